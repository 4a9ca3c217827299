// Kernel family: MXFP8 x MXFP8 block-scaled GEMM on Hopper (sm_90a), written for jax-gmma.
//
//   D[m, n] = sum_kb  sa[m, kb] * sb[n, kb] * sum_{k in block kb} A[m, k] * B[n, k]  (+ bias[n])
//
// A (M, K) and B (N, K) are float8_e4m3fn, K-major; sa / sb are E8M0 scales, one per 32 of K,
// in the swizzled 128x4-atom layout of the Blackwell kernels (jax_gmma "sm100_128x4":
// 512-byte atoms of 128 rows x 4 K blocks, row r's 4 codes in the 32-bit word at byte
// (r % 32) * 16 + (r / 32 % 4) * 4), so one quantized operand serves Hopper and Blackwell.
//
// Hopper's tensor cores have no block-scaled MMA, and CUTLASS's sm90 blockwise-scaling
// mainloop promotes at most once per 128 of K, so this is a mainloop of our own:
//
// * CTA tile 128 rows (two consumer warp groups of 64) or 64 rows (one; twice the CTAs for
//   decode shapes with few 128-row tiles) x BQ (16, 32, 64 or 128), K step 128 (four 32-K
//   scale blocks), 5-8 stage TMA pipeline (16 in the one-CTA-per-SM "_deep" configs;
//   mbarrier full / empty pairs). Warp group 0 is the
//   producer (one thread issues two 2-D TMA loads, 128B-swizzled, and two 512-byte bulk
//   copies of the scale atoms per stage); the other warp groups consume.
// * Per 32-K block, one wgmma m64nBQk32 (e4m3 x e4m3 -> f32) into a *fresh* register tile
//   (scale-d = 0), then the promotion acc += (sa[row] * sb[col]) * tile in float32: every
//   scale is applied exactly (a power of two times the block's sum), one rounding per block.
//   BQ <= 64: a stage's four wgmmas are issued at once into four tiles, each block promoted
//   as soon as its commit group is done. BQ = 128: two tiles alternate.
// * Column scales are decoded once per stage and warp group into float32 in shared memory
//   (E8M0 code c -> 2^(c - 127): code 0 is 2^-127, code 255 is NaN), laid out so a thread
//   fetches up to 4 of its columns with one 16-byte load.
// * Persistent CTAs (grid = min(tiles, SMs x CTAs per SM)), tiles in groups of 8 P-tiles for
//   L2 reuse; the consumers' epilogue (registers -> global, masked at the edges, + bias)
//   overlaps the producer's loads for the next tile.
//
// Cost (measured on the H200, 2026-11-30): the promotion is
// two float32 instructions per accumulator element per 32 of K, and it barely overlaps the
// tensor core: ~370 TFLOP/s at large M (the wgmma pipeline alone: 1200), which is why
// jax_gmma.mx picks an exact bf16 route from M = 512; at decode the swap configs stream the
// weights at ~3.5 TB/s.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/bfloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "jax_gmma/e8m0.cuh"
#include "jax_gmma/gemm_api.h"

