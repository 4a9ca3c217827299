"""Kernel configs of the grouped (mixture-of-experts) FP8 GEMM family (``jax_gmma.ragged_dot``)
and the rule that picks one. Pure Python: tested on CPU.

The decode kernels (``cpp/sm90_fp8_gemm_grouped_stream.cu``) are the FP8 weight-streaming
kernel of the dense decode path run per expert: a CTA takes 16 rows of one expert's weights and
that expert's tokens, 8 or 16 at a time, with 4 or 8 warps splitting K. For block-scaled experts
with many tokens each, the prefill kernels (``cpp/sm90_fp8_gemm_grouped_blockwise.cu``) are
CUTLASS's grouped tensor-core GEMM with the FP8 blockwise-scaling mainloop, its per-expert
arguments written on the device by a setup kernel. The compiled kernel of a config for a scale
kind is ``grouped_<kind>_<config>``:

* ``blockwise_1d2d`` / ``blockwise_1d1d``: fp8_128x128 / fp8_1x128 experts, x fp8_1x128;
* ``mxf8``: mxfp8 experts and x;
* ``fp8``: fp8_channel experts (or fp8_tensor, one scale per expert), x fp8_channel or
  fp8_tensor.

FP4 / FP6 experts (PackedWeight: nvfp4, mxfp4, mxfp6_e2m3, mxfp6_e3m2) run the grouped form of
the weight-only decode kernel (``cpp/sm90_fp4_gemm_weightonly.cu``, ``..._fp6_...``; x in
bfloat16), its CTA shape picked in C++ (``weightonly_grouped_pick``).

The grid is (16-row strips of N) x (min(G, M) + 1) CTAs: one slot per expert that can hold rows,
so empty experts cost one early-exiting CTA per strip, never their weights
(``cpp/include/jax_gmma/groups.cuh``).
"""
from __future__ import annotations

import dataclasses

#: scale kind of each expert-weight format
KINDS = {"fp8_128x128": "blockwise_1d2d", "fp8_1x128": "blockwise_1d1d", "mxfp8": "mxf8",
         "fp8_channel": "fp8", "fp8_tensor": "fp8"}
#: FP4 / FP6 expert formats (PackedWeight) of the grouped weight-only kernel
WEIGHTONLY_FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
#: weight-streaming configs: (tokens per CTA, warps along K)
CONFIGS = {"stream_16x8_kw4": (8, 4), "stream_16x8_kw8": (8, 8), "stream_16x16_kw4": (16, 4),
           "stream_16x16_kw8": (16, 8)}
#: prefill configs of the block-scaled kinds (cpp/sm90_fp8_gemm_grouped_blockwise.cu: CUTLASS's
#: grouped GEMM with the FP8 blockwise-scaling mainloop): rows of tokens per tile
PREFILL_CONFIGS = {"128x128x128_coop": 128, "64x128x128_pingpong": 64}
PREFILL_KINDS = ("blockwise_1d2d", "blockwise_1d1d")
#: the experts' average rows from which the block-scaled kinds take the prefill tiles, and the
#: 128-row tile
PREFILL_MIN_ROWS = 64
PREFILL_128_MIN_ROWS = 256
#: the kernels' contraction block: K must be a multiple of it
K_BLOCK = 32
#: most experts a launch takes (one grid row per expert slot, CUDA's 65535 grid rows)
MAX_GROUPS = 65534


@dataclasses.dataclass(frozen=True)
class GroupedProblem:
  """A grouped GEMM: M rows of x (all experts' tokens), G experts of (N, K), the weight format."""
  m: int
  n: int
  k: int
  g: int
  fmt: str

  def __str__(self):
    return f"ragged_dot M={self.m} (G={self.g} experts of N={self.n} x K={self.k}, {self.fmt})"


def kernel_name(kind: str, config: str) -> str:
  """The C++ kernel-table name of a config for a scale kind."""
  return f"grouped_{kind}_{config}"


def unsupported(problem: GroupedProblem):
  """Why no grouped kernel multiplies the problem (a sentence), or None when one does."""
  if problem.fmt not in KINDS and problem.fmt not in WEIGHTONLY_FORMATS:
    return (f"no grouped kernel for {problem.fmt} expert weights (grouped kernels: "
            f"{', '.join(tuple(KINDS) + WEIGHTONLY_FORMATS)})")
  if problem.g > MAX_GROUPS:
    return f"the grouped kernels take at most {MAX_GROUPS} experts, got {problem.g}"
  if problem.fmt in WEIGHTONLY_FORMATS:
    return None  # a PackedWeight is laid out for the kernel (N % 16, K padded to 64)
  if problem.k % K_BLOCK:
    return f"the grouped kernels need K (the stored contraction length) a multiple of {K_BLOCK}, got {problem.k}"
  return None


def stream_config(problem: GroupedProblem, sm_count: int) -> str:
  """The weight-streaming config: 16-token CTAs when the experts average more than 8 rows each
  (M > 8 G), else 8; 8 warps along K while the expert slots give at most two CTAs per SM, else
  4. A first rule from the dense streaming kernel's measurements
  (``blockwise_configs.select_stream_config``), not yet tuned on grouped problems."""
  slots = min(problem.g, problem.m)
  ctas = -(-problem.n // 16) * slots
  tokens = 16 if problem.m > 8 * problem.g else 8
  kw = 8 if ctas <= 2 * sm_count else 4
  return f"stream_16x{tokens}_kw{kw}"


def select_config(problem: GroupedProblem, sm_count: int) -> str:
  """The config for a problem. Block-scaled experts averaging at least PREFILL_MIN_ROWS rows
  (M / min(G, M)) take CUTLASS's grouped tensor-core kernel, in 128-row tiles from
  PREFILL_128_MIN_ROWS and 64-row ping-pong tiles below (N a multiple of 8 for its TMA rows);
  everything else streams the weights (:func:`stream_config`). First rules, not yet measured
  on grouped problems."""
  avg = problem.m / max(min(problem.g, problem.m), 1)
  if KINDS.get(problem.fmt) in PREFILL_KINDS and avg >= PREFILL_MIN_ROWS and problem.n % 8 == 0:
    return "128x128x128_coop" if avg >= PREFILL_128_MIN_ROWS else "64x128x128_pingpong"
  return stream_config(problem, sm_count)


def is_prefill(config: str) -> bool:
  return config in PREFILL_CONFIGS
