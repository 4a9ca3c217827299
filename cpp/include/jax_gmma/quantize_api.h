/* jax-gmma: the Python-free C interface of the activation quantization kernel
 * (cpp/sm90_fp8_quantize.cu).
 *
 * Quantizes a row-major (M, K) bfloat16 / float16 / float32 array x to float8_e4m3fn with one
 * scale per row and per block of K, in exactly the layout of jax_gmma.quantize (rowmajor):
 *
 *   block 128 ("fp8_1x128"): data (M, Kp) e4m3, Kp = round_up(K, 128), the tail Kp - K zero;
 *                            scales (M, Kp / 128) float32 dequantization scales
 *                            scale = max(amax * f32(1/448), 2^-126), or 1 when amax == 0;
 *   block 32 ("mxfp8"):      data (M, Kp) e4m3, Kp = round_up(K, 32);
 *                            scales (M, Kp / 32) E8M0 bytes (float8_e8m0fnu), 2^e with
 *                            e = clamp(floor(log2(amax)) - 8, -126, 127), e = 0 when
 *                            amax < 2^-126.
 *
 * amax is the largest |x| over the finite values of the block. Elements are x / scale
 * (x * 2^-e for MX) clipped to +-448 and rounded to nearest even; NaN stays NaN and +-Inf
 * becomes NaN (0x7F / 0xFF), as jax_gmma.quantize documents. The results are bit-identical to
 * jax_gmma.quantize run by XLA on the same GPU; see JAX_GMMA_QUANT_DIV_* for the one choice
 * that depends on how XLA compiles the reference's division.
 *
 * Everything is device side: the call enqueues one kernel on `stream` and returns; it never
 * synchronizes, allocates or queries the stream (safe under CUDA-graph capture).
 */
#ifndef JAX_GMMA_QUANTIZE_API_H_
#define JAX_GMMA_QUANTIZE_API_H_

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Input element types. */
enum {
  JAX_GMMA_QUANT_IN_BF16 = 0,
  JAX_GMMA_QUANT_IN_F16 = 1,
  JAX_GMMA_QUANT_IN_F32 = 2,
};

/* How the block-128 elements x / scale are divided (block 32 multiplies by an exact power of
 * two and ignores this). The reference's f32 division is compiled by XLA, so the kernel must
 * divide the way XLA's GPU code does to be bit-identical:
 *   XLA_GPU (default): div.full.f32, as XLA's NVPTX backend lowers f32 fdiv
 *            (-nvptx-prec-divf32=1: fast full-range division, <= 2 ulp, not correctly
 *            rounded). For the scales that occur it equals x * div.full(1, scale), which is also
 *            what XLA would compute were it to rewrite A / broadcast(B) into
 *            A * broadcast(1 / B) on GPUs (it does so only on CPU today);
 *   IEEE:    div.rn.f32, the correctly rounded quotient (in case XLA ever divides exactly). */
enum {
  JAX_GMMA_QUANT_DIV_XLA_GPU = 0,
  JAX_GMMA_QUANT_DIV_IEEE = 1,
};

/* Kp (padded K) and the number of scale blocks per row for a block size (128 or 32). */
static inline int64_t jax_gmma_quantize_padded_k(int64_t k, int block) {
  return (k + block - 1) / block * block;
}
static inline int64_t jax_gmma_quantize_scale_blocks(int64_t k, int block) {
  return (k + block - 1) / block;
}

/* Enqueues the quantization of x (M, K) on `stream`.
 *   x:       device pointer, (M, K) row-major, element type in_dtype (JAX_GMMA_QUANT_IN_*);
 *   data:    device pointer, (M, Kp) bytes (float8_e4m3fn);
 *   scales:  device pointer, (M, Kp / block) float32 (block 128) or bytes (E8M0, block 32);
 *   block:   128 or 32;  div_mode: JAX_GMMA_QUANT_DIV_*.
 * Any K >= 1 works, and any alignment (scales: that of their element type); K % 16 == 0
 * with a 16-byte aligned x takes the vectorized loads, a 16-byte aligned data the 16-byte
 * stores. M * ceil(Kp / 128) must be < 2^31. Returns cudaSuccess, cudaErrorInvalidValue for
 * bad arguments, or the launch error. M == 0 enqueues nothing. */
cudaError_t jax_gmma_fp8_quantize(const void* x, int in_dtype, int64_t m, int64_t k, int block,
                                  int div_mode, void* data, void* scales, cudaStream_t stream);

/* Scale layouts (jax_gmma.layouts): ROWMAJOR as above; SM100_128X4 (block 32 only): the
 * swizzled 128-row x 4-block atoms the MXFP8 GEMMs read, (ceil(M / 128), ceil(nb / 4), 32, 4, 4)
 * bytes, the padding (rows past M, blocks past nb) zero bytes -- bit-identical to
 * jax_gmma.layouts.swizzle_scales of the row-major scales (scales 4-byte aligned). */
enum {
  JAX_GMMA_QUANT_SCALES_ROWMAJOR = 0,
  JAX_GMMA_QUANT_SCALES_SM100_128X4 = 1,
};

/* jax_gmma_fp8_quantize with a choice of scale layout (JAX_GMMA_QUANT_SCALES_*). */
cudaError_t jax_gmma_fp8_quantize_ex(const void* x, int in_dtype, int64_t m, int64_t k, int block,
                                     int div_mode, int scale_layout, void* data, void* scales,
                                     cudaStream_t stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* JAX_GMMA_QUANTIZE_API_H_ */
