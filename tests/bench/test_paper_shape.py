"""The paper-shape benchmark (speculative/bench/paper_shape.py): its refusals (one line, exit status 2,
before any compute, nothing written), the small-shape switch end to end, and the cells of its
real-walltime table.

  .venv/bin/python -m pytest -q -p no:xdist tests/bench/test_paper_shape.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import model_utils
import pytest

from speculative.bench import costs
from speculative.bench import paper_shape
from speculative.models import memory
from speculative.models import t5 as t5_lib

SMALL = "configs/benchmark/paper_shape_small.gin"


def _run(capsys, tmp_path, *bindings, gin_file=SMALL):
  out = tmp_path / "out"
  argv = [f"--gin_file={gin_file}", f"--gin_bindings=paper_shape.output_dir = '{out}'"]
  argv += [f"--gin_bindings={b}" for b in bindings]
  with pytest.raises(SystemExit) as exit_info:
    paper_shape.main(argv)
  captured = capsys.readouterr()
  return exit_info.value.code, captured.err.strip().splitlines(), out


def test_a_shape_that_does_not_fit_is_refused_in_one_line(capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(memory, "device_memory", lambda: (int(50e6), "a 50 MB test device"))
  code, err, out = _run(capsys, tmp_path)
  assert code == 2 and len(err) == 1, err
  assert "target_config's shape does not fit this device: it needs ~0.1 GB" in err[0]
  assert "the device has 0.1 GB (a 50 MB test device)" in err[0]
  assert not out.exists()


@pytest.mark.slow  # traces T5 1.1 XXL's init for its shapes (~15 s on a quiet 2-core CPU)
def test_the_paper_shape_is_refused_on_a_16_gb_device(capsys, tmp_path, monkeypatch):
  monkeypatch.setattr(memory, "device_memory", lambda: (int(16e9), "a 16 GB test device"))
  code, err, out = _run(capsys, tmp_path, gin_file="configs/benchmark/paper_shape.gin")
  assert code == 2 and len(err) == 1, err
  # T5 1.1 XXL's widths and depths with the pair's 8k vocabulary (10.94B params) and T5 1.1 small's
  # (0.06B): 22.0 GB in bfloat16.
  assert "weights 22.0 GB" in err[0] and "16.0 GB (a 16 GB test device)" in err[0]
  assert not out.exists()


@pytest.mark.parametrize(
  "binding, message",
  [
    ("VOCAB_SIZE = 32128", "source_config -> target_config: cannot grow: vocab_size differs "),
    ("paper_shape_small/t5.T5Config.head_dim = 128", "cannot grow: head_dim differs (64 vs 128)"),
  ],
)
def test_a_grown_target_with_another_vocabulary_or_head_size_is_refused(
  capsys, tmp_path, binding, message
):
  code, err, out = _run(capsys, tmp_path, binding)
  assert code == 2 and len(err) == 1 and message in err[0], err
  assert not out.exists()


@pytest.mark.slow
def test_the_small_shape_switch_runs_every_part(capsys, tmp_path):
  out = tmp_path / "out"
  paper_shape.main(
    [
      f"--gin_file={SMALL}",
      f"--gin_bindings=paper_shape.output_dir = '{out}'",
      "--gin_bindings=paper_shape.num_examples = 2",
      "--gin_bindings=paper_shape.max_new_tokens = 12",
    ]
  )
  printed = capsys.readouterr().out
  for heading in ("## Costs (batch 1)", "## Theorem 3.8", "## Real walltime"):
    assert heading in printed
  saved = json.loads(Path(out, "results.json").read_text())
  costs = saved["costs"]
  assert sorted(costs["v"], key=int) == [str(t) for t in range(1, 9)]
  assert costs["c"] > 0 and costs["loop_overhead"] > 0 and costs["bandwidth_share"] > 0
  for label, alpha in paper_shape.PAPER_ALPHAS:
    entry = costs["theorem_3_8"][label]
    assert entry["alpha"] == alpha and sorted(entry["speedup"], key=int) == [
      str(g) for g in range(1, 9)
    ]
  (group,) = saved["real"]["groups"]
  names = [row["name"] for row in group["baselines"] + group["speculative"]]
  assert names[0] == "baseline" and "model/gamma=3" in names
  for row in group["speculative"]:  # greedy: identical or audited, never a mismatch
    assert row["identical_to_baseline"] + len(row.get("divergences", [])) == 2
    assert not row.get("audit_mismatch")


def test_the_real_walltime_table_reads_a_refused_prediction_as_every_table_does():
  row = dict(temperature=0.0, ms_per_token=10.0, identical_to_baseline=2, examples=2)
  base = dict(row, name="baseline", method="baseline")
  spec = dict(row, name="model/gamma=3", method="speculative", ms_per_token=8.0)
  spec.update(speedup_vs_stock=1.5, alpha_used=0.7, predicted_speedup=None)
  real = dict(grow_s=1.0, c=0.1, v={"1": 1.0, "4": 1.2}, groups=[])
  real["groups"].append(dict(baselines=[base], speculative=[spec]))
  report = dict(real=real, source="target", shipped_draft="draft")

  def cells():
    text = "\n".join(paper_shape._real_lines(report))
    return [line.split(" | ")[3:7] for line in text.splitlines() if line.startswith("| 0 |")]

  assert cells() == [
    ["1.00x", "-", "-", "-"],  # the baseline: nothing predicted
    ["1.25x", "1.50x", "0.700", costs.TOO_NOISY],
  ]
  spec["predicted_speedup"] = 1.234
  assert cells()[1][3] == "1.23x"


@model_utils.kernels_run_here_mark()
def test_the_memory_need_counts_the_pair_packed_for_the_cpu_kernels():
  """Where batch 1 decodes on the CPU kernels, the pair's decoders are held packed beside their
  bfloat16 weights (`methods.bench_models`): the need is exactly those bytes more than on XLA's."""
  target, draft = model_utils.tiny_t5_config(2), model_utils.tiny_t5_config(1)
  fields = dict(target_config=target, draft_config=draft, max_new_tokens=12, cost_position=8)
  on, off = (
    paper_shape.PaperShapeSettings(kernels=k, **fields).memory_need() for k in ("on", "off")
  )
  packed = 0
  for config in (target, draft):  # what pack_decode_params makes of the pair's bfloat16 weights
    model = t5_lib.T5(config)
    params = model.init_params(jax.random.PRNGKey(0), "bfloat16")
    packed += sum(
      x.nbytes for x in jax.tree_util.tree_leaves(t5_lib.pack_decode_params(model, params).packed)
    )
  assert off.packed == 0 and on == dataclasses.replace(off, packed=packed)
