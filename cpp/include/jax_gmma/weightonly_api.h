// jax-gmma: weight-only quantized GEMM on Hopper (sm_90a) -- FP4 weights (NVFP4, MXFP4) or FP6
// weights (MXFP6 e2m3 / e3m2) times bf16 activations, the decode (small M) kernel families of
// cpp/sm90_fp4_gemm_weightonly.cu and cpp/sm90_fp6_gemm_weightonly.cu, and the weight unpack
// kernels of the prefill path (same files).
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
//
// The prefill (large M) path instead unpacks the prepared weight once per call into a plain
// row-major (N, K) matrix and runs a tensor-core GEMM on it (weightonly_unpack_run: one
// memory-bound kernel launch, no workspace, graph safe; FFI target jax_gmma_weightonly_unpack):
//   bf16 output:  out[r, k] = w[r, k] = code value * block scale (exact; NVFP4's per-tensor
//                 global scale is NOT applied). Poisoned blocks give Inf / NaN as the decode.
//   e4m3 output:  out[r, k] = e4m3(w[r, k] * 2^(127 - row_exp[r])), round to nearest even,
//                 saturating to +-448; poisoned blocks (non-finite w) give NaN (0x7F).
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
  const void* x = nullptr;          // (M, K) bf16, or tiled (x_rows)
  const float* x_scale = nullptr;   // (M,) per-token scale, or nullptr (1)
  const void* w_packed = nullptr;   // prepared e2m1 / FP6 codes
  const void* w_scales = nullptr;   // prepared scale codes
  const float* w_global = nullptr;  // (1,) per-tensor scale, or nullptr (1)
  const void* bias = nullptr;       // (N,) in the output dtype, or nullptr
  void* d = nullptr;                // (M, N) row-major, bf16 or f32
  bool d_is_f32 = false;
  WoScale scale = WoScale::kNv16;
  // The CTA shape (0: pick by shape): weight rows x tokens, and the warps that split K (a CTA
  // is one or more row groups of k_warps warps). Only the shapes listed in
  // weightonly_common.cuh (kWoCtaShapes) are built; weightonly_check refuses the others.
  // Tokens 32, 64 or 128 name the tensor-core kernel's shapes (weightonly_wgmma.cuh,
  // kWoTcShapes: rows 64 / 128 / 256, k_warps 4 per warp group along K).
  int32_t rows_per_cta = 0;         // 16, 32 or 64 (tensor core: 64, 128, 256)
  int32_t tokens_per_cta = 0;       // 8 or 16 (tensor core: 32, 64, 128)
  int32_t k_warps = 0;              // warps splitting K: 16, 8, 4 or 2 (0: 8 if rows or
                                    // tokens are given, else picked)
  // The tensor-core shapes (dense, not grouped) take x tiled: (K / 64) x (x_rows / 8) blocks of
  // 8 tokens x 64 K in the kernel's shared-memory order (wo_tc_tiled_x in weightonly_wgmma.cuh;
  // jax_gmma.weightonly.tiled_x), rows M .. x_rows - 1 zero, x_rows a multiple of the tokens.
  // 0: x is row-major (M, K) (the other shapes).
  int64_t x_rows = 0;
};

// A CTA shape of the decode kernels.
struct WoCta {
  int32_t rows = 0, tokens = 0, k_warps = 0;
};

// The x_rows a CTA shape takes for M tokens: M padded to its tokens for the tensor-core shapes
// (32 tokens or more: x tiled, weightonly_tile_x_run), 0 for the decode shapes (x row-major).
inline int64_t weightonly_x_rows(int64_t m, const WoCta& c) {
  return c.tokens >= 32 ? (m + c.tokens - 1) / c.tokens * c.tokens : 0;
}

