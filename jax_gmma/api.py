"""The public entry points on QuantizedArrays / PackedWeights: :func:`dot` (asks the op families
of :mod:`jax_gmma.ops` which one multiplies the weight) and :func:`scaled_matmul`
(``jax.nn.scaled_matmul`` on the block-scaled families)."""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _backend, _vma, ops
from .arrays import QuantizedArray
from .numerics import shapes
from .numerics.formats import E8M0
from .ops import mx, tensorwise
from .ops.blockwise import blockwise_gemm
from .ops.weightonly import PackedWeight, unpack


def dot(x, w: QuantizedArray, *, bias=None, out_dtype=None, x_format: str = "fp8_channel",
        fast_accum: bool = False, config: Optional[str] = None, splits: Optional[int] = None):
  """``x @ dequantize(w).T`` as an FP8 GEMM: ``x`` (..., K) float or QuantizedArray, ``w`` a
  QuantizedArray of an (N, K) weight (``quantize(w, "fp8_channel")``, done once).

  A float ``x`` is quantized on the fly to float8_e4m3fn with ``x_format``: "fp8_channel" (one
  scale per token/row, the default) or "fp8_tensor". ``out_dtype`` defaults to x's dtype when it
  is bfloat16/float16/float32, else bfloat16.

  The weight picks the op family (``jax_gmma.ops.FAMILIES``, each with the ``WEIGHT_FORMATS``
  it serves and its own ``dot``). Block-scaled weights (formats "fp8_128x128" and "fp8_1x128"):
  x is quantized to "fp8_1x128" (one scale per token and 128 of K; ``x_format`` and
  ``fast_accum`` do not apply) and the product runs on :func:`jax_gmma.blockwise_gemm`. MX /
  NVFP4 weights: :func:`jax_gmma.mx_gemm` (see ``jax_gmma.ops.mx.dot``). A
  :class:`~jax_gmma.PackedWeight`: :func:`jax_gmma.weightonly_gemm`.

  Differentiable with respect to a float ``x`` and ``bias`` (``jax.grad``, ``jax.vjp``): the
  on-the-fly quantization of x passes gradients straight through, and the weight is a constant
  (its cotangent is zero, as under ``lax.stop_gradient``; train weights with
  :func:`jax_gmma.fp8_linear`). The backward pass is one XLA bfloat16 GEMM (float32
  accumulation): ``dx = g @ dequantize(w)``, the per-channel / global scales folded into g and
  the weight exact in bf16 where the format allows (FP8 per-tensor / per-channel, MX, FP4 / FP6
  weight-only); block-scaled and NVFP4 block weights are rounded to bf16 once.
  """
  if not isinstance(x, QuantizedArray):
    x = jnp.asarray(x)
    return _dot_float(x, w, bias, (None if out_dtype is None else np.dtype(jnp.dtype(out_dtype)),
                                   x_format, bool(fast_accum), config, splits))
  return _dot_impl(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format, fast_accum=fast_accum,
                   config=config, splits=splits)


def _dot_impl(x, w, *, bias, out_dtype, x_format, fast_accum, config, splits):
  family = ops.family_for(w)
  if family is not None:
    return family.dot(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format,
                      fast_accum=fast_accum, config=config, splits=splits)
  if not isinstance(w, QuantizedArray):
    raise TypeError("w must be a jax_gmma.QuantizedArray of an (N, K) weight; quantize it once with "
                    "jax_gmma.quantize(w, 'fp8_channel')")
  raise ValueError(f"w: format {w.format.name!r} has no GEMM kernel in this version; "
                   f"supported weight formats: {', '.join(ops.QUANTIZED_WEIGHT_FORMATS)}")


# -- differentiation ---------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _dot_float(x, w, bias, static):
  out_dtype, x_format, fast_accum, config, splits = static
  return _dot_impl(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format, fast_accum=fast_accum,
                   config=config, splits=splits)


def _dot_float_fwd(x, w, bias, static):
  return _dot_float(x, w, bias, static), (w, bias, _vma.like(x))


def _dot_float_bwd(static, res, g):
  w, bias, x_like = res
  n = g.shape[-1]
  g2 = g.reshape(-1, n)
  dx = dx_from_dequantized(g2, w).reshape(*g.shape[:-1], w.k).astype(x_like.dtype)
  # None: a zero cotangent for every leaf of w
  return _vma.match(dx, x_like), None, _vma.bias_cotangent(g2, bias)


