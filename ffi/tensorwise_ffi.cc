// XLA FFI handler of the sm90 FP8 tensorwise GEMM family (cpp/sm90_fp8_gemm_tensorwise*.cuh),
// target "jax_gmma_fp8_gemm" (typed FFI, CUDA platform).
//
// Graph safety (the rules of ffi/graph_safety.h, shared by every handler): the execute path
//  * takes the stream from the platform context and asks CUDA nothing about it but whether it
//    is capturing (cudaStreamGetDevice on a capturing stream invalidates the capture);
//  * gets the device with cudaGetDevice(), which capture allows;
//  * does its one-time setup (the kernel's dynamic shared-memory attribute) once per
//    device, normally before any capture (jax_gmma prepares every kernel when it registers
//    the targets), and otherwise with cudaFuncSetAttribute, which is not a stream operation;
//  * enqueues only a memset (stream-K workspace flags) and the kernel launch;
//  * never synchronizes and never copies device memory to the host: scales are read by the
//    kernel's epilogue.
// The block-scaled (ffi/blockwise_ffi.cc) and MX (ffi/mx_ffi.cc) GEMM handlers share this path
// (ffi_common::launch).
#include "common.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

// Operands: a (M,K) fp8, b (N,K) fp8, a_scale f32 (1,) or (M,), b_scale f32 (1,) or (N,),
// bias (N,) in the output dtype (ignored unless has_bias). Results: d (M,N), workspace u8.
ffi::Error Fp8GemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                       ffi::AnyBuffer a_scale, ffi::AnyBuffer b_scale, ffi::AnyBuffer bias,
                       ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                       std::string_view config, int32_t splits, int32_t sm_count, bool has_bias,
                       int32_t swizzle, int32_t raster) {
  HostTimer timer;
  thread_local EntryCache cache;
  return run_fp8_gemm("jax_gmma_fp8_gemm", cache, stream, a, b, a_scale, b_scale, bias, d, workspace,
                      config, splits, sm_count, has_bias, swizzle, raster,
                      [&](int64_t m, int64_t n, int64_t, GemmArgs& g) -> std::string {
    const int64_t as = static_cast<int64_t>(a_scale.element_count());
    const int64_t bs = static_cast<int64_t>(b_scale.element_count());
    if ((as != 1 && as != m) || (bs != 1 && bs != n)) return "scale sizes";
    g.a_scale = static_cast<const float*>(a_scale.untyped_data());
    g.b_scale = static_cast<const float*>(b_scale.untyped_data());
    g.a_scale_per_row = as == m && m != 1;
    g.b_scale_per_col = bs == n && n != 1;
    return {};
  });
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8Gemm, jax_gmma::Fp8GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_scale
                                  .Arg<ffi::AnyBuffer>()  // b_scale
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

JAX_GMMA_EXPORT_HANDLER(jax_gmma_fp8_gemm_handler, JaxGmmaFp8Gemm)
