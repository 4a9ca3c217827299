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

``recipe="blockwise"`` is DeepSeek-V3's fine-grained recipe on jax-gmma's block-scaled kernels,
every operand in e4m3 with float32 block scales, each GEMM promoting per 128 of K:

* forward: x in 1x128 blocks (per token and 128 of K), w in 128x128 blocks;
* dgrad: g in 1x128 blocks (per token and 128 of N) times ``w8.T`` with the transposed
  128x128 scale grid (exact: a 128x128 block grid transposes into one);
* wgrad: g and x in 1x128 blocks along the *tokens* (per output / input channel and 128
  tokens; the forward saves this FP8 copy of x), multiplied by the 1x128 x 1x128 kernel.

It needs K and N to be multiples of 128.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import _vma, primitive
from .numerics import shapes
from .ops import blockwise, tensorwise
from .ops.quantize import quantize

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
#: wgrad contracts over the tokens M: padded with zero rows to a multiple of this (the GEMM's
#: K rule; zero rows add nothing).
M_ALIGN = 16
RECIPES = ("tensor", "blockwise")
#: The blockwise recipe's block: K and N multiples of it.
BLOCK = 128


#: What fp8_linear's kernel errors (raised when the program is lowered) name.
CALLER = ("fp8_linear", "x", "w")


def fp8_gemm(a, b, a_scale, b_scale, *, bias=None, out_dtype, fast_accum):
  """jax_gmma.fp8_gemm, its errors naming fp8_linear."""
  return tensorwise.gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype, fast_accum=fast_accum,
                         config=None, splits=None, caller=CALLER)


def blockwise_gemm(a, b, a_scales, b_scales, *, bias=None, out_dtype):
  """jax_gmma.blockwise_gemm, its errors naming fp8_linear."""
  return blockwise.gemm(a, b, a_scales, b_scales, bias=bias, out_dtype=out_dtype, config=None,
                        splits=None, caller=CALLER)


def _check(x, w, bias, out_dtype, recipe):
  who = "jax_gmma.fp8_linear"
  if recipe not in RECIPES:
    raise ValueError(f"{who}: recipe must be one of {RECIPES}, got {recipe!r}")
  for name, v in (("x", x), ("w", w)):
    if not jnp.issubdtype(v.dtype, jnp.floating) or np.dtype(v.dtype) not in shapes.OUT_DTYPES:
      raise TypeError(f"{who}: {name} must be bfloat16, float16 or float32 (the master values; "
                      f"fp8_linear quantizes them), got {v.dtype}")
  if w.ndim != 2:
    raise ValueError(f"{who}: w must be a 2-D (N, K) weight, got shape {w.shape}")
  n, k = w.shape
  if x.ndim < 1 or x.shape[-1] != k:
    raise ValueError(f"{who}: x must be (..., K) with K = w.shape[1] = {k}, got shape {x.shape}")
  if n == 0 or k == 0:
    raise ValueError(f"{who}: w must be non-empty (N, K >= 1), got shape {w.shape}")
  if max(int(np.prod(x.shape[:-1], dtype=np.int64)), n, k) >= 2**31:
    raise ValueError(f"{who}: dimensions must be < 2**31: x {x.shape}, w {w.shape}")
  if k % 16:
    raise ValueError(f"{who}: K = {k} must be a multiple of 16 (the forward GEMM's contraction)")
  if n % 16:
    raise ValueError(f"{who}: N = {n} must be a multiple of 16 (dgrad contracts over N)")
  if recipe == "blockwise" and (k % BLOCK or n % BLOCK):
    raise ValueError(f"{who}: recipe='blockwise' needs K and N multiples of {BLOCK} (128x128 weight "
                     f"blocks, transposed for dgrad), got K = {k}, N = {n}")
  primitive.check_bias(bias, n, who)
  if out_dtype is not None:
    primitive.out_dtype_or_error(out_dtype, who, shapes.OUT_DTYPES)


