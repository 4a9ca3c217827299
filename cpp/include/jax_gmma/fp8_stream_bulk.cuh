// jax-gmma: the grouped (mixture-of-experts) FP8 weight-streaming kernel with the weights staged
// in shared memory by TMA bulk copies ("grouped_*_stream_bulk_*" configs of
// cpp/sm90_fp8_gemm_grouped_stream.cu). The math is fp8_stream.cuh's: the same fragments, the
// same MMAs and per-group scaling (mma_step / mma_blocks, scale policy S), the same warp for
// every K step and for the K % 128 tail, the same warp-ordered reduction, so the results equal
// grouped_stream_kernel's bit for bit. What differs is how the weights arrive and how CTAs take
// work:
//
//  * Persistent CTAs (kBulkCtasPerSm per SM, never more than the work items) over work items
//    (expert slot, 16-row strip of N), slot-major (an expert's strips adjacent), each CTA one
//    contiguous range of them (it reads the group sizes once per slot it meets). The items are
//    those of the live slots (groups::Slot::live: the experts with rows in this shard, counted
//    on the device) and then one fill item per strip: the rows past the groups' total, exactly
//    as grouped_stream_kernel's fill slot (zeros; NaN everywhere when a group size is negative,
//    and then no expert runs).
//  * Warp WK produces: per stage (kBulkChunkK bytes of K of the strip's 16 rows, fewer in a
//    row's last chunk: K % kBulkChunkK, a multiple of 32) one cp.async.bulk per row, issued by
//    lanes 0 .. 15, into a ring of kBulkStages stages (rows kBulkChunkK + 32 bytes apart: the
//    consumers' 8-byte reads are conflict-free), a full mbarrier per stage (the expected bytes)
//    and an empty one (one arrival per consumer warp). It walks the same items and token tiles
//    as the consumers, so it runs ahead of them across tiles and items: the next strip's first
//    stages load while the current strip's reduction runs. Rows past N read row N - 1, as
//    stream_tile.
//  * Warps 0 .. WK - 1 consume: K step j (128 of K) is warp j % WK's, as in stream_tile (a stage
//    holds kBulkChunkK / 128 steps, a multiple of WK); a warp reads its A fragments from the
//    stage (rows g and g + 8, bytes 8t .. 8t + 7 of each 32-byte block), the tokens and the
//    scales of its next kBulkPre steps ahead in registers (__ldg, as stream_tile); the tail
//    step by warp ksteps % WK from the last stage, exact. Every consumer warp waits for every
//    stage of a tile and frees it, whether it has steps in it or not.
//  * The WK partial sums are added in warp order through shared memory (double-buffered by
//    token tile: one named barrier of the consumer warps per tile), + bias, cast, store.
//
// Dynamic shared memory (above 48 KiB: opted in once per device, bulk_opt_in): the ring, two
// buffers of partial sums and the mbarriers, 103-108 KiB (two CTAs per SM). No workspace, only
// the launch: CUDA-graph safe. The same shape rules as the other streaming kernels (any M, any
// N, K % 32 == 0, operands 16-byte aligned: every row and chunk of a row starts 16-byte aligned).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "jax_gmma/fp8_stream.cuh"
#include "jax_gmma/gemm_api.h"
#include "jax_gmma/groups.cuh"

namespace jax_gmma::fp8_stream {

constexpr int kBulkChunkK = 1024;                      // K bytes of a row per stage
constexpr int kBulkRowStride = kBulkChunkK + 32;       // a stage's rows in shared memory
constexpr int kBulkStageBytes = 16 * kBulkRowStride;   // one stage: the strip's 16 rows
constexpr int kBulkStages = 6;                         // 96 KiB of weights in flight per CTA
constexpr int kBulkCtasPerSm = 2;
constexpr int kBulkPre = 2;                            // tokens and scales, steps ahead per warp

// The partial sums of one token tile: [WK][NT * 8 tokens][16 rows] floats.
template <int NT, int WK>
constexpr int bulk_red_floats() {
  return WK * NT * 8 * 16;
}
template <int NT, int WK>
constexpr int bulk_smem_bytes() {
  return kBulkStages * kBulkStageBytes + 2 * bulk_red_floats<NT, WK>() * 4 + 2 * kBulkStages * 8;
}
static_assert(kBulkChunkK % kStepK == 0 && kBulkStageBytes % 16 == 0, "16-byte aligned bulk copies");
static_assert(kBulkCtasPerSm * (bulk_smem_bytes<2, 4>() + 1024) <= 228 * 1024,
              "two CTAs of the 16-token kernel share an SM's 228 KiB");

__device__ __forceinline__ uint2 lds8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];"
               : "=r"(v.x), "=r"(v.y)
               : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))));
  return v;
}

