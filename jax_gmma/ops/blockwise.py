"""Block-scaled FP8 GEMM (DeepSeek-V3 style) for Hopper: 1x128 activation scales times 128x128
("1d2d") or 1x128 ("1d1d") weight scales, float32 scales applied per 128 of K.

The primitive ``fp8_blockwise_gemm_p`` takes its scales in the kernels' layout (see
:func:`kernel_scale_layout`); its default lowering is the pure-JAX reference (dequantize the
blocks, float32 dot, cast), its CUDA lowering one of the family's kernels (XLA FFI custom call
``jax_gmma_fp8_blockwise_gemm``): the CUTLASS wgmma kernels, or at small M (decode) the
weight-streaming mma.sync kernel (``stream_*`` configs,
``blockwise_configs.select_stream_config``). Both promote the tensor core's sums into float32
every 128 of K, multiplied by that block's two scales. Public entry point: :func:`blockwise_gemm`
(also behind :func:`jax_gmma.dot` for fp8_128x128 / fp8_1x128 weights and
:func:`jax_gmma.scaled_matmul` for block size 128).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from .. import _backend, _vma, batching, primitive, sharding
from ..arrays import QuantizedArray
from ..numerics import shapes
from . import blockwise_configs, quantize

BLOCKWISE_GEMM_TARGET = _backend.FP8_BLOCKWISE_GEMM_TARGET
#: Rows of the kernel scale layout are padded to a multiple of this (16-byte aligned columns).
SCALE_LD_ALIGN = 4

#: Weight formats this family multiplies (``jax_gmma.dot``); activations are quantized to
#: fp8_1x128.
WEIGHT_FORMATS = ("fp8_128x128", "fp8_1x128")


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



# -- CUDA lowering -----------------------------------------------------------------------------

def has_kernels() -> bool:
  """Whether the built library holds the block-scaled kernels."""
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


def _kernel_missing(ctx, params):
  why = _backend.missing_reason("blockwise_gemm")
  if why is None and not has_kernels():
    why = "this build of jax_gmma has no block-scaled kernels; rebuild it with nvcc on PATH"
  return why


def _kernel(ctx, a, b, a_scales_t, b_scales_t, bias, *, out_dtype, variant, has_bias, config,
            splits, swizzle, raster):
  _backend.prepare_devices()
  av, bv = ctx.avals_in[:2]  # shapes and scale layouts were checked by blockwise_gemm
  problem = shapes.BlockwiseProblem(m=av.shape[0], n=bv.shape[0], k=av.shape[1], batch_shape=(),
                                    a_dtype=np.dtype(av.dtype), b_dtype=np.dtype(bv.dtype),
                                    out_dtype=np.dtype(out_dtype), variant=variant, has_bias=has_bias)
  sm_count = int(_backend.first_cuda_device().core_count)
  cfg, s, ws, (sw, ro) = plan(problem, sm_count, config=config, splits=splits, swizzle=swizzle,
                              raster=raster)
  return primitive.ffi_with_workspace(
      BLOCKWISE_GEMM_TARGET, ctx, (a, b, a_scales_t, b_scales_t, bias), ws,
      config=blockwise_configs.kernel_name(cfg, variant), splits=np.int32(s),
      sm_count=np.int32(sm_count), has_bias=bool(has_bias), swizzle=np.int32(sw),
      raster=np.int32(blockwise_configs.RASTERS[ro]))


def _partition_rule(avals, params):
  a, b, sa_t, sb_t, bias = avals
  m, k = a.shape
  n = b.shape[0]
  row_block = shapes.BLOCK_N if params["variant"] == "1d2d" else 1
  rows_b = -(-n // row_block)
  pad = SCALE_LD_ALIGN

  def rows_split(rows, d, what):
    # the kernel layout pads scale rows to a multiple of SCALE_LD_ALIGN: a shard's rows must
    # be a whole multiple of it, so that the padding stays at the end of the last shard
    return None if rows % (d * pad) == 0 else \
        f"its {what} scale rows ({rows}) do not split into multiples of {pad} (the kernel layout's padding)"

  def check(f, d):
    if f == "m":
      return sharding.divides(m, d, "M") or rows_split(m, d, "per-token")
    if f == "n":
      return (sharding.aligned(n, d, max(row_block, shapes.N_ALIGN), "N") or rows_split(rows_b, d, "weight"))
    return sharding.aligned(k, d, shapes.BLOCK_K, "K")

  compound = {}
  if k % shapes.BLOCK_K == 0:  # the scales' K blocks split with K
    compound["k"] = ("kb", "kr", shapes.BLOCK_K)
  if row_block > 1 and n % row_block == 0:  # the 128-row weight-scale blocks split with N
    compound["n"] = ("nb", "nr", row_block)
  sa_rows = "m" if sa_t.shape[1] == m else "ma"  # (padded scale rows are never split)
  sb_rows = ("n" if row_block == 1 else "nb") if sb_t.shape[1] == rows_b else "na"
  kb = "kb" if "k" in compound else "ka"
  return sharding.Rule(operands=(("m", "k"), ("n", "k"), (kb, sa_rows), (kb, sb_rows),
                                 sharding.bias_factors(bias, n)),
                       results=(("m", "n"),), shardable=("m", "n", "k"), check=check, compound=compound,
                       reduction=("k",), partial=sharding.partial_f32, finish=sharding.finish_bias(4))



def _fold_rest(args, dims, size, m, k, params):
  # (a, b, a_scales_t, b_scales_t, bias): a_scales_t in the kernel layout (kb, scale_ld(M)) per
  # element -> (kb, size * M) -> padded kernel layout
  s = batching.front(args[2], dims[2], size)[:, :, :m]      # (size, kb, M)
  s = jnp.moveaxis(s, 0, 1).reshape(s.shape[1], size * m)   # (kb, size * M)
  args[2] = kernel_scale_layout(s.T)
  return args, params


FP8_BLOCKWISE_GEMM = primitive.define(
    "jax_gmma_fp8_blockwise_gemm", abstract_eval=_abstract_eval, reference=_reference_lowering,
    user_fn="jax_gmma.blockwise_gemm / scaled_matmul", kernel=_kernel,
    kernel_missing=_kernel_missing, op="blockwise_gemm", partition_rule=_partition_rule,
    vmap=batching.fold((1, 3, 4), _fold_rest))
fp8_blockwise_gemm_p = FP8_BLOCKWISE_GEMM.p


def _two_level(a, b, a_scale, b_scale, bias, *, out_dtype, has_bias):
  """The two-level GEMM (fp8_gemm's operands) on the block-scaled 1d2d kernel: the per-tensor
  or per-row A scale and the per-tensor B scale broadcast to every 128-K block, in the kernel's
  MN-major scale layout (:func:`kernel_scale_layout`; one small XLA fusion each)."""
  m, k = a.shape
  n = b.shape[0]
  kb = -(-k // shapes.BLOCK_K)
  sa = kernel_scale_layout(jnp.broadcast_to(a_scale.reshape(-1, 1), (m, kb)))
  sb = kernel_scale_layout(jnp.broadcast_to(b_scale.reshape(1, 1), (-(-n // shapes.BLOCK_N), kb)))
  bias_in = bias if has_bias else jnp.zeros((1,), out_dtype)
  return fp8_blockwise_gemm_p.bind(a, b, sa, sb, bias_in, out_dtype=out_dtype, variant="1d2d",
                                   has_bias=has_bias, config=blockwise_configs.ROUTE_CONFIG,
                                   splits=1, swizzle=None, raster=None)


def lower_two_level(ctx, a, b, a_scale, b_scale, bias, *, out_dtype, has_bias):
  """Lowers an fp8_gemm (two-level accumulation) onto this family's kernel: the two-level
  route of :func:`jax_gmma.fp8_gemm` (``ops.tensorwise.two_level_route``)."""
  return mlir.lower_fun(functools.partial(_two_level, out_dtype=out_dtype, has_bias=has_bias),
                        multiple_results=False)(ctx, a, b, a_scale, b_scale, bias)


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
  return gemm(a, b, a_scales, b_scales, bias=bias, out_dtype=out_dtype, config=config,
              splits=splits, swizzle=swizzle, raster=raster, caller=("blockwise_gemm", "a", "b"))


def gemm(a, b, a_scales, b_scales, *, bias, out_dtype, config, splits, swizzle=None, raster=None,
         caller):
  """:func:`blockwise_gemm` for the public function ``caller`` = (name, a argument, b argument):
  its errors (here and at lowering time) name that function."""
  who = f"jax_gmma.{caller[0]}"
  a = jnp.asarray(a)
  b = jnp.asarray(b)
  a_scales = jnp.asarray(a_scales)
  b_scales = jnp.asarray(b_scales)
  out_dtype = primitive.out_dtype_or_error(out_dtype, who, shapes.BLOCKWISE_OUT_DTYPES)
  bias_arr = None if bias is None else jnp.asarray(bias)
  if bias_arr is not None:
    primitive.check_float(bias_arr.dtype, who, "bias", what="(N,) vector")
  problem = primitive.named(
      who, shapes.fp8_blockwise_problem, a.shape, a.dtype, b.shape, b.dtype, a_scales.shape,
      a_scales.dtype, b_scales.shape, b_scales.dtype,
      bias_shape=None if bias_arr is None else bias_arr.shape,
      bias_dtype=None if bias_arr is None else bias_arr.dtype, out_dtype=out_dtype)
  cfg = None if config is None else primitive.named(who, blockwise_configs.get_config, config,
                                                    problem.variant)
  primitive.check_splits(splits, who, None if cfg is None else cfg.stream_k)
  primitive.named(who, blockwise_configs.check_tile_order, swizzle, raster)
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
                                  swizzle=swizzle, raster=raster, **{primitive.CALLER: tuple(caller)})
  if kernel_out != out_dtype:
    out = out.astype(out_dtype)
  return out.reshape(shapes.output_shape(problem))


# -- jax_gmma.dot on this family's weights ---------------------------------------------------

def serves(w) -> bool:
  """Whether :func:`dot` multiplies weight ``w`` (an fp8_128x128 / fp8_1x128 QuantizedArray)."""
  return isinstance(w, QuantizedArray) and w.format.name in WEIGHT_FORMATS


#: ``dot`` quantizes a float activation of at most this many rows (tokens) with the pure-JAX
#: path of ``quantize`` -- plain XLA ops, which XLA fuses into the activation's producer -- and
#: larger ones with the quantize kernel (one pass, no XLA fusion). Same bits either way
#: (``jax_gmma.ops.quantize``: the kernel is bit-identical to the pure-JAX path on the GPU).
XLA_QUANTIZE_MAX_M = 64


#: ``x_format`` values dot accepts with these weights: the activation is always quantized to
#: fp8_1x128 (the tensorwise family's names, dot's default among them, do not apply here).
X_FORMATS = ("fp8_channel", "fp8_tensor", "fp8_1x128")


def dot(x, w: QuantizedArray, *, bias, out_dtype, config, splits, x_format="fp8_1x128",
        who: str = "jax_gmma.dot", **_):
  """``jax_gmma.dot`` for fp8_128x128 / fp8_1x128 weights: x (M, K) is quantized per token and
  128 of K (fp8_1x128, float8_e4m3fn) and multiplied by the block-scaled GEMM.

  Which path runs at which M (Hopper): the activation quantization is plain XLA ops up to
  XLA_QUANTIZE_MAX_M (64) tokens, which XLA fuses into the op producing x, and the quantize
  kernel above (same bits either way); the GEMM is the weight-streaming kernel up to 8 tokens
  (16 for weights of at most 32 MiB, K a multiple of 32), the wgmma swap-AB tiles up to 64 and
  the 128x128 tiles above (``blockwise_configs.select_blockwise_config``). Stored data of
  both operands is K-padded to a multiple of 128 with zeros, so the padding adds nothing.
  ``jax_gmma.dot`` has checked w's fields, x's dtype and K, bias and out_dtype."""
  n, k = w.canonical_shape
  if x_format not in X_FORMATS:
    raise ValueError(f"{who}: x_format must be one of {X_FORMATS} for a {w.format.name} weight (x is "
                     f"quantized to fp8_1x128 either way), got {x_format!r}")
  primitive.check_fp8_weight(w, who)
  if isinstance(x, QuantizedArray):
    if x.format.name != "fp8_1x128":
      raise ValueError(f"{who}: x has format {x.format.name!r}, which cannot multiply a "
                       f"{w.format.name} weight; use fp8_1x128 (or pass a float x)")
    if np.dtype(x.dtype) != shapes.F8E4M3:
      raise TypeError(f"{who}: x must have float8_e4m3fn elements (the block-scaled kernels are e4m3 "
                      f"x e4m3), got {np.dtype(x.dtype).name}")
    lead = x.canonical_shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    x_data = x.data.reshape(rows, x.data.shape[-1])
    x_scales = x.scales.reshape(rows, x.scales.shape[-1])
    default_out = shapes.BF16
  else:
    lead = x.shape[:-1]
    default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in shapes.OUT_DTYPES else shapes.BF16
    rows = shapes.size(lead)
    fused = shapes.is_constant_dim(rows) and rows <= XLA_QUANTIZE_MAX_M
    x_data, x_scales, _ = quantize.quantize_parts(x, "fp8_1x128", dtype=jnp.float8_e4m3fn,
                                                  use_kernel=not fused)
  out_dtype = default_out if out_dtype is None else out_dtype
  out = gemm(x_data, w.data, x_scales, w.scales, bias=bias, out_dtype=out_dtype, config=config,
             splits=splits, caller=(who[len("jax_gmma."):], "x", "w"))
  return out.reshape(*lead, n)
