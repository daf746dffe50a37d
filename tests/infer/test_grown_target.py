"""A job whose target is grown in memory (`infer.grow_target_to`, the paper-shape job's switch:
configs/benchmark/paper_shape_job.gin): the grown target decodes the checkpoint's function (the
same greedy tokens as the job without growth, in float32), speculative decoding stays identical to
it, the manifest and the report name the grown shape, and a shape it cannot grow to is refused in
one line before any model loads."""

import dataclasses
import json

import jax
import model_utils
import pytest

from speculative import infer
from speculative.infer import run as infer_run
from speculative.infer import settings as infer_settings
from speculative.models import memory

SOURCES = model_utils.JOB_SOURCES


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  root = tmp_path_factory.mktemp("grown")
  kwargs = model_utils.tiny_job(root, gamma=3, batch_size=2)
  return root, kwargs


def _grown(config):
  """Wider residual, one more head, a wider MLP and one more layer each side."""
  return dataclasses.replace(
    config,
    emb_dim=2 * config.emb_dim,
    num_heads=config.num_heads + 1,
    mlp_dim=2 * config.mlp_dim,
    num_encoder_layers=config.num_encoder_layers + 1,
    num_decoder_layers=config.num_decoder_layers + 1,
  )


def _predictions(out, mode):
  return [json.loads(line)["prediction"] for line in (out / f"predictions-{mode}.jsonl").open()]


def test_a_grown_target_decodes_the_checkpoints_tokens(pair, tmp_path):
  root, kwargs = pair
  large = _grown(kwargs["target_config"])
  plain = infer.infer(output_dir=str(tmp_path / "plain"), **{**kwargs, "modes": ("baseline",)})
  grown = infer.infer(output_dir=str(tmp_path / "grown"), grow_target_to=large, **kwargs)
  want = _predictions(tmp_path / "plain", "baseline")
  assert _predictions(tmp_path / "grown", "baseline") == want
  assert _predictions(tmp_path / "grown", "speculative") == want
  assert grown["identical_outputs"] == len(SOURCES)
  assert (
    grown["speculative"]["accepted"] > 0
  )  # the draft's tokens were accepted by the grown target
  assert "grown_target" not in plain
  assert grown["grown_target"].startswith(f"{memory.describe(large)}, float32; grown in memory")
  manifest = json.loads((tmp_path / "grown" / "manifest.json").read_text())
  assert manifest["grow_target_to"]["num_decoder_layers"] == large.num_decoder_layers
  assert "grow_target_to" not in json.loads((tmp_path / "plain" / "manifest.json").read_text())
  report = (tmp_path / "grown" / "report.md").read_text()
  assert "(function-preserving growth)" in report and "grown in memory from" in report


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(num_heads=1), "grow_target_to: cannot grow: num_heads shrinks"),
    (dict(head_dim=32), "grow_target_to: cannot grow: head_dim differs"),
    (dict(vocab_size=300), "grow_target_to: cannot grow: vocab_size differs"),
  ],
)
def test_a_shape_it_cannot_grow_to_is_refused_before_any_model_loads(
  pair, tmp_path, change, message
):
  root, kwargs = pair
  large = dataclasses.replace(_grown(kwargs["target_config"]), **change)
  with pytest.raises(ValueError, match=message):
    infer_settings.InferSettings(output_dir=str(tmp_path / "out"), grow_target_to=large, **kwargs)
  with pytest.raises(ValueError, match="grow_target_to must be None or a t5.T5Config"):
    infer_settings.InferSettings(output_dir=str(tmp_path / "out"), grow_target_to="xxl", **kwargs)
  assert not (tmp_path / "out").exists()


def test_a_grown_shape_that_does_not_fit_is_refused_before_any_model_loads(
  pair, tmp_path, monkeypatch
):
  """On a device too small for the grown target (its weights, cache, activations, and the
  checkpoint's model while it grows): one line naming the shape and both sizes; nothing written."""
  root, kwargs = pair
  large = _grown(kwargs["target_config"])
  monkeypatch.setattr(memory, "device_memory", lambda: (1_000_000, "a 1 MB test device"))
  with pytest.raises(Exception, match="grow_target_to's shape does not fit this device") as info:
    infer.infer(output_dir=str(tmp_path / "out"), grow_target_to=large, **kwargs)
  assert "the device has 0.0 GB (a 1 MB test device)" in str(info.value)
  assert len(str(info.value).splitlines()) == 1
  assert not (tmp_path / "out").exists()


@model_utils.kernels_run_here_mark()
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_grown_need_counts_the_weights_packed_for_the_cpu_kernels(pair, tmp_path, dtype):
  """On the CPU kernels' path `load_models` holds the grown target's and the draft's decoders
  packed beside their weights: the memory check needs exactly those bytes more than on XLA's."""
  root, kwargs = pair
  large = dataclasses.replace(_grown(kwargs["target_config"]), dtype=dtype)
  settings = {
    k: infer_settings.InferSettings(
      output_dir=str(tmp_path / k), grow_target_to=large, kernels=k, **kwargs
    )
    for k in ("on", "off")
  }
  models = infer_run.load_models(settings["on"])
  packed = sum(  # what pack_decode_params made, as loaded
    x.nbytes
    for params in (models.target_params, models.draft_model_params)
    for x in jax.tree_util.tree_leaves(params.packed)
  )
  on, off = (infer_run._grown_need(settings[k]) for k in ("on", "off"))
  assert off.packed == 0 and on == dataclasses.replace(off, packed=packed)
  assert on.total == int(memory.MARGIN * (off.weights + packed + off.caches + off.activations))
  assert "packed for the CPU kernels" in on.line() and "packed" not in off.line()