// The consumer warps' barrier (named barrier 1; barrier 0 is __syncthreads).
template <int WK>
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(WK * 32) : "memory");
}

// The ring's position: stage and the parity of its current use.
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kBulkStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

using BulkBarrier = cutlass::arch::ClusterBarrier;
using BulkTxBarrier = cutlass::arch::ClusterTransactionBarrier;

// Producer warp: the chunks of one token tile, weight rows row0 .. row0 + 15 of o.b (the expert).
__device__ __forceinline__ void bulk_produce_tile(const Operands& o, int64_t row0, int64_t nchunks,
                                                  uint8_t* ring, uint64_t* full, uint64_t* empty,
                                                  RingPos& pos) {
  const int lane = threadIdx.x & 31;
  const uint8_t* wrow = o.b + min(row0 + (lane & 15), o.n - 1) * o.k;
  for (int64_t c = 0; c < nchunks; ++c) {
    const uint32_t bytes = static_cast<uint32_t>(min(static_cast<int64_t>(kBulkChunkK), o.k - c * kBulkChunkK));
    BulkBarrier::wait(&empty[pos.stage], pos.phase ^ 1);  // freed by every consumer warp
    if (lane == 0) BulkTxBarrier::arrive_and_expect_tx(&full[pos.stage], 16 * bytes);
    __syncwarp();
    if (lane < 16)
      cute::SM90_BULK_COPY_G2S::copy(wrow + c * kBulkChunkK, &full[pos.stage],
                                     ring + pos.stage * kBulkStageBytes + lane * kBulkRowStride,
                                     static_cast<int32_t>(bytes));
    pos.advance();
  }
}

