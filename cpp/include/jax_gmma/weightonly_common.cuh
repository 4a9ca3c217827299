// Device helpers shared by the sm90 weight-only GEMM kernels (cpp/sm90_fp4_gemm_weightonly.cu,
// cpp/sm90_fp6_gemm_weightonly.cu): loads, the bf16 mma.sync wrapper, the bf16x2 multiply, the
// output conversions and the CTA's shared-memory K reduction + epilogue. Both kernels use the same
// CTA shapes (warps splitting K over RS 16-row strips x NT 8-token tiles) and fragment mapping,
// and scale the converted weights by 2^-10 (undone by the epilogue). A CTA is WR row groups of
// WK warps (the group's warps split K); kWoCtaShapes lists the shapes built.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "jax_gmma/groups.cuh"
#include "jax_gmma/weightonly_api.h"

namespace jax_gmma {
namespace wo_detail {

// Measurement hook of benchmarks/kernels/bench_weightonly_kernel.cu (the library never sets it; results are
// wrong when it is nonzero): 1 = one 8-token MMA per k16 slice (the others and their activation
// loads dropped), 2 = every 8-token tile multiplies tile 0's activations (their loads dropped).
// Accumulators start at distinct values so that no MMA chain is merged with another.
#ifndef JAX_GMMA_WO_ABLATE
#define JAX_GMMA_WO_ABLATE 0
#endif

struct WoParams {
  int64_t m, n, k;
  const __nv_bfloat16* x;
  const float* x_scale;
  const uint8_t* w;
  const uint8_t* s;
  const float* w_global;
  const void* bias;
  void* d;
  int64_t x_groups;  // the tensor-core kernel's tiled x: 8-token groups per 64-K step
};

inline WoParams make_params(const WoArgs& a) {
  return WoParams{a.m,
                  a.n,
                  a.k,
                  static_cast<const __nv_bfloat16*>(a.x),
                  a.x_scale,
                  static_cast<const uint8_t*>(a.w_packed),
                  static_cast<const uint8_t*>(a.w_scales),
                  a.w_global,
                  a.bias,
                  a.d,
                  a.x_rows / 8};
}

// Weights are read once: no L1 allocation.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_u16(const void* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Scales one k16 slice of raw bf16x2 weight pairs (A registers a0..a3: rows g, g + 8, g, g + 8)
// by the rows' multipliers: F(row g) for a0, a2 and F(row g + 8) for a1, a3.
__device__ __forceinline__ void scale_slice(uint32_t (&a)[4], uint32_t f_lo, uint32_t f_hi) {
  a[0] = mul_bf16x2(a[0], f_lo);
  a[1] = mul_bf16x2(a[1], f_hi);
  a[2] = mul_bf16x2(a[2], f_lo);
  a[3] = mul_bf16x2(a[3], f_hi);
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename OutT>
__device__ __forceinline__ float to_float(OutT v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename OutT>
__device__ __forceinline__ OutT from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The CTA's end: every warp's partial sums (its K steps) go through shared memory, summed in a
// fixed order, times alpha (2^10, the per-tensor and per-token scales), plus bias, cast, stored.
// The CTA is WR row groups of WK warps; warp w = wr * WK + wk owns rows
// [kRows wr, kRows (wr + 1)) of the CTA and K steps wk, wk + WK, ...; an output sums the WK
// warps of its row group, in warp order (deterministic).
// C fragment: c0, c1 -> (row g, tokens 2t, 2t+1), c2, c3 -> (row g + 8, same tokens).
template <int RS, int NT, int WK, int WR, typename OutT>
__device__ __forceinline__ void reduce_store(const WoParams& p, float (&acc)[RS][NT][4],
                                             int64_t cta_strip0, int64_t tok0) {
  constexpr int kRows = RS * 16, kCols = NT * 8, kCtaRows = kRows * WR;
  __shared__ float red[WK * WR][kCols][kRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int r = 0; r < RS; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = r * 16 + g, col = nt * 8 + 2 * t;
      red[warp][col][row] = acc[r][nt][0];
      red[warp][col + 1][row] = acc[r][nt][1];
      red[warp][col][row + 8] = acc[r][nt][2];
      red[warp][col + 1][row + 8] = acc[r][nt][3];
    }
  __syncthreads();

  const float alpha0 = 1024.f * (p.w_global ? *p.w_global : 1.f);  // 2^10 undoes F's 2^-10
  const OutT* bias = static_cast<const OutT*>(p.bias);
  OutT* d = static_cast<OutT*>(p.d);
  for (int e = threadIdx.x; e < kCtaRows * kCols; e += WK * WR * 32) {
    const int crow = e % kCtaRows, col = e / kCtaRows;
    const int wr = crow / kRows, row = crow % kRows;
    const int64_t tok = tok0 + col;
    if (tok >= p.m) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) sum += red[wr * WK + w][col][row];
    const float alpha = p.x_scale ? alpha0 * p.x_scale[tok] : alpha0;
    const int64_t n = cta_strip0 * 16 + crow;
    float v = sum * alpha;
    if (bias) v += to_float<OutT>(bias[n]);
    d[tok * p.n + n] = from_float<OutT>(v);
  }
}

// A lane's activation rows (token tok0 + 8 nt + g, K offset 16 t) and their loads for one K step
// of 64 (two 16-byte loads per 8-token tile; activations are L2-resident). Token rows past M read
// row M - 1: their output columns are computed but never stored.
template <int NT>
struct XRows {
  const __nv_bfloat16* row[NT];
  __device__ __forceinline__ XRows(const WoParams& p, int64_t tok0, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int64_t tok = tok0 + nt * 8 + g;
      row[nt] = p.x + (tok < p.m ? tok : p.m - 1) * p.k + 16 * t;
    }
  }
  // K step j (K = 64 j .. 64 j + 63).
  __device__ __forceinline__ void load(int64_t j, uint4 (&x)[NT][2]) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#if JAX_GMMA_WO_ABLATE == 2  // measurement hook (wrong results): tiles nt > 0 reuse tile 0's data
      if (nt > 0) {
        x[nt][0] = x[0][0];
        x[nt][1] = x[0][1];
        continue;
      }
#endif
      const uint4* px = reinterpret_cast<const uint4*>(row[nt] + j * 64);
      x[nt][0] = __ldg(px);
      x[nt][1] = __ldg(px + 1);
    }
  }
};

