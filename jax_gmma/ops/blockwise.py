"""Block-scaled FP8 GEMM (DeepSeek-V3 style) for Hopper: 1x128 activation scales times 128x128
("1d2d") or 1x128 ("1d1d") weight scales, float32 scales applied per 128 of K.

The primitive ``fp8_blockwise_gemm_p`` takes its scales in the kernels' layout (see
:func:`kernel_scale_layout`); its default lowering is the pure-JAX reference (dequantize the
blocks, float32 dot, cast), its CUDA lowering the CUTLASS kernel (XLA FFI custom call
``jax_gmma_fp8_blockwise_gemm``). Public entry points: :func:`blockwise_gemm` and
:func:`scaled_matmul` (``jax.nn.scaled_matmul``'s signature and semantics).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import ShapedArray
from jax.interpreters import mlir

try:  # jax >= 0.4.36
  from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
  from jax.core import Primitive
from jax._src import dispatch  # apply_primitive: eager execution of a primitive via jit

from . import _backend, _vma, blockwise_configs, shapes
from . import sharding as _sharding
from .formats import E8M0

BLOCKWISE_GEMM_TARGET = _backend.FP8_BLOCKWISE_GEMM_TARGET
#: Rows of the kernel scale layout are padded to a multiple of this (16-byte aligned columns).
SCALE_LD_ALIGN = 4

fp8_blockwise_gemm_p = Primitive("jax_gmma_fp8_blockwise_gemm")
fp8_blockwise_gemm_p.def_impl(functools.partial(dispatch.apply_primitive, fp8_blockwise_gemm_p))


# -- scale layouts -----------------------------------------------------------------------------

def scale_ld(rows: int) -> int:
  """Leading dimension of a kernel-layout scale matrix with ``rows`` rows."""
  return -(-rows // SCALE_LD_ALIGN) * SCALE_LD_ALIGN


def kernel_scale_layout(scales):
  """Row-major scales (rows, kb) -> the kernels' MN-major layout (kb, scale_ld(rows)): scale
  (r, kb) at [kb, r], rows zero-padded to a multiple of 4 (the padding feeds only rows past the
  problem's edge, never stored). Free for rows = 1."""
  rows = scales.shape[0]
  t = scales.T
  pad = scale_ld(rows) - rows
  return jnp.pad(t, ((0, 0), (0, pad))) if pad else t


def _rowmajor_from_kernel(scales_t, rows):
  return scales_t[:, :rows].T


# -- reference -----------------------------------------------------------------------------------

def _expand(scales, rows, k, row_block):
  """(ceil(rows/row_block), ceil(k/128)) block scales -> one float32 per element (rows, k)."""
  s = scales.astype(jnp.float32)
  if row_block > 1:
    s = jnp.repeat(s, row_block, axis=0)[:rows]
  return jnp.repeat(s, shapes.BLOCK_K, axis=1)[:, :k]


def blockwise_gemm_reference(a, b, a_scales, b_scales, bias=None, *, out_dtype, has_bias=None, **_unused):
  """Pure-JAX reference in the user layout: a (M, K) fp8, b (N, K) fp8, a_scales (M, kb),
  b_scales (ceil(N/128), kb) or (N, kb), bias (N,): dequantize the blocks to float32, dot at
  HIGHEST precision, add bias in float32, cast once."""
  m, k = a.shape
  n = b.shape[0]
  row_block = shapes.BLOCK_N if b_scales.shape[0] != n else 1
  af = a.astype(jnp.float32) * _expand(a_scales, m, k, 1)
  bf = b.astype(jnp.float32) * _expand(b_scales, n, k, row_block)
  out = lax.dot_general(af, bf, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.float32)
  if has_bias is None:
    has_bias = bias is not None
  if has_bias:
    out = out + bias.astype(jnp.float32).reshape(1, -1)
  return out.astype(out_dtype)


def _reference_lowering(a, b, a_scales_t, b_scales_t, bias, *, out_dtype, variant, has_bias, **_):
  m, n = a.shape[0], b.shape[0]
  rows_b = -(-n // shapes.BLOCK_N) if variant == "1d2d" else n
  return blockwise_gemm_reference(a, b, _rowmajor_from_kernel(a_scales_t, m),
                                  _rowmajor_from_kernel(b_scales_t, rows_b), bias,
                                  out_dtype=out_dtype, has_bias=has_bias)


def _abstract_eval(a, b, a_scales_t, b_scales_t, bias, *, out_dtype, **_):
  return _vma.out_aval((a.shape[0], b.shape[0]), out_dtype, a, b, a_scales_t, b_scales_t, bias)


fp8_blockwise_gemm_p.def_abstract_eval(_abstract_eval)
# Default lowering (every platform): the pure-JAX reference.
mlir.register_lowering(fp8_blockwise_gemm_p,
                       _sharding.lowering(fp8_blockwise_gemm_p, mlir.lower_fun(_reference_lowering, multiple_results=False)))


# -- CUDA lowering -----------------------------------------------------------------------------

def _has_blockwise_kernels() -> bool:
  e = _backend.ext()
  return bool(e is not None and hasattr(e, "check_blockwise") and
              any(str(k["config"]).startswith("blockwise_") for k in e.kernels()))


def plan(problem: shapes.BlockwiseProblem, sm_count: int, *, config=None, splits=None, swizzle=None,
         raster=None):
  """(KernelConfig, splits, workspace bytes, (swizzle, raster)) for a problem (ops.plan's order);
  raises ValueError when CUTLASS's can_implement rejects it. Host-only; needs the built extension."""
  cfg, s = blockwise_configs.select_blockwise_config(problem, sm_count, config=config, splits=splits)
  order = blockwise_configs.select_tile_order(problem, cfg, swizzle=swizzle, raster=raster)
  name = blockwise_configs.kernel_name(cfg, problem.variant)
  kernel_out = shapes.F32 if problem.out_dtype == shapes.F16 else problem.out_dtype
  err, ws = _backend.ext().check_blockwise(name, problem.a_dtype.name, problem.b_dtype.name,
                                           np.dtype(kernel_out).name, problem.m, problem.n, problem.k,
                                           s, sm_count, problem.has_bias, order[0],
                                           blockwise_configs.RASTERS[order[1]])
  if err:
    raise ValueError(f"jax_gmma: kernel {name} (splits={s}, swizzle={order[0]}, raster={order[1]!r}) "
                     f"cannot run {problem}: {err}")
  return cfg, s, ws, order


def _cuda_lowering(ctx, a, b, a_scales_t, b_scales_t, bias, *, out_dtype, variant, has_bias, config,
                   splits, swizzle, raster):
  params = dict(out_dtype=out_dtype, variant=variant, has_bias=has_bias, config=config, splits=splits)
  dev = _backend.check_cuda_kernels("blockwise_gemm")
  if dev is not None and not _has_blockwise_kernels():
    if not _backend.reference_allowed():
      raise _backend.KernelUnavailable(
          "jax_gmma.blockwise_gemm: this build of jax_gmma has no block-scaled kernels; rebuild it "
          "with nvcc on PATH. Refusing to fall back silently to the slower pure-JAX reference; set "
          "JAX_GMMA_ALLOW_REFERENCE=1, call jax_gmma.set_allow_reference(True), or trace inside "
          "`with jax_gmma.allow_reference():` to run it anyway.")
    dev = None
  if dev is None:  # the user opted in to the reference path
    return mlir.lower_fun(_reference_lowering, multiple_results=False)(ctx, a, b, a_scales_t,
                                                                       b_scales_t, bias, **params)
  _backend.register_targets()
  _backend.prepare_devices()
  av, bv = ctx.avals_in[:2]  # shapes and scale layouts were checked by blockwise_gemm
  problem = shapes.BlockwiseProblem(m=av.shape[0], n=bv.shape[0], k=av.shape[1], batch_shape=(),
                                    a_dtype=np.dtype(av.dtype), b_dtype=np.dtype(bv.dtype),
                                    out_dtype=np.dtype(out_dtype), variant=variant, has_bias=has_bias)
  sm_count = int(dev.core_count)
  cfg, s, ws, (sw, ro) = plan(problem, sm_count, config=config, splits=splits, swizzle=swizzle,
                              raster=raster)
  # The workspace (stream-K partials and flags) is a second result: XLA owns the memory, so it
  # is valid under CUDA-graph replay and nothing is allocated at run time.
  ws_aval = ShapedArray((max(int(ws), 16),), np.dtype(np.uint8))
  rule = jax.ffi.ffi_lowering(BLOCKWISE_GEMM_TARGET)
  sub = ctx.replace(avals_out=[ctx.avals_out[0], ws_aval])
  results = rule(sub, a, b, a_scales_t, b_scales_t, bias,
                 config=blockwise_configs.kernel_name(cfg, variant), splits=np.int32(s),
                 sm_count=np.int32(sm_count), has_bias=bool(has_bias), swizzle=np.int32(sw),
                 raster=np.int32(blockwise_configs.RASTERS[ro]))
  return [results[0]]


mlir.register_lowering(fp8_blockwise_gemm_p,
                       _sharding.lowering(fp8_blockwise_gemm_p, _cuda_lowering), platform="cuda")


# -- public API --------------------------------------------------------------------------------

def blockwise_gemm(a, b, a_scales, b_scales, *, bias=None, out_dtype=jnp.bfloat16,
                   config: Optional[str] = None, splits: Optional[int] = None,
                   swizzle: Optional[int] = None, raster: Optional[str] = None):
  """Block-scaled FP8 GEMM: ``out[m, n] = sum_kb a_scales[m, kb] * b_scales[n // G, kb] *
  sum_{k in block kb} a[m, k] * b[n, k]  (+ bias[n])``.

  Args:
    a: (..., M, K) float8_e4m3fn, K contiguous (activations). Any M >= 1.
    b: (N, K) float8_e4m3fn, K contiguous (weights). N % 8 == 0; K % 16 == 0 (a partial last
      128-block of K is fine).
    a_scales: (..., M, ceil(K/128)) float32: one dequantization scale per row and 128 of K
      (``quantize(x, "fp8_1x128").scales``).
    b_scales: (ceil(N/128), ceil(K/128)) float32 (128x128 blocks, G = 128,
      ``quantize(w, "fp8_128x128").scales``) or (N, ceil(K/128)) float32 (1x128 blocks, G = 1).
    bias: optional (N,); added in float32, stored in ``out_dtype`` first (cast if needed).
    out_dtype: bfloat16, float32, or float16 (computed by the float32 kernel, then rounded once).
    config, splits: force a kernel config (``jax_gmma.blockwise_configs.CONFIGS``) and K split.
    swizzle, raster: force the persistent scheduler's tile order (swizzle 1/2/4/8, raster
      "auto"/"m"/"n"; see ``jax_gmma.fp8_gemm``); None = ``blockwise_configs.select_tile_order``.

  Runs the CUTLASS kernel on Hopper GPUs and the pure-JAX reference elsewhere (on CUDA GPUs
  without a kernel only when allowed, see ``jax_gmma.allow_reference``).
  """
  a = jnp.asarray(a)
  b = jnp.asarray(b)
  a_scales = jnp.asarray(a_scales)
  b_scales = jnp.asarray(b_scales)
  out_dtype = np.dtype(jnp.dtype(out_dtype))
  bias_arr = None if bias is None else jnp.asarray(bias)
  problem = shapes.fp8_blockwise_problem(
      a.shape, a.dtype, b.shape, b.dtype, a_scales.shape, a_scales.dtype, b_scales.shape,
      b_scales.dtype, bias_shape=None if bias_arr is None else bias_arr.shape,
      bias_dtype=None if bias_arr is None else bias_arr.dtype, out_dtype=out_dtype)
  if config is not None:
    blockwise_configs.get_config(config, problem.variant)
  blockwise_configs.check_tile_order(swizzle, raster)
  # float16 output: the float32 kernel, then one rounding (identical to a float16 epilogue).
  kernel_out = shapes.F32 if out_dtype == shapes.F16 else out_dtype
  a2 = a.reshape(problem.m, problem.k)
  sa = kernel_scale_layout(a_scales.reshape(problem.m, problem.k_blocks))
  sb = kernel_scale_layout(b_scales)
  if bias_arr is not None:
    bias_in = bias_arr.astype(out_dtype).astype(kernel_out)
  else:
    bias_in = jnp.zeros((1,), kernel_out)  # placeholder operand, ignored (has_bias=False)
  out = fp8_blockwise_gemm_p.bind(a2, b, sa, sb, bias_in, out_dtype=kernel_out, variant=problem.variant,
                                  has_bias=bias_arr is not None, config=config, splits=splits,
                                  swizzle=swizzle, raster=raster)
  if kernel_out != out_dtype:
    out = out.astype(out_dtype)
  return out.reshape(shapes.output_shape(problem))


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
  from . import mx  # no import cycle at module load
  outs = [mx.mx_gemm(mx.mxfp8_operand(lhs[i], lhs_scales[i]), mx.mxfp8_operand(rhs[i], rhs_scales[i]),
                     out_dtype=out_dtype) for i in range(lhs.shape[0])]
  return jnp.stack(outs) if len(outs) > 1 else outs[0][None]


def scaled_matmul(lhs, rhs, lhs_scales, rhs_scales, preferred_element_type=jnp.float32):
  """``jax.nn.scaled_matmul`` on jax-gmma's Hopper kernels.

  lhs (B, M, K), rhs (B, N, K), lhs_scales (B, M, K // bs), rhs_scales (B, N, K // bs): out
  (B, M, N) = einsum('BMK,BNK->BMN', lhs * repeat(lhs_scales, bs), rhs * repeat(rhs_scales, bs)).
  With block size bs = 128, float8_e4m3fn operands and float32 / bfloat16 / float16 /
  float8_e8m0fnu scales (converted to float32 exactly), this runs the block-scaled kernel
  (1x128 x 1x128 scales), one GEMM per batch entry. MXFP8 (block size 32, float8_e4m3fn
  operands, float8_e8m0fnu scales, what ``jax.nn.get_scaled_dot_general_config("mxfp8")``
  makes) runs :func:`jax_gmma.mx_gemm` per batch entry (on Hopper jax-gmma's own kernel: every
  scale applied exactly in float32, see :mod:`jax_gmma.mx`); its scales are swizzled to the
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
      raise ValueError(
          f"jax_gmma.scaled_matmul: {why}. Refusing to fall back silently to the slower pure-JAX "
          "reference; set JAX_GMMA_ALLOW_REFERENCE=1, call jax_gmma.set_allow_reference(True), or "
          "trace inside `with jax_gmma.allow_reference():` to run it anyway.")
    return _scaled_matmul_reference(lhs, rhs, lhs_scales, rhs_scales, out_dtype)
  sa = lhs_scales.astype(jnp.float32)
  sb = rhs_scales.astype(jnp.float32)
  outs = [blockwise_gemm(lhs[i], rhs[i], sa[i], sb[i], out_dtype=out_dtype) for i in range(bsz)]
  return jnp.stack(outs) if bsz > 1 else outs[0][None]
