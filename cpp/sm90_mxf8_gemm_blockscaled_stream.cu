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
//  * The kernel is cpp/include/jax_gmma/fp8_stream.cuh's (swap AB on mma.sync.m16n8k32 e4m3,
//    16 weight rows x 8 tokens per warp, WK warps splitting K, a deterministic shared-memory
//    reduction); this file gives it the E8M0 scale policy: per 32-K block one MMA into a fresh
//    fragment, then acc += (sb[row] * sa[token]) * part in float32, so every E8M0 scale is
//    applied exactly (one rounding per block), as in the wgmma kernel.
//    The E8M0 codes become float32 by a shift into the exponent; a K step where any lane's codes
//    include 0 (2^-127, a subnormal) or 255 (NaN) takes an exact conversion instead (the whole
//    warp: the MMAs must not diverge). Any M, any N, K % 32 == 0; no workspace: graph safe.
//  * Measured on the H200 (2026-11-30): faster than the wgmma
//    kernel's decode configs only at M <= 8 and small N (1 x 8192 x 8192: 25.0 vs 25.8-26.1 us);
//    jax_gmma.mx.select_sm90_config picks it there. It is also more precise: the FP8 MMA runs as
//    f16 MMAs on sm_90, whose float32 sums of exact products agree with float64 to ~1e-7.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/fp8_stream.cuh"
#include "jax_gmma/fp8_stream_scales.cuh"
#include "jax_gmma/gemm_api.h"

namespace jax_gmma::sm90_mxf8_stream {
namespace {

using fp8_stream::MxScales;

const char* can_implement(const GemmArgs& g) {
  if (const char* why = fp8_stream::can_implement_common(g.m, g.n, g.k)) return why;
  if (g.a_global_scale || g.b_global_scale) return "MXFP8 has no global scale";
  return nullptr;
}

template <int NT, int WK, typename OutT>
cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
  if (can_implement(g)) return cudaErrorInvalidValue;
  const fp8_stream::Params<MxScales> p{
      {g.m, g.n, g.k, static_cast<const uint8_t*>(g.a), static_cast<const uint8_t*>(g.b), g.bias, g.d},
      {static_cast<const uint8_t*>(g.a_sf), static_cast<const uint8_t*>(g.b_sf), (g.k / 32 + 3) / 4, 0}};
  return fp8_stream::launch<MxScales, NT, WK, OutT>(
      p, reinterpret_cast<uintptr_t>(g.a_sf) | reinterpret_cast<uintptr_t>(g.b_sf), stream);
}

template <int NT, int WK, typename OutT>
KernelEntry entry(const char* name, DType d) {
  return fp8_stream::table_row(name, d, &can_implement, &run<NT, WK, OutT>, WK);
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