template <int RS, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[RS][NT][4]) {
#pragma unroll
  for (int r = 0; r < RS; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][nt][i] = JAX_GMMA_WO_ABLATE ? 1e-30f * nt : 0.f;
}

// A warp's K steps are wk, wk + WK, ... (wk = warp % WK): how many of the ksteps it has.
template <int WK>
__device__ __forceinline__ int64_t warp_ksteps(int64_t ksteps, int wk) {
  return ksteps > wk ? (ksteps - wk + WK - 1) / WK : 0;
}

// Where warp `warp` of CTA `cta` works: its K-step phase wk, its first 16-row strip, and the
// CTA's first strip (RS strips per warp, WR row groups of WK warps per CTA).
template <int RS, int WK, int WR>
struct WarpPlace {
  int wk;
  int64_t strip0, cta_strip0;
  __device__ __forceinline__ WarpPlace(int cta, int warp)
      : wk(warp % WK),
        strip0(static_cast<int64_t>(cta) * (RS * WR) + (warp / WK) * RS),
        cta_strip0(static_cast<int64_t>(cta) * (RS * WR)) {}
};

// One k16 slice q (0..3) of a K step for one 16-row strip: the scaled bf16x2 A registers a0..a3
// (rows g / g + 8, k 4q + 0..1 / 4q + 2..3) times each 8-token tile's activations.
template <int NT>
__device__ __forceinline__ void mma_tiles(float (&acc)[NT][4], uint32_t a0, uint32_t a1,
                                          uint32_t a2, uint32_t a3, const uint4 (&x)[NT][2],
                                          int q) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#if JAX_GMMA_WO_ABLATE == 1  // measurement hook (wrong results): one 8-token MMA per slice
    if (nt > 0) continue;
