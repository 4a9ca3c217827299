// sm90 FP8 tensorwise GEMMs, e4m3e4m3 -> bf16, large-M configs (decode ones: ..._decode.cu). See sm90_fp8_gemm_tensorwise.cuh.
#include "sm90_fp8_gemm_tensorwise_inst.cuh"

namespace jax_gmma {
int sm90_fp8_tensorwise_e4m3e4m3_bf16_entries(KernelEntry* out) {
  return sm90::tensorwise_large_entries<DType::kF8E4M3, DType::kF8E4M3, DType::kBF16>(out);
}
}  // namespace jax_gmma
