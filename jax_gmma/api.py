"""The public entry points on QuantizedArrays / PackedWeights: :func:`dot` (asks the op families
of :mod:`jax_gmma.ops` which one multiplies the weight), :func:`ragged_dot` (the grouped GEMM of
mixture-of-experts layers, :mod:`jax_gmma.ops.grouped`) and :func:`scaled_matmul`
(``jax.nn.scaled_matmul`` on the block-scaled families)."""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _backend, _vma, ops, primitive
from .arrays import QuantizedArray, check_leaves
from .numerics import shapes
from .numerics.formats import E8M0
from .ops import blockwise, mx, tensorwise
from .ops.grouped import ragged_dot
from .ops.weightonly import PackedWeight, unpack


WHO_DOT = "jax_gmma.dot"


def dot(x, w: QuantizedArray, *, bias=None, out_dtype=None, x_format: str = "fp8_channel",
        fast_accum: bool = False, config: Optional[str] = None, splits: Optional[int] = None):
  """``x @ dequantize(w).T`` as an FP8 GEMM: ``x`` (..., K) float or QuantizedArray, ``w`` a
  QuantizedArray of an (N, K) weight (``quantize(w, "fp8_channel")``, done once).

  A float ``x`` (bfloat16, float16 or float32; any rank >= 1, leading dims folded into M, which
  may be 0: the result is then an empty (..., 0, N) array) is quantized on the fly to
  float8_e4m3fn with ``x_format``: "fp8_channel" (one scale per token/row, the default) or
  "fp8_tensor". ``out_dtype`` (bfloat16, float16 or float32) defaults to x's dtype (bfloat16
  for a QuantizedArray x). Integer, bool and complex x / bias, and a non-float out_dtype, are
  refused, as is a QuantizedArray whose fields do not match its format.

  The weight picks the op family (``jax_gmma.ops.FAMILIES``, each with the ``WEIGHT_FORMATS``
  it serves and its own ``dot``). Block-scaled weights (formats "fp8_128x128" and "fp8_1x128"):
  x is quantized to "fp8_1x128" (one scale per token and 128 of K; ``x_format`` and
  ``fast_accum`` do not apply) and the product runs on :func:`jax_gmma.blockwise_gemm`. MX /
  NVFP4 weights: :func:`jax_gmma.mx_gemm` (see ``jax_gmma.ops.mx.dot``; a weight with row-major
  scales is converted to the kernels' swizzled layout inside the call). A
  :class:`~jax_gmma.PackedWeight`: :func:`jax_gmma.weightonly_gemm`.

  Differentiable with respect to a float ``x`` and ``bias`` (``jax.grad``, ``jax.vjp``): the
  on-the-fly quantization of x passes gradients straight through, and the weight is a constant
  (its cotangent is zero, as under ``lax.stop_gradient``; train weights with
  :func:`jax_gmma.fp8_linear`; an E8M0 scale leaf is stored as uint8 bytes and gets a ``float0``
  cotangent, so ``jax.grad`` with respect to an MX weight needs ``allow_int=True``). The
  backward pass is one XLA bfloat16
  GEMM (float32 accumulation): ``dx = g @ dequantize(w)``, the per-channel / global scales
  folded into g and the weight exact in bf16 where the format allows (FP8 per-tensor /
  per-channel, MX, FP4 / FP6 weight-only); block-scaled and NVFP4 block weights are rounded to
  bf16 once.
  """
  if isinstance(w, PackedWeight):
    if not isinstance(x, QuantizedArray):
      x = jnp.asarray(x)
      out_dt = None if out_dtype is None else primitive.out_dtype_or_error(out_dtype, WHO_DOT)
      return _dot_float(x, w, bias, (out_dt, x_format, bool(fast_accum), config, splits))
    return _dot_impl(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format, fast_accum=fast_accum,
                     config=config, splits=splits)
  who = WHO_DOT
  n, k = check_weight(w, who)
  out_dtype = None if out_dtype is None else primitive.out_dtype_or_error(out_dtype, who)
  bias = primitive.check_bias(bias, n, who)
  primitive.check_splits(splits, who)
  if config is not None and not isinstance(config, str):
    raise TypeError(f"{who}: config must be None or a kernel config name (str), got {config!r}")
  if not isinstance(x_format, str):
    raise TypeError(f"{who}: x_format must be a format name (str), got {x_format!r}")
  if isinstance(x, QuantizedArray):
    check_quantized(x, who, "x")
    if x.k != k:
      raise ValueError(f"{who}: contraction mismatch: x has K={x.k}, w has K={k}")
    return _dot_impl(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format, fast_accum=fast_accum,
                     config=config, splits=splits)
  x = primitive.float_activation(x, who)
  if x.ndim < 1:
    raise ValueError(f"{who}: x must have rank >= 1, (..., K) with K = {k}, got a scalar")
  if x.shape[-1] != k:
    raise ValueError(f"{who}: contraction mismatch: x.shape[-1] = {x.shape[-1]} must equal w's K = "
                     f"{k} (x is (..., K), w an (N, K) weight), got x shape {tuple(x.shape)}")
  lead = tuple(x.shape[:-1])
  m = shapes.size(lead)
  if shapes.is_constant_dim(m) and m >= 2**31:
    raise ValueError(f"{who}: x's rows M = prod(x.shape[:-1]) = {m} must be < 2**31")
  static = (out_dtype, x_format, bool(fast_accum), config, splits)
  if shapes.is_constant_dim(m) and m == 0:
    # No rows: the same checks as one row (abstractly: nothing runs), then an empty result.
    one = jax.eval_shape(lambda x1, w1, b1: _dot_impl(x1, w1, bias=b1, out_dtype=out_dtype,
                                                      x_format=x_format, fast_accum=fast_accum,
                                                      config=config, splits=splits, who=who),
                         jax.ShapeDtypeStruct((1, k), x.dtype), w, bias)
    return jnp.zeros(lead + (n,), one.dtype)
  return _dot_float(x.reshape(m, k), w, bias, static).reshape(*lead, n)