#endif
    const uint4& xb = x[nt][q >> 1];
    const uint32_t b0 = (q & 1) ? xb.z : xb.x;
    const uint32_t b1 = (q & 1) ? xb.w : xb.y;
    mma_bf16(acc[nt], a0, a1, a2, a3, b0, b1);
  }
}

// The K loop of both kernels: each warp walks its K steps with the weights D steps ahead in a
// register ring (slot = step % D) and the activations one step ahead (slot = step % 2).
// load_x(i, slot) / load_w(i, slot) fill a slot for K step i; step(slot) multiplies one step.
// Unrolled by D so every slot index is a compile-time constant (the rings stay in registers).
template <int D, class LoadX, class Step, class LoadW>
__device__ __forceinline__ void ring_k_loop(int64_t nsteps, LoadX&& load_x, Step&& step,
                                            LoadW&& load_w) {
  int64_t i0 = 0;
  for (; i0 + D <= nsteps; i0 += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const int64_t i = i0 + u;
      if (i + 1 < nsteps) load_x(i + 1, (u + 1) & 1);
      step(u);
      if (i + D < nsteps) load_w(i + D, u);
    }
  }
  // The last nsteps % D steps (already loaded into ring slots 0 .. nsteps % D - 1).
#pragma unroll
  for (int u = 0; u < D - 1; ++u) {
    const int64_t i = i0 + u;
    if (i < nsteps) {
      if (i + 1 < nsteps) load_x(i + 1, (u + 1) & 1);
      step(u);
    }
  }
}

// The CTA shapes the decode kernels are built for, one row each: RS 16-row strips per warp,
// NT 8-token tiles, WR row groups of WK warps (the WK warps of a group split K), i.e. a CTA of
// WK WR warps and 16 RS WR rows x 8 NT tokens. WoArgs names a shape by (rows_per_cta,
// tokens_per_cta, k_warps); weightonly_check accepts exactly these.
struct WoCtaShape {
  int rs, nt, wk, wr;
  constexpr int rows() const { return 16 * rs * wr; }
};
// Tuning builds of benchmarks/kernels/bench_weightonly_kernel.cu try other tables (the library never sets
// it): `-include shapes.h` with `#define JAX_GMMA_WO_CTA_SHAPES` and the rows (rs, nt, wk, wr
// each; nvcc splits a -D value at its commas, hence the header). tests/test_weightonly.py reads
// the rows below.
constexpr WoCtaShape kWoCtaShapes[] = {
#ifdef JAX_GMMA_WO_CTA_SHAPES
    JAX_GMMA_WO_CTA_SHAPES
#else
    // 8 warps along K (the original shapes: 16 / 32 / 64 rows x 8 / 16 tokens)
    {1, 1, 8, 1}, {1, 2, 8, 1}, {2, 1, 8, 1}, {2, 2, 8, 1}, {4, 1, 8, 1}, {4, 2, 8, 1},
    // the weightonly_pick shapes with other K splits (benchmarks/kernels/bench_weightonly_kernel.cu)
    {1, 1, 16, 1}, {1, 1, 4, 1}, {1, 2, 4, 1}, {2, 2, 4, 1}, {2, 2, 2, 1}, {1, 2, 2, 4},
    {1, 1, 2, 1},
#endif
};
constexpr int kWoCtaShapeCount = static_cast<int>(sizeof(kWoCtaShapes) / sizeof(kWoCtaShapes[0]));

