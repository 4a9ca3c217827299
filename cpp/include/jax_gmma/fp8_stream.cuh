// jax-gmma: the FP8 x FP8 weight-streaming kernel of Hopper (sm_90a), shared by the families
// that multiply e4m3 tokens by e4m3 weights with scales along K: the dense decode kernels of
// cpp/sm90_mxf8_gemm_blockscaled_stream.cu (MXFP8: E8M0 scale per 32 of K) and
// cpp/sm90_fp8_gemm_blockwise_stream.cu (float32 scale per 128 of K: 1x128 tokens, 128x128 or
// 1x128 weights), and the grouped (mixture-of-experts) kernel of
// cpp/sm90_fp8_gemm_grouped_stream.cu (below: an expert's token tiles per CTA). A family
// supplies a scale policy S (cpp/include/jax_gmma/fp8_stream_scales.cuh); everything else is
// this file.
//
//   D[m, n] = sum_g  sa[m, g] * sb[n, g] * sum_{k in scale group g} A[m, k] * B[n, k]  (+ bias[n])
//
//  * "Swap AB": 16 weight rows are the A operand of mma.sync.m16n8k32 (e4m3 x e4m3 -> f32),
//    8 tokens its B. No conversion: the fp8 bytes are the fragments. A lane (g, t) -- g = lane
//    / 4, t = lane % 4 -- loads 8 contiguous bytes of rows g and g + 8 per 32-K block (K 8t ..
//    8t + 7 of the block; the K order inside a block is free as long as A and B agree), and the
//    same 8 bytes of token g's row: every load is whole 32-byte sectors.
//  * Per scale group (S::kGroup 32-K blocks) the MMAs accumulate into a fresh fragment on the
//    tensor core, then acc += (sb[row] * sa[token]) * part in float32: every scale is applied
//    exactly once per group (one rounding per group).
//  * CTA = WK warps on one 16-row strip, splitting K (interleaved 128-K steps, a last step of
//    1-3 blocks of 32 when K % 128 != 0); each warp keeps its next two steps' weights in
//    registers; a shared-memory reduction over the WK warps (fixed order: deterministic) ends
//    in a direct epilogue (+ bias, cast). Any M, any N (the last strip's rows past N are
//    computed, not stored), K % 32 == 0. No workspace, only the launch: CUDA-graph safe.
//
// Scale policy S:
//   using Args;                         // the scale operands (kernel parameters)
//   using Word;                         // one row's (or token's) scales of a 128-K step
//   static constexpr int kGroup;        // 32-K blocks per scale: 1 (MX) or 4 (128 of K)
//   static constexpr bool kSpecial;     // some words need the exact conversion (warp vote)
//   __device__ static Word load_w(const Args&, int64_t row, int64_t step);
//   __device__ static Word load_x(const Args&, int64_t token, int64_t step);
//   template <bool kExact> __device__ static float scale(Word, int group);
//   __device__ static uint32_t special(Word);   // nonzero: this step takes the exact path
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/gemm_api.h"
#include "jax_gmma/groups.cuh"
#include "jax_gmma/weightonly_common.cuh"

