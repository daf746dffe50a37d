"""The pair's training on one accelerator, in one process: grow the multi-task target from the
small target, train it on translation + summarization, decode the distillation set (the target's
greedy outputs on the training inputs of both tasks), train two drafts on it side by side, evaluate,
and export bfloat16 weights in chunks that the device tool can bring back.

First, here, the small pair it starts from, out of git history (into a folder the device tool
carries: `.device/` is git-ignored):
  .venv/bin/python -m speculative.train.pair --fetch_sources --sources .device/small_pair
Device call (the device tool's `run`, one command, carry ['.device', '.whl'] where .whl holds the
gin-config wheel; docs/training.md, "The pair on an accelerator", has the whole procedure):
  PYTHONUNBUFFERED=1 python3 -m speculative.train.pair --sources .device/small_pair \
      --out_dir /root/pair --first_dir $OUT
then, at once while the machine is warm, a second call returns the rest:
  cp /root/pair/second/* $OUT/ && sha256sum $OUT/*
and `python -m speculative.train.transport collect` joins and verifies both calls' files here.
To continue a trained pair instead (both models from their weights, fresh optimizers, the one
draft shape that ships), carry it over in parts (`transport pack_upload` here, one part per call,
`transport unpack_upload` there; docs/training.md, "The pair on an accelerator") and add
`--continue_from <folder with target.msgpack and draft.msgpack>`.
CPU dry run of the same code at toy shapes and budgets (~2 min on 2 cores):
  .venv/bin/python -m speculative.train.pair --toy --sources .device/small_pair \
      --out_dir /tmp/pair_toy --first_dir /tmp/pair_toy/first

Why one process with wall-clock budgets: a lease is minutes, every distinct batch shape compiles
(~45 s for the target's train step), so the shapes are few and compiled in threads while the device
works, and the learning rate warms up over `warmup_steps` steps, then follows the wall clock
(constant, then a linear cooldown over the last `cooldown_fraction` of the seconds) through
`optax.inject_hyperparams`, so no schedule's length is guessed in steps.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import shutil
import time
from typing import Any
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative import checkpoints
from speculative.data import corpus
from speculative.data import metrics
from speculative.data import overlap
from speculative.data import tasks
from speculative.infer import inputs as infer_inputs
from speculative.models import grow
from speculative.models import t5 as t5_lib
from speculative.train import data as train_data
from speculative.train import distill_data
from speculative.train import draft_agreement
from speculative.train import steps
from speculative.train import transport

SPM_MODEL = "data/libreoffice_ende/spm8k.model"
TRANSLATION_TRAIN = ("data/libreoffice_ende/train.tsv.gz", "data/libreoffice_ui_ende/train.tsv.gz")
SUMMARIZATION_TRAIN = ("data/debian_descriptions/train.tsv.gz",)
HELDOUT = {
  "translate": ("data/libreoffice_ende/validation.tsv.gz", "data/libreoffice_ende/test.tsv.gz"),
  "summarize": (
    "data/debian_descriptions/validation.tsv.gz",
    "data/debian_descriptions/test.tsv.gz",
  ),
}
PREFIX = {"translate": tasks.TRANSLATE_EN_DE_PREFIX, "summarize": tasks.SUMMARIZE_PREFIX}
MODELS = {  # name: (gin file, macro)
  "small_target": ("configs/models/small_target.gin", "SMALL_TARGET"),
  "target": ("configs/models/embedded_target.gin", "EMBEDDED_TARGET"),
  "small_draft": ("configs/models/small_draft.gin", "SMALL_DRAFT"),
  "embedded_draft": ("configs/models/embedded_draft.gin", "EMBEDDED_DRAFT"),
}
# The small pair the recipe starts from (the embedded pair before this one): the target is grown
# from the small target, both drafts start from the small draft. `--fetch_sources` writes them (and
# their sidecars) from git history into `--sources`.
SMALL_PAIR_COMMIT = "4feb4d0804bddc9f3e007f525b6619499ece3d20"
SOURCES = {
  "small_target": "models/embedded/target.msgpack",
  "small_draft": "models/embedded/draft.msgpack",
}


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Budgets and shapes of one device call (the defaults) or of the CPU dry run (`toy`)."""

  target_seconds: float = 130.0
  draft_seconds: float = 70.0
  target_lr: float = 3e-3  # Adafactor peak: a grown, already-trained model, batches of ~32k tokens
  draft_lr: float = 1e-2  # the drafts' CPU recipe's peak
  warmup_steps: int = 100
  cooldown_fraction: float = 0.3  # linear to 0 over the last 30% of each phase's seconds
  tokens_per_batch: int = 32768  # padded tokens (inputs + targets) per batch
  buckets: tuple = ((32, 32), (64, 64), (128, 128), (256, 48))
  translation_repeats: int = 2  # translation examples listed twice in the mixed stream
  eval_every_seconds: float = 20.0
  validation_examples: int = 500
  decode_batch: int = 512
  inputs_length: tuple = (("translate", 128), ("summarize", 256))
  new_tokens: tuple = (("translate", 128), ("summarize", 64))
  chunk_bytes: int = 16_600_000  # the device tool returns files of at most 16 MiB, 64 MiB a call
  first_call_chunks: int = 4  # <= 64 MiB in the first call's $OUT
  examples_per_task: int | None = None  # None: every training example
  test_examples: int | None = None  # None: every test example
  seed: int = 0

  def lengths(self, task: str) -> tuple[int, int]:
    return dict(self.inputs_length)[task], dict(self.new_tokens)[task]


