"""The FP8 GEMM family with per-tensor / per-row / per-channel scales: :func:`fp8_gemm` and its
primitive ``fp8_gemm_p`` (shape rules at bind time, pure-JAX reference as the default lowering,
the CUTLASS kernel -- XLA FFI custom call ``jax_gmma_fp8_gemm`` -- as the CUDA lowering)."""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _backend, _vma, batching, primitive, sharding
from ..arrays import QuantizedArray
from ..numerics import shapes
from . import blockwise, blockwise_configs, quantize
from . import tensorwise_configs as configs

#: Weight formats this family multiplies (``jax_gmma.dot``).
WEIGHT_FORMATS = ("fp8_tensor", "fp8_channel")
#: How ``dot`` quantizes a float activation for these weights.
ACTIVATION_FORMATS = ("fp8_channel", "fp8_tensor")


def fp8_gemm_reference(a, b, a_scale, b_scale, bias, *, out_dtype, has_bias, **_unused):
  """Pure-JAX reference: dequantize to float32, dot at HIGHEST precision, scale, add bias, cast.
  a (M, K) fp8, b (N, K) fp8, a_scale (1,) or (M,), b_scale (1,) or (N,), bias (N,)."""
  acc = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), (((1,), (1,)), ((), ())),
                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  out = acc * a_scale.astype(jnp.float32).reshape(-1, 1) * b_scale.astype(jnp.float32).reshape(1, -1)
  if has_bias:
    out = out + bias.astype(jnp.float32).reshape(1, -1)
  return out.astype(out_dtype)


def _abstract_eval(a, b, a_scale, b_scale, bias, *, out_dtype, **_):
  return _vma.out_aval((a.shape[0], b.shape[0]), out_dtype, a, b, a_scale, b_scale, bias)


def _problem_from_avals(a, b, a_scale, b_scale, bias, out_dtype, has_bias):
  return shapes.fp8_gemm_problem(
      a.shape, a.dtype, b.shape, b.dtype, a_scale_shape=a_scale.shape, b_scale_shape=b_scale.shape,
      bias_shape=bias.shape if has_bias else None, out_dtype=out_dtype)


def plan(problem: shapes.GemmProblem, sm_count: int, *, fast_accum=False, config=None, splits=None,
         swizzle=None, raster=None):
  """(KernelConfig, splits, workspace bytes, (swizzle, raster)) of the tensorwise kernel for a
  problem; raises ValueError when CUTLASS's can_implement rejects it. Host-only; needs the built
  extension.

  Not consulted when the lowering takes the two-level route (:func:`two_level_route`): a
  two-level GEMM (no ``fast_accum``, nothing forced) that the tensorwise tiles fill badly runs
  the block-scaled 1d2d kernel instead (``blockwise_configs.ROUTE_CONFIG``, the scales broadcast
  per 128-K block; same arithmetic), when the build has block-scaled kernels."""
  cfg, s = configs.select_config(problem, sm_count, fast_accum=fast_accum, config=config, splits=splits)
  order = configs.select_tile_order(problem, cfg, swizzle=swizzle, raster=raster)
  if cfg.sweep and not configs.sweep_kernels_built():
    raise ValueError(f"jax_gmma: config {cfg.name} is a sweep-only kernel, and this jax_gmma was "
                     "built without them: reinstall with JAX_GMMA_SWEEP_KERNELS=1")
  err, ws = _backend.ext().check(cfg.name, problem.a_dtype.name, problem.b_dtype.name,
                                 problem.out_dtype.name, problem.m, problem.n, problem.k, s, sm_count,
                                 problem.a_scale == "row", problem.b_scale == "channel",
                                 problem.has_bias, order[0], configs.RASTERS[order[1]])
  if err:
    raise ValueError(f"jax_gmma: kernel {cfg.name} (splits={s}) cannot run {problem}: {err}")
  return cfg, s, ws, order


