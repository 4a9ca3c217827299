// XLA FFI handler of the activation quantization kernel (cpp/sm90_fp8_quantize.cu), target
// "jax_gmma_fp8_quantize" (typed FFI, CUDA platform; the quantize primitive of jax_gmma lowers to it).
//
// Graph safety (the rules of ffi/graph_safety.h, shared by every handler): the execute path
// takes the stream from the platform context and asks it nothing but cudaStreamIsCapturing
// (cudaStreamGetDevice on a capturing stream would invalidate the capture), needs no device,
// no one-time setup and no workspace, and enqueues exactly one kernel launch: no
// synchronization, no allocation, no device-to-host copy.
#include "common.h"
#include "jax_gmma/quantize_api.h"

namespace jax_gmma {
namespace {

using namespace ffi_common;

ffi::Error invalid(std::string_view msg) { return fail("jax_gmma_fp8_quantize", msg); }

// Operand: x (M, K) bfloat16 / float16 / float32, row-major. Results: data (M, Kp)
// float8_e4m3fn; scales (M, Kp / block) float32 (block 128, "fp8_1x128") or float8_e8m0fnu /
// uint8 (block 32, "mxfp8"), or with scale_layout SM100_128X4 (block 32) the swizzled
// (ceil(M / 128), ceil(nb / 4), 32, 4, 4) bytes; Kp = K rounded up to the block. Attributes:
// block (128 or 32), div_mode (JAX_GMMA_QUANT_DIV_*), scale_layout (JAX_GMMA_QUANT_SCALES_*;
// see quantize_api.h).
ffi::Error Fp8QuantizeImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> data,
                           ffi::Result<ffi::AnyBuffer> scales, int32_t block, int32_t div_mode,
                           int32_t scale_layout) {
  // Cheap structural checks: the Python side builds exactly these shapes at trace time.
  auto xd = x.dimensions();
  auto dd = data->dimensions();
  auto sd = scales->dimensions();
  const bool swz = scale_layout == JAX_GMMA_QUANT_SCALES_SM100_128X4;
  if (!swz && scale_layout != JAX_GMMA_QUANT_SCALES_ROWMAJOR)
    return invalid("unknown scale_layout");
  if (swz && block != 32) return invalid("swizzled scales need block 32 (mxfp8)");
  if (xd.size() != 2 || dd.size() != 2 || sd.size() != (swz ? 5u : 2u))
    return invalid("x and data must be 2-D, scales 2-D (row-major) or 5-D (swizzled)");
  if (block != 128 && block != 32) return invalid("block must be 128 or 32");
  if (div_mode != JAX_GMMA_QUANT_DIV_XLA_GPU && div_mode != JAX_GMMA_QUANT_DIV_IEEE)
    return invalid("unknown div_mode");
  int in_dtype;
  switch (x.element_type()) {
    case ffi::DataType::BF16: in_dtype = JAX_GMMA_QUANT_IN_BF16; break;
    case ffi::DataType::F16: in_dtype = JAX_GMMA_QUANT_IN_F16; break;
    case ffi::DataType::F32: in_dtype = JAX_GMMA_QUANT_IN_F32; break;
    default: return invalid("x must be bfloat16, float16 or float32");
  }
  const int64_t m = xd[0], k = xd[1];
  const int64_t kp = jax_gmma_quantize_padded_k(k, block);
  const int64_t nb = jax_gmma_quantize_scale_blocks(k, block);
  if (data->element_type() != ffi::DataType::F8E4M3FN || dd[0] != m || dd[1] != kp)
    return invalid("data must be float8_e4m3fn (M, K rounded up to the block)");
  const bool scale_ok = block == 128 ? scales->element_type() == ffi::DataType::F32
                                     : (scales->element_type() == ffi::DataType::F8E8M0FNU ||
                                        scales->element_type() == ffi::DataType::U8);
  const bool dims_ok = swz ? (sd[0] == (m + 127) / 128 && sd[1] == (nb + 3) / 4 &&
                              sd[2] == 32 && sd[3] == 4 && sd[4] == 4)
                            : (sd[0] == m && sd[1] == nb);
  if (!scale_ok || !dims_ok)
    return invalid("scales must be (M, ceil(K / block)) -- swizzled: (ceil(M / 128), "
                   "ceil(K / 128), 32, 4, 4) -- float32 for block 128, float8_e8m0fnu for "
                   "block 32");
#if !defined(JAX_GMMA_HAVE_SM90)
  (void)stream;
  (void)in_dtype;
  return invalid(kNoSm90);
#else
  if (m == 0) return ffi::Error::Success();

  // Counted in the library-wide capture counters (_gmma_ext.capture_stats()).
  if (!jax_gmma_note_execution(stream))
    return ffi::Error::Internal("jax_gmma_fp8_quantize: cudaStreamIsCapturing failed");

  const cudaError_t err =
      jax_gmma_fp8_quantize_ex(x.untyped_data(), in_dtype, m, k, block, div_mode, scale_layout,
                               data->untyped_data(), scales->untyped_data(), stream);
  if (err != cudaSuccess) return cuda_fail("jax_gmma_fp8_quantize: kernel launch failed", err);
  return ffi::Error::Success();
#endif
}

}  // namespace
}  // namespace jax_gmma

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8Quantize, jax_gmma::Fp8QuantizeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Ret<ffi::AnyBuffer>()  // data
                                  .Ret<ffi::AnyBuffer>()  // scales
                                  .Attr<int32_t>("block")
                                  .Attr<int32_t>("div_mode")
                                  .Attr<int32_t>("scale_layout"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

JAX_GMMA_EXPORT_HANDLER(jax_gmma_fp8_quantize_handler, JaxGmmaFp8Quantize)