TOY = Recipe(
  target_seconds=25.0,
  draft_seconds=15.0,
  tokens_per_batch=1024,
  buckets=((32, 32), (64, 32)),
  eval_every_seconds=10.0,
  validation_examples=32,
  decode_batch=32,
  inputs_length=(("translate", 64), ("summarize", 64)),
  new_tokens=(("translate", 16), ("summarize", 16)),
  chunk_bytes=2_000_000,
  first_call_chunks=2,
  examples_per_task=96,
  test_examples=32,
)


def log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ------------------------------------------------------------------------------------------------
# Data.


@dataclasses.dataclass
class TaskData:
  """One task's tokenized splits; test keeps its strings for the metrics."""

  train_pairs: list  # [(source, target)] after the held-out filter
  train: list  # [(inputs [S] int32, targets [T] int32)], EOS appended
  validation: list
  test_pairs: list
  test_inputs: list  # [inputs [S] int32]


def load_task(task: str, files: Sequence[str], recipe: Recipe) -> TaskData:
  pairs = [p for path in files for p in train_data.read_tsv(path)][: recipe.examples_per_task]
  heldout = [p for path in HELDOUT[task] for p in train_data.read_tsv(path)]
  drop, report = overlap.find_overlap(pairs, heldout)
  pairs = [p for p, d in zip(pairs, drop) if not d]
  log(f"{task}: {len(pairs)} training pairs after the held-out filter {json.dumps(report)}")
  validation = train_data.read_tsv(HELDOUT[task][0])[: recipe.validation_examples]
  test = train_data.read_tsv(HELDOUT[task][1])[: recipe.test_examples]
  inputs_length, _ = recipe.lengths(task)
  test_tok = train_data.tokenize_pairs(test, SPM_MODEL, PREFIX[task])
  return TaskData(
    train_pairs=pairs,
    train=train_data.tokenize_pairs(pairs, SPM_MODEL, PREFIX[task]),
    validation=train_data.tokenize_pairs(validation, SPM_MODEL, PREFIX[task]),
    test_pairs=test,
    test_inputs=[infer_inputs.truncate(src, inputs_length)[0] for src, _ in test_tok],
  )


def mixed(translate: list, summarize: list, recipe: Recipe) -> list:
  return translate * recipe.translation_repeats + summarize


# ------------------------------------------------------------------------------------------------
# Training.


def make_optimizer() -> optax.GradientTransformation:
  """Gradient clipping at 1.0, then T5X's Adafactor with a run-time learning rate."""
  return optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.inject_hyperparams(steps.adafactor, static_args=("weight_decay",))(learning_rate=0.0),
  )


def set_learning_rate(opt_state, value: float):
  opt_state[1].hyperparams["learning_rate"] = jnp.asarray(value, jnp.float32)
  return opt_state


