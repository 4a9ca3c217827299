// sm90 FP6 weight-only GEMM (MXFP6 e2m3 / e3m2 weights, E8M0 scale per 32 of K, x bf16
// activations): the decode kernel, the FP6 sibling of cpp/sm90_fp4_gemm_weightonly.cu.
//
// Same structure as the FP4 kernel (swap AB: weights are mma.sync's A, 8 warps splitting K,
// register prefetch ring, shared-memory reduction + epilogue from weightonly_common.cuh); only
// the weight tile and its conversion differ:
//
//  * A 16-row x 64-K tile is 768 bytes; lane l loads 16 bytes at 16 l and 8 bytes at 512 + 8 l:
//    six words, two groups of three (a 96-bit stream each) holding the 16 six-bit codes of two
//    mma.m16n8k16 A operands (8 bf16x2 registers).
//  * A 6-bit code placed at bf16 bits 15 | 8..4 (e2m3: s e1 e0 m2 m1 m0) is the bf16 number
//    value * 2^-126; at 15 | 9..5 (e3m2: s e2 e1 e0 m1 m0) it is value * 2^-124 (e = 0 gives
//    exact bf16 subnormals). One bf16x2 multiply by F = scale * 2^116 (e2m3) or 2^114 (e3m2)
//    gives value * scale * 2^-10 exactly; the epilogue multiplies by 2^10.
//  * Each bf16x2 register is an OR of "pieces" ((funnel-shifted window << shl) & mask): the
//    prepared layout (jax_gmma.weightonly.FP6_PIECES, mirrored by Fp6Pieces below) is chosen so
//    that few logic instructions are needed: e2m3 16 LOP3 + 5 SHF per 16 weights, e3m2 12 LOP3
//    + 4 SHF; the left shifts are IMAD.SHL on the FMA pipe (the FP4 kernel is ALU-bound).
//
// Also here: the FP6 unpack kernels of the prefill path (weightonly_fp6_unpack_run, called by
// weightonly_unpack_run): the same per-lane decode (lane_scales + fp6_group + fp6_slice), written
// out as a plain row-major bf16 or e4m3 matrix by wo_unpack_kernel (weightonly_common.cuh).
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "jax_gmma/weightonly_api.h"
#include "jax_gmma/weightonly_common.cuh"
#include "jax_gmma/weightonly_wgmma.cuh"

