"""The resume fingerprint, setting by setting: a re-run into an output directory resumes only
outputs of the same settings. Each setting of `InferSettings` that can change an output is changed
alone, and the refusal must name the manifest field that records it; a setting that cannot change
an output (the output directory's path, the progress bar, ...) must resume. No model loads and
nothing decodes: the manifest is built (`outputs.build_manifest`) from real `InferSettings` and
compared by `outputs.check_output_dir`, as `infer.infer` does before its models load.

A new setting is one row: of OUTPUT_CHANGES (its name, the change, the manifest field the refusal
names) or of NOT_OUTPUT; `test_every_setting_has_a_row` fails for a field of InferSettings that has
neither."""

import dataclasses
import shutil

from model_utils import save_tiny_pair
import numpy as np
import pytest

from speculative import checkpoints
from speculative.data import tasks
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs
from speculative.infer import report as infer_report
from speculative.infer import settings as infer_settings
from speculative.kernels import policy

SOURCES = ["Click OK.", "Open the file menu.", "Hello", "Select a cell range."]


def _other_weights(role):
  """The `role` ('t' target, 'd' draft) weights with one array changed, saved with their config."""

  def change(root, kwargs):
    path = root / f"{role}2.msgpack"
    if not path.exists():
      params = checkpoints.load_params(root / f"{role}.msgpack")
      embedding = np.array(params["token_embedder"]["embedding"])
      embedding[2, 0] += 1.0
      params["token_embedder"]["embedding"] = embedding
      config = kwargs["target_config" if role == "t" else "draft_config"]
      checkpoints.save_params(params, path, dtype=None, config=config)
    return {("target" if role == "t" else "draft") + "_checkpoint": str(path)}

  return change


def _other_input_file(root, kwargs):
  path = root / "in2.tsv"
  path.write_text("Hello\tRef\nClick OK.\tRef\nBye\tRef\n")
  return {"input_file": str(path)}


def _copied_vocabulary(root, kwargs):  # the same SentencePiece model at another path
  path = root / "spm_copy.model"
  shutil.copy(tasks.VOCAB_PATH, path)
  return {"vocabulary_path": str(path)}


def _target_dtype(root, kwargs):
  return {"target_config": dataclasses.replace(kwargs["target_config"], dtype="bfloat16")}


def _draft_dtype(root, kwargs):
  return {"draft_config": dataclasses.replace(kwargs["draft_config"], dtype="bfloat16")}


def _grown_target(root, kwargs):
  target = kwargs["target_config"]
  return {
    "grow_target_to": dataclasses.replace(target, num_decoder_layers=target.num_decoder_layers + 1)
  }


def _other_kernels(root, kwargs):
  """The decode path the base settings do not take (the kernels where they run here)."""
  base = policy.choose("auto", kwargs["batch_size"])
  try:
    policy.choose("off" if base.kernels else "on", kwargs["batch_size"])
  except ValueError as e:
    pytest.skip(f"one decode path only here: {e}")
  return {"kernels": "off" if base.kernels else "on"}


# (setting, its change (a dict, or fn(root, base kwargs) -> dict), the manifest field the refusal
# names). The base settings: BASE below plus the tiny pair and its input file.
OUTPUT_CHANGES = [
  ("target_checkpoint", _other_weights("t"), "target_checkpoint_sha256"),
  ("draft_checkpoint", _other_weights("d"), "draft_checkpoint_sha256"),
  ("target_config", _target_dtype, "target_config"),
  ("target_config's dtype", _target_dtype, "dtype"),
  ("draft_config", _draft_dtype, "draft_config"),
  ("grow_target_to", _grown_target, "grow_target_to"),
  (
    "task_feature_lengths",
    {"task_feature_lengths": {"inputs": 24, "targets": 7}},
    "task_feature_lengths",
  ),
  ("input_file", _other_input_file, "inputs_sha256"),
  ("input_file's path", _other_input_file, "inputs"),
  ("input_prefix", {"input_prefix": "translate: "}, "inputs_sha256"),
  ("vocabulary_path", _copied_vocabulary, "inputs"),
  ("num_examples", {"num_examples": 2}, "num_examples"),  # a shrink (a grow resumes)
  ("modes", {"modes": ("baseline",)}, "modes"),
  ("batch_size", {"batch_size": 3}, "batch_size"),
  ("gamma", {"gamma": 4}, "gamma"),
  ("gamma", {"gamma": "auto"}, "gamma"),
  ("gamma_max", {"gamma": "auto", "gamma_max": 5}, "gamma_max"),
  ("method", {"method": "spectr", "temperature": 1.0}, "method"),
  ("num_drafts", {"method": "spectr", "num_drafts": 2, "temperature": 1.0}, "num_drafts"),
  ("drafter", {"drafter": "prompt_lookup+model"}, "drafter"),
  ("draft_stop_below", {"draft_stop_below": 0.5}, "draft_stop_below"),
  ("adaptive_verify", {"adaptive_verify": True}, "adaptive_verify"),
  ("lenience", {"lenience": 0.5}, "lenience"),
  ("temperature", {"temperature": 1.0}, "temperature"),
  ("top_k", {"top_k": 5}, "top_k"),
  ("top_p", {"top_p": 0.9}, "top_p"),
  ("seed", {"seed": 1}, "seed"),
  ("kernels", _other_kernels, "decode_path"),
  # SpecTr (needs sampling): the manifest of a one-draft job has neither field.
  ("method", {"method": "spectr", "num_drafts": 2, "temperature": 1.0}, "method"),
  ("num_drafts", {"method": "spectr", "num_drafts": 3, "temperature": 1.0}, "num_drafts"),
]

