// sm90 FP4 weight-only GEMM (NVFP4 / MXFP4 weights x bf16 activations): the decode kernel.
//
// Hopper has no FP4 tensor-core instruction, so the weights are widened in registers and fed
// to bf16 mma.sync.m16n8k16 (fp32 accumulation). At decode (M <= 16) the weight bytes are the
// whole cost, so the kernel is built around streaming them:
//
//  * The weight operand is the MMA's A (16 weight rows), the activations its B (8 tokens):
//    "swap AB", so M = 1 wastes nothing on the weight side.
//  * The weights are pre-shuffled once (jax_gmma.weightonly.prepare): a 16-row x 64-K tile is
//    512 contiguous bytes, lane l's 16 bytes are exactly its A fragments of four MMAs. The K
//    order inside an MMA is free (a dot product commutes), so lane (g, t) -- g = lane / 4,
//    t = lane % 4 -- owns K range [16t, 16t + 16) of the tile for rows g and g + 8: one
//    NVFP4 block (one MXFP4 half block) per row, so each lane needs just two scales per tile,
//    and its activation operand is 32 contiguous bytes of one token's row.
//  * e2m1 -> bf16 without a table: a nibble (s e1 e0 m) placed at bf16 bits 15 | 8..6 is the
//    bf16 number v * 2^-126 (e1e0 = 0 gives the bf16 subnormal m * 2^-127, which is exact),
//    so two values cost two shifts and a LOP3. One bf16x2 multiply by F = scale * 2^116 then
//    gives v * scale * 2^-10 exactly (at most 6 significant bits, within bf16's normal range
//    for every e4m3 scale and for E8M0 scales 2^-115 .. 2^11); the epilogue multiplies by
//    2^10. Block scales are stored as codes from which F is one integer multiply-add.
//  * CTA = `WR` row groups of `WK` warps; each warp owns `RS` 16-row strips and `NT` 8-token
//    tiles, the WK warps of a group split K (interleaved 64-K steps, so a group streams
//    contiguous WK x 512-byte runs), each prefetches its next steps into registers, and a
//    shared-memory reduction over the WK warps ends in a direct epilogue (alpha, bias, cast):
//    no workspace, no second kernel, nothing but the launch -- CUDA-graph safe. The shapes
//    built are kWoCtaShapes (weightonly_common.cuh); weightonly_pick chooses by M, N, K and
//    format: the K split sets how many warps stream the weight at once (measured).
//
// Also here: the FP4 unpack kernels of the prefill path (weightonly_unpack_run, the dispatcher
// of all formats): the same per-lane decode (lane_scales + fp4_slice), written out as a plain
// row-major bf16 or e4m3 matrix by wo_unpack_kernel (weightonly_common.cuh).
#include <algorithm>
#include <cstdint>
#include <cstddef>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "jax_gmma/weightonly_api.h"
#include "jax_gmma/weightonly_common.cuh"
#include "jax_gmma/weightonly_wgmma.cuh"