def check_quantized(q: QuantizedArray, who: str, name: str) -> None:
  """The leaves of QuantizedArray ``q`` (argument ``name``) as its format stores them (one rule
  with the constructor and quantize: :func:`jax_gmma.arrays.check_leaves`). A pytree rebuilt
  with other leaves (``tree_unflatten``, ``tree.map``) is refused here rather than multiplied
  with the wrong meaning."""
  check_leaves(q, f"{who}: {name}")


def check_weight(w, who: str) -> tuple:
  """(N, K) of a QuantizedArray weight some family multiplies, else the error."""
  if not isinstance(w, QuantizedArray):
    raise TypeError(f"{who}: w must be a jax_gmma.QuantizedArray of an (N, K) weight (quantize it "
                    "once with jax_gmma.quantize(w, 'fp8_channel')) or a jax_gmma.PackedWeight, got "
                    f"{type(w).__name__}")
  if ops.family_for(w) is None:
    raise ValueError(f"{who}: w has format {w.format.name!r}, which has no GEMM kernel in this "
                     f"version; supported weight formats: {', '.join(ops.QUANTIZED_WEIGHT_FORMATS)}")
  if len(w.canonical_shape) != 2:
    raise ValueError(f"{who}: w must be a 2-D (N, K) weight, got shape {w.shape}")
  check_quantized(w, who, "w")
  n, k = w.canonical_shape
  if max(n, k) >= 2**31:
    raise ValueError(f"{who}: w's dimensions must be < 2**31, got N={n} K={k}")
  return int(n), int(k)


def _dot_impl(x, w, *, bias, out_dtype, x_format, fast_accum, config, splits, who=WHO_DOT):
  family = ops.family_for(w)
  if family is not None:
    return family.dot(x, w, bias=bias, out_dtype=out_dtype, x_format=x_format,
                      fast_accum=fast_accum, config=config, splits=splits, who=who)
  check_weight(w, who)
  raise AssertionError("unreachable")  # check_weight refuses every weight no family serves


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
  return _vma.match(dx, x_like), None, _vma.bias_cotangent(g2, bias)  # the weight is a constant


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
  """MXFP8 scaled_matmul: one mx_gemm on swizzled copies of the scales, batched by ``jax.vmap``
  (mx_gemm's batching rule: one GEMM per batch entry inside one ``lax.map``)."""
  def one(l, r, ls, rs):
    return mx.gemm(mx.mxfp8_operand(l, ls), mx.mxfp8_operand(r, rs), bias=None, out_dtype=out_dtype,
                   config=None, caller=_SCALED_MATMUL_CALLER)
  return one(lhs[0], rhs[0], lhs_scales[0], rhs_scales[0])[None] if lhs.shape[0] == 1 \
      else jax.vmap(one)(lhs, rhs, lhs_scales, rhs_scales)


