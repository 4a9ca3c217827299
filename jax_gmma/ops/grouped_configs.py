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

At prefill sizes the per-row / per-tensor experts (kind ``fp8``) run the ``blockwise_1d1d``
prefill kernel too (:data:`PREFILL_KIND`): a per-row or per-tensor scale is a 1x128 block scale
that repeats over K, so the lowering writes it out once per 128 of K (a partial last block
included: K a multiple of 32, as every grouped kernel) and CUTLASS's grouped tensor-core GEMM
multiplies them; below the prefill sizes they stream. MXFP8 experts (scales per 32 of K, which
CUTLASS's Hopper blockwise mainloop cannot apply: it promotes once per 128) take kind ``bf16``
at prefill sizes: both operands dequantized exactly to bfloat16 (an e4m3 element times its
power-of-two scale) and CUTLASS's grouped bf16 tensor-core GEMM
(``cpp/sm90_bf16_gemm_grouped.cu``, :data:`BF16_PREFILL_CONFIGS`), as the dense MXFP8 family's
exact bf16 route at large M.

FP4 / FP6 experts (PackedWeight: nvfp4, mxfp4, mxfp6_e2m3, mxfp6_e3m2) run the grouped form of
the weight-only decode kernel (``cpp/sm90_fp4_gemm_weightonly.cu``, ``..._fp6_...``; x in
bfloat16), its CTA shape picked in C++ (``weightonly_grouped_pick``); at prefill sizes those
with a float x take the bf16 route of MXFP8 (:func:`packed_takes_bf16`; NVFP4 with float32
sums, its global scale applied after the kernel).

The grid is (16-row strips of N) x (min(G, M) + 1) CTAs: one slot per expert that can hold rows,
so empty experts cost one early-exiting CTA per strip, never their weights
(``cpp/include/jax_gmma/groups.cuh``).

On Blackwell (sm_100a, compute capability 10.0) MXFP8, NVFP4 and MXFP4 experts given as
QuantizedArrays (block scales on both operands: x quantized to the weights' format) run
CUTLASS's grouped block-scaled tensor-core GEMM (``cpp/sm100_mx_gemm_grouped_blockscaled.cu``,
tcgen05 block-scaled MMA): per format pair a 1-SM config (128-row tiles) and a 2-SM one (256-row
MMAs over an SM pair), ``sm100_grouped_<fmt>x<fmt>_<MMA tile>_<1sm|2sm>`` (:data:`SM100_CONFIGS`,
:func:`select_sm100_config`). Compiled and checked on the host and in its SASS only: this project
has no Blackwell GPU to run it on.
"""
from __future__ import annotations

import dataclasses

#: scale kind of each expert-weight format
KINDS = {"fp8_128x128": "blockwise_1d2d", "fp8_1x128": "blockwise_1d1d", "mxfp8": "mxf8",
         "fp8_channel": "fp8", "fp8_tensor": "fp8"}
#: FP4 / FP6 expert formats (PackedWeight) of the grouped weight-only kernel
WEIGHTONLY_FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
#: weight-streaming configs: (tokens per CTA, warps along K). The ``stream_bulk_*`` ones stage
#: the weights in shared memory with TMA bulk copies (a producer warp besides the K warps) on
#: persistent CTAs (``cpp/include/jax_gmma/fp8_stream_bulk.cuh``)
CONFIGS = {"stream_16x8_kw4": (8, 4), "stream_16x8_kw8": (8, 8), "stream_16x16_kw4": (16, 4),
           "stream_16x16_kw8": (16, 8), "stream_bulk_16x8_kw4": (8, 4),
           "stream_bulk_16x16_kw4": (16, 4)}
#: prefill configs of the block-scaled kinds (cpp/sm90_fp8_gemm_grouped_blockwise.cu: CUTLASS's
#: grouped GEMM with the FP8 blockwise-scaling mainloop): rows of tokens per tile
PREFILL_CONFIGS = {"128x128x128_coop": 128, "64x128x128_pingpong": 64}
#: prefill configs of kind ``bf16`` (cpp/sm90_bf16_gemm_grouped.cu: CUTLASS's grouped GEMM on
#: bfloat16 operands): rows of tokens per tile
BF16_PREFILL_CONFIGS = {"128x256x64_coop": 128, "64x128x64_pingpong": 64}
#: the prefill kernels' scale kind of each expert format that has one: per-row (fp8_channel)
#: and per-tensor (fp8_tensor) scales as 1x128 blocks repeating one value over K; MXFP8 as
#: exact bfloat16 operands
PREFILL_KIND = {"fp8_128x128": "blockwise_1d2d", "fp8_1x128": "blockwise_1d1d",
                "fp8_channel": "blockwise_1d1d", "fp8_tensor": "blockwise_1d1d", "mxfp8": "bf16"}
#: the contraction block of the prefill kernels' scales (the block-scaled formats store K padded
#: to it; per-row / per-tensor experts write ceil(K / 128) blocks, the last one partial)
PREFILL_K_BLOCK = 128
#: the experts' average rows from which the block-scaled kinds take the prefill tiles, and the
#: 128-row tile (measured on an H100, both kinds, DeepSeek-V3's 2048 x 7168 and Qwen3-30B-A3B's
#: 1536 x 2048 experts: the 64-row ping-pong tile wins by 1-24% at 64 rows per expert, the
#: 128-row tile by 14-46% from 96; benchmarks/grouped_routes.py)
PREFILL_MIN_ROWS = 64
PREFILL_128_MIN_ROWS = 96
#: PackedWeight formats whose element times its block scale is exact in bfloat16 (an e2m1 /
#: e2m3 / e3m2 element times a power-of-two E8M0 scale; NVFP4's e2m1 times its e4m3 scale has at
#: most 6 significant bits), and the experts' average rows from which they take the bf16 prefill
#: kernel (:func:`packed_takes_bf16`). The route first unpacks every expert to bfloat16 (the
#: weight-only unpack kernel, one launch); the kernel's epilogue multiplies each expert's float32
#: sums by its global scale. Below the threshold the weight-only kernel reads the packed experts
#: directly: up to 128 rows per expert (its largest token tile) it was 5-11% faster than the
#: route on an H100, from 160 (two token tiles) the route 15-44% faster
#: (benchmarks/grouped_routes.py)
WEIGHTONLY_BF16_FORMATS = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4")
WEIGHTONLY_BF16_MIN_ROWS = 129
#: the kernels' contraction block: K must be a multiple of it
K_BLOCK = 32
#: most experts a launch takes (one grid row per expert slot, CUDA's 65535 grid rows)
MAX_GROUPS = 65534
#: Blackwell (sm_100a) grouped block-scaled kernels (cpp/sm100_mx_gemm_grouped_blockscaled.cu):
#: the (1-SM, 2-SM) configs of each expert format (x in the same format), and the format's
#: element dtype
SM100_CONFIGS = {"mxfp8": ("mxfp8xmxfp8_128x128x128_1sm", "mxfp8xmxfp8_256x128x128_2sm"),
                 "nvfp4": ("nvfp4xnvfp4_128x128x256_1sm", "nvfp4xnvfp4_256x128x256_2sm"),
                 "mxfp4": ("mxfp4xmxfp4_128x128x256_1sm", "mxfp4xmxfp4_256x128x256_2sm")}
SM100_ELEMENTS = {"mxfp8": "float8_e4m3fn", "nvfp4": "float4_e2m1fn", "mxfp4": "float4_e2m1fn"}
#: their contraction alignment: the MX scale block (16-byte TMA rows of FP4 operands)
SM100_K_ALIGN = 32
#: most experts and rows (int32 problem shapes, with room) of the sm100 grouped kernels
SM100_MAX = 2**30


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


def sm100_kernel_name(config: str) -> str:
  """The C++ kernel-table name of an sm100 grouped block-scaled config (:data:`SM100_CONFIGS`)."""
  return f"sm100_grouped_{config}"


def select_sm100_config(problem: GroupedProblem, sm_count: int) -> str:
  """The sm100 grouped config for a problem: the 2-SM one (256-row MMAs over an SM pair) when
  the experts holding rows average more than 128 of them (M / min(G, M)) and their 256-row
  tiles fill the SM pairs at least once (as ``mx.select_config`` for one GEMM), else 1-SM.
  A first rule, never measured: there is no Blackwell GPU here."""
  one, two = SM100_CONFIGS[problem.fmt]
  slots = max(min(problem.g, problem.m), 1)
  avg = problem.m / slots
  tiles_2sm = -(-problem.m // 256) * -(-problem.n // 128)
  return two if avg > 128 and tiles_2sm >= max(1, sm_count // 2) else one


def sm100_unsupported(problem: GroupedProblem, out_align: int):
  """Why the sm100 grouped block-scaled kernel cannot multiply the problem (a sentence), or None.
  ``out_align``: the output's 16-byte row in elements (8 bfloat16, 4 float32)."""
  if problem.fmt not in SM100_CONFIGS:
    return (f"no sm_100a grouped kernel for {problem.fmt} expert weights (sm_100a grouped kernels: "
            f"{', '.join(SM100_CONFIGS)})")
  if problem.k % SM100_K_ALIGN:
    return (f"the sm_100a grouped kernels need K (the stored contraction length) a multiple of "
            f"{SM100_K_ALIGN} (the scale block; 16-byte rows of FP4 operands), got {problem.k}")
  if problem.n % out_align:
    return (f"the sm_100a grouped kernels need N a multiple of {out_align} for this output dtype "
            f"(16-byte output rows), got {problem.n}")
  if max(problem.m, problem.n, problem.k, problem.g) >= SM100_MAX:
    return f"the sm_100a grouped kernels take M, N, K and G below 2**30, got {problem}"
  return None


def sm100_workspace_bound(m: int, g: int, k: int, vec: int) -> int:
  """Bytes of the activations' re-laid scale factors in the sm100 grouped kernels' workspace
  (from M, G and K only: at most ceil(M / 128) + min(G, M) atoms of 128 rows, each
  ceil(K / vec / 4) x 512 bytes); the kernel adds its per-expert arrays and TMA descriptors."""
  atoms = -(-m // 128) + min(g, m)
  return atoms * (-(-(k // vec) // 4)) * 512


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
  """The weight-streaming config, from the rows per expert that uniform routing gives:

  * G / 2 <= M <= 2 G (one or two rows on each expert that has any): the bulk-copy kernel with
    8-token CTAs (``stream_bulk_16x8_kw4``);
  * M > 2 G: the register-ring kernel with 16-token CTAs and 4 warps along K;
  * M < G / 2 (a few experts of many hold a row): 8-token CTAs, with 8 warps along K while the
    expert slots give at most two CTAs per SM, else 4.

  Measured per grouped GEMM on an H100 (``benchmarks/grouped_stream_configs.py``, fp8_channel
  experts of the four MoE presets at 1, 16 and 64 tokens). At one or two rows per expert the
  bulk kernel took 0.68-0.95x the time of the register ring's 16-token CTAs (Qwen3-30B-A3B
  gate/up at 16 tokens: 136.7 against 202.3 µs; gpt-oss-20b gate/up 224.6 against 248.1;
  DeepSeek-V3 down at 64 tokens 217.5 against 233.1). From four rows per expert it gained up
  to 13% in some cells and lost up to 25% in others (Mixtral-8x7B at 64 tokens, 16 rows per
  expert: 465.9 against 372.2 µs), so the register ring keeps them; below G / 2 rows (1 token)
  it was not faster everywhere (DeepSeek-V3 down: 40.7 against 23.4 µs). In an earlier run the
  register ring's 16-token CTAs took 0.69-0.93x the time of its 8-token ones from 16 tokens
  (ptxas gives them 166 registers against 194: three CTAs per SM against two) and its 8-warp
  kernels (one CTA per SM) 1.25-1.75x."""
  if 2 * problem.m >= problem.g:
    return "stream_bulk_16x8_kw4" if problem.m <= 2 * problem.g else "stream_16x16_kw4"
  ctas = -(-problem.n // 16) * min(problem.g, problem.m)
  kw = 8 if ctas <= 2 * sm_count else 4
  return f"stream_16x8_kw{kw}"


def takes_prefill(problem: GroupedProblem) -> bool:
  """Whether the experts' format has a prefill kernel for the problem's shape: every FP8 format,
  with N a multiple of 8 (the output's TMA rows). K needs nothing more than every grouped
  kernel's multiple of K_BLOCK: a partial last 128-K block is read as zeros past K."""
  return problem.fmt in PREFILL_KIND and problem.n % 8 == 0


def select_config(problem: GroupedProblem, sm_count: int) -> str:
  """The config for a problem. Experts with a prefill kernel (:func:`takes_prefill`) averaging
  at least PREFILL_MIN_ROWS rows (M / min(G, M)) take CUTLASS's grouped tensor-core kernel, in
  128-row tiles from PREFILL_128_MIN_ROWS and 64-row ping-pong tiles below; everything else
  streams the weights (:func:`stream_config`). The 128-row threshold was measured (above). The
  choice sees M and G only (the group sizes stay on the device), so a skewed routing whose hot
  expert holds many rows still streams when the average is small."""
  avg = problem.m / max(min(problem.g, problem.m), 1)
  if takes_prefill(problem) and avg >= PREFILL_MIN_ROWS:
    # (128-row tiles, 64-row tiles) of the format's prefill kind
    big, small = tuple(BF16_PREFILL_CONFIGS if PREFILL_KIND[problem.fmt] == "bf16" else PREFILL_CONFIGS)
    return big if avg >= PREFILL_128_MIN_ROWS else small
  return stream_config(problem, sm_count)


def packed_takes_bf16(problem: GroupedProblem, x_is_float: bool) -> bool:
  """Whether FP4 / FP6 experts (a PackedWeight) take the exact bfloat16 route at prefill instead
  of the grouped weight-only kernel: formats whose elements times their block scales are exact
  in bfloat16 (:data:`WEIGHTONLY_BF16_FORMATS`; the kernel applies the global scales to the
  float32 sums), a float x (an FP8 x with its own scale stays on the weight-only kernel, which
  applies that scale in float32), and experts averaging at least WEIGHTONLY_BF16_MIN_ROWS rows:
  the route first writes every expert's weights out in bfloat16, a cost that only many tokens
  per expert repay."""
  avg = problem.m / max(min(problem.g, problem.m), 1)
  return problem.fmt in WEIGHTONLY_BF16_FORMATS and x_is_float and avg >= WEIGHTONLY_BF16_MIN_ROWS


def is_prefill(config: str) -> bool:
  return config in PREFILL_CONFIGS or config in BF16_PREFILL_CONFIGS


def kernel_kind(fmt: str, config: str) -> str:
  """The scale kind whose kernel runs a config for experts of a format: the prefill kernels'
  (:data:`PREFILL_KIND`) for a prefill config, else the format's streaming kind."""
  return PREFILL_KIND[fmt] if is_prefill(config) else KINDS[fmt]
