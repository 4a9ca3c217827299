// sm100 block-scaled GEMMs, format pair mxf6e2m3 -> bf16. See sm100_mx_gemm_blockscaled.cuh.
#include "sm100_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm100_mx_mxf6e2m3_bf16_entries(KernelEntry* out) {
  return sm1xx_mx::sm100_mx_entries<sm1xx_mx::Sm100Pair::kMxf6E2M3, DType::kBF16>(out);
}
}  // namespace jax_gmma
