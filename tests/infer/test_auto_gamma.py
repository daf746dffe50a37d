"""GAMMA = 'auto' through the job (speculative.infer) on the correlated tiny pair, with injected
costs (each batch's measured walltime is its loop steps times the injected step of its gamma):
plain decoding only where nothing pays (no draft call), greedy identity with drafts accepted at
batch 1 and 8, the costs measured on the job's batches, cached and recorded, a resumed sampled job
byte-identical (while measuring and from a cached start), and the settings it refuses."""

import dataclasses
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import model_utils
import pytest

from speculative import infer
from speculative.autogamma import costs as costs_lib
from speculative.autogamma import policy
from speculative.decode import batching
from speculative.infer import auto_gamma
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs as infer_outputs
from speculative.infer import settings as infer_settings

REPO = Path(__file__).resolve().parents[2]
SOURCES = [
  "Click OK.",
  "Open the file menu and choose Save.",
  "Hello",
  "Select a cell range.",
  "Press Enter to perform the search.",
  "Choose Format - Cells.",
  "Insert a new sheet.",
  "The dialog closes.",
  "Type the name of the file.",
  "Save the document.",
]
MAX_NEW = model_utils.JOB_MAX_NEW_TOKENS


def _costs(verify_ratios, draft_ratio, t1=1e-3):
  """Loop steps v(gamma + 1) + gamma d(1) for gamma 0..len(verify_ratios) - 1."""
  steps = tuple((g, (v + g * draft_ratio) * t1) for g, v in enumerate(verify_ratios))
  return costs_lib.Costs(steps, len(verify_ratios) - 1)