// nullptr when the kernel can run `a` (shapes, alignment, config), else the reason.
const char* weightonly_check(const WoArgs& a);
// Enqueues the kernel on `stream` (nothing else: no memset, no workspace, no sync).
cudaError_t weightonly_run(const WoArgs& a, cudaStream_t stream);
// One-time setup of the current device (the tensor-core kernels' shared-memory opt-in), outside
// any stream capture; weightonly_run does it on first use where this did not run.
cudaError_t weightonly_prepare();
// The CTA shape the kernel picks for (m, n, k) and the weight format when WoArgs leaves it
// open (mirrored by jax_gmma.weightonly.pick_cta).
WoCta weightonly_pick(int64_t m, int64_t n, int64_t k, WoScale scale);
// The mma.sync decode kernel's CTA shape (8 or 16 tokens per CTA) for any m.
WoCta weightonly_decode_pick(int64_t m, int64_t n, int64_t k, WoScale scale);
// The tensor-core kernel's CTA shape for 16 < m (rows 0 when none fits N; mirrored by
// jax_gmma.weightonly.pick_cta).
WoCta weightonly_tc_pick(int64_t m, int64_t n, int64_t k, WoScale scale);
// The CTA shape weightonly_run uses for `a` (its forced fields, the pick for the rest).
WoCta weightonly_resolve(const WoArgs& a);

// Grouped (mixture-of-experts) weight-only GEMM: x (M, K) bf16 tokens sorted by expert (x_scale
// (M,) or nullptr), the G experts' prepared codes and scale codes back to back (each expert
// laid out as one (N, K) weight), w_global (G,) NVFP4 global scales or nullptr, bias (G, N) or
// nullptr. Expert e takes x's rows [end_e - size_e, end_e), end = cumsum(sizes), numbered from
// row_ids[0] (the global index of x's row 0); rows past the total come out zero, and a negative
// size makes every output NaN (cpp/include/jax_gmma/groups.cuh). sizes and row_ids are read on
// the device only. The CTA shape is picked (WoArgs' shape fields must be 0) among 16 rows x 8
// or 16 tokens with 4 or 8 warps along K.
struct WoGroups {
  const int32_t* sizes = nullptr;    // (G,) int32 on the device
  const int32_t* row_ids = nullptr;  // row_ids[0] on the device
  int64_t count = 0;                 // G
};
// nullptr when the grouped kernel can run (a, g), else the reason.
const char* weightonly_grouped_check(const WoArgs& a, const WoGroups& g);
// Enqueues the grouped kernel on `stream` (nothing else).
cudaError_t weightonly_grouped_run(const WoArgs& a, const WoGroups& g, cudaStream_t stream);
// The CTA shape of the grouped kernel for M rows, G experts of (N, K) in a format.
WoCta weightonly_grouped_pick(int64_t m, int64_t n, int64_t k, int64_t groups, WoScale scale);

// The tensor-core kernel's tiled activations (WoArgs::x_rows) from a row-major x: one
// memory-bound launch (FFI target jax_gmma_weightonly_tile_x; the layout is wo_tc_tiled_x in
// weightonly_wgmma.cuh, jax_gmma.weightonly.tiled_x its JAX spelling).
struct WoTileArgs {
  int64_t m = 0, k = 0;             // x (M, K) bf16 row-major, K a multiple of 64
  int64_t rows = 0;                 // M padded (a multiple of 8, >= M): rows M .. rows - 1 zero
  const void* x = nullptr;
  void* out = nullptr;              // (K / 64, rows / 8, 512) bf16
};
// nullptr when the tiling kernel can run `a`, else the reason.
const char* weightonly_tile_x_check(const WoTileArgs& a);
// Enqueues the tiling kernel on `stream` (one launch, nothing else).
cudaError_t weightonly_tile_x_run(const WoTileArgs& a, cudaStream_t stream);

// The unpack kernel (prefill path): prepared weight -> row-major (N, K) bf16 or float8_e4m3fn.
struct WoUnpackArgs {
  int64_t n = 0, k = 0;             // N (multiple of 16), K = the *padded* K (multiple of 64)
  WoScale scale = WoScale::kNv16;   // the weight format
  const void* w_packed = nullptr;   // prepared codes (N/16, K/64, 512 or 768)
  const void* w_scales = nullptr;   // prepared scale codes (N/16, K/64, 64 or 32)
  const int32_t* row_exp = nullptr; // FP8 output only: (N,) int32 e_r per row
  void* out = nullptr;              // (N, K) row-major
  bool out_fp8 = false;
};

// nullptr when the unpack kernel can run `a` (shapes, alignment, format), else the reason.
const char* weightonly_unpack_check(const WoUnpackArgs& a);
// Enqueues the unpack kernel on `stream` (one launch: no memset, no workspace, no sync).
cudaError_t weightonly_unpack_run(const WoUnpackArgs& a, cudaStream_t stream);

}  // namespace jax_gmma
