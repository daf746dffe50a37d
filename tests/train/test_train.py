"""Training: the loss falls, checkpoints are T5X layout, and a resumed run equals an uninterrupted one."""

import dataclasses
import gzip
import json
import logging
import shutil

import jax
import numpy as np
import pytest

from speculative import checkpoints
from speculative import train
from speculative.data import corpus
from speculative.data import tasks
from speculative.jobs import checks
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config
from speculative.train import checkpoints as train_checkpoints
from speculative.train import data as train_data
from speculative.train import settings as train_settings
from speculative.train import steps as train_steps

TINY = T5Config(
  vocab_size=8000,
  dtype="float32",
  emb_dim=32,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=1,
  head_dim=16,
  mlp_dim=64,
  mlp_activations=("gelu", "linear"),
  dropout_rate=0.1,
  logits_via_embedding=False,
  float32_attention_logits=False,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  root = tmp_path_factory.mktemp("train_data")
  pairs = tasks.load_split("validation")[:96]
  for name, chunk in (("train", pairs[:64]), ("validation", pairs[64:])):
    with gzip.open(root / f"{name}.tsv.gz", "wt", encoding="utf-8") as f:
      f.writelines(f"{en}\t{de}\n" for en, de in chunk)
  return dict(
    train_tsv=str(root / "train.tsv.gz"),
    validation_tsv=str(root / "validation.tsv.gz"),
    spm_model=str(tasks.VOCAB_PATH),
    tokens_per_batch=1024,
    bucket_lengths=(64,),
    learning_rate=3e-3,
    warmup_steps=5,
    # Independent of num_steps (as the shipped recipes' 'rsqrt' and 'constant' are), so the runs
    # below, of 2 to 12 steps, share one compiled train step; 'cosine', the default, bakes
    # num_steps into the step and is trained in test_loss_falls_and_exports.
    schedule="rsqrt",
    eval_every=1000,
    checkpoint_every=1000,
  )


def _log(output_dir):
  return [json.loads(line) for line in open(f"{output_dir}/train_log.jsonl")]


@pytest.mark.slow
def test_loss_falls_and_exports(data, tmp_path):
  out = tmp_path / "run"
  train.train(
    model_config=TINY,
    output_dir=str(out),
    num_steps=40,
    export_path=str(tmp_path / "model.msgpack"),
    **{**data, "eval_every": 20, "schedule": "cosine"},
  )
  log = _log(out)
  assert [m["step"] for m in log] == [20, 40]
  assert log[-1]["val_nll"] < log[0]["val_nll"] - 0.3  # the model learns the data
  exported = checkpoints.load_params(tmp_path / "model.msgpack")
  checkpoints.validate_params(exported, T5(TINY).param_shapes())
  t5x_params = checkpoints.load_t5x_checkpoint(out)  # T5X layout, newest step
  checkpoints.validate_params(t5x_params, T5(TINY).param_shapes())


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted(data, tmp_path):
  full, split = tmp_path / "full", tmp_path / "split"
  common = dict(model_config=TINY, num_steps=12, **{**data, "checkpoint_every": 6})
  train.train(output_dir=str(full), **common)
  train.train(output_dir=str(split), max_steps_this_run=6, **common)  # "interrupted" at step 6
  assert checkpoints.checkpoint_steps(split) == [6]
  train.train(output_dir=str(split), **common)  # resumes from checkpoint_6
  a = checkpoints.load_t5x_checkpoint(full / "checkpoint_12")
  b = checkpoints.load_t5x_checkpoint(split / "checkpoint_12")
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6), a, b)


@pytest.mark.slow
def test_an_export_of_the_last_weights_keeps_better_weights_there(data, tmp_path):
  """Without export_best the export records its last evaluation (train_log.jsonl) and does not
  replace an export of a lower validation NLL (here: a longer run's) unless asked."""
  export = tmp_path / "model.msgpack"
  common = dict(model_config=TINY, export_path=str(export), **{**data, "eval_every": 2})
  train.train(output_dir=str(tmp_path / "long"), num_steps=8, **common)
  recorded = checkpoints.read_metadata(export)["training"]
  assert recorded["step"] == 8 and recorded["val_nll"] == _log(tmp_path / "long")[-1]["val_nll"]
  with pytest.raises(ValueError, match="lower than the .* of the weights to export"):
    train.train(output_dir=str(tmp_path / "short"), num_steps=2, **common)
  assert checkpoints.read_metadata(export)["training"]["step"] == 8  # untouched
  train.train(
    output_dir=str(tmp_path / "short"), num_steps=2, export_replaces_better=True, **common
  )  # resumes at its end step: exports with the evaluation its log holds for step 2
  replaced = checkpoints.read_metadata(export)["training"]
  assert replaced["step"] == 2 and replaced["val_nll"] == _log(tmp_path / "short")[-1]["val_nll"]