namespace jax_gmma {
namespace {

using namespace wo_detail;

constexpr int kTileBytes = 512;  // 16 rows x 64 K of e2m1 codes

// e2m1 pair -> bf16x2 of (value * 2^-126): sign at bit 15 (31), magnitude e1 e0 m at bits 8..6
// (24..22). The prepared layout puts the four pairs of a word where the cheapest extraction
// finds them (the layout table in jax_gmma/weightonly.py): pair 0 in place, pair 1 a left shift
// away, pair 2 a rotate away, pair 3 in two pieces. Left shifts are written as multiplies so
// that they run on the FMA pipe (IMAD.SHL), not on the logic pipe this kernel leans on: 5 LOP3 +
// 2 SHF + 2 IMAD per 8 weights (the previous layout needed 6 LOP3 + 2 SHF + 3 IMAD; 1-6% faster
// on the H200, measured 2026-11-30, weight layout). The two SHF moved to the
// FMA pipe too (mul.hi / mul.wide: IMAD.HI, IMAD.WIDE) made the kernel 5-12% slower: that pipe
// is already the fuller one (measured on the H200).
constexpr uint32_t kPairMask = 0x81C081C0u;
__device__ __forceinline__ uint32_t e2m1_pair0(uint32_t w) { return w & kPairMask; }
__device__ __forceinline__ uint32_t e2m1_pair1(uint32_t w) { return (w * 16u) & kPairMask; }
__device__ __forceinline__ uint32_t e2m1_pair2(uint32_t w) { return __funnelshift_l(w, w, 10) & kPairMask; }
__device__ __forceinline__ uint32_t e2m1_pair3(uint32_t w) {
  // sign and c1 c0 6 bits below their places (9, 1, 0 | 25, 17, 16), c2 2 bits above (10 | 26)
  return ((w * 64u) & 0x80C080C0u) | ((w >> 2) & 0x01000100u);
}

// The bf16x2 multiplier (F, F) of one row from its scale code (byte `which` of `sc`).
template <WoScale S>
__device__ __forceinline__ uint32_t scale_pair(uint32_t sc, uint32_t sel) {
  const uint32_t c = prmt(sc, 0u, sel);  // code in bits 0..7 of both halves
  if constexpr (S == WoScale::kNv16)
    return c * 16u + 0x70007000u;  // bf16 bits (E - 224) << 3 | m3  ->  E << 7 | m3 << 4
  else
    return c * 128u + 0x3A003A00u;  // E8M0 u -> bf16 exponent u + 116
}

// Byte offset in a tile's scale codes of lane (g, t)'s two codes (rows g, g + 8; its K block).
template <WoScale S>
__device__ __forceinline__ int scale_offset(int g, int t) {
  return (S == WoScale::kNv16 ? 8 * t + g : 8 * (t >> 1) + g) * 2;
}

// The lane's row multipliers (F of row g, F of row g + 8) from its 16-bit scale word.
template <WoScale S>
__device__ __forceinline__ void lane_scales(uint32_t sc, uint32_t& f_lo, uint32_t& f_hi) {
  f_lo = scale_pair<S>(sc, 0x4040u);  // row g
  f_hi = scale_pair<S>(sc, 0x4141u);  // row g + 8
}

// k16 slice q of the lane's tile from its word q: the scaled A registers a0..a3.
__device__ __forceinline__ void fp4_slice(uint32_t w, uint32_t f_lo, uint32_t f_hi,
                                          uint32_t (&a)[4]) {
  a[0] = mul_bf16x2(e2m1_pair0(w), f_lo);  // row g,     k 4q + 0, 1
  a[1] = mul_bf16x2(e2m1_pair1(w), f_hi);  // row g + 8, k 4q + 0, 1
  a[2] = mul_bf16x2(e2m1_pair2(w), f_lo);  // row g,     k 4q + 2, 3
  a[3] = mul_bf16x2(e2m1_pair3(w), f_hi);  // row g + 8, k 4q + 2, 3
}

#ifdef JAX_GMMA_WO_MIN_WARPS  // tuning builds: at least this many warps resident per SM
#define JAX_GMMA_WO_BOUNDS(threads) __launch_bounds__((threads), (JAX_GMMA_WO_MIN_WARPS * 32 + (threads) - 1) / (threads))
#else
#define JAX_GMMA_WO_BOUNDS(threads) __launch_bounds__(threads)
#endif
// One CTA tile: CTA column block `cta` (16 RS WR rows) x tokens tok0 .. tok0 + 8 NT - 1.
template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__device__ __forceinline__ void wo_gemm_tile(const WoParams& p, int cta, int64_t tok0) {
  static_assert(D % 2 == 0, "the activation double buffer is indexed by step parity");
  constexpr int kScaleBytes = S == WoScale::kNv16 ? 64 : 32;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ksteps = p.k / 64;
  const WarpPlace<RS, WK, WR> at(cta, warp);
  const int64_t strip0 = at.strip0;
  const int sc_off = scale_offset<S>(g, t);
  const uint8_t* wbase = p.w + strip0 * ksteps * kTileBytes + lane * 16;
  const uint8_t* sbase = p.s + strip0 * ksteps * kScaleBytes + sc_off;

  const XRows<NT> xrows(p, tok0, g, t);
  float acc[RS][NT][4];
  zero_acc(acc);

  // This warp's K steps are wk, wk + WK, ...: step i of the warp is K step wk + i * WK.
  // Weights and scales run D steps ahead in a register ring, the activations (L2-resident)
  // one step ahead; the WR row groups of a CTA read the same activations.
  const int64_t nsteps = warp_ksteps<WK>(ksteps, at.wk);
  uint4 wr[D][RS];
  uint32_t sr[D][RS];
  uint4 xr[2][NT][2];
  auto load_w = [&](int64_t i, uint4 (&w)[RS], uint32_t (&s)[RS]) {
    const int64_t j = at.wk + i * WK;
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      w[r] = ld_stream(wbase + (r * ksteps + j) * kTileBytes);
      s[r] = ld_u16(sbase + (r * ksteps + j) * kScaleBytes);
    }
  };
  auto load_x = [&](int64_t i, uint4 (&x)[NT][2]) { xrows.load(at.wk + i * WK, x); };
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < nsteps) load_w(u, wr[u], sr[u]);
  if (nsteps > 0) load_x(0, xr[0]);

