// XLA FFI handlers of the grouped (mixture-of-experts) GEMM families: jax_gmma.ragged_dot's
// kernels. Target "jax_gmma_fp8_grouped_gemm" (typed FFI, CUDA platform): the FP8 weight-streaming
// kernels of cpp/sm90_fp8_gemm_grouped_stream.cu and the CUTLASS prefill kernels of
// cpp/sm90_fp8_gemm_grouped_blockwise.cu and cpp/sm90_bf16_gemm_grouped.cu ("grouped_*"
// configs, Hopper). Target
// "jax_gmma_mx_grouped_gemm": the Blackwell block-scaled MXFP8 / NVFP4 / MXFP4 kernels of
// cpp/sm100_mx_gemm_grouped_blockscaled.cu ("sm100_grouped_*" configs; not run on hardware by
// this project). Graph safety: the execute path of the other GEMM handlers (ffi_common::launch;
// rules in ffi/graph_safety.h); the group sizes and the row offset are read by the kernels,
// never by the host.
#include "common.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

enum class Scales { kBlock1d2d, kBlock1d1d, kMx, kRow, kExpert, kUnknown };

Scales scales_of(std::string_view config) {
  auto starts = [&](std::string_view p) { return config.substr(0, p.size()) == p; };
  if (starts("grouped_blockwise_1d2d_")) return Scales::kBlock1d2d;
  if (starts("grouped_blockwise_1d1d_")) return Scales::kBlock1d1d;
  if (starts("grouped_mxf8_")) return Scales::kMx;
  if (starts("grouped_fp8_")) return Scales::kRow;
  if (starts("grouped_bf16_")) return Scales::kExpert;
  return Scales::kUnknown;
}

