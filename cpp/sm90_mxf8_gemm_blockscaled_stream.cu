// Kernel family: MXFP8 x MXFP8 block-scaled GEMM on Hopper (sm_90a) for decode: the weight
// streaming kernel ("sm90_mxf8_stream_*" configs), written for jax-gmma.
//
//   D[m, n] = sum_kb  sa[m, kb] * sb[n, kb] * sum_{k in block kb} A[m, k] * B[n, k]  (+ bias[n])
//
// Same operands as cpp/sm90_mxf8_gemm_blockscaled.cu (A (M, K) tokens and B (N, K) weights,
// float8_e4m3fn, K-major; E8M0 scales per 32 of K in the swizzled 128x4-atom layout), built like
// the FP4 weight-only decode kernel (cpp/sm90_fp4_gemm_weightonly.cu) instead of around TMA and
// wgmma: at M <= 16 the weight bytes are the whole cost, and the wgmma kernel's 64-row tiles
// leave too few CTAs (and pipeline stages) to keep enough of them in flight.
//
//  * "Swap AB": 16 weight rows are the A operand of mma.sync.m16n8k32 (e4m3 x e4m3 -> f32),
//    8 tokens its B. No conversion: the fp8 bytes are the fragments. A lane (g, t) -- g = lane
//    / 4, t = lane % 4 -- loads 8 contiguous bytes of rows g and g + 8 per 32-K block (K 8t ..
//    8t + 7 of the block; the K order inside a block is free as long as A and B agree), and the
//    same 8 bytes of token g's row: every load is whole 32-byte sectors.
//  * Per 32-K block one MMA into a fresh fragment, then acc += (sb[row] * sa[token]) * part in
//    float32: every E8M0 scale is applied exactly (one rounding per block; inside the block the
//    tensor core's float32 accumulation), as in the wgmma kernel.
//    The E8M0 codes become float32 by a shift into the exponent; a K step where any lane's codes
//    include 0 (2^-127, a subnormal) or 255 (NaN) takes an exact conversion instead (the whole
//    warp: the MMAs must not diverge).
//  * CTA = WK warps on one 16-row strip, splitting K (interleaved 128-K steps, a last step of
//    1-3 blocks when K % 128 != 0); each warp keeps its next two steps' weights in registers; a
//    shared-memory reduction over the WK warps ends in a direct epilogue (+ bias, cast). Any M,
//    any N (the last strip's rows past N are computed, not stored), K % 32 == 0. No workspace,
//    only the launch: CUDA-graph safe.
//  * Measured on the H200 (2026-11-30): faster than the wgmma
//    kernel's decode configs only at M <= 8 and small N (1 x 8192 x 8192: 25.0 vs 25.8-26.1 us);
//    jax_gmma.mx.select_sm90_config picks it there. It is also more precise: the FP8 MMA runs as
//    f16 MMAs on sm_90, whose float32 sums of exact products agree with float64 to ~1e-7.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/e8m0.cuh"
#include "jax_gmma/gemm_api.h"
#include "jax_gmma/weightonly_common.cuh"

namespace jax_gmma::sm90_mxf8_stream {
namespace {

using wo_detail::from_float;
using wo_detail::ld_stream8;
using wo_detail::ring_k_loop;
using wo_detail::to_float;
using wo_detail::warp_ksteps;

constexpr int kStepK = 128;     // one K step: four 32-K scale blocks, one 32-bit scale word
constexpr int kDepth = 2;       // weight steps in flight per warp (4 KiB per warp)

struct Params {
  int64_t m, n, k;
  const uint8_t* a;   // (M, K) tokens
  const uint8_t* b;   // (N, K) weights
  const uint8_t* sa;  // swizzled E8M0, M rows
  const uint8_t* sb;  // swizzled E8M0, N rows
  const void* bias;
  void* d;
  int64_t k_atoms;    // 4-block atoms along K: ceil(K / 128)
};

__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};"
      : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
}

