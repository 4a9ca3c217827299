// sm90 FP8 block-scaled GEMMs, e4m3 x e4m3 -> f32, 1d2d scales. See sm90_fp8_gemm_blockwise.cuh.
#include "sm90_fp8_gemm_blockwise_inst.cuh"

namespace jax_gmma {
int sm90_fp8_blockwise_1d2d_f32_entries(KernelEntry* out) {
  return sm90_blockwise::blockwise_entries<DType::kF8E4M3, DType::kF8E4M3, DType::kF32,
                                           sm90_blockwise::Variant::k1d2d>(out);
}
}  // namespace jax_gmma
