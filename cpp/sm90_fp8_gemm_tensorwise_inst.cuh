// Instantiates every config of the sm90 FP8 tensorwise family for one output dtype.
// Included by sm90_fp8_gemm_tensorwise_{bf16,f16,f32}.cu (one translation unit per output
// dtype so the build parallelizes).
#pragma once

#include "sm90_fp8_gemm_tensorwise.cuh"

namespace jax_gmma::sm90 {

template <DType kA, DType kB, DType kD>
inline void add_tensorwise_configs(KernelEntry* out, int& i) {
#if defined(JAX_GMMA_SMOKE_BUILD)
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<16>>::entry("swap_128x16x128_coop_streamk_2lvl");
#else
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgL256Coop2l>::entry("128x256x128_c2x1_coop_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgL256CoopFast>::entry("128x256x128_c2x1_coop_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgP128Pp2l>::entry("128x128x128_c1x2_pingpong_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgP128PpFast>::entry("128x128x128_c1x2_pingpong_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgS128CoopSk>::entry("128x128x128_c1x1_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<16>>::entry("swap_128x16x128_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<32>>::entry("swap_128x32x128_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<64>>::entry("swap_128x64x128_coop_streamk_2lvl");
#endif
}

// Fills `out` (capacity >= 32) with this output dtype's kernels; returns the count.
template <DType kD>
inline int tensorwise_entries(KernelEntry* out) {
  int i = 0;
  add_tensorwise_configs<DType::kF8E4M3, DType::kF8E4M3, kD>(out, i);
  add_tensorwise_configs<DType::kF8E5M2, DType::kF8E4M3, kD>(out, i);
  return i;
}

}  // namespace jax_gmma::sm90
