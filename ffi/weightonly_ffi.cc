// XLA FFI handlers of the sm90 FP4 / FP6 weight-only GEMM (cpp/sm90_fp4_gemm_weightonly.cu,
// cpp/sm90_fp6_gemm_weightonly.cu), of its grouped (mixture-of-experts) form and of the weight
// unpack kernel of the prefill path (same files): jax_gmma_weightonly_gemm,
// jax_gmma_weightonly_grouped_gemm, jax_gmma_weightonly_unpack and jax_gmma_weightonly_tile_x
// (the tensor-core shapes' tiled activations). The grouped form reads the group sizes on the
// device only.
//
// Graph safety (the rules of ffi/graph_safety.h): the stream comes from the platform context and
// is only asked whether it is capturing; the execute path enqueues one kernel launch (static
// shared memory, no attribute to set, no workspace, no memset) and never synchronizes or
// copies to the host -- the scales are read by the kernel.
#include "common.h"
#include "jax_gmma/weightonly_api.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

ffi::Error bad(std::string_view msg) { return fail("jax_gmma_weightonly_gemm", msg); }
ffi::Error bad_unpack(std::string_view msg) { return fail("jax_gmma_weightonly_unpack", msg); }
ffi::Error bad_grouped(std::string_view msg) { return fail("jax_gmma_weightonly_grouped_gemm", msg); }
ffi::Error bad_tile(std::string_view msg) { return fail("jax_gmma_weightonly_tile_x", msg); }

// The prepared weight both handlers take: uint8 codes and scale codes of an (N, K) weight
// (K the padded K) in format scale_kind. nullptr when they match, else the reason.
const char* check_prepared(const ffi::AnyBuffer& w_packed, const ffi::AnyBuffer& w_scales,
                           int32_t scale_kind, int64_t n, int64_t k) {
  if (w_packed.element_type() != ffi::DataType::U8 || w_scales.element_type() != ffi::DataType::U8)
    return "w_packed and w_scales must be uint8";
  if (scale_kind < 0 || scale_kind > static_cast<int32_t>(WoScale::kMx6E3M2))
    return "scale_kind must be 0 (nvfp4), 1 (mxfp4), 2 (mxfp6_e2m3) or 3 (mxfp6_e3m2)";
  const int64_t sb = weightonly_scale_bytes(static_cast<WoScale>(scale_kind));
  const int64_t tb = weightonly_tile_bytes(static_cast<WoScale>(scale_kind));
  if (static_cast<int64_t>(w_packed.size_bytes()) != n / 16 * (k / 64) * tb ||
      static_cast<int64_t>(w_scales.size_bytes()) != n / 16 * (k / 64) * sb)
    return "prepared weight sizes do not match (N, K)";
  return nullptr;
}

// The WoArgs of both GEMM handlers (shapes from x (M, Kp) and d (M, N); checked by the caller).
WoArgs wo_args(const ffi::AnyBuffer& x, const ffi::AnyBuffer& x_scale, const ffi::AnyBuffer& w_packed,
               const ffi::AnyBuffer& w_scales, const ffi::AnyBuffer& w_global,
               const ffi::AnyBuffer& bias, ffi::Result<ffi::AnyBuffer>& d, bool has_x_scale,
               bool has_global, bool has_bias, WoScale scale) {
  WoArgs a;
  a.m = x.dimensions()[0];
  a.k = x.dimensions()[1];
  a.n = d->dimensions()[1];
  a.x = x.untyped_data();
  a.x_scale = has_x_scale ? static_cast<const float*>(x_scale.untyped_data()) : nullptr;
  a.w_packed = w_packed.untyped_data();
  a.w_scales = w_scales.untyped_data();
  a.w_global = has_global ? static_cast<const float*>(w_global.untyped_data()) : nullptr;
  a.bias = has_bias ? bias.untyped_data() : nullptr;
  a.d = d->untyped_data();
  a.d_is_f32 = d->element_type() == ffi::DataType::F32;
  a.scale = scale;
  return a;
}