// Each (rows, tokens, k_warps) names one row: two rows with the same name would make one of
// them unreachable.
constexpr bool wo_cta_shapes_distinct() {
  for (int i = 0; i < kWoCtaShapeCount; ++i)
    for (int j = i + 1; j < kWoCtaShapeCount; ++j)
      if (kWoCtaShapes[i].rows() == kWoCtaShapes[j].rows() &&
          kWoCtaShapes[i].nt == kWoCtaShapes[j].nt && kWoCtaShapes[i].wk == kWoCtaShapes[j].wk)
        return false;
  return true;
}
static_assert(wo_cta_shapes_distinct(), "kWoCtaShapes: two rows share (rows, tokens, k_warps)");

// The row of kWoCtaShapes for (rows per CTA, tokens per CTA, warps along K), or -1.
inline int wo_cta_shape_index(int rows, int tokens, int k_warps) {
  for (int i = 0; i < kWoCtaShapeCount; ++i) {
    const WoCtaShape& c = kWoCtaShapes[i];
    if (c.rows() == rows && 8 * c.nt == tokens && c.wk == k_warps) return i;
  }
  return -1;
}

// Host: one launch of a weight-only kernel instantiated for CTA shape (RS, NT, WK, WR) (grid:
// N / (16 RS WR) x ceil(M / (8 NT)), WK WR warps, static shared memory only).
template <int RS, int NT, int WK, int WR>
cudaError_t launch_tile(const WoArgs& a, cudaStream_t stream, void (*kernel)(WoParams)) {
  const WoParams p = make_params(a);
  constexpr int kCtaRows = 16 * RS * WR;
  const dim3 grid(static_cast<unsigned>(a.n / kCtaRows),
                  static_cast<unsigned>((a.m + NT * 8 - 1) / (NT * 8)));
  kernel<<<grid, WK * WR * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

// ---- Grouped (mixture-of-experts) weight-only GEMM: the expert slots of
// cpp/include/jax_gmma/groups.cuh on the grid's y, the CTA's rows of N on its x. The experts'
// prepared weights, scale codes, global scales (NVFP4) and bias rows lie back to back.
struct WoGroupedParams {
  WoParams p;             // m: A's rows; w, s, w_global, bias: expert 0's
  groups::Groups groups;
  int64_t w_expert, s_expert;  // bytes between two experts' codes / scale codes
};

// The body of a grouped kernel: `tile(q, tok0)` runs one CTA tile (the dense kernel's body) on
// expert parameters q for tokens tok0 .. tok0 + 8 NT - 1.
template <int kCtaRows, int kTileTokens, typename OutT, class Tile>
__device__ __forceinline__ void wo_grouped(const WoGroupedParams& gp, Tile&& tile) {
  const WoParams& p = gp.p;
  const int64_t r0 = __ldg(gp.groups.row_ids);
  const bool fill = blockIdx.y == gridDim.y - 1;
  const groups::Slot s = groups::find_slot(gp.groups, r0, p.m, fill ? 0 : blockIdx.y);
  if (fill) {
    groups::fill_rows<kCtaRows>(static_cast<OutT*>(p.d), p.n, p.m,
                                static_cast<int64_t>(blockIdx.x) * kCtaRows, s, r0,
                                [](float v) { return from_float<OutT>(v); });
    return;
  }
  if (s.negative || s.expert < 0) return;
  const int64_t lo = max(s.begin - r0, int64_t{0}), hi = min(s.end - r0, p.m);
  WoParams q = p;
  q.m = hi;  // tokens past the expert's rows read its last row and are not stored
  q.w = p.w + s.expert * gp.w_expert;
  q.s = p.s + s.expert * gp.s_expert;
  if (p.w_global) q.w_global = p.w_global + s.expert;
  if (p.bias) q.bias = static_cast<const OutT*>(p.bias) + s.expert * p.n;
  for (int64_t tok0 = lo; tok0 < hi; tok0 += kTileTokens) {
    tile(q, tok0);
    __syncthreads();  // the next tile reuses the reduction's shared memory
  }
}

// The CTA shapes the grouped kernels are built for (16 rows; 8 or 16 tokens; 4 or 8 warps
// along K): rows of kWoCtaShapes.
constexpr WoCtaShape kWoGroupedShapes[] = {{1, 1, 8, 1}, {1, 2, 8, 1}, {1, 1, 4, 1}, {1, 2, 4, 1}};
constexpr int kWoGroupedShapeCount = static_cast<int>(sizeof(kWoGroupedShapes) / sizeof(kWoGroupedShapes[0]));
inline bool wo_grouped_shape(const WoCta& c) {
  for (const WoCtaShape& s : kWoGroupedShapes)
    if (s.rows() == c.rows && 8 * s.nt == c.tokens && s.wk == c.k_warps) return true;
  return false;
}

// Host: one launch of a grouped kernel (grid: N / (16 RS WR) x the expert slots).
inline WoGroupedParams make_grouped_params(const WoArgs& a, const WoGroups& gr) {
  return WoGroupedParams{make_params(a), {gr.sizes, gr.row_ids, gr.count},
                         a.n / 16 * (a.k / 64) * weightonly_tile_bytes(a.scale),
                         a.n / 16 * (a.k / 64) * weightonly_scale_bytes(a.scale)};
}

template <int RS, int NT, int WK, int WR>
cudaError_t launch_grouped_tile(const WoArgs& a, const WoGroups& gr, cudaStream_t stream,
                                void (*kernel)(WoGroupedParams)) {
  constexpr int kCtaRows = 16 * RS * WR;
  const WoGroupedParams gp = make_grouped_params(a, gr);
  const dim3 grid(static_cast<unsigned>(a.n / kCtaRows),
                  static_cast<unsigned>(groups::slots(gp.groups, a.m)));
  kernel<<<grid, WK * WR * 32, 0, stream>>>(gp);
  return cudaGetLastError();
}

// Host: calls launch(RS, NT, WK, WR) for the kWoGroupedShapes row matching c.
template <int I = 0, class F>
cudaError_t dispatch_grouped_shape(const WoCta& c, F&& launch) {
  if constexpr (I >= kWoGroupedShapeCount) {
    return cudaErrorInvalidValue;
  } else {
    constexpr WoCtaShape s = kWoGroupedShapes[I];
    if (s.rows() == c.rows && 8 * s.nt == c.tokens && s.wk == c.k_warps)
      return launch(std::integral_constant<int, s.rs>{}, std::integral_constant<int, s.nt>{},
                    std::integral_constant<int, s.wk>{}, std::integral_constant<int, s.wr>{});
    return dispatch_grouped_shape<I + 1>(c, launch);
  }
}

// Host: calls launch(RS, NT, WK, WR) (as std::integral_constant) for the kWoCtaShapes row
// `index`; the recursion instantiates every row.
template <int I, class F>
cudaError_t dispatch_cta_shape_from(int index, F&& launch) {
  if constexpr (I >= kWoCtaShapeCount) {
    return cudaErrorInvalidValue;
  } else {
    if (index == I) {
      constexpr WoCtaShape c = kWoCtaShapes[I];
      return launch(std::integral_constant<int, c.rs>{}, std::integral_constant<int, c.nt>{},
                    std::integral_constant<int, c.wk>{}, std::integral_constant<int, c.wr>{});
    }
    return dispatch_cta_shape_from<I + 1>(index, launch);
  }
}
template <class F>
cudaError_t dispatch_tile_shape(int rows, int tokens, int k_warps, F&& launch) {
  return dispatch_cta_shape_from<0>(wo_cta_shape_index(rows, tokens, k_warps), launch);
}

// ---------------------------------------------------------------------------------------------
// Unpack (the prefill path): the prepared weight -> a plain row-major (N, K) bf16 or e4m3 matrix
// for a tensor-core GEMM. One kernel launch, no workspace. A warp converts whole 16 x 64 tiles
// (tile = strip * K/64 + K step, the prepared order), a CTA kUnpackWarps x kUnpackTiles
// consecutive tiles, all its loads issued before the first store. Lane (g, t) of a tile decodes
// exactly what it feeds the GEMM's mma.sync (the same helpers) and writes 16 contiguous elements
// of rows 16 s + g and 16 s + g + 8 at K 64 j + 16 t.

struct UnpackParams {
  int64_t k;                // padded K (row length of the output)
  uint32_t ntiles, ksteps;  // N/16 * K/64, K/64
  const uint8_t* w;
  const uint8_t* s;
  const int32_t* row_exp;   // FP8 output: (N,) biased exponents
  void* out;
};

constexpr int kUnpackWarps = 8;
#ifndef JAX_GMMA_WO_UNPACK_TILES
#define JAX_GMMA_WO_UNPACK_TILES 4
#endif
constexpr int kUnpackTiles = JAX_GMMA_WO_UNPACK_TILES;  // tiles per warp (per CTA: x kUnpackWarps)

// (2^x, 2^x) as bf16x2, x in -126 .. 127.
__device__ __forceinline__ uint32_t pow2_bf16x2(int x) {
  return static_cast<uint32_t>((x + 127) << 7) * 0x10001u;
}

// Row factor of the FP8 output: 2^(127 - e) on w, times the 2^10 that undoes the decode's
// 2^-10, as two bf16 powers of two (fa * fb = 2^(137 - e), each a normal number). e is clamped
// to [-115, 389]: at the ends every nonzero weight already saturates (or flushes to zero), so
// the result is exact for any int32 e. The two multiplies cannot overflow or underflow where
// the final product does not (same sign of exponent), so the result is rn(w * 2^(127 - e)).
__device__ __forceinline__ void fp8_row_factors(int32_t e, uint32_t& fa, uint32_t& fb) {
  const int c = 137 - min(max(e, -115), 389);  // -252 .. 252
  const int a = c >> 1;
  fa = pow2_bf16x2(a);
  fb = pow2_bf16x2(c - a);
}

// Two bf16x2 (elements 0, 1 | 2, 3) -> four e4m3 bytes (element 0 lowest): rn, satfinite
// (finite out-of-range values give +-448), NaN -> 0x7F.
__device__ __forceinline__ uint32_t bf16x4_to_e4m3x4(uint32_t p01, uint32_t p23) {
  const float f0 = __uint_as_float(p01 << 16), f1 = __uint_as_float(p01 & 0xFFFF0000u);
  const float f2 = __uint_as_float(p23 << 16), f3 = __uint_as_float(p23 & 0xFFFF0000u);
  uint32_t d;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(d)
      : "f"(f0), "f"(f1), "f"(f2), "f"(f3));
  return d;
}