__device__ __forceinline__ uint32_t ld_u32_nc(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// One warp's weights of a K step: rows g / g + 8, four blocks of 8 bytes, and the rows' scale
// words.
struct WStep {
  uint2 w[2][4];
  uint32_t s[2];
};
// One warp's tokens of a K step: per 8-token tile, token g's four 8-byte pieces and the scale
// words of tokens 2t, 2t + 1 (the columns of the lane's accumulator fragment).
template <int NT>
struct XStep {
  uint2 x[NT][4];
  uint32_t s[NT][2];
};

template <int NT, int WK, typename OutT>
__global__ void __launch_bounds__(WK * 32) stream_kernel(const Params p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t kblocks = p.k / 32;
  const int64_t ksteps = kblocks / 4;    // whole 128-K steps
  const int tail = static_cast<int>(kblocks % 4);  // 32-K blocks after them
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * (NT * 8);
  // Rows past N (the last strip when N % 16 != 0) and tokens past M read row N - 1 / M - 1:
  // computed, never stored.
  int64_t rows[2];
  const uint8_t* wrow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rows[r] = min(row0 + g + 8 * r, p.n - 1);
    wrow[r] = p.b + rows[r] * p.k + 8 * t;
  }
  const uint8_t* xrow[NT];
  int64_t xs_row[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    xrow[nt] = p.a + min(tok0 + nt * 8 + g, p.m - 1) * p.k + 8 * t;
#pragma unroll
    for (int c = 0; c < 2; ++c) xs_row[nt][c] = min(tok0 + nt * 8 + 2 * t + c, p.m - 1);
  }

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.f;

  // K step j's first nb blocks (nb = 4 but in the tail step); the scale words are inside the
  // layout's K padding (whole 4-block atoms) even in the tail step.
  auto load_w = [&](int64_t j, WStep& w, int nb) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        w.w[r][b] = b < nb ? ld_stream8(wrow[r] + j * kStepK + 32 * b) : make_uint2(0u, 0u);
      w.s[r] = ld_u32_nc(p.sb + mx_sf_word_offset(rows[r], j, p.k_atoms));
    }
  };
  auto load_x = [&](int64_t j, XStep<NT>& x, int nb) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int b = 0; b < 4; ++b)
        x.x[nt][b] = b < nb ? __ldg(reinterpret_cast<const uint2*>(xrow[nt] + j * kStepK + 32 * b))
                            : make_uint2(0u, 0u);
#pragma unroll
      for (int c = 0; c < 2; ++c)
        x.s[nt][c] = __ldg(reinterpret_cast<const uint32_t*>(p.sa + mx_sf_word_offset(xs_row[nt][c], j, p.k_atoms)));
    }
  };

  // Block b's float32 scale from a word of four E8M0 codes. Fast: the code shifted into the
  // float32 exponent (exact for codes 1 .. 254); a step whose codes include 0 (2^-127) or 255
  // (NaN) takes the exact conversion (the tail step always does).
  auto fast = [](uint32_t v, int b) {
    return __uint_as_float((b < 3 ? v << (23 - 8 * b) : v >> 1) & 0x7F800000u);
  };
  auto exact = [](uint32_t v, int b) { return e8m0_to_float((v >> (8 * b)) & 0xff); };
  auto special = [](uint32_t v) {  // a byte equal to 0x00 or 0xFF
    return ((v - 0x01010101u) & ~v & 0x80808080u) | ((~v - 0x01010101u) & v & 0x80808080u);
  };
  auto blocks = [&](const WStep& w, const XStep<NT>& x, auto conv, int nb) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      if (b >= nb) break;
      const float f0 = conv(w.s[0], b), f1 = conv(w.s[1], b);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float part[4];
        mma_e4m3(part, w.w[0][b].x, w.w[1][b].x, w.w[0][b].y, w.w[1][b].y, x.x[nt][b].x, x.x[nt][b].y);
        const float e0 = conv(x.s[nt][0], b), e1 = conv(x.s[nt][1], b);
        acc[nt][0] = fmaf(part[0], f0 * e0, acc[nt][0]);
        acc[nt][1] = fmaf(part[1], f0 * e1, acc[nt][1]);
        acc[nt][2] = fmaf(part[2], f1 * e0, acc[nt][2]);
        acc[nt][3] = fmaf(part[3], f1 * e1, acc[nt][3]);
      }
    }
  };

  // The whole steps: this warp's are warp, warp + WK, ...; weights kDepth steps ahead in a
  // register ring, activations one step ahead.
  const int64_t nsteps = warp_ksteps<WK>(ksteps, warp);
  WStep wr[kDepth];
  XStep<NT> xr[2];