  auto step = [&](int u) {
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      uint32_t f_lo, f_hi;
      lane_scales<S>(sr[u][r], f_lo, f_hi);
      const uint32_t words[4] = {wr[u][r].x, wr[u][r].y, wr[u][r].z, wr[u][r].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t a[4];
        fp4_slice(words[q], f_lo, f_hi, a);
        mma_tiles(acc[r], a[0], a[1], a[2], a[3], xr[u & 1], q);
      }
    }
  };
  // Whole groups of D steps: no per-step guards except on the prefetches.
  ring_k_loop<D>(
      nsteps, [&](int64_t i, int slot) { load_x(i, xr[slot]); }, step,
      [&](int64_t i, int slot) { load_w(i, wr[slot], sr[slot]); });

  reduce_store<RS, NT, WK, WR, OutT>(p, acc, at.cta_strip0, tok0);
}

template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__global__ void JAX_GMMA_WO_BOUNDS(WK * WR * 32) wo_gemm_kernel(const WoParams p) {
  wo_gemm_tile<RS, NT, WK, WR, S, OutT, D>(p, blockIdx.x, static_cast<int64_t>(blockIdx.y) * (NT * 8));
}

// The grouped kernel (mixture-of-experts; wo_grouped in weightonly_common.cuh).
template <int RS, int NT, int WK, int WR, WoScale S, typename OutT, int D>
__global__ void __launch_bounds__(WK * WR * 32) wo_grouped_kernel(const WoGroupedParams gp) {
  wo_grouped<16 * RS * WR, 8 * NT, OutT>(gp, [](const WoParams& q, int64_t tok0) {
    wo_gemm_tile<RS, NT, WK, WR, S, OutT, D>(q, blockIdx.x, tok0);
  });
}

// The unpack kernel's view of an FP4 tile (see wo_unpack_kernel in weightonly_common.cuh).
template <WoScale S>
struct Fp4Tile {
  struct Regs {
    uint4 w;
    uint32_t s;
  };
  static __device__ __forceinline__ Regs load(const UnpackParams& p, uint32_t tile, int lane) {
    constexpr int kScaleBytes = S == WoScale::kNv16 ? 64 : 32;
    Regs r;
    r.w = ld_stream(p.w + static_cast<size_t>(tile) * kTileBytes + lane * 16);
    r.s = ld_u16(p.s + static_cast<size_t>(tile) * kScaleBytes + scale_offset<S>(lane >> 2, lane & 3));
    return r;
  }
  static __device__ __forceinline__ void scales(const Regs& r, uint32_t& f_lo, uint32_t& f_hi) {
    lane_scales<S>(r.s, f_lo, f_hi);
  }
  static __device__ __forceinline__ void slices(const Regs& r, uint32_t f_lo, uint32_t f_hi,
                                                uint32_t (&a)[4][4]) {
    fp4_slice(r.w.x, f_lo, f_hi, a[0]);
    fp4_slice(r.w.y, f_lo, f_hi, a[1]);
    fp4_slice(r.w.z, f_lo, f_hi, a[2]);
    fp4_slice(r.w.w, f_lo, f_hi, a[3]);
  }
};