namespace jax_gmma::sm90_mxf8 {

// The kernel computes a P x Q tile grid: P is the operand whose rows the consumer warp
// groups split (64 rows each, 128 or 64 per CTA; the wgmma M side), Q the operand whose rows are the
// wgmma N side (kBQ = 16 .. 128 per CTA). Large M: P = A, Q = B (kBQ = 128). Decode ("swap"):
// P = B (the weights stream through 64-row wgmma tiles), Q = A (kBQ = 16, 32 or 64 tokens),
// so the promotion work scales with the tokens, not with 128.
constexpr int kBK = 128;
constexpr int kGroupP = 8;
constexpr int kAtomBytes = 512;  // one 128 x 4 scale atom

// kCons consumer warp groups of 64 P rows each: 2 (a 128-row P tile) or 1 (64 rows: twice the
// CTAs, for decode shapes whose N / 128 tiles leave SMs idle).
template <int BQ, int kCons, bool kDeep>
struct Cfg {
  static_assert(BQ == 16 || BQ == 32 || BQ == 64 || BQ == 128, "wgmma N tile");
  static_assert(kCons == 1 || kCons == 2, "consumer warp groups");
  static constexpr int kBP = 64 * kCons;
  static constexpr int kThreads = 128 * (1 + kCons);
  // Small tiles: two CTAs per SM. Setmaxnreg moves registers inside the CTA's launch pool:
  // kProducerRegs + kCons * kConsumerRegs <= (1 + kCons) * (65536 / (kThreads * kMinBlocks)).
  // kDeep (one consumer warp group only): one CTA per SM with 16 stages in flight instead of
  // two CTAs with 8 each, for weight streams of at most one wave of 64-row tiles.
  static_assert(!kDeep || kCons == 1, "deep pipelines are built for one consumer warp group");
  static constexpr int kMinBlocks = kDeep ? 1 : (kCons == 1 || BQ <= 32) ? 2 : 1;
  static constexpr int kStages = kDeep ? 16 : kCons == 1 ? 8 : (kMinBlocks == 2 ? 5 : 6);
  static constexpr int kConsumerRegs = kDeep ? 232 : kCons == 1 ? (BQ == 64 ? 216 : 120) : (kMinBlocks == 2 ? 104 : 232);
  static constexpr int kProducerRegs = kCons == 1 ? 40 : (kMinBlocks == 2 ? 24 : 40);
  static_assert(kProducerRegs + kCons * kConsumerRegs <= (1 + kCons) * (65536 / (kThreads * kMinBlocks) / 8 * 8),
                "setmaxnreg: the warp groups' registers exceed the CTA's launch allocation");
  static constexpr int kG = BQ >= 32 ? BQ / 32 : 1;  // decoded column scales per 32-row group
  static constexpr int kAcc = BQ / 2;                 // accumulators per thread
  static constexpr bool kBatch = BQ <= 64;            // a stage's four wgmmas at once (see the kernel)
  static constexpr uint32_t kStageTx = (kBP + BQ) * kBK + 2 * kAtomBytes;
};

template <int BQ, int kCons, bool kDeep>
struct SharedStorage {
  using C = Cfg<BQ, kCons, kDeep>;
  alignas(1024) uint8_t p[C::kStages][C::kBP * kBK];
  alignas(1024) uint8_t q[C::kStages][BQ * kBK];
  uint32_t sfp[C::kStages][128];
  uint32_t sfq[C::kStages][128];
  float colf[kCons][2][4 * BQ];  // [consumer][buffer][kb][q % 32][q / 32]
  uint64_t full[C::kStages];
  uint64_t empty[C::kStages];
};
template <int BQ, int kCons, bool kDeep>
constexpr int smem_bytes() { return static_cast<int>(sizeof(SharedStorage<BQ, kCons, kDeep>)) + 1024; }  // + alignment slack

struct Params {
  const uint8_t* p_sf;  // scale atoms of P / Q (swizzled 128x4 layout)
  const uint8_t* q_sf;
  void* d;
  const void* bias;
  int n;                // columns of D (M, N)
  int rows_p, rows_q;   // rows of P and Q
  int k_tiles, tiles_p, tiles_q;
};

// -- PTX helpers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// K-major, 128B-swizzled operand tile (rows of 128 bytes, 8-row / 1024-byte swizzle atoms).
__device__ __forceinline__ uint64_t make_desc(const void* tile) {
  cute::GmmaDescriptor desc;
  desc.bitfield.start_address_ = static_cast<uint16_t>(smem_u32(tile) >> 4);
  desc.bitfield.leading_byte_offset_ = 1;   // unused for swizzled K-major layouts
  desc.bitfield.stride_byte_offset_ = 64;   // 1024 bytes between 8-row groups
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = 1;           // SWIZZLE_128B
  return desc.desc_;
}

#define JG_D4(i) d[i + 0], d[i + 1], d[i + 2], d[i + 3]
#define JG_D8(i) JG_D4(i), JG_D4(i + 4)
#define JG_D32(i) JG_D8(i), JG_D8(i + 8), JG_D8(i + 16), JG_D8(i + 24)

// One 64 x BQ x 32 e4m3 wgmma into a fresh (zeroed) f32 tile.
template <int BQ>
__device__ __forceinline__ void wgmma_fresh(uint64_t da, uint64_t db, float (&d)[BQ / 2]) {
  using namespace cute::SM90::GMMA;
  constexpr auto z = ScaleOut::Zero;
  if constexpr (BQ == 16) MMA_64x16x32_F32E4M3E4M3_SS_TN<>::fma(da, db, JG_D8(0), z);
  if constexpr (BQ == 32) MMA_64x32x32_F32E4M3E4M3_SS_TN<>::fma(da, db, JG_D8(0), JG_D8(8), z);
  if constexpr (BQ == 64) MMA_64x64x32_F32E4M3E4M3_SS_TN<>::fma(da, db, JG_D32(0), z);
  if constexpr (BQ == 128) MMA_64x128x32_F32E4M3E4M3_SS_TN<>::fma(da, db, JG_D32(0), JG_D32(32), z);
}
#undef JG_D32
#undef JG_D8
#undef JG_D4

// Waits until block kb's commit group (of the four a stage issues) is complete.
__device__ __forceinline__ void wait_groups_after(int kb) {
  switch (kb) {
    case 0: cute::warpgroup_wait<3>(); break;
    case 1: cute::warpgroup_wait<2>(); break;
    case 2: cute::warpgroup_wait<1>(); break;
    default: cute::warpgroup_wait<0>(); break;
  }
}

template <int N>
__device__ __forceinline__ void fence_tile(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

template <int G>
__device__ __forceinline__ void lds(uint32_t addr, float (&v)[G]) {
  if constexpr (G == 4) {
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(addr));
  } else if constexpr (G == 2) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[0]), "=f"(v[1]) : "r"(addr));
  } else {
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v[0]) : "r"(addr));
  }
}