// Operands: a (M, K) float8_e4m3fn tokens sorted by expert; b (G, N, K) float8_e4m3fn experts
// (bfloat16 both for grouped_bf16);
// the scales of the config's kind, per expert back to back --
//   grouped_blockwise_1d2d / _1d1d: a_scales f32 (kb, round_up(M, 4)), b_scales f32
//     (G, kb, round_up(rows, 4)), kb = ceil(K/128), rows = ceil(N/128) / N (gemm_api.h's layout);
//   grouped_mxf8: a_scales, b_scales uint8 E8M0 in the swizzled 128x4-atom layout,
//     mx_sf_bytes(M, K, 32) and G * mx_sf_bytes(N, K, 32) bytes;
//   grouped_fp8: a_scales f32 (M,) or (1,), b_scales f32 (G, N) or (G,);
//   grouped_bf16: a and b bfloat16; b_scales f32 (G,), one scale per expert multiplying its
//     float32 sums before the bias (ones where there is none); a_scales is not read;
// bias (G, N) in the output dtype (read only when has_bias); group_sizes (G,) int32; row_ids
// (M,) int32 (row_ids[0]: the global index of row 0). Results: d (M, N) bfloat16 or float32,
// and the workspace u8 (the per-expert arguments of the prefill kernels, written on the device
// by their setup kernel; unused by the streaming ones).
ffi::Error Fp8GroupedGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                              ffi::AnyBuffer a_scales, ffi::AnyBuffer b_scales, ffi::AnyBuffer bias,
                              ffi::AnyBuffer group_sizes, ffi::AnyBuffer row_ids,
                              ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                              std::string_view config, int32_t sm_count, bool has_bias) {
  HostTimer timer;
  auto bad = [](std::string_view msg) { return fail("jax_gmma_fp8_grouped_gemm", msg); };
  // Cheap structural checks: the Python shape rules already enforce these at trace time.
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 3 || dd.size() != 2) return bad("a, b, d must be (M, K), (G, N, K), (M, N)");
  const int64_t m = ad[0], k = ad[1], groups = bd[0], n = bd[1];
  if (bd[2] != k || dd[0] != m || dd[1] != n) return bad("shape mismatch");
  DType ta, tb, td;
  if (!to_dtype(a.element_type(), &ta) || !to_dtype(b.element_type(), &tb) ||
      !to_dtype(d->element_type(), &td))
    return bad("unsupported dtype");
  if (auto e = check_groups(group_sizes, row_ids, bias, *d, has_bias, groups, m, n); !e.empty()) return bad(e);

  GemmArgs g;
  const int64_t kb = (k + 127) / 128;
  const int64_t as = a_scales.element_count(), bs = b_scales.element_count();
  switch (scales_of(config)) {
    case Scales::kBlock1d2d:
    case Scales::kBlock1d1d: {
      const bool d2 = scales_of(config) == Scales::kBlock1d2d;
      g.a_block_scale_ld = block_scale_ld(m);
      g.b_block_scale_ld = block_scale_ld(d2 ? (n + 127) / 128 : n);
      if (a_scales.element_type() != ffi::DataType::F32 || b_scales.element_type() != ffi::DataType::F32 ||
          as != kb * g.a_block_scale_ld || bs != groups * kb * g.b_block_scale_ld)
        return bad("block scales (expected float32 (ceil(K/128), round_up(M, 4)) and (G, ceil(K/128), "
                   "round_up(rows, 4)) MN-major scales)");
      g.a_block_scale = static_cast<const float*>(a_scales.untyped_data());
      g.b_block_scale = static_cast<const float*>(b_scales.untyped_data());
      break;
    }
    case Scales::kMx:
      if (a_scales.element_type() != ffi::DataType::U8 || b_scales.element_type() != ffi::DataType::U8 ||
          static_cast<int64_t>(a_scales.size_bytes()) != mx_sf_bytes(m, k, 32) ||
          static_cast<int64_t>(b_scales.size_bytes()) != groups * mx_sf_bytes(n, k, 32))
        return bad("scale factors (expected uint8 bytes in the swizzled 128x4-atom layout, per expert)");
      g.a_sf = a_scales.untyped_data();
      g.b_sf = b_scales.untyped_data();
      break;
    case Scales::kRow:
      if (a_scales.element_type() != ffi::DataType::F32 || b_scales.element_type() != ffi::DataType::F32 ||
          (as != m && as != 1) || (bs != groups * n && bs != groups))
        return bad("scales (expected float32 (M,) or (1,) and (G, N) or (G,))");
      g.a_scale = static_cast<const float*>(a_scales.untyped_data());
      g.b_scale = static_cast<const float*>(b_scales.untyped_data());
      g.a_scale_per_row = as == m && m != 1;
      g.b_scale_per_col = bs == groups * n && n != 1;
      break;
    case Scales::kExpert:
      if (b_scales.element_type() != ffi::DataType::F32 || bs != groups)
        return bad("b_scales (expected float32 (G,): one scale per expert)");
      g.b_global_scale = static_cast<const float*>(b_scales.untyped_data());
      break;
    case Scales::kUnknown:
      return bad("config must be a grouped_* kernel");
  }

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return bad(why);

  set_common_args(g, m, n, k, a, b, bias, has_bias, d, workspace, 1, sm_count);
  g.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  g.row_ids = static_cast<const int32_t*>(row_ids.untyped_data());
  g.groups = groups;
  return launch(entry, g, stream);
}