// Operands: x (M,K) bf16, or with x_rows > 0 (the tensor-core shapes) the tiled x: (K / 64,
// x_rows / 8, 512) bf16 (WoArgs::x_rows), x_scale f32 (M,) or (1,) (ignored unless has_x_scale),
// w_packed u8, w_scales u8 (prepared layouts), w_global f32 (1,) (ignored unless has_global),
// bias (N,) in the output dtype (ignored unless has_bias). Result: d (M,N) bf16 or f32.
ffi::Error WeightOnlyGemmImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer x_scale,
                              ffi::AnyBuffer w_packed, ffi::AnyBuffer w_scales,
                              ffi::AnyBuffer w_global, ffi::AnyBuffer bias,
                              ffi::Result<ffi::AnyBuffer> d, int32_t scale_kind, int32_t rows,
                              int32_t tokens, int32_t k_warps, int32_t x_rows, bool has_x_scale,
                              bool has_global, bool has_bias) {
  auto xd = x.dimensions();
  auto dd = d->dimensions();
  if (dd.size() != 2) return bad("d must be 2-D");
  if (x.element_type() != ffi::DataType::BF16) return bad("x must be bfloat16");
  if (x_rows < 0) return bad("x_rows must not be negative");
  const int64_t m = dd[0], n = dd[1];
  int64_t k = 0;
  if (x_rows) {
    if (xd.size() != 3 || xd[1] * 8 != x_rows || xd[2] != 512)
      return bad("tiled x must be (K / 64, x_rows / 8, 512)");
    k = xd[0] * 64;
  } else {
    if (xd.size() != 2) return bad("x must be 2-D");
    if (xd[0] != m) return bad("shape mismatch");
    k = xd[1];
  }
  const bool f32 = d->element_type() == ffi::DataType::F32;
  if (!f32 && d->element_type() != ffi::DataType::BF16) return bad("d must be bfloat16 or float32");
  if (const char* why = check_prepared(w_packed, w_scales, scale_kind, n, k)) return bad(why);
  if (has_x_scale && (x_scale.element_type() != ffi::DataType::F32 ||
                      static_cast<int64_t>(x_scale.element_count()) != m))
    return bad("x_scale must be float32 (M,)");
  if (has_global && !is_f32_scalar(w_global)) return bad("w_global must be float32 (1,)");
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return bad(e);

  WoArgs a = wo_args(x, x_scale, w_packed, w_scales, w_global, bias, d, has_x_scale, has_global,
                     has_bias, static_cast<WoScale>(scale_kind));
  a.rows_per_cta = rows;
  a.tokens_per_cta = tokens;
  a.k_warps = k_warps;
  a.x_rows = x_rows;
  a.m = m;  // (wo_args read them from a row-major x)
  a.k = k;
#if !defined(JAX_GMMA_HAVE_SM90)
  (void)stream;
  return bad(kNoSm90);
#else
  if (const char* why = weightonly_check(a)) return bad(why);

  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  if (cudaError_t err = weightonly_run(a, stream); err != cudaSuccess)
    return cuda_fail("jax_gmma: weight-only GEMM launch failed", err);
  return ffi::Error::Success();
#endif
}