__device__ __forceinline__ void st_v4(void* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

#ifndef JAX_GMMA_WO_UNPACK_XCHG
#define JAX_GMMA_WO_UNPACK_XCHG 1  // bf16 output: pair lanes so each store writes whole sectors
#endif

// bf16 output of one row: the lane holds chunks 2t, 2t + 1 (16 bytes each) of the row's 128-byte
// run. Lanes t, t ^ 1 swap one chunk so that each 16-byte store instruction covers whole 32-byte
// sectors: store A of lanes (2u, 2u + 1) writes chunks 4u, 4u + 1, store B chunks 4u + 2, 4u + 3.
// `ok` guards the stores only (the shuffles need the whole warp).
__device__ __forceinline__ void store_bf16_row(__nv_bfloat16* row, int t, uint4 c0, uint4 c1,
                                               bool ok) {
#if JAX_GMMA_WO_UNPACK_XCHG
  const bool odd = t & 1;
  const uint4 send = odd ? c0 : c1;
  uint4 recv;
  recv.x = __shfl_xor_sync(0xFFFFFFFFu, send.x, 1);
  recv.y = __shfl_xor_sync(0xFFFFFFFFu, send.y, 1);
  recv.z = __shfl_xor_sync(0xFFFFFFFFu, send.z, 1);
  recv.w = __shfl_xor_sync(0xFFFFFFFFu, send.w, 1);
  uint8_t* base = reinterpret_cast<uint8_t*>(row) + 64 * (t >> 1) + 16 * (t & 1);
  if (ok) {
    st_v4(base, odd ? recv : c0);
    st_v4(base + 32, odd ? c1 : recv);
  }
#else
  uint8_t* base = reinterpret_cast<uint8_t*>(row) + 32 * t;
  if (ok) {
    st_v4(base, c0);
    st_v4(base + 16, c1);
  }
#endif
}

// The unpack kernel. Tile (per format) provides
//   Regs;  load(p, tile, lane) -> Regs;  scales(regs, f_lo, f_hi): the rows' bf16x2 multipliers;
//   slices(regs, f_lo, f_hi, a): a[q][0..3] = the scaled A registers of k16 slice q
//   (value * scale * 2^-10: rows g, g + 8, g, g + 8 at k 4q + 0..1, 4q + 0..1, 4q + 2..3, 4q + 2..3).
template <class Tile, bool FP8>
__global__ void __launch_bounds__(kUnpackWarps * 32) wo_unpack_kernel(const UnpackParams p) {
  constexpr uint32_t kPerCta = kUnpackWarps * kUnpackTiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t ngroups = (p.ntiles + kPerCta - 1) / kPerCta;
  for (uint32_t grp = blockIdx.x; grp < ngroups; grp += gridDim.x) {
    typename Tile::Regs regs[kUnpackTiles];
    uint32_t strip[kUnpackTiles], kstep[kUnpackTiles];
    int32_t e0[kUnpackTiles], e1[kUnpackTiles];
#pragma unroll
    for (int i = 0; i < kUnpackTiles; ++i) {
      // Past the last tile (the last CTA only): redo the last tile, store nothing. No branch
      // around the decode, so the bf16 path's shuffles stay unconditional.
      const uint32_t tile = min(grp * kPerCta + i * kUnpackWarps + warp, p.ntiles - 1);
      regs[i] = Tile::load(p, tile, lane);
      strip[i] = tile / p.ksteps;
      kstep[i] = tile - strip[i] * p.ksteps;
      if constexpr (FP8) {
        const int32_t* re = p.row_exp + 16 * static_cast<size_t>(strip[i]) + g;
        e0[i] = __ldg(re);
        e1[i] = __ldg(re + 8);
      }
    }
#pragma unroll
    for (int i = 0; i < kUnpackTiles; ++i) {
      const bool ok = grp * kPerCta + i * kUnpackWarps + warp < p.ntiles;
      uint32_t f_lo, f_hi;
      Tile::scales(regs[i], f_lo, f_hi);
      const int64_t row0 = 16 * static_cast<int64_t>(strip[i]) + g;
      const int64_t col = 64 * static_cast<int64_t>(kstep[i]);
      uint32_t a[4][4];
      if constexpr (FP8) {
        // A poisoned block's multiplier is Inf (or NaN): make it NaN, so that every weight of
        // the block converts to NaN instead of saturating to 448.
        f_lo = fma_bf16x2(f_lo, 0u, f_lo);
        f_hi = fma_bf16x2(f_hi, 0u, f_hi);
        Tile::slices(regs[i], f_lo, f_hi, a);
        uint32_t fa0, fb0, fa1, fb1;
        fp8_row_factors(e0[i], fa0, fb0);
        fp8_row_factors(e1[i], fa1, fb1);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          a[q][0] = mul_bf16x2(mul_bf16x2(a[q][0], fa0), fb0);
          a[q][2] = mul_bf16x2(mul_bf16x2(a[q][2], fa0), fb0);
          a[q][1] = mul_bf16x2(mul_bf16x2(a[q][1], fa1), fb1);
          a[q][3] = mul_bf16x2(mul_bf16x2(a[q][3], fa1), fb1);
        }
        uint8_t* out = static_cast<uint8_t*>(p.out);
        const uint4 v0 =
            make_uint4(bf16x4_to_e4m3x4(a[0][0], a[0][2]), bf16x4_to_e4m3x4(a[1][0], a[1][2]),
                       bf16x4_to_e4m3x4(a[2][0], a[2][2]), bf16x4_to_e4m3x4(a[3][0], a[3][2]));
        const uint4 v1 =
            make_uint4(bf16x4_to_e4m3x4(a[0][1], a[0][3]), bf16x4_to_e4m3x4(a[1][1], a[1][3]),
                       bf16x4_to_e4m3x4(a[2][1], a[2][3]), bf16x4_to_e4m3x4(a[3][1], a[3][3]));
        if (ok) {
          st_v4(out + row0 * p.k + col + 16 * t, v0);
          st_v4(out + (row0 + 8) * p.k + col + 16 * t, v1);
        }
      } else {
        Tile::slices(regs[i], f_lo, f_hi, a);
        constexpr uint32_t k1024 = 0x44804480u;  // bf16x2 (2^10, 2^10): undoes the 2^-10, exact
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int r = 0; r < 4; ++r) a[q][r] = mul_bf16x2(a[q][r], k1024);
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
        store_bf16_row(out + row0 * p.k + col, t,
                       make_uint4(a[0][0], a[0][2], a[1][0], a[1][2]),
                       make_uint4(a[2][0], a[2][2], a[3][0], a[3][2]), ok);
        store_bf16_row(out + (row0 + 8) * p.k + col, t,
                       make_uint4(a[0][1], a[0][3], a[1][1], a[1][3]),
                       make_uint4(a[2][1], a[2][3], a[3][1], a[3][3]), ok);
      }
    }
  }
}

