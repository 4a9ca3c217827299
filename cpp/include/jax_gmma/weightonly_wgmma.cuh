// The sm90 weight-only tensor-core kernel (FP4 / FP6 weights x bf16 activations) for batched
// decode, 16 < M <= 128: the same prepared weight layout and per-lane decode as the mma.sync
// decode kernel (weightonly_common.cuh), fed to wgmma instead of mma.sync so that one decoded
// weight fragment multiplies up to 128 tokens at once.
//
//  * Swap AB, as the decode kernel: the weights are wgmma's A operand *from registers*
//    (m64, one 16-row strip per warp of a warp group; a warp's fragment of a k16 slice is
//    exactly the mma.m16n8k16 A fragment the prepared layout already hands each lane), the
//    tokens wgmma's N (32, 64 or 128), their activations B from shared memory.
//  * The prepared layout permutes K inside each 64-K step (lane (g, t) owns K 16t .. 16t + 15,
//    see sm90_fp4_gemm_weightonly.cu); the activations are written to shared memory in the same
//    order: lane t's 32 loaded bytes (K 16t .. 16t + 15 of one token) are eight bf16 pairs,
//    pair i = (slice q = i / 2, half i % 2) going to core-matrix column i of the tile at byte 4t.
//    Tile layout (no swizzle, K-major "interleave"): 8-token x 8-K core matrices of 128 bytes,
//    core matrix (token group r / 8, column c) at (8 (r / 8) + c) 128 bytes; a k16 slice q is
//    columns 2q, 2q + 1 (descriptor start + 256 q, LBO 128, SBO 1024). The stores are
//    conflict-free (a warp covers 8 tokens x 4 lanes t: 32 distinct banks).
//  * CTA = WR x WK warp groups: WR row groups of 64 weight rows (they share the activation
//    tile), WK K phases (interleaved 64-K steps, as the decode kernel's K split). Each K phase
//    streams its weights D steps ahead in registers. The A fragments are double-buffered: step
//    i's wgmmas run while step i + 1 is decoded (wait_group 1).
//  * Activations, dense kernel: x arrives tiled (wo_tc_tiled_x below: per 64-K step, per 8
//    tokens, the 1 KiB that the shared-memory tile holds), so a stage of NT tokens is one
//    contiguous bulk copy (cp.async.bulk, no registers), issued by one thread of the K phase
//    S - 2 steps ahead into a ring of S stages (wo_tc_bulk_stages: 4-6) with a full and an
//    empty mbarrier each (a warp frees a stage once wait_group has retired its wgmmas). With
//    row-major x and a 3-stage ring filled through registers (global -> registers one step
//    ahead -> shared memory, one named barrier per step), the 64-token kernel took 90 us at
//    64 x 28672 x 8192 on an H100, 70 with the activation traffic compiled out.
//    Grouped kernel: row-major x through that register ring (an expert's token tiles start at
//    any row).
//  * End: the K phases' partial sums are added in phase order through shared memory
//    (deterministic), times alpha (2^10 w_global x_scale[m]), plus bias, stored. One launch,
//    no workspace: CUDA-graph safe like the decode kernel.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include "jax_gmma/weightonly_common.cuh"

// Measurement hook of benchmarks/kernels/bench_weightonly_kernel.cu (the library never sets it;
// results are wrong when it is nonzero): bit 1 = the register-ring activations (the grouped
// kernel's) are loaded and stored for the first two steps only (later steps multiply stale
// stages: no L2 activation traffic), bit 2 = the weight ring is filled once (no HBM weight
// traffic after the first D steps).
#ifndef JAX_GMMA_WO_TC_ABLATE
#define JAX_GMMA_WO_TC_ABLATE 0
#endif