// Operands: x (M, Kp) bf16 tokens sorted by expert, x_scale f32 (M,) (ignored unless
// has_x_scale), w_packed u8 and w_scales u8 (G experts' prepared layouts back to back), w_global
// f32 (G,) or (G, 1), bias (G, N) in the output dtype (ignored unless has_bias), group_sizes s32
// (G,), row_ids s32 (M,). Result: d (M, N) bf16 or f32.
ffi::Error WeightOnlyGroupedGemmImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer x_scale,
                                     ffi::AnyBuffer w_packed, ffi::AnyBuffer w_scales,
                                     ffi::AnyBuffer w_global, ffi::AnyBuffer bias,
                                     ffi::AnyBuffer group_sizes, ffi::AnyBuffer row_ids,
                                     ffi::Result<ffi::AnyBuffer> d, int32_t scale_kind,
                                     bool has_x_scale, bool has_bias) {
  HostTimer timer;
  auto xd = x.dimensions();
  auto dd = d->dimensions();
  if (xd.size() != 2 || dd.size() != 2) return bad_grouped("x and d must be 2-D");
  if (x.element_type() != ffi::DataType::BF16) return bad_grouped("x must be bfloat16");
  const int64_t m = xd[0], k = xd[1], n = dd[1];
  const int64_t groups = group_sizes.element_count();
  if (dd[0] != m) return bad_grouped("shape mismatch");
  const bool f32 = d->element_type() == ffi::DataType::F32;
  if (!f32 && d->element_type() != ffi::DataType::BF16) return bad_grouped("d must be bfloat16 or float32");
  if (group_sizes.element_type() != ffi::DataType::S32 || groups < 1)
    return bad_grouped("group_sizes must be (G,) int32, G >= 1");
  if (row_ids.element_type() != ffi::DataType::S32 || static_cast<int64_t>(row_ids.element_count()) != m)
    return bad_grouped("row_ids must be (M,) int32");
  if (w_packed.element_type() != ffi::DataType::U8 || w_scales.element_type() != ffi::DataType::U8)
    return bad_grouped("w_packed and w_scales must be uint8");
  if (scale_kind < 0 || scale_kind > static_cast<int32_t>(WoScale::kMx6E3M2))
    return bad_grouped("scale_kind must be 0 (nvfp4), 1 (mxfp4), 2 (mxfp6_e2m3) or 3 (mxfp6_e3m2)");
  const WoScale sk = static_cast<WoScale>(scale_kind);
  if (static_cast<int64_t>(w_packed.size_bytes()) != groups * (n / 16) * (k / 64) * weightonly_tile_bytes(sk) ||
      static_cast<int64_t>(w_scales.size_bytes()) != groups * (n / 16) * (k / 64) * weightonly_scale_bytes(sk))
    return bad_grouped("prepared weight sizes do not match G experts of (N, K)");
  if (w_global.element_type() != ffi::DataType::F32 || static_cast<int64_t>(w_global.element_count()) != groups)
    return bad_grouped("w_global must be float32, one per expert");
  if (has_x_scale && (x_scale.element_type() != ffi::DataType::F32 ||
                      static_cast<int64_t>(x_scale.element_count()) != m))
    return bad_grouped("x_scale must be float32 (M,)");
  if (has_bias && (bias.element_type() != d->element_type() ||
                   static_cast<int64_t>(bias.element_count()) != groups * n))
    return bad_grouped("bias must be (G, N) in the output dtype");

  WoArgs a = wo_args(x, x_scale, w_packed, w_scales, w_global, bias, d, has_x_scale, true, has_bias, sk);
  WoGroups g;
  g.sizes = static_cast<const int32_t*>(group_sizes.untyped_data());
  g.row_ids = static_cast<const int32_t*>(row_ids.untyped_data());
  g.count = groups;
#if !defined(JAX_GMMA_HAVE_SM90)
  (void)stream;
  (void)g;
  return bad_grouped(kNoSm90);
#else
  if (const char* why = weightonly_grouped_check(a, g)) return bad_grouped(why);

  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  if (cudaError_t err = weightonly_grouped_run(a, g, stream); err != cudaSuccess)
    return cuda_fail("jax_gmma: grouped weight-only GEMM launch failed", err);
  return ffi::Error::Success();
#endif
}

// Operands: w_packed u8, w_scales u8 (prepared layouts of an (N, Kp) weight), row_exp s32 (N,)
// (float8 output only; any (1,) buffer otherwise). Result: out (N, Kp) bf16 (the exact weight)
// or float8_e4m3fn (weight * 2^(127 - row_exp[r]), saturating; NaN for poisoned blocks).
ffi::Error WeightOnlyUnpackImpl(cudaStream_t stream, ffi::AnyBuffer w_packed,
                                ffi::AnyBuffer w_scales, ffi::AnyBuffer row_exp,
                                ffi::Result<ffi::AnyBuffer> out, int32_t scale_kind) {
  auto od = out->dimensions();
  if (od.size() != 2) return bad_unpack("out must be 2-D (N, Kp)");
  const int64_t n = od[0], k = od[1];
  const bool fp8 = out->element_type() == ffi::DataType::F8E4M3FN;
  if (!fp8 && out->element_type() != ffi::DataType::BF16)
    return bad_unpack("out must be bfloat16 or float8_e4m3fn");
  if (n < 1 || k < 1 || n % 16 != 0 || k % 64 != 0)
    return bad_unpack("out must be (N, Kp) with N a multiple of 16 and Kp of 64");
  if (const char* why = check_prepared(w_packed, w_scales, scale_kind, n, k)) return bad_unpack(why);
  if (fp8 && (row_exp.element_type() != ffi::DataType::S32 ||
              static_cast<int64_t>(row_exp.element_count()) != n))
    return bad_unpack("row_exp must be int32 (N,) for float8 output");

  WoUnpackArgs a;
  a.n = n;
  a.k = k;
  a.scale = static_cast<WoScale>(scale_kind);
  a.w_packed = w_packed.untyped_data();
  a.w_scales = w_scales.untyped_data();
  a.row_exp = fp8 ? static_cast<const int32_t*>(row_exp.untyped_data()) : nullptr;
  a.out = out->untyped_data();
  a.out_fp8 = fp8;
#if !defined(JAX_GMMA_HAVE_SM90)
  (void)stream;
  return bad_unpack(kNoSm90);
#else
  if (const char* why = weightonly_unpack_check(a)) return bad_unpack(why);

  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  if (cudaError_t err = weightonly_unpack_run(a, stream); err != cudaSuccess)
    return cuda_fail("jax_gmma: weight-only unpack launch failed", err);
  return ffi::Error::Success();
#endif
}