// Operands: a (M, K * bits / 8) tokens sorted by expert and b (G, N, K * bits / 8) experts:
// float8_e4m3fn elements, or uint8 bytes of packed FP4 (2 per byte); a_sf, b_sf: uint8
// scale-factor bytes (E8M0 or E4M3) in the swizzled 128x4-atom layout, mx_sf_bytes(M, K, sf_vec)
// and G * mx_sf_bytes(N, K, sf_vec) (per expert back to back); a_global (1,) and b_global (G,)
// float32, NVFP4's global scales (read only when has_global); bias (G, N) in the output dtype
// (read only when has_bias); group_sizes (G,) int32; row_ids (M,) int32 (row_ids[0]: the global
// index of row 0). Results: d (M, N) bfloat16 or float32, and the workspace u8 (the per-expert
// arguments and the experts' re-laid activation scale factors, written on the device by the
// kernels' setup). Attributes: config, the logical element dtypes a_dtype / b_dtype
// (dtype_name spelling), the logical K, the scale-vector size sf_vec (32 MX, 16 NVFP4).
ffi::Error MxGroupedGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer a_sf,
                             ffi::AnyBuffer b_sf, ffi::AnyBuffer a_global, ffi::AnyBuffer b_global,
                             ffi::AnyBuffer bias, ffi::AnyBuffer group_sizes, ffi::AnyBuffer row_ids,
                             ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                             std::string_view config, std::string_view a_dtype, std::string_view b_dtype,
                             int64_t k, int32_t sf_vec, int32_t sm_count, bool has_bias, bool has_global) {
  HostTimer timer;
  auto bad = [](std::string_view msg) { return fail("jax_gmma_mx_grouped_gemm", msg); };
  // Cheap structural checks: the Python shape rules already enforce these at trace time.
  DType ta, tb, td;
  if (auto e = mx_dtypes(a_dtype, b_dtype, *d, &ta, &tb, &td); !e.empty()) return bad(e);
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 3 || dd.size() != 2) return bad("a, b, d must be (M, K), (G, N, K), (M, N)");
  const int64_t m = ad[0], groups = bd[0], n = bd[1];
  if (dd[0] != m || dd[1] != n) return bad("output shape mismatch");
  if (k <= 0) return bad("K must be positive");
  if (auto e = check_mx_operand(a, ta, m, k, "a"); !e.empty()) return bad(e);
  if (auto e = check_mx_operand(b, tb, groups * n, k, "b"); !e.empty()) return bad(e);
  if (auto e = check_mx_scale_factors(a_sf, b_sf, sf_vec, m, n, groups, k); !e.empty()) return bad(e);
  if (has_global && (!is_f32_scalar(a_global) || b_global.element_type() != ffi::DataType::F32 ||
                     static_cast<int64_t>(b_global.element_count()) != groups))
    return bad("global scales must be float32 (1,) and (G,)");
  if (auto e = check_groups(group_sizes, row_ids, bias, *d, has_bias, groups, m, n); !e.empty()) return bad(e);

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return bad(why);

  GemmArgs g;
  set_common_args(g, m, n, k, a, b, bias, has_bias, d, workspace, 1, sm_count);
  set_mx_args(g, a_sf, b_sf, a_global, b_global, has_global);
  g.group_sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  g.row_ids = static_cast<const int32_t*>(row_ids.untyped_data());
  g.groups = groups;
  return launch(entry, g, stream);
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8GroupedGemm, jax_gmma::Fp8GroupedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a (M, K)
                                  .Arg<ffi::AnyBuffer>()  // b (G, N, K)
                                  .Arg<ffi::AnyBuffer>()  // a_scales (kernel layout)
                                  .Arg<ffi::AnyBuffer>()  // b_scales (kernel layout, per expert)
                                  .Arg<ffi::AnyBuffer>()  // bias (G, N)
                                  .Arg<ffi::AnyBuffer>()  // group_sizes (G,) int32
                                  .Arg<ffi::AnyBuffer>()  // row_ids (M,) int32
                                  .Ret<ffi::AnyBuffer>()  // d (M, N)
                                  .Ret<ffi::AnyBuffer>()  // workspace u8
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_fp8_grouped_gemm_handler, JaxGmmaFp8GroupedGemm)

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaMxGroupedGemm, jax_gmma::MxGroupedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a (M, K): fp8, or packed fp4 bytes
                                  .Arg<ffi::AnyBuffer>()  // b (G, N, K)
                                  .Arg<ffi::AnyBuffer>()  // a_sf (swizzled, uint8)
                                  .Arg<ffi::AnyBuffer>()  // b_sf (swizzled, per expert)
                                  .Arg<ffi::AnyBuffer>()  // a_global (f32 (1,))
                                  .Arg<ffi::AnyBuffer>()  // b_global (f32 (G,))
                                  .Arg<ffi::AnyBuffer>()  // bias (G, N)
                                  .Arg<ffi::AnyBuffer>()  // group_sizes (G,) int32
                                  .Arg<ffi::AnyBuffer>()  // row_ids (M,) int32
                                  .Ret<ffi::AnyBuffer>()  // d (M, N)
                                  .Ret<ffi::AnyBuffer>()  // workspace u8
                                  .Attr<std::string_view>("config")
                                  .Attr<std::string_view>("a_dtype")
                                  .Attr<std::string_view>("b_dtype")
                                  .Attr<int64_t>("k")
                                  .Attr<int32_t>("sf_vec")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_global"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_mx_grouped_gemm_handler, JaxGmmaMxGroupedGemm)
