"""The job's batches: every mode over each batch, interleaved, timed warm, and written as soon as
the batch is done; 'auto''s choice of gamma per batch (speculative/infer/auto_gamma.py) made
before it, and its measurements taken on the calls its programs' compiles make anyway."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import timing
from speculative.decode import batching
from speculative.decode import modes
from speculative.infer import auto_gamma
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs
from speculative.infer import settings as infer_settings
from speculative.jobs import checks
from speculative.jobs import interrupts
from speculative.jobs import resources


def decode_all(
  settings: infer_settings.InferSettings,
  inputs: infer_inputs.JobInputs,
  runs: Sequence[outputs.ModeRun],
  claim: Callable[[], None],
) -> None:
  """Decodes every example some mode has not finished, batch by batch (length-sorted), the modes
  interleaved; each batch's records are written as soon as it is done (`claim` before the first
  write). A signal during a write ends the job after it (`interrupts.deferred`): the records in
  memory are the records on disk. An 'auto' mode first replays the choices of the batches it
  finished before (`AutoGamma.replay`), then chooses each batch's gamma before decoding it."""
  from tqdm import tqdm

  examples = inputs.examples
  plain = next((run for run in runs if run.name == modes.BASELINE), None)
  auto_run = next((r for r in runs if isinstance(r.decode, auto_gamma.AutoGamma)), None)
  for run in runs:
    if isinstance(run.decode, auto_gamma.AutoGamma):
      with checks.user_errors():
        run.decode.replay(
          auto_gamma.done_batches(examples, run.records, settings.batch_size),
          run.records,
          plain.records if plain is not None else None,
        )
  todo = [e for e in examples if any(e.index not in run.records for run in runs)]
  if len(todo) < len(examples):
    print(f"resuming: {len(examples) - len(todo)} of {len(examples)} examples already done")
  batches = batching.length_sorted_batches(todo, settings.batch_size)
  with tqdm(batches, desc="decoding", unit="batch", disable=not settings.progress) as bar:
    for batch_examples in bar:
      length = batching.padded_length(batch_examples, settings.inputs_length)
      encoder_tokens = jnp.asarray(  # [batch, length]: the batch's length bucket, not inputs_length
        batching.pad_batch(batch_examples, settings.batch_size, length)
      )
      rng = jax.random.fold_in(jax.random.PRNGKey(settings.seed), batch_examples[0].index)
      # 'auto' chooses the batch's gamma first (from the batches before it); while that choice
      # still measures the costs, its first batches' calls are also timed without their loop
      # steps (`_decode_batch`'s stepless call; `AutoGamma.stepless`): the auto mode's, and the
      # baseline's beside it. A gamma it would decode the batch at to measure it, whose program
      # has not run at the batch's length, is first measured on the warm call that program's
      # compile makes anyway (`_measure_batch`), and the batch decoded at the gamma chosen with
      # that measurement (`AutoGamma.measure`).
      choice = None
      if auto_run is not None and not all(e.index in auto_run.records for e in batch_examples):
        choice = auto_run.decode.choose()
      for run in runs:
        if all(e.index in run.records for e in batch_examples):
          continue
        decode, variant, stepless, measured, stepless_s = run.decode, (), False, {}, None
        if run is auto_run:
          auto = run.decode
          beside = auto_gamma.plain_rows(plain and plain.records, batch_examples)
          if auto.measures(choice, batch_examples):
            auto.ran(batch_examples, choice.gamma)
            measured, seconds, measured_stepless_s = _measure_batch(
              run,
              auto.decode_fn(choice.gamma),
              choice.gamma,
              batch_examples,
              encoder_tokens,
              rng,
              auto.stepless(choice.gamma),
            )
            measured_choice = auto.measure(
              choice, auto_gamma.measurement_rows(list(measured.values())), beside
            )
            if measured_choice.gamma == choice.gamma:
              # Dropped: the batch's decode at this gamma measures it (its stepless call: this).
              measured, stepless_s = {}, measured_stepless_s
            else:
              run.compile_s -= seconds  # the warm call was the measurement: calibration
              choice = measured_choice
          auto.ran(batch_examples, choice.gamma)
          decode, variant = auto.decode_fn(choice.gamma), (choice.gamma,)
          if choice.gamma == 0 and plain is not None:
            # Gamma 0 runs the baseline's own compiled program: where the baseline has compiled
            # it at this shape and run it warm, it is not compiled and warmed again.
            if (encoder_tokens.shape,) in plain.compiled_shapes:
              run.compiled_shapes.add((encoder_tokens.shape, 0))
              run.compile_s = run.compile_s or 0.0  # (a mode that decoded and compiled nothing)
          stepless = stepless_s is None and auto.stepless(choice.gamma)
        elif run is plain and choice is not None:
          stepless = auto_run.decode.plain_beside and auto_run.decode.stepless(choice.gamma)
        records = _decode_batch(
          run,
          decode,
          variant,
          batch_examples,
          encoder_tokens,
          rng,
          inputs.vocabulary,
          stepless,
          stepless_s,
        )
        if run is auto_run:
          for index, row in records.items():
            row["gamma"] = choice.gamma
            row.update(measured.get(index, {}))
        with interrupts.deferred():  # the records, their timings and the manifest: all or none
          claim()
          run.records.update(records)
          outputs.write_records(settings.output_dir, runs, run)
          if run is auto_run:
            auto.observe(choice, [records[e.index] for e in batch_examples])
            if plain is not None and not measured:
              auto.observe_plain(choice.gamma, beside)
  if auto_run is not None:
    auto_run.decode.finish()  # the loop times of every batch back to the cache