@dataclasses.dataclass
class Trainee:
  """A model being trained: its params, optimizer state, jitted steps and best validation."""

  name: str
  config: t5_lib.T5Config  # as served (no dropout); trained with `dropout_rate`
  params: Any
  peak_lr: float
  started_from: str = "small_draft"  # recorded in the exported weights' provenance
  dropout_rate: float = 0.1
  label_smoothing: float = 0.1
  opt_state: Any = None
  train_step: Any = None
  eval_step: Any = None
  steps_done: int = 0
  best: tuple | None = None  # (score, params, opt_state, metrics)
  lr_scale: float = 1.0  # halved when a validation blows up (the params go back to the best)
  history: list = dataclasses.field(default_factory=list)

  def __post_init__(self):
    model = t5_lib.T5(dataclasses.replace(self.config, dropout_rate=self.dropout_rate))
    optimizer = make_optimizer()
    self.opt_state = optimizer.init(self.params)
    self.train_step = steps.make_train_step(
      steps.StepConfig(model=model, label_smoothing=self.label_smoothing), optimizer
    )
    self.eval_step = steps.make_eval_step(t5_lib.T5(self.config))

  def warm_calls(self, buckets) -> list:
    """One call per batch shape, to compile them all in threads before (or while) training."""
    rng = jax.random.PRNGKey(0)
    calls = []
    for bucket in buckets:
      batch = train_data.make_batch([], [], bucket)
      calls.append(lambda b=batch: self.train_step(self.params, self.opt_state, b, rng, None))
      calls.append(lambda b=batch: self.eval_step(self.params, b))
    return calls


def learning_rate(trainee: Trainee, fraction: float, recipe: Recipe) -> float:
  """Warmup over the trainee's first steps, then the peak, then linear to 0 over the last
  `cooldown_fraction` of the phase's seconds (`fraction` = elapsed / budget)."""
  warm = min(1.0, (trainee.steps_done + 1) / recipe.warmup_steps)
  cool = min(1.0, max(0.0, 1.0 - fraction) / recipe.cooldown_fraction)
  return trainee.peak_lr * trainee.lr_scale * warm * cool


def evaluate(trainee: Trainee, val_sets: dict, buckets) -> dict:
  out = {}
  for task, examples in val_sets.items():
    m = steps.evaluate(trainee.eval_step, trainee.params, examples, buckets, f"val_{task}")
    out.update({k: v for k, v in m.items() if "entropy" not in k})
  out["val_score"] = sum(out[f"val_{task}_nll"] for task in val_sets)
  return out


def train_for(
  trainees: list,
  examples: list,
  val_sets: dict,
  seconds: float,
  recipe: Recipe,
  buckets,
  background: Sequence = (),
) -> None:
  """Trains every trainee on the same batch stream for `seconds` of wall clock; evaluates every
  `eval_every_seconds` on `val_sets` ({task: examples}) and keeps each one's best validation state
  (the sum of its tasks' NLL; never a NaN or infinite one, FloatingPointError if none was finite);
  a validation that is not finite or 0.5 nats above the best restores the best and halves the
  learning rate. `background`: calls run in threads meanwhile (compiling the next phase)."""
  pool = concurrent.futures.ThreadPoolExecutor(max(1, len(background)))
  pending = [pool.submit(call) for call in background]
  stream = train_data.batch_stream(examples, buckets, recipe.seed)
  start = time.time()
  next_eval = recipe.eval_every_seconds
  key = jax.random.PRNGKey(recipe.seed + 1)
  last: list = [None] * len(trainees)
  while True:
    elapsed = time.time() - start
    fraction = elapsed / seconds
    batch = next(stream)
    for k, t in enumerate(trainees):
      t.opt_state = set_learning_rate(t.opt_state, learning_rate(t, fraction, recipe))
      rng = jax.random.fold_in(jax.random.fold_in(key, t.steps_done), k)
      previous = last[k]
      t.params, t.opt_state, last[k] = t.train_step(t.params, t.opt_state, batch, rng, None)
      t.steps_done += 1
      if previous is not None:  # one step in flight: the wall clock measures the device's work
        previous["loss"].block_until_ready()
    if elapsed >= next_eval or fraction >= 1.0:
      for k, t in enumerate(trainees):
        _evaluate_and_keep(t, val_sets, buckets, elapsed, float(last[k]["loss"]))
      next_eval = elapsed + recipe.eval_every_seconds
    if fraction >= 1.0:
      break
  for future in pending:
    future.result()  # a failed compile fails the run here, not later
  pool.shutdown()
  for t in trainees:  # every validation was NaN or infinite: no weights to export
    if t.best is None:
      raise FloatingPointError(f"{t.name}: every validation to step {t.steps_done} was not finite")