# Settings that cannot change an output: a re-run that changes one of them alone resumes.
NOT_OUTPUT = [
  ("output_dir", lambda root, kwargs: {"output_dir": str(root / "elsewhere")}),
  ("progress", {"progress": True}),
  ("require_identical", {"require_identical": False}),
  # The cost cache of a GAMMA = 'auto' job: a resume reuses the calibration its manifest records.
  ("calibration_file", lambda root, kwargs: {"calibration_file": str(root / "other.json")}),
]

# Settings without a row, and why.
NO_ROW = {
  "mixture_or_task_name": "a seqio task (TensorFlow): recorded in 'inputs' as input_file is",
  "split": "a seqio task's split: recorded in 'inputs' as input_file is",
  "overwrite": "deletes the old outputs instead of resuming them",
}

BASE = dict(
  task_feature_lengths={"inputs": 24, "targets": 6},
  batch_size=2,
  gamma=3,
  num_examples=3,
  progress=False,
)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  """(root, the base keyword arguments, an output directory claimed with their manifest)."""
  root = tmp_path_factory.mktemp("fingerprint")
  kwargs = dict(**save_tiny_pair(root, SOURCES, record_config=True), **BASE)
  kwargs["output_dir"] = str(root / "out")
  manifest, _ = _manifest(kwargs)
  (root / "out").mkdir()
  outputs.claim_output_dir(kwargs["output_dir"], manifest, overwrite=False)
  return root, kwargs


def _manifest(kwargs):
  settings = infer_settings.InferSettings(**kwargs)
  inputs = infer_inputs.load_inputs(settings)
  return outputs.build_manifest(settings, inputs), inputs


def _changed(job, change):
  root, kwargs = job
  return {**kwargs, **(change(root, kwargs) if callable(change) else change)}


@pytest.mark.parametrize(
  "change,field", [row[1:] for row in OUTPUT_CHANGES], ids=[row[0] for row in OUTPUT_CHANGES]
)
def test_a_changed_output_setting_is_refused_naming_it(job, change, field):
  kwargs = _changed(job, change)
  manifest, inputs = _manifest(kwargs)
  with pytest.raises(ValueError, match=rf"refusing to mix them:(\n  .*)*\n  {field}: was ") as info:
    outputs.check_output_dir(job[1]["output_dir"], manifest, False, inputs.examples)
  assert "Use a new output directory, or bind infer.overwrite = True" in str(info.value)


@pytest.mark.parametrize(
  "change", [row[1] for row in NOT_OUTPUT], ids=[row[0] for row in NOT_OUTPUT]
)
def test_a_setting_that_cannot_change_an_output_resumes(job, change):
  manifest, inputs = _manifest(_changed(job, change))
  assert outputs.check_output_dir(job[1]["output_dir"], manifest, False, inputs.examples) is True


# Settings that exist on another base only, changed alone there: (setting, the base's own
# settings, the change, the manifest field the refusal names, and only it).
OTHER_BASES = {
  "auto": {"gamma": "auto"},
  "spectr": {"method": "spectr", "num_drafts": 2, "temperature": 1.0},
}
ALONE_ON_OTHER_BASES = [
  ("gamma_max", "auto", {"gamma_max": 5}, "gamma_max"),
  ("num_drafts", "spectr", {"num_drafts": 3}, "num_drafts"),
]


