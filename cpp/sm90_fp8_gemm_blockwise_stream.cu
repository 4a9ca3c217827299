// Kernel family: block-scaled FP8 GEMM (DeepSeek-V3 style: 1x128 token scales x 128x128 or
// 1x128 weight scales, float32) on Hopper (sm_90a) for decode: the weight-streaming kernel
// ("blockwise_1d2d_stream_*" / "blockwise_1d1d_stream_*" configs), written for jax-gmma.
//
//   D[m, n] = sum_kb  sa[m, kb] * sb[n / G, kb] * sum_{k in block kb} A[m, k] * B[n, k]  (+ bias[n])
//
// Same operands as the CUTLASS kernels of cpp/sm90_fp8_gemm_blockwise.cuh (A (M, K) tokens and
// B (N, K) weights, float8_e4m3fn, K-major; float32 scales per 128 of K in the MN-major layout
// of gemm_api.h, G = 128 rows for "1d2d", 1 for "1d1d"). At small M the weight bytes are the
// whole cost and the wgmma tiles (128 weight rows) leave too few CTAs in flight; this is the
// weight-streaming kernel of cpp/include/jax_gmma/fp8_stream.cuh (16 weight rows x 8 tokens per
// warp on mma.sync.m16n8k32 e4m3, WK warps splitting K) with a 128-K scale policy: the four
// MMAs of a 128-K block accumulate on the tensor core into a fresh fragment, then
// acc += (sb * sa) * part in float32 -- the same promotion every 128 of K as the CUTLASS
// kernels' two-level accumulation. Any M, any N, K % 32 == 0 (a partial last 128-K block has its
// own scale, as in the CUTLASS kernels); no workspace, only the launch: CUDA-graph safe.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/fp8_stream.cuh"
#include "jax_gmma/fp8_stream_scales.cuh"
#include "jax_gmma/gemm_api.h"

namespace jax_gmma::sm90_blockwise_stream {
namespace {

using fp8_stream::Block128Scales;

const char* can_implement(const GemmArgs& g) {
  if (const char* why = fp8_stream::can_implement_common(g.m, g.n, g.k)) return why;
  if (!g.a_block_scale || !g.b_block_scale) return "the block-scaled kernels need both block scales";
  if (g.splits != 1) return "the streaming kernel does not split K across CTAs (splits must be 1)";
  return nullptr;
}

template <int G, int NT, int WK, typename OutT>
cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
  if (can_implement(g)) return cudaErrorInvalidValue;
  using S = Block128Scales<G>;
  const fp8_stream::Params<S> p{
      {g.m, g.n, g.k, static_cast<const uint8_t*>(g.a), static_cast<const uint8_t*>(g.b), g.bias, g.d},
      {g.a_block_scale, g.b_block_scale, g.a_block_scale_ld, g.b_block_scale_ld, 0}};
  return fp8_stream::launch<S, NT, WK, OutT>(
      p, reinterpret_cast<uintptr_t>(g.a_block_scale) | reinterpret_cast<uintptr_t>(g.b_block_scale),
      stream);
}

template <int G, int NT, int WK, typename OutT>
KernelEntry entry(const char* name, DType d) {
  return fp8_stream::table_row(name, d, &can_implement, &run<G, NT, WK, OutT>, WK);
}

}  // namespace
}  // namespace jax_gmma::sm90_blockwise_stream

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): per scale variant, 16 weight rows x 8
// tokens per CTA with 4, 8 or 16 warps splitting K, and 16 rows x 16 tokens (two 8-token MMA
// tiles per warp, one weight fragment; four would spill registers) with 4 or 8; each for
// bfloat16 and float32 output.
int sm90_fp8_blockwise_stream_entries(KernelEntry* out) {
  using namespace sm90_blockwise_stream;
  int n = 0;
#define JG_ENTRY(name, g, nt, wk)                                 \
  out[n++] = entry<g, nt, wk, __nv_bfloat16>(name, DType::kBF16); \
  out[n++] = entry<g, nt, wk, float>(name, DType::kF32);
#define JG_VARIANT(v, g)                          \
  JG_ENTRY("blockwise_" v "_stream_16x8_kw4", g, 1, 4)   \
  JG_ENTRY("blockwise_" v "_stream_16x8_kw8", g, 1, 8)   \
  JG_ENTRY("blockwise_" v "_stream_16x8_kw16", g, 1, 16) \
  JG_ENTRY("blockwise_" v "_stream_16x16_kw4", g, 2, 4)  \
  JG_ENTRY("blockwise_" v "_stream_16x16_kw8", g, 2, 8)
  JG_VARIANT("1d2d", 128)
  JG_VARIANT("1d1d", 1)
#undef JG_VARIANT
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