namespace jax_gmma {
namespace wo_detail {

// The tensor-core CTA shapes: NT tokens (the wgmma N), WR row groups of 64 rows, WK warp groups
// along K. WoArgs names one by (rows_per_cta = 64 WR, tokens_per_cta = NT, k_warps = 4 WK); the
// tokens (32 or more) tell it from the decode kernel's shapes (8 or 16 tokens).
struct WoTcShape {
  int nt, wr, wk;
  constexpr int rows() const { return 64 * wr; }
  constexpr int threads() const { return 128 * wr * wk; }
};
constexpr WoTcShape kWoTcShapes[] = {
    {32, 1, 4}, {32, 2, 2}, {64, 1, 2}, {64, 2, 1}, {64, 4, 1}, {128, 1, 1}, {128, 2, 1},
    {128, 1, 2}, {64, 1, 4},
};
constexpr int kWoTcShapeCount = static_cast<int>(sizeof(kWoTcShapes) / sizeof(kWoTcShapes[0]));
constexpr int kWoTcStages = 3;
// Stages of the dense kernel's bulk-copy activation ring per K phase (stage i + S - 2 is issued
// at step i): 6, fewer where the CTA's rings would pass 72 KiB (three CTAs of 128 threads share
// an SM's 227 KiB), at least 3.
constexpr int kWoTcBulkStagesMax = 6;

// The shapes built as grouped kernels too: within 256 threads (the grouped slot loop costs
// registers; at 512 threads the tiles spill).
constexpr bool wo_tc_grouped_shape(WoTcShape s) { return s.threads() <= 256 && !(s.nt == 128 && s.wr == 1); }
inline bool wo_tc_grouped_shape_index(int index) {
  return index >= 0 && index < kWoTcShapeCount && wo_tc_grouped_shape(kWoTcShapes[index]);
}

// The K phases' partial sums at the end (phases 1 .. WK - 1; rows padded by 4 floats).
constexpr int wo_tc_red_bytes(WoTcShape s) { return (s.wk - 1) * s.nt * (s.rows() + 4) * 4; }
// The grouped kernel's dynamic shared memory: the activation rings of the WK phases, reused at
// the end for the partial sums. Kept within the 48 KiB that needs no opt-in (no per-device
// function attribute to set).
constexpr int wo_tc_smem_bytes(WoTcShape s) {
  const int ring = s.wk * kWoTcStages * s.nt * 128, red = wo_tc_red_bytes(s);
  return ring > red ? ring : red;
}
// The dense kernel's: the bulk rings, then their full and empty mbarriers (8 bytes each), or
// the partial sums, whichever is larger. Above 48 KiB: opted in per device (TcOptIn).
constexpr int wo_tc_bulk_stages(WoTcShape s) {
  const int fit = 72 * 1024 / (s.wk * s.nt * 128);
  return fit < 3 ? 3 : (fit > kWoTcBulkStagesMax ? kWoTcBulkStagesMax : fit);
}
constexpr int wo_tc_bulk_ring_bytes(WoTcShape s) { return s.wk * wo_tc_bulk_stages(s) * s.nt * 128; }
constexpr int wo_tc_bulk_smem_bytes(WoTcShape s) {
  const int ring = wo_tc_bulk_ring_bytes(s) + 2 * s.wk * wo_tc_bulk_stages(s) * 8, red = wo_tc_red_bytes(s);
  return ring > red ? ring : red;
}
constexpr bool wo_tc_shapes_ok() {
  for (int i = 0; i < kWoTcShapeCount; ++i) {
    const WoTcShape s = kWoTcShapes[i];
    if (s.nt != 32 && s.nt != 64 && s.nt != 128) return false;
    if (s.threads() > 512 || wo_tc_bulk_smem_bytes(s) > 227 * 1024) return false;
    if (wo_tc_grouped_shape(s) && wo_tc_smem_bytes(s) > 48 * 1024) return false;
    for (int j = i + 1; j < kWoTcShapeCount; ++j)
      if (kWoTcShapes[j].nt == s.nt && kWoTcShapes[j].wr == s.wr && kWoTcShapes[j].wk == s.wk) return false;
  }
  return true;
}
static_assert(wo_tc_shapes_ok(),
              "kWoTcShapes: N tile 32/64/128, <= 512 threads, <= 227 KiB (grouped: 48 KiB), distinct rows");

// wo_tc_tiled_x: the tiled activations of the dense kernel, one 1 KiB block per (64-K step j, 8 tokens g): byte
// 128 c + 16 r + 4 t + 2 e of block (j, g) is x[8 g + r][64 j + 16 t + 2 c + e] (c, r < 8;
// t < 4; e < 2), blocks in order (j, g), rows past M zero, M padded to a multiple of the CTA's
// tokens (weightonly_tile_x_run builds it, one launch before the GEMM's; jax_gmma.weightonly.tiled_x
// is its JAX spelling). A block is the shared-memory image of 8
// tokens x one 64-K step in the layout above: core matrix (token group, column c) 128 bytes.

// The row of kWoTcShapes for (rows per CTA, tokens per CTA, warps along K), or -1.
inline int wo_tc_shape_index(int rows, int tokens, int k_warps) {
  for (int i = 0; i < kWoTcShapeCount; ++i) {
    const WoTcShape& s = kWoTcShapes[i];
    if (s.rows() == rows && s.nt == tokens && 4 * s.wk == k_warps) return i;
  }
  return -1;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Generic-proxy shared-memory writes -> visible to wgmma (the async proxy) after a barrier.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// K-major, unswizzled ("interleave") B tile: 16-byte core rows, K-adjacent core matrices 128
// bytes apart (LBO), 8-token groups 1024 bytes apart (SBO).
__device__ __forceinline__ uint64_t tc_desc(uint32_t addr) {
  cute::GmmaDescriptor desc;
  desc.bitfield.start_address_ = static_cast<uint16_t>(addr >> 4);
  desc.bitfield.leading_byte_offset_ = 128 >> 4;
  desc.bitfield.stride_byte_offset_ = 1024 >> 4;
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = 0;  // no swizzle
  return desc.desc_;
}

#define JG_D4(i) d[i + 0], d[i + 1], d[i + 2], d[i + 3]
#define JG_D8(i) JG_D4(i), JG_D4(i + 4)
#define JG_D32(i) JG_D8(i), JG_D8(i + 8), JG_D8(i + 16), JG_D8(i + 24)
// d += A (64 x 16, registers) * B (16 x NT, shared memory): one bf16 wgmma, fp32 accumulation.
template <int NT>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t db, float (&d)[NT / 2]) {
  using namespace cute::SM90::GMMA;
  constexpr Major K = Major::K;
  if constexpr (NT == 32)
    MMA_64x32x16_F32BF16BF16_RS<K, K>::fma(a[0], a[1], a[2], a[3], db, JG_D8(0), JG_D8(8));
  if constexpr (NT == 64) MMA_64x64x16_F32BF16BF16_RS<K, K>::fma(a[0], a[1], a[2], a[3], db, JG_D32(0));
  if constexpr (NT == 128)
    MMA_64x128x16_F32BF16BF16_RS<K, K>::fma(a[0], a[1], a[2], a[3], db, JG_D32(0), JG_D32(32));
}
#undef JG_D32
#undef JG_D8
#undef JG_D4

template <int N>
__device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

// The kernel. Tile is the format's view of a prepared 16 x 64 tile (Fp4Tile / Fp6Tile: load,
// scales, slices; see wo_unpack_kernel), D the weight prefetch depth (even), XB: x tiled and
// staged by bulk copies (the dense kernel), else row-major x through registers (grouped).
// One CTA tile: weight rows [64 WR row_block, 64 WR (row_block + 1)) x tokens [tok0, tok0 + NT)
// (rows from p.m on read row p.m - 1, or the tiled x's zero rows, and are not stored). Dynamic
// shared memory: wo_tc_bulk_smem_bytes (XB) or wo_tc_smem_bytes of the shape.
template <int NT, int WR, int WK, class Tile, typename OutT, int D, bool XB>
__device__ __forceinline__ void wo_tc_tile(const WoParams& p, int64_t row_block, int64_t tok0) {
  static_assert(D % 2 == 0, "the A fragments are double-buffered by step parity");
  constexpr WoTcShape kShape{NT, WR, WK};
  constexpr int kStageBytes = NT * 128;               // NT tokens x 64 K, bf16
  constexpr int kStages = XB ? wo_tc_bulk_stages(kShape) : kWoTcStages;
  constexpr int kPhaseThreads = 128 * WR;             // threads of one K phase
  constexpr int kPairs = XB ? 1 : (NT * 4 + kPhaseThreads - 1) / kPhaseThreads;  // (token, 16-K run) pairs
  constexpr bool kPartial = !XB && kPairs * kPhaseThreads > NT * 4;              // some threads have none
  constexpr int kRows = 64 * WR;
  extern __shared__ __align__(1024) uint8_t smem[];

  const int tid = threadIdx.x;
  const int wg = tid / 128, wk = wg % WK, wr = wg / WK;
  const int warp = (tid / 32) % 4, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ksteps = p.k / 64;
  const int64_t strip = row_block * (4 * WR) + wr * 4 + warp;
  UnpackParams up{};
  up.w = p.w;
  up.s = p.s;
  const int64_t nsteps = warp_ksteps<WK>(ksteps, wk);
  auto tile_of = [&](int64_t i) { return static_cast<uint32_t>(strip * ksteps + wk + i * WK); };
  uint8_t* ring = smem + wk * kStages * kStageBytes;

  // XB: this phase's mbarriers (full: the producer's expect_tx + the copy's bytes; empty: one
  // arrival per warp of the phase), the producer (the phase's first thread) and its source:
  // step i's stage is the tiled x's NT / 8 blocks (K step wk + i WK, token groups tok0 / 8 ..).
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + WK * kStages * kStageBytes);  // [phase][full, empty][stage]
  uint64_t* full = bars + wk * 2 * kStages;
  uint64_t* empty = full + kStages;
  const bool producer = XB && wr == 0 && tid % 128 == 0;
  auto issue = [&](int64_t i) {  // producer: step i's stage
    const int st = static_cast<int>(i % kStages);
    TxBarrier::arrive_and_expect_tx(&full[st], kStageBytes);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(p.x) + ((wk + i * WK) * p.x_groups + tok0 / 8) * 1024;
    cute::SM90_BULK_COPY_G2S::copy(src, &full[st], ring + st * kStageBytes, kStageBytes);
  };
  if constexpr (XB) {
    if (tid == 0) {
      for (int ph = 0; ph < WK; ++ph)
        for (int st = 0; st < kStages; ++st) {
          Barrier::init(&bars[ph * 2 * kStages + st], 1);
          Barrier::init(&bars[ph * 2 * kStages + kStages + st], 4 * WR);
        }
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    if (producer)
      for (int64_t i = 0; i < kStages - 2 && i < nsteps; ++i) issue(i);
  }

  // Not XB: this thread's activation pairs: token r = pp / 4 of the tile, K run tt = pp % 4 (16
  // bf16).
  const int kt = wr * 128 + (tid % 128);
  const bool x_mine = !XB && (!kPartial || kt < NT * 4);
  const __nv_bfloat16* xsrc[kPairs];
  uint32_t xdst[kPairs];
#pragma unroll
  for (int i = 0; i < kPairs; ++i) {
    const int pp = (kt + i * kPhaseThreads) % (NT * 4), r = pp / 4, tt = pp % 4;
    const int64_t tok = tok0 + r;
    xsrc[i] = p.x + (tok < p.m ? tok : p.m - 1) * p.k + 16 * tt;
    xdst[i] = static_cast<uint32_t>((8 * (r / 8)) * 128 + (r % 8) * 16 + 4 * tt);
  }
  uint4 xr[kPairs][2];
  auto load_x = [&](int64_t i) {
    if (!x_mine) return;
    const int64_t off = 64 * (wk + i * WK);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const uint4* src = reinterpret_cast<const uint4*>(xsrc[j] + off);
      xr[j][0] = __ldg(src);
      xr[j][1] = __ldg(src + 1);
    }
  };
  auto store_x = [&](int stage) {
    if (!x_mine) return;
    const uint32_t base = smem_addr(ring + stage * kStageBytes);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      const uint32_t dst = base + xdst[j];
      const uint32_t w[8] = {xr[j][0].x, xr[j][0].y, xr[j][0].z, xr[j][0].w,
                             xr[j][1].x, xr[j][1].y, xr[j][1].z, xr[j][1].w};
#pragma unroll
      for (int c = 0; c < 8; ++c) sts32(dst + 128 * c, w[c]);
    }
  };