#pragma unroll
  for (int u = 0; u < kDepth; ++u)
    if (u < nsteps) load_w(warp + u * WK, wr[u], 4);
  if (nsteps > 0) load_x(warp, xr[0], 4);
  auto step = [&](int u) {
    const WStep& w = wr[u];
    const XStep<NT>& x = xr[u & 1];
    uint32_t sp = special(w.s[0]) | special(w.s[1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sp |= special(x.s[nt][0]) | special(x.s[nt][1]);
    // One path for the whole warp: mma.sync needs every lane (a per-lane choice between two
    // copies of the MMAs hung the GPU on a step where only some lanes saw a 0x00 / 0xFF code).
    if (!__any_sync(0xFFFFFFFFu, sp != 0))
      blocks(w, x, fast, 4);
    else
      blocks(w, x, exact, 4);
  };
  ring_k_loop<kDepth>(
      nsteps, [&](int64_t i, int slot) { load_x(warp + i * WK, xr[slot], 4); }, step,
      [&](int64_t i, int slot) { load_w(warp + i * WK, wr[slot], 4); });
  // The tail step (K % 128 = 32, 64 or 96), by the warp whose turn it is.
  if (tail && warp == ksteps % WK) {
    load_w(ksteps, wr[0], tail);
    load_x(ksteps, xr[0], tail);
    blocks(wr[0], xr[0], exact, tail);
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
  const OutT* bias = static_cast<const OutT*>(p.bias);
  OutT* d = static_cast<OutT*>(p.d);
  for (int e = threadIdx.x; e < 16 * kCols; e += WK * 32) {
    const int row = e & 15, col = e >> 4;
    const int64_t tok = tok0 + col, n = row0 + row;
    if (tok >= p.m || n >= p.n) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) sum += red[w][col][row];
    if (bias) sum += to_float<OutT>(bias[n]);
    d[tok * p.n + n] = from_float<OutT>(sum);
  }
}

const char* can_implement(const GemmArgs& g) {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return "M, N and K must be positive";
  if (g.k % 32) return "K must be a multiple of 32 (the MX scale block)";
  if (g.m > INT32_MAX / 2 || g.n > INT32_MAX / 2 || g.k > INT32_MAX / 2) return "M, N and K must be below 2^30";
  if ((g.m + 7) / 8 > 65535) return "M must be at most 524280 (8-token tiles on the grid's y)";
  if (g.a_global_scale || g.b_global_scale) return "MXFP8 has no global scale";
  return nullptr;
}

size_t workspace_size(const GemmArgs&) { return 0; }
cudaError_t prepare() { return cudaSuccess; }  // static shared memory only

template <int NT, int WK, typename OutT>
cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
  if (can_implement(g)) return cudaErrorInvalidValue;
  if (((reinterpret_cast<uintptr_t>(g.a) | reinterpret_cast<uintptr_t>(g.b) |
        reinterpret_cast<uintptr_t>(g.a_sf) | reinterpret_cast<uintptr_t>(g.b_sf)) % 16) != 0)
    return cudaErrorMisalignedAddress;
  const Params p{g.m, g.n, g.k,
                 static_cast<const uint8_t*>(g.a), static_cast<const uint8_t*>(g.b),
                 static_cast<const uint8_t*>(g.a_sf), static_cast<const uint8_t*>(g.b_sf),
                 g.bias, g.d, (g.k / 32 + 3) / 4};
  // 8-byte operand loads: K % 32 == 0 keeps every row 32-byte aligned from a 16-byte base.
  const int64_t ytiles = (g.m + NT * 8 - 1) / (NT * 8);
  if (ytiles > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((g.n + 15) / 16), static_cast<unsigned>(ytiles));
  stream_kernel<NT, WK, OutT><<<grid, WK * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

template <int NT, int WK, typename OutT>
KernelEntry entry(const char* name, DType d) {
  return KernelEntry{name, DType::kF8E4M3, DType::kF8E4M3, d, &can_implement, &workspace_size,
                     &prepare, &run<NT, WK, OutT>, 0, WK * 32, 90};
}

}  // namespace
}  // namespace jax_gmma::sm90_mxf8_stream

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): 16 weight rows x 8 tokens per CTA with
// 2, 4, 8 or 16 warps splitting K, and 16 rows x 16 tokens (two 8-token MMA tiles per warp,
// one weight fragment) with 4 or 8; each for bfloat16 and float32 output.
int sm90_mx_mxf8_stream_entries(KernelEntry* out) {
  using namespace sm90_mxf8_stream;
  int n = 0;
#define JG_ENTRY(name, nt, wk)                                 \
  out[n++] = entry<nt, wk, __nv_bfloat16>(name, DType::kBF16); \
  out[n++] = entry<nt, wk, float>(name, DType::kF32);
  JG_ENTRY("sm90_mxf8_stream_16x8_kw2", 1, 2)
  JG_ENTRY("sm90_mxf8_stream_16x8_kw4", 1, 4)
  JG_ENTRY("sm90_mxf8_stream_16x8_kw8", 1, 8)
  JG_ENTRY("sm90_mxf8_stream_16x8_kw16", 1, 16)
  JG_ENTRY("sm90_mxf8_stream_16x16_kw4", 2, 4)
  JG_ENTRY("sm90_mxf8_stream_16x16_kw8", 2, 8)
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