def two_level_route(problem: shapes.GemmProblem, sm_count: int, *, fast_accum=False, config=None,
                    splits=None, swizzle=None, raster=None) -> bool:
  """Whether the CUDA lowering runs ``problem`` on the block-scaled kernel (the two-level route
  of :func:`fp8_gemm`): ``blockwise_configs.two_level_route`` says the tensorwise tiles fill it
  badly, and the build has block-scaled kernels."""
  return (blockwise_configs.two_level_route(problem, sm_count, fast_accum=fast_accum, config=config,
                                            splits=splits, swizzle=swizzle, raster=raster)
          and blockwise.has_kernels())


def _kernel_missing(ctx, params):
  return _backend.missing_reason("fp8_gemm")


def _kernel(ctx, a, b, a_scale, b_scale, bias, *, out_dtype, has_bias, fast_accum, config,
            splits, swizzle, raster):
  _backend.prepare_devices()
  problem = _problem_from_avals(*ctx.avals_in, out_dtype, has_bias)
  sm_count = int(_backend.first_cuda_device().core_count)
  if two_level_route(problem, sm_count, fast_accum=fast_accum, config=config, splits=splits,
                     swizzle=swizzle, raster=raster):
    return blockwise.lower_two_level(ctx, a, b, a_scale, b_scale, bias, out_dtype=out_dtype,
                                     has_bias=has_bias)
  cfg, s, ws, (sw, ro) = plan(problem, sm_count, fast_accum=fast_accum, config=config, splits=splits,
                              swizzle=swizzle, raster=raster)
  return primitive.ffi_with_workspace(
      _backend.FP8_GEMM_TARGET, ctx, (a, b, a_scale, b_scale, bias), ws, config=cfg.name,
      splits=np.int32(s), sm_count=np.int32(sm_count), has_bias=bool(has_bias),
      swizzle=np.int32(sw), raster=np.int32(configs.RASTERS[ro]))


def _partition_rule(avals, params):
  a, b, sa, sb, bias = avals
  m, k = a.shape
  n = b.shape[0]

  def check(f, d):
    if f == "m":
      return sharding.divides(m, d, "M")
    if f == "n":
      return sharding.aligned(n, d, shapes.N_ALIGN, "N")
    return sharding.aligned(k, d, shapes.K_ALIGN, "K")

  return sharding.Rule(operands=(("m", "k"), ("n", "k"), sharding.vector("m", "sa", sa.shape[0], m),
                                 sharding.vector("n", "sb", sb.shape[0], n), sharding.bias_factors(bias, n)),
                       results=(("m", "n"),), shardable=("m", "n", "k"), check=check, reduction=("k",),
                       partial=sharding.partial_f32, finish=sharding.finish_bias(4))


def _fold_rest(args, dims, size, m, k, params):
  # (a, b, a_scale, b_scale, bias): a_scale (1,) or (M,)
  args[2] = batching.rows_scale(args[2], dims[2], size, m)
  return args, params


FP8_GEMM = primitive.define(
    "jax_gmma_fp8_gemm", abstract_eval=_abstract_eval, reference=fp8_gemm_reference,
    user_fn="jax_gmma.fp8_gemm", kernel=_kernel, kernel_missing=_kernel_missing, op="fp8_gemm",
    partition_rule=_partition_rule, vmap=batching.fold((1, 3, 4), _fold_rest))
fp8_gemm_p = FP8_GEMM.p


def _as_scale(x):
  """A scale operand as a float32 vector: (1,) per tensor, (rows,) per row/channel."""
  if x is None:
    return jnp.ones((1,), jnp.float32)
  x = jnp.asarray(x)
  if x.dtype != jnp.float32:
    x = x.astype(jnp.float32)
  return x.reshape(-1) if x.ndim else x.reshape(1)


