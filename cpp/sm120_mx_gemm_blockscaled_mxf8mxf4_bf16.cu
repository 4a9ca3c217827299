// sm120 block-scaled GEMMs, format pair mxf8mxf4 -> bf16. See sm120_mx_gemm_blockscaled.cuh.
#include "sm120_mx_gemm_blockscaled.cuh"

namespace jax_gmma {
int sm120_mx_mxf8mxf4_bf16_entries(KernelEntry* out) {
  return sm1xx_mx::sm120_mx_entries<sm1xx_mx::Sm120Pair::kMxf8Mxf4, DType::kBF16>(out);
}
}  // namespace jax_gmma