@pytest.mark.slow
def test_a_resumed_run_logs_each_evaluation_once(data, tmp_path, monkeypatch):
  """A run stopped after evaluating steps 6 and 8 but before checkpoint_8 resumes from checkpoint_4
  and evaluates 6 and 8 again: train_log.jsonl holds each step once (and no line cut short)."""
  out = tmp_path / "run"
  common = dict(model_config=TINY, output_dir=str(out), num_steps=8)
  common.update({**data, "eval_every": 3, "checkpoint_every": 4})
  save = train_checkpoints.save_train_state

  def stopped_at_8(output_dir, step, *args, **kwargs):
    if step == 8:
      with open(out / "train_log.jsonl", "a") as f:
        f.write('{"step": 8, "val_')  # a kill mid-append
      raise KeyboardInterrupt
    return save(output_dir, step, *args, **kwargs)

  monkeypatch.setattr(train_checkpoints, "save_train_state", stopped_at_8)
  with pytest.raises(KeyboardInterrupt):
    train.train(**common)
  assert checkpoints.checkpoint_steps(out) == [4]
  monkeypatch.setattr(train_checkpoints, "save_train_state", save)
  train.train(**common)
  assert [m["step"] for m in _log(out)] == [3, 6, 8]


def test_bad_arguments(data, tmp_path, caplog):
  with pytest.raises(ValueError, match="num_steps"):
    train.train(model_config=TINY, output_dir=str(tmp_path), num_steps=0, **data)
  with pytest.raises(ValueError, match="optimizer must be one of"):
    train.train(model_config=TINY, output_dir=str(tmp_path), num_steps=2, optimizer="sgd", **data)
  with pytest.raises(ValueError, match="teacher"):
    train.train(
      model_config=TINY, output_dir=str(tmp_path), num_steps=2, distill_weight=0.5, **data
    )
  empty = tmp_path / "empty.tsv.gz"
  with gzip.open(empty, "wt") as f:
    f.write("")
  with pytest.raises(ValueError, match="no examples") as info:
    train.train(
      model_config=TINY, output_dir=str(tmp_path), num_steps=2, **{**data, "train_tsv": str(empty)}
    )
  assert checks.user_message(info.value) == str(info.value)  # the command line prints one line
  no_tab = tmp_path / "no_tab.tsv"
  no_tab.write_text("Hello\tHallo\nonly one field\n")
  with pytest.raises(ValueError, match="no_tab.tsv:2: expected 2 tab-separated fields") as info:
    train.train(
      model_config=TINY, output_dir=str(tmp_path), num_steps=2, **{**data, "train_tsv": str(no_tab)}
    )
  assert checks.user_message(info.value) == str(info.value)
  with caplog.at_level(logging.WARNING):  # decay not scaled by the learning rate: 0.99 ** 2
    train_settings.TrainSettings(
      model_config=TINY,
      output_dir=str(tmp_path / "w"),
      num_steps=2,
      optimizer="adafactor",
      **{**data, "weight_decay": 0.01},
    )
  assert "weight_decay 0.01 under adafactor takes 0.01 of every weight each step" in caplog.text
  assert "0.98 of a weight the gradients leave alone is left after 2 steps" in caplog.text
  for change, message in [
    ({"eval_every": 0}, "eval_every must be in \\[1, inf\\]"),
    ({"checkpoint_every": 0}, "checkpoint_every must be in \\[1, inf\\]"),
    ({"label_smoothing": 1.0}, "label_smoothing must be in \\[0, 1\\), got 1.0"),
    ({"spm_model": str(tmp_path)}, "spm_model is a directory, not a file"),
  ]:
    with pytest.raises((ValueError, OSError), match=message):
      train.train(model_config=TINY, output_dir=str(tmp_path), num_steps=2, **{**data, **change})
  missing = str(tmp_path / "missing.tsv.gz")
  with pytest.raises(FileNotFoundError, match="missing.tsv.gz"):
    train.train(
      model_config=TINY,
      output_dir=str(tmp_path),
      num_steps=2,
      **{**data, "train_tsv": [data["train_tsv"], missing]},
    )