// Consumer warps: one token tile (stream_tile's math, the weights from the ring), reduced in
// warp order through red ([WK][NT * 8][16] floats) and stored.
template <class S, int NT, int WK, typename OutT>
__device__ __forceinline__ void bulk_consume_tile(const Params<S>& p, int64_t row0, int64_t tok0,
                                                  int64_t nchunks, const uint8_t* ring, uint64_t* full,
                                                  uint64_t* empty, RingPos& pos, float* red) {
  constexpr int kStepsPerChunk = kBulkChunkK / kStepK;
  constexpr int kQ = kStepsPerChunk / WK;  // a warp's steps in a whole stage
  static_assert(kStepsPerChunk % WK == 0, "a stage holds the same number of steps for every warp");
  static_assert(kQ % kBulkPre == 0, "the token ring's slots are compile-time per stage");
  const Operands& o = p.o;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kblocks = o.k / 32;
  const int64_t ksteps = kblocks / 4;
  const int tail = static_cast<int>(kblocks % 4);
  int64_t rows[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) rows[r] = min(row0 + g + 8 * r, o.n - 1);
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

  // K step j's tokens (first nb blocks) and token scales, as stream_tile's load_x.
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
  // The A fragments of the step at byte off of the stage (first nb blocks) and the rows' scales.
  auto load_w = [&](const uint8_t* stage, int64_t off, WStep<S>& w, int nb) {
    const uint8_t* a = stage + g * kBulkRowStride + off + 8 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w.w[r][b] = b < nb ? lds8(a + r * 8 * kBulkRowStride + 32 * b) : make_uint2(0u, 0u);
  };

  // This warp's whole steps i = 0 .. nsteps - 1 (K step warp + i WK, in stage i / kQ): tokens
  // and scales kBulkPre steps ahead in a register ring (slot i % kBulkPre).
  struct Pre {
    XStep<S, NT> x;
    typename S::Word ws[2];
  };
  Pre pre[kBulkPre];
  auto load_pre = [&](int64_t i, Pre& q) {
    const int64_t j = warp + i * WK;
    load_x(j, q.x, 4);
#pragma unroll
    for (int r = 0; r < 2; ++r) q.ws[r] = S::load_w(p.s, rows[r], j);
  };
  const int64_t nsteps = warp_ksteps<WK>(ksteps, warp);
#pragma unroll
  for (int u = 0; u < kBulkPre; ++u)
    if (u < nsteps) load_pre(u, pre[u]);
  for (int64_t c = 0; c < nchunks; ++c) {
    BulkBarrier::wait(&full[pos.stage], pos.phase);
    const uint8_t* stage = ring + pos.stage * kBulkStageBytes;
#pragma unroll
    for (int u = 0; u < kQ; ++u) {
      const int64_t i = c * kQ + u;
      if (i < nsteps) {
        Pre& q = pre[u % kBulkPre];
        WStep<S> w;
        load_w(stage, (warp + u * WK) * kStepK, w, 4);
        w.s[0] = q.ws[0];
        w.s[1] = q.ws[1];
        mma_step<S, NT>(acc, w, q.x);
        if (i + kBulkPre < nsteps) load_pre(i + kBulkPre, q);
      }
    }
    // The tail step (K % 128 = 32, 64 or 96), by the warp whose turn it is; exact conversion.
    if (tail && c == nchunks - 1 && warp == ksteps % WK) {
      WStep<S> w;
      XStep<S, NT> x;
      load_w(stage, ksteps * kStepK - c * kBulkChunkK, w, tail);
#pragma unroll
      for (int r = 0; r < 2; ++r) w.s[r] = S::load_w(p.s, rows[r], ksteps);
      load_x(ksteps, x, tail);
      mma_blocks<S, NT, true>(acc, w, x, tail);
    }
    __syncwarp();
    if (lane == 0) BulkBarrier::arrive(&empty[pos.stage]);
    pos.advance();
  }

  // Reduction over the WK warps (fixed order: deterministic), + bias, cast, store.
  constexpr int kCols = NT * 8;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = nt * 8 + 2 * t;
    red[(warp * kCols + col) * 16 + g] = acc[nt][0];
    red[(warp * kCols + col + 1) * 16 + g] = acc[nt][1];
    red[(warp * kCols + col) * 16 + g + 8] = acc[nt][2];
    red[(warp * kCols + col + 1) * 16 + g + 8] = acc[nt][3];
  }
  consumers_sync<WK>();
  const OutT* bias = static_cast<const OutT*>(o.bias);
  OutT* d = static_cast<OutT*>(o.d);
  for (int e = threadIdx.x; e < 16 * kCols; e += WK * 32) {
    const int row = e & 15, col = e >> 4;
    const int64_t tok = tok0 + col, n = row0 + row;
    if (tok >= o.m || n >= o.n) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) sum += red[(w * kCols + col) * 16 + row];
    if (bias) sum += to_float<OutT>(bias[n]);
    d[tok * o.n + n] = from_float<OutT>(sum);
  }
}

template <class S, int NT, int WK, typename OutT>
__global__ void __launch_bounds__((WK + 1) * 32, kBulkCtasPerSm) grouped_bulk_kernel(const GroupedParams<S> gp) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  float* red = reinterpret_cast<float*>(smem + kBulkStages * kBulkStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(red + 2 * bulk_red_floats<NT, WK>());
  uint64_t* empty = full + kBulkStages;
  const int warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kBulkStages; ++st) {
      BulkBarrier::init(&full[st], 1);
      BulkBarrier::init(&empty[st], WK);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier: from here the producer runs ahead

  // Every warp walks the CTA's items on its own (the same slots, the same order).
  const Operands& o = gp.p.o;
  const int64_t r0 = __ldg(gp.groups.row_ids);
  const int64_t strips = (o.n + 15) / 16;
  const int64_t nchunks = (o.k + kBulkChunkK - 1) / kBulkChunkK;
  groups::Slot s = groups::find_slot(gp.groups, r0, o.m, 0);
  int64_t slot = 0;  // s's
  const int64_t live = s.negative ? 0 : s.live;
  const int64_t items = (live + 1) * strips;
  const int64_t first = items * blockIdx.x / gridDim.x, last = items * (blockIdx.x + 1) / gridDim.x;
  RingPos pos;
  int buf = 0;  // the consumers' partial-sum buffer of the next tile
  for (int64_t item = first; item < last; ++item) {
    const int64_t y = item / strips, row0 = (item % strips) * 16;
    if (y == live) {  // the fill items (total and negative are the same in every Slot)
      groups::fill_rows<16>(static_cast<OutT*>(o.d), o.n, o.m, row0, s, r0,
                            [](float v) { return from_float<OutT>(v); });
      continue;
    }
    if (y != slot) {
      s = groups::find_slot(gp.groups, r0, o.m, y);
      slot = y;
    }
    const int64_t lo = max(s.begin - r0, int64_t{0}), hi = min(s.end - r0, o.m);
    Params<S> p = gp.p;
    p.o.m = hi;  // tokens past the expert's rows read its last row and are not stored
    p.o.b = o.b + s.expert * o.n * o.k;
    if (o.bias) p.o.bias = static_cast<const OutT*>(o.bias) + s.expert * o.n;
    p.s = expert_scales(gp.p.s, s.expert);
    for (int64_t tok0 = lo; tok0 < hi; tok0 += NT * 8) {
      if (warp == WK) {
        bulk_produce_tile(p.o, row0, nchunks, ring, full, empty, pos);
      } else {
        bulk_consume_tile<S, NT, WK, OutT>(p, row0, tok0, nchunks, ring, full, empty, pos,
                                           red + buf * bulk_red_floats<NT, WK>());
        buf ^= 1;
      }
    }
  }
}

