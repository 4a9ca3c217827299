"""Kernel configs of the sm90 block-scaled FP8 GEMM family and the heuristic that picks one.

Names match ``cpp/sm90_fp8_gemm_blockwise_inst.cuh``; the compiled kernel of a config for a
scale variant is ``blockwise_<variant>_<name>`` (variant "1d2d": 1x128 x 128x128 scales,
"1d1d": 1x128 x 1x128). All configs accumulate two-level: every 128 of K the tensor-core
accumulators are promoted into float32 multiplied by that K block's scales (``accum="2lvl"``).
Pure Python: tested on CPU. The config heuristic mirrors the tensorwise family's measured choices;
the tile order rule was measured on the H200 (see select_tile_order).
"""
from __future__ import annotations

from typing import Optional

from . import tensorwise_configs as _tw
from .tensorwise_configs import KernelConfig
from ..numerics.shapes import BF16, F32, F8E4M3, BlockwiseProblem, GemmProblem

VARIANTS = ("1d2d", "1d1d")

_ALL = [
    KernelConfig("128x128x128_c1x1_coop", (128, 128, 128), (1, 1), "cooperative", False, False, "2lvl"),
    KernelConfig("128x128x128_c1x1_coop_streamk", (128, 128, 128), (1, 1), "cooperative", False, True, "2lvl"),
    KernelConfig("64x128x128_c1x1_pingpong", (64, 128, 128), (1, 1), "pingpong", False, False, "2lvl",
                 extra=True),
    KernelConfig("swap_128x16x128_coop_streamk", (128, 16, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x32x128_coop_streamk", (128, 32, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x64x128_coop_streamk", (128, 64, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_64x16x128_pingpong", (64, 16, 128), (1, 1), "pingpong", True, False, "2lvl"),
    KernelConfig("swap_64x32x128_pingpong", (64, 32, 128), (1, 1), "pingpong", True, False, "2lvl"),
    KernelConfig("swap_64x64x128_pingpong", (64, 64, 128), (1, 1), "pingpong", True, False, "2lvl"),
    # The weight-streaming kernel (cpp/sm90_fp8_gemm_blockwise_stream.cu): 16 weight rows x 8 or
    # 16 tokens per CTA on mma.sync, K split over the CTA's 4-16 warps; tile (16, tokens, 128).
    KernelConfig("stream_16x8_kw4", (16, 8, 128), (1, 1), "stream", True, False, "2lvl"),
    KernelConfig("stream_16x8_kw8", (16, 8, 128), (1, 1), "stream", True, False, "2lvl"),
    KernelConfig("stream_16x8_kw16", (16, 8, 128), (1, 1), "stream", True, False, "2lvl"),
    KernelConfig("stream_16x16_kw4", (16, 16, 128), (1, 1), "stream", True, False, "2lvl"),
    KernelConfig("stream_16x16_kw8", (16, 16, 128), (1, 1), "stream", True, False, "2lvl"),
]
CONFIGS = {c.name: c for c in _ALL}


def is_stream(cfg: KernelConfig) -> bool:
  """Whether a config is the weight-streaming mma.sync kernel (any M; K a multiple of 32)."""
  return cfg.schedule == "stream"


def config_variants(cfg: KernelConfig) -> tuple:
  """Scale variants a config is compiled for. A swap-AB wgmma tile puts the weights along the
  kernel's M, where 128x128 scales need a multiple of 128 rows: 64-row swap tiles are 1d1d only.
  The streaming kernel reads a scale per row, so it serves both."""
  if cfg.swap_ab and cfg.tile[0] % 128 and not is_stream(cfg):
    return ("1d1d",)
  return VARIANTS


def kernel_name(cfg: KernelConfig, variant: str) -> str:
  """The C++ kernel-table name of a config for a scale variant."""
  return f"blockwise_{variant}_{cfg.name}"


def get_config(name: str, variant: Optional[str] = None) -> KernelConfig:
  try:
    cfg = CONFIGS[name]
  except KeyError:
    raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}") from None
  if variant is not None and variant not in config_variants(cfg):
    raise ValueError(f"config {name!r} has no kernel for {variant} scales (128x128 weight scales need "
                     f"128-row kernel tiles); use one of "
                     f"{sorted(n for n, c in CONFIGS.items() if variant in config_variants(c))}")
  return cfg


def configs_table() -> str:
  return "\n".join(f"{c} [{', '.join(config_variants(c))}]" for c in _ALL)


# Tile arithmetic shared with the tensorwise family (it reads only problem.m/n/k and the config).
num_tiles = _tw.num_tiles
RASTERS = _tw.RASTERS
check_tile_order = _tw.check_tile_order


def select_tile_order(problem, cfg: KernelConfig, *, swizzle=None, raster=None) -> tuple:
  """(swizzle, raster) of the persistent scheduler for a block-scaled config: the caller's where
  given, else: data-parallel large-M tiles walk along M in groups of 8 N tiles when 8 divides
  the N tile count (the tensorwise family's rule), everything else keeps CUTLASS's default
  order (1, "auto": ungrouped, along the dimension with fewer tiles). Measured on the H200 with
  ``128x128x128_c1x1_coop``, 1x128 x 128x128 scales, against the default order, 3 interleaved
  rounds, µs (measured 2026-12-01): 8192^3 1140.6 -> 1003.0,
  4096x7168x16384 913.6 -> 872.5, 4096x4096x7168 235.5 -> 227.1, 4096x4096x4096 133.9 -> 135.1,
  2048x8192x8192 253.3 -> 258.3, 4096x24576x1536 337.2 -> 337.8. 4096x2112x7168 (17 N tiles)
  keeps the default: 134.2 (8 along M: 170.6; 1 along M, the tensorwise family's choice there:
  141.7; route_ab.json)."""
  return _tw.select_tile_order(problem, cfg, swizzle=swizzle, raster=raster, ungrouped_raster="auto")


wave_efficiency = _tw.wave_efficiency
choose_splits = _tw.choose_splits


#: Below this wave efficiency a data-parallel grid is replaced by stream-K. 0.85:
#: 4096x2112x7168 (544 tiles, 0.82 of 5 waves) ran 128.6 / 130.6 / 125.7 µs on stream-K vs
#: 132.2 / 132.3 / 132.5 data-parallel in three runs (measured 2026-12-01).
MIN_WAVE_EFFICIENCY = 0.85
#: CUTLASS's stream-K heuristic decomposition (passed as splits=0 to the kernel).
STREAM_K_HEURISTIC = 0


#: The weight-streaming kernel serves M up to this (measured, see select_stream_config).
STREAM_MAX_M = 16
#: From 9 tokens on, the streaming kernel's 16-token CTAs win only while the weight is small.
STREAM_16_MAX_WEIGHT_BYTES = 32 << 20


def select_stream_config(problem: BlockwiseProblem, sm_count: int) -> Optional[str]:
  """The weight-streaming config for a decode problem, or None where the wgmma swap tiles are
  as fast: K a multiple of 32 (the kernel's 32-K blocks) and M <= 8, or M <= STREAM_MAX_M with
  at most STREAM_16_MAX_WEIGHT_BYTES of weight. 8-token CTAs with more warps along K the fewer
  16-row strips N has (16 up to one strip per SM, 8 up to two, else 4); 16-token CTAs with 4.

  Measured on the H200 (``jax_gmma.dot`` on bf16 x in chains of 16 dependent GEMMs, distinct
  weights, µs per GEMM, streaming vs the swap 128x16 wgmma tile; measured 2026-12-04):
  M = 1: 4096x4096 15.0 vs 22.7, 6144x4096 31.4 vs 40.5, 4096x14336 35.7 vs 41.3,
  28672x4096 49.9 vs 53.3, 8192x8192 34.2 vs 34.3; M = 8: 4096x4096 17.5 vs 21.9, 6144x4096
  18.6 vs 28.4, 4096x14336 32.1 vs 36.1, 28672x4096 49.0 vs 50.8, 8192x8192 33.9 vs 34.4;
  M = 16 (16-token CTAs, 4 warps): 4096x4096 17.8 vs 20.6, 6144x4096 22.8 vs 30.8, but
  4096x14336 44.2 vs 36.7, 28672x4096 61.4 vs 52.1, 8192x8192 53.1 vs 36.6; at M = 32 and 64
  the wgmma tiles win everywhere (4096x4096, M = 32: 23.5 vs 29.2)."""
  m, n, k = problem.m, problem.n, problem.k
  if k % 32 or m > STREAM_MAX_M:
    return None
  strips = -(-n // 16)
  if m <= 8:
    kw = 16 if strips <= sm_count else (8 if strips <= 2 * sm_count else 4)
    return f"stream_16x8_kw{kw}"
  return "stream_16x16_kw4" if n * k <= STREAM_16_MAX_WEIGHT_BYTES else None


def select_blockwise_config(problem: BlockwiseProblem, sm_count: int, *, config: Optional[str] = None,
                            splits: Optional[int] = None) -> tuple:
  """Returns (KernelConfig, splits) for a block-scaled problem on a GPU with `sm_count` SMs.

  splits: 1 = data-parallel, > 1 = split-K (deterministic reduction), 0 = CUTLASS's stream-K
  heuristic (stream-K configs only).

  Decode: the weight-streaming kernel where select_stream_config picks it (M <= 16), else
  (M <= 64) swap-AB with the smallest N tile covering M. 1d1d: 64-row ping-pong tiles
  when N gives at least half the SMs a tile, else 128-row cooperative tiles with K split until
  the weight stream covers the SMs; 1d2d: always the 128-row cooperative tiles (64-row tiles
  cannot carry 128x128 scales), split by wave efficiency. Otherwise: 128x128 cooperative when
  its grid fills the GPU's waves well (MIN_WAVE_EFFICIENCY, measured at 4096x2112x7168), else
  128x128 stream-K. Otherwise unmeasured (mirrors the tensorwise family's measured choices).
  """
  if sm_count <= 0:
    raise ValueError(f"sm_count must be positive, got {sm_count}")
  if config is not None:
    cfg = get_config(config, problem.variant)
  else:
    m = problem.m
    stream = select_stream_config(problem, sm_count) if splits in (None, 1) else None
    if stream is not None:
      cfg = CONFIGS[stream]
    elif m <= 64:
      tn = 16 if m <= 16 else 32 if m <= 32 else 64
      cfg = CONFIGS[f"swap_128x{tn}x128_coop_streamk"]
      if problem.variant == "1d1d":
        pp = CONFIGS[f"swap_64x{tn}x128_pingpong"]
        if num_tiles(problem, pp) >= sm_count // 2:
          cfg = pp
    else:
      cfg = CONFIGS["128x128x128_c1x1_coop"]
      if num_tiles(problem, cfg) < sm_count or wave_efficiency(problem, cfg, sm_count) < MIN_WAVE_EFFICIENCY:
        cfg = CONFIGS["128x128x128_c1x1_coop_streamk"]
        if splits is None:
          splits = STREAM_K_HEURISTIC
  return cfg, _tw.resolve_splits(problem, cfg, sm_count, splits)


# -- two-level per-tensor GEMMs through the block-scaled kernel ------------------------------------

#: The block-scaled config a routed two-level GEMM runs (see two_level_route).
ROUTE_CONFIG = "128x128x128_c1x1_coop"
#: Margin by which the block-scaled tiles' useful fraction must beat the tensorwise pick's
#: (0.08 from a same-process A/B, see two_level_route; 0.01 before it).
ROUTE_MARGIN = 0.08


def two_level_route(problem: GemmProblem, sm_count: int, *, fast_accum: bool = False, config=None,
                    splits=None, swizzle=None, raster=None) -> bool:
  """Whether a ``fp8_gemm`` problem with two-level accumulation runs the block-scaled 1d2d kernel
  (1x128 x 128x128 scales) with its per-tensor / per-row scales broadcast to every K block,
  instead of the tensorwise family's pick.

  Same arithmetic: both promote the tensor core's 128-K sums into float32 (the block-scaled
  kernel multiplies each sum by sa * sb before adding it, the tensorwise one multiplies the total
  in the epilogue). The block-scaled 128x128 tiles fill the GPU's waves better where the
  tensorwise two-level pick (128x192 first) leaves part of its last wave or edge tiles idle;
  measured on the H200 (2026-11-30, same process, µs):
  4096^3 139.1 -> 123.1, 2048x8192x8192 271.7 -> 242.0, 4096x4096x7168 235.3 -> 226.0;
  not routed (rule below): 8192^3 992.3 vs 1083.6, 4096x2112x7168 117.7 vs 123.5.
  ROUTE_MARGIN (measured 2026-12-01, the route A/B, routed
  vs the tensorwise 128x192 tile, same process, µs): useful fraction higher by 0.108 -- routed,
  2048x8192x8192 254.2 vs 260.1, 4096x4096x7168 225.4 vs 236.4; by 0.065-0.066 -- not routed,
  4096x7168x16384 876.3 vs 871.8, 4096x11008x4096 346.6 vs 339.5, 512x28672x8192 226.2 vs 229.6;
  by 0.017-0.029 -- not routed, 4096x24576x1536 335.1 vs 324.5, 4096x14336x4096 459.5 vs 434.8,
  2048x28672x8192 886.9 vs 850.6, 4096x8192x8192 506.0 vs 497.9, 8192x4096x4096 265.6 vs 273.5.

  Routed when: two-level accumulation with nothing forced (config, splits, tile order), M > 64,
  e4m3 x e4m3, a per-tensor B scale (a per-channel one would need the 1x128 weight-scale kernel,
  measured 1.4-1.5x slower), bfloat16 or float32 output, and the block-scaled config's useful
  fraction (waves and edge tiles) beats the tensorwise pick's by more than ROUTE_MARGIN.
  Pure: no device needed.
  """
  if fast_accum or config is not None or splits is not None or swizzle is not None or raster is not None:
    return False
  if problem.m <= 64 or problem.a_dtype != F8E4M3 or problem.b_dtype != F8E4M3:
    return False
  if problem.b_scale != "tensor" or problem.out_dtype not in (BF16, F32):
    return False
  tw, _ = _tw.select_config(problem, sm_count)
  bw = CONFIGS[ROUTE_CONFIG]
  if num_tiles(problem, bw) < sm_count:
    return False
  return _tw.useful_fraction(problem, bw, sm_count) > _tw.useful_fraction(problem, tw, sm_count) + ROUTE_MARGIN