// acc[r][c] += sp[r] * sq[c] * tile[r][c] for this thread's 2 rows x BQ / 4 columns (wgmma
// accumulator layout: element 4 j + 2 h + e is row 8 h + (lane / 4), column 8 j + 2 t + e).
// colf_kb is the shared address of the block's decoded column scales, [q % 32][q / 32]: one
// load of G floats gives columns c, c + 32, .. c + 32 (G - 1).
template <int BQ>
__device__ __forceinline__ void promote(float (&acc)[BQ / 2], const float (&tile)[BQ / 2], float sp0, float sp1,
                                        uint32_t colf_kb, int t) {
  constexpr int G = BQ >= 32 ? BQ / 32 : 1;
  constexpr int JB = BQ >= 32 ? 4 : BQ / 8;  // distinct (column % 32) / 8 per thread
#pragma unroll
  for (int jb = 0; jb < JB; ++jb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float c[G];
      lds<G>(colf_kb + ((8 * jb + 2 * t + e) * G) * 4, c);
      // The scale products first (independent), then the accumulations.
      float p[2 * G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        p[g] = sp0 * c[g];
        p[G + g] = sp1 * c[g];
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int j = jb + 4 * g;  // column 8 j + 2 t + e
        acc[4 * j + e] = fmaf(tile[4 * j + e], p[g], acc[4 * j + e]);
        acc[4 * j + 2 + e] = fmaf(tile[4 * j + 2 + e], p[G + g], acc[4 * j + 2 + e]);
      }
    }
  }
}

__device__ __forceinline__ void tile_coords(int tile, const Params& p, int* pt, int* qt) {
  const int group = tile / (kGroupP * p.tiles_q);
  const int first = group * kGroupP;
  const int gp = min(kGroupP, p.tiles_p - first);
  const int idx = tile - group * kGroupP * p.tiles_q;
  *pt = first + idx % gp;
  *qt = idx / gp;
}

// Stores this thread's 2 x BQ / 4 tile elements: rows prow, prow + 8 of P, columns qcol + 8 j
// (and + 1) of Q; D[p][q] (P = A) or D[q][p] (swap: P = B).
template <class OutT, bool kBias, bool kSwap, int BQ>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[BQ / 2], int prow, int qcol) {
  OutT* d = static_cast<OutT*>(p.d);
  const OutT* bias = static_cast<const OutT*>(p.bias);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = prow + 8 * h;
    if (row >= p.rows_p) continue;
#pragma unroll
    for (int j = 0; j < BQ / 8; ++j) {
      const int col = qcol + 8 * j;
      float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
      if constexpr (!kSwap) {
        if (col >= p.rows_q) continue;  // N is even: col + 1 < N too
        if constexpr (kBias) {
          v0 += static_cast<float>(bias[col]);
          v1 += static_cast<float>(bias[col + 1]);
        }
        OutT* out = d + static_cast<int64_t>(row) * p.n + col;
        if constexpr (std::is_same_v<OutT, float>) {
          *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
        }
      } else {
        if constexpr (kBias) {
          const float b = static_cast<float>(bias[row]);
          v0 += b;
          v1 += b;
        }
        if (col < p.rows_q) d[static_cast<int64_t>(col) * p.n + row] = static_cast<OutT>(v0);
        if (col + 1 < p.rows_q) d[static_cast<int64_t>(col + 1) * p.n + row] = static_cast<OutT>(v1);
      }
    }
  }
}

