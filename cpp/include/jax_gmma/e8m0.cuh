// jax-gmma: E8M0 (OCP MX shared exponent) scale codes on the device, for the Hopper MXFP8
// kernels (cpp/sm90_mxf8_gemm_blockscaled.cu, cpp/sm90_mxf8_gemm_blockscaled_stream.cu).
#pragma once

#include <cstdint>

namespace jax_gmma {

// E8M0 code -> float32 2^(c - 127); c = 0 is the subnormal 2^-127, c = 255 NaN.
__device__ __forceinline__ float e8m0_to_float(uint32_t c) {
  uint32_t bits = c << 23;
  bits = c == 0 ? 0x00400000u : bits;
  bits = c == 255 ? 0x7fc00000u : bits;
  return __uint_as_float(bits);
}

}  // namespace jax_gmma