// Host: one launch of the unpack kernel for Tile (after weightonly_unpack_check passed).
template <class Tile>
cudaError_t launch_unpack(const WoUnpackArgs& a, cudaStream_t stream) {
  UnpackParams p;
  p.k = a.k;
  p.ksteps = static_cast<uint32_t>(a.k / 64);
  p.ntiles = static_cast<uint32_t>(a.n / 16 * (a.k / 64));
  p.w = static_cast<const uint8_t*>(a.w_packed);
  p.s = static_cast<const uint8_t*>(a.w_scales);
  p.row_exp = a.row_exp;
  p.out = a.out;
  constexpr uint32_t kPerCta = kUnpackWarps * kUnpackTiles;
  const unsigned grid = (p.ntiles + kPerCta - 1) / kPerCta;
  if (a.out_fp8)
    wo_unpack_kernel<Tile, true><<<grid, kUnpackWarps * 32, 0, stream>>>(p);
  else
    wo_unpack_kernel<Tile, false><<<grid, kUnpackWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace wo_detail

// The MXFP6 kernel family (cpp/sm90_fp6_gemm_weightonly.cu), called by weightonly_run for
// a.scale == kMx6E2M3 / kMx6E3M2 once weightonly_check passed and the tile is resolved.
cudaError_t weightonly_fp6_run(const WoArgs& a, const WoCta& c, cudaStream_t stream);
cudaError_t weightonly_fp6_grouped_run(const WoArgs& a, const WoGroups& g, const WoCta& c,
                                       cudaStream_t stream);
// The MXFP6 unpack kernels, called by weightonly_unpack_run once weightonly_unpack_check passed.
cudaError_t weightonly_fp6_unpack_run(const WoUnpackArgs& a, cudaStream_t stream);
// The MXFP6 tensor-core kernels' one-time device setup, called by weightonly_prepare.
cudaError_t weightonly_fp6_prepare();

}  // namespace jax_gmma