template <class OutT, bool kBias, bool kSwap, int BQ, int kCons, bool kDeep>
__global__ void __launch_bounds__(Cfg<BQ, kCons, kDeep>::kThreads, Cfg<BQ, kCons, kDeep>::kMinBlocks)
    mxf8_gemm_kernel(const __grid_constant__ CUtensorMap tma_p, const __grid_constant__ CUtensorMap tma_q,
                     const Params p) {
  using C = Cfg<BQ, kCons, kDeep>;
  constexpr int kBP = C::kBP;
  extern __shared__ uint8_t smem_raw[];
  SharedStorage<BQ, kCons, kDeep>& s = *reinterpret_cast<SharedStorage<BQ, kCons, kDeep>*>(
      smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  const int wg = threadIdx.x / 128;
  const int num_tiles = p.tiles_p * p.tiles_q;

  if (threadIdx.x == 0) {
    for (int i = 0; i < C::kStages; ++i) {
      mbar_init(&s.full[i], 1);
      mbar_init(&s.empty[i], 128 * kCons);  // one arrival per consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    cutlass::arch::warpgroup_reg_dealloc<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tma_p)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tma_q)) : "memory");
      int stage = 0;
      uint32_t phase = 0;
      for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        int pt, qt;
        tile_coords(tile, p, &pt, &qt);
        // Scale atoms cover 128 rows: a tile of fewer rows sits in atom (first row) / 128.
        const uint8_t* sfp = p.p_sf + static_cast<int64_t>(pt * kBP / 128) * p.k_tiles * kAtomBytes;
        const uint8_t* sfq = p.q_sf + static_cast<int64_t>(qt * BQ / 128) * p.k_tiles * kAtomBytes;
        for (int kt = 0; kt < p.k_tiles; ++kt) {
          mbar_wait(&s.empty[stage], phase ^ 1);
          mbar_expect_tx(&s.full[stage], C::kStageTx);
          tma_load_2d(&tma_p, &s.full[stage], s.p[stage], kt * kBK, pt * kBP);
          tma_load_2d(&tma_q, &s.full[stage], s.q[stage], kt * kBK, qt * BQ);
          bulk_load(s.sfp[stage], sfp + kt * kAtomBytes, kAtomBytes, &s.full[stage]);
          bulk_load(s.sfq[stage], sfq + kt * kAtomBytes, kAtomBytes, &s.full[stage]);
          if (++stage == C::kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<C::kConsumerRegs>();
  // Consumer cw (0 .. kCons - 1): P rows 64 cw .. 64 cw + 63 of the tile.
  const int cw = wg - 1;
  const int tid = threadIdx.x % 128;
  const int warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, t = lane % 4;
  const int r0 = 64 * cw + 16 * warp + gid;  // this thread's P rows r0, r0 + 8 (in the tile)
  float* colf_base = s.colf[cw][0];

  // Each 32-K block is one wgmma into a fresh tile, then promoted into acc. BQ <= 64
  // (C::kBatch): a stage's four wgmmas are issued at once into four tiles and block kb is
  // promoted as soon as its commit group is done (wait_group 3 - kb): one wgmma latency per
  // stage. BQ = 128 (four 64-float tiles would not fit in the registers): two tiles alternate;
  // once block kb's wgmma is done, block kb + 1's is issued and block kb is promoted while the
  // tensor core works. (Tried: issuing the next stage's wgmma into each tile as soon as it is
  // promoted, so three stay in flight across stages -- ptxas then serializes every wgmma, C7514,
  // and it ran 20-50% slower; moving this loop into helper functions cost the 128x128 config
  // ~2%.)
  int stage = 0, buf = 0;
  uint32_t phase = 0;
  float acc[C::kAcc];
  float tb[C::kBatch ? 4 : 1][C::kAcc];
  float(&t0)[C::kAcc] = tb[0];
  float t1[C::kBatch ? 1 : C::kAcc];
  for (int tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    int pt, qt;
    tile_coords(tile, p, &pt, &qt);
    // The Q row this thread decodes (one per thread while tid < BQ) and its P rows, in atom
    // coordinates, as scale-word indices.
    const int qa = (qt * BQ) % 128 + tid;
    const int wq = (qa % 32) * 4 + qa / 32;
    const int pa0 = (pt * kBP) % 128 + r0, pa1 = pa0 + 8;
    const int wp0 = (pa0 % 32) * 4 + pa0 / 32, wp1 = (pa1 % 32) * 4 + pa1 / 32;
#pragma unroll
    for (int i = 0; i < C::kAcc; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      mbar_wait(&s.full[stage], phase);
      float* colf = colf_base + buf * 4 * BQ;
      if (tid < BQ) {
        const uint32_t w = s.sfq[stage][wq];
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
          colf[kb * BQ + (tid % 32) * C::kG + tid / 32] = e8m0_to_float((w >> (8 * kb)) & 0xff);
      }
      const uint32_t rp0 = s.sfp[stage][wp0], rp1 = s.sfp[stage][wp1];
      const uint32_t colf_s = smem_u32(colf);
      const uint64_t da = make_desc(s.p[stage] + cw * 64 * kBK);
      const uint64_t db = make_desc(s.q[stage]);
      if constexpr (C::kBatch) {
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) fence_tile(tb[kb]);
        cute::warpgroup_arrive();
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          wgmma_fresh<BQ>(da + 2 * kb, db + 2 * kb, tb[kb]);  // +32 bytes of K per block
          cute::warpgroup_commit_batch();
        }
        named_sync(1 + cw, 128);  // colf written by the warp group
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          wait_groups_after(kb);
          fence_tile(tb[kb]);
          // Operands no longer read. Every consumer thread arrives: an arrive releases only its
          // own thread's reads of the stage's scales (compute-sanitizer's racecheck reported
          // the one-arrival-per-warp version; same speed, measured).
          if (kb == 3) mbar_arrive(&s.empty[stage]);
          promote<BQ>(acc, tb[kb], e8m0_to_float((rp0 >> (8 * kb)) & 0xff),
                      e8m0_to_float((rp1 >> (8 * kb)) & 0xff), colf_s + kb * BQ * 4, t);
        }
      } else {
        fence_tile(t0);
        cute::warpgroup_arrive();
        wgmma_fresh<BQ>(da, db, t0);
        cute::warpgroup_commit_batch();
        named_sync(1 + cw, 128);  // colf written by the warp group
#pragma unroll
        for (int kb = 0; kb < 4; ++kb) {
          float(&cur)[C::kAcc] = (kb & 1) ? t1 : t0;
          float(&nxt)[C::kAcc] = (kb & 1) ? t0 : t1;
          cute::warpgroup_wait<0>();
          fence_tile(cur);
          if (kb < 3) {  // the tensor core takes block kb + 1 while this block is promoted
            fence_tile(nxt);
            cute::warpgroup_arrive();
            wgmma_fresh<BQ>(da + 2 * (kb + 1), db + 2 * (kb + 1), nxt);  // +32 bytes of K per block
            cute::warpgroup_commit_batch();
          } else {
            mbar_arrive(&s.empty[stage]);  // operands no longer read (every thread: see above)
          }
          promote<BQ>(acc, cur, e8m0_to_float((rp0 >> (8 * kb)) & 0xff),
                      e8m0_to_float((rp1 >> (8 * kb)) & 0xff), colf_s + kb * BQ * 4, t);
        }
      }
      if (++stage == C::kStages) {
        stage = 0;
        phase ^= 1;
      }
      buf ^= 1;
    }
    store_tile<OutT, kBias, kSwap, BQ>(p, acc, pt * kBP + r0, qt * BQ + 2 * t);
  }
}

// -- host ----------------------------------------------------------------------------------

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      ptr = nullptr;
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// (rows, K) bytes, K contiguous, boxes of box_rows x 128 bytes, 128B swizzle; reads past the
// edges are zeros.
bool make_map(CUtensorMap* map, const void* base, int64_t rows, int64_t k, int box_rows) {
  EncodeTiled fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};
  const cuuint32_t box[2] = {kBK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

const char* can_implement(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return "M, N and K must be positive";
  if (g.k % 32) return "K must be a multiple of 32 (the MX scale block)";
  if (g.n % 2) return "N must be even";
  if (g.m > INT32_MAX / 2 || g.n > INT32_MAX / 2 || g.k > INT32_MAX / 2) return "M, N and K must be below 2^30";
  if (g.a_global_scale || g.b_global_scale) return "MXFP8 has no global scale";
  return nullptr;
}

// TMA and the bulk copies need 16-byte aligned global addresses (XLA's buffers are).
bool aligned(const GemmArgs& g) {
  return ((reinterpret_cast<uintptr_t>(g.a) | reinterpret_cast<uintptr_t>(g.b) |
           reinterpret_cast<uintptr_t>(g.a_sf) | reinterpret_cast<uintptr_t>(g.b_sf)) % 16) == 0;
}

size_t workspace_size(const GemmArgs&) { return 0; }

template <class OutT, bool kSwap, int BQ, int kCons, bool kDeep>
cudaError_t prepare() {
  for (auto fn : {mxf8_gemm_kernel<OutT, false, kSwap, BQ, kCons, kDeep>, mxf8_gemm_kernel<OutT, true, kSwap, BQ, kCons, kDeep>}) {
    cudaError_t e =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes<BQ, kCons, kDeep>());
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <class OutT, bool kSwap, int BQ, int kCons, bool kDeep>
cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
  using C = Cfg<BQ, kCons, kDeep>;
  constexpr int kBP = C::kBP;
  if (!aligned(g)) return cudaErrorMisalignedAddress;
  Params p;
  p.p_sf = static_cast<const uint8_t*>(kSwap ? g.b_sf : g.a_sf);
  p.q_sf = static_cast<const uint8_t*>(kSwap ? g.a_sf : g.b_sf);
  p.d = g.d;
  p.bias = g.bias;
  p.n = static_cast<int>(g.n);
  p.rows_p = static_cast<int>(kSwap ? g.n : g.m);
  p.rows_q = static_cast<int>(kSwap ? g.m : g.n);
  p.k_tiles = static_cast<int>((g.k + kBK - 1) / kBK);
  p.tiles_p = (p.rows_p + kBP - 1) / kBP;
  p.tiles_q = (p.rows_q + BQ - 1) / BQ;
  CUtensorMap mp, mq;
  if (!make_map(&mp, kSwap ? g.b : g.a, p.rows_p, g.k, kBP) || !make_map(&mq, kSwap ? g.a : g.b, p.rows_q, g.k, BQ))
    return cudaErrorInvalidValue;
  const int tiles = p.tiles_p * p.tiles_q;
  int sms = g.sm_count;
  if (sms <= 0 && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g.device) != cudaSuccess) sms = 132;
  const dim3 grid(std::min(tiles, sms * C::kMinBlocks));
  constexpr int smem = smem_bytes<BQ, kCons, kDeep>();
  if (g.bias)
    mxf8_gemm_kernel<OutT, true, kSwap, BQ, kCons, kDeep><<<grid, C::kThreads, smem, stream>>>(mp, mq, p);
  else
    mxf8_gemm_kernel<OutT, false, kSwap, BQ, kCons, kDeep><<<grid, C::kThreads, smem, stream>>>(mp, mq, p);
  return cudaGetLastError();
}

template <class OutT, bool kSwap, int BQ, int kCons, bool kDeep>
KernelEntry entry(const char* name, DType d) {
  return KernelEntry{name, DType::kF8E4M3, DType::kF8E4M3, d, &can_implement, &workspace_size,
                     &prepare<OutT, kSwap, BQ, kCons, kDeep>, &run<OutT, kSwap, BQ, kCons, kDeep>,
                     smem_bytes<BQ, kCons, kDeep>(), Cfg<BQ, kCons, kDeep>::kThreads, 90};
}

}  // namespace jax_gmma::sm90_mxf8

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): one large-M config and eight decode
// (swap) configs -- 128- or 64-row weight tiles x 16, 32 or 64 tokens, and the 64-row 16- and
// 32-token tiles as one-CTA-per-SM 16-stage "_deep" variants -- each for bfloat16 and float32
// output.
int sm90_mx_mxf8_entries(KernelEntry* out) {
  using namespace sm90_mxf8;
  using BF16 = cutlass::bfloat16_t;
  int n = 0;
#define JG_ENTRY(name, swap, bq, cons, deep)                               \
  out[n++] = entry<BF16, swap, bq, cons, deep>(name, DType::kBF16); \
  out[n++] = entry<float, swap, bq, cons, deep>(name, DType::kF32);
  JG_ENTRY("sm90_mxf8_blockscaled_128x128", false, 128, 2, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_128x16", true, 16, 2, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_128x32", true, 32, 2, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_128x64", true, 64, 2, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_64x16", true, 16, 1, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_64x32", true, 32, 1, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_64x64", true, 64, 1, false)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_64x16_deep", true, 16, 1, true)
  JG_ENTRY("sm90_mxf8_blockscaled_swap_64x32_deep", true, 32, 1, true)
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
