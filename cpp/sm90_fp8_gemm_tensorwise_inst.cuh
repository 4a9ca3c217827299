// Instantiates every config of the sm90 FP8 tensorwise family for one output dtype.
// Included by the generated sm90_fp8_gemm_tensorwise_<a><b>_<d>[_decode].cu (CMakeLists.txt): two
// translation units per dtype triple, so the build parallelizes and each compiler process stays
// under ~8 GB. Kernels no heuristic picks (jax_gmma's tensorwise configs; reachable only by
// forcing config=) are compiled only with JAX_GMMA_EXTRA_KERNELS=1 (JAX_GMMA_WITH_EXTRA).
#pragma once

#include "sm90_fp8_gemm_tensorwise.cuh"

namespace jax_gmma::sm90 {

// Two halves per dtype triple, each its own translation unit (sm90_fp8_gemm_tensorwise_<a><b>_<d>.cu
// and ..._decode.cu): one TU with all 14 configs peaked at 11.7 GB of compiler memory, so two
// of them could not compile side by side on a 24 GB machine.

// Large-M configs (no swap-AB).
template <DType kA, DType kB, DType kD>
inline int tensorwise_large_entries(KernelEntry* out) {
  int i = 0;
#if !defined(JAX_GMMA_SMOKE_BUILD)
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgL256CoopFast>::entry("128x256x128_c2x1_coop_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgM192Coop2l>::entry("128x192x128_c2x1_coop_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgM192CoopFast>::entry("128x192x128_c2x1_coop_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgM128Coop2l>::entry("128x128x128_c2x1_coop_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgP128PpFast>::entry("128x128x128_c1x2_pingpong_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgS128CoopSk>::entry("128x128x128_c1x1_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgL256CoopSkFast>::entry("128x256x128_c1x1_coop_streamk_fast");
#endif
  return i;
}

// Decode configs (swap-AB: the weights along the kernel's M).
template <DType kA, DType kB, DType kD>
inline int tensorwise_decode_entries(KernelEntry* out) {
  int i = 0;
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<16>>::entry("swap_128x16x128_coop_streamk_2lvl");
#if !defined(JAX_GMMA_SMOKE_BUILD)
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<32>>::entry("swap_128x32x128_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwap<64>>::entry("swap_128x64x128_coop_streamk_2lvl");
#if defined(JAX_GMMA_WITH_EXTRA)
  // Never picked (the 16-token one-wave tile is the warp-specialized one): forced configs only.
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapPp<16>>::entry("swap_64x16x128_pingpong_2lvl");
#endif
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapPp<32>>::entry("swap_64x32x128_pingpong_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapPp<64>>::entry("swap_64x64x128_pingpong_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapC2<64>>::entry("swap_128x64x128_c2x1_coop_streamk_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWs<16, 10>>::entry("swap_64x16x128_ws_s10_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWs<16, 4>>::entry("swap_64x16x128_ws_s4_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWs<64, 8>>::entry("swap_64x64x128_ws_s8_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWs<64, 6>>::entry("swap_64x64x128_ws_s6_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWsC2<64, 4>>::entry("swap_64x64x128_c2x1_ws_s4_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapWs<32, 4>>::entry("swap_64x32x128_ws_s4_2lvl");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapCoopFast<16, 1>>::entry("swap_128x16x128_coop_streamk_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapCoopFast<32, 1>>::entry("swap_128x32x128_coop_streamk_fast");
  out[i++] = Sm90Fp8Gemm<kA, kB, kD, CfgDecodeSwapCoopFast<64, 2>>::entry("swap_128x64x128_c2x1_coop_streamk_fast");
#endif
  return i;
}

}  // namespace jax_gmma::sm90
