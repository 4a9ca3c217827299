// XLA FFI handler of the block-scaled MX / NVFP4 GEMM family: the Blackwell kernels
// (cpp/sm1xx_mx_gemm_blockscaled.cuh, "sm100_*" / "sm120_*") and the Hopper MXFP8 ones
// (cpp/sm90_mxf8_gemm_blockscaled*.cu, "sm90_mxf8_*"), target "jax_gmma_mx_gemm" (typed FFI,
// CUDA platform). Graph safety: the execute path of the tensorwise handler
// (ffi/tensorwise_ffi.cc, ffi_common::launch; rules in ffi/graph_safety.h).
#include "common.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

// Operands: a (M, K * bits_a / 8) and b (N, K * bits_b / 8): float8_e4m3fn elements, or uint8
// bytes of packed fp4 / fp6 (2 per byte / 4 per 3 bytes); a_sf, b_sf: uint8 scale-factor bytes
// (E8M0 or E4M3) in the swizzled 128x4-atom layout, mx_sf_bytes(rows, K, sf_vec) each;
// a_global, b_global: float32 (1,) NVFP4 per-tensor scales (read only when has_global);
// bias (N,) in the output dtype (read only when has_bias). Results: d (M, N), workspace u8.
// Attributes: config, the logical element dtypes a_dtype / b_dtype (dtype_name spelling),
// the logical K, the scale-vector size sf_vec (32 MX, 16 NVFP4).
ffi::Error MxGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer a_sf,
                      ffi::AnyBuffer b_sf, ffi::AnyBuffer a_global, ffi::AnyBuffer b_global,
                      ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> d,
                      ffi::Result<ffi::AnyBuffer> workspace, std::string_view config,
                      std::string_view a_dtype, std::string_view b_dtype, int64_t k, int32_t sf_vec,
                      int32_t sm_count, bool has_bias, bool has_global) {
  HostTimer timer;
  auto bad = [](std::string_view msg) { return fail("jax_gmma_mx_gemm", msg); };
  // Cheap structural checks: the Python shape rules already enforce these at trace time.
  DType ta, tb, td;
  if (auto e = mx_dtypes(a_dtype, b_dtype, *d, &ta, &tb, &td); !e.empty()) return bad(e);
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2) return bad("operands must be 2-D");
  const int64_t m = ad[0], n = bd[0];
  if (dd[0] != m || dd[1] != n) return bad("output shape mismatch");
  if (auto e = check_mx_operand(a, ta, m, k, "a"); !e.empty()) return bad(e);
  if (auto e = check_mx_operand(b, tb, n, k, "b"); !e.empty()) return bad(e);
  if (auto e = check_mx_scale_factors(a_sf, b_sf, sf_vec, m, n, 1, k); !e.empty()) return bad(e);
  if (has_global && (!is_f32_scalar(a_global) || !is_f32_scalar(b_global)))
    return bad("global scales must be float32 (1,)");
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return bad(e);

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return bad(why);

  GemmArgs g;
  set_common_args(g, m, n, k, a, b, bias, has_bias, d, workspace, 1, sm_count);
  set_mx_args(g, a_sf, b_sf, a_global, b_global, has_global);
  return launch(entry, g, stream);
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaMxGemm, jax_gmma::MxGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a (fp8, or packed fp4/fp6 bytes)
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_sf (swizzled, uint8)
                                  .Arg<ffi::AnyBuffer>()  // b_sf
                                  .Arg<ffi::AnyBuffer>()  // a_global (f32 (1,))
                                  .Arg<ffi::AnyBuffer>()  // b_global
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<std::string_view>("config")
                                  .Attr<std::string_view>("a_dtype")
                                  .Attr<std::string_view>("b_dtype")
                                  .Attr<int64_t>("k")
                                  .Attr<int32_t>("sf_vec")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_global"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_mx_gemm_handler, JaxGmmaMxGemm)