@pytest.fixture(scope="module")
def other_base(job):
  """base name -> the keyword arguments of an output directory claimed with that base's manifest
  (the 'auto' one also holding the calibration record such a job writes once it starts)."""
  root, kwargs = job
  claimed = {}

  def get(name):
    if name not in claimed:
      base = {**kwargs, **OTHER_BASES[name], "output_dir": str(root / f"out-{name}")}
      manifest, _ = _manifest(base)
      if name == "auto":
        manifest["calibration"] = {"source": "measured", "times": {"recorded": "by the job"}}
      (root / f"out-{name}").mkdir()
      outputs.claim_output_dir(base["output_dir"], manifest, overwrite=False)
      claimed[name] = base
    return claimed[name]

  return get


@pytest.mark.parametrize(
  "base,change,field",
  [row[1:] for row in ALONE_ON_OTHER_BASES],
  ids=[row[0] for row in ALONE_ON_OTHER_BASES],
)
def test_a_setting_of_another_base_changed_alone_is_refused_naming_only_it(
  other_base, base, change, field
):
  kwargs = other_base(base)
  manifest, inputs = _manifest({**kwargs, **change})
  with pytest.raises(ValueError, match=rf"refusing to mix them:\n  {field}: was ") as info:
    outputs.check_output_dir(kwargs["output_dir"], manifest, False, inputs.examples)
  assert str(info.value).count(": was ") == 1, str(info.value)


def test_an_auto_job_resumes_with_another_cost_cache(other_base, tmp_path):
  """The cost cache is not an output setting: a resumed 'auto' job reuses the calibration its
  manifest records (which a re-run's settings are not compared with)."""
  kwargs = other_base("auto")
  manifest, inputs = _manifest({**kwargs, "calibration_file": str(tmp_path / "other.json")})
  assert "calibration" not in manifest
  assert outputs.check_output_dir(kwargs["output_dir"], manifest, False, inputs.examples) is True


def test_a_t5x_target_has_one_fingerprint_however_its_path_is_written(job, tmp_path):
  """A T5X model directory, its step directory and the step's `checkpoint` file name the same
  weights: the manifest records one hash for the three (a re-run that writes the path another way
  resumes), the step's."""
  root, kwargs = job
  params = checkpoints.load_params(kwargs["target_checkpoint"])
  step_dir = checkpoints.save_t5x_checkpoint(params, tmp_path / "model", 7)
  fingerprints = {
    _manifest({**kwargs, "target_checkpoint": str(path)})[0]["target_checkpoint_sha256"]
    for path in (tmp_path / "model", step_dir, step_dir / "checkpoint")
  }
  assert len(fingerprints) == 1, fingerprints


def test_the_same_settings_resume_and_a_grow_extends(job):
  root, kwargs = job
  manifest, inputs = _manifest(kwargs)
  assert outputs.check_output_dir(kwargs["output_dir"], manifest, False, inputs.examples) is True
  grown, inputs = _manifest({**kwargs, "num_examples": 4})
  assert outputs.check_output_dir(kwargs["output_dir"], grown, False, inputs.examples) is True


def test_every_setting_has_a_row():
  rows = {name.split("'")[0] for name, *_ in OUTPUT_CHANGES} | {n for n, _ in NOT_OUTPUT}
  fields = {f.name for f in dataclasses.fields(infer_settings.InferSettings)}
  assert sorted(fields - rows - set(NO_ROW)) == [], "settings without a row"
  assert sorted((rows | set(NO_ROW)) - fields) == [], "rows of settings that do not exist"


def test_the_manifest_records_every_output_setting(job):
  # What the report's header names is what a resume compares (one list: output_settings).
  root, kwargs = job
  manifest, _ = _manifest(kwargs)
  settings = infer_settings.InferSettings(**kwargs)
  for name, value in settings.output_settings().items():
    assert manifest[name] == value, name


def test_the_report_header_names_sampling_settings(job):
  # TOPK = 20, TOPP = 0.9: named in report.md's header, not in metrics.json only.
  root, kwargs = job
  settings = infer_settings.InferSettings(
    **{**kwargs, "temperature": 1.0, "top_k": 20, "top_p": 0.9}
  )
  line = infer_report.settings_line(settings.output_settings())
  assert "temperature = 1.0, top_k = 20, top_p = 0.9, seed = 0" in line