_dot_float.defvjp(_dot_float_fwd, _dot_float_bwd)


def dx_from_dequantized(g, w):
  """``g @ dequantize(w)`` for g (M, N): one bfloat16 GEMM with float32 accumulation, float32
  (M, K). Per-channel / per-tensor / global scales are folded into g (float32, then one bf16
  rounding) so that the weight operand is exact in bf16 where the format allows."""
  g = g.astype(jnp.float32)
  if isinstance(w, PackedWeight):
    wb = unpack(w)[:, :w.k]                      # code x block scale: exact in bf16
    if w.global_scale is not None:
      g = g * jnp.asarray(w.global_scale, jnp.float32).reshape(())
  elif w.format.name in tensorwise.WEIGHT_FORMATS:
    wb = w.data.astype(jnp.bfloat16)              # e4m3 / e5m2: exact in bf16
    g = g * jnp.asarray(w.scales, jnp.float32).reshape(1, -1)
  else:
    wb = w.dequantize(jnp.float32).astype(jnp.bfloat16)
  return lax.dot_general(g.astype(jnp.bfloat16), wb, (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)


# -- jax.nn.scaled_matmul -----------------------------------------------------------------

#: Block size along K of the 1x128 block-scaled kernels.
SCALED_MATMUL_BLOCK = 128
#: MXFP8's block size (E8M0 scales): jax_gmma.mx_gemm (jax-gmma's own kernel on Hopper).
SCALED_MATMUL_MX_BLOCK = 32
#: Scale dtypes scaled_matmul accepts for the kernel path (all exact in float32).
_EXACT_SCALE_DTYPES = (shapes.F32, shapes.BF16, shapes.F16, np.dtype(E8M0))


def _scaled_matmul_reference(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type):
  """jax.nn.scaled_matmul's documented maths, float32, pure JAX."""
  def deq(x, s):
    bs = x.shape[-1] // s.shape[-1]
    return x.astype(jnp.float32) * jnp.repeat(s.astype(jnp.float32), bs, axis=-1)
  out = jnp.einsum("bmk,bnk->bmn", deq(lhs, lhs_scales), deq(rhs, rhs_scales),
                   precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return out.astype(preferred_element_type)


def _mx_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype):
  """MXFP8 scaled_matmul: mx_gemm per batch entry on swizzled copies of the scales."""
  outs = [mx.mx_gemm(mx.mxfp8_operand(lhs[i], lhs_scales[i]), mx.mxfp8_operand(rhs[i], rhs_scales[i]),
                     out_dtype=out_dtype) for i in range(lhs.shape[0])]
  return jnp.stack(outs) if len(outs) > 1 else outs[0][None]


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=jnp.float32):
  """``jax.nn.scaled_matmul`` on jax-gmma's Hopper kernels.

  lhs (B, M, K), rhs (B, N, K), lhs_scales (B, M, K // bs), rhs_scales (B, N, K // bs): out
  (B, M, N) = einsum('BMK,BNK->BMN', lhs * repeat(lhs_scales, bs), rhs * repeat(rhs_scales, bs)).
  With block size bs = 128, float8_e4m3fn operands and float32 / bfloat16 / float16 /
  float8_e8m0fnu scales (converted to float32 exactly), this runs the block-scaled kernel
  (1x128 x 1x128 scales, :func:`jax_gmma.blockwise_gemm`), one GEMM per batch entry. MXFP8
  (block size 32, float8_e4m3fn operands, float8_e8m0fnu scales, what
  ``jax.nn.get_scaled_dot_general_config("mxfp8")`` makes) runs :func:`jax_gmma.mx_gemm` per
  batch entry (on Hopper jax-gmma's own kernel: every scale applied exactly in float32, see
  :mod:`jax_gmma.ops.mx`); its scales are swizzled to the
  kernel layout in the same jitted computation (1/32 of the operand bytes; quantize with
  ``layout="sm100_128x4"`` and call mx_gemm to do that once). Any other block size or dtype has
  no kernel: it raises unless the reference path is allowed (``jax_gmma.allow_reference``),
  which then computes the documented maths in float32.
  """
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  lhs_scales, rhs_scales = jnp.asarray(lhs_scales), jnp.asarray(rhs_scales)
  if not all(x.ndim == 3 for x in (lhs, rhs, lhs_scales, rhs_scales)):
    raise ValueError("scaled_matmul requires lhs (B, M, K), rhs (B, N, K), lhs_scales (B, M, K // bs) "
                     "and rhs_scales (B, N, K // bs): all 3-dimensional, got shapes "
                     f"{lhs.shape}, {rhs.shape}, {lhs_scales.shape}, {rhs_scales.shape}")
  (bsz, m, k), (bsz_b, n, k_b) = lhs.shape, rhs.shape
  if k != k_b or bsz != bsz_b:
    raise ValueError(f"scaled_matmul: lhs and rhs must have matching batch (B) and contraction (K) "
                     f"dimensions, got shapes {lhs.shape} and {rhs.shape}")
  if lhs_scales.shape[0] != bsz or rhs_scales.shape[0] != bsz or lhs_scales.shape[2] != rhs_scales.shape[2]:
    raise ValueError(f"scaled_matmul: scales must have matching batch (B) and contraction-block "
                     f"dimensions, got shapes {lhs_scales.shape} and {rhs_scales.shape}")
  if lhs_scales.shape[1] != m or rhs_scales.shape[1] != n:
    raise ValueError(f"scaled_matmul: scales must match the non-contracting dimensions: lhs {lhs.shape}, "
                     f"rhs {rhs.shape}, lhs_scales {lhs_scales.shape}, rhs_scales {rhs_scales.shape}")
  kb = lhs_scales.shape[2]
  if kb == 0 or k % kb:
    raise ValueError(f"scaled_matmul: K ({k}) must be a multiple of the scales' last dimension ({kb})")
  block = k // kb
  out_dtype = np.dtype(jnp.dtype(preferred_element_type))
  if (block == SCALED_MATMUL_MX_BLOCK and np.dtype(lhs.dtype) == shapes.F8E4M3 and
      np.dtype(rhs.dtype) == shapes.F8E4M3 and np.dtype(lhs_scales.dtype) == np.dtype(E8M0) and
      np.dtype(rhs_scales.dtype) == np.dtype(E8M0) and out_dtype in shapes.BLOCKWISE_OUT_DTYPES):
    return _mx_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  why = None
  if block != SCALED_MATMUL_BLOCK and block != SCALED_MATMUL_MX_BLOCK:
    why = (f"block size {block} (K={k} / {kb} scales) has no kernel behind scaled_matmul; it takes "
           f"block size {SCALED_MATMUL_BLOCK} (the 1x128 kernels) or {SCALED_MATMUL_MX_BLOCK} with "
           "float8_e8m0fnu scales (MXFP8, jax_gmma.mx_gemm); NVFP4 (block 16, two-level scales) goes "
           "through jax_gmma.quantize(x, 'nvfp4', layout='sm100_128x4') and mx_gemm")
  elif np.dtype(lhs.dtype) != shapes.F8E4M3 or np.dtype(rhs.dtype) != shapes.F8E4M3:
    why = (f"operands {np.dtype(lhs.dtype).name} x {np.dtype(rhs.dtype).name} have no kernel; the "
           "block-scaled kernels take float8_e4m3fn x float8_e4m3fn")
  elif block == SCALED_MATMUL_MX_BLOCK:
    why = (f"block size 32 takes float8_e8m0fnu scales (MXFP8), got {np.dtype(lhs_scales.dtype).name} / "
           f"{np.dtype(rhs_scales.dtype).name}")
  elif any(np.dtype(s.dtype) not in _EXACT_SCALE_DTYPES for s in (lhs_scales, rhs_scales)):
    why = (f"scale dtypes {np.dtype(lhs_scales.dtype).name} / {np.dtype(rhs_scales.dtype).name} are not "
           "supported; use float32, bfloat16, float16 or float8_e8m0fnu")
  elif out_dtype not in shapes.BLOCKWISE_OUT_DTYPES:
    why = f"preferred_element_type {out_dtype.name} is not one of bfloat16, float16, float32"
  if why is not None:
    if not _backend.reference_allowed():
      raise ValueError(f"jax_gmma.scaled_matmul: {why}. {_backend.REFUSAL}")
    return _scaled_matmul_reference(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  sa = lhs_scales.astype(jnp.float32)
  sb = rhs_scales.astype(jnp.float32)
  outs = [blockwise_gemm(lhs[i], rhs[i], sa[i], sb[i], out_dtype=out_dtype) for i in range(bsz)]
  return jnp.stack(outs) if bsz > 1 else outs[0][None]
