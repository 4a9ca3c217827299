"""FP8 training: a linear layer whose forward and backward GEMMs all run in FP8.

``fp8_linear(x, w, bias)`` computes ``x @ w.T + bias`` for float (master) ``x`` and ``w`` and is
differentiable in all three. The recipe is per-tensor *current scaling* (each tensor scaled by
its own amax at the step it is used, as TransformerEngine's ``Float8CurrentScaling``):

* forward: x and w quantized to float8_e4m3fn with one scale each, ``y = fp8_gemm(x8, w8)``;
* backward, with the output gradient g quantized to float8_e5m2 (one scale):
  ``dx = fp8_gemm(g8, w8.T)`` (dgrad) and ``dw = fp8_gemm(g8.T, x8.T)`` (wgrad), e5m2 x e4m3;
  ``dbias = sum(g)`` in float32.

Hopper's FP8 tensor cores read both operands K-major, so dgrad and wgrad take transposed FP8
copies (XLA transposes of one-byte tensors). Per-tensor scales make those transposes exact: a
per-row scale of x would lie along wgrad's contraction. The forward saves the FP8 x and w (not
the float ones) for the backward. Gradients pass straight through the quantization.

Accumulation follows TransformerEngine's defaults: the forward GEMM accumulates in the tensor
cores only (``fast_accum_fwd=True``), dgrad and wgrad promote to float32 every 128 of K
(``fast_accum_bwd=False``); both are arguments.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import shapes
from .ops import fp8_gemm
from .quantize import quantize

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
#: wgrad contracts over the tokens M: padded with zero rows to a multiple of this (the GEMM's
#: K rule; zero rows add nothing).
M_ALIGN = 16


def _check(x, w, bias, out_dtype):
  who = "fp8_linear"
  for name, v in (("x", x), ("w", w)):
    if not jnp.issubdtype(v.dtype, jnp.floating) or np.dtype(v.dtype) not in shapes.OUT_DTYPES:
      raise TypeError(f"{who}: {name} must be bfloat16, float16 or float32 (the master values; "
                      f"fp8_linear quantizes them), got {v.dtype}")
  if w.ndim != 2:
    raise ValueError(f"{who}: w must be a 2-D (N, K) weight, got shape {w.shape}")
  n, k = w.shape
  if x.ndim < 1 or x.shape[-1] != k:
    raise ValueError(f"{who}: x must be (..., K) with K = w.shape[1] = {k}, got shape {x.shape}")
  if x.size == 0:
    raise ValueError(f"{who}: x must be non-empty, got shape {x.shape}")
  if k % 16:
    raise ValueError(f"{who}: K = {k} must be a multiple of 16 (the forward GEMM's contraction)")
  if n % 16:
    raise ValueError(f"{who}: N = {n} must be a multiple of 16 (dgrad contracts over N)")
  if bias is not None and (bias.shape != (n,) or not jnp.issubdtype(bias.dtype, jnp.floating)):
    raise ValueError(f"{who}: bias must be a float (N,) = ({n},) array, got {bias.dtype}{bias.shape}")
  if out_dtype is not None and np.dtype(jnp.dtype(out_dtype)) not in shapes.OUT_DTYPES:
    raise TypeError(f"{who}: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")


def fp8_linear(x, w, bias=None, *, out_dtype=None, fast_accum_fwd: bool = True,
               fast_accum_bwd: bool = False):
  """``x @ w.T + bias`` with FP8 GEMMs in the forward and backward passes (module docstring).

  Args:
    x: (..., K) bfloat16 / float16 / float32 activations.
    w: (N, K) bfloat16 / float16 / float32 weight (the master copy; quantized per call).
    bias: optional (N,) float.
    out_dtype: output dtype, default x's. dx comes out in x's dtype, dw in w's, dbias in bias's.
    fast_accum_fwd, fast_accum_bwd: tensor-core-only accumulation (True) or float32 promotion
      every 128 of K (False) for the forward GEMM and for dgrad / wgrad.

  K and N must be multiples of 16; any number of tokens. Runs jax-gmma's FP8 GEMM kernel on
  Hopper and the pure-JAX reference elsewhere (``jax_gmma.allow_reference`` on other GPUs).
  """
  x = jnp.asarray(x)
  w = jnp.asarray(w)
  bias = None if bias is None else jnp.asarray(bias)
  _check(x, w, bias, out_dtype)
  out = np.dtype(x.dtype) if out_dtype is None else np.dtype(jnp.dtype(out_dtype))
  return _linear(x, w, bias, (out, bool(fast_accum_fwd), bool(fast_accum_bwd)))


def _quant(v, dtype):
  q = quantize(v, "fp8_tensor", dtype=dtype)
  return q.data, jnp.asarray(q.scales, jnp.float32).reshape(1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear(x, w, bias, static):
  return _fwd(x, w, bias, static)[0]


def _fwd(x, w, bias, static):
  out_dtype, fast_fwd, _ = static
  k = w.shape[1]
  x8, sx = _quant(x.reshape(-1, k), E4M3)
  w8, sw = _quant(w, E4M3)
  y = fp8_gemm(x8, w8, sx, sw, bias=bias, out_dtype=out_dtype, fast_accum=fast_fwd)
  holders = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), w.dtype))
  return y.reshape(*x.shape[:-1], w.shape[0]), (x8, sx, w8, sw, bias, holders)


def _bwd(static, res, g):
  _, _, fast_bwd = static
  x8, sx, w8, sw, bias, (xh, wh) = res
  m, k = x8.shape
  n = w8.shape[0]
  g2 = g.reshape(m, n)
  g8, sg = _quant(g2, E5M2)
  # dgrad (M, K) = g (M, N) . w (N, K): contraction over N, both operands N-major.
  dx = fp8_gemm(g8, w8.T, sg, sw, out_dtype=xh.dtype, fast_accum=fast_bwd)
  # wgrad (N, K) = g.T (N, M) . x (M, K): contraction over the tokens, padded to M_ALIGN.
  mp = -(-m // M_ALIGN) * M_ALIGN
  gt, xt = g8.T, x8.T
  if mp != m:
    gt = jnp.pad(gt, ((0, 0), (0, mp - m)))
    xt = jnp.pad(xt, ((0, 0), (0, mp - m)))
  dw = fp8_gemm(gt, xt, sg, sx, out_dtype=wh.dtype, fast_accum=fast_bwd)
  db = None if bias is None else g2.astype(jnp.float32).sum(0).astype(bias.dtype)
  return dx.reshape(*g.shape[:-1], k), dw, db


def _linear_fwd(x, w, bias, static):
  return _fwd(x, w, bias, static)


_linear.defvjp(_linear_fwd, _bwd)
