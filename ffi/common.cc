// What the XLA FFI handlers share (see ffi/common.h), and the library-wide execution counters.
#include "common.h"

#include <atomic>

namespace jax_gmma::ffi_common {
namespace {

// How many executions happened while the stream was being captured into a CUDA graph (XLA
// command buffer) and how many ran eagerly: lets tests check capture, not assume it.
// cudaStreamIsCapturing is the one stream query that capture allows.
std::atomic<uint64_t> g_captured{0}, g_eager{0};
// GEMM handler calls and the host nanoseconds spent in them (HostTimer).
std::atomic<uint64_t> g_host_calls{0}, g_host_ns{0};

}  // namespace

ffi::Error fail(std::string_view target, std::string_view msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string(target) + ": " + std::string(msg));
}

ffi::Error cuda_fail(std::string_view what, cudaError_t err) {
  return ffi::Error::Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

bool to_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F8E4M3FN: *out = DType::kF8E4M3; return true;
    case ffi::DataType::F8E5M2: *out = DType::kF8E5M2; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    case ffi::DataType::F32: *out = DType::kF32; return true;
    default: return false;
  }
}

bool is_f32_scalar(const ffi::AnyBuffer& x) {
  return x.element_type() == ffi::DataType::F32 && x.element_count() == 1;
}

std::string check_fp8_operands(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                               const ffi::AnyBuffer& d, int64_t* m, int64_t* n, int64_t* k,
                               DType* ta, DType* tb, DType* td) {
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto dd = d.dimensions();
  if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2) return "operands must be 2-D";
  *m = ad[0];
  *k = ad[1];
  *n = bd[0];
  if (bd[1] != *k || dd[0] != *m || dd[1] != *n) return "shape mismatch";
  if (!to_dtype(a.element_type(), ta) || !to_dtype(b.element_type(), tb) ||
      !to_dtype(d.element_type(), td))
    return "unsupported dtype";
  return {};
}

std::string check_bias(const ffi::AnyBuffer& bias, const ffi::AnyBuffer& d, bool has_bias, int64_t n) {
  if (has_bias && (bias.element_type() != d.element_type() ||
                   static_cast<int64_t>(bias.element_count()) != n))
    return "bias must be (N,) in the output dtype";
  return {};
}

std::string check_groups(const ffi::AnyBuffer& group_sizes, const ffi::AnyBuffer& row_ids,
                         const ffi::AnyBuffer& bias, const ffi::AnyBuffer& d, bool has_bias,
                         int64_t groups, int64_t m, int64_t n) {
  if (group_sizes.element_type() != ffi::DataType::S32 ||
      static_cast<int64_t>(group_sizes.element_count()) != groups)
    return "group_sizes must be (G,) int32";
  if (row_ids.element_type() != ffi::DataType::S32 || static_cast<int64_t>(row_ids.element_count()) != m)
    return "row_ids must be (M,) int32";
  if (has_bias && (bias.element_type() != d.element_type() ||
                   static_cast<int64_t>(bias.element_count()) != groups * n))
    return "bias must be (G, N) in the output dtype";
  return {};
}

std::string check_mx_operand(const ffi::AnyBuffer& x, DType t, int64_t rows, int64_t k, const char* name) {
  const bool packed = dtype_bits(t) < 8;
  const ffi::DataType want = packed ? ffi::DataType::U8
                             : t == DType::kF8E4M3 ? ffi::DataType::F8E4M3FN
                                                    : ffi::DataType::F8E5M2;
  if (x.element_type() != want)
    return std::string(name) + ": expected " + (packed ? "uint8 (packed)" : dtype_name(t)) + " elements";
  if (k <= 0 || (k * dtype_bits(t)) % 8 || static_cast<int64_t>(x.size_bytes()) * 8 != rows * k * dtype_bits(t))
    return std::string(name) + ": size does not match (rows, K) " + dtype_name(t) + " elements";
  return {};
}

std::string mx_dtypes(std::string_view a_dtype, std::string_view b_dtype, const ffi::AnyBuffer& d,
                      DType* ta, DType* tb, DType* td) {
  if (!dtype_from_name(std::string(a_dtype).c_str(), ta) || !dtype_from_name(std::string(b_dtype).c_str(), tb))
    return "unknown operand dtype attribute";
  if (!to_dtype(d.element_type(), td) || (*td != DType::kBF16 && *td != DType::kF32))
    return "output must be bfloat16 or float32";
  return {};
}

