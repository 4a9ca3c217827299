// Instantiates every config of the sm90 FP8 block-scaled family for one scale variant and
// output dtype. Included by the generated sm90_fp8_gemm_blockwise_<variant>_<d>.cu
// (CMakeLists.txt): one translation unit per (variant, output dtype), so the build parallelizes.
// Entry names are "blockwise_<variant>_<config>"; the configs match jax_gmma's block-scaled
// configs. Kernels no heuristic picks (reachable only by forcing config=) are compiled only with
// JAX_GMMA_EXTRA_KERNELS=1 (JAX_GMMA_WITH_EXTRA).
#pragma once

#include "sm90_fp8_gemm_blockwise.cuh"

namespace jax_gmma::sm90_blockwise {

template <DType kA, DType kB, DType kD, Variant kV>
inline void add_blockwise_configs(KernelEntry* out, int& i) {
  constexpr bool k1d1d = kV == Variant::k1d1d;
#define JAX_GMMA_BW(Cfg, name) \
  out[i++] = Sm90Fp8BlockwiseGemm<kA, kB, kD, kV, Cfg>::entry(k1d1d ? "blockwise_1d1d_" name : "blockwise_1d2d_" name)
#if defined(JAX_GMMA_SMOKE_BUILD)
  JAX_GMMA_BW(CfgSwapCoopSk<16>, "swap_128x16x128_coop_streamk");
#else
  JAX_GMMA_BW(CfgCoop, "128x128x128_c1x1_coop");
  JAX_GMMA_BW(CfgCoopSk, "128x128x128_c1x1_coop_streamk");
#if defined(JAX_GMMA_WITH_EXTRA)
  // Never picked (large M takes the 128x128 cooperative tiles): forced configs only.
  JAX_GMMA_BW(CfgPp64, "64x128x128_c1x1_pingpong");
#endif
  JAX_GMMA_BW(CfgSwapCoopSk<16>, "swap_128x16x128_coop_streamk");
  JAX_GMMA_BW(CfgSwapCoopSk<32>, "swap_128x32x128_coop_streamk");
  JAX_GMMA_BW(CfgSwapCoopSk<64>, "swap_128x64x128_coop_streamk");
  if constexpr (k1d1d) {
    // 64-row kernel tiles cannot carry 128x128 weight scales (granularity must divide the tile).
    JAX_GMMA_BW(CfgSwapPp<16>, "swap_64x16x128_pingpong");
    JAX_GMMA_BW(CfgSwapPp<32>, "swap_64x32x128_pingpong");
    JAX_GMMA_BW(CfgSwapPp<64>, "swap_64x64x128_pingpong");
  }
#endif
#undef JAX_GMMA_BW
}

// Fills `out` (capacity >= 16) with the kernels of one (A, B, D, variant); returns the count.
template <DType kA, DType kB, DType kD, Variant kV>
inline int blockwise_entries(KernelEntry* out) {
  int i = 0;
  add_blockwise_configs<kA, kB, kD, kV>(out, i);
  return i;
}

}  // namespace jax_gmma::sm90_blockwise
