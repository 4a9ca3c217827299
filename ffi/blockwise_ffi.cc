// XLA FFI handler of the sm90 block-scaled FP8 GEMM family (cpp/sm90_fp8_gemm_blockwise*.cuh),
// target "jax_gmma_fp8_blockwise_gemm" (typed FFI, CUDA platform). Graph safety: the execute
// path of the tensorwise handler (ffi/tensorwise_ffi.cc, ffi_common::launch; rules in
// ffi/graph_safety.h); the block scales are read by the kernel's mainloop.
#include "common.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

// Block-scaled FP8 GEMM (DeepSeek-style 1x128 x 128x128 or 1x128 x 1x128 float32 scales).
// Operands: a (M,K) fp8, b (N,K) fp8, a_scales f32 (kb, ld_a), b_scales f32 (kb, ld_b) -- the
// MN-major layout of gemm_api.h, kb = ceil(K/128), ld = round_up(rows, 4), rows_a = M,
// rows_b = ceil(N/128) ("blockwise_1d2d_*" configs) or N ("blockwise_1d1d_*") -- and bias (N,)
// in the output dtype (ignored unless has_bias). Results: d (M,N), workspace u8.
ffi::Error Fp8BlockwiseGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                ffi::AnyBuffer a_scales, ffi::AnyBuffer b_scales, ffi::AnyBuffer bias,
                                ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                                std::string_view config, int32_t splits, int32_t sm_count,
                                bool has_bias, int32_t swizzle, int32_t raster) {
  HostTimer timer;
  thread_local EntryCache cache;
  return run_fp8_gemm("jax_gmma_fp8_blockwise_gemm", cache, stream, a, b, a_scales, b_scales, bias, d,
                      workspace, config, splits, sm_count, has_bias, swizzle, raster,
                      [&](int64_t m, int64_t n, int64_t k, GemmArgs& g) -> std::string {
    if (!blockwise_scale_lds(config, m, n, &g.a_block_scale_ld, &g.b_block_scale_ld))
      return "config must be a blockwise_1d2d_* or blockwise_1d1d_* kernel";
    const int64_t kb = (k + 127) / 128;
    if (static_cast<int64_t>(a_scales.element_count()) != kb * g.a_block_scale_ld ||
        static_cast<int64_t>(b_scales.element_count()) != kb * g.b_block_scale_ld)
      return "scale sizes (expected (ceil(K/128), round_up(rows, 4)) MN-major scales)";
    g.a_block_scale = static_cast<const float*>(a_scales.untyped_data());
    g.b_block_scale = static_cast<const float*>(b_scales.untyped_data());
    return {};
  });
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8BlockwiseGemm, jax_gmma::Fp8BlockwiseGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_scales (kernel layout)
                                  .Arg<ffi::AnyBuffer>()  // b_scales (kernel layout)
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("splits")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<int32_t>("swizzle")   // tile order, see GemmArgs
                                  .Attr<int32_t>("raster"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_fp8_blockwise_gemm_handler, JaxGmmaFp8BlockwiseGemm)