// Operand: x (M, K) bf16 row-major. Result: out (K / 64, rows / 8, 512) bf16, the tensor-core
// kernel's tiled x (WoTileArgs; rows M .. rows - 1 zero).
ffi::Error WeightOnlyTileXImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> out) {
  auto xd = x.dimensions();
  auto od = out->dimensions();
  if (xd.size() != 2 || x.element_type() != ffi::DataType::BF16) return bad_tile("x must be (M, K) bfloat16");
  if (od.size() != 3 || out->element_type() != ffi::DataType::BF16 || od[0] * 64 != xd[1] || od[2] != 512)
    return bad_tile("out must be (K / 64, rows / 8, 512) bfloat16");
  WoTileArgs a;
  a.m = xd[0];
  a.k = xd[1];
  a.rows = od[1] * 8;
  a.x = x.untyped_data();
  a.out = out->untyped_data();
#if !defined(JAX_GMMA_HAVE_SM90)
  (void)stream;
  return bad_tile(kNoSm90);
#else
  if (const char* why = weightonly_tile_x_check(a)) return bad_tile(why);

  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  if (cudaError_t err = weightonly_tile_x_run(a, stream); err != cudaSuccess)
    return cuda_fail("jax_gmma: weight-only x tiling launch failed", err);
  return ffi::Error::Success();
#endif
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaWeightOnlyGemm, jax_gmma::WeightOnlyGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // x_scale
                                  .Arg<ffi::AnyBuffer>()  // w_packed
                                  .Arg<ffi::AnyBuffer>()  // w_scales
                                  .Arg<ffi::AnyBuffer>()  // w_global
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Attr<int32_t>("scale_kind")
                                  .Attr<int32_t>("rows")
                                  .Attr<int32_t>("tokens")
                                  .Attr<int32_t>("k_warps")
                                  .Attr<int32_t>("x_rows")
                                  .Attr<bool>("has_x_scale")
                                  .Attr<bool>("has_global")
                                  .Attr<bool>("has_bias"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_weightonly_gemm_handler, JaxGmmaWeightOnlyGemm)

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaWeightOnlyUnpack, jax_gmma::WeightOnlyUnpackImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // w_packed
                                  .Arg<ffi::AnyBuffer>()  // w_scales
                                  .Arg<ffi::AnyBuffer>()  // row_exp
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<int32_t>("scale_kind"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_weightonly_unpack_handler, JaxGmmaWeightOnlyUnpack)

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaWeightOnlyGroupedGemm, jax_gmma::WeightOnlyGroupedGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // x_scale
                                  .Arg<ffi::AnyBuffer>()  // w_packed (G experts)
                                  .Arg<ffi::AnyBuffer>()  // w_scales
                                  .Arg<ffi::AnyBuffer>()  // w_global (G,)
                                  .Arg<ffi::AnyBuffer>()  // bias (G, N)
                                  .Arg<ffi::AnyBuffer>()  // group_sizes (G,) int32
                                  .Arg<ffi::AnyBuffer>()  // row_ids (M,) int32
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Attr<int32_t>("scale_kind")
                                  .Attr<bool>("has_x_scale")
                                  .Attr<bool>("has_bias"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_weightonly_grouped_gemm_handler, JaxGmmaWeightOnlyGroupedGemm)

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaWeightOnlyTileX, jax_gmma::WeightOnlyTileXImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Ret<ffi::AnyBuffer>(),  // out (tiled)
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_weightonly_tile_x_handler, JaxGmmaWeightOnlyTileX)