std::string check_mx_scale_factors(const ffi::AnyBuffer& a_sf, const ffi::AnyBuffer& b_sf, int32_t sf_vec,
                                   int64_t a_rows, int64_t b_rows, int64_t groups, int64_t k) {
  if (sf_vec != 16 && sf_vec != 32) return "sf_vec must be 16 or 32";
  if (a_sf.element_type() != ffi::DataType::U8 || b_sf.element_type() != ffi::DataType::U8)
    return "scale factors must be passed as uint8 bytes";
  if (static_cast<int64_t>(a_sf.size_bytes()) != mx_sf_bytes(a_rows, k, sf_vec) ||
      static_cast<int64_t>(b_sf.size_bytes()) != groups * mx_sf_bytes(b_rows, k, sf_vec))
    return std::string("scale-factor sizes (expected the swizzled 128x4-atom layout: rows padded to 128, "
                       "K blocks to 4") + (groups > 1 ? "; the experts' back to back)" : ")");
  return {};
}

void set_mx_args(GemmArgs& g, const ffi::AnyBuffer& a_sf, const ffi::AnyBuffer& b_sf,
                 const ffi::AnyBuffer& a_global, const ffi::AnyBuffer& b_global, bool has_global) {
  g.a_sf = a_sf.untyped_data();
  g.b_sf = b_sf.untyped_data();
  g.a_global_scale = has_global ? static_cast<const float*>(a_global.untyped_data()) : nullptr;
  g.b_global_scale = has_global ? static_cast<const float*>(b_global.untyped_data()) : nullptr;
}

void set_common_args(GemmArgs& g, int64_t m, int64_t n, int64_t k, const ffi::AnyBuffer& a,
                     const ffi::AnyBuffer& b, const ffi::AnyBuffer& bias, bool has_bias,
                     ffi::Result<ffi::AnyBuffer>& d, ffi::Result<ffi::AnyBuffer>& workspace,
                     int32_t splits, int32_t sm_count) {
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a.untyped_data();
  g.b = b.untyped_data();
  g.bias = has_bias ? bias.untyped_data() : nullptr;
  g.d = d->untyped_data();
  g.workspace = workspace->untyped_data();
  g.workspace_bytes = workspace->size_bytes();
  g.splits = splits;
  g.sm_count = sm_count;
}

const KernelEntry* lookup(EntryCache& cache, std::string_view config, DType ta, DType tb, DType td,
                          std::string* why) {
  const KernelEntry* c = cache.entry;
  if (c && c->a == ta && c->b == tb && c->d == td && cache.name == config) return c;
  std::string name(config);
  const KernelEntry* entry = find_kernel(name.c_str(), ta, tb, td);
  if (!entry) {
    *why = missing_kernel_message(name.c_str(), ta, tb, td);
    return nullptr;
  }
  cache.entry = entry;
  cache.name = std::move(name);
  return entry;
}

ffi::Error launch(const KernelEntry* entry, GemmArgs& g, cudaStream_t stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return ffi::Error::Internal("cudaGetDevice failed");
  if (cudaError_t err = ensure_prepared(entry, device); err != cudaSuccess)
    return cuda_fail("jax_gmma: kernel setup failed", err);
  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  g.device = device;
  if (cudaError_t err = entry->run(g, stream); err != cudaSuccess)
    return cuda_fail(std::string("jax_gmma: kernel launch failed (") + entry->config + ")", err);
  return ffi::Error::Success();
}

HostTimer::~HostTimer() {
  auto dt = std::chrono::steady_clock::now() - t0;
  g_host_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count()),
                      std::memory_order_relaxed);
  g_host_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace jax_gmma::ffi_common

using jax_gmma::ffi_common::g_captured;
using jax_gmma::ffi_common::g_eager;
using jax_gmma::ffi_common::g_host_calls;
using jax_gmma::ffi_common::g_host_ns;

// Counts one handler execution (graph_safety.h: jax_gmma_note_execution).
extern "C" void jax_gmma_count_execution(bool captured) {
  (captured ? g_captured : g_eager).fetch_add(1, std::memory_order_relaxed);
}

// Counters of executions under stream capture / eager (_gmma_ext.capture_stats()).
extern "C" __attribute__((visibility("default"))) void jax_gmma_capture_stats(uint64_t* captured,
                                                                            uint64_t* eager) {
  *captured = g_captured.load();
  *eager = g_eager.load();
}

// GEMM handler calls and the host nanoseconds spent in them (_gmma_ext.host_stats()).
extern "C" __attribute__((visibility("default"))) void jax_gmma_host_stats(uint64_t* calls,
                                                                         uint64_t* ns) {
  *calls = g_host_calls.load();
  *ns = g_host_ns.load();
}
