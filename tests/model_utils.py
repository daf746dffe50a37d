"""Shared test helpers for tiny random models and exact sequence-distribution tests."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np


def random_params(model, seed, logit_scale=1.0):
  """Random weights with the real init's shapes and scales, without compiling an initializer (fast).

  `logit_scale` multiplies the output projection: larger values give peakier distributions.
  """
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init_params, jax.random.key(0))

  def make(path, leaf):
    name = jax.tree_util.keystr(path)
    if leaf.ndim == 1:
      value = np.ones(leaf.shape) if 'scale' in name else np.zeros(leaf.shape)
    elif 'embedder' in name:
      value = rng.normal(size=leaf.shape)
    else:
      value = rng.normal(size=leaf.shape) / np.sqrt(leaf.shape[0])
      if 'logits_dense' in name:
        value = value * logit_scale
    return jnp.asarray(value, jnp.float32)

  return jax.tree_util.tree_map_with_path(make, shapes)


def pooled_chi_square(counts, exact):
  """Chi-square of observed `counts` against `len(samples) * exact` probabilities.

  Bins with expected count >= 5 are kept; the smaller ones are pooled into one bin so the
  chi-square approximation holds. Returns (statistic, degrees of freedom, p-value).
  """
  from scipy import stats

  expected = counts.sum() * exact
  big = expected >= 5
  observed_bins = np.append(counts[big], counts[~big].sum())
  expected_bins = np.append(expected[big], expected[~big].sum())
  keep = expected_bins > 0
  statistic = np.sum((observed_bins[keep] - expected_bins[keep]) ** 2 / expected_bins[keep])
  dof = keep.sum() - 1
  return statistic, dof, stats.chi2.sf(statistic, dof)


def all_continuations(vocab, length):
  """Every token sequence of `length` over `vocab`: [vocab**length, length] int32, row i spelling i
  in base `vocab` (the index `sequence_counts` uses)."""
  return np.array(list(itertools.product(range(vocab), repeat=length)), np.int32)


def sequence_probs(probs, continuations):
  """P(continuation) from the model's distributions at its positions.

  probs: [N, length, V], row n's next-token distributions given continuations[n]'s prefixes;
  continuations: [N, length] int32. Returns [N] float64, the product over positions.
  """
  per_token = np.take_along_axis(np.asarray(probs), continuations[..., None], axis=-1)[..., 0]
  return per_token.astype(np.float64).prod(axis=1)


def sequence_counts(tokens, vocab):
  """How often each continuation was sampled: tokens [S, length] -> [vocab**length] float64,
  indexed like `all_continuations`."""
  tokens = np.asarray(tokens)
  index = (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(1)
  return np.bincount(index, minlength=vocab ** tokens.shape[1]).astype(np.float64)


def tiny_t5_config(decoder_layers):
  """A tiny T5Config on the shipped 8k vocabulary (the infer and job-safety tests' target and draft)."""
  from speculative.models.t5 import T5Config

  return T5Config(
    vocab_size=8000,
    dtype="float32",
    emb_dim=16,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=decoder_layers,
    head_dim=8,
    mlp_dim=32,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
    float32_attention_logits=False,
  )


def save_tiny_pair(root, sources, *, record_config):
  """Random tiny target (2 decoder layers) and draft (1) as root/{t,d}.msgpack and `sources` as
  root/in.tsv (reference "Ref i"); returns the infer keyword arguments that name them. With
  `record_config` the weights carry their config sidecar."""
  from speculative import checkpoints
  from speculative.models.t5 import T5

  target, draft = tiny_t5_config(2), tiny_t5_config(1)
  for config, name, seed in ((target, "t.msgpack", 0), (draft, "d.msgpack", 1)):
    checkpoints.save_params(
      T5(config).init_params(jax.random.PRNGKey(seed)),
      root / name,
      dtype=None,
      config=config if record_config else None,
    )
  (root / "in.tsv").write_text("".join(f"{s}\tRef {i}\n" for i, s in enumerate(sources)))
  return dict(
    target_config=target,
    target_checkpoint=str(root / "t.msgpack"),
    draft_config=draft,
    draft_checkpoint=str(root / "d.msgpack"),
    input_file=str(root / "in.tsv"),
  )