namespace jax_gmma::fp8_stream {

using wo_detail::from_float;
using wo_detail::ld_stream8;
using wo_detail::ring_k_loop;
using wo_detail::to_float;
using wo_detail::warp_ksteps;

constexpr int kStepK = 128;  // one K step: four 32-K blocks
constexpr int kDepth = 2;    // weight steps in flight per warp (4 KiB per warp)

struct Operands {
  int64_t m, n, k;
  const uint8_t* a;  // (M, K) tokens
  const uint8_t* b;  // (N, K) weights
  const void* bias;
  void* d;
};

template <class S>
struct Params {
  Operands o;
  typename S::Args s;
};

// c += A B (float32 accumulators).
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld_u32_nc(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// One warp's weights of a K step: rows g / g + 8, four blocks of 8 bytes, and the rows' scales.
template <class S>
struct WStep {
  uint2 w[2][4];
  typename S::Word s[2];
};
// One warp's tokens of a K step: per 8-token tile, token g's four 8-byte pieces and the scales
// of tokens 2t, 2t + 1 (the columns of the lane's accumulator fragment).
template <class S, int NT>
struct XStep {
  uint2 x[NT][4];
  typename S::Word s[NT][2];
};

// K step math shared by the streaming kernels (stream_tile below, the bulk-copy ring of
// cpp/include/jax_gmma/fp8_stream_bulk.cuh): the step's first nb blocks (nb = 4 but in the tail
// step), per scale group into a fresh fragment, then acc += (sb * sa) * part. The tail step's
// scales are those of its (partial) last group.
template <class S, int NT, bool kExact>
__device__ __forceinline__ void mma_blocks(float (&acc)[NT][4], const WStep<S>& w, const XStep<S, NT>& x,
                                           int nb) {
#pragma unroll
  for (int grp = 0; grp < 4 / S::kGroup; ++grp) {
    const int b0 = grp * S::kGroup;
    if (b0 >= nb) break;
    const float f0 = S::template scale<kExact>(w.s[0], grp);
    const float f1 = S::template scale<kExact>(w.s[1], grp);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int b = b0; b < b0 + S::kGroup; ++b)
        if (b < nb)
          mma_e4m3(part, w.w[0][b].x, w.w[1][b].x, w.w[0][b].y, w.w[1][b].y, x.x[nt][b].x,
                   x.x[nt][b].y);
      const float e0 = S::template scale<kExact>(x.s[nt][0], grp);
      const float e1 = S::template scale<kExact>(x.s[nt][1], grp);
      acc[nt][0] = fmaf(part[0], f0 * e0, acc[nt][0]);
      acc[nt][1] = fmaf(part[1], f0 * e1, acc[nt][1]);
      acc[nt][2] = fmaf(part[2], f1 * e0, acc[nt][2]);
      acc[nt][3] = fmaf(part[3], f1 * e1, acc[nt][3]);
    }
  }
}

// A whole K step: the fast scale conversion unless a scale of the step needs the exact one.
template <class S, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[NT][4], const WStep<S>& w, const XStep<S, NT>& x) {
  if constexpr (S::kSpecial) {
    uint32_t sp = S::special(w.s[0]) | S::special(w.s[1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sp |= S::special(x.s[nt][0]) | S::special(x.s[nt][1]);
    // One path for the whole warp: mma.sync needs every lane (a per-lane choice between two
    // copies of the MMAs hung the GPU on a step where only some lanes needed the exact one).
    if (!__any_sync(0xFFFFFFFFu, sp != 0))
      mma_blocks<S, NT, false>(acc, w, x, 4);
    else
      mma_blocks<S, NT, true>(acc, w, x, 4);
  } else {
    mma_blocks<S, NT, false>(acc, w, x, 4);
  }
}

// One CTA's tile: weight rows row0 .. row0 + 15 times tokens tok0 .. tok0 + NT * 8 - 1 (those
// below o.m stored). Shared by the dense kernel (one tile per CTA) and the grouped one (an
// expert's token tiles in turn; the caller separates two tiles with __syncthreads()).
template <class S, int NT, int WK, typename OutT>
__device__ __forceinline__ void stream_tile(const Params<S>& p, const int64_t row0, const int64_t tok0) {
  const Operands& o = p.o;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kblocks = o.k / 32;
  const int64_t ksteps = kblocks / 4;              // whole 128-K steps
  const int tail = static_cast<int>(kblocks % 4);  // 32-K blocks after them
  // Rows past N (the last strip when N % 16 != 0) and tokens past M read row N - 1 / M - 1:
  // computed, never stored.
  int64_t rows[2];
  const uint8_t* wrow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = min(row0 + g + 8 * r, o.n - 1);
    wrow[r] = o.b + rows[r] * o.k + 8 * t;
  }
  const uint8_t* xrow[NT];
  int64_t xs_row[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    xrow[nt] = o.a + min(tok0 + nt * 8 + g, o.m - 1) * o.k + 8 * t;
#pragma unroll
    for (int c = 0; c < 2; ++c) xs_row[nt][c] = min(tok0 + nt * 8 + 2 * t + c, o.m - 1);
  }

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  // K step j's first nb blocks (nb = 4 but in the tail step); the scales of the tail step are
  // those of its (partial) last group.
  auto load_w = [&](int64_t j, WStep<S>& w, int nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w.w[r][b] = b < nb ? ld_stream8(wrow[r] + j * kStepK + 32 * b) : make_uint2(0u, 0u);
      w.s[r] = S::load_w(p.s, rows[r], j);
    }
  };
  auto load_x = [&](int64_t j, XStep<S, NT>& x, int nb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        x.x[nt][b] = b < nb ? __ldg(reinterpret_cast<const uint2*>(xrow[nt] + j * kStepK + 32 * b))
                            : make_uint2(0u, 0u);
#pragma unroll
      for (int c = 0; c < 2; ++c) x.s[nt][c] = S::load_x(p.s, xs_row[nt][c], j);
    }
  };

  // The whole steps: this warp's are warp, warp + WK, ...; weights kDepth steps ahead in a
  // register ring, activations one step ahead.
  const int64_t nsteps = warp_ksteps<WK>(ksteps, warp);
  WStep<S> wr[kDepth];
  XStep<S, NT> xr[2];
