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
#define JAX_GMMA_DECLARE(pair, d)                                      \
  int sm90_fp8_tensorwise_##pair##_##d##_entries(KernelEntry* out); \
  int sm90_fp8_tensorwise_##pair##_##d##_decode_entries(KernelEntry* out);
JAX_GMMA_DECLARE(e4m3e4m3, bf16)
JAX_GMMA_DECLARE(e4m3e4m3, f16)
JAX_GMMA_DECLARE(e4m3e4m3, f32)
JAX_GMMA_DECLARE(e5m2e4m3, bf16)
JAX_GMMA_DECLARE(e5m2e4m3, f16)
JAX_GMMA_DECLARE(e5m2e4m3, f32)
#undef JAX_GMMA_DECLARE
#if defined(JAX_GMMA_WITH_SWEEP)
int sm90_fp8_tensorwise_sweep_entries(KernelEntry* out);  // JAX_GMMA_SWEEP_KERNELS=1 builds only
#else
static int sm90_fp8_tensorwise_sweep_entries(KernelEntry*) { return 0; }
#endif
int sm90_fp8_blockwise_1d2d_bf16_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d2d_f32_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d1d_bf16_entries(KernelEntry* out);
int sm90_fp8_blockwise_1d1d_f32_entries(KernelEntry* out);
int sm90_mx_mxf8_entries(KernelEntry* out);  // cpp/sm90_mxf8_gemm_blockscaled.cu
int sm90_mx_mxf8_stream_entries(KernelEntry* out);  // cpp/sm90_mxf8_gemm_blockscaled_stream.cu
#endif
// Blackwell block-scaled MX / NVFP4 families (cpp/sm100_mx_gemm_blockscaled_*.cu,
// cpp/sm120_mx_gemm_blockscaled_*.cu): one fill function per (format pair, output dtype).
#define JAX_GMMA_MX_SM100_TUS(X) \
  X(sm100, mxf8, bf16) X(sm100, mxf8, f32) X(sm100, mxf6e2m3, bf16) X(sm100, mxf6e2m3, f32) \
  X(sm100, mxf6e3m2, bf16) X(sm100, mxf6e3m2, f32) X(sm100, mxf8mxf4, bf16) X(sm100, mxf8mxf4, f32) \
  X(sm100, mxf4, bf16) X(sm100, mxf4, f32) X(sm100, nvf4, bf16) X(sm100, nvf4, f32)
#define JAX_GMMA_MX_SM120_TUS(X) \
  X(sm120, mxf8, bf16) X(sm120, mxf8, f32) X(sm120, mxf6e2m3, bf16) X(sm120, mxf6e2m3, f32) \
  X(sm120, mxf8mxf4, bf16) X(sm120, mxf8mxf4, f32) X(sm120, mxf4, bf16) X(sm120, mxf4, f32) \
  X(sm120, nvf4, bf16) X(sm120, nvf4, f32)
#define JAX_GMMA_MX_DECLARE(arch, pair, d) int arch##_mx_##pair##_##d##_entries(KernelEntry* out);
#define JAX_GMMA_MX_FILL(arch, pair, d) &arch##_mx_##pair##_##d##_entries,
#if defined(JAX_GMMA_HAVE_SM100)
JAX_GMMA_MX_SM100_TUS(JAX_GMMA_MX_DECLARE)
#endif
#if defined(JAX_GMMA_HAVE_SM120)
JAX_GMMA_MX_SM120_TUS(JAX_GMMA_MX_DECLARE)
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
                      &sm90_fp8_tensorwise_e4m3e4m3_bf16_decode_entries,
                      &sm90_fp8_tensorwise_e4m3e4m3_f16_decode_entries,
                      &sm90_fp8_tensorwise_e4m3e4m3_f32_decode_entries,
                      &sm90_fp8_tensorwise_e5m2e4m3_bf16_decode_entries,
                      &sm90_fp8_tensorwise_e5m2e4m3_f16_decode_entries,
                      &sm90_fp8_tensorwise_e5m2e4m3_f32_decode_entries,
                      &sm90_fp8_tensorwise_sweep_entries,
                      // Block-scaled family (1x128 / 128x128 float32 scales), e4m3 x e4m3.
                      &sm90_fp8_blockwise_1d2d_bf16_entries, &sm90_fp8_blockwise_1d2d_f32_entries,
                      &sm90_fp8_blockwise_1d1d_bf16_entries, &sm90_fp8_blockwise_1d1d_f32_entries,
                      // MXFP8 x MXFP8 (E8M0 per 32 of K), a mainloop of our own, and the
                      // weight-streaming decode kernel.
                      &sm90_mx_mxf8_entries, &sm90_mx_mxf8_stream_entries}) {
      int n = fill(buf);
      entries.insert(entries.end(), buf, buf + n);
    }
#endif
#if defined(JAX_GMMA_HAVE_SM100) || defined(JAX_GMMA_HAVE_SM120)
    {
      using Fill = int (*)(KernelEntry*);
      const Fill mx_fills[] = {
#if defined(JAX_GMMA_HAVE_SM100)
          JAX_GMMA_MX_SM100_TUS(JAX_GMMA_MX_FILL)
#endif
#if defined(JAX_GMMA_HAVE_SM120)
          JAX_GMMA_MX_SM120_TUS(JAX_GMMA_MX_FILL)
#endif
      };
      KernelEntry mx_buf[8];
      for (Fill fill : mx_fills) {
        int n = fill(mx_buf);
        entries.insert(entries.end(), mx_buf, mx_buf + n);
      }
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
    case DType::kF4E2M1: return "float4_e2m1fn";
    case DType::kF6E2M3: return "float6_e2m3fn";
    case DType::kF6E3M2: return "float6_e3m2fn";
  }
  return "?";
}

bool dtype_from_name(const char* name, DType* out) {
  for (DType t : {DType::kF8E4M3, DType::kF8E5M2, DType::kBF16, DType::kF16, DType::kF32,
                  DType::kF4E2M1, DType::kF6E2M3, DType::kF6E3M2}) {
    if (std::strcmp(name, dtype_name(t)) == 0) {
      *out = t;
      return true;
    }
  }
  return false;
}

int dtype_bits(DType t) {
  switch (t) {
    case DType::kF4E2M1: return 4;
    case DType::kF6E2M3:
    case DType::kF6E3M2: return 6;
    case DType::kF8E4M3:
    case DType::kF8E5M2: return 8;
    case DType::kBF16:
    case DType::kF16: return 16;
    case DType::kF32: return 32;
  }
  return 0;
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
  // The archs whose kernels were actually compiled into this library.
  static const std::string archs = [] {
    std::string s;
    auto add = [&s](const char* a) { s += (s.empty() ? "" : ","), s += a; };
#if defined(JAX_GMMA_HAVE_SM90)
    add("sm_90a");
#endif
#if defined(JAX_GMMA_HAVE_SM100)
    add("sm_100a");
#endif
#if defined(JAX_GMMA_HAVE_SM120)
    add("sm_120a");
#endif
    (void)add;
    return s;
  }();
  return archs.c_str();
}

}  // namespace jax_gmma
