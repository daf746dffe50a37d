"""NumPy references for the CPU kernels (tests compare the kernels with these)."""

from __future__ import annotations

import numpy as np

BLOCK = 16  # output columns per packed block, as in matmul.cc


def pack(kernel: np.ndarray) -> np.ndarray:
  """[K, N] -> [ceil(N / 16), K, 16], the padding columns zero."""
  k, n = kernel.shape
  nb = -(-n // BLOCK)
  padded = np.zeros((k, nb * BLOCK), kernel.dtype)
  padded[:, :n] = kernel
  return np.ascontiguousarray(padded.reshape(k, nb, BLOCK).transpose(1, 0, 2))


def unpack(packed: np.ndarray, n: int) -> np.ndarray:
  """Inverse of `pack`: [NB, K, 16] -> [K, N]."""
  nb, k, _ = packed.shape
  return packed.transpose(1, 0, 2).reshape(k, nb * BLOCK)[:, :n]


def packed_matmul(x: np.ndarray, packed: np.ndarray, n: int) -> np.ndarray:
  """x [..., K] @ unpack(packed) in float64, rounded to float32 once (the exact product's value)."""
  w = unpack(np.asarray(packed, np.float32), n).astype(np.float64)
  return (np.asarray(x, np.float64) @ w).astype(np.float32)


def fma_chain_matmul(x: np.ndarray, packed: np.ndarray, n: int) -> np.ndarray:
  """The kernel's arithmetic spelled out: out = fma(x[k], w[k], out) for k = 0..K-1 from +0.

  Each fused multiply-add is emulated in float64 (x*w is exact there; the sum is rounded to float64
  and then to float32, which differs from one rounding only when the float64 sum lands exactly
  halfway between two float32 values). Slow: small shapes only.
  """
  x = np.asarray(x, np.float32)
  w = unpack(np.asarray(packed, np.float32), n)
  out = np.zeros(x.shape[:-1] + (n,), np.float32)
  for k in range(x.shape[-1]):
    prod = x[..., k, None].astype(np.float64) * w[k].astype(np.float64)
    out = (prod + out.astype(np.float64)).astype(np.float32)
  return out


def decode_attention(query, key, value, bias) -> np.ndarray:
  """softmax(q . k + bias) @ v in float64, rounded once; query [B,T,H,dh], key/value [B,H,dh,K]."""
  q = np.asarray(query, np.float64)
  k = np.asarray(key, np.float64)
  v = np.asarray(value, np.float64)
  scores = np.einsum('bthd,bhdk->bhtk', q, k) + np.asarray(bias, np.float64)
  scores -= scores.max(-1, keepdims=True)
  weights = np.exp(scores)
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhtk,bhdk->bthd', weights, v).astype(np.float32)


def rms_norm(x, scale, epsilon: float) -> np.ndarray:
  """T5's RMS layer norm in float64, rounded once."""
  x = np.asarray(x, np.float64)
  inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon)
  return (x * inv * np.asarray(scale, np.float64)).astype(np.float32)