def _blockwise_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype):
  """Block size 128: one block-scaled GEMM (1x128 x 1x128 scales), batched by ``jax.vmap`` (the
  primitive's batching rule: with a different rhs per batch entry, one GEMM per entry inside
  one ``lax.map``)."""
  def one(l, r, ls, rs):
    return blockwise.gemm(l, r, ls, rs, bias=None, out_dtype=out_dtype, config=None, splits=None,
                          caller=_SCALED_MATMUL_CALLER)
  sa, sb = lhs_scales.astype(jnp.float32), rhs_scales.astype(jnp.float32)
  return one(lhs[0], rhs[0], sa[0], sb[0])[None] if lhs.shape[0] == 1 \
      else jax.vmap(one)(lhs, rhs, sa, sb)


_SCALED_MATMUL_CALLER = ("scaled_matmul", "lhs", "rhs")


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=jnp.float32):
  """``jax.nn.scaled_matmul`` on jax-gmma's Hopper kernels.

  lhs (B, M, K), rhs (B, N, K), lhs_scales (B, M, K // bs), rhs_scales (B, N, K // bs): out
  (B, M, N) = einsum('BMK,BNK->BMN', lhs * repeat(lhs_scales, bs), rhs * repeat(rhs_scales, bs)).
  With block size bs = 128, float8_e4m3fn operands and float32 / bfloat16 / float16 /
  float8_e8m0fnu scales (converted to float32 exactly), this runs the block-scaled kernel
  (1x128 x 1x128 scales, :func:`jax_gmma.blockwise_gemm`). MXFP8 (block size 32,
  float8_e4m3fn operands, float8_e8m0fnu scales, what
  ``jax.nn.get_scaled_dot_general_config("mxfp8")`` makes) runs :func:`jax_gmma.mx_gemm` (on
  Hopper jax-gmma's own kernel: every scale applied exactly in float32, see
  :mod:`jax_gmma.ops.mx`); its scales are swizzled to the kernel layout in the same jitted
  computation (1/32 of the operand bytes; quantize with ``layout="sm100_128x4"`` and call
  mx_gemm to do that once).

  Every batch entry has its own rhs, so the batch is not folded into M: B > 1 runs one GEMM
  per batch entry inside one ``lax.map`` (one kernel call in the program, a loop of B launches;
  for one weight shared by the batch, reshape lhs to (1, B * M, K) instead: one launch).
  A zero-size B, M or N gives an empty (B, M, N) result; K must be >= 1.

  Integer, bool and complex arrays and a non-float ``preferred_element_type`` are refused. Any
  other block size or dtype has no kernel: it raises unless the reference path is allowed
  (``jax_gmma.allow_reference``), which then computes the documented maths in float32.
  """
  who = "jax_gmma.scaled_matmul"
  args = {}
  for name, v in (("lhs", lhs), ("rhs", rhs), ("lhs_scales", lhs_scales), ("rhs_scales", rhs_scales)):
    try:
      v = jnp.asarray(v)
    except TypeError:
      raise TypeError(f"{who}: {name} must be a floating array, got {type(v).__name__}") from None
    primitive.check_float(v.dtype, who, name)
    args[name] = v
  lhs, rhs, lhs_scales, rhs_scales = args["lhs"], args["rhs"], args["lhs_scales"], args["rhs_scales"]
  try:
    out_dtype = np.dtype(jnp.dtype(preferred_element_type))
  except (TypeError, ValueError):
    raise TypeError(f"{who}: preferred_element_type must be a floating dtype (bfloat16, float16, "
                    f"float32), got {preferred_element_type!r}") from None
  if not jnp.issubdtype(out_dtype, jnp.floating):
    raise TypeError(f"{who}: preferred_element_type must be a floating dtype (bfloat16, float16, "
                    f"float32), got {out_dtype.name}")
  if not all(x.ndim == 3 for x in (lhs, rhs, lhs_scales, rhs_scales)):
    raise ValueError(f"{who}: requires lhs (B, M, K), rhs (B, N, K), lhs_scales (B, M, K // bs) "
                     "and rhs_scales (B, N, K // bs): all 3-dimensional, got shapes "
                     f"{lhs.shape}, {rhs.shape}, {lhs_scales.shape}, {rhs_scales.shape}")
  (bsz, m, k), (bsz_b, n, k_b) = lhs.shape, rhs.shape
  if k != k_b or bsz != bsz_b:
    raise ValueError(f"{who}: lhs and rhs must have matching batch (B) and contraction (K) "
                     f"dimensions, got shapes {lhs.shape} and {rhs.shape}")
  if lhs_scales.shape[0] != bsz or rhs_scales.shape[0] != bsz or lhs_scales.shape[2] != rhs_scales.shape[2]:
    raise ValueError(f"{who}: lhs_scales and rhs_scales must have matching batch (B) and "
                     f"contraction-block dimensions, got shapes {lhs_scales.shape} and {rhs_scales.shape}")
  if lhs_scales.shape[1] != m or rhs_scales.shape[1] != n:
    raise ValueError(f"{who}: scales must match the non-contracting dimensions: lhs {lhs.shape}, "
                     f"rhs {rhs.shape}, lhs_scales {lhs_scales.shape}, rhs_scales {rhs_scales.shape}")
  if k == 0:
    raise ValueError(f"{who}: K (lhs.shape[2]) must be >= 1, got shapes {lhs.shape} and {rhs.shape}")
  kb = lhs_scales.shape[2]
  if kb == 0 or k % kb:
    raise ValueError(f"{who}: K ({k}) must be a multiple of the scales' last dimension ({kb})")
  if max(bsz * m, n, k) >= 2**31:
    raise ValueError(f"{who}: dimensions must be < 2**31, got B*M={bsz * m} N={n} K={k}")
  block = k // kb
  mx_path = (block == SCALED_MATMUL_MX_BLOCK and np.dtype(lhs.dtype) == shapes.F8E4M3 and
             np.dtype(rhs.dtype) == shapes.F8E4M3 and np.dtype(lhs_scales.dtype) == np.dtype(E8M0) and
             np.dtype(rhs_scales.dtype) == np.dtype(E8M0) and out_dtype in shapes.BLOCKWISE_OUT_DTYPES)
  why = None
  if mx_path:
    pass
  elif block != SCALED_MATMUL_BLOCK and block != SCALED_MATMUL_MX_BLOCK:
    why = (f"block size {block} (K={k} / {kb} scales) has no kernel behind scaled_matmul; it takes "
           f"block size {SCALED_MATMUL_BLOCK} (the 1x128 kernels) or {SCALED_MATMUL_MX_BLOCK} with "
           "float8_e8m0fnu scales (MXFP8, jax_gmma.mx_gemm); NVFP4 (block 16, two-level scales) goes "
           "through jax_gmma.quantize(x, 'nvfp4', layout='sm100_128x4') and mx_gemm")
  elif np.dtype(lhs.dtype) != shapes.F8E4M3 or np.dtype(rhs.dtype) != shapes.F8E4M3:
    why = (f"operands lhs / rhs {np.dtype(lhs.dtype).name} x {np.dtype(rhs.dtype).name} have no kernel; "
           "the block-scaled kernels take float8_e4m3fn x float8_e4m3fn")
  elif block == SCALED_MATMUL_MX_BLOCK and out_dtype in shapes.BLOCKWISE_OUT_DTYPES:
    why = (f"block size 32 takes float8_e8m0fnu scales (MXFP8), got lhs_scales / rhs_scales "
           f"{np.dtype(lhs_scales.dtype).name} / {np.dtype(rhs_scales.dtype).name}")
  elif any(np.dtype(s.dtype) not in _EXACT_SCALE_DTYPES for s in (lhs_scales, rhs_scales)):
    why = (f"lhs_scales / rhs_scales dtypes {np.dtype(lhs_scales.dtype).name} / "
           f"{np.dtype(rhs_scales.dtype).name} are not supported; use float32, bfloat16, float16 or "
           "float8_e8m0fnu")
  elif out_dtype not in shapes.BLOCKWISE_OUT_DTYPES:
    why = f"preferred_element_type {out_dtype.name} is not one of bfloat16, float16, float32"
  if why is not None and not _backend.reference_allowed():
    raise ValueError(f"{who}: {why}. {_backend.REFUSAL}")
  if bsz == 0 or m == 0 or n == 0:
    return jnp.zeros((bsz, m, n), out_dtype)
  if why is not None:
    return _scaled_matmul_reference(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  if mx_path:
    return _mx_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  return _blockwise_scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, out_dtype)


def export_disabled_checks() -> list:
  """``disabled_checks`` for ``jax.export.export`` of programs that run jax-gmma kernels: the
  custom-call targets of the kernels (XLA FFI handlers of this build). JAX refuses to serialize
  custom calls without a compatibility guarantee; jax-gmma's targets have none across versions,
  so an exported program runs with the jax-gmma build it was exported with (the same version on
  the machine that calls it)."""
  return [jax.export.DisabledSafetyCheck.custom_call(t) for t in _backend.TARGETS]
