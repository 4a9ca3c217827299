// sm120 block-scaled GEMMs, format pair mxf6e2m3 -> bf16. See sm120_mx_gemm_blockscaled.cuh.
#include "sm120_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm120_mx_mxf6e2m3_bf16_entries(KernelEntry* out) {
  return sm1xx_mx::sm120_mx_entries<sm1xx_mx::Sm120Pair::kMxf6E2M3, DType::kBF16>(out);
}
}  // namespace jax_gmma
