// sm120 block-scaled GEMMs, format pair nvf4 -> bf16. See sm120_mx_gemm_blockscaled.cuh.
#include "sm120_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm120_mx_nvf4_bf16_entries(KernelEntry* out) {
  return sm1xx_mx::sm120_mx_entries<sm1xx_mx::Sm120Pair::kNvf4, DType::kBF16>(out);
}
}  // namespace jax_gmma
