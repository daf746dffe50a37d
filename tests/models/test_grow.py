"""Growth (speculative/models/grow.py): the grown model computes the small model's logits, and every new
weight gets a gradient on the first step (no zero-read/zero-write saddle)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from model_utils import random_params
import numpy as np
import pytest

from speculative.models import grow
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config

# One layer per stack grown to two: every kind of growth (residual width, heads, MLP width, a new
# layer) happens, and T5's initializer (which growth compiles for LARGE) stays small to compile.
SMALL = T5Config(
  vocab_size=300,
  emb_dim=32,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=1,
  head_dim=16,
  mlp_dim=64,
  mlp_activations=("gelu", "linear"),
)
LARGE = T5Config(
  vocab_size=300,
  emb_dim=64,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=2,
  head_dim=16,
  mlp_dim=128,
  mlp_activations=("gelu", "linear"),
)


@functools.cache
def _small_params():
  """The small model's params: random, with the real init's shapes and scales, made in NumPy
  (`model_utils.random_params`; compiling T5's initializer for SMALL took ~8 s). Growth must keep
  the logits of any small model, so its weights need not come from the initializer; the large
  model's fresh weights still do (grow_params and grow_params_in_memory call T5.init_params)."""
  return jax.device_get(random_params(T5(SMALL), seed=1))


def _batch():
  rng = np.random.default_rng(0)
  enc = rng.integers(2, 300, size=(3, 11)).astype(np.int32)
  enc[0, 7:] = 0  # padding
  dec = rng.integers(2, 300, size=(3, 9)).astype(np.int32)
  return jnp.asarray(enc), jnp.asarray(dec)


@pytest.mark.parametrize("tied", [False, True], ids=["own_head", "tied_head"])
def test_grown_model_computes_the_small_models_logits(tied):
  """With its own logits head, and with the head tied to the embedding (which divides the logits
  by the square root of the residual width: the grown one's)."""
  small, large = (dataclasses.replace(c, logits_via_embedding=tied) for c in (SMALL, LARGE))
  small_params = jax.device_get(random_params(T5(small), seed=1)) if tied else _small_params()
  grown = grow.grow_params(jax.device_get(small_params), small, large, seed=2)
  enc, dec = _batch()
  expected = jax.jit(T5(small).forward)(small_params, enc, dec)  # jitted: one compile, not ~100
  got = jax.jit(T5(large).forward)(jax.tree_util.tree_map(jnp.asarray, grown), enc, dec)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5, rtol=1e-5)


def test_new_write_weights_get_gradients():
  small_params = _small_params()
  grown = jax.tree_util.tree_map(
    jnp.asarray, grow.grow_params(jax.device_get(small_params), SMALL, LARGE, seed=2)
  )
  enc, dec = _batch()
  model = T5(LARGE)

  def loss(params):
    logits = model.forward(params, enc, dec)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), dec[..., None], -1))

  grads = jax.jit(jax.grad(loss))(grown)
  d = SMALL.emb_dim
  # the new residual dims' writers, the new heads' and hidden units' writers, the new layer
  assert np.abs(grads["token_embedder"]["embedding"][:, d:]).max() > 0
  out = grads["decoder"]["layers_0"]["self_attention"]["out"]["kernel"]
  assert np.abs(out[:, d:]).max() > 0 and np.abs(out[SMALL.num_heads * 16 :, :d]).max() > 0
  assert np.abs(grads["encoder"]["layers_0"]["mlp"]["wo"]["kernel"][SMALL.mlp_dim :]).max() > 0
  assert np.abs(grads["decoder"]["layers_1"]["mlp"]["wo"]["kernel"]).max() > 0  # the new layer


def test_refuses_to_shrink_or_change_the_vocabulary():
  params = jax.device_get(random_params(T5(LARGE), seed=0))
  with pytest.raises(ValueError, match="emb_dim shrinks"):
    grow.grow_params(params, LARGE, SMALL)
  other = T5Config(**{**LARGE.__dict__, "vocab_size": 400})
  with pytest.raises(ValueError, match="vocab_size differs"):
    grow.grow_params(params, LARGE, other)


def test_growth_in_memory_is_the_same_rule_in_bfloat16():
  """`grow_params_in_memory` (device, bfloat16) gives `grow_params`'s tree rounded to bfloat16, and
  the grown model computes the small one's logits within bfloat16 rounding."""
  small_params = _small_params()
  grown = grow.grow_params_in_memory(small_params, SMALL, LARGE, seed=2, dtype="bfloat16")
  assert {x.dtype for x in jax.tree_util.tree_leaves(grown)} == {jnp.dtype(jnp.bfloat16)}
  reference = grow.grow_params(small_params, SMALL, LARGE, seed=2)
  jax.tree_util.tree_map(
    lambda got, want: np.testing.assert_array_equal(
      np.asarray(got, np.float32), np.asarray(jnp.asarray(want, jnp.bfloat16), np.float32)
    ),
    grown,
    reference,
  )
  enc, dec = _batch()
  expected = jax.jit(T5(SMALL).forward)(small_params, enc, dec)  # jitted: op by op takes minutes
  got = jax.jit(T5(LARGE).forward)(grown, enc, dec)
  scale = float(np.abs(np.asarray(expected)).max())
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=0.05 * scale, rtol=0)
  assert np.mean(np.argmax(got, -1) == np.argmax(expected, -1)) > 0.9


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("vocab_size", 400, "vocab_size differs"),
    ("head_dim", 32, "head_dim differs"),
    ("relative_attention_max_distance", 64, "relative_attention_max_distance differs"),
  ],
)
def test_growth_in_memory_refuses_another_vocabulary_or_head_size(field, value, message):
  params = _small_params()
  other = T5Config(**{**LARGE.__dict__, field: value})
  with pytest.raises(ValueError, match=message):
    grow.grow_params_in_memory(params, SMALL, other)