#ifndef JAX_GMMA_WO_TC_DEPTH
#define JAX_GMMA_WO_TC_DEPTH 4  // the tensor-core kernel's weight prefetch depth (K steps of 64)
#endif
constexpr int kWoTcDepth = JAX_GMMA_WO_TC_DEPTH;

#ifndef JAX_GMMA_WO_DEPTH
#define JAX_GMMA_WO_DEPTH 4  // weight prefetch depth (K steps of 64 in flight per warp)
#define JAX_GMMA_WO_SHALLOW_RING 1  // fp4_shallow_tile applies (off when a tuning build forces D)
#else
#define JAX_GMMA_WO_SHALLOW_RING 0
#endif

// The 16-row x 8-token tile with 8 warps along K runs a 2-step ring when each warp has at most
// 16 K steps (K <= 8192). Measured on the H200, kernel alone, M = 1..8
// (measured 2026-12-03, ring depth):
//  * faster: NVFP4 2-3% at N x K = 8192 x 8192 and 14336 x 4096; MXFP4 0-4%;
//  * slower with 56 steps per warp (8192 x 28672: 2-4%), with 16 warps along K
//    (4096 x 14336: 23-29%) and at N = 28672 (2 warps along K: 4%).
// Only that tile is instantiated at depth 2 (fp4_shallow_tile), chosen by K (fp4_shallow_k).
constexpr bool fp4_shallow_tile(int rs, int nt, int wk, int wr) {
  return JAX_GMMA_WO_SHALLOW_RING && rs == 1 && nt == 1 && wk == 8 && wr == 1;
}
inline bool fp4_shallow_k(int64_t k) { return k / 64 <= 16 * 8; }

template <WoScale S, typename OutT, int D = JAX_GMMA_WO_DEPTH>
cudaError_t dispatch_tile(const WoArgs& a, const WoCta& c, cudaStream_t stream) {
  if (c.tokens >= 32)  // the tensor-core kernel (weightonly_wgmma.cuh)
    return launch_tc<Fp4Tile<S>, OutT, kWoTcDepth>(a, wo_tc_shape_index(c.rows, c.tokens, c.k_warps), stream);
  return dispatch_tile_shape(c.rows, c.tokens, c.k_warps, [&](auto rs, auto nt, auto wk, auto wr) {
    constexpr int RS = decltype(rs)::value, NT = decltype(nt)::value;
    constexpr int WK = decltype(wk)::value, WR = decltype(wr)::value;
    if constexpr (fp4_shallow_tile(RS, NT, WK, WR))
      if (fp4_shallow_k(a.k))
        return launch_tile<RS, NT, WK, WR>(a, stream, wo_gemm_kernel<RS, NT, WK, WR, S, OutT, 2>);
    return launch_tile<RS, NT, WK, WR>(a, stream, wo_gemm_kernel<RS, NT, WK, WR, S, OutT, D>);
  });
}

template <WoScale S, typename OutT>
cudaError_t dispatch_grouped(const WoArgs& a, const WoGroups& gr, const WoCta& c, cudaStream_t stream) {
  if (c.tokens >= 32)  // the tensor-core kernel (weightonly_wgmma.cuh)
    return launch_tc<Fp4Tile<S>, OutT, kWoTcDepth>(a, wo_tc_shape_index(c.rows, c.tokens, c.k_warps), stream, &gr);
  return dispatch_grouped_shape(c, [&](auto rs, auto nt, auto wk, auto wr) {
    constexpr int RS = decltype(rs)::value, NT = decltype(nt)::value;
    constexpr int WK = decltype(wk)::value, WR = decltype(wr)::value;
    return launch_grouped_tile<RS, NT, WK, WR>(a, gr, stream,
                                               wo_grouped_kernel<RS, NT, WK, WR, S, OutT, JAX_GMMA_WO_DEPTH>);
  });
}

}  // namespace

