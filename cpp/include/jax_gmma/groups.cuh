// jax-gmma: the expert bookkeeping of the grouped (mixture-of-experts) streaming kernels
// (cpp/include/jax_gmma/fp8_stream.cuh for FP8 experts, cpp/include/jax_gmma/weightonly_common.cuh
// for FP4 / FP6 experts): which expert a CTA's slot multiplies, read from the group sizes on the
// device, and the rows no expert holds.
//
// A holds the tokens sorted by expert: expert e takes rows [start_e, end_e) with end = cumsum of
// group_sizes (G,) and start_e = end_e - size_e, in the rows' global numbering; A's row 0 is
// global row row_ids[0] (a shard of the rows under jax.jit's partitioning: contiguous). B holds
// the G experts' weights back to back, each with its scales and bias row. The group sizes stay
// on the device: each CTA reads them itself.
//
// Grid: x = the kernel's column tiles of N, y = slots 0 .. min(G, M) - 1 and one last "fill"
// slot. Slot s takes the s-th non-empty expert with rows in this shard (never more than
// min(G, M) of them) and runs its token tiles one after another with the expert's weights; the
// slots without an expert return at once, so empty experts cost nothing but that. The fill slot
// writes the rows past the groups' total (zeros, as jax.lax.ragged_dot). A negative group size
// (whose overlapping groups jax.lax.ragged_dot sums) is not multiplied: the fill slot writes NaN
// to every row and no expert runs, so the result is detectably invalid, never plausible and
// wrong.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace jax_gmma::groups {

struct Groups {
  const int32_t* sizes;    // (G,) int32
  const int32_t* row_ids;  // row_ids[0]: global index of A's row 0
  int64_t count;           // G
};

// The grid's slot rows for M rows of A (one per possible expert, plus the fill slot).
inline int64_t slots(const Groups& gr, int64_t m) { return std::min(gr.count, m) + 1; }

struct Slot {
  int64_t expert;      // -1: none
  int64_t begin, end;  // its global rows
  int64_t total;       // sum of the group sizes
  bool negative;       // some group size < 0
  int64_t live;        // experts with rows in [r0, r0 + m): the slots that hold one
};

// The slot-th non-empty expert with rows in [r0, r0 + m), computed by each warp on its own (the
// same result in every warp, no shared memory): 32 sizes per round, a warp prefix sum. Also the
// sizes' total, whether one is negative, and how many experts have rows in [r0, r0 + m).
__device__ inline Slot find_slot(const Groups& gr, int64_t r0, int64_t m, int64_t slot) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  const int lane = threadIdx.x & 31;
  Slot s{-1, 0, 0, 0, false, 0};
  int64_t base = 0;  // rows of the experts before this round
  int64_t left = slot;
  bool negative = false;
  for (int64_t c = 0; c < gr.count; c += 32) {
    const int64_t e = c + lane;
    const int64_t size = e < gr.count ? static_cast<int64_t>(__ldg(gr.sizes + e)) : 0;
    negative |= size < 0;
    int64_t incl = size;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t v = __shfl_up_sync(kAll, incl, d);
      if (lane >= d) incl += v;
    }
    const int64_t end = base + incl, begin = end - size;
    unsigned live = __ballot_sync(kAll, size > 0 && end > r0 && begin < r0 + m);
    s.live += __popc(live);
    if (s.expert < 0) {  // warp-uniform
      const int found = __popc(live);
      if (left < found) {
        for (int64_t i = 0; i < left; ++i) live &= live - 1;
        const int pos = __ffs(live) - 1;
        s.expert = c + pos;
        s.begin = __shfl_sync(kAll, begin, pos);
        s.end = __shfl_sync(kAll, end, pos);
      } else {
        left -= found;
      }
    }
    base += __shfl_sync(kAll, incl, 31);
  }
  s.total = base;
  s.negative = __any_sync(kAll, negative);
  return s;
}

// The fill slot's work for the CTA's kCols columns [col0, col0 + kCols) of D (M, N) row-major:
// zeros in the rows past the groups' total, or NaN in every row when a group size is negative.
template <int kCols, typename T, class FromFloat>
__device__ __forceinline__ void fill_rows(T* d, int64_t n, int64_t m, int64_t col0, const Slot& s,
                                          int64_t r0, FromFloat&& from_float) {
  const int64_t from = s.negative ? 0 : min(max(s.total - r0, int64_t{0}), m);
  const int live = static_cast<int>(min(static_cast<int64_t>(kCols), n - col0));
  const T v = from_float(s.negative ? __int_as_float(0x7FC00000) : 0.f);
  for (int64_t e = threadIdx.x; e < (m - from) * kCols; e += blockDim.x) {
    const int c = static_cast<int>(e % kCols);
    if (c < live) d[(from + e / kCols) * n + col0 + c] = v;
  }
}

}  // namespace jax_gmma::groups
