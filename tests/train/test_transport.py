"""Weights off a device machine (speculative/train/transport.py): chunks that join to the same
bytes, and every corruption refused in one error line with nothing written."""

import json
import os

import numpy as np
import pytest

from speculative import checkpoints
from speculative.train import transport


def _device_run(tmp_path, size=250_000, chunk=100_000, first_n=2):
  """What a device call leaves: a weights file split over the two calls' folders, plus a draft and
  the results archive (sidecars) in the second."""
  out, first = tmp_path / "device", tmp_path / "device" / "first"
  for d in (first, out / "second"):
    d.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  params = {"w": rng.standard_normal(size // 4).astype(np.float32)}
  checkpoints.save_params(params, out / "target.msgpack", dtype="float32")
  checkpoints.save_params({"v": np.ones(7, np.float32)}, out / "draft.msgpack", dtype="float32")
  os.replace(out / "draft.msgpack", out / "second" / "draft.msgpack")
  manifest = transport.split(str(out / "target.msgpack"), str(out), str(first), chunk, first_n)
  transport.pack_results(str(out), str(out / "second" / "results.tar.gz"))
  return out, first, manifest


def test_split_then_collect_gives_the_same_bytes(tmp_path):
  out, first, manifest = _device_run(tmp_path)
  assert [c["size"] for c in manifest["chunks"]] == [100_000, 100_000, manifest["size"] - 200_000]
  assert sorted(p.name for p in first.glob("*.part*")) == [
    "target.msgpack.part00",
    "target.msgpack.part01",
  ]
  written = transport.collect(str(first), str(out / "second"), str(tmp_path / "here"))
  assert (tmp_path / "here" / "target.msgpack").read_bytes() == (
    out / "target.msgpack"
  ).read_bytes()
  assert sorted(os.path.basename(p) for p in written) == ["draft.msgpack", "target.msgpack"]
  checkpoints.verify_weights(str(tmp_path / "here" / "target.msgpack"))


def test_a_changed_chunk_is_refused_and_nothing_written(tmp_path):
  out, first, _ = _device_run(tmp_path)
  part = out / "second" / "target.msgpack.part02"
  part.write_bytes(part.read_bytes()[:-1] + b"x")
  with pytest.raises(transport.TransportError, match=r"part02: sha256 differs from the device's"):
    transport.collect(str(first), str(out / "second"), str(tmp_path / "here"))
  assert not (tmp_path / "here").exists()
  assert [p for p in tmp_path.iterdir() if p.name.startswith("tmp")] == []  # staging removed


def test_a_missing_chunk_and_a_changed_draft_are_refused(tmp_path):
  out, first, _ = _device_run(tmp_path)
  (first / "target.msgpack.part01").unlink()
  with pytest.raises(transport.TransportError, match=r"chunk target.msgpack.part01 is missing"):
    transport.collect(str(first), str(out / "second"), str(tmp_path / "here"))
  out, first, _ = _device_run(tmp_path / "again")
  draft = out / "second" / "draft.msgpack"
  draft.write_bytes(draft.read_bytes() + b"\0")
  with pytest.raises(
    transport.TransportError, match=r"draft.msgpack: sha256 differs from its sidecar"
  ):
    transport.collect(str(first), str(out / "second"), str(tmp_path / "here"))


def test_the_command_line_says_one_line_and_exits_2(tmp_path, capsys):
  out, first, _ = _device_run(tmp_path)
  manifest = json.loads((first / transport.MANIFEST).read_text())
  manifest["sha256"] = "0" * 64
  (first / transport.MANIFEST).write_text(json.dumps(manifest))
  (out / "second" / transport.MANIFEST).unlink()
  code = transport.main(
    ["collect", str(first), str(out / "second"), "--dest_dir", str(tmp_path / "x")]
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1
  assert err[0] == "error: target.msgpack: the joined chunks differ from the device's file"
