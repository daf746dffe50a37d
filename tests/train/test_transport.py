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


def _pair_to_upload(tmp_path):
  """A target and a draft with sidecars, as models/embedded/ holds them."""
  src = tmp_path / "pair"
  src.mkdir()
  rng = np.random.default_rng(1)
  checkpoints.save_params(
    {"w": rng.standard_normal(60_000).astype(np.float32)}, src / "target.msgpack", "float32"
  )
  checkpoints.save_params({"v": np.arange(9, dtype=np.float32)}, src / "draft.msgpack", "float32")
  return [str(src / "target.msgpack"), str(src / "draft.msgpack")]


def _upload_in_two_calls(tmp_path, files):
  """pack_upload here, then each part (with the manifest) in the folder its call would carry."""
  packed = tmp_path / "upload"
  manifest = transport.pack_upload(files, str(packed), 2)
  calls = []
  for k, chunk in enumerate(manifest["chunks"]):
    call = tmp_path / f"call{k}"
    call.mkdir()
    os.replace(packed / chunk["name"], call / chunk["name"])
    (call / transport.UPLOAD_MANIFEST).write_bytes(
      (packed / transport.UPLOAD_MANIFEST).read_bytes()
    )
    calls.append(str(call))
  return manifest, calls


def test_upload_parts_unpack_to_the_same_verified_files(tmp_path):
  files = _pair_to_upload(tmp_path)
  manifest, calls = _upload_in_two_calls(tmp_path, files)
  assert len(manifest["chunks"]) == 2
  assert sum(c["size"] for c in manifest["chunks"]) == manifest["size"]
  names = transport.unpack_upload(calls, str(tmp_path / "there"))
  assert sorted(names) == [
    "draft.msgpack",
    "draft.msgpack.json",
    "target.msgpack",
    "target.msgpack.json",
  ]
  for path in files:
    name = os.path.basename(path)
    assert (tmp_path / "there" / name).read_bytes() == open(path, "rb").read()
    checkpoints.verify_weights(str(tmp_path / "there" / name))


def test_a_changed_or_missing_upload_part_is_refused_and_nothing_written(tmp_path, capsys):
  files = _pair_to_upload(tmp_path)
  manifest, calls = _upload_in_two_calls(tmp_path, files)
  part = os.path.join(calls[1], manifest["chunks"][1]["name"])
  data = open(part, "rb").read()
  with open(part, "wb") as f:
    f.write(data[:-1] + bytes([data[-1] ^ 1]))
  with pytest.raises(transport.TransportError, match=r"part01: sha256 differs from the device's"):
    transport.unpack_upload(calls, str(tmp_path / "there"))
  assert not (tmp_path / "there").exists()
  os.remove(part)
  code = transport.main(["unpack_upload", *calls, "--dest_dir", str(tmp_path / "there")])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1
  assert err[0].startswith("error: chunk upload.tar.xz.part01 is missing from ")
  assert not (tmp_path / "there").exists()
  assert [p for p in tmp_path.iterdir() if p.name.startswith("tmp")] == []  # staging removed


def test_stale_weights_are_not_packed(tmp_path):
  files = _pair_to_upload(tmp_path)
  with open(files[1], "ab") as f:
    f.write(b"\0")  # changed after export: its sidecar's sha256 no longer matches
  with pytest.raises(checkpoints.CheckpointError, match="draft.msgpack"):
    transport.pack_upload(files, str(tmp_path / "upload"), 2)


def test_a_dest_dir_that_holds_files_is_refused_and_kept(tmp_path):
  """collect and unpack_upload replace their dest_dir whole: one that holds anything (an earlier
  pair, a folder of other files) is refused before anything is read, and left as it was."""
  files = _pair_to_upload(tmp_path)
  _, calls = _upload_in_two_calls(tmp_path, files)
  kept = tmp_path / "there"
  kept.mkdir()
  (kept / "other_run_report.json").write_text("{}")
  with pytest.raises(transport.TransportError, match=r"there is not empty: its files would be"):
    transport.unpack_upload(calls, str(kept))
  assert [p.name for p in kept.iterdir()] == ["other_run_report.json"]
