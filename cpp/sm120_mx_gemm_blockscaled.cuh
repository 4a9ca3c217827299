// sm_120a (RTX 50 / RTX PRO Blackwell) block-scaled MX / NVFP4 GEMM configs: warp-level
// block-scaled MMA (mxf8f6f4 / mxf4 / nvf4 kinds), TMA + warp-specialized cooperative
// mainloop, no clusters (no multicast on this arch). Kernel template:
// sm1xx_mx_gemm_blockscaled.cuh. NOT RUN ON HARDWARE here.
//
// Shared memory: ~100 KB per SM (vs 228 KB on sm100), so the tiles are 128x128 with K 128 (one
// 16 KB A + 16 KB B stage for FP8, half that for FP4) and the stage count is whatever the
// builder fits next to the epilogue (StageCountAutoCarveout against sm120's capacity); no 2-SM
// configs (sm120 has no tcgen05 / SM-pair MMA).
//
// Kernel names: "sm120_<A format>x<B format>_<tile>_coop"; they must match jax_gmma/mx.py.
#pragma once

#include "sm1xx_mx_gemm_blockscaled.cuh"

// The host stub error "__wrapper__device_stub_device_kernel<...> does not match any template
// declaration" (nvcc 13.0 + GCC 12): CUTLASS's sm120 block-scaled builder takes the scale
// vector size from blockscaled_type<Tag, Element>::SfVectorSize, a uint32_t, and builds the scale
// factor smem layouts from `Int<SFVectorSize>` inside the (dependent) builder. GCC 12 does not
// convert that argument to Int's `int` parameter when it is used inside another template
// argument (looks like GCC PR c++/112632, fixed for GCC 14; not tried here), so on the host
// C<32u> (and C<1u> = C<128>/C<32u>/C<4>) end up in the GemmKernel type, while nvcc's front end
// (EDG) sees C<32> / C<1>. cudafe spells the kernel's Params type out in the host stub the EDG
// way, and GCC rejects the stub. sm100 is unaffected (its builder uses an int vector size);
// -static-global-template-stub=false does not help (same stub). Fix: for the sm120 schedules we
// build, the same traits with an `int` vector size, so both compilers agree on C<32> (C<16> for
// NVFP4). More specialized than CUTLASS's own; same values; the device code is unchanged.
namespace cutlass::gemm::collective::detail::blockscaled {
#define JAX_GMMA_SM120_INT_SFVEC(Tag, Wrapper, SF, Vec)                         \
  template <class T>                                                          \
  struct blockscaled_type<cutlass::gemm::Tag, cutlass::Wrapper<T>> {          \
    using sf_type = SF;                                                       \
    using data_type = T;                                                      \
    static constexpr int SfVectorSize = Vec;                                  \
  };
JAX_GMMA_SM120_INT_SFVEC(KernelTmaWarpSpecializedMxf8f6f4Sm120, mx_float8_t, cutlass::float_ue8m0_t, 32)
JAX_GMMA_SM120_INT_SFVEC(KernelTmaWarpSpecializedMxf8f6f4Sm120, mx_float6_t, cutlass::float_ue8m0_t, 32)
JAX_GMMA_SM120_INT_SFVEC(KernelTmaWarpSpecializedMxf8f6f4Sm120, mx_float4_t, cutlass::float_ue8m0_t, 32)
JAX_GMMA_SM120_INT_SFVEC(KernelTmaWarpSpecializedMxf4Sm120, mx_float4_t, cutlass::float_ue8m0_t, 32)
JAX_GMMA_SM120_INT_SFVEC(KernelTmaWarpSpecializedNvf4Sm120, nv_float4_t, cutlass::float_ue4m3_t, 16)
#undef JAX_GMMA_SM120_INT_SFVEC
}  // namespace cutlass::gemm::collective::detail::blockscaled

namespace jax_gmma::sm1xx_mx {

namespace sm120 {
using cutlass::arch::Sm120;
using Mxf8f6f4 = Config<Sm120, 120, Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                        cutlass::gemm::KernelTmaWarpSpecializedMxf8f6f4Sm120,
                        cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Mxf4 = Config<Sm120, 120, Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                    cutlass::gemm::KernelTmaWarpSpecializedMxf4Sm120,
                    cutlass::epilogue::TmaWarpSpecializedCooperative>;
using Nvf4 = Config<Sm120, 120, Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                    cutlass::gemm::KernelTmaWarpSpecializedNvf4Sm120,
                    cutlass::epilogue::TmaWarpSpecializedCooperative>;
}  // namespace sm120

enum class Sm120Pair { kMxf8, kMxf6E2M3, kMxf8Mxf4, kMxf4, kNvf4 };

// Fills `out` (capacity >= 4) with the kernels of one format pair and output; returns the count.
template <Sm120Pair kP, DType kD>
inline int sm120_mx_entries(KernelEntry* out) {
  int i = 0;
#define JAX_GMMA_MX(FA, FB, Cfg, name) out[i++] = MxGemm<FA, FB, kD, sm120::Cfg>::entry(name)
  if constexpr (kP == Sm120Pair::kMxf8) {
    JAX_GMMA_MX(MxF8E4M3, MxF8E4M3, Mxf8f6f4, "sm120_mxfp8xmxfp8_128x128x128_coop");
  } else if constexpr (kP == Sm120Pair::kMxf6E2M3) {
    JAX_GMMA_MX(MxF6E2M3, MxF6E2M3, Mxf8f6f4, "sm120_mxfp6_e2m3xmxfp6_e2m3_128x128x128_coop");
  } else if constexpr (kP == Sm120Pair::kMxf8Mxf4) {
    JAX_GMMA_MX(MxF8E4M3, MxF4F8f6f4, Mxf8f6f4, "sm120_mxfp8xmxfp4_128x128x128_coop");
  } else if constexpr (kP == Sm120Pair::kMxf4) {
    JAX_GMMA_MX(MxF4, MxF4, Mxf4, "sm120_mxfp4xmxfp4_128x128x128_coop");
  } else {
    JAX_GMMA_MX(NvF4, NvF4, Nvf4, "sm120_nvfp4xnvfp4_128x128x128_coop");
  }
#undef JAX_GMMA_MX
  return i;
}

}  // namespace jax_gmma::sm1xx_mx