def fp8_linear(x, w, bias=None, *, out_dtype=None, recipe: str = "tensor",
               fast_accum_fwd: Optional[bool] = None, fast_accum_bwd: Optional[bool] = None):
  """``x @ w.T + bias`` with FP8 GEMMs in the forward and backward passes (module docstring).

  Args:
    x: (..., K) bfloat16 / float16 / float32 activations.
    w: (N, K) bfloat16 / float16 / float32 weight (the master copy; quantized per call).
    bias: optional (N,) float.
    out_dtype: output dtype, default x's. dx comes out in x's dtype, dw in w's, dbias in bias's.
    recipe: "tensor" (per-tensor current scaling, e5m2 gradients) or "blockwise" (DeepSeek-V3's
      1x128 / 128x128 blocks, e4m3 everywhere); see the module docstring.
    fast_accum_fwd, fast_accum_bwd: recipe "tensor" only: tensor-core-only accumulation (True)
      or float32 promotion every 128 of K (False) for the forward GEMM and for dgrad / wgrad;
      None = True / False (TransformerEngine's defaults). The blockwise kernels always promote.

  K and N must be multiples of 16 (128 for "blockwise"); any number of tokens (none: an empty
  result). Integer, bool and complex arrays and a non-float out_dtype are refused. Runs jax-gmma's
  FP8 GEMM kernels on Hopper and the pure-JAX reference elsewhere (``jax_gmma.allow_reference``
  on other GPUs). Reverse-mode only (``jax.grad`` / ``jax.vjp``), as for any ``jax.custom_vjp``.
  """
  x = jnp.asarray(x)
  w = jnp.asarray(w)
  bias = None if bias is None else jnp.asarray(bias)
  _check(x, w, bias, out_dtype, recipe)
  out = np.dtype(x.dtype) if out_dtype is None else np.dtype(jnp.dtype(out_dtype))
  if recipe == "blockwise" and (fast_accum_fwd is not None or fast_accum_bwd is not None):
    raise ValueError("jax_gmma.fp8_linear: fast_accum_fwd / fast_accum_bwd apply to recipe='tensor' "
                       "only (the block-scaled kernels promote every 128 of K)")
  if x.size == 0:
    # no tokens: an empty result (no FP8 GEMM to run); its gradients are zero
    return jnp.zeros((*x.shape[:-1], w.shape[0]), out)
  if recipe == "blockwise":
    return _linear_blockwise(x, w, bias, out)
  fast_fwd = True if fast_accum_fwd is None else bool(fast_accum_fwd)
  fast_bwd = False if fast_accum_bwd is None else bool(fast_accum_bwd)
  return _linear(x, w, bias, (out, fast_fwd, fast_bwd))


def _likes(x, w):
  return _vma.like(x), _vma.like(w)


def _cotangents(dx, dw, g2, bias, x_like, w_like):
  """(dx, dw, dbias), each typed like its primal under shard_map (``_vma.match``: summed over
  the mesh axes the primal does not vary over, e.g. dw of a replicated weight)."""
  return _vma.match(dx, x_like), _vma.match(dw, w_like), _vma.bias_cotangent(g2, bias)


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
  return y.reshape(*x.shape[:-1], w.shape[0]), (x8, sx, w8, sw, bias, _likes(x, w))


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
  return _cotangents(dx.reshape(*g.shape[:-1], k), dw, g2, bias, xh, wh)


_linear.defvjp(_fwd, _bwd)


# -- recipe "blockwise" --------------------------------------------------------------------------

def _q1x128(v, along_rows=False):
  """1x128 blocks along v's last axis, or along its rows (``along_rows``: blocks of 128 rows per
  column, stored transposed: data (cols, rows padded to 128)). The latter quantizes ``v.T``
  along its last axis: the same numbers as ``quantize(v, axis=0)``, and on Hopper the
  quantization kernel runs after one XLA transpose instead of the pure-JAX path."""
  q = quantize(v.T if along_rows else v, "fp8_1x128", dtype=E4M3)
  return q.data, q.scales


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear_blockwise(x, w, bias, out_dtype):
  return _bw_fwd(x, w, bias, out_dtype)[0]


def _bw_fwd(x, w, bias, out_dtype):
  k = w.shape[1]
  x2 = x.reshape(-1, k)
  x8, sx = _q1x128(x2)                   # (M, K), (M, K/128)
  wq = quantize(w, "fp8_128x128", dtype=E4M3)
  y = blockwise_gemm(x8, wq.data, sx, wq.scales, bias=bias, out_dtype=out_dtype)
  xt8, sxt = _q1x128(x2, along_rows=True)         # (K, Mp), (K, Mp/128): blocks along the tokens
  return y.reshape(*x.shape[:-1], w.shape[0]), (xt8, sxt, wq.data, wq.scales, bias, _likes(x, w))


def _bw_bwd(out_dtype, res, g):
  xt8, sxt, w8, sw, bias, (xh, wh) = res
  n, k = w8.shape
  g2 = g.reshape(-1, n)
  g8, sg = _q1x128(g2)                    # (M, N), (M, N/128)
  dx = blockwise_gemm(g8, w8.T, sg, sw.T, out_dtype=xh.dtype)        # 128x128 grid transposed
  gt8, sgt = _q1x128(g2, along_rows=True)          # (N, Mp), (N, Mp/128)
  dw = blockwise_gemm(gt8, xt8, sgt, sxt, out_dtype=wh.dtype)         # 1x128 x 1x128
  return _cotangents(dx.reshape(*g.shape[:-1], k), dw, g2, bias, xh, wh)


_linear_blockwise.defvjp(_bw_fwd, _bw_bwd)