@pytest.mark.slow
def test_several_train_files_train_as_one_set(data, tmp_path):
  """`train_tsv` as a list reads the files in order as one set: two halves of a corpus give the
  same run as the whole corpus in one file."""
  pairs = corpus.read_tsv_gz(data["train_tsv"])
  first, second = tmp_path / "first.tsv.gz", tmp_path / "second.tsv.gz"
  corpus.write_tsv_gz(first, pairs[:40])
  corpus.write_tsv_gz(second, pairs[40:])
  common = dict(model_config=TINY, num_steps=4, **{**data, "checkpoint_every": 4})
  train.train(output_dir=str(tmp_path / "one"), **common)
  train.train(
    output_dir=str(tmp_path / "two"), **{**common, "train_tsv": [str(first), str(second)]}
  )
  a = checkpoints.load_t5x_checkpoint(tmp_path / "one" / "checkpoint_4")
  b = checkpoints.load_t5x_checkpoint(tmp_path / "two" / "checkpoint_4")
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_init_checkpoint_starts_from_its_weights(data, tmp_path):
  """A run started from another run's checkpoint (fresh optimizer, here Adafactor) begins from those
  weights: at learning rate ~0 its first checkpoint equals them. A checkpoint of another shape is
  refused before training, naming the file."""
  common = dict(model_config=TINY, **{**data, "checkpoint_every": 1000})
  train.train(output_dir=str(tmp_path / "a"), num_steps=6, **common)
  train.train(
    output_dir=str(tmp_path / "b"),
    num_steps=2,
    init_checkpoint=str(tmp_path / "a" / "checkpoint_6"),
    optimizer="adafactor",
    **{**common, "learning_rate": 1e-12, "weight_decay": 0.0},
  )
  a = checkpoints.load_t5x_checkpoint(tmp_path / "a" / "checkpoint_6")
  b = checkpoints.load_t5x_checkpoint(tmp_path / "b" / "checkpoint_2")
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), a, b)
  # Once the run has a checkpoint it resumes from it: the init_checkpoint is no longer read (here
  # it is gone), but it must be the one the run started from.
  shutil.move(tmp_path / "a" / "checkpoint_6", tmp_path / "moved")
  resume = dict(optimizer="adafactor", **{**common, "learning_rate": 1e-12, "weight_decay": 0.0})
  init = str(tmp_path / "a" / "checkpoint_6")
  train.train(output_dir=str(tmp_path / "b"), num_steps=3, init_checkpoint=init, **resume)
  assert checkpoints.checkpoint_steps(tmp_path / "b")[-1] == 3
  with pytest.raises(ValueError, match="started differently(.|\n)*init_checkpoint"):
    train.train(output_dir=str(tmp_path / "b"), num_steps=4, init_checkpoint=None, **resume)
  shutil.move(tmp_path / "moved", tmp_path / "a" / "checkpoint_6")
  other = dataclasses.replace(TINY, emb_dim=16, head_dim=8)
  with pytest.raises(checkpoints.CheckpointError, match="checkpoint_6"):
    train.train(
      model_config=other,
      output_dir=str(tmp_path / "c"),
      num_steps=2,
      init_checkpoint=str(tmp_path / "a" / "checkpoint_6"),
      **data,
    )
  with pytest.raises(FileNotFoundError, match="init_checkpoint"):
    train.train(
      init_checkpoint=str(tmp_path / "missing"),
      output_dir=str(tmp_path / "d"),
      num_steps=2,
      **common,
    )


