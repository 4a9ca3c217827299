// jax-gmma: the Python-free C++ interface of the CUDA kernel library.
//
// A GEMM problem is described in *user* coordinates:
//   D[m, n] = a_scale[m or 0] * b_scale[n or 0] * sum_k A[m, k] * B[n, k]  (+ bias[n])
// A is (M, K) and B is (N, K), both K-major (row-major with K contiguous), D is (M, N)
// row-major. Kernels may internally compute the transposed product ("swap AB") for
// small M; that is a property of the kernel config, invisible at this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

namespace jax_gmma {

// Element types crossing the boundary. Values match nothing external on purpose:
// the FFI layer maps XLA dtypes to these.
enum class DType : int32_t {
  kF8E4M3 = 0, kF8E5M2 = 1, kBF16 = 2, kF16 = 3, kF32 = 4,
  // Blackwell block-scaled element types (packed: fp4 2 per byte, fp6 4 per 3 bytes).
  kF4E2M1 = 5, kF6E2M3 = 6, kF6E3M2 = 7,
};

const char* dtype_name(DType t);
// Inverse of dtype_name (numpy / ml_dtypes names); false for an unknown name.
bool dtype_from_name(const char* name, DType* out);
// Storage bits of one element (4, 6, 8, 16 or 32).
int dtype_bits(DType t);

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;        // (M, K) fp8, K contiguous
  const void* b = nullptr;        // (N, K) fp8, K contiguous
  const float* a_scale = nullptr; // (M,) if a_scale_per_row else (1,)
  const float* b_scale = nullptr; // (N,) if b_scale_per_col else (1,)
  bool a_scale_per_row = false;
  bool b_scale_per_col = false;
  const void* bias = nullptr;     // (N,) in the output dtype, or nullptr
  void* d = nullptr;              // (M, N) row-major
  void* workspace = nullptr;      // device scratch, >= workspace_size() bytes
  size_t workspace_bytes = 0;
  int32_t splits = 1;             // K splits for stream-K/split-K configs (1 = none)
  int32_t sm_count = 0;           // SMs the persistent/stream-K schedulers spread over
  int32_t device = 0;             // CUDA device ordinal (for the hardware info)
  // Block-scaled family ("blockwise_*" configs) only; nullptr/0 for the others. float32 scales,
  // one per 128 of K, stored MN-major: scale (row r, K block kb) at [kb * ld + r], ld a
  // multiple of 4 >= rows. A: rows = M (1x128 blocks). B: rows = ceil(N/128) (128x128 blocks,
  // "1d2d" configs) or N (1x128 blocks, "1d1d" configs).
  const float* a_block_scale = nullptr;
  const float* b_block_scale = nullptr;
  int64_t a_block_scale_ld = 0;
  int64_t b_block_scale_ld = 0;
  // Blackwell block-scaled (MX / NVFP4) family ("sm100_*" / "sm120_*" mx configs) only.
  // Scale factors (E8M0 or E4M3 bytes) in the swizzled 128x4-atom layout (mx_sf_bytes):
  // a_sf covers the M rows of A, b_sf the N rows of B. a/b_global_scale: NVFP4's float32
  // per-tensor scales on the device (alpha = a_global * b_global in the epilogue), or nullptr (1).
  const void* a_sf = nullptr;
  const void* b_sf = nullptr;
  const float* a_global_scale = nullptr;
  const float* b_global_scale = nullptr;
  // Tile order of the persistent / stream-K tile schedulers (sm90 tensorwise family): CUTLASS's
  // max_swizzle_size (1, 2, 4 or 8: consecutive CTAs take tiles in groups this wide, for L2
  // reuse) and raster order (0 = CUTLASS's heuristic, 1 = along M, 2 = along N). Runtime
  // arguments of the same kernels.
  int32_t swizzle = 1;
  int32_t raster = 0;
  // Grouped (mixture-of-experts) family ("grouped_*" configs) only. B is G experts' (N, K)
  // weights back to back, each with its own scales (laid out as one expert's, back to back) and
  // bias row (bias (G, N)); group_sizes (G,) int32 on the device: expert e takes A's rows
  // [end_e - size_e, end_e), end = cumsum(group_sizes), numbered from row_ids[0] (the global
  // index of A's row 0, on the device); rows past the total come out zero. The Blackwell
  // block-scaled grouped kernels ("sm100_grouped_*") take a_sf / b_sf as above (b_sf: the G
  // experts' swizzled tensors back to back) and, for NVFP4, b_global_scale (G,): one per expert.
  // The grouped bf16 kernels ("grouped_bf16_*") take b_global_scale (G,) too: expert e's
  // float32 sums are multiplied by it before the bias (nullptr: by 1).
  const int32_t* group_sizes = nullptr;
  const int32_t* row_ids = nullptr;
  int64_t groups = 0;
};