def fp8_gemm(a, b, a_scale=None, b_scale=None, *, bias=None, out_dtype=jnp.bfloat16,
             fast_accum: bool = False, config: Optional[str] = None, splits: Optional[int] = None,
             swizzle: Optional[int] = None, raster: Optional[str] = None):
  """FP8 GEMM with scales: ``out = a_scale * b_scale * (a @ b.T) + bias``.

  Args:
    a: (..., M, K) float8_e4m3fn or float8_e5m2, K contiguous (activations).
    b: (N, K) float8_e4m3fn, K contiguous (weights, the layout of an nn.Linear weight).
    a_scale: None (1.0), a scalar / (1,) (per tensor) or (..., M) / (..., M, 1) (per row); float.
    b_scale: None, a scalar / (1,) (per tensor) or (N,) / (N, 1) (per output channel); float.
    bias: optional (N,); added in float32, stored in ``out_dtype`` first (cast if needed).
    out_dtype: bfloat16, float16 or float32.
    fast_accum: accumulate only in the tensor cores' accumulators (faster for large K, less
      precise); default is two-level accumulation (fp32 promotion every 128 of K). Two-level
      GEMMs that the tensorwise tiles fill badly run the block-scaled kernel with the scales
      broadcast per 128-K block (same arithmetic; a config of the CUDA lowering, decided by
      :func:`two_level_route`, see :func:`plan`).
    config, splits: force a kernel config (see ``jax_gmma.configs``, the module
      ``jax_gmma.ops.tensorwise_configs``) and K split count (an int >= 0; 1 unless the config
      is stream-K).
    swizzle, raster: force the tile order of the kernel's scheduler (``configs.SWIZZLES``:
      tiles taken in groups of 1, 2, 4 or 8; ``configs.RASTERS``: "auto", "m" or "n"); None =
      the heuristic's (``configs.select_tile_order``). Same results, different speed.

  Scales are the *dequantization* scales: a_real = a * a_scale. Runs the CUTLASS kernel on
  Hopper GPUs and the pure-JAX reference elsewhere (on CUDA GPUs without a kernel only when
  allowed, see ``jax_gmma.allow_reference``). Integer, bool or complex scales / bias and a
  non-float ``out_dtype`` are refused; zero-size dimensions are refused (shape rules).
  """
  return gemm(a, b, a_scale, b_scale, bias=bias, out_dtype=out_dtype, fast_accum=fast_accum,
              config=config, splits=splits, swizzle=swizzle, raster=raster,
              caller=("fp8_gemm", "a", "b"))


def gemm(a, b, a_scale=None, b_scale=None, *, bias, out_dtype, fast_accum, config, splits,
         swizzle=None, raster=None, caller):
  """:func:`fp8_gemm` for the public function ``caller`` = (name, a argument, b argument): its
  errors (here and at lowering time) name that function."""
  who = f"jax_gmma.{caller[0]}"
  a = jnp.asarray(a)
  b = jnp.asarray(b)
  out_dtype = primitive.out_dtype_or_error(out_dtype, who)
  a_scale_arr = None if a_scale is None else jnp.asarray(a_scale)
  b_scale_arr = None if b_scale is None else jnp.asarray(b_scale)
  for name, v in (("a_scale", a_scale_arr), ("b_scale", b_scale_arr)):
    if v is not None:
      primitive.check_float(v.dtype, who, name)
  bias_arr = None if bias is None else jnp.asarray(bias)
  if bias_arr is not None:
    primitive.check_float(bias_arr.dtype, who, "bias", what="(N,) vector")
  problem = primitive.named(
      who, shapes.fp8_gemm_problem, a.shape, a.dtype, b.shape, b.dtype,
      a_scale_shape=None if a_scale_arr is None else a_scale_arr.shape,
      a_scale_dtype=None if a_scale_arr is None else a_scale_arr.dtype,
      b_scale_shape=None if b_scale_arr is None else b_scale_arr.shape,
      b_scale_dtype=None if b_scale_arr is None else b_scale_arr.dtype,
      bias_shape=None if bias_arr is None else bias_arr.shape,
      bias_dtype=None if bias_arr is None else bias_arr.dtype, out_dtype=out_dtype)
  cfg = None if config is None else primitive.named(who, configs.get_config, config)
  primitive.check_splits(splits, who, None if cfg is None else cfg.stream_k)
  primitive.named(who, configs.check_tile_order, swizzle, raster)
  a2 = a.reshape(problem.m, problem.k)
  sa = _as_scale(a_scale_arr)
  sb = _as_scale(b_scale_arr)
  if problem.a_scale == "tensor":
    sa = sa[:1]
  if bias_arr is not None:
    bias_in = bias_arr.astype(out_dtype) if bias_arr.dtype != out_dtype else bias_arr
  else:
    bias_in = sb  # placeholder operand, ignored (has_bias=False)
  out = fp8_gemm_p.bind(a2, b, sa, sb, bias_in, out_dtype=out_dtype, has_bias=bias_arr is not None,
                        fast_accum=bool(fast_accum), config=config, splits=splits,
                        swizzle=None if swizzle is None else int(swizzle), raster=raster,
                        **{primitive.CALLER: tuple(caller)})
  return out.reshape(shapes.output_shape(problem))