namespace {
// The operand rules of the dense and the grouped kernels (not the CTA shape).
const char* check_operands(const WoArgs& a) {
  if (a.m < 1 || a.n < 1 || a.k < 1) return "M, N and K must be positive";
  if (a.n % 16 != 0) return "N must be a multiple of 16";
  if (a.k % 64 != 0) return "K must be a multiple of 64";
  if (!a.x || !a.w_packed || !a.w_scales || !a.d) return "null operand";
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || reinterpret_cast<uintptr_t>(a.w_packed) % 16 != 0)
    return "x and w_packed must be 16-byte aligned";
  if (a.scale != WoScale::kNv16 && a.scale != WoScale::kMx32 && a.scale != WoScale::kMx6E2M3 &&
      a.scale != WoScale::kMx6E3M2)
    return "unknown weight format (scale_kind)";
  return nullptr;
}
}  // namespace

WoCta weightonly_grouped_pick(int64_t m, int64_t n, int64_t k, int64_t groups, WoScale scale) {
  // A first rule, not yet measured on grouped problems: from 17 rows an expert slot averages,
  // the tensor-core kernel's pick for them; below, the decode pick for those rows and N times
  // the slots (the CTAs in flight), restricted to kWoGroupedShapes.
  const int64_t slots = std::max<int64_t>(std::min(groups, m), 1);
  const int64_t per_expert = (m + slots - 1) / slots;
  if (per_expert > 16 && n % 64 == 0) {  // the grouped tensor-core shapes (wo_tc_grouped_shape)
    WoCta tc;
    tc.tokens = per_expert > 64 && n % 128 == 0 ? 128 : 64;
    const bool wide = n % 128 == 0 && (tc.tokens == 128 || n / 16 >= 1024);
    tc.rows = wide ? 128 : 64;
    tc.k_warps = wide ? 4 : 8;
    if (n / tc.rows <= 65535) return tc;
  }
  const WoCta dense = weightonly_decode_pick(per_expert, n * slots, k, scale);
  WoCta c;
  c.rows = 16;
  c.tokens = dense.tokens;
  c.k_warps = dense.k_warps >= 8 ? 8 : 4;
  return c;
}

const char* weightonly_grouped_check(const WoArgs& a, const WoGroups& g) {
  if (a.rows_per_cta || a.tokens_per_cta || a.k_warps) return "the grouped kernel picks its CTA shape";
  if (a.x_rows) return "the grouped kernel takes x row-major (x_rows = 0)";
  if (const char* why = check_operands(a)) return why;
  if (!g.sizes || !g.row_ids || g.count < 1) return "the grouped kernel needs group sizes, row_ids and G >= 1";
  if (g.count > 65534) return "G must be at most 65534";
  const WoCta c = weightonly_grouped_pick(a.m, a.n, a.k, g.count, a.scale);
  if (c.tokens >= 32 ? !wo_tc_grouped_shape_index(wo_tc_shape_index(c.rows, c.tokens, c.k_warps))
                     : !wo_grouped_shape(c))
    return "no grouped kernel for the picked CTA shape";
  if (c.tokens >= 32 && a.n / 16 * (a.k / 64) > UINT32_MAX) return "weight too large";
  return nullptr;
}

cudaError_t weightonly_grouped_run(const WoArgs& a, const WoGroups& g, cudaStream_t stream) {
  if (weightonly_grouped_check(a, g)) return cudaErrorInvalidValue;
  const WoCta c = weightonly_grouped_pick(a.m, a.n, a.k, g.count, a.scale);
  if (a.scale == WoScale::kMx6E2M3 || a.scale == WoScale::kMx6E3M2)
    return weightonly_fp6_grouped_run(a, g, c, stream);
  if (a.scale == WoScale::kNv16)
    return a.d_is_f32 ? dispatch_grouped<WoScale::kNv16, float>(a, g, c, stream)
                      : dispatch_grouped<WoScale::kNv16, __nv_bfloat16>(a, g, c, stream);
  return a.d_is_f32 ? dispatch_grouped<WoScale::kMx32, float>(a, g, c, stream)
                    : dispatch_grouped<WoScale::kMx32, __nv_bfloat16>(a, g, c, stream);
}

