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

from .shapes import GemmProblem


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  name: str
  tile: tuple          # kernel (M, N, K) tile; with swap_ab the kernel's M is the problem's N
  cluster: tuple       # (x, y)
  schedule: str        # "cooperative" | "pingpong"
  swap_ab: bool        # computes D^T = B A^T: small problem M becomes the kernel's N tile
  stream_k: bool       # stream-K scheduler (supports split-K with deterministic reduction)
  accum: str           # "2lvl": fp32 promotion every 128 K (precise) | "fast": wgmma accumulators only

  def __str__(self) -> str:
    t = "x".join(map(str, self.tile))
    c = "x".join(map(str, self.cluster))
    return (f"{self.name}: tile {t}, cluster {c}, {self.schedule}"
            f"{', swap-AB' if self.swap_ab else ''}{', stream-K/split-K' if self.stream_k else ''}, "
            f"accumulation {'two-level (fp32 promotion)' if self.accum == '2lvl' else 'fast (tensor-core only)'}")


_ALL = [
    KernelConfig("128x256x128_c2x1_coop_2lvl", (128, 256, 128), (2, 1), "cooperative", False, False, "2lvl"),
    KernelConfig("128x256x128_c2x1_coop_fast", (128, 256, 128), (2, 1), "cooperative", False, False, "fast"),
    KernelConfig("128x128x128_c1x2_pingpong_2lvl", (128, 128, 128), (1, 2), "pingpong", False, False, "2lvl"),
    KernelConfig("128x128x128_c1x2_pingpong_fast", (128, 128, 128), (1, 2), "pingpong", False, False, "fast"),
    KernelConfig("128x128x128_c1x1_coop_streamk_2lvl", (128, 128, 128), (1, 1), "cooperative", False, True, "2lvl"),
    KernelConfig("swap_128x16x128_coop_streamk_2lvl", (128, 16, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x32x128_coop_streamk_2lvl", (128, 32, 128), (1, 1), "cooperative", True, True, "2lvl"),
    KernelConfig("swap_128x64x128_coop_streamk_2lvl", (128, 64, 128), (1, 1), "cooperative", True, True, "2lvl"),
]
CONFIGS = {c.name: c for c in _ALL}


def get_config(name: str) -> KernelConfig:
  try:
    return CONFIGS[name]
  except KeyError:
    raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {name!r}") from None


def configs_table() -> str:
  return "\n".join(str(c) for c in _ALL)


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


def select_config(problem: GemmProblem, sm_count: int, *, fast_accum: bool = False,
                  config: Optional[str] = None, splits: Optional[int] = None) -> tuple:
  """Returns (KernelConfig, splits) for the problem on a GPU with `sm_count` SMs.

  Decode (M <= 64): swap-AB with the smallest N tile covering M; split K until the weight
  stream covers the SMs. Mid M (<= 256): 128x128 stream-K. Large: 128x256 cooperative when it
  fills the GPU, else 128x128 ping-pong. `fast_accum` selects tensor-core-only accumulation
  where a fast variant exists (decode configs always promote: they are memory-bound).
  """
  if sm_count <= 0:
    raise ValueError(f"sm_count must be positive, got {sm_count}")
  if config is not None:
    cfg = get_config(config)
  else:
    acc = "fast" if fast_accum else "2lvl"
    m = problem.m
    if m <= 16:
      cfg = CONFIGS["swap_128x16x128_coop_streamk_2lvl"]
    elif m <= 32:
      cfg = CONFIGS["swap_128x32x128_coop_streamk_2lvl"]
    elif m <= 64:
      cfg = CONFIGS["swap_128x64x128_coop_streamk_2lvl"]
    elif m <= 256:
      cfg = CONFIGS["128x128x128_c1x1_coop_streamk_2lvl"]
    else:
      big = CONFIGS[f"128x256x128_c2x1_coop_{acc}"]
      if num_tiles(problem, big) >= sm_count:
        cfg = big
      else:
        cfg = CONFIGS[f"128x128x128_c1x2_pingpong_{acc}"]
  if splits is None:
    splits = choose_splits(problem, cfg, sm_count)
  elif splits < 1 or (splits > 1 and not cfg.stream_k):
    raise ValueError(f"splits must be 1 for config {cfg.name} (no split-K), got {splits}"
                     if splits >= 1 else f"splits must be >= 1, got {splits}")
  return cfg, int(splits)