// Bytes of a swizzled 128x4-atom scale-factor tensor for `rows` rows and K blocks of `vec`
// (jax_gmma/layouts.py "sm100_128x4"): rows padded to 128, K blocks to 4.
inline int64_t mx_sf_bytes(int64_t rows, int64_t k, int64_t vec) {
  const int64_t kb = (k + vec - 1) / vec;
  return (rows + 127) / 128 * 128 * ((kb + 3) / 4 * 4);
}

// Byte offset of row r's 4-byte word for K blocks 4j .. 4j + 3 in that layout (k_atoms =
// ceil(K blocks / 4) atoms per 128 rows): atom (r / 128, j) of 512 bytes, then
// (r % 32) * 16 + (r / 32 % 4) * 4; block kb is byte kb % 4 of word kb / 4. Host and device.
#ifdef __CUDACC__
__host__ __device__
#endif
inline int64_t mx_sf_word_offset(int64_t r, int64_t j, int64_t k_atoms) {
  return ((r >> 7) * k_atoms + j) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4;
}

// The SM count a persistent grid (and CUTLASS's per-SM workspace) is sized for: GemmArgs' or,
// when 0, the device's (an attribute query: no stream operation). 0 when neither is known.
inline int grouped_sm_count(const GemmArgs& g) {
  if (g.sm_count > 0) return g.sm_count;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g.device) != cudaSuccess) {
    cudaGetLastError();  // not this call's error to report later
    return 0;
  }
  return sms;
}

// Leading dimension of a block-scale matrix with `rows` rows (see GemmArgs): 16-byte columns.
inline int64_t block_scale_ld(int64_t rows) { return (rows + 3) / 4 * 4; }

// The block-scale leading dimensions of a "blockwise_1d2d_*" / "blockwise_1d1d_*" kernel for an
// (M, N) problem (rows of A: M; rows of B: ceil(N / 128) for 1d2d, N for 1d1d); false when
// `config` names no block-scaled kernel.
bool blockwise_scale_lds(std::string_view config, int64_t m, int64_t n, int64_t* ld_a, int64_t* ld_b);

// One compiled kernel: a (config, A dtype, B dtype, D dtype) combination.
struct KernelEntry {
  const char* config;  // config name, e.g. "sm90_fp8_tensorwise_128x256x128_c2x1_coop_2lvl"
  DType a, b, d;
  // Host-only checks (no device needed): CUTLASS can_implement for the problem.
  // Returns nullptr when implementable, else a static message.
  const char* (*can_implement)(const GemmArgs&);
  size_t (*workspace_size)(const GemmArgs&);
  // One-time per-device setup (shared-memory attribute). Not a stream operation.
  cudaError_t (*prepare)();
  // Enqueue on `stream`: workspace init (memset) if needed, then the kernel.
  // Does nothing that CUDA stream capture forbids.
  cudaError_t (*run)(const GemmArgs&, cudaStream_t stream);
  int32_t smem_bytes;
  int32_t threads;
  int32_t arch = 90;  // the SM arch the kernel was compiled for: 90 (sm_90a), 100 (sm_100a), 120 (sm_120a)
};

// The table of kernels built into this library (empty when built without sm_90a).
const KernelEntry* kernel_table(int* count);

// Finds a kernel; nullptr if absent.
const KernelEntry* find_kernel(const char* config, DType a, DType b, DType d);

// Why find_kernel found nothing: "no kernel '<config>' for <a> x <b> -> <d> in this build", and
// for a kernel that is compiled only on request (JAX_GMMA_EXTRA_KERNELS), how to get it.
std::string missing_kernel_message(const char* config, DType a, DType b, DType d);

// Runs entry->prepare() once per (entry, device); cheap afterwards. Thread-safe.
cudaError_t ensure_prepared(const KernelEntry* entry, int device);

// Prepares every kernel on `device` (restoring the current device). Returns nullptr on
// success, else a message (valid until the next call on this thread). Call outside capture.
const char* prepare_device(int device);

// Comma-separated list of CUDA archs compiled in (e.g. "sm_90a" or "sm_90a,sm_100a,sm_120a").
const char* built_archs();

}  // namespace jax_gmma