  typename Tile::Regs wring[D];
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < nsteps) wring[u] = Tile::load(up, tile_of(u), lane);
  if constexpr (!XB) {
    if (nsteps > 0) {
      load_x(0);
      store_x(0);
    }
    if (nsteps > 1) load_x(1);
  }

  float acc[NT / 2];
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) acc[i] = 0.f;
  uint32_t a[2][4][4];

  // Step i (slot u = i % D of the weight ring, activation stage i % kStages).
  //  * Not XB: before the barrier this thread's stores of stage i are fenced; after it, every
  //    thread of the phase has stored stage i and retired step i - 2's wgmmas (wait_group 1 at
  //    the end of step i - 1), so stage (i + 1) % 3, last read by step i - 2, may be overwritten.
  //  * XB: the producer refills the stage of step i - 2 (every warp of the phase freed it at
  //    step i - 1) with step i + S - 2; the phase waits for stage i's bytes; after wait_group 1
  //    retires step i - 1's wgmmas each warp frees its stage.
  int stage = 0;
  auto step = [&](int64_t i, int u) {
    const int next = stage == kStages - 1 ? 0 : stage + 1;
    if constexpr (XB) {
      if (producer && i + kStages - 2 < nsteps) {
        if (i >= 2) Barrier::wait(&empty[(i - 2) % kStages], static_cast<uint32_t>(((i - 2) / kStages) & 1));
        issue(i + kStages - 2);
      }
      __syncwarp();  // the producer's warp converged again before the warp-group wgmmas
      Barrier::wait(&full[stage], static_cast<uint32_t>((i / kStages) & 1));
    } else {
      fence_async_shared();
      bar_sync(1 + wk, kPhaseThreads);
      constexpr bool kXOnce = (JAX_GMMA_WO_TC_ABLATE & 1) != 0;
      if (i + 1 < nsteps && (!kXOnce || i < 1)) store_x(next);
      if (i + 2 < nsteps && (!kXOnce || i < 1)) load_x(i + 2);
    }
    uint32_t f_lo, f_hi;
    Tile::scales(wring[u], f_lo, f_hi);
    Tile::slices(wring[u], f_lo, f_hi, a[u & 1]);
    if (i + D < nsteps && !(JAX_GMMA_WO_TC_ABLATE & 2)) wring[u] = Tile::load(up, tile_of(i + D), lane);
    const uint32_t sb = smem_addr(ring + stage * kStageBytes);
    fence_acc(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int q = 0; q < 4; ++q) wgmma_rs<NT>(a[u & 1][q], tc_desc(sb + 256 * q), acc);
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
    fence_acc(acc);
    if constexpr (XB) {
      if (i >= 1) {
        __syncwarp();
        if (lane == 0) Barrier::arrive(&empty[(i - 1) % kStages]);
      }
    }
    stage = next;
  };
  int64_t i0 = 0;
  for (; i0 + D <= nsteps; i0 += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) step(i0 + u, u);
  }