# -- jax_gmma.dot on this family's weights ---------------------------------------------------

def serves(w) -> bool:
  """Whether :func:`dot` multiplies weight ``w`` (a per-tensor / per-channel FP8 QuantizedArray)."""
  return isinstance(w, QuantizedArray) and w.format.name in WEIGHT_FORMATS


def dot(x, w: QuantizedArray, *, bias, out_dtype, x_format, fast_accum, config, splits,
        who: str = "jax_gmma.dot", **_):
  """``jax_gmma.dot`` for fp8_tensor / fp8_channel weights: a float x (M, K) is quantized to FP8
  e4m3 with ``x_format`` (one scale per token or per tensor), then the FP8 GEMM. ``jax_gmma.dot``
  has checked w's fields, x's dtype and K, bias and out_dtype; this checks what the family
  adds (e4m3 weight elements, K a multiple of 16, N of 8), naming ``who``'s arguments x and w."""
  n, k = w.canonical_shape
  primitive.check_fp8_weight(w, who)
  if k % shapes.K_ALIGN:
    raise ValueError(f"{who}: K (w's contraction length, x.shape[-1]) must be a multiple of "
                     f"{shapes.K_ALIGN} for {w.format.name} weights (16-byte aligned fp8 rows), got {k}")
  if isinstance(x, QuantizedArray):
    if x.format.name not in WEIGHT_FORMATS:
      raise ValueError(f"{who}: x has format {x.format.name!r}, which cannot multiply a "
                       f"{w.format.name} weight; use one of {', '.join(ACTIVATION_FORMATS)} (or pass a "
                       "float x)")
    lead = x.canonical_shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    x_data = x.data.reshape(rows, x.data.shape[-1])
    x_scales = x.scales if x.format.name == "fp8_tensor" else x.scales.reshape(rows)
    default_out = shapes.BF16
  else:
    if x_format not in ACTIVATION_FORMATS:
      raise ValueError(f"{who}: x_format must be one of {ACTIVATION_FORMATS} for a {w.format.name} "
                       f"weight, got {x_format!r}")
    lead = x.shape[:-1]
    default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in shapes.OUT_DTYPES else shapes.BF16
    x_data, x_scales, _ = quantize.quantize_parts(x, x_format, dtype=jnp.float8_e4m3fn)
  out_dtype = default_out if out_dtype is None else out_dtype
  out = gemm(x_data, w.data, x_scales, w.scales, bias=bias, out_dtype=out_dtype,
             fast_accum=fast_accum, config=config, splits=splits, caller=(who[len("jax_gmma."):], "x", "w"))
  return out.reshape(*lead, n)
