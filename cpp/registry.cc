// The kernel table of the CUDA library and per-device one-time preparation.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jax_gmma/gemm_api.h"
#include "jax_gmma/weightonly_api.h"
#include "jax_gmma_kernel_tus.h"  // generated: JAX_GMMA_KERNEL_TUS(X)

namespace jax_gmma {

// One fill function per kernel translation unit of this build (CMakeLists.txt generates the
// list): it writes the unit's KernelEntry rows and returns their count.
#define JAX_GMMA_DECLARE(fill) int fill(KernelEntry* out);
JAX_GMMA_KERNEL_TUS(JAX_GMMA_DECLARE)
#undef JAX_GMMA_DECLARE

namespace {

constexpr int kMaxDevices = 64;
constexpr int kMaxEntriesPerUnit = 64;  // rows one fill function may write

struct Table {
  std::vector<KernelEntry> entries;
  // prepared[i] has bit d set once entries[i].prepare() ran on device d.
  std::unique_ptr<std::atomic<uint64_t>[]> prepared;
  std::mutex mu;

  Table() {
    using Fill = int (*)(KernelEntry*);
#define JAX_GMMA_FILL(fill) &fill,
    const Fill fills[] = {JAX_GMMA_KERNEL_TUS(JAX_GMMA_FILL) nullptr};
#undef JAX_GMMA_FILL
    KernelEntry buf[kMaxEntriesPerUnit];
    for (Fill fill : fills) {
      if (!fill) break;
      int n = fill(buf);
      entries.insert(entries.end(), buf, buf + n);
    }
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

std::string missing_kernel_message(const char* config, DType a, DType b, DType d) {
  std::string msg = std::string("no kernel '") + config + "' for " + dtype_name(a) + " x " +
                    dtype_name(b) + " -> " + dtype_name(d) + " in this build";
#if defined(JAX_GMMA_PARTIAL_FP8)
  msg += " (the FP8 tensorwise kernels of this build cover only some dtypes: reinstall with "
         "JAX_GMMA_FP8_PAIRS / JAX_GMMA_FP8_OUTPUTS naming the ones you need)";
#endif
#if !defined(JAX_GMMA_WITH_EXTRA)
  // Kernels no heuristic picks (reachable only by forcing config=): compiled only with
  // JAX_GMMA_EXTRA_KERNELS=1 (cpp/sm90_fp8_gemm_tensorwise_inst.cuh,
  // cpp/sm90_fp8_gemm_blockwise_inst.cuh).
  for (const char* extra : {"swap_64x16x128_pingpong_2lvl", "blockwise_1d2d_64x128x128_c1x1_pingpong",
                            "blockwise_1d1d_64x128x128_c1x1_pingpong"}) {
    if (std::strcmp(config, extra) == 0) {
      msg += " (a kernel that is built only on request: reinstall with JAX_GMMA_EXTRA_KERNELS=1)";
      break;
    }
  }
#endif
  return msg;
}

bool blockwise_scale_lds(std::string_view config, int64_t m, int64_t n, int64_t* ld_a, int64_t* ld_b) {
  constexpr std::string_view k1d2d = "blockwise_1d2d_", k1d1d = "blockwise_1d1d_";
  const bool is_1d2d = config.substr(0, k1d2d.size()) == k1d2d;
  if (!is_1d2d && config.substr(0, k1d1d.size()) != k1d1d) return false;
  *ld_a = block_scale_ld(m);
  *ld_b = block_scale_ld(is_1d2d ? (n + 127) / 128 : n);
  return true;
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
#if defined(JAX_GMMA_HAVE_SM90)
  // The weight-only tensor-core kernels (not table entries): their shared-memory opt-in.
  if (!result)
    if (cudaError_t err = weightonly_prepare(); err != cudaSuccess) {
      msg = std::string("weight-only tensor-core kernels: ") + cudaGetErrorString(err);
      result = msg.c_str();
    }
#endif
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