@pytest.mark.slow
def test_distillation_step_runs(data, tmp_path):
  teacher_dir = tmp_path / "teacher"
  checkpoints.save_t5x_checkpoint(T5(TINY).init_params(jax.random.PRNGKey(3)), teacher_dir, 0)
  student = dataclasses.replace(TINY, emb_dim=16, head_dim=8, mlp_dim=32)
  metrics = train.train(
    model_config=student,
    output_dir=str(tmp_path / "student"),
    num_steps=3,
    teacher_config=TINY,
    teacher_checkpoint=str(teacher_dir),
    distill_weight=0.5,
    **data,
  )
  assert np.isfinite(metrics["val_nll"])
  # The teacher may also be a shipped bf16 .msgpack (the target exactly as it is served).
  shipped = tmp_path / "teacher.msgpack"
  checkpoints.save_params(T5(TINY).init_params(jax.random.PRNGKey(3)), shipped)
  metrics = train.train(
    model_config=student,
    output_dir=str(tmp_path / "student2"),
    num_steps=2,
    teacher_config=TINY,
    teacher_checkpoint=str(shipped),
    distill_weight=1.0,
    **data,
  )
  assert np.isfinite(metrics["val_nll"])
  with pytest.raises(FileNotFoundError, match="teacher"):
    train.train(
      model_config=student,
      output_dir=str(tmp_path / "student3"),
      num_steps=2,
      teacher_config=TINY,
      teacher_checkpoint=str(tmp_path / "missing"),
      distill_weight=0.5,
      **data,
    )


@pytest.mark.slow
def test_fork_continues_a_run_with_its_optimizer_state(data, tmp_path):
  """A run forked from another run's checkpoint_6 (weights, optimizer state, step) and trained to
  step 12 with the same settings equals the uninterrupted run; the source run is not touched. A
  fork that is not a trainer checkpoint is refused before any compute, naming the path."""
  common = dict(model_config=TINY, num_steps=12, **{**data, "checkpoint_every": 6})
  train.train(output_dir=str(tmp_path / "full"), **common)
  train.train(output_dir=str(tmp_path / "source"), max_steps_this_run=6, **common)
  fork = str(tmp_path / "source" / "checkpoint_6")
  train.train(output_dir=str(tmp_path / "fork"), fork_checkpoint=fork, **common)
  assert checkpoints.checkpoint_steps(tmp_path / "source") == [6]
  a = checkpoints.load_t5x_checkpoint(tmp_path / "full" / "checkpoint_12")
  b = checkpoints.load_t5x_checkpoint(tmp_path / "fork" / "checkpoint_12")
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6), a, b)
  with pytest.raises(ValueError, match="checkpoint_<step>"):
    train.train(
      output_dir=str(tmp_path / "bad"), fork_checkpoint=str(tmp_path / "source"), **common
    )
  with pytest.raises(FileNotFoundError, match="checkpoint_7"):
    train.train(
      output_dir=str(tmp_path / "bad"),
      fork_checkpoint=str(tmp_path / "source" / "checkpoint_7"),
      **common,
    )
  with pytest.raises(ValueError, match="not both"):
    train.train(
      output_dir=str(tmp_path / "bad"), fork_checkpoint=fork, init_checkpoint=fork, **common
    )
  # The fork's directory records where it started: resuming it from other weights or with another
  # data-order seed is refused before any compute (it would continue, and relabel, another run).
  other = str(tmp_path / "full" / "checkpoint_6")
  with pytest.raises(ValueError, match="started differently(.|\n)*fork_checkpoint"):
    train.train(output_dir=str(tmp_path / "fork"), fork_checkpoint=other, **common)
  with pytest.raises(ValueError, match="started differently(.|\n)*seed: run 0, given 5"):
    train.train(output_dir=str(tmp_path / "fork"), fork_checkpoint=fork, seed=5, **common)
  assert checkpoints.checkpoint_steps(tmp_path / "fork") == [6, 12]


@pytest.mark.slow
def test_attention_entropy_is_one_for_uniform_and_zero_for_one_hot():
  """Normalized by log(number of keys a row may attend to): real keys (encoder, cross) or the
  causal prefix (decoder self-attention); padded query rows and single-key rows are left out."""
  import jax.numpy as jnp

  enc = jnp.array([[5, 6, 7, 1, 0, 0]])  # [1, 6]: 4 real tokens
  tgt = jnp.array([[8, 9, 1, 0]])  # [1, 4]: 3 real tokens
  enc_real, causal = (enc != 0).astype(jnp.float32), jnp.tril(jnp.ones((4, 4)))
  uniform = {
    "encoder/layers_0/attention": jnp.broadcast_to(enc_real / 4, (1, 2, 6, 6)),
    "decoder/layers_0/self_attention": (causal / causal.sum(-1, keepdims=True))[None, None],
    "decoder/layers_0/encoder_decoder_attention": jnp.broadcast_to(enc_real / 4, (1, 2, 4, 6)),
  }
  one_hot = {k: jnp.zeros_like(w).at[..., 0].set(1.0) for k, w in uniform.items()}
  for weights, expected in ((uniform, 1.0), (one_hot, 0.0)):
    sums = train_steps.attention_entropy_sums(weights, enc, tgt)
    rows = {k: float(c) for k, (_, c) in sums.items()}
    # encoder: 4 real rows x 2 heads; decoder self: rows 1-2 (row 0 sees one key) x 1 head;
    # cross: 3 real rows x 2 heads.
    assert rows == {"encoder": 8.0, "decoder_self": 2.0, "cross": 6.0}
    for kind, (total, count) in sums.items():
      np.testing.assert_allclose(float(total) / float(count), expected, atol=1e-5, err_msg=kind)