def _evaluate_and_keep(t: Trainee, val_sets, buckets, elapsed: float, loss: float) -> None:
  m = evaluate(t, val_sets, buckets)
  m.update(
    step=t.steps_done,
    seconds=round(elapsed, 1),
    train_loss=loss,
    lr=float(t.opt_state[1].hyperparams["learning_rate"]),
  )
  finite = bool(np.isfinite(m["val_score"]))
  if not finite:  # NaN compares False with every score: kept, it would stay the best for good
    m["not_finite"] = True  # in the log line and the report's history: never the best
  t.history.append(m)
  log(
    f"{t.name} " + json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in m.items()})
  )
  if finite and (t.best is None or m["val_score"] < t.best[0]):
    t.best = (m["val_score"], t.params, t.opt_state, m)
  elif t.best is not None and (not finite or m["val_score"] > t.best[0] + 0.5):
    t.params, t.opt_state, t.lr_scale = t.best[1], t.best[2], t.lr_scale * 0.5
    log(f"{t.name}: validation blew up; back to step {t.best[3]['step']}, lr x{t.lr_scale}")


# ------------------------------------------------------------------------------------------------
# Decoding.


def _greedy(decode, params, inputs: list, recipe: Recipe, task: str) -> list:
  inputs_length, _ = recipe.lengths(task)
  return distill_data.greedy_outputs(decode, params, inputs, recipe.decode_batch, inputs_length)


def distillation_set(task: str, data: TaskData, outputs: list) -> tuple[list, dict]:
  """(inputs, the target's output) training examples: outputs that loop, stop at the cap without
  EOS or are empty are dropped (`distill_data.drop_reason`), then every pair whose source or
  output matches a held-out side (`overlap`), as the CPU recipe's distillation set."""
  texts = distill_data.detokenize(outputs, SPM_MODEL)
  counts = {"records": len(outputs), "looping": 0, "no_eos": 0, "empty": 0}
  kept = []
  for i, ((src, _), text, toks) in enumerate(zip(data.train_pairs, texts, outputs)):
    record = {"inputs": PREFIX[task] + src, "prediction": text, "tokens": [int(t) for t in toks]}
    reason = distill_data.drop_reason(record, PREFIX[task])
    if reason is None:
      kept.append(i)
    else:
      counts[reason] += 1
  heldout = [p for path in HELDOUT[task] for p in train_data.read_tsv(path)]
  pairs = [(data.train_pairs[i][0], texts[i].strip()) for i in kept]
  drop, report = overlap.find_overlap(pairs, heldout) if pairs else ([], {})
  examples = [(data.train[i][0], outputs[i]) for i, d in zip(kept, drop) if not d]
  counts.update(kept=len(examples), heldout_dropped=int(sum(drop)))
  log(f"distillation set, {task}: {json.dumps(counts)}")
  return examples, dict(counts, heldout=report)


# ------------------------------------------------------------------------------------------------
# The recipe.


def load_configs(toy: bool) -> dict[str, t5_lib.T5Config]:
  from speculative.jobs import gin_utils

  configs = {
    name: gin_utils.load_macro(path, macro, t5_lib.T5Config)
    for name, (path, macro) in MODELS.items()
  }
  if toy:  # the draft's shape grown by a decoder layer stands in for the target
    configs["small_target"] = configs["small_draft"]
    configs["target"] = dataclasses.replace(configs["small_draft"], num_decoder_layers=3)
  return configs


def as_served(params) -> Any:
  """The params rounded through bfloat16, as the exported weights are served."""
  return jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)


def source_path(sources: str, name: str) -> str:
  return os.path.join(sources, f"{name}.msgpack")