# gamma_max 3 (T = 1..4). Compute-bound verify: nothing pays, not even at alpha 1.
ONLY_PLAIN_PAYS = _costs([1, 2, 3, 4], 0.5)
# A flat verify and a cheap draft: every gamma >= 1 pays at the pair's alpha (~0.4).
DRAFTS_PAY = _costs([1, 1, 1, 1], 0.05)
# Gamma 1 pays only above alpha 0.85 ((1 + alpha) / 1.85), above the prior's 0.8 and the pair's
# acceptance: plain decoding, with a probe at gamma 1 every 8th batch (alpha 1 would pay): the
# choices vary.
PROBES_ONLY = _costs([1, 1.75, 2.5, 3.25], 0.1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  root = tmp_path_factory.mktemp("auto")
  kwargs = model_utils.tiny_job(root, SOURCES, gamma="auto", gamma_max=3)
  return root, kwargs


@pytest.fixture
def inject(monkeypatch):
  """inject(costs): each batch the job times is measured as its loop steps times `costs.step` of
  the gamma it ran (`costs.batch_timing`; the baseline's records: gamma 0), instead of its
  walltime; returns the list of gammas timed."""
  timed = []

  def set_costs(costs):
    def batch_timing(records):
      records = list(records)
      gamma = int(records[0].get("gamma", 0))
      steps = max(int(r["target_calls"]) for r in records)
      tokens = max(int(r["num_tokens"]) for r in records)
      timed.append(gamma)
      return costs_lib.BatchTiming(steps * costs.step(gamma), steps, tokens=tokens)

    monkeypatch.setattr(costs_lib, "batch_timing", batch_timing)
    monkeypatch.setattr(costs_lib, "MIN_STEPS", 4)  # the tiny jobs' batches run 4-12 steps
    return timed

  return set_costs


def _records(out, mode):
  return [json.loads(line) for line in (out / f"predictions-{mode}.jsonl").open()]


def test_where_only_plain_decoding_pays_the_job_never_drafts(pair, inject, tmp_path, monkeypatch):
  """The first job measures the loops' steps on its own batches (the baseline's for the plain
  loop; gamma 1 on its first batch, by the warm call of gamma 1's compile), then decodes plain
  only, its first batch included, and caches the costs; a second job with the cache never drafts
  at all."""
  root, kwargs = pair
  timed = inject(ONLY_PLAIN_PAYS)
  cache = tmp_path / "calibration.json"
  first = infer.infer(
    output_dir=str(tmp_path / "out1"), batch_size=2, calibration_file=str(cache), **kwargs
  )
  spec = _records(tmp_path / "out1", "speculative")
  policy_summary = first["gamma_policy"]
  # Gamma 1 measured on the first batch loses to plain decoding, so the job does not look past
  # it: the costs freeze at that batch, which is decoded plain like every other (on gammas 0..1
  # not even alpha 1 pays), and no batch is decoded at gamma 1.
  assert policy_summary["reasons"] == {policy.NEVER_PAYS: 5}
  assert [r["gamma"] for r in spec] == [0] * 10
  assert timed[:2] == [1, 0]  # the gamma-1 measurement, then the baseline's batch beside it
  settings = infer_settings.InferSettings(output_dir=str(tmp_path / "x"), batch_size=2, **kwargs)
  first_batch = batching.length_sorted_batches(infer_inputs.load_inputs(settings).examples, 2)[0]
  want = sorted(e.index for e in first_batch)
  assert sorted(r["index"] for r in spec if "measured" in r) == want
  assert {r["measured"]["gamma"] for r in spec if "measured" in r} == {1}
  # The measurement, and the baseline's decode of its batch, were also timed without their loop
  # steps (what a call pays once); no other batch's calls were.
  timings = json.loads((tmp_path / "out1" / "timings.json").read_text())
  assert {
    field: {mode: sorted(int(i) for i in by_index) for mode, by_index in timings[field].items()}
    for field in ("stepless_s", "measured_s", "measured_stepless_s")
  } == {
    "stepless_s": {"baseline": want, "speculative": []},
    "measured_s": {"baseline": [], "speculative": want},
    "measured_stepless_s": {"baseline": [], "speculative": want},
  }
  assert all(v > 0 for f in timings.values() for mode in f.values() for v in mode.values())
  calibration = policy_summary["calibration"]
  assert (calibration["source"], calibration["measuring_batches"]) == ("measured", 1)
  assert calibration["measured_batches"] == 1
  cached = costs_lib.load(
    str(cache),
    costs_lib.Calibration.from_json(
      json.loads((tmp_path / "out1" / "manifest.json").read_text())["calibration"]
    ).fields,
  )
  assert dict(cached.costs.loop_steps) == pytest.approx(
    {g: ONLY_PLAIN_PAYS.step(g) for g in (0, 1)}
  )
  report = (tmp_path / "out1" / "report.md").read_text()
  assert "## Gamma 'auto' (0..3; 0 = plain decoding)" in report
  assert "Costs measured on this job's first 1 batch (their own decodes" in report
  assert "1 batch first measured at a gamma not then decoded" in report
  assert "never pays 5" in report
  # A second job on this device, batch and models: the cache's costs, no draft call at all.
  requested = []  # the gammas whose decode function the job asked for
  decode_fn = auto_gamma.AutoGamma.decode_fn
  monkeypatch.setattr(
    auto_gamma.AutoGamma, "decode_fn", lambda self, g: requested.append(g) or decode_fn(self, g)
  )
  timed.clear()
  summary = infer.infer(
    output_dir=str(tmp_path / "out"), batch_size=2, calibration_file=str(cache), **kwargs
  )
  spec = _records(tmp_path / "out", "speculative")
  assert all(r["gamma"] == 0 and r["drafted"] == 0 for r in spec)
  assert [r["tokens"] for r in spec] == [
    r["tokens"] for r in _records(tmp_path / "out", "baseline")
  ]
  # No speculative loop was even asked for: every batch ran the baseline's program (no draft
  # call), and every batch timed (its times join the cached ones) was a plain one.
  assert requested == [0] * 5 and set(timed) == {0}
  # Its plain batches ran the baseline's program, compiled and warm at each length: not again.
  assert summary["speculative"]["compile_s"] == 0.0 and summary["baseline"]["compile_s"] > 0
  policy_summary = summary["gamma_policy"]
  calls_of = {r["index"]: r["target_calls"] for r in spec}
  steps = sum(  # the loop's steps: each batch's (length-sorted, as the job forms them) longest row
    max(calls_of[e.index] for e in batch)
    for batch in batching.length_sorted_batches(infer_inputs.load_inputs(settings).examples, 2)
  )
  assert policy_summary["per_gamma"] == {"0": {"batches": 5, "steps": steps, "examples": 10}}
  assert policy_summary["reasons"] == {policy.NEVER_PAYS: 5}
  assert policy_summary["calibration"]["source"] == "cache"
  manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert manifest["gamma"] == "auto" and manifest["gamma_max"] == 3
  assert costs_lib.LoopTimes.from_json(manifest["calibration"]["times"]) == cached.times
  # At its end the job wrote its own batches' times back to the cache: 10 more plain batches.
  after = costs_lib.load(str(cache), cached.fields).times
  assert after.own[0].steps == cached.times.own[0].steps + 2 * steps
  assert after.own[1:] == cached.times.own[1:]
  # A job without the baseline beside its batches has no paired plain decodes: its loop times do
  # not add to these (the cache key holds it), so it measures its own.
  alone = infer.infer(
    output_dir=str(tmp_path / "alone"),
    batch_size=2,
    calibration_file=str(cache),
    modes=("speculative",),
    **kwargs,
  )
  assert alone["gamma_policy"]["calibration"]["source"] == "measured"


def test_at_batch_1_a_batch_is_decoded_at_the_gamma_it_measures(pair, inject, tmp_path):
  """At batch 1 the warm call after a compile runs slower than the calls after it, so no batch is
  measured on it (`AutoGamma.measures`): the first batch is decoded at gamma 1, as the rules
  choose to measure it, where at batch 2 the same costs decode every batch plain."""
  root, kwargs = pair
  inject(ONLY_PLAIN_PAYS)
  summary = infer.infer(
    output_dir=str(tmp_path / "out"),
    batch_size=1,
    calibration_file=str(tmp_path / "c.json"),
    **kwargs,
  )
  spec = _records(tmp_path / "out", "speculative")
  assert not any("measured" in r for r in spec)
  assert spec[0]["gamma"] == 1 and summary["gamma_policy"]["calibration"]["measured_batches"] == 0
  assert summary["gamma_policy"]["reasons"][policy.CALIBRATE] >= 1


@pytest.mark.parametrize("batch_size", [1, 8])
def test_greedy_auto_equals_the_baseline_with_drafts_accepted(pair, inject, tmp_path, batch_size):
  root, kwargs = pair
  inject(DRAFTS_PAY)
  out = tmp_path / "out"
  summary = infer.infer(
    output_dir=str(out),
    batch_size=batch_size,
    calibration_file=str(tmp_path / "c.json"),
    **kwargs,
  )
  assert summary["identical_outputs"] == len(SOURCES)
  spec = _records(out, "speculative")
  base = _records(out, "baseline")
  assert [r["tokens"] for r in spec] == [r["tokens"] for r in base]
  gammas = {r["gamma"] for r in spec}
  assert gammas and 0 not in gammas, gammas
  events = {
    g: model_utils.speculation_events([r for r in spec if r["gamma"] == g], g, MAX_NEW)
    for g in gammas
  }
  accepted = sum(e["accepted"] for e in events.values())
  drafted = sum(e["drafted"] for e in events.values())
  assert 0 < accepted < drafted, events
  assert any(e["bonus"] for e in events.values()), events  # a fully accepted block, bonus token
  assert any(e["eos"] for e in events.values()) and any(e["capped"] for e in events.values())


def _without_run_facts(gamma_policy):
  """A job's `gamma_policy` less what differs between runs of the same choices: where its costs
  came from and the seconds its stepless calls took."""
  calibration = {k: v for k, v in gamma_policy["calibration"].items()}
  del calibration["source"], calibration["calibration_s"]
  return {**gamma_policy, "calibration": calibration}


@pytest.mark.parametrize("start", ["measuring", "cached"])
def test_a_resumed_sampled_auto_job_is_byte_identical(pair, inject, tmp_path, monkeypatch, start):
  """Temperature 1, batch 1, choices that vary (PROBES_ONLY); the job is interrupted after some
  speculative records and re-run with another cache file. 'measuring': the job measured the costs
  on its own batches, and the re-run measures them again from the finished records, interrupted
  after 1 batch (the re-run ends the measuring on a batch of its own) and after 6 (it ends it while
  replaying the finished batches' choices); 'cached': the job started from the cache's costs, and
  the re-run reads them from its manifest. Either way it finishes byte-identical to an
  uninterrupted job, with the same costs, acceptance estimate and choices."""
  root, kwargs = pair
  kwargs = {**kwargs, "temperature": 1.0, "seed": 3, "batch_size": 1}
  inject(PROBES_ONLY)
  cache = tmp_path / "a.json"
  reference = infer.infer(output_dir=str(tmp_path / "ref"), calibration_file=str(cache), **kwargs)
  assert reference["gamma_policy"]["calibration"]["source"] == "measured"
  if start == "cached":  # the reference and the interrupted job both start from this cache
    shutil.copy(cache, tmp_path / "start.json")  # (each job writes its times back at its end)
    reference = infer.infer(
      output_dir=str(tmp_path / "ref"), calibration_file=str(cache), overwrite=True, **kwargs
    )
    assert reference["gamma_policy"]["calibration"]["source"] == "cache"
  gammas = [r["gamma"] for r in _records(tmp_path / "ref", "speculative")]
  assert len(set(gammas)) > 1, gammas  # the choices vary, so a wrong replay would show
  measured_on = reference["gamma_policy"]["calibration"]["measuring_batches"]
  original = infer_outputs.record
  for finished in [1, 6] if start == "measuring" else [6]:
    if start == "measuring":  # the measuring ends after the finished batches, or among them
      assert (measured_on < finished) == (finished == 6), measured_on
    seen = []

    def interrupted(example, *args):
      seen.append(example.index)
      if len(seen) == 2 * finished + 1:  # `finished` batches of both modes, then a baseline row
        raise KeyboardInterrupt
      return original(example, *args)

    out = tmp_path / f"run{finished}"
    monkeypatch.setattr(infer_outputs, "record", interrupted)
    first_cache = tmp_path / ("start.json" if start == "cached" else f"b{finished}.json")
    with pytest.raises(KeyboardInterrupt):
      infer.infer(output_dir=str(out), calibration_file=str(first_cache), **kwargs)
    assert len(_records(out, "speculative")) == finished
    monkeypatch.setattr(infer_outputs, "record", original)
    resume_cache = tmp_path / f"c{finished}.json"
    resumed = infer.infer(output_dir=str(out), calibration_file=str(resume_cache), **kwargs)
    want = {"measuring": "measured", "cached": "manifest"}[start]
    assert resumed["gamma_policy"]["calibration"]["source"] == want
    for mode in infer_settings.MODES:
      name = f"predictions-{mode}.jsonl"
      assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    assert _without_run_facts(resumed["gamma_policy"]) == _without_run_facts(
      reference["gamma_policy"]
    )


@pytest.mark.parametrize("finished", [1, 3])
def test_a_resumed_job_replays_a_batch_measured_at_a_gamma_it_was_not_decoded_at(
  pair, inject, tmp_path, monkeypatch, finished
):
  """Batch 2, temperature 1, ONLY_PLAIN_PAYS: the first batch is measured at gamma 1 (the warm
  call of its compile) and decoded plain (`AutoGamma.measure`); a job interrupted after 1 or 3
  batches (the measured one among them) resumes from the measurement its records keep (a replay
  without it would choose gamma 1 for the first batch and refuse to resume) and ends
  byte-identical to an uninterrupted job, with the same costs and choices."""
  root, kwargs = pair
  kwargs = {**kwargs, "temperature": 1.0, "seed": 5, "batch_size": 2}
  inject(ONLY_PLAIN_PAYS)
  reference = infer.infer(
    output_dir=str(tmp_path / "ref"), calibration_file=str(tmp_path / "a.json"), **kwargs
  )
  spec = _records(tmp_path / "ref", "speculative")
  assert [r["index"] for r in spec if "measured" in r] == sorted(
    e.index
    for e in batching.length_sorted_batches(
      infer_inputs.load_inputs(
        infer_settings.InferSettings(output_dir=str(tmp_path / "x"), **kwargs)
      ).examples,
      2,
    )[0]
  )
  original = infer_outputs.record
  seen = []

  def interrupted(example, *args):
    seen.append(example.index)
    if len(seen) == 4 * finished + 1:  # `finished` batches of 2 rows, both modes
      raise KeyboardInterrupt
    return original(example, *args)

  out = tmp_path / "run"
  monkeypatch.setattr(infer_outputs, "record", interrupted)
  with pytest.raises(KeyboardInterrupt):
    infer.infer(output_dir=str(out), calibration_file=str(tmp_path / "b.json"), **kwargs)
  assert len(_records(out, "speculative")) == 2 * finished
  monkeypatch.setattr(infer_outputs, "record", original)
  resumed = infer.infer(output_dir=str(out), calibration_file=str(tmp_path / "c.json"), **kwargs)
  for mode in infer_settings.MODES:
    name = f"predictions-{mode}.jsonl"
    assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
  assert _without_run_facts(resumed["gamma_policy"]) == _without_run_facts(
    reference["gamma_policy"]
  )


BAD = [
  (dict(gamma="fast"), "gamma must be an int in \\[1, 32\\] or 'auto', got 'fast'"),
  (dict(gamma=0), "gamma \\(or 'auto'\\) must be in \\[1, 32\\]"),
  (dict(gamma=33), "gamma \\(or 'auto'\\) must be in \\[1, 32\\]"),
  (dict(gamma=3, gamma_max=5), "gamma_max \\(GAMMA_MAX = 5\\) bounds gamma = 'auto' only"),
  (dict(gamma="auto", gamma_max=0), "gamma_max \\(None = 7\\) must be in \\[1, 32\\]"),
  (dict(gamma="auto", gamma_max=33), "gamma_max \\(None = 7\\) must be in \\[1, 32\\]"),
  (dict(gamma="auto", draft_stop_below=0.4), "draft_stop_below \\(0.4\\) shortens drafts"),
  (dict(gamma="auto", adaptive_verify=True), "adaptive_verify narrows it by another rule"),
  (dict(gamma="auto", calibration_file="/proc/x/c.json"), "calibration cache /proc/x/c.json"),
]


@pytest.mark.parametrize("bad, message", BAD, ids=[str(b) for b, _ in BAD])
def test_bad_gamma_settings_are_refused_naming_them(pair, bad, message, tmp_path):
  root, kwargs = pair
  kwargs = {**kwargs, **bad}
  with pytest.raises((ValueError, PermissionError), match=message):
    infer_settings.InferSettings(output_dir=str(tmp_path), **kwargs)


def test_an_unwritable_calibration_cache_is_one_line_before_any_model_loads(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "speculative.infer",
      "--gin_file=configs/local/run.gin",
      f"--gin_bindings=CALIBRATION_FILE = '{blocker}/c.json'",
      f"--gin_bindings=INFER_OUTPUT_DIR = '{tmp_path / 'out'}'",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
  )
  assert proc.returncode == 2, proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert (
    len(lines) == 1 and f"calibration cache {blocker}/c.json: {blocker} is a file" in lines[0]
  ), lines
  assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_timings_file_gives_a_resumed_job_the_measured_batch_timings_back(tmp_path):
  """A resumed job measures its costs again from the finished records: their decode and stepless
  times come back from timings.json as written (the predictions files hold no walltime), so
  `costs.batch_timing` of a batch is the same number before and after."""
  rows = {
    0: {"index": 0, "inputs": "a", "prediction": "x", "tokens": [5, 1], "num_tokens": 2},
    1: {"index": 1, "inputs": "b", "prediction": "y", "tokens": [6, 1], "num_tokens": 2},
  }
  rows[0].update(decode_s=0.125, stepless_s=0.03125, target_calls=2)
  rows[1].update(decode_s=0.25, target_calls=1)  # decoded after the costs froze: no stepless call
  runs = infer_outputs.resume_runs(str(tmp_path), infer_settings.MODES, resume=False)
  for run in runs:
    run.records.update({i: dict(r) for i, r in rows.items()})
    infer_outputs.write_records(str(tmp_path), runs, run)
  assert "decode_s" not in (tmp_path / "predictions-speculative.jsonl").read_text()
  assert "stepless_s" not in (tmp_path / "predictions-speculative.jsonl").read_text()
  for run in infer_outputs.resume_runs(str(tmp_path), infer_settings.MODES):
    assert run.records == rows
    assert costs_lib.batch_timing(run.records.values()) == costs_lib.batch_timing(rows.values())


def test_only_the_first_measuring_batches_are_timed_stepless():
  """While measuring, a batch's calls are also timed without their steps until the stepless calls
  of the plain loop, and of the speculative loops pooled, cover STEPLESS_TOKENS tokens; after the
  measuring, never."""
  fields = {"gamma_max": 3}
  measuring = costs_lib.Calibration(None, None, "k", fields, "measured")
  auto = auto_gamma.AutoGamma(measuring, lambda g: None, cache_path="unused", plain_beside=True)
  half = costs_lib.STEPLESS_TOKENS // 2
  timed = costs_lib.BatchTiming(1.0, 40, 0.1, half, half)
  assert auto.stepless(0) and auto.stepless(1)
  auto.times = auto.times.add_plain(1, timed).add(1, timed)
  assert auto.stepless(0) and auto.stepless(2)  # half of the tokens each
  auto.times = auto.times.add(2, timed)  # gammas 1 and 2 pooled: enough
  assert auto.stepless(0) and not auto.stepless(1) and not auto.stepless(3)
  auto.times = auto.times.add_plain(2, timed)
  assert not auto.stepless(0)
  untimed = costs_lib.BatchTiming(1.0, 40, 0.0, half, 0)
  fresh = auto_gamma.AutoGamma(measuring, lambda g: None, cache_path="unused", plain_beside=True)
  fresh.times = fresh.times.add_plain(1, untimed).add(1, untimed)  # decoded, not timed stepless
  assert fresh.stepless(1)
  frozen = dataclasses.replace(measuring, costs=costs_lib.Costs(((0, 1e-3),), 3), source="cache")
  cached = auto_gamma.AutoGamma(frozen, lambda g: None, cache_path="unused", plain_beside=True)
  assert not cached.stepless(0) and not cached.stepless(1)