@pytest.mark.slow
def test_evaluation_logs_attention_entropy_and_a_training_subset(data, tmp_path):
  out = tmp_path / "run"
  train.train(model_config=TINY, output_dir=str(out), num_steps=4, **{**data, "eval_every": 4})
  (m,) = _log(out)
  for prefix in ("val", "train"):
    assert m[f"{prefix}_nll"] > 0 and 0 <= m[f"{prefix}_accuracy"] <= 1
    for kind in train_steps.ATTENTION_KINDS:
      assert 0.5 < m[f"{prefix}_attention_entropy_{kind}"] <= 1.0  # near uniform at init


@pytest.mark.slow
def test_task_prefixes_and_a_second_validation_set(data, tmp_path):
  """Multi-task training: each train file gets its own input prefix (the default prefix for every
  file equals the single-task run), a second validation set is logged under its name, and a prefix
  list of the wrong length is refused before any compute."""
  common = dict(model_config=TINY, num_steps=2, **{**data, "checkpoint_every": 2})
  train.train(output_dir=str(tmp_path / "default"), **common)
  prefixed = dict(common, input_prefixes=[train_data.INPUT_PREFIX])
  train.train(output_dir=str(tmp_path / "same"), **prefixed)
  a = checkpoints.load_t5x_checkpoint(tmp_path / "default" / "checkpoint_2")
  b = checkpoints.load_t5x_checkpoint(tmp_path / "same" / "checkpoint_2")
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)

  out = tmp_path / "multi"
  train.train(
    output_dir=str(out),
    **{
      **common,
      "eval_every": 2,
      "train_tsv": [data["train_tsv"], data["validation_tsv"]],
      "input_prefixes": ["translate English to German: ", "summarize: "],
      "extra_validation": {"summarize": (data["validation_tsv"], "summarize: ")},
    },
  )
  (m,) = _log(out)
  assert m["val_nll"] > 0 and m["val_summarize_nll"] > 0
  assert m["val_nll"] != m["val_summarize_nll"]  # same pairs, different prefix


def test_a_prefix_list_of_the_wrong_length_is_refused(data, tmp_path):
  with pytest.raises(ValueError, match="input_prefixes has 2 entries for 1 train_tsv"):
    train.train(
      model_config=TINY,
      num_steps=2,
      output_dir=str(tmp_path / "bad"),
      input_prefixes=["a", "b"],
      **data,
    )


def test_rectangular_buckets_take_the_smallest_fit():
  buckets = train_data.make_buckets([16, 64, (64, 16)], 256)
  assert [b.batch_size for b in buckets] == [8, 2, 3]
  examples = [
    (np.ones(n), np.ones(m)) for n, m in [(10, 10), (50, 10), (50, 40), (90, 12), (90, 70)]
  ]
  # (50, 10) fits (64, 64) and (64, 16): the smaller; (90, 12) fits none: (64, 16) cuts fewest
  assert train_data.assign_buckets(examples, buckets) == [[0], [2, 4], [1, 3]]


def test_batch_stream_refuses_examples_that_fill_no_batch():
  """Fewer examples than any bucket's batch size give no batch: one error, not an endless loop."""
  buckets = train_data.make_buckets([8, 16], tokens_per_batch=64)  # batch sizes 4 and 2
  examples = [(np.array([5, 1], np.int32), np.array([6, 1], np.int32))] * 3  # all in the 8x8 bucket
  with pytest.raises(ValueError, match=r"no full batch in 3 examples: .*8x8: 4, 16x16: 2"):
    next(train_data.batch_stream(examples, buckets, seed=0))