#pragma unroll
  for (int u = 0; u < kDepth; ++u)
    if (u < nsteps) load_w(warp + u * WK, wr[u], 4);
  if (nsteps > 0) load_x(warp, xr[0], 4);
  auto step = [&](int u) { mma_step<S, NT>(acc, wr[u], xr[u & 1]); };
  ring_k_loop<kDepth>(
      nsteps, [&](int64_t i, int slot) { load_x(warp + i * WK, xr[slot], 4); }, step,
      [&](int64_t i, int slot) { load_w(warp + i * WK, wr[slot], 4); });
  // The tail step (K % 128 = 32, 64 or 96), by the warp whose turn it is; exact conversion.
  if (tail && warp == ksteps % WK) {
    load_w(ksteps, wr[0], tail);
    load_x(ksteps, xr[0], tail);
    mma_blocks<S, NT, true>(acc, wr[0], xr[0], tail);
  }

  // Reduction over the WK warps (fixed order: deterministic), + bias, cast, store.
  constexpr int kCols = NT * 8;
  __shared__ float red[WK][kCols][16];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = nt * 8 + 2 * t;
    red[warp][col][g] = acc[nt][0];
    red[warp][col + 1][g] = acc[nt][1];
    red[warp][col][g + 8] = acc[nt][2];
    red[warp][col + 1][g + 8] = acc[nt][3];
  }
  __syncthreads();
  const OutT* bias = static_cast<const OutT*>(o.bias);
  OutT* d = static_cast<OutT*>(o.d);
  for (int e = threadIdx.x; e < 16 * kCols; e += WK * 32) {
    const int row = e & 15, col = e >> 4;
    const int64_t tok = tok0 + col, n = row0 + row;
    if (tok >= o.m || n >= o.n) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) sum += red[w][col][row];
    if (bias) sum += to_float<OutT>(bias[n]);
    d[tok * o.n + n] = from_float<OutT>(sum);
  }
}

template <class S, int NT, int WK, typename OutT>
__global__ void __launch_bounds__(WK * 32) stream_kernel(const Params<S> p) {
  stream_tile<S, NT, WK, OutT>(p, static_cast<int64_t>(blockIdx.x) * 16,
                               static_cast<int64_t>(blockIdx.y) * (NT * 8));
}

// ---- Grouped (mixture-of-experts) GEMM: the expert slots of cpp/include/jax_gmma/groups.cuh,
// 16-row strips of N on the grid's x, each slot's expert's token tiles in turn.
// The scale operands of expert e: every policy's Args has sb (the weight scales) and sb_expert
// (the distance between two experts' weight scales, in elements of sb).
template <class Args>
__device__ __forceinline__ Args expert_scales(const Args& s, int64_t e) {
  Args r = s;
  r.sb += e * s.sb_expert;
  return r;
}

template <class S>
struct GroupedParams {
  Params<S> p;  // o.m: A's rows; o.b, o.bias, s: expert 0's
  groups::Groups groups;
};

