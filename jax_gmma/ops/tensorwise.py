"""The FP8 GEMM primitive: shape rules at bind time, pure-JAX reference as the default lowering,
the CUTLASS kernel (XLA FFI custom call) as the CUDA lowering."""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray
from jax.interpreters import mlir

try:  # jax >= 0.4.36
  from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
  from jax.core import Primitive
from jax._src import dispatch  # apply_primitive: eager execution of a primitive via jit

from . import _backend, _vma, blockwise, blockwise_configs, configs, shapes
from . import sharding as _sharding
from .reference import fp8_gemm_reference

fp8_gemm_p = Primitive("jax_gmma_fp8_gemm")
fp8_gemm_p.def_impl(functools.partial(dispatch.apply_primitive, fp8_gemm_p))


def _abstract_eval(a, b, a_scale, b_scale, bias, *, out_dtype, **_):
  return _vma.out_aval((a.shape[0], b.shape[0]), out_dtype, a, b, a_scale, b_scale, bias)


fp8_gemm_p.def_abstract_eval(_abstract_eval)
# Default lowering (every platform): the pure-JAX reference.
mlir.register_lowering(fp8_gemm_p,
                       _sharding.lowering(fp8_gemm_p, mlir.lower_fun(fp8_gemm_reference, multiple_results=False)))


def _problem_from_avals(a, b, a_scale, b_scale, bias, out_dtype, has_bias):
  return shapes.fp8_gemm_problem(
      a.shape, a.dtype, b.shape, b.dtype, a_scale_shape=a_scale.shape, b_scale_shape=b_scale.shape,
      bias_shape=bias.shape if has_bias else None, out_dtype=out_dtype)


def plan(problem: shapes.GemmProblem, sm_count: int, *, fast_accum=False, config=None, splits=None,
         swizzle=None, raster=None):
  """(KernelConfig, splits, workspace bytes, (swizzle, raster)) for a problem; raises ValueError
  when CUTLASS's can_implement rejects it. Host-only; needs the built extension."""
  cfg, s = configs.select_config(problem, sm_count, fast_accum=fast_accum, config=config, splits=splits)
  order = configs.select_tile_order(problem, cfg, swizzle=swizzle, raster=raster)
  if cfg.sweep and not _backend.sweep_kernels_built():
    raise ValueError(f"jax_gmma: config {cfg.name} is a sweep-only kernel, and this jax_gmma was "
                     "built without them: reinstall with JAX_GMMA_SWEEP_KERNELS=1")
  err, ws = _backend.ext().check(cfg.name, problem.a_dtype.name, problem.b_dtype.name,
                                 problem.out_dtype.name, problem.m, problem.n, problem.k, s, sm_count,
                                 problem.a_scale == "row", problem.b_scale == "channel",
                                 problem.has_bias, order[0], configs.RASTERS[order[1]])
  if err:
    raise ValueError(f"jax_gmma: kernel {cfg.name} (splits={s}) cannot run {problem}: {err}")
  return cfg, s, ws, order


def _cuda_lowering(ctx, a, b, a_scale, b_scale, bias, *, out_dtype, has_bias, fast_accum, config,
                   splits, swizzle, raster):
  params = dict(out_dtype=out_dtype, has_bias=has_bias, fast_accum=fast_accum, config=config,
                splits=splits, swizzle=swizzle, raster=raster)
  dev = _backend.check_cuda_kernels("fp8_gemm")
  if dev is None:  # the user opted in to the reference path
    return mlir.lower_fun(fp8_gemm_reference, multiple_results=False)(ctx, a, b, a_scale, b_scale,
                                                                      bias, **params)
  _backend.register_targets()
  _backend.prepare_devices()
  problem = _problem_from_avals(*ctx.avals_in, out_dtype, has_bias)
  sm_count = int(dev.core_count)
  if blockwise_configs.two_level_route(problem, sm_count, fast_accum=fast_accum, config=config,
                                       splits=splits, swizzle=swizzle, raster=raster):
    if blockwise._has_blockwise_kernels():
      return mlir.lower_fun(functools.partial(_two_level_via_blockwise, out_dtype=out_dtype, has_bias=has_bias),
                            multiple_results=False)(ctx, a, b, a_scale, b_scale, bias)
  cfg, s, ws, (sw, ro) = plan(problem, sm_count, fast_accum=fast_accum, config=config, splits=splits,
                              swizzle=swizzle, raster=raster)
  # The workspace (stream-K partials and flags) is a second result: XLA owns the memory, so it
  # is valid under CUDA-graph replay and nothing is allocated at run time.
  ws_aval = ShapedArray((max(int(ws), 16),), np.dtype(np.uint8))
  rule = jax.ffi.ffi_lowering(_backend.FP8_GEMM_TARGET)
  sub = ctx.replace(avals_out=[ctx.avals_out[0], ws_aval])
  results = rule(sub, a, b, a_scale, b_scale, bias, config=cfg.name, splits=np.int32(s),
                 sm_count=np.int32(sm_count), has_bias=bool(has_bias), swizzle=np.int32(sw),
                 raster=np.int32(configs.RASTERS[ro]))
  return [results[0]]


