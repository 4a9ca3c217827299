// sm_100a (B200 / GB200) block-scaled MX / NVFP4 GEMM configs: tcgen05 UMMA block-scaled
// kinds (mxf8f6f4, mxf4, nvf4) with 1-SM and 2-SM (cluster 2x1, one MMA spanning an SM pair)
// schedules. Kernel template: sm1xx_mx_gemm_blockscaled.cuh. NOT RUN ON HARDWARE here.
//
// Kernel names: "sm100_<A format>x<B format>_<MMA tile>_<1sm|2sm>"; they must match
// jax_gmma/mx.py. One translation unit per (format pair, output dtype): each instantiates
// that pair's 1-SM and 2-SM kernels.
#pragma once

#include "sm1xx_mx_gemm_blockscaled.cuh"

namespace jax_gmma::sm1xx_mx {

namespace sm100 {
using cutlass::arch::Sm100;
// f8f6f4 kind (MXFP8, MXFP6, MXFP8 x MXFP4): K tile 128 (128 bytes of fp8 per row).
using Mxf8f6f4_1Sm = Config<Sm100, 100, Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                            cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100,
                            cutlass::epilogue::TmaWarpSpecialized1Sm>;
using Mxf8f6f4_2Sm = Config<Sm100, 100, Shape<_256, _128, _128>, Shape<_2, _1, _1>,
                            cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100,
                            cutlass::epilogue::TmaWarpSpecialized2Sm>;
// mxf4 / nvf4 kinds (packed FP4 in shared memory): K tile 256 (128 bytes per row).
using Mxf4_1Sm = Config<Sm100, 100, Shape<_128, _128, _256>, Shape<_1, _1, _1>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmMxf4Sm100,
                        cutlass::epilogue::TmaWarpSpecialized1Sm>;
using Mxf4_2Sm = Config<Sm100, 100, Shape<_256, _128, _256>, Shape<_2, _1, _1>,
                        cutlass::gemm::KernelTmaWarpSpecialized2SmMxf4Sm100,
                        cutlass::epilogue::TmaWarpSpecialized2Sm>;
using Nvf4_1Sm = Config<Sm100, 100, Shape<_128, _128, _256>, Shape<_1, _1, _1>,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100,
                        cutlass::epilogue::TmaWarpSpecialized1Sm>;
using Nvf4_2Sm = Config<Sm100, 100, Shape<_256, _128, _256>, Shape<_2, _1, _1>,
                        cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100,
                        cutlass::epilogue::TmaWarpSpecialized2Sm>;
}  // namespace sm100

enum class Sm100Pair { kMxf8, kMxf6E2M3, kMxf6E3M2, kMxf8Mxf4, kMxf4, kNvf4 };

// Fills `out` (capacity >= 4) with the kernels of one format pair and output; returns the count.
template <Sm100Pair kP, DType kD>
inline int sm100_mx_entries(KernelEntry* out) {
  int i = 0;
#define JAX_GMMA_MX(FA, FB, Cfg, name) out[i++] = MxGemm<FA, FB, kD, sm100::Cfg>::entry(name)
  if constexpr (kP == Sm100Pair::kMxf8) {
    JAX_GMMA_MX(MxF8E4M3, MxF8E4M3, Mxf8f6f4_1Sm, "sm100_mxfp8xmxfp8_128x128x128_1sm");
    JAX_GMMA_MX(MxF8E4M3, MxF8E4M3, Mxf8f6f4_2Sm, "sm100_mxfp8xmxfp8_256x128x128_2sm");
  } else if constexpr (kP == Sm100Pair::kMxf6E2M3) {
    JAX_GMMA_MX(MxF6E2M3, MxF6E2M3, Mxf8f6f4_1Sm, "sm100_mxfp6_e2m3xmxfp6_e2m3_128x128x128_1sm");
    JAX_GMMA_MX(MxF6E2M3, MxF6E2M3, Mxf8f6f4_2Sm, "sm100_mxfp6_e2m3xmxfp6_e2m3_256x128x128_2sm");
  } else if constexpr (kP == Sm100Pair::kMxf6E3M2) {
    JAX_GMMA_MX(MxF6E3M2, MxF6E3M2, Mxf8f6f4_1Sm, "sm100_mxfp6_e3m2xmxfp6_e3m2_128x128x128_1sm");
  } else if constexpr (kP == Sm100Pair::kMxf8Mxf4) {
    JAX_GMMA_MX(MxF8E4M3, MxF4F8f6f4, Mxf8f6f4_1Sm, "sm100_mxfp8xmxfp4_128x128x128_1sm");
    JAX_GMMA_MX(MxF8E4M3, MxF4F8f6f4, Mxf8f6f4_2Sm, "sm100_mxfp8xmxfp4_256x128x128_2sm");
  } else if constexpr (kP == Sm100Pair::kMxf4) {
    JAX_GMMA_MX(MxF4, MxF4, Mxf4_1Sm, "sm100_mxfp4xmxfp4_128x128x256_1sm");
    JAX_GMMA_MX(MxF4, MxF4, Mxf4_2Sm, "sm100_mxfp4xmxfp4_256x128x256_2sm");
  } else {
    JAX_GMMA_MX(NvF4, NvF4, Nvf4_1Sm, "sm100_nvfp4xnvfp4_128x128x256_1sm");
    JAX_GMMA_MX(NvF4, NvF4, Nvf4_2Sm, "sm100_nvfp4xnvfp4_256x128x256_2sm");
  }
#undef JAX_GMMA_MX
  return i;
}

}  // namespace jax_gmma::sm1xx_mx
