// sm90 FP8 tensorwise GEMMs with bf16 output. See sm90_fp8_gemm_tensorwise.cuh.
#include "sm90_fp8_gemm_tensorwise_inst.cuh"

namespace jax_gmma {
int sm90_fp8_tensorwise_bf16_entries(KernelEntry* out) {
  return sm90::tensorwise_entries<DType::kBF16>(out);
}
}  // namespace jax_gmma