def fetch_sources(sources: str) -> None:
  """Writes the small pair's weights and sidecars from git history (`SMALL_PAIR_COMMIT`)."""
  import subprocess

  os.makedirs(sources, exist_ok=True)
  for name, path in SOURCES.items():
    for suffix in ("", ".json"):
      data = subprocess.run(
        ["git", "show", f"{SMALL_PAIR_COMMIT}:{path}{suffix}"], capture_output=True, check=True
      ).stdout
      with open(source_path(sources, name) + suffix, "wb") as f:
        f.write(data)
    checkpoints.verify_weights(source_path(sources, name))
    print(f"wrote {source_path(sources, name)} (from {SMALL_PAIR_COMMIT[:7]}:{path})")


def run(
  out_dir: str,
  first_dir: str,
  recipe: Recipe,
  toy: bool,
  sources: str,
  continue_from: str | None = None,
) -> dict:
  t0 = time.time()
  log(f"jax {jax.__version__}, devices {jax.devices()}")
  configs = load_configs(toy)
  source = "small_draft" if toy else "small_target"
  data = {
    "translate": load_task("translate", TRANSLATION_TRAIN, recipe),
    "summarize": load_task("summarize", SUMMARIZATION_TRAIN, recipe),
  }
  buckets = train_data.make_buckets(recipe.buckets, recipe.tokens_per_batch)
  val_sets = {task: d.validation for task, d in data.items()}
  report: dict = {
    "recipe": dataclasses.asdict(recipe),
    "jax": jax.__version__,
    "device": str(jax.devices()[0].device_kind),
    "toy": toy,
  }

  # 1. The target: grown from the small target (or continued from a trained pair's target, with a
  # fresh optimizer), trained on both tasks.
  if continue_from:
    source = os.path.join(continue_from, "target.msgpack")
    start = checkpoints.load_params(source, dtype=np.float32, config=configs["target"])
    report["continued_from"] = {
      name: checkpoints.verify_weights(os.path.join(continue_from, f"{name}.msgpack"))
      for name in ("target", "draft")
    }
  else:
    small = checkpoints.load_params(source_path(sources, source), dtype=np.float32)
    start = grow.grow_params(small, configs[source], configs["target"], recipe.seed)
  start = jax.tree_util.tree_map(jnp.asarray, start)
  target = Trainee("target", configs["target"], start, recipe.target_lr)
  target_model = t5_lib.T5(configs["target"])
  decoders = {task: distill_data.greedy_fn(target_model, recipe.lengths(task)[1]) for task in data}
  drafts = _make_drafts(configs, recipe, sources, continue_from)
  _compile([*target.warm_calls(buckets)])
  log(f"target compiled ({time.time() - t0:.0f} s); training {recipe.target_seconds:.0f} s")
  if continue_from:  # the starting point is a candidate too: training must beat it to replace it
    _evaluate_and_keep(target, val_sets, buckets, 0.0, float("nan"))
  background = [lambda t=t: _warm_decode(decoders[t], target.params, recipe, t) for t in data]
  background += [call for d in drafts for call in d.warm_calls(buckets)]
  train_for(
    [target],
    mixed(data["translate"].train, data["summarize"].train, recipe),
    val_sets,
    recipe.target_seconds,
    recipe,
    buckets,
    background,
  )
  target_params = as_served(target.best[1])
  report["target"] = {"history": target.history, "best": target.best[3], "steps": target.steps_done}
  target_path = os.path.join(out_dir, "target.msgpack")
  checkpoints.save_params(
    target.best[1],
    target_path,
    "bfloat16",
    configs["target"],
    extra={"training": _provenance("target", target, recipe, source)},
  )
  manifest = transport.split(
    target_path, out_dir, first_dir, recipe.chunk_bytes, recipe.first_call_chunks
  )
  log(f"target exported ({time.time() - t0:.0f} s): {json.dumps(manifest)}")

  # 2. The distillation set: the target's greedy outputs on every training input of both tasks.
  distilled, report["distillation"] = {}, {}
  for task, d in data.items():
    outputs = _greedy(decoders[task], target_params, [s for s, _ in d.train], recipe, task)
    distilled[task], report["distillation"][task] = distillation_set(task, d, outputs)
  log(f"distillation set decoded ({time.time() - t0:.0f} s)")
  empty = [task for task, examples in distilled.items() if not examples]
  if len(empty) == len(distilled):
    raise ValueError("every distillation set is empty: the target kept no output (see the counts)")
  for task in empty:  # e.g. the toy run's summaries, which never reach EOS in 16 tokens
    log(f"warning: the {task} distillation set is empty; the drafts train on the other task only")

  # 3. The drafts, side by side on the same batches, validated on the target's own greedy outputs
  # of the validation inputs (what their alpha is measured on).
  val_distilled = {}
  for task, d in data.items():
    outputs = _greedy(decoders[task], target_params, [s for s, _ in d.validation], recipe, task)
    val_distilled[task] = [(s, o) for (s, _), o in zip(d.validation, outputs) if len(o)]
  if continue_from:
    for d in drafts:
      _evaluate_and_keep(d, val_distilled, buckets, 0.0, float("nan"))
  train_for(
    drafts,
    mixed(distilled["translate"], distilled["summarize"], recipe),
    val_distilled,
    recipe.draft_seconds,
    recipe,
    buckets,
  )
  log(f"drafts trained ({time.time() - t0:.0f} s)")

  # 4. Test: the target's greedy outputs and metrics, each draft's teacher-forced alpha on them.
  report["test"] = _test(data, decoders, target_params, drafts, recipe, out_dir)
  for d in drafts:  # the weights travel in the second call, their sidecars in its results
    path = os.path.join(out_dir, f"{d.name}.msgpack")
    checkpoints.save_params(
      d.best[1],
      path,
      "bfloat16",
      configs[d.name],
      extra={"training": _provenance(d.name, d, recipe, d.started_from)},
    )
    shutil.move(path, os.path.join(out_dir, "second", f"{d.name}.msgpack"))
    report[d.name] = {
      "history": d.history,
      "best": d.best[3],
      "steps": d.steps_done,
      "sha256": corpus.sha256_file(os.path.join(out_dir, "second", f"{d.name}.msgpack")),
    }
  report["seconds"] = round(time.time() - t0, 1)
  with open(os.path.join(out_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=1, default=float)
  transport.pack_results(out_dir, os.path.join(out_dir, "second", "results.tar.gz"))
  shutil.copy(os.path.join(out_dir, "report.json"), os.path.join(first_dir, "report.json"))
  log(f"done in {report['seconds']} s; second call: cp {out_dir}/second/* $OUT/")
  return report


def _make_drafts(
  configs, recipe: Recipe, sources: str, continue_from: str | None = None
) -> list[Trainee]:
  """The small draft (from its weights) and the embedded draft's shape (grown from them); or,
  continuing a trained pair, its draft alone (the embedded draft's shape, from its weights)."""
  to_jax = lambda p: jax.tree_util.tree_map(jnp.asarray, p)  # noqa: E731
  if continue_from:
    path = os.path.join(continue_from, "draft.msgpack")
    config = configs["embedded_draft"]
    params = checkpoints.load_params(path, dtype=np.float32, config=config)
    return [Trainee("embedded_draft", config, to_jax(params), recipe.draft_lr, started_from=path)]
  small = checkpoints.load_params(source_path(sources, "small_draft"), dtype=np.float32)
  wide = grow.grow_params(small, configs["small_draft"], configs["embedded_draft"], recipe.seed)
  return [
    Trainee(name, configs[name], to_jax(p), recipe.draft_lr)
    for name, p in (("small_draft", small), ("embedded_draft", wide))
  ]


def _compile(calls: Sequence) -> None:
  """Runs every call once, in threads: XLA compiles them side by side."""
  with concurrent.futures.ThreadPoolExecutor(max(1, len(calls))) as pool:
    list(pool.map(lambda call: jax.block_until_ready(call()), calls))


def _warm_decode(decode, params, recipe: Recipe, task: str):
  inputs_length, _ = recipe.lengths(task)
  enc = jnp.ones((recipe.decode_batch, inputs_length), jnp.int32)
  return jax.block_until_ready(decode(params, enc).tokens)


def _test(data, decoders, target_params, drafts, recipe: Recipe, out_dir: str) -> dict:
  """The target's greedy test outputs of each task (written to `out_dir/test_<task>.jsonl`), their
  metrics, and each draft's teacher-forced alpha and block efficiency on them."""
  out = {}
  for task, d in data.items():
    tokens = _greedy(decoders[task], target_params, d.test_inputs, recipe, task)
    texts = distill_data.detokenize(tokens, SPM_MODEL)
    refs = [t for _, t in d.test_pairs]
    m = {"examples": len(texts), **metrics.loop_rate(refs, texts)}
    m["no_eos"] = sum(1 for t in tokens if not len(t) or t[-1] != tasks.EOS_ID) / len(tokens)
    m.update(metrics.task_metrics(task, refs, texts))
    examples = [(src, toks) for src, toks in zip(d.test_inputs, tokens) if len(toks)]
    positions = sum(len(t) for _, t in examples)
    for draft in drafts:
      model = t5_lib.T5(draft.config)
      agree = draft_agreement.agreement(model, as_served(draft.best[1]), examples, batch_size=2048)
      m[f"{draft.name}_alpha"] = float(np.concatenate(agree).mean())
      for gamma in (3, 5, 7):
        calls = sum(draft_agreement.greedy_target_calls(a, gamma) for a in agree)
        m[f"{draft.name}_block_efficiency_gamma{gamma}"] = positions / calls
    out[task] = m
    log(f"test {task}: {json.dumps(m)}")
    rows = [
      {"source": src, "reference": ref, "prediction": text, "tokens": [int(t) for t in toks]}
      for (src, ref), text, toks in zip(d.test_pairs, texts, tokens)
    ]
    with open(os.path.join(out_dir, f"test_{task}.jsonl"), "w") as f:
      f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
  return out


def _provenance(name: str, trainee: Trainee, recipe: Recipe, started_from: str) -> dict:
  best = trainee.best[3]
  return {
    "recipe": "speculative.train.pair",
    "step": best["step"],
    "seconds": best["seconds"],
    "steps_run": trainee.steps_done,
    **{k: v for k, v in best.items() if k.startswith("val_")},
    "optimizer": "adafactor",
    "schedule": "wall clock: warmup, constant, linear cooldown",
    "learning_rate": trainee.peak_lr,
    "tokens_per_batch": recipe.tokens_per_batch,
    "started_from": started_from,
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
  }


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out_dir", help="everything, kept on the machine")
  parser.add_argument("--first_dir", help="what the first call returns ($OUT)")
  parser.add_argument("--sources", default="../runs/small_pair", help="the small pair's weights")
  parser.add_argument("--fetch_sources", action="store_true", help="write them from git history")
  parser.add_argument("--toy", action="store_true", help="toy shapes and budgets (CPU dry run)")
  parser.add_argument("--target_seconds", type=float)
  parser.add_argument("--draft_seconds", type=float)
  parser.add_argument("--target_lr", type=float)
  parser.add_argument(
    "--continue_from",
    help="a trained pair's folder (target.msgpack, draft.msgpack): continue both, fresh optimizers",
  )
  args = parser.parse_args(argv)
  if args.fetch_sources:
    fetch_sources(args.sources)
    return
  if not (args.out_dir and args.first_dir):
    parser.error("--out_dir and --first_dir are required to train")
  if args.continue_from:  # both files, their hashes and shapes checked before any compute
    configs = load_configs(args.toy)
    for name, config in (("target", configs["target"]), ("draft", configs["embedded_draft"])):
      path = os.path.join(args.continue_from, f"{name}.msgpack")
      if not os.path.isfile(path):
        parser.error(f"{path} is missing")
      try:
        checkpoints.verify_weights(path, config)
      except checkpoints.CheckpointError as err:
        parser.error(str(err))
  else:
    for name in ("small_target", "small_draft"):
      if not os.path.isfile(source_path(args.sources, name)):
        parser.error(f"{source_path(args.sources, name)} is missing (write it: --fetch_sources)")
  recipe = TOY if args.toy else Recipe()
  changes = {k: getattr(args, k) for k in ("target_seconds", "draft_seconds", "target_lr")}
  recipe = dataclasses.replace(recipe, **{k: v for k, v in changes.items() if v is not None})
  for path in (args.out_dir, args.first_dir, os.path.join(args.out_dir, "second")):
    os.makedirs(path, exist_ok=True)
  cache = os.path.join(args.out_dir, "jax_cache")  # a retry on the same machine skips compiles
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  run(args.out_dir, args.first_dir, recipe, args.toy, args.sources, args.continue_from)


if __name__ == "__main__":
  main()