// Host: the dynamic shared memory above 48 KiB needs a per-device opt-in (cudaFuncSetAttribute:
// not a stream operation; the device from cudaGetDevice, which capture allows). The kernel
// table's prepare (run for every device before any capture) and every launch call it; it sets
// the attributes once per device.
template <class S, int NT, int WK, typename OutT>
cudaError_t bulk_opt_in() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(grouped_bulk_kernel<S, NT, WK, OutT>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bulk_smem_bytes<NT, WK>());
  // the largest shared-memory carveout: room for kBulkCtasPerSm CTAs
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(grouped_bulk_kernel<S, NT, WK, OutT>,
                             cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return e;
}

// Enqueues the kernel (G >= 1 experts) on min(work items, kBulkCtasPerSm x sms) CTAs; the
// alignment rules of launch_grouped (16-byte operands: with K % 32 == 0 every bulk copy's source
// is 16-byte aligned).
template <class S, int NT, int WK, typename OutT>
cudaError_t launch_grouped_bulk(const GroupedParams<S>& gp, uintptr_t scale_ptrs, int sms, cudaStream_t stream) {
  if (((reinterpret_cast<uintptr_t>(gp.p.o.a) | reinterpret_cast<uintptr_t>(gp.p.o.b) | scale_ptrs) % 16) != 0)
    return cudaErrorMisalignedAddress;
  if (gp.groups.count < 1 || !gp.groups.sizes || !gp.groups.row_ids || sms < 1) return cudaErrorInvalidValue;
  const int64_t items = groups::slots(gp.groups, gp.p.o.m) * ((gp.p.o.n + 15) / 16);
  const int64_t ctas = items < int64_t{kBulkCtasPerSm} * sms ? items : int64_t{kBulkCtasPerSm} * sms;
  if (cudaError_t e = bulk_opt_in<S, NT, WK, OutT>(); e != cudaSuccess) return e;
  grouped_bulk_kernel<S, NT, WK, OutT>
      <<<static_cast<unsigned>(ctas), (WK + 1) * 32, bulk_smem_bytes<NT, WK>(), stream>>>(gp);
  return cudaGetLastError();
}

// A bulk kernel's kernel-table row (e4m3 x e4m3 -> d, no workspace, WK + 1 warps, the
// shared-memory opt-in as its per-device preparation).
template <class S, int NT, int WK, typename OutT>
KernelEntry bulk_table_row(const char* name, DType d, const char* (*can_implement)(const GemmArgs&),
                           cudaError_t (*run)(const GemmArgs&, cudaStream_t)) {
  return KernelEntry{name, DType::kF8E4M3, DType::kF8E4M3, d, can_implement, &no_workspace,
                     &bulk_opt_in<S, NT, WK, OutT>, run, bulk_smem_bytes<NT, WK>(), (WK + 1) * 32, 90};
}

}  // namespace jax_gmma::fp8_stream
