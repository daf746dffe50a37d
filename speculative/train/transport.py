"""Moving weights off a device machine: split a file into checked chunks there, join and verify
them here. The device tool returns at most 8 files of at most 16 MiB, 64 MiB in all, per call, so
the 102 MB bfloat16 target comes back over two calls (speculative.train.pair); nothing is trained
on or shipped from a file whose sha256 differs from what the device printed.

Here, after both calls (their files under two folders):
  .venv/bin/python -m speculative.train.transport collect <first call's files> <second call's files> \\
      --dest_dir ../runs/pair_device
and before a call, what would travel (the device tool takes at most 64 MiB of working tree):
  .venv/bin/python -m speculative.train.transport tree_size
Moving weights onto a device machine (a pair to continue from, larger than one call carries): here,
  .venv/bin/python -m speculative.train.transport pack_upload models/embedded/target.msgpack \\
      models/embedded/draft.msgpack --dest_dir .device/upload --parts 2
packs the files and their sidecars into one tar.xz cut into `--parts` checked parts (each call
carries one under `.device/`); there, after the last part's call,
  python3 -m speculative.train.transport unpack_upload <folders holding the parts> --dest_dir DIR
checks every part and the whole against the manifest and unpacks, or writes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tarfile
import tempfile

from speculative import checkpoints
from speculative.data import corpus

MANIFEST = "target.manifest.json"
UPLOAD_MANIFEST = "upload.manifest.json"
TREE_LIMIT = 64 * 2**20


class TransportError(ValueError):
  """A chunk or file that is missing or does not match its recorded sha256."""


def split(path: str, out_dir: str, first_dir: str, chunk_bytes: int, first_n: int) -> dict:
  """Cuts `path` into chunks of `chunk_bytes`: the first `first_n` go to `first_dir` (the first
  call's $OUT), the rest to `out_dir/second`; the manifest (sizes and sha256 of the file and of
  every chunk) goes to both and is returned."""
  second = os.path.join(out_dir, "second")
  manifest = _write_chunks(
    Path(path).read_bytes(),
    os.path.basename(path),
    chunk_bytes,
    lambda k: first_dir if k < first_n else second,
  )
  for dest in (first_dir, second):
    Path(dest, MANIFEST).write_text(json.dumps(manifest, indent=1))
  return manifest


def _write_chunks(data: bytes, name: str, chunk_bytes: int, folder_of) -> dict:
  """Writes `data` as chunks `<name>.partNN` of `chunk_bytes`, chunk k into `folder_of(k)`;
  returns the manifest: sizes and sha256 of the whole and of every chunk."""
  chunks = []
  for k, start in enumerate(range(0, len(data), chunk_bytes)):
    piece = data[start : start + chunk_bytes]
    chunk = f"{name}.part{k:02d}"
    Path(folder_of(k), chunk).write_bytes(piece)
    chunks.append({"name": chunk, "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
  return {
    "file": name,
    "size": len(data),
    "sha256": hashlib.sha256(data).hexdigest(),
    "chunks": chunks,
  }


def _find_manifest(folders: list[str], name: str) -> dict:
  path = next((Path(f, name) for f in folders if Path(f, name).is_file()), None)
  if path is None:
    raise TransportError(f"no {name} in {', '.join(folders)}")
  return json.loads(path.read_text())


@contextlib.contextmanager
def _staged(dest_dir: str):
  """A temporary folder beside `dest_dir` that replaces `dest_dir` when the block ends without an
  error, and is removed when it raises: a failed check leaves nothing written. A `dest_dir` that
  holds anything already is refused first: it would be replaced whole, its files lost."""
  if os.path.isdir(dest_dir) and os.listdir(dest_dir):
    raise TransportError(
      f"--dest_dir {dest_dir} is not empty: its files would be replaced; give a new folder"
    )
  staging = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(dest_dir)) or ".")
  try:
    yield staging
    if os.path.exists(dest_dir):
      shutil.rmtree(dest_dir)
    os.replace(staging, dest_dir)
  finally:
    if os.path.exists(staging):
      shutil.rmtree(staging)


def pack_results(out_dir: str, dest: str) -> None:
  """The small files of a run (report, test outputs, sidecars) as one tar.gz."""
  with tarfile.open(dest, "w:gz") as tar:
    for path in sorted(Path(out_dir).rglob("*")):
      if path.is_file() and (path.suffix in (".json", ".jsonl")) and "jax_cache" not in path.parts:
        tar.add(path, arcname=str(path.relative_to(out_dir)))


def join(manifest: dict, folders: list[str], dest: str) -> str:
  """Joins the manifest's chunks (found in `folders`) into `dest`, each chunk and the whole
  checked against the manifest; raises TransportError naming the first mismatch, writing nothing."""
  parts = []
  for chunk in manifest["chunks"]:
    found = [Path(f, chunk["name"]) for f in folders if Path(f, chunk["name"]).is_file()]
    if not found:
      raise TransportError(f"chunk {chunk['name']} is missing from {', '.join(folders)}")
    data = found[0].read_bytes()
    if hashlib.sha256(data).hexdigest() != chunk["sha256"]:
      raise TransportError(f"{found[0]}: sha256 differs from the device's {chunk['sha256'][:12]}")
    parts.append(data)
  whole = b"".join(parts)
  if hashlib.sha256(whole).hexdigest() != manifest["sha256"] or len(whole) != manifest["size"]:
    raise TransportError(f"{manifest['file']}: the joined chunks differ from the device's file")
  checkpoints.write_atomic(dest, whole)
  return dest


def collect(first: str, second: str, dest_dir: str) -> list[str]:
  """Joins the target, unpacks the results and checks every weights file against the sha256 its
  sidecar records (the device wrote the sidecars). Returns the weights files written."""
  folders = [first, second]
  manifest = _find_manifest(folders, MANIFEST)
  results = Path(second, "results.tar.gz")
  if not results.is_file():
    raise TransportError(f"{results} is missing")
  with _staged(dest_dir) as staging:
    with tarfile.open(results) as tar:
      tar.extractall(staging, filter="data")
    join(manifest, folders, os.path.join(staging, manifest["file"]))
    written = [manifest["file"]]
    for weights in sorted(Path(second).glob("*.msgpack")):
      shutil.copy(weights, os.path.join(staging, weights.name))
      written.append(weights.name)
    for name in written:
      sidecar = Path(staging, name + ".json")
      if not sidecar.is_file():
        raise TransportError(f"{name}: its sidecar is not in {results}")
      recorded = json.loads(sidecar.read_text())["sha256"]
      if corpus.sha256_file(Path(staging, name)) != recorded:
        raise TransportError(f"{name}: sha256 differs from its sidecar's {recorded[:12]}")
  return [os.path.join(dest_dir, name) for name in written]


def pack_upload(files: list[str], dest_dir: str, n_parts: int) -> dict:
  """Packs `files` and their sidecars (`<file>.json`, where present) into one tar.xz, cut into
  `n_parts` parts in `dest_dir`, the manifest (`UPLOAD_MANIFEST`) beside them: each call carries
  one part and a copy of the manifest. Each weights file is verified first: nothing stale
  travels."""
  for path in files:
    checkpoints.verify_weights(path)
  os.makedirs(dest_dir, exist_ok=True)
  with tempfile.TemporaryFile() as tmp:
    with tarfile.open(fileobj=tmp, mode="w:xz", preset=1) as tar:
      for path in files:
        for member in (path, path + ".json"):
          if os.path.isfile(member):
            tar.add(member, arcname=os.path.basename(member))
    tmp.seek(0)
    data = tmp.read()
  size = -(-len(data) // n_parts)  # at most n_parts chunks (n_parts for any real archive)
  manifest = _write_chunks(data, "upload.tar.xz", size, lambda k: dest_dir)
  Path(dest_dir, UPLOAD_MANIFEST).write_text(json.dumps(manifest, indent=1))
  return manifest


def unpack_upload(folders: list[str], dest_dir: str) -> list[str]:
  """Joins the parts found in `folders` (checked against the manifest found there), unpacks the
  tar.xz into `dest_dir` and verifies each weights file against its sidecar; returns the names.
  Raises TransportError naming the first mismatch, leaving `dest_dir` untouched."""
  manifest = _find_manifest(folders, UPLOAD_MANIFEST)
  with _staged(dest_dir) as staging:
    archive = join(manifest, folders, os.path.join(staging, manifest["file"]))
    with tarfile.open(archive, mode="r:xz") as tar:
      names = tar.getnames()
      tar.extractall(staging, filter="data")
    os.remove(archive)
    for name in names:
      if name.endswith(".msgpack"):
        checkpoints.verify_weights(os.path.join(staging, name))
  return names


def tree_size(root: str = ".") -> int:
  """Bytes the device tool would send: tracked and untracked-not-ignored files present here."""
  names = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    cwd=root,
    capture_output=True,
    check=True,
  ).stdout.split(b"\0")
  return sum(
    os.path.getsize(Path(root, n.decode())) for n in names if n and Path(root, n.decode()).is_file()
  )


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  c = sub.add_parser("collect", help="join and verify what the two calls returned")
  c.add_argument("first")
  c.add_argument("second")
  c.add_argument("--dest_dir", required=True)
  sub.add_parser("tree_size", help="what the device tool would send, against its 64 MiB")
  p = sub.add_parser("pack_upload", help="weights to carry to a device over several calls")
  p.add_argument("files", nargs="+")
  p.add_argument("--dest_dir", required=True)
  p.add_argument("--parts", type=int, default=2)
  u = sub.add_parser("unpack_upload", help="there: join, verify and unpack the parts")
  u.add_argument("folders", nargs="+")
  u.add_argument("--dest_dir", required=True)
  args = parser.parse_args(argv)
  try:
    if args.command == "collect":
      for path in collect(args.first, args.second, args.dest_dir):
        print(f"verified {path}")
    elif args.command == "pack_upload":
      manifest = pack_upload(args.files, args.dest_dir, args.parts)
      for chunk in manifest["chunks"]:
        print(f"{args.dest_dir}/{chunk['name']}: {chunk['size']} bytes, sha256 {chunk['sha256']}")
      print(f"whole {manifest['file']}: {manifest['size']} bytes, sha256 {manifest['sha256']}")
    elif args.command == "unpack_upload":
      for name in unpack_upload(args.folders, args.dest_dir):
        print(f"unpacked and verified {args.dest_dir}/{name}")
    else:
      size = tree_size()
      print(f"working tree to send: {size / 2**20:.1f} MiB (limit {TREE_LIMIT / 2**20:.0f} MiB)")
      return 0 if size <= TREE_LIMIT else 1
  except (TransportError, OSError, tarfile.TarError, checkpoints.CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
