// sm120 block-scaled GEMMs, format pair mxf8 -> f32. See sm120_mx_gemm_blockscaled.cuh.
#include "sm120_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm120_mx_mxf8_f32_entries(KernelEntry* out) {
  return sm1xx_mx::sm120_mx_entries<sm1xx_mx::Sm120Pair::kMxf8, DType::kF32>(out);
}
}  // namespace jax_gmma