#pragma unroll
  for (int u = 0; u < D - 1; ++u)
    if (i0 + u < nsteps) step(i0 + u, u);
  cute::warpgroup_wait<0>();
  fence_acc(acc);

  // Accumulator fragment: acc[i] is weight row 16 warp + g + 8 ((i / 2) % 2) of the row group,
  // token 8 (i / 4) + 2t + i % 2. Phases 1 .. WK - 1 leave their sums in shared memory
  // ([phase - 1][token][row], rows padded by 4 floats: conflict-free), phase 0 adds them in order.
  constexpr int kRedStride = kRows + 4;
  static_assert(!XB || wo_tc_red_bytes(kShape) <= wo_tc_bulk_ring_bytes(kShape),
                "the partial sums reuse the rings, not the mbarriers behind them");
  float* red = reinterpret_cast<float*>(smem);
  const int row_base = 64 * wr + 16 * warp + g;
  if constexpr (WK > 1) {
    __syncthreads();  // every phase is done with its ring
    if (wk > 0) {
      float* mine = red + (wk - 1) * NT * kRedStride;
#pragma unroll
      for (int i = 0; i < NT / 2; ++i)
        mine[(8 * (i / 4) + 2 * t + (i & 1)) * kRedStride + row_base + 8 * ((i >> 1) & 1)] = acc[i];
    }
    __syncthreads();
    if (wk > 0) return;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
      const int idx = (8 * (i / 4) + 2 * t + (i & 1)) * kRedStride + row_base + 8 * ((i >> 1) & 1);
#pragma unroll
      for (int w = 0; w < WK - 1; ++w) acc[i] += red[w * NT * kRedStride + idx];
    }
  }
  const float alpha0 = 1024.f * (p.w_global ? *p.w_global : 1.f);  // 2^10 undoes the decode's 2^-10
  const OutT* bias = static_cast<const OutT*>(p.bias);
  OutT* d = static_cast<OutT*>(p.d);
  const int64_t n0 = row_block * kRows + row_base;
  float b_lo = 0.f, b_hi = 0.f;
  if (bias) {
    b_lo = to_float<OutT>(bias[n0]);
    b_hi = to_float<OutT>(bias[n0 + 8]);
  }
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    const int64_t tok = tok0 + 8 * (i / 4) + 2 * t + (i & 1);
    if (tok >= p.m) continue;
    const bool hi = (i >> 1) & 1;
    const float alpha = p.x_scale ? alpha0 * p.x_scale[tok] : alpha0;
    d[tok * p.n + n0 + (hi ? 8 : 0)] = from_float<OutT>(acc[i] * alpha + (hi ? b_hi : b_lo));
  }
}

