// sm100 block-scaled GEMMs, format pair mxf6e3m2 -> bf16. See sm100_mx_gemm_blockscaled.cuh.
#include "sm100_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm100_mx_mxf6e3m2_bf16_entries(KernelEntry* out) {
  return sm1xx_mx::sm100_mx_entries<sm1xx_mx::Sm100Pair::kMxf6E3M2, DType::kBF16>(out);
}
}  // namespace jax_gmma