WoCta weightonly_pick(int64_t m, int64_t n, int64_t k, WoScale scale) {
  if (m > 16) {  // the tensor-core kernel: one decoded weight fragment feeds NT tokens
    const WoCta tc = weightonly_tc_pick(m, n, k, scale);
    if (tc.rows) return tc;
  }
  return weightonly_decode_pick(m, n, k, scale);
}

WoCta weightonly_decode_pick(int64_t m, int64_t n, int64_t k, WoScale scale) {
  // Measured on the H200, every shape of kWoCtaShapes at N x K = 28672 x 8192, 8192 x 8192,
  // 8192 x 28672, 4096 x 14336 and M = 1, 4, 16, 64 (benchmarks/kernels/bench_weightonly_kernel.cu;
  // measured 2026-11-30, CTA shapes and weight layout). The K
  // split sets how many warps stream the weights at once: small N wants more warps per 16-row
  // strip (16 at N = 4096), large N fewer (2 at N = 28672: 1792 two-warp CTAs are one wave,
  // no tail; 4 warps 2.7% slower for NVFP4, equal for MXFP4).
  // 16 tokens: 32 rows per CTA halves the activation reads per weight byte at large N.
  const int64_t strips = n / 16;
  const bool fp6 = scale == WoScale::kMx6E2M3 || scale == WoScale::kMx6E3M2;
  WoCta c;
  c.tokens = m <= 8 ? 8 : 16;
  if (!fp6) {
    if (m <= 8) {
      c.rows = 16;
      c.k_warps = strips <= 256 ? 16 : (strips <= 1024 ? 8 : (strips < 1536 ? 4 : 2));
    } else if (m <= 16) {
      c.rows = strips >= 1024 ? 32 : 16;
      c.k_warps = strips >= 1024 ? 2 : (strips >= 512 ? 4 : 8);
    } else {
      c.rows = 32;
      c.k_warps = strips <= 256 ? 4 : 2;
    }
  } else {
    if (m <= 8) {
      c.rows = strips >= 384 && strips < 1024 ? 32 : 16;
      c.k_warps = 8;
    } else if (m <= 16) {
      c.rows = 16;
      c.k_warps = strips >= 512 && k < 16384 ? 4 : 8;
    } else {
      c.rows = strips >= 1024 ? 32 : 64;
      c.k_warps = 2;
    }
  }
  if (n % c.rows != 0) {  // N is a multiple of 16: the 16-row, 8-warp shape always fits
    c.rows = 16;
    c.k_warps = 8;
  }
  return c;
}

WoCta weightonly_tc_pick(int64_t m, int64_t n, int64_t k, WoScale scale) {
  // Measured on an H100 (NVFP4, kernel alone, weights rotated past L2; every shape of
  // kWoTcShapes against the mma.sync shapes at N = 4096 .. 28672; the figures are in
  // jax_gmma.weightonly.pick_tc, which mirrors this). Where N gives few 64-row blocks, CTAs
  // with more warp groups along K fill the 132 SMs.
  (void)k;
  (void)scale;
  if (m <= 16 || n % 64 != 0 || n / 64 > 65535) return WoCta{};  // none: the decode kernel's shapes
  const int64_t blocks = n / 64;
  const bool wide = n % 128 == 0 && n / 128 >= 132;
  auto shape = [](int32_t rows, int32_t tokens, int32_t k_warps) { return WoCta{rows, tokens, k_warps}; };
  const bool fits_256 = n % 256 == 0 && n / 256 >= 96;
  if (m <= 32) return fits_256 ? shape(256, 64, 4) : (blocks >= 128 ? shape(64, 32, 16) : WoCta{});
  if (m <= 64) {
    if (blocks >= 192) return fits_256 ? shape(256, 64, 4) : shape(64, 64, 8);
    if (blocks >= 96 && blocks <= 132) return shape(64, 64, 16);
    return blocks > 132 && m > 48 ? shape(64, 64, 8) : WoCta{};
  }
  if (blocks < 32) return WoCta{};
  if (m <= 128) {
    if (wide) return shape(128, 128, 4);
    // Two token tiles of 64 x 64 CTAs past one wave: 64 x 128 tiles instead.
    return blocks > 132 ? shape(64, 128, 4) : (2 * blocks > 132 ? shape(64, 128, 8) : shape(64, 64, 16));
  }
  return wide || n % 128 != 0 ? shape(64, 128, 4) : shape(128, 128, 4);
}