// The dense kernel. Token tiles vary fastest over the grid: the CTAs of one weight row block run
// together, so the second and later token tiles read the weight from L2.
template <int NT, int WR, int WK, class Tile, typename OutT, int D>
__global__ void __launch_bounds__(128 * WR * WK) wo_tc_kernel(const WoParams p) {
  wo_tc_tile<NT, WR, WK, Tile, OutT, D, true>(p, blockIdx.y, static_cast<int64_t>(blockIdx.x) * NT);
}

// The grouped kernel (mixture-of-experts; wo_grouped in weightonly_common.cuh): grid x = the row
// blocks, y = the expert slots; a slot runs its expert's token tiles one after another.
template <int NT, int WR, int WK, class Tile, typename OutT, int D>
__global__ void __launch_bounds__(128 * WR * WK) wo_tc_grouped_kernel(const WoGroupedParams gp) {
  wo_grouped<64 * WR, NT, OutT>(gp, [](const WoParams& q, int64_t tok0) {
    wo_tc_tile<NT, WR, WK, Tile, OutT, D, false>(q, blockIdx.x, tok0);
  });
}

// Host: the dense kernel's shared memory above 48 KiB needs a per-device opt-in
// (cudaFuncSetAttribute: not a stream operation; the device from cudaGetDevice, which capture
// allows). weightonly_prepare (called for every device when jax_gmma registers its kernels,
// before any capture) sets it for every shape; a launch sets it only where that did not run.
template <int I, class Tile, typename OutT, int D>
struct TcOptIn {
  static cudaError_t ensure() {
    constexpr WoTcShape s = kWoTcShapes[I];
    constexpr int bytes = wo_tc_bulk_smem_bytes(s);
    if constexpr (bytes <= 48 * 1024) {
      return cudaSuccess;
    } else {
      static std::atomic<uint64_t> done{0};
      int dev = 0;
      if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
      const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
      if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
      const cudaError_t e = cudaFuncSetAttribute(wo_tc_kernel<s.nt, s.wr, s.wk, Tile, OutT, D>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
      return e;
    }
  }
};

// Every shape's opt-in for one format and output type (the current device).
template <class Tile, typename OutT, int D, int I = 0>
cudaError_t prepare_tc() {
  if constexpr (I >= kWoTcShapeCount) {
    return cudaSuccess;
  } else {
    if (cudaError_t e = TcOptIn<I, Tile, OutT, D>::ensure(); e != cudaSuccess) return e;
    return prepare_tc<Tile, OutT, D, I + 1>();
  }
}

// Host: one launch of the tensor-core kernel for kWoTcShapes row `index`, dense (grid
// ceil(M / NT) x N / (64 WR), x tiled, wo_tc_bulk_smem_bytes) or grouped (gr: grid N / (64 WR) x
// the expert slots, row-major x, wo_tc_smem_bytes below 48 KiB).
template <class Tile, typename OutT, int D, int I = 0>
cudaError_t launch_tc(const WoArgs& a, int index, cudaStream_t stream, const WoGroups* gr = nullptr) {
  if constexpr (I >= kWoTcShapeCount) {
    return cudaErrorInvalidValue;
  } else {
    if (index != I) return launch_tc<Tile, OutT, D, I + 1>(a, index, stream, gr);
    constexpr WoTcShape s = kWoTcShapes[I];
    const unsigned blocks = static_cast<unsigned>(a.n / s.rows());
    if (gr) {
      if constexpr (wo_tc_grouped_shape(s)) {
        const WoGroupedParams gp = make_grouped_params(a, *gr);
        wo_tc_grouped_kernel<s.nt, s.wr, s.wk, Tile, OutT, D>
            <<<dim3(blocks, static_cast<unsigned>(groups::slots(gp.groups, a.m))), s.threads(),
               wo_tc_smem_bytes(s), stream>>>(gp);
      } else {
        return cudaErrorInvalidValue;  // not built grouped (weightonly_grouped_check refuses it)
      }
    } else {
      if (a.x_rows % s.nt != 0 || a.x_rows < a.m) return cudaErrorInvalidValue;  // x not tiled for NT
      if (cudaError_t e = TcOptIn<I, Tile, OutT, D>::ensure(); e != cudaSuccess) return e;
      wo_tc_kernel<s.nt, s.wr, s.wk, Tile, OutT, D>
          <<<dim3(static_cast<unsigned>((a.m + s.nt - 1) / s.nt), blocks), s.threads(),
             wo_tc_bulk_smem_bytes(s), stream>>>(make_params(a));
    }
    return cudaGetLastError();
  }
}

}  // namespace wo_detail
}  // namespace jax_gmma