template <class S, int NT, int WK, typename OutT>
__global__ void __launch_bounds__(WK * 32) grouped_stream_kernel(const GroupedParams<S> gp) {
  const Operands& o = gp.p.o;
  const int64_t r0 = __ldg(gp.groups.row_ids);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16;
  const bool fill = blockIdx.y == gridDim.y - 1;
  const groups::Slot s = groups::find_slot(gp.groups, r0, o.m, fill ? 0 : blockIdx.y);
  if (fill) {
    groups::fill_rows<16>(static_cast<OutT*>(o.d), o.n, o.m, row0, s, r0,
                          [](float v) { return from_float<OutT>(v); });
    return;
  }
  if (s.negative || s.expert < 0) return;
  const int64_t lo = max(s.begin - r0, int64_t{0}), hi = min(s.end - r0, o.m);
  Params<S> p = gp.p;
  p.o.m = hi;  // tokens past the expert's rows read its last row and are not stored
  p.o.b = o.b + s.expert * o.n * o.k;
  if (o.bias) p.o.bias = static_cast<const OutT*>(o.bias) + s.expert * o.n;
  p.s = expert_scales(gp.p.s, s.expert);
  for (int64_t tok0 = lo; tok0 < hi; tok0 += NT * 8) {
    stream_tile<S, NT, WK, OutT>(p, row0, tok0);
    __syncthreads();  // the next tile reuses the reduction's shared memory
  }
}

// The shape rules every policy shares (K % 32, sizes, the grid); nullptr when they hold.
inline const char* can_implement_common(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return "M, N and K must be positive";
  if (k % 32) return "K must be a multiple of 32 (the streaming kernel's 32-K blocks)";
  if (m > INT32_MAX / 2 || n > INT32_MAX / 2 || k > INT32_MAX / 2) return "M, N and K must be below 2^30";
  if ((m + 7) / 8 > 65535) return "M must be at most 524280 (8-token tiles on the grid's y)";
  return nullptr;
}

// Enqueues the kernel; the operands' 16-byte alignment is checked here (8-byte operand loads:
// K % 32 == 0 keeps every row 32-byte aligned from a 16-byte base).
template <class S, int NT, int WK, typename OutT>
cudaError_t launch(const Params<S>& p, uintptr_t scale_ptrs, cudaStream_t stream) {
  if (((reinterpret_cast<uintptr_t>(p.o.a) | reinterpret_cast<uintptr_t>(p.o.b) | scale_ptrs) % 16) != 0)
    return cudaErrorMisalignedAddress;
  const int64_t ytiles = (p.o.m + NT * 8 - 1) / (NT * 8);
  if (ytiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((p.o.n + 15) / 16), static_cast<unsigned>(ytiles));
  stream_kernel<S, NT, WK, OutT><<<grid, WK * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

// Enqueues the grouped kernel (G >= 1 experts); the alignment rules of launch().
template <class S, int NT, int WK, typename OutT>
cudaError_t launch_grouped(const GroupedParams<S>& gp, uintptr_t scale_ptrs, cudaStream_t stream) {
  if (((reinterpret_cast<uintptr_t>(gp.p.o.a) | reinterpret_cast<uintptr_t>(gp.p.o.b) | scale_ptrs) % 16) != 0)
    return cudaErrorMisalignedAddress;
  if (gp.groups.count < 1 || !gp.groups.sizes || !gp.groups.row_ids) return cudaErrorInvalidValue;
  const int64_t slots = groups::slots(gp.groups, gp.p.o.m);
  if (slots > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((gp.p.o.n + 15) / 16), static_cast<unsigned>(slots));
  grouped_stream_kernel<S, NT, WK, OutT><<<grid, WK * 32, 0, stream>>>(gp);
  return cudaGetLastError();
}

inline size_t no_workspace(const GemmArgs&) { return 0; }
inline cudaError_t nothing_to_prepare() { return cudaSuccess; }  // static shared memory only

// A streaming kernel's kernel-table row (e4m3 x e4m3 -> d, no workspace, WK warps).
inline KernelEntry table_row(const char* name, DType d, const char* (*can_implement)(const GemmArgs&),
                             cudaError_t (*run)(const GemmArgs&, cudaStream_t), int warps) {
  return KernelEntry{name, DType::kF8E4M3, DType::kF8E4M3, d, can_implement, &no_workspace,
                     &nothing_to_prepare, run, 0, warps * 32, 90};
}

}  // namespace jax_gmma::fp8_stream