def _decode_batch(
  run: outputs.ModeRun,
  decode: modes.DecodeFn,
  variant: tuple,
  batch_examples: Sequence[infer_inputs.Example],
  encoder_tokens: jax.Array,
  rng,
  vocabulary,
  stepless: bool = False,
  stepless_s: float | None = None,
) -> dict[int, dict]:
  """One mode over one batch with `decode`, timed warm (the first call of each `variant`, an
  'auto' mode's gamma, at each input length compiles, and a second call runs it once more, both
  timed apart as compile time): {example index: its record}. `stepless`: the same compiled call
  with `max_steps = 0` is timed too (what the call pays once: 'auto's calibration, recorded as
  `stepless_s`, not decode time); `stepless_s`: that call's seconds, timed already."""
  compiled = (encoder_tokens.shape, *variant)
  if compiled not in run.compiled_shapes:  # compile this shape outside the timing
    _compile(run, decode, compiled, encoder_tokens, rng)
  with resources.CompileCounter() as compiles:  # the time 'auto' measures its costs with, too
    seconds, result = timing.timed(lambda: decode(encoder_tokens, rng))
  run.compiles_warm += compiles.count
  if stepless:
    stepless_s, _ = timing.timed(lambda: decode(encoder_tokens, rng, max_steps=0))
  tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
  metrics = _metrics(result, batch_examples)
  return {
    example.index: outputs.record(
      example,
      vocabulary,
      tokens[row],
      int(lengths[row]),
      {k: v[row] for k, v in metrics.items()},
      seconds,
      len(batch_examples),
      stepless_s,
    )
    for row, example in enumerate(batch_examples)
  }


def _compile(run: outputs.ModeRun, decode: modes.DecodeFn, compiled: tuple, encoder_tokens, rng):
  """Compiles `decode` at `compiled` (the batch's shape and the mode's variant) outside the
  timing: the compiling call and one more, both in the mode's compile time. The first run after
  a compile measured 1.3-1.8x slower than the runs after it (2-core EPYC, batch 1): timed, it
  would bias the job's speedup and the costs 'auto' measures on the first batches of each gamma
  it visits. Returns the second call's warm seconds and result (`_measure_batch`)."""
  t0 = time.perf_counter()
  with resources.CompileCounter() as compiles:
    jax.block_until_ready(decode(encoder_tokens, rng))
    seconds, result = timing.timed(lambda: decode(encoder_tokens, rng))
  run.compile_s = (run.compile_s or 0.0) + time.perf_counter() - t0
  run.compiles_first_call += compiles.count
  run.compiled_shapes.add(compiled)
  return seconds, result


def _measure_batch(
  run: outputs.ModeRun,
  decode: modes.DecodeFn,
  gamma: int,
  batch_examples: Sequence[infer_inputs.Example],
  encoder_tokens: jax.Array,
  rng,
  stepless: bool,
) -> tuple[dict[int, dict], float, float | None]:
  """'auto' measuring `gamma` on a batch its program has not run at: the program compiled there
  (`_compile`), its warm second call timed, and with `stepless` its call with `max_steps = 0`.
  Returns ({example index: the fields its record keeps where the measurement is kept: `measured`
  (gamma, num_tokens, target_calls, drafted) and its shares of the two calls' seconds,
  `measured_s` and `measured_stepless_s`}, the warm call's seconds, the stepless call's or None)."""
  seconds, result = _compile(run, decode, (encoder_tokens.shape, gamma), encoder_tokens, rng)
  stepless_s = None
  if stepless:
    stepless_s, _ = timing.timed(lambda: decode(encoder_tokens, rng, max_steps=0))
  lengths = np.asarray(result.lengths)
  metrics = _metrics(result, batch_examples)
  rows = len(batch_examples)
  return (
    {
      example.index: {
        "measured": {
          "gamma": gamma,
          "num_tokens": int(lengths[row]),
          "target_calls": int(metrics["target_calls"][row]),
          "drafted": int(metrics["drafted"][row]),
        },
        "measured_s": seconds / rows,
        **({} if stepless_s is None else {"measured_stepless_s": stepless_s / rows}),
      }
      for row, example in enumerate(batch_examples)
    },
    seconds,
    stepless_s,
  )


def _metrics(result, batch_examples: Sequence[infer_inputs.Example]) -> dict[str, np.ndarray]:
  """A decode's metrics as numpy arrays; FloatingPointError naming the examples where a row's
  logits were NaN or inf."""
  metrics = jax.tree_util.tree_map(
    np.asarray,
    dataclasses.asdict(result.metrics)
    if dataclasses.is_dataclass(result.metrics)
    else result.metrics.__dict__,
  )
  if np.any(metrics["invalid"][: len(batch_examples)]):
    raise FloatingPointError(
      f"NaN/inf logits while decoding examples {[e.index for e in batch_examples]}"
    )
  return metrics
