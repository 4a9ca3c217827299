"""Tuned kernel configs of the sm90 FP8 GEMM family and the heuristic that picks one.

A :class:`KernelConfig` is a compiled CUTLASS kernel shape (names match the C++ table in
``cpp/sm90_fp8_gemm_tensorwise_inst.cuh``; a test checks the two agree when the library is
built). :func:`select_config` maps a :class:`~jax_gmma.shapes.GemmProblem` and the GPU's SM count
to a config and a K-split count. Pure Python: tested on CPU.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .. import _backend
from ..numerics.shapes import GemmProblem


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  name: str
  tile: tuple          # kernel (M, N, K) tile; with swap_ab the kernel's M is the problem's N
  cluster: tuple       # (x, y)
  schedule: str        # "cooperative" | "pingpong" | "warp-specialized" (one consumer warpgroup, not persistent)
                       # | "stream" (the mma.sync weight-streaming kernel, block-scaled family)
  swap_ab: bool        # computes D^T = B A^T: small problem M becomes the kernel's N tile
  stream_k: bool       # stream-K scheduler (supports split-K with deterministic reduction)
  accum: str           # "2lvl": fp32 promotion every 128 K (precise) | "fast": wgmma accumulators only
  stages: int = 0      # mainloop pipeline stages; 0 = as many as shared memory holds (CUTLASS auto)
  sweep: bool = False  # sweep-only kernel: built for e4m3 x e4m3 -> bfloat16 only, never auto-picked
  extra: bool = False  # never auto-picked, reachable only by config=: built with JAX_GMMA_EXTRA_KERNELS=1

  def __str__(self) -> str:
    t = "x".join(map(str, self.tile))
    c = "x".join(map(str, self.cluster))
    return (f"{self.name}: tile {t}, cluster {c}, {self.schedule}"
            f"{', swap-AB' if self.swap_ab else ''}{', stream-K/split-K' if self.stream_k else ''}, "
            f"accumulation {'two-level (fp32 promotion)' if self.accum == '2lvl' else 'fast (tensor-core only)'}, "
            f"stages {self.stages or 'auto'}{', sweep only (e4m3 x e4m3 -> bfloat16)' if self.sweep else ''}"
            f"{', built on request (JAX_GMMA_EXTRA_KERNELS=1)' if self.extra else ''}")


_ALL = [
    KernelConfig("128x256x128_c2x1_coop_fast", (128, 256, 128), (2, 1), "cooperative", False, False, "fast"),
    KernelConfig("128x192x128_c2x1_coop_2lvl", (128, 192, 128), (2, 1), "cooperative", False, False, "2lvl"),
    KernelConfig("128x192x128_c2x1_coop_fast", (128, 192, 128), (2, 1), "cooperative", False, False, "fast"),
    KernelConfig("128x128x128_c2x1_coop_2lvl", (128, 128, 128), (2, 1), "cooperative", False, False, "2lvl"),
    KernelConfig("128x128x128_c1x2_pingpong_fast", (128, 128, 128), (1, 2), "pingpong", False, False, "fast"),
    KernelConfig("128x128x128_c1x1_coop_streamk_2lvl", (128, 128, 128), (1, 1), "cooperative", False, True, "2lvl"),
    KernelConfig("128x256x128_c1x1_coop_streamk_fast", (128, 256, 128), (1, 1), "cooperative", False, True, "fast"),
    KernelConfig("swap_128x16x128_coop_streamk_2lvl", (128, 16, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x32x128_coop_streamk_2lvl", (128, 32, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x64x128_coop_streamk_2lvl", (128, 64, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_64x16x128_pingpong_2lvl", (64, 16, 128), (1, 1), "pingpong", True, False, "2lvl",
                 extra=True),
    KernelConfig("swap_64x32x128_pingpong_2lvl", (64, 32, 128), (1, 1), "pingpong", True, False, "2lvl"),
    KernelConfig("swap_64x64x128_pingpong_2lvl", (64, 64, 128), (1, 1), "pingpong", True, False, "2lvl"),
    # One wave of 64-row tiles or less: one non-persistent warp-specialized CTA per tile with an
    # explicit stage count. Measured on the H200 (2026-12-02): in the
    # decode chain at N = K = 8192 1.10 / 1.06 / 1.04x the ping-pong kernel at M = 1 / 16 / 64;
    # the 32-token tile stays ping-pong (no faster kernel alone), and so does the 64-token tile at
    # half a wave or less (N <= 64 x SMs / 2), where it measured slower in the chain.
    KernelConfig("swap_64x16x128_ws_s10_2lvl", (64, 16, 128), (1, 1), "warp-specialized", True, False, "2lvl",
                 stages=10),
    # The 16-token tile with 4 stages (41 KB of shared memory: 5 CTAs per SM instead of 2), for
    # more weight rows than SMs over a short K (<= WS_SHALLOW_MAX_K): kernel alone,
    # M = 1, N = 24576, K = 1536 12.7 vs 14.7 us (10 stages) vs 17.5 (128-row stream-K).
    KernelConfig("swap_64x16x128_ws_s4_2lvl", (64, 16, 128), (1, 1), "warp-specialized", True, False, "2lvl",
                 stages=4),
    KernelConfig("swap_64x64x128_ws_s8_2lvl", (64, 64, 128), (1, 1), "warp-specialized", True, False, "2lvl",
                 stages=8),
    # More weight rows than SMs over a short K (<= WS_SHALLOW_MAX_K), 17..64 tokens: non-persistent
    # warp-specialized 64-row tiles with few stages, several CTAs per SM (32 tokens: 4 stages,
    # 4 per SM; 64 tokens: 6 stages, 2 per SM, or 4 stages in a 2x1 cluster, 3 per SM, whichever
    # wave fits the tile count better). Kernel alone
    # (measured 2026-12-02), us, vs the persistent ping-pong tile:
    # M = 32, N x K = 24576 x 1536 13.0 vs 14.9, 32768 x 512 8.1 vs 10.2; M = 64: 24576 x 1536
    # 13.9 vs 15.1 (cluster), 16384 x 1536 10.2 vs 11.4, 32768 x 512 10.2 vs 10.8.
    KernelConfig("swap_64x32x128_ws_s4_2lvl", (64, 32, 128), (1, 1), "warp-specialized", True, False, "2lvl",
                 stages=4),
    KernelConfig("swap_64x64x128_ws_s6_2lvl", (64, 64, 128), (1, 1), "warp-specialized", True, False, "2lvl",
                 stages=6),
    KernelConfig("swap_64x64x128_c2x1_ws_s4_2lvl", (64, 64, 128), (2, 1), "warp-specialized", True, False,
                 "2lvl", stages=4),
    # M = 33..64 with many weight rows: the activation tile is shared by a 2x1 cluster (TMA
    # multicast), halving its L2 reads.
    KernelConfig("swap_128x64x128_c2x1_coop_streamk_2lvl", (128, 64, 128), (2, 1), "cooperative", True, True,
                 "2lvl"),
    # Fast-accumulation decode (fast_accum=True) where the weight rows need stream-K.
    KernelConfig("swap_128x16x128_coop_streamk_fast", (128, 16, 128), (1, 1), "cooperative", True, True, "fast"),
    KernelConfig("swap_128x32x128_coop_streamk_fast", (128, 32, 128), (1, 1), "cooperative", True, True, "fast"),
    KernelConfig("swap_128x64x128_c2x1_coop_streamk_fast", (128, 64, 128), (2, 1), "cooperative", True, True,
                 "fast"),
]


def _staged(name: str, stages: int) -> KernelConfig:
  base = next(c for c in _ALL if c.name == name)
  return dataclasses.replace(base, name=f"{name}_s{stages}", stages=stages, sweep=True, extra=False)


#: Sweep-only kernels (cpp/sm90_fp8_gemm_tensorwise_sweep.cu): explicit stage counts of the
#: production configs and candidate tiles under evaluation. benchmarks/sweep.py times them.
_SWEEP = [
    *(_staged("128x256x128_c2x1_coop_fast", s) for s in (2, 3, 4)),
    *(_staged("128x128x128_c2x1_coop_2lvl", s) for s in (2, 3, 4, 5, 6)),
    *(_staged("128x128x128_c1x2_pingpong_fast", s) for s in (3, 4)),
    *(_staged("swap_64x16x128_pingpong_2lvl", s) for s in (4, 8)),
    *(_staged("swap_64x64x128_pingpong_2lvl", s) for s in (4, 8)),
    _staged("128x192x128_c2x1_coop_2lvl", 4),
    KernelConfig("64x192x128_c1x2_pingpong_2lvl", (64, 192, 128), (1, 2), "pingpong", False, False, "2lvl",
                 sweep=True),
    KernelConfig("64x128x128_c1x2_pingpong_2lvl", (64, 128, 128), (1, 2), "pingpong", False, False, "2lvl",
                 sweep=True),
    # M = 33..64 with many weight rows (sweep candidates): a 4x1 cluster sharing the
    # activation tile four ways; the unswapped 64-token ping-pong tile with fast accumulation.
    KernelConfig("swap_128x64x128_c4x1_coop_streamk_2lvl", (128, 64, 128), (4, 1), "cooperative", True, True,
                 "2lvl", sweep=True),
    KernelConfig("swap_128x64x128_c4x1_coop_streamk_fast", (128, 64, 128), (4, 1), "cooperative", True, True,
                 "fast", sweep=True),
    KernelConfig("64x128x128_c1x2_pingpong_fast", (64, 128, 128), (1, 2), "pingpong", False, False, "fast",
                 sweep=True),
]
_ALL += _SWEEP
CONFIGS = {c.name: c for c in _ALL}
#: The dtype triple sweep-only kernels are built for.
SWEEP_DTYPES = ("float8_e4m3fn", "float8_e4m3fn", "bfloat16")


#: Tile order of the persistent / stream-K schedulers: runtime arguments of every config (no
#: extra kernels). swizzle: CUTLASS's max_swizzle_size, consecutive CTAs take tiles in groups
#: this wide (L2 reuse of the operand strips they share); raster: the dimension the tile walk
#: runs along first ("auto" = CUTLASS's heuristic: along the dimension with fewer tiles).
SWIZZLES = (1, 2, 4, 8)
RASTERS = {"auto": 0, "m": 1, "n": 2}


def sweep_kernels_built() -> bool:
  """Whether the library holds the sweep-only kernels (built with JAX_GMMA_SWEEP_KERNELS=1)."""
  e = _backend.ext()
  return bool(_backend.kernels_built() and any(
      k["config"] in CONFIGS and CONFIGS[k["config"]].sweep for k in e.kernels()))


def extra_kernels_built() -> bool:
  """Whether the library holds the kernels no heuristic picks (built with JAX_GMMA_EXTRA_KERNELS=1)."""
  e = _backend.ext()
  return bool(_backend.kernels_built() and any(
      k["config"] in CONFIGS and CONFIGS[k["config"]].extra for k in e.kernels()))


def check_tile_order(swizzle, raster) -> None:
  """Raises ValueError (naming the argument) for a swizzle / raster outside the options;
  None means "the heuristic's choice"."""
  if swizzle is not None and (isinstance(swizzle, bool) or swizzle not in SWIZZLES):
    raise ValueError(f"swizzle must be one of {SWIZZLES} or None, got {swizzle!r}")
  if raster is not None and raster not in RASTERS:
    raise ValueError(f"raster must be one of {tuple(RASTERS)} or None, got {raster!r}")


def select_tile_order(problem: GemmProblem, cfg: KernelConfig, *, swizzle=None, raster=None,
                      ungrouped_raster: str = "m") -> tuple:
  """(swizzle, raster) for a problem and config: the caller's where given, else the rule.

  Data-parallel large-M configs: walk the tiles along M, in groups of 8 N tiles when the N tile
  count is a multiple of 8 (a swizzle pads the grid to a multiple of itself: 28 N tiles with
  swizzle 8 ran 14-18% slower), else ungrouped. Measured against CUTLASS's heuristic (ungrouped,
  along the dimension with fewer tiles) with the fast tiles (tile-order sweep, H200):
  8192^3 881.8 vs 901.6 us, 4096x7168x16384 743.9 vs 769.6, 4096x2112x7168 105.9 vs 108.5,
  2048x8192x8192 206.7 vs 205.5. Decode (swap-AB) and stream-K configs keep CUTLASS's default
  (1, "auto"). `ungrouped_raster`: the raster of a data-parallel grid whose N tiles 8 does not
  divide ("m" here; the block-scaled family passes "auto", measured in
  blockwise_configs.select_tile_order).
  """
  check_tile_order(swizzle, raster)
  rule = (1, "auto")
  if not cfg.swap_ab and not cfg.stream_k:
    rule = (8, "m") if math.ceil(problem.n / cfg.tile[1]) % 8 == 0 else (1, ungrouped_raster)
  return (rule[0] if swizzle is None else int(swizzle)), (rule[1] if raster is None else raster)


def get_config(name: str) -> KernelConfig:
  try:
    return CONFIGS[name]
  except KeyError:
    raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}") from None


def configs_table(include_sweep: bool = False) -> str:
  return "\n".join(str(c) for c in _ALL if include_sweep or not c.sweep)


def _kernel_mn(problem: GemmProblem, cfg: KernelConfig) -> tuple:
  return (problem.n, problem.m) if cfg.swap_ab else (problem.m, problem.n)


def num_tiles(problem: GemmProblem, cfg: KernelConfig) -> int:
  km, kn = _kernel_mn(problem, cfg)
  return math.ceil(km / cfg.tile[0]) * math.ceil(kn / cfg.tile[1])


def choose_splits(problem: GemmProblem, cfg: KernelConfig, sm_count: int, max_splits: int = 16,
                  min_k_tiles_per_split: int = 4) -> int:
  """K splits that best fill the SMs (wave efficiency), preferring fewer splits on ties."""
  if not cfg.stream_k:
    return 1
  tiles = num_tiles(problem, cfg)
  k_tiles = math.ceil(problem.k / cfg.tile[2])
  best, best_eff = 1, 0.0
  for s in range(1, max_splits + 1):
    if s > 1 and k_tiles // s < min_k_tiles_per_split:
      break
    units = tiles * s
    eff = units / (math.ceil(units / sm_count) * sm_count)
    # A split costs a partial-tile reduction; require a real gain to take more splits.
    if eff > best_eff + 0.04:
      best, best_eff = s, eff
  return best


def wave_efficiency(problem: GemmProblem, cfg: KernelConfig, sm_count: int) -> float:
  tiles = num_tiles(problem, cfg)
  return tiles / (math.ceil(tiles / sm_count) * sm_count)


def useful_fraction(problem: GemmProblem, cfg: KernelConfig, sm_count: int) -> float:
  """Fraction of the launched waves' tile area that holds real outputs (1.0 = no partial tiles
  and no partial last wave): wave efficiency times the M and N fill of the edge tiles."""
  km, kn = _kernel_mn(problem, cfg)
  tiles = num_tiles(problem, cfg)
  waves = math.ceil(tiles / sm_count)
  return km * kn / (waves * sm_count * cfg.tile[0] * cfg.tile[1])


#: A data-parallel grid whose useful fraction is below this is replaced by the next candidate
#: (and in the end by stream-K).
MIN_USEFUL_FRACTION = 0.85
#: Decode: 64-row ping-pong tiles (no split) unless the weight rows make fewer than
#: sm_count / this many of them; then 128-row tiles with K split. Was 2 until the Llama-3-8B
#: shapes were swept (measured 2026-11-29, the Llama sweep): at N = 4096
#: (64 tiles on 132 SMs) the unsplit ping-pong tile is 1.31x faster than the 4-way split at
#: M = 1, K = 4096, and 1.14x at K = 14336.
SPLIT_BELOW_SM_FRACTION = 3
#: The 16-token decode tile over more 64-row weight tiles than SMs takes the 4-stage kernel
#: (5 CTAs per SM) up to this K, the 10-stage one (2 per SM) above it. Kernel alone
#: (measured 2026-12-02), M = 1, us, 4 / 10 stages: N x K =
#: 24576 x 1536 12.7 / 14.7, 28672 x 2048 18.6 / 20.1, 16384 x 4096 20.6 / 20.1,
#: 28672 x 8192 59.7 / 60.0.
WS_SHALLOW_MAX_K = 2048
#: 64 tokens over more 64-row weight tiles than SMs with K <= WS_SHALLOW_MAX_K: the two
#: non-persistent tiles and how many of their CTAs an SM holds (cudaOccupancy, read by the
#: kernel-alone tool); the one whose CTA waves the tile count fills better runs.
_SHORT_K_64 = (("swap_64x64x128_ws_s6_2lvl", 2), ("swap_64x64x128_c2x1_ws_s4_2lvl", 3))
#: Two-level accumulation at 65..SWAP_MAX_M tokens where no large data-parallel tile fills the
#: waves: the swap-AB 128 x 64 stream-K tile when N / 128 x ceil(M / 64) of them fit one wave,
#: else the 128 x 128 stream-K tile without a split when it has a wave of tiles. Decode chains on
#: an H100 (16 dependent GEMMs, µs, against the 128 x 128 tile with CUTLASS's stream-K
#: decomposition, and XLA's FP8 dot): 96 x 8192 x 8192 35.2 against 43.6 (XLA 39.7), 128 x 8192 x
#: 8192 35.9 against 44.7 (37.0); 96 / 128 x 28672 x 8192, no split: 99.1 / 101.3 against 101.8 /
#: 105.0 (94.7 / 98.0). At 256 tokens the stream-K decomposition stays (28672 x 8192: 144.1
#: against 156.6 without a split and 164.2 for the swap tile).
SWAP_MAX_M = 128
#: CUTLASS's stream-K heuristic decomposition (passed as splits=0 to the kernel).
STREAM_K_HEURISTIC = 0
# Candidates in order of preference (measured per-tile speed on an H200, benchmarks/sweep.py,
# results in benchmarks/results/): the first whose grid fills the GPU well enough wins.
_LARGE_2LVL = ("128x192x128_c2x1_coop_2lvl", "128x128x128_c2x1_coop_2lvl")
_LARGE_FAST = ("128x256x128_c2x1_coop_fast", "128x192x128_c2x1_coop_fast",
               "128x128x128_c1x2_pingpong_fast")


#: Decode tile per token tile width when the weight rows make at most one wave of 64-row tiles
#: (the 16-token one also above a wave: see select_config).
_ONE_WAVE_DECODE = {16: "swap_64x16x128_ws_s10_2lvl", 32: "swap_64x32x128_pingpong_2lvl",
                    64: "swap_64x64x128_ws_s8_2lvl"}


def select_config(problem: GemmProblem, sm_count: int, *, fast_accum: bool = False,
                  config: Optional[str] = None, splits: Optional[int] = None) -> tuple:
  """Returns (KernelConfig, splits) for the problem on a GPU with `sm_count` SMs.

  splits: 1 = data-parallel, > 1 = split-K (deterministic reduction), 0 = CUTLASS's stream-K
  heuristic (stream-K configs only).

  Decode (M <= 64): swap-AB with the smallest N tile covering M. With fast_accum, the stream-K
  configs' fast-accumulation twins (16- and 32-token tiles, and the 64-token 2x1 cluster);
  the 64-row one-wave tiles and the 64-token split-K decode tiles exist with two-level accumulation only,
  which fast_accum=True then runs (more precise, never less). 64-row tiles (no workspace;
  warp-specialized one CTA per tile for 16 tokens and for 64 over more than half a wave,
  ping-pong otherwise) when the weight rows make at most one wave of them; more weight rows: for
  16 tokens still the warp-specialized 64-row tile (4 stages, 5 CTAs per SM, when K <=
  WS_SHALLOW_MAX_K; 1.03-1.47x the stream-K tile in the decode chains), for 32 / 64
  tokens with K <= WS_SHALLOW_MAX_K non-persistent warp-specialized 64-row tiles with few stages
  (32 tokens: 4 stages; 64 tokens: 6 stages, or 4 in a 2x1 cluster, by wave fill), else 128-row
  cooperative tiles with CUTLASS's stream-K decomposition (measured at N = 28672, K = 8192:
  5-11% faster than 3.4 waves of ping-pong 64-row tiles), as 2x1 clusters for 64-token tiles
  (M = 33..64); fewer than a third of the SMs' worth of 64-row tiles
  (SPLIT_BELOW_SM_FRACTION): 128-row tiles with K split until the weight stream covers the SMs. Otherwise: the first large tile of the
  requested accumulation mode (128x192 then 128x128 for two-level; 128x256, 128x192, 128x128
  ping-pong for fast) whose grid has a useful fraction >= MIN_USEFUL_FRACTION, else stream-K
  (two-level up to SWAP_MAX_M tokens: the swap-AB 128x64 tile or no split, see SWAP_MAX_M).
  """
  if sm_count <= 0:
    raise ValueError(f"sm_count must be positive, got {sm_count}")
  if config is not None:
    cfg = get_config(config)
    dts = (problem.a_dtype.name, problem.b_dtype.name, problem.out_dtype.name)
    if cfg.sweep and dts != SWEEP_DTYPES:
      raise ValueError(f"config {cfg.name} is a sweep-only kernel, built for "
                       f"{' x '.join(SWEEP_DTYPES[:2])} -> {SWEEP_DTYPES[2]} only; got "
                       f"{dts[0]} x {dts[1]} -> {dts[2]}")
  else:
    m = problem.m
    if m <= 64:
      tn = 16 if m <= 16 else 32 if m <= 32 else 64
      cfg = CONFIGS[_ONE_WAVE_DECODE[tn]]
      if tn == 64 and num_tiles(problem, cfg) <= sm_count // 2:
        # Half a wave or less of 64-token tiles: ping-pong (in the chain at N = K = 4096, M = 64,
        # twice 1.04-1.21x faster than the warp-specialized tile).
        cfg = CONFIGS["swap_64x64x128_pingpong_2lvl"]
      tiles = num_tiles(problem, cfg)
      if tiles > sm_count and tn == 16:
        if problem.k <= WS_SHALLOW_MAX_K:
          # Short K: the 4-stage tile keeps 5 CTAs per SM streaming.
          cfg = CONFIGS["swap_64x16x128_ws_s4_2lvl"]
      elif tiles > sm_count and problem.k <= WS_SHALLOW_MAX_K:
        # Short K, 32 / 64 tokens: non-persistent tiles with few stages, several CTAs per SM
        # (stream-K's fixup costs more than it balances over so few K blocks: 8-27%
        # faster kernels than the persistent ping-pong tile).
        if tn == 32:
          cfg = CONFIGS["swap_64x32x128_ws_s4_2lvl"]
        else:
          # Wave fill with per_sm CTAs on each SM (max keeps the first on ties).
          name = max(_SHORT_K_64, key=lambda c: wave_efficiency(problem, CONFIGS[c[0]], c[1] * sm_count))[0]
          cfg = CONFIGS[name]
      elif tiles > sm_count:
        # 64-token tiles: a 2x1 cluster shares the activation tile by TMA multicast. Measured
        # (decode sweep, H200): N = 28672, K = 8192: M = 48 65.9 vs 71.6 us, M = 64 66.3 vs
        # 66.5 us against the single-CTA 128x64 stream-K kernel.
        # fast_accum: the fast-accumulation twin (1-5% faster in the decode sweep).
        cfg = CONFIGS[(f"swap_128x{tn}x128_c2x1_coop_streamk" if tn == 64
                       else f"swap_128x{tn}x128_coop_streamk") + ("_fast" if fast_accum else "_2lvl")]
        if splits is None:
          splits = STREAM_K_HEURISTIC
      elif tiles < sm_count // SPLIT_BELOW_SM_FRACTION:
        # K split over few weight rows; the fast twins exist for 16- and 32-token tiles.
        fast = fast_accum and tn < 64
        cfg = CONFIGS[f"swap_128x{tn}x128_coop_streamk_{'fast' if fast else '2lvl'}"]
    else:
      cfg = CONFIGS["128x256x128_c1x1_coop_streamk_fast" if fast_accum
                    else "128x128x128_c1x1_coop_streamk_2lvl"]
      for name in (_LARGE_FAST if fast_accum else _LARGE_2LVL):
        c = CONFIGS[name]
        if num_tiles(problem, c) >= sm_count and useful_fraction(problem, c, sm_count) >= MIN_USEFUL_FRACTION:
          cfg = c
          break
      if cfg.stream_k and not fast_accum and m <= SWAP_MAX_M:
        # Batched decode, 65..128 tokens: swap-AB 128 x 64 tiles (two token tiles) while the weight
        # rows give at most one wave of them, else the 128 x 128 tile data-parallel when it fills
        # a wave (see SWAP_MAX_M).
        swap = CONFIGS["swap_128x64x128_coop_streamk_2lvl"]
        if num_tiles(problem, swap) <= sm_count:
          cfg = swap
        elif splits is None and num_tiles(problem, cfg) >= sm_count:
          splits = 1
      if cfg.stream_k and splits is None:
        splits = STREAM_K_HEURISTIC
  return cfg, resolve_splits(problem, cfg, sm_count, splits)


def resolve_splits(problem, cfg: KernelConfig, sm_count: int, splits: Optional[int]) -> int:
  """The K split count: the caller's (checked against the config: 1 unless stream-K), else
  :func:`choose_splits`."""
  if splits is None:
    return int(choose_splits(problem, cfg, sm_count))
  if splits < 0 or (splits != 1 and not cfg.stream_k):
    raise ValueError(f"splits must be 1 for config {cfg.name} (no split-K), got {splits}"
                     if splits >= 0 else f"splits must be >= 0, got {splits}")
  return int(splits)
