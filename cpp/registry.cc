// The kernel table of the CUDA library and per-device one-time preparation.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jax_gmma/gemm_api.h"

namespace jax_gmma {

#if defined(JAX_GMMA_HAVE_SM90)
#define JAX_GMMA_DECLARE(pair, d) int sm90_fp8_tensorwise_##pair##_##d##_entries(KernelEntry* out);
JAX_GMMA_DECLARE(e4m3e4m3, bf16)
JAX_GMMA_DECLARE(e4m3e4m3, f16)
JAX_GMMA_DECLARE(e4m3e4m3, f32)
JAX_GMMA_DECLARE(e5m2e4m3, bf16)
JAX_GMMA_DECLARE(e5m2e4m3, f16)
JAX_GMMA_DECLARE(e5m2e4m3, f32)
#undef JAX_GMMA_DECLARE
int sm90_fp8_tensorwise_sweep_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d2d_bf16_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d2d_f32_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d1d_bf16_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d1d_f32_entries(KernelEntry* out);
#endif

namespace {

constexpr int kMaxDevices = 64;

struct Table {
  std::vector<KernelEntry> entries;
  // prepared[i] has bit d set once entries[i].prepare() ran on device d.
  std::unique_ptr<std::atomic<uint64_t>[]> prepared;
  std::mutex mu;

  Table() {
#if defined(JAX_GMMA_HAVE_SM90)
    KernelEntry buf[64];
    for (auto fill : {&sm90_fp8_tensorwise_e4m3e4m3_bf16_entries, &sm90_fp8_tensorwise_e4m3e4m3_f16_entries,
                      &sm90_fp8_tensorwise_e4m3e4m3_f32_entries, &sm90_fp8_tensorwise_e5m2e4m3_bf16_entries,
                      &sm90_fp8_tensorwise_e5m2e4m3_f16_entries, &sm90_fp8_tensorwise_e5m2e4m3_f32_entries,
                      &sm90_fp8_tensorwise_sweep_entries,
                      // Block-scaled family (1x128 / 128x128 float32 scales), e4m3 x e4m3.
                      &sm90_fp8_blockwise_1d2d_bf16_entries, &sm90_fp8_blockwise_1d2d_f32_entries,
                      &sm90_fp8_blockwise_1d1d_bf16_entries, &sm90_fp8_blockwise_1d1d_f32_entries}) {
      int n = fill(buf);
      entries.insert(entries.end(), buf, buf + n);
    }
#endif
    prepared.reset(new std::atomic<uint64_t>[entries.size() + 1]);
    for (size_t i = 0; i <= entries.size(); ++i) prepared[i].store(0);
  }
};

Table& table() {
  static Table t;
  return t;
}

}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF8E4M3: return "float8_e4m3fn";
    case DType::kF8E5M2: return "float8_e5m2";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
  }
  return "?";
}

const KernelEntry* kernel_table(int* count) {
  Table& t = table();
  *count = static_cast<int>(t.entries.size());
  return t.entries.data();
}

const KernelEntry* find_kernel(const char* config, DType a, DType b, DType d) {
  for (const KernelEntry& e : table().entries) {
    if (e.a == a && e.b == b && e.d == d && std::strcmp(e.config, config) == 0) return &e;
  }
  return nullptr;
}

cudaError_t ensure_prepared(const KernelEntry* entry, int device) {
  Table& t = table();
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  const size_t idx = static_cast<size_t>(entry - t.entries.data());
  const uint64_t bit = uint64_t{1} << device;
  if (t.prepared[idx].load(std::memory_order_acquire) & bit) return cudaSuccess;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.prepared[idx].load(std::memory_order_relaxed) & bit) return cudaSuccess;
  // cudaFuncSetAttribute is not a stream operation; it applies to the current device.
  cudaError_t err = entry->prepare();
  if (err == cudaSuccess) t.prepared[idx].fetch_or(bit, std::memory_order_release);
  return err;
}

const char* prepare_device(int device) {
  thread_local std::string msg;
  int prev = 0;
  if (cudaError_t e = cudaGetDevice(&prev); e != cudaSuccess) return (msg = cudaGetErrorString(e)).c_str();
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return (msg = cudaGetErrorString(e)).c_str();
  const char* result = nullptr;
  Table& t = table();
  for (const KernelEntry& e : t.entries) {
    if (cudaError_t err = ensure_prepared(&e, device); err != cudaSuccess) {
      msg = std::string(e.config) + ": " + cudaGetErrorString(err);
      result = msg.c_str();
      break;
    }
  }
  cudaSetDevice(prev);
  return result;
}

const char* built_archs() {
#if defined(JAX_GMMA_HAVE_SM90)
  return "sm_90a";
#else
  return "";
#endif
}

}  // namespace jax_gmma
