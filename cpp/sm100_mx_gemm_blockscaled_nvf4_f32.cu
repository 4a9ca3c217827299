// sm100 block-scaled GEMMs, format pair nvf4 -> f32. See sm100_mx_gemm_blockscaled.cuh.
#include "sm100_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm100_mx_nvf4_f32_entries(KernelEntry* out) {
  return sm1xx_mx::sm100_mx_entries<sm1xx_mx::Sm100Pair::kNvf4, DType::kF32>(out);
}
}  // namespace jax_gmma