namespace jax_gmma {
namespace {
namespace fp6 {

using namespace wo_detail;

constexpr int kTileBytes = 768;   // 16 rows x 64 K of 6-bit codes
constexpr int kScaleBytes = 32;   // E8M0 codes: 16 rows x 2 blocks of 32 K

struct Piece {
  int lo, hi, r, shl;  // window = (word[hi]:word[lo]) >> r (hi < 0: word[lo] >> r); << shl
  uint32_t mask;       // mask == 0: unused slot
};

// Pieces of bf16x2 pair v (0..7) of a three-word group; KEEP IN SYNC with
// jax_gmma/weightonly.py FP6_PIECES (tests/test_weightonly.py compares them).
template <WoScale S>
struct Fp6Pieces;
template <>
struct Fp6Pieces<WoScale::kMx6E2M3> {
  static constexpr int kBias = 116;  // bits(F) = 128 (code + kBias)
  __host__ __device__ static constexpr Piece get(int v, int i) {
    constexpr Piece p[8][3] = {
      {{0, -1, 0, 4, 0x000081F0u}, {0, -1, 0, 14, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{0, 1, 8, 0, 0x000081F0u}, {0, -1, 0, 2, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{0, 1, 20, 0, 0x000081F0u}, {0, 1, 20, 10, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{1, -1, 0, 0, 0x000081F0u}, {1, -1, 0, 4, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{1, 2, 6, 0, 0x000081F0u}, {2, -1, 0, 12, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{1, 2, 18, 0, 0x000081F0u}, {1, 2, 18, 10, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{2, -1, 0, 2, 0x000081F0u}, {2, -1, 0, 6, 0x81F00000u}, {0, -1, 0, 0, 0u}},
      {{2, 0, 22, 0, 0x000081F0u}, {2, -1, 0, 0, 0x81F00000u}, {0, -1, 0, 0, 0u}},
    };
    return p[v][i];
  }
};
template <>
struct Fp6Pieces<WoScale::kMx6E3M2> {
  static constexpr int kBias = 114;
  __host__ __device__ static constexpr Piece get(int v, int i) {
    constexpr Piece p[8][3] = {
      {{0, -1, 0, 0, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{0, -1, 0, 5, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{1, -1, 0, 0, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{1, -1, 0, 5, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{2, -1, 0, 0, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{2, -1, 0, 5, 0x83E083E0u}, {0, -1, 0, 0, 0u}, {0, -1, 0, 0, 0u}},
      {{0, -1, 6, 0, 0x01E001E0u}, {2, -1, 2, 0, 0x02000200u}, {2, -1, 0, 2, 0x80008000u}},
      {{1, -1, 6, 0, 0x01E001E0u}, {2, -1, 3, 0, 0x02000200u}, {2, -1, 0, 1, 0x80008000u}},
    };
    return p[v][i];
  }
};

template <WoScale S, int V>
__device__ __forceinline__ uint32_t fp6_pair(const uint32_t (&w)[3]) {
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const Piece pc = Fp6Pieces<S>::get(V, i);
    if (pc.mask == 0u) continue;
    uint32_t win;
    if (pc.hi < 0)
      win = pc.r ? (w[pc.lo] >> pc.r) : w[pc.lo];
    else
      win = __funnelshift_r(w[pc.lo], w[pc.hi], pc.r);
    // Left shifts as multiplies: IMAD.SHL on the FMA pipe, not the logic pipe.
    out |= (win * (1u << pc.shl)) & pc.mask;
  }
  return out;
}

template <WoScale S>
__device__ __forceinline__ void fp6_group(const uint32_t (&w)[3], uint32_t (&a)[8]) {
  a[0] = fp6_pair<S, 0>(w);
  a[1] = fp6_pair<S, 1>(w);
  a[2] = fp6_pair<S, 2>(w);
  a[3] = fp6_pair<S, 3>(w);
  a[4] = fp6_pair<S, 4>(w);
  a[5] = fp6_pair<S, 5>(w);
  a[6] = fp6_pair<S, 6>(w);
  a[7] = fp6_pair<S, 7>(w);
}

// (F, F) of one row from its E8M0 scale code (byte `sel` of `sc`).
template <WoScale S>
__device__ __forceinline__ uint32_t scale_pair(uint32_t sc, uint32_t sel) {
  constexpr uint32_t kAdd = (uint32_t(Fp6Pieces<S>::kBias) << 7) * 0x10001u;
  return prmt(sc, 0u, sel) * 128u + kAdd;  // E8M0 u -> bf16 exponent u + bias
}

// The lane's row multipliers (F of row g, F of row g + 8) from its 16-bit scale word.
template <WoScale S>
__device__ __forceinline__ void lane_scales(uint32_t sc, uint32_t& f_lo, uint32_t& f_hi) {
  f_lo = scale_pair<S>(sc, 0x4040u);  // row g
  f_hi = scale_pair<S>(sc, 0x4141u);  // row g + 8
}

// The lane's two three-word groups: words 0..2 (the 16-byte load's x, y, z) and 3..5 (its w,
// then the 8-byte load).
__device__ __forceinline__ void fp6_words(const uint4& w, const uint2& w2, uint32_t (&w0)[3],
                                          uint32_t (&w1)[3]) {
  w0[0] = w.x;
  w0[1] = w.y;
  w0[2] = w.z;
  w1[0] = w.w;
  w1[1] = w2.x;
  w1[2] = w2.y;
}

// k16 slice q = 2 grp + m of the lane's tile from the raw pairs `raw` of group grp
// (fp6_group): the scaled A registers a0..a3 (rows g, g + 8, g, g + 8; k 4q + 0..1 / 2..3).
__device__ __forceinline__ void fp6_slice(const uint32_t (&raw)[8], int m, uint32_t f_lo,
                                          uint32_t f_hi, uint32_t (&a)[4]) {
  a[0] = raw[4 * m + 0];
  a[1] = raw[4 * m + 1];
  a[2] = raw[4 * m + 2];
  a[3] = raw[4 * m + 3];
  scale_slice(a, f_lo, f_hi);
}

// One CTA tile: CTA column block `cta` (16 RS WR rows) x tokens tok0 .. tok0 + 8 NT - 1.
template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__device__ __forceinline__ void wo6_gemm_tile(const WoParams& p, int cta, int64_t tok0) {
  static_assert(D % 2 == 0, "the activation double buffer is indexed by step parity");

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ksteps = p.k / 64;
  const WarpPlace<RS, WK, WR> at(cta, warp);
  const int64_t strip0 = at.strip0;
  const int sc_off = (8 * (t >> 1) + g) * 2;
  const uint8_t* wbase = p.w + strip0 * ksteps * kTileBytes + lane * 16;
  const uint8_t* wbase2 = p.w + strip0 * ksteps * kTileBytes + 512 + lane * 8;
  const uint8_t* sbase = p.s + strip0 * ksteps * kScaleBytes + sc_off;

  const XRows<NT> xrows(p, tok0, g, t);
  float acc[RS][NT][4];
  zero_acc(acc);

  const int64_t nsteps = warp_ksteps<WK>(ksteps, at.wk);
  uint4 wr[D][RS];
  uint2 wr2[D][RS];
  uint32_t sr[D][RS];
  uint4 xr[2][NT][2];
  auto load_w = [&](int64_t i, uint4 (&w)[RS], uint2 (&w2)[RS], uint32_t (&s)[RS]) {
    const int64_t j = at.wk + i * WK;
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      w[r] = ld_stream(wbase + (r * ksteps + j) * kTileBytes);
      w2[r] = ld_stream8(wbase2 + (r * ksteps + j) * kTileBytes);
      s[r] = ld_u16(sbase + (r * ksteps + j) * kScaleBytes);
    }
  };
  auto load_x = [&](int64_t i, uint4 (&x)[NT][2]) { xrows.load(at.wk + i * WK, x); };
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < nsteps) load_w(u, wr[u], wr2[u], sr[u]);
  if (nsteps > 0) load_x(0, xr[0]);

  auto step = [&](int u) {
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      uint32_t f_lo, f_hi;
      lane_scales<S>(sr[u][r], f_lo, f_hi);
      uint32_t w0[3], w1[3];
      fp6_words(wr[u][r], wr2[u][r], w0, w1);
#pragma unroll
      for (int grp = 0; grp < 2; ++grp) {
        uint32_t raw[8];
        fp6_group<S>(grp ? w1 : w0, raw);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          uint32_t a[4];
          fp6_slice(raw, m, f_lo, f_hi, a);
          mma_tiles(acc[r], a[0], a[1], a[2], a[3], xr[u & 1], 2 * grp + m);
        }
      }
    }
  };
  ring_k_loop<D>(
      nsteps, [&](int64_t i, int slot) { load_x(i, xr[slot]); }, step,
      [&](int64_t i, int slot) { load_w(i, wr[slot], wr2[slot], sr[slot]); });
  reduce_store<RS, NT, WK, WR, OutT>(p, acc, at.cta_strip0, tok0);
}

template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__global__ void __launch_bounds__(WK * WR * 32) wo6_gemm_kernel(const WoParams p) {
  wo6_gemm_tile<RS, NT, WK, WR, S, OutT, D>(p, blockIdx.x, static_cast<int64_t>(blockIdx.y) * (NT * 8));
}

// The grouped kernel (mixture-of-experts; wo_grouped in weightonly_common.cuh).
template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__global__ void __launch_bounds__(WK * WR * 32) wo6_grouped_kernel(const WoGroupedParams gp) {
  wo_grouped<16 * RS * WR, 8 * NT, OutT>(gp, [](const WoParams& q, int64_t tok0) {
    wo6_gemm_tile<RS, NT, WK, WR, S, OutT, D>(q, blockIdx.x, tok0);
  });
}

// The unpack kernel's view of an FP6 tile (see wo_unpack_kernel in weightonly_common.cuh).
template <WoScale S>
struct Fp6Tile {
  struct Regs {
    uint4 w;
    uint2 w2;
    uint32_t s;
  };
  static __device__ __forceinline__ Regs load(const UnpackParams& p, uint32_t tile, int lane) {
    const uint8_t* w = p.w + static_cast<size_t>(tile) * kTileBytes;
    Regs r;
    r.w = ld_stream(w + lane * 16);
    r.w2 = ld_stream8(w + 512 + lane * 8);
    r.s = ld_u16(p.s + static_cast<size_t>(tile) * kScaleBytes + (8 * ((lane & 3) >> 1) + (lane >> 2)) * 2);
    return r;
  }
  static __device__ __forceinline__ void scales(const Regs& r, uint32_t& f_lo, uint32_t& f_hi) {
    lane_scales<S>(r.s, f_lo, f_hi);
  }
  static __device__ __forceinline__ void slices(const Regs& r, uint32_t f_lo, uint32_t f_hi,
                                                uint32_t (&a)[4][4]) {
    uint32_t w0[3], w1[3];
    fp6_words(r.w, r.w2, w0, w1);
#pragma unroll
    for (int grp = 0; grp < 2; ++grp) {
      uint32_t raw[8];
      fp6_group<S>(grp ? w1 : w0, raw);
      fp6_slice(raw, 0, f_lo, f_hi, a[2 * grp]);
      fp6_slice(raw, 1, f_lo, f_hi, a[2 * grp + 1]);
    }
  }
};

#ifndef JAX_GMMA_WO6_TC_DEPTH
#define JAX_GMMA_WO6_TC_DEPTH 2  // the tensor-core kernel's weight prefetch depth (K steps of 64)
#endif
constexpr int kWo6TcDepth = JAX_GMMA_WO6_TC_DEPTH;

#ifndef JAX_GMMA_WO6_DEPTH
#define JAX_GMMA_WO6_DEPTH 4  // weight prefetch depth (K steps of 64 in flight per warp)
#endif

template <WoScale S, typename OutT, int D = JAX_GMMA_WO6_DEPTH>
cudaError_t dispatch_tile(const WoArgs& a, const WoCta& c, cudaStream_t stream) {
  if (c.tokens >= 32)  // the tensor-core kernel (weightonly_wgmma.cuh)
    return launch_tc<Fp6Tile<S>, OutT, kWo6TcDepth>(a, wo_tc_shape_index(c.rows, c.tokens, c.k_warps), stream);
  return dispatch_tile_shape(c.rows, c.tokens, c.k_warps, [&](auto rs, auto nt, auto wk, auto wr) {
    constexpr int RS = decltype(rs)::value, NT = decltype(nt)::value;
    constexpr int WK = decltype(wk)::value, WR = decltype(wr)::value;
    return launch_tile<RS, NT, WK, WR>(a, stream, wo6_gemm_kernel<RS, NT, WK, WR, S, OutT, D>);
  });
}

template <WoScale S>
cudaError_t dispatch_out(const WoArgs& a, const WoCta& c, cudaStream_t stream) {
  return a.d_is_f32 ? dispatch_tile<S, float>(a, c, stream)
                    : dispatch_tile<S, __nv_bfloat16>(a, c, stream);
}

template <WoScale S, typename OutT>
cudaError_t dispatch_grouped(const WoArgs& a, const WoGroups& gr, const WoCta& c, cudaStream_t stream) {
  if (c.tokens >= 32)  // the tensor-core kernel (weightonly_wgmma.cuh)
    return launch_tc<Fp6Tile<S>, OutT, kWo6TcDepth>(a, wo_tc_shape_index(c.rows, c.tokens, c.k_warps), stream, &gr);
  return dispatch_grouped_shape(c, [&](auto rs, auto nt, auto wk, auto wr) {
    constexpr int RS = decltype(rs)::value, NT = decltype(nt)::value;
    constexpr int WK = decltype(wk)::value, WR = decltype(wr)::value;
    return launch_grouped_tile<RS, NT, WK, WR>(a, gr, stream,
                                               wo6_grouped_kernel<RS, NT, WK, WR, S, OutT, JAX_GMMA_WO6_DEPTH>);
  });
}

template <WoScale S>
cudaError_t dispatch_grouped_out(const WoArgs& a, const WoGroups& gr, const WoCta& c, cudaStream_t stream) {
  return a.d_is_f32 ? dispatch_grouped<S, float>(a, gr, c, stream)
                    : dispatch_grouped<S, __nv_bfloat16>(a, gr, c, stream);
}

}  // namespace fp6
}  // namespace

cudaError_t weightonly_fp6_unpack_run(const WoUnpackArgs& a, cudaStream_t stream) {
  if (a.scale == WoScale::kMx6E2M3) return wo_detail::launch_unpack<fp6::Fp6Tile<WoScale::kMx6E2M3>>(a, stream);
  if (a.scale == WoScale::kMx6E3M2) return wo_detail::launch_unpack<fp6::Fp6Tile<WoScale::kMx6E3M2>>(a, stream);
  return cudaErrorInvalidValue;
}

cudaError_t weightonly_fp6_grouped_run(const WoArgs& a, const WoGroups& g, const WoCta& c,
                                       cudaStream_t stream) {
  if (a.scale == WoScale::kMx6E2M3) return fp6::dispatch_grouped_out<WoScale::kMx6E2M3>(a, g, c, stream);
  if (a.scale == WoScale::kMx6E3M2) return fp6::dispatch_grouped_out<WoScale::kMx6E3M2>(a, g, c, stream);
  return cudaErrorInvalidValue;
}

cudaError_t weightonly_fp6_prepare() {
  using namespace wo_detail;
  for (cudaError_t e : {prepare_tc<fp6::Fp6Tile<WoScale::kMx6E2M3>, float, fp6::kWo6TcDepth>(),
                        prepare_tc<fp6::Fp6Tile<WoScale::kMx6E2M3>, __nv_bfloat16, fp6::kWo6TcDepth>(),
                        prepare_tc<fp6::Fp6Tile<WoScale::kMx6E3M2>, float, fp6::kWo6TcDepth>(),
                        prepare_tc<fp6::Fp6Tile<WoScale::kMx6E3M2>, __nv_bfloat16, fp6::kWo6TcDepth>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t weightonly_fp6_run(const WoArgs& a, const WoCta& c, cudaStream_t stream) {
  if (a.scale == WoScale::kMx6E2M3) return fp6::dispatch_out<WoScale::kMx6E2M3>(a, c, stream);
  if (a.scale == WoScale::kMx6E3M2) return fp6::dispatch_out<WoScale::kMx6E3M2>(a, c, stream);
  return cudaErrorInvalidValue;
}

}  // namespace jax_gmma