mlir.register_lowering(fp8_gemm_p, _sharding.lowering(fp8_gemm_p, _cuda_lowering), platform="cuda")


def _two_level_via_blockwise(a, b, a_scale, b_scale, bias, *, out_dtype, has_bias):
  """The two-level GEMM on the block-scaled 1d2d kernel (blockwise_configs.two_level_route): the
  per-tensor or per-row A scale and the per-tensor B scale broadcast to every 128-K block, in
  the kernel's MN-major scale layout (blockwise.kernel_scale_layout; one small XLA fusion each)."""
  m, k = a.shape
  n = b.shape[0]
  kb = -(-k // shapes.BLOCK_K)
  sa = blockwise.kernel_scale_layout(jnp.broadcast_to(a_scale.reshape(-1, 1), (m, kb)))
  sb = blockwise.kernel_scale_layout(jnp.broadcast_to(b_scale.reshape(1, 1), (-(-n // shapes.BLOCK_N), kb)))
  bias_in = bias if has_bias else jnp.zeros((1,), out_dtype)
  return blockwise.fp8_blockwise_gemm_p.bind(a, b, sa, sb, bias_in, out_dtype=out_dtype, variant="1d2d",
                                             has_bias=has_bias, config=blockwise_configs.ROUTE_CONFIG,
                                             splits=1, swizzle=None, raster=None)


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
      broadcast per 128-K block (same arithmetic; ``blockwise_configs.two_level_route``).
    config, splits: force a kernel config (see ``jax_gmma.configs``) and K split count.
    swizzle, raster: force the tile order of the kernel's scheduler (``configs.SWIZZLES``:
      tiles taken in groups of 1, 2, 4 or 8; ``configs.RASTERS``: "auto", "m" or "n"); None =
      the heuristic's (``configs.select_tile_order``). Same results, different speed.

  Scales are the *dequantization* scales: a_real = a * a_scale. Runs the CUTLASS kernel on
  Hopper GPUs and the pure-JAX reference elsewhere (on CUDA GPUs without a kernel only when
  allowed, see ``jax_gmma.allow_reference``).
  """
  a = jnp.asarray(a)
  b = jnp.asarray(b)
  out_dtype = np.dtype(jnp.dtype(out_dtype))
  a_scale_arr = None if a_scale is None else jnp.asarray(a_scale)
  b_scale_arr = None if b_scale is None else jnp.asarray(b_scale)
  bias_arr = None if bias is None else jnp.asarray(bias)
  problem = shapes.fp8_gemm_problem(
      a.shape, a.dtype, b.shape, b.dtype,
      a_scale_shape=None if a_scale_arr is None else a_scale_arr.shape,
      a_scale_dtype=None if a_scale_arr is None else a_scale_arr.dtype,
      b_scale_shape=None if b_scale_arr is None else b_scale_arr.shape,
      b_scale_dtype=None if b_scale_arr is None else b_scale_arr.dtype,
      bias_shape=None if bias_arr is None else bias_arr.shape,
      bias_dtype=None if bias_arr is None else bias_arr.dtype, out_dtype=out_dtype)
  if config is not None:
    configs.get_config(config)
  configs.check_tile_order(swizzle, raster)
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
                        swizzle=None if swizzle is None else int(swizzle), raster=raster)
  return out.reshape(shapes.output_shape(problem))