WoCta weightonly_resolve(const WoArgs& a) {
  const WoCta pick = weightonly_pick(a.m, a.n, a.k, a.scale);
  if (!a.rows_per_cta && !a.tokens_per_cta && !a.k_warps) return pick;
  WoCta c;
  c.rows = a.rows_per_cta ? a.rows_per_cta : pick.rows;
  c.tokens = a.tokens_per_cta ? a.tokens_per_cta : pick.tokens;
  c.k_warps = a.k_warps ? a.k_warps : 8;
  return c;
}


const char* weightonly_check(const WoArgs& a) {
  if (const char* why = check_operands(a)) return why;
  const WoCta c = weightonly_resolve(a);
  if (c.tokens >= 32) {
    if (wo_tc_shape_index(c.rows, c.tokens, c.k_warps) < 0)
      return "no tensor-core kernel for this CTA shape (rows_per_cta, tokens_per_cta, k_warps): see kWoTcShapes";
    if (a.n / 16 * (a.k / 64) > UINT32_MAX) return "weight too large";
    if (a.n / c.rows > 65535) return "N too large (more than 65535 row blocks)";
    if (a.x_rows < a.m || a.x_rows % c.tokens != 0)
      return "the tensor-core shapes take x tiled (x_rows: M padded to a multiple of the tokens per CTA)";
  } else if (a.x_rows) {
    return "x is tiled (x_rows) but the CTA shape is not a tensor-core one";
  } else if (wo_cta_shape_index(c.rows, c.tokens, c.k_warps) < 0) {
    return "no kernel for this CTA shape (rows_per_cta, tokens_per_cta, k_warps): see kWoCtaShapes";
  }
  if (a.n % c.rows != 0) return "N must be a multiple of rows_per_cta";
  if ((a.m + c.tokens - 1) / c.tokens > 65535) return "M too large";
  return nullptr;
}

