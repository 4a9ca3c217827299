// jax-gmma: weight-only quantized GEMM on Hopper (sm_90a) -- FP4 weights (NVFP4, MXFP4) or FP6
// weights (MXFP6 e2m3 / e3m2) times bf16 activations, the decode (small M) kernel families of
// cpp/sm90_fp4_gemm_weightonly.cu and cpp/sm90_fp6_gemm_weightonly.cu.
//
//   D[m, n] = alpha[m] * sum_k X[m, k] * dequant(W)[n, k]  (+ bias[n])
//   alpha[m] = w_global (NVFP4 per-tensor scale, else 1) * x_scale[m] (per-token scale, else 1)
//
// X is (M, K) bf16 row-major. W is stored in the *prepared* layout written once by
// jax_gmma.weightonly.prepare (see that module's docstring for the exact bit layout):
//   w_packed  uint8 (N/16, K/64, 512): one 16-row x 64-K tile of e2m1 codes per 512 bytes, laid
//             out so that lane l of a warp loads the 16 bytes it feeds to four mma.m16n8k16;
//             MXFP6: (N/16, K/64, 768), six 32-bit words per lane, 16 six-bit codes per three;
//   w_scales  uint8 (N/16, K/64, 64) for NVFP4 (16-K blocks) or (N/16, K/64, 32) for MXFP4 and
//             MXFP6 (32-K blocks): each block scale re-encoded as a bf16 exponent/mantissa code,
//             so the kernel rebuilds the bf16 multiplier with one integer multiply-add.
// Requirements (checked by weightonly_check): N % 16 == 0, K % 64 == 0, M >= 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace jax_gmma {

// The weight format (element type and scale kind); FFI attribute "scale_kind".
enum class WoScale : int32_t {
  kNv16 = 0,     // NVFP4: e2m1, e4m3 scale per 16 of K (+ float32 per-tensor scale)
  kMx32 = 1,     // MXFP4: e2m1, E8M0 scale per 32 of K
  kMx6E2M3 = 2,  // MXFP6 e2m3, E8M0 scale per 32 of K
  kMx6E3M2 = 3,  // MXFP6 e3m2, E8M0 scale per 32 of K
};

// Prepared bytes per 16-row x 64-K tile of codes, and of scale codes.
constexpr int64_t weightonly_tile_bytes(WoScale s) {
  return s == WoScale::kMx6E2M3 || s == WoScale::kMx6E3M2 ? 768 : 512;
}
constexpr int64_t weightonly_scale_bytes(WoScale s) { return s == WoScale::kNv16 ? 64 : 32; }

struct WoArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* x = nullptr;          // (M, K) bf16
  const float* x_scale = nullptr;   // (M,) per-token scale, or nullptr (1)
  const void* w_packed = nullptr;   // prepared e2m1 / FP6 codes
  const void* w_scales = nullptr;   // prepared scale codes
  const float* w_global = nullptr;  // (1,) per-tensor scale, or nullptr (1)
  const void* bias = nullptr;       // (N,) in the output dtype, or nullptr
  void* d = nullptr;                // (M, N) row-major, bf16 or f32
  bool d_is_f32 = false;
  WoScale scale = WoScale::kNv16;
  int32_t rows_per_cta = 0;         // 16, 32 or 64 (0: pick by shape)
  int32_t tokens_per_cta = 0;       // 8 or 16 (0: pick by M)
};

// nullptr when the kernel can run `a` (shapes, alignment, config), else the reason.
const char* weightonly_check(const WoArgs& a);
// Enqueues the kernel on `stream` (nothing else: no memset, no workspace, no sync).
cudaError_t weightonly_run(const WoArgs& a, cudaStream_t stream);
// The config the kernel would use for (m, n): rows_per_cta * 100 + tokens_per_cta.
int32_t weightonly_pick(int64_t m, int64_t n, int64_t k);

}  // namespace jax_gmma
