"""High-level entry points on QuantizedArrays."""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _vma, shapes
from .blockwise import blockwise_gemm
from .ops import fp8_gemm
from .quantize import QuantizedArray, quantize

#: Weight formats `dot` runs on a GEMM kernel today.
DOT_WEIGHT_FORMATS = ("fp8_tensor", "fp8_channel")
#: How `dot` quantizes a float activation.
DOT_ACTIVATION_FORMATS = ("fp8_channel", "fp8_tensor")
#: Block-scaled weight formats: `dot` quantizes the activation to fp8_1x128 and runs the
#: block-scaled GEMM (jax_gmma.blockwise_gemm).
DOT_BLOCKWISE_WEIGHT_FORMATS = ("fp8_128x128", "fp8_1x128")
#: MX / NVFP4 weight formats: `dot` quantizes the activation to the matching format (or to
#: x_format="mxfp8" for MX weights, e.g. MXFP8 activations x MXFP4 weights) with the swizzled
#: scale layout and runs jax_gmma.mx.mx_gemm (Blackwell kernels; MXFP8 x MXFP8 also on Hopper;
#: reference elsewhere).
DOT_MX_WEIGHT_FORMATS = ("mxfp8", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4")


def dot(x, w: QuantizedArray, *, bias=None, out_dtype=None, x_format: str = "fp8_channel",
        fast_accum: bool = False, config: Optional[str] = None, splits: Optional[int] = None):
  """``x @ dequantize(w).T`` as an FP8 GEMM: ``x`` (..., K) float or QuantizedArray, ``w`` a
  QuantizedArray of an (N, K) weight (``quantize(w, "fp8_channel")``, done once).

  A float ``x`` is quantized on the fly to float8_e4m3fn with ``x_format``: "fp8_channel" (one
  scale per token/row, the default) or "fp8_tensor". ``out_dtype`` defaults to x's dtype when it
  is bfloat16/float16/float32, else bfloat16.

  Block-scaled weights (formats "fp8_128x128" and "fp8_1x128"): x is quantized to "fp8_1x128"
  (one scale per token and 128 of K; ``x_format`` and ``fast_accum`` do not apply) and the
  product runs on :func:`jax_gmma.blockwise_gemm`.

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
  from .weightonly import PackedWeight  # noqa: PLC0415
  if isinstance(w, PackedWeight):
    return _dot_weightonly(x, w, bias=bias, out_dtype=out_dtype)
  if not isinstance(w, QuantizedArray):
    raise TypeError("w must be a jax_gmma.QuantizedArray of an (N, K) weight; quantize it once with "
                    "jax_gmma.quantize(w, 'fp8_channel')")
  if w.format.name in DOT_BLOCKWISE_WEIGHT_FORMATS:
    return _dot_blockwise(x, w, bias=bias, out_dtype=out_dtype, config=config, splits=splits)
  if w.format.name in DOT_MX_WEIGHT_FORMATS:
    return _dot_mx(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format, config=config)
  if w.format.name not in DOT_WEIGHT_FORMATS:
    raise ValueError(f"w: format {w.format.name!r} has no GEMM kernel in this version; "
                     f"supported weight formats: "
                     f"{', '.join(DOT_WEIGHT_FORMATS + DOT_BLOCKWISE_WEIGHT_FORMATS + DOT_MX_WEIGHT_FORMATS)}")
  if w.data.ndim != 2:
    raise ValueError(f"w must be a 2-D (N, K) weight, got data shape {w.data.shape}")
  if isinstance(x, QuantizedArray):
    if x.format.name not in DOT_WEIGHT_FORMATS:
      raise ValueError(f"x: format {x.format.name!r} is not supported by dot; use one of "
                       f"{', '.join(DOT_ACTIVATION_FORMATS)}")
    xq = x
    default_out = shapes.BF16
  else:
    x = jnp.asarray(x)
    if x_format not in DOT_ACTIVATION_FORMATS:
      raise ValueError(f"x_format must be one of {DOT_ACTIVATION_FORMATS}, got {x_format!r}")
    default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in shapes.OUT_DTYPES else shapes.BF16
    xq = quantize(x, x_format, dtype=jnp.float8_e4m3fn)
  out_dtype = default_out if out_dtype is None else out_dtype
  return fp8_gemm(xq.data, w.data, xq.scales, w.scales, bias=bias, out_dtype=out_dtype,
                  fast_accum=fast_accum, config=config, splits=splits)


def _dot_blockwise(x, w: QuantizedArray, *, bias, out_dtype, config, splits):
  """``dot`` for fp8_128x128 / fp8_1x128 weights: x is quantized per token and 128 of K
  (fp8_1x128, float8_e4m3fn) and multiplied by the block-scaled GEMM. Stored data of both
  operands is K-padded to a multiple of 128 with zeros, so the padding adds nothing."""
  if w.data.ndim != 2:
    raise ValueError(f"w must be a 2-D (N, K) weight, got data shape {w.data.shape}")
  if isinstance(x, QuantizedArray):
    if x.format.name != "fp8_1x128":
      raise ValueError(f"x: format {x.format.name!r} cannot multiply a {w.format.name} weight; "
                       "use fp8_1x128 (or pass a float x)")
    xq = x
    default_out = shapes.BF16
  else:
    x = jnp.asarray(x)
    default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in shapes.OUT_DTYPES else shapes.BF16
    xq = quantize(x, "fp8_1x128", dtype=jnp.float8_e4m3fn)
  if xq.k != w.k:
    raise ValueError(f"contraction mismatch: x has K={xq.k}, w has K={w.k}")
  out_dtype = default_out if out_dtype is None else out_dtype
  return blockwise_gemm(xq.data, w.data, xq.scales, w.scales, bias=bias, out_dtype=out_dtype,
                        config=config, splits=splits)


def _dot_mx(x, w: QuantizedArray, *, bias, out_dtype, x_format, config):
  """``dot`` for MX / NVFP4 weights: a float x (..., K) is flattened to (M, K) and quantized to
  w's format (``x_format="fp8_channel"``, the default, means "match w"; "mxfp8" gives MXFP8
  activations for any MX weight) with scales in the swizzled layout, then
  :func:`jax_gmma.mx.mx_gemm`."""
  from . import mx  # noqa: PLC0415 (keeps the import graph flat)
  if isinstance(x, QuantizedArray):
    return mx.mx_gemm(x, w, bias=bias, out_dtype=shapes.BF16 if out_dtype is None else out_dtype,
                      config=config)
  x = jnp.asarray(x)
  fmt = w.format.name if x_format == "fp8_channel" else x_format
  if fmt not in DOT_MX_WEIGHT_FORMATS:
    raise ValueError(f"x_format must be one of {DOT_MX_WEIGHT_FORMATS} for a {w.format.name} weight, "
                     f"got {x_format!r}")
  if x.ndim < 1 or x.shape[-1] != w.k:
    raise ValueError(f"contraction mismatch: x has shape {x.shape}, w has K={w.k}")
  default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in shapes.OUT_DTYPES else shapes.BF16
  lead = x.shape[:-1]
  xq = quantize(x.reshape(-1, x.shape[-1]), fmt, layout=mx.SCALE_LAYOUT)
  out = mx.mx_gemm(xq, w, bias=bias, out_dtype=default_out if out_dtype is None else out_dtype,
                   config=config)
  return out.reshape(*lead, out.shape[-1])


def _dot_weightonly(x, w, *, bias, out_dtype):
  """``dot`` for FP4 / FP6 weights prepared for Hopper (jax_gmma.weightonly.prepare): a float x is
  multiplied in bfloat16 (float32/float16 inputs are rounded to bf16 first); an FP8
  QuantizedArray x (fp8_tensor / fp8_channel) is widened to bf16 exactly with its scales."""
  from .weightonly import weightonly_gemm  # noqa: PLC0415
  if isinstance(x, QuantizedArray):
    if x.format.name not in DOT_WEIGHT_FORMATS:
      raise ValueError(f"x: format {x.format.name!r} cannot multiply FP4/FP6 weights; use fp8_tensor, "
                       "fp8_channel or a float x")
    return weightonly_gemm(x.data, w, x_scale=x.scales, bias=bias,
                           out_dtype=shapes.BF16 if out_dtype is None else out_dtype)
  x = jnp.asarray(x)
  default_out = shapes.F32 if np.dtype(x.dtype) == shapes.F32 else shapes.BF16
  if np.dtype(x.dtype) != shapes.BF16:
    x = x.astype(jnp.bfloat16)
  return weightonly_gemm(x, w, bias=bias, out_dtype=default_out if out_dtype is None else out_dtype)


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
  from .weightonly import PackedWeight, unpack  # noqa: PLC0415
  g = g.astype(jnp.float32)
  if isinstance(w, PackedWeight):
    wb = unpack(w)[:, :w.k]                      # code x block scale: exact in bf16
    if w.global_scale is not None:
      g = g * jnp.asarray(w.global_scale, jnp.float32).reshape(())
  elif w.format.name in DOT_WEIGHT_FORMATS:
    wb = w.data.astype(jnp.bfloat16)              # e4m3 / e5m2: exact in bf16
    g = g * jnp.asarray(w.scales, jnp.float32).reshape(1, -1)
  else:
    wb = w.dequantize(jnp.float32).astype(jnp.bfloat16)
  return lax.dot_general(g.astype(jnp.bfloat16), wb, (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)