cudaError_t weightonly_prepare() {
  for (cudaError_t e : {prepare_tc<Fp4Tile<WoScale::kNv16>, float, kWoTcDepth>(),
                        prepare_tc<Fp4Tile<WoScale::kNv16>, __nv_bfloat16, kWoTcDepth>(),
                        prepare_tc<Fp4Tile<WoScale::kMx32>, float, kWoTcDepth>(),
                        prepare_tc<Fp4Tile<WoScale::kMx32>, __nv_bfloat16, kWoTcDepth>(),
                        weightonly_fp6_prepare()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t weightonly_run(const WoArgs& a, cudaStream_t stream) {
  if (weightonly_check(a)) return cudaErrorInvalidValue;
  const WoCta c = weightonly_resolve(a);
  if (a.scale == WoScale::kMx6E2M3 || a.scale == WoScale::kMx6E3M2)
    return weightonly_fp6_run(a, c, stream);
  if (a.scale == WoScale::kNv16)
    return a.d_is_f32 ? dispatch_tile<WoScale::kNv16, float>(a, c, stream)
                      : dispatch_tile<WoScale::kNv16, __nv_bfloat16>(a, c, stream);
  return a.d_is_f32 ? dispatch_tile<WoScale::kMx32, float>(a, c, stream)
                    : dispatch_tile<WoScale::kMx32, __nv_bfloat16>(a, c, stream);
}

const char* weightonly_unpack_check(const WoUnpackArgs& a) {
  if (a.n < 1 || a.k < 1) return "N and K must be positive";
  if (a.n % 16 != 0) return "N must be a multiple of 16";
  if (a.k % 64 != 0) return "K must be a multiple of 64 (the padded K)";
  if (a.n / 16 * (a.k / 64) > INT32_MAX) return "weight too large";
  if (!a.w_packed || !a.w_scales || !a.out) return "null operand";
  if (a.out_fp8 && !a.row_exp) return "row_exp is required for float8 output";
  if (reinterpret_cast<uintptr_t>(a.w_packed) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0)
    return "w_packed and out must be 16-byte aligned";
  if (reinterpret_cast<uintptr_t>(a.w_scales) % 2 != 0 ||
      reinterpret_cast<uintptr_t>(a.row_exp) % 4 != 0)
    return "w_scales must be 2-byte and row_exp 4-byte aligned";
  if (a.scale != WoScale::kNv16 && a.scale != WoScale::kMx32 && a.scale != WoScale::kMx6E2M3 &&
      a.scale != WoScale::kMx6E3M2)
    return "unknown weight format (scale_kind)";
  return nullptr;
}

cudaError_t weightonly_unpack_run(const WoUnpackArgs& a, cudaStream_t stream) {
  if (weightonly_unpack_check(a)) return cudaErrorInvalidValue;
  switch (a.scale) {
    case WoScale::kNv16: return launch_unpack<Fp4Tile<WoScale::kNv16>>(a, stream);
    case WoScale::kMx32: return launch_unpack<Fp4Tile<WoScale::kMx32>>(a, stream);
    case WoScale::kMx6E2M3:
    case WoScale::kMx6E3M2: return weightonly_fp6_unpack_run(a, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {

// One thread per 16 bytes of the tiled x (wo_tc_tiled_x): 16-byte chunk q = 8 c + r of block
// (j, g) = i / 64 holds the bf16 pairs x[8 g + r][64 j + 16 t + 2 c .. + 1], t = 0 .. 3: four
// 4-byte loads 32 bytes apart (per load, a warp -- columns c 0-3 or 4-7 of one block -- reads
// 16 bytes of each of 8 rows, the warp of the other four columns the other 16 of those 32-byte
// sectors) and one 16-byte store (a warp writes 512 contiguous bytes).
__global__ void wo_tile_x_kernel(const uint32_t* __restrict__ x, int64_t m, int64_t k, int64_t groups,
                                 uint4* __restrict__ out, int64_t chunks) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= chunks) return;
  const int q = static_cast<int>(i & 63), c = q >> 3, r = q & 7;
  const int64_t b = i >> 6, j = b / groups, tok = 8 * (b % groups) + r;
  uint4 v = make_uint4(0, 0, 0, 0);
  if (tok < m) {
    const uint32_t* src = x + (tok * k + 64 * j) / 2 + c;
    v.x = __ldg(src);
    v.y = __ldg(src + 8);
    v.z = __ldg(src + 16);
    v.w = __ldg(src + 24);
  }
  out[i] = v;
}

}  // namespace

const char* weightonly_tile_x_check(const WoTileArgs& a) {
  if (a.m < 1 || a.k < 1) return "M and K must be positive";
  if (a.k % 64 != 0) return "K must be a multiple of 64 (the padded K)";
  if (a.rows < a.m || a.rows % 8 != 0) return "rows must be M padded to a multiple of 8";
  if (a.rows / 8 > int64_t{INT32_MAX} * 4 / (a.k / 64)) return "x too large (grid)";  // blocks = chunks / 256
  if (!a.x || !a.out) return "null operand";
  if (reinterpret_cast<uintptr_t>(a.x) % 4 != 0 || reinterpret_cast<uintptr_t>(a.out) % 16 != 0)
    return "x must be 4-byte and out 16-byte aligned";
  return nullptr;
}

cudaError_t weightonly_tile_x_run(const WoTileArgs& a, cudaStream_t stream) {
  if (weightonly_tile_x_check(a)) return cudaErrorInvalidValue;
  const int64_t chunks = a.k / 64 * (a.rows / 8) * 64;
  constexpr int kThreads = 256;
  wo_tile_x_kernel<<<static_cast<unsigned>((chunks + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<const uint32_t*>(a.x), a.m, a.k, a.rows / 8, static_cast<uint4*>(a.out), chunks);
  return cudaGetLastError();
}

}  // namespace jax_gmma
