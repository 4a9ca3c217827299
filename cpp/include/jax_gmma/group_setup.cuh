// jax-gmma: device helpers of the grouped (mixture-of-experts) setup kernels that run before
// CUTLASS's grouped GEMMs (cpp/sm90_fp8_gemm_grouped_blockwise.cu, Hopper block-scaled FP8;
// cpp/sm100_mx_gemm_grouped_blockscaled.cu, Blackwell block-scaled): the group sizes' total and
// sign, a CTA-wide prefix sum over the experts, and the rows of D past the groups' total. The
// group sizes are read on the device only (CUDA-graph safe).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace jax_gmma::group_setup {

// Sum and "any negative" of the group sizes, the same in every thread of the CTA (kThreads).
template <int kThreads>
__device__ inline void group_total(const int32_t* sizes, int64_t groups, int64_t* total, bool* negative) {
  __shared__ int64_t warp_sum[kThreads / 32];
  int64_t sum = 0;
  bool neg = false;
  for (int64_t e = threadIdx.x; e < groups; e += kThreads) {
    const int64_t v = __ldg(sizes + e);
    sum += v;
    neg |= v < 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, d);
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = sum;
  *negative = __syncthreads_or(neg) != 0;  // also orders the warp sums
  int64_t t = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) t += warp_sum[w];
  *total = t;
}

// Inclusive prefix sum over the CTA; *all: the CTA's total. Ends with a barrier (smem reuse).
template <int kThreads>
__device__ inline int64_t block_inclusive_scan(int64_t v, int64_t* all) {
  __shared__ int64_t warp_sum[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t u = __shfl_up_sync(0xFFFFFFFFu, v, d);
    if (lane >= d) v += u;
  }
  if (lane == 31) warp_sum[warp] = v;
  __syncthreads();
  int64_t before = 0, t = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    before += w < warp ? warp_sum[w] : 0;
    t += warp_sum[w];
  }
  __syncthreads();
  *all = t;
  return v + before;
}

// Calls f(e, lo, me) once for every expert e (thread e % kThreads of the CTA, chunk by chunk;
// every thread of the CTA must call it): expert e's rows in this shard are [lo, lo + me) in A's
// numbering (A's row 0 is global row r0, A has m rows), me = 0 for an empty expert, one outside
// the shard, or every expert when a size is negative (no tiles).
template <int kThreads, class F>
__device__ inline void for_each_expert(const int32_t* sizes, int64_t groups, int64_t r0, int64_t m,
                                       bool negative, F&& f) {
  int64_t base = 0;  // rows of the experts before this chunk
  for (int64_t c = 0; c < groups; c += kThreads) {
    const int64_t e = c + threadIdx.x;
    const int64_t size = e < groups ? static_cast<int64_t>(__ldg(sizes + e)) : 0;
    int64_t chunk;
    const int64_t end = base + block_inclusive_scan<kThreads>(size, &chunk);
    const int64_t begin = end - size;
    base += chunk;
    if (e >= groups) continue;
    const int64_t lo = min(max(begin - r0, int64_t{0}), m);
    const int64_t hi = min(max(end - r0, int64_t{0}), m);
    f(e, lo, negative ? int64_t{0} : max(hi - lo, int64_t{0}));
  }
}

// The work of CTAs 1 .. gridDim.x - 1 (CTA 0 writes the per-expert arrays): rows [from, M) of D
// (M, N) row-major, from = the groups' total in this shard's numbering (A's row 0 is global row
// r0), set to zero -- jax.lax.ragged_dot's rows that no expert holds -- or every row set to a
// quiet NaN when a group size is negative. Whole 16-byte vectors: N * sizeof(ElD) % 16 == 0.
template <int kThreads, class ElD>
__device__ inline void fill_rows_past_total(ElD* d, int64_t m, int64_t n, int64_t total, int64_t r0,
                                            bool negative) {
  const int64_t from = negative ? 0 : min(max(total - r0, int64_t{0}), m);
  const int64_t row_vecs = n * static_cast<int64_t>(sizeof(ElD)) / 16;
  uint32_t word = 0;  // zero, or a quiet NaN in every element of the word
  if (negative) word = sizeof(ElD) == 2 ? 0x7FC07FC0u : 0x7FC00000u;
  const uint4 v = make_uint4(word, word, word, word);
  uint4* out = reinterpret_cast<uint4*>(d) + from * row_vecs;
  const int64_t count = (m - from) * row_vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x - 1) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x - 1) * kThreads + threadIdx.x;
  for (int64_t i = first; i < count; i += stride) out[i] = v;
}

}  // namespace jax_gmma::group_setup
