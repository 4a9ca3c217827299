// XLA FFI handlers of jax-gmma (typed FFI, CUDA platform).
//
// Graph safety (the rules are in ffi/graph_safety.h, shared by every handler): the execute path
//  * takes the stream from the platform context and asks CUDA nothing about it
//    (cudaStreamGetDevice on a capturing stream invalidates the capture);
//  * gets the device with cudaGetDevice(), which capture allows;
//  * does its one-time setup (the kernel's dynamic shared-memory attribute) once per
//    device, normally before any capture (jax_gmma prepares every kernel when it registers
//    the targets), and otherwise with cudaFuncSetAttribute, which is not a stream operation;
//  * enqueues only a memset (stream-K workspace flags) and the kernel launch;
//  * never synchronizes and never copies device memory to the host: scales are read by the
//    kernel's epilogue.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "jax_gmma/gemm_api.h"
#include "xla/ffi/api/ffi.h"
#include "graph_safety.h"

namespace ffi = xla::ffi;

namespace jax_gmma {
namespace {

// How many executions happened while the stream was being captured into a CUDA graph (XLA
// command buffer) and how many ran eagerly: lets tests check capture, not assume it.
// cudaStreamIsCapturing is the one stream query that capture allows.
std::atomic<uint64_t> g_captured{0}, g_eager{0};
// Host time spent inside the handler (checks, kernel lookup, parameter cache, launch), so the
// benchmark can report our share of the per-call host cost apart from XLA's own.
std::atomic<uint64_t> g_host_calls{0}, g_host_ns{0};

struct HostTimer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~HostTimer() {
    auto dt = std::chrono::steady_clock::now() - t0;
    g_host_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count()),
                        std::memory_order_relaxed);
    g_host_calls.fetch_add(1, std::memory_order_relaxed);
  }
};

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

// An invalid-argument error, prefixed with the FFI target's name.
ffi::Error fail(std::string_view target, const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string(target) + ": " + msg);
}

// The structural checks the FP8 handlers share (the Python shape rules enforce them at trace
// time already): a (M, K), b (N, K), d (M, N), all 2-D, with supported dtypes. "" when fine.
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

// bias: (N,) in the output dtype when has_bias (else an ignored placeholder). "" when fine.
std::string check_bias(const ffi::AnyBuffer& bias, const ffi::AnyBuffer& d, bool has_bias, int64_t n) {
  if (has_bias && (bias.element_type() != d.element_type() ||
                   static_cast<int64_t>(bias.element_count()) != n))
    return "bias must be (N,) in the output dtype";
  return {};
}

// The GemmArgs fields every handler fills the same way (operand, bias, output and workspace
// pointers, problem size, split count, SM count); scale fields are the caller's.
GemmArgs common_args(int64_t m, int64_t n, int64_t k, const ffi::AnyBuffer& a,
                     const ffi::AnyBuffer& b, const ffi::AnyBuffer& bias, bool has_bias,
                     ffi::Result<ffi::AnyBuffer>& d, ffi::Result<ffi::AnyBuffer>& workspace,
                     int32_t splits, int32_t sm_count) {
  GemmArgs g;
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
  return g;
}

// The kernel a handler's call site asked for. Each handler keeps a thread-local one-entry cache
// (the same call site hits it every step); nullptr, with `why`, when this build lacks it.
struct EntryCache {
  const KernelEntry* entry = nullptr;
  std::string name;
};

const KernelEntry* lookup(EntryCache& cache, std::string_view config, DType ta, DType tb, DType td,
                          std::string* why) {
  const KernelEntry* c = cache.entry;
  if (c && c->a == ta && c->b == tb && c->d == td && cache.name == config) return c;
  std::string name(config);
  const KernelEntry* entry = find_kernel(name.c_str(), ta, tb, td);
  if (!entry) {
    *why = "no kernel '" + name + "' for " + dtype_name(ta) + " x " + dtype_name(tb) + " -> " +
           dtype_name(td) + " in this build";
    return nullptr;
  }
  cache.entry = entry;
  cache.name = std::move(name);
  return entry;
}

// The execute path every GEMM handler shares (graph-safety rules: ffi/graph_safety.h): device
// from cudaGetDevice, one-time kernel setup if it has not happened yet, capture accounting, and
// the launch (plus any stream-K workspace memset the kernel needs).
ffi::Error launch(const KernelEntry* entry, GemmArgs& g, cudaStream_t stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return ffi::Error::Internal("cudaGetDevice failed");
  if (cudaError_t err = ensure_prepared(entry, device); err != cudaSuccess)
    return ffi::Error::Internal(std::string("jax_gmma: kernel setup failed: ") + cudaGetErrorString(err));
  if (!jax_gmma_note_execution(stream)) return ffi::Error::Internal("cudaStreamIsCapturing failed");
  g.device = device;
  if (cudaError_t err = entry->run(g, stream); err != cudaSuccess)
    return ffi::Error::Internal(std::string("jax_gmma: kernel launch failed (") + entry->config +
                                "): " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// Operands: a (M,K) fp8, b (N,K) fp8, a_scale f32 (1,) or (M,), b_scale f32 (1,) or (N,),
// bias (N,) in the output dtype (ignored unless has_bias). Results: d (M,N), workspace u8.
ffi::Error Fp8GemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                       ffi::AnyBuffer a_scale, ffi::AnyBuffer b_scale, ffi::AnyBuffer bias,
                       ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                       std::string_view config, int32_t splits, int32_t sm_count, bool has_bias,
                       int32_t swizzle, int32_t raster) {
  HostTimer timer;
  constexpr std::string_view kTarget = "jax_gmma_fp8_gemm";
  int64_t m, n, k;
  DType ta, tb, td;
  if (auto e = check_fp8_operands(a, b, *d, &m, &n, &k, &ta, &tb, &td); !e.empty()) return fail(kTarget, e);
  if (a_scale.element_type() != ffi::DataType::F32 || b_scale.element_type() != ffi::DataType::F32)
    return fail(kTarget, "scales must be float32");
  const int64_t as = static_cast<int64_t>(a_scale.element_count());
  const int64_t bs = static_cast<int64_t>(b_scale.element_count());
  if ((as != 1 && as != m) || (bs != 1 && bs != n)) return fail(kTarget, "scale sizes");
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return fail(kTarget, e);

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return fail(kTarget, why);

  GemmArgs g = common_args(m, n, k, a, b, bias, has_bias, d, workspace, splits, sm_count);
  g.a_scale = static_cast<const float*>(a_scale.untyped_data());
  g.b_scale = static_cast<const float*>(b_scale.untyped_data());
  g.a_scale_per_row = as == m && m != 1;
  g.b_scale_per_col = bs == n && n != 1;
  g.swizzle = swizzle;  // checked by the kernel's can_implement at trace time
  g.raster = raster;
  return launch(entry, g, stream);
}

// Block-scaled FP8 GEMM (DeepSeek-style 1x128 x 128x128 or 1x128 x 1x128 float32 scales).
// Operands: a (M,K) fp8, b (N,K) fp8, a_scales f32 (kb, ld_a), b_scales f32 (kb, ld_b) -- the
// MN-major layout of gemm_api.h, kb = ceil(K/128), ld = round_up(rows, 4), rows_a = M,
// rows_b = ceil(N/128) ("blockwise_1d2d_*" configs) or N ("blockwise_1d1d_*") -- and bias (N,)
// in the output dtype (ignored unless has_bias). Results: d (M,N), workspace u8.
ffi::Error Fp8BlockwiseGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                ffi::AnyBuffer a_scales, ffi::AnyBuffer b_scales, ffi::AnyBuffer bias,
                                ffi::Result<ffi::AnyBuffer> d, ffi::Result<ffi::AnyBuffer> workspace,
                                std::string_view config, int32_t splits, int32_t sm_count,
                                bool has_bias, int32_t swizzle, int32_t raster) {
  HostTimer timer;
  constexpr std::string_view kTarget = "jax_gmma_fp8_blockwise_gemm";
  int64_t m, n, k;
  DType ta, tb, td;
  if (auto e = check_fp8_operands(a, b, *d, &m, &n, &k, &ta, &tb, &td); !e.empty()) return fail(kTarget, e);
  if (a_scales.element_type() != ffi::DataType::F32 || b_scales.element_type() != ffi::DataType::F32)
    return fail(kTarget, "scales must be float32");
  constexpr std::string_view k1d2d = "blockwise_1d2d_", k1d1d = "blockwise_1d1d_";
  const bool is_1d2d = config.substr(0, k1d2d.size()) == k1d2d;
  if (!is_1d2d && config.substr(0, k1d1d.size()) != k1d1d)
    return fail(kTarget, "config must be a blockwise_1d2d_* or blockwise_1d1d_* kernel");
  const int64_t kb = (k + 127) / 128;
  const int64_t rows_b = is_1d2d ? (n + 127) / 128 : n;
  const int64_t ld_a = block_scale_ld(m), ld_b = block_scale_ld(rows_b);
  if (static_cast<int64_t>(a_scales.element_count()) != kb * ld_a ||
      static_cast<int64_t>(b_scales.element_count()) != kb * ld_b)
    return fail(kTarget, "scale sizes (expected (ceil(K/128), round_up(rows, 4)) MN-major scales)");
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return fail(kTarget, e);

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return fail(kTarget, why);

  GemmArgs g = common_args(m, n, k, a, b, bias, has_bias, d, workspace, splits, sm_count);
  g.a_block_scale = static_cast<const float*>(a_scales.untyped_data());
  g.b_block_scale = static_cast<const float*>(b_scales.untyped_data());
  g.a_block_scale_ld = ld_a;
  g.b_block_scale_ld = ld_b;
  g.swizzle = swizzle;  // checked by the kernel's can_implement at trace time
  g.raster = raster;
  return launch(entry, g, stream);
}

// Blackwell block-scaled GEMM (MX / NVFP4 formats; "sm100_*" / "sm120_*" mx kernels).
// Operands: a (M, K * bits_a / 8) and b (N, K * bits_b / 8): float8_e4m3fn elements, or uint8
// bytes of packed fp4 / fp6 (2 per byte / 4 per 3 bytes); a_sf, b_sf: uint8 scale-factor bytes
// (E8M0 or E4M3) in the swizzled 128x4-atom layout, mx_sf_bytes(rows, K, sf_vec) each;
// a_global, b_global: float32 (1,) NVFP4 per-tensor scales (read only when has_global);
// bias (N,) in the output dtype (read only when has_bias). Results: d (M, N), workspace u8.
// Attributes: config, the logical element dtypes a_dtype / b_dtype (dtype_name spelling),
// the logical K, the scale-vector size sf_vec (32 MX, 16 NVFP4).
ffi::Error MxGemmImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer a_sf,
                      ffi::AnyBuffer b_sf, ffi::AnyBuffer a_global, ffi::AnyBuffer b_global,
                      ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> d,
                      ffi::Result<ffi::AnyBuffer> workspace, std::string_view config,
                      std::string_view a_dtype, std::string_view b_dtype, int64_t k, int32_t sf_vec,
                      int32_t sm_count, bool has_bias, bool has_global) {
  HostTimer timer;
  auto bad = [](const std::string& msg) { return fail("jax_gmma_mx_gemm", msg); };
  // Cheap structural checks: the Python shape rules already enforce these at trace time.
  DType ta, tb, td;
  if (!dtype_from_name(std::string(a_dtype).c_str(), &ta) || !dtype_from_name(std::string(b_dtype).c_str(), &tb))
    return bad("unknown operand dtype attribute");
  if (!to_dtype(d->element_type(), &td) || (td != DType::kBF16 && td != DType::kF32))
    return bad("output must be bfloat16 or float32");
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto dd = d->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || dd.size() != 2) return bad("operands must be 2-D");
  const int64_t m = ad[0], n = bd[0];
  if (dd[0] != m || dd[1] != n) return bad("output shape mismatch");
  auto check_operand = [&](const ffi::AnyBuffer& x, DType t, int64_t rows, const char* name) -> std::string {
    const bool packed = dtype_bits(t) < 8;
    const ffi::DataType want = packed ? ffi::DataType::U8
                               : t == DType::kF8E4M3 ? ffi::DataType::F8E4M3FN
                                                      : ffi::DataType::F8E5M2;
    if (x.element_type() != want)
      return std::string(name) + ": expected " + (packed ? "uint8 (packed)" : dtype_name(t)) + " elements";
    if (k <= 0 || (k * dtype_bits(t)) % 8 || static_cast<int64_t>(x.size_bytes()) * 8 != rows * k * dtype_bits(t))
      return std::string(name) + ": size does not match (rows, K) " + dtype_name(t) + " elements";
    return {};
  };
  if (auto e = check_operand(a, ta, m, "a"); !e.empty()) return bad(e);
  if (auto e = check_operand(b, tb, n, "b"); !e.empty()) return bad(e);
  if (sf_vec != 16 && sf_vec != 32) return bad("sf_vec must be 16 or 32");
  if (a_sf.element_type() != ffi::DataType::U8 || b_sf.element_type() != ffi::DataType::U8)
    return bad("scale factors must be passed as uint8 bytes");
  if (static_cast<int64_t>(a_sf.size_bytes()) != mx_sf_bytes(m, k, sf_vec) ||
      static_cast<int64_t>(b_sf.size_bytes()) != mx_sf_bytes(n, k, sf_vec))
    return bad("scale-factor sizes (expected the swizzled 128x4-atom layout: rows padded to 128, "
               "K blocks to 4)");
  if (has_global && (a_global.element_type() != ffi::DataType::F32 || a_global.element_count() != 1 ||
                     b_global.element_type() != ffi::DataType::F32 || b_global.element_count() != 1))
    return bad("global scales must be float32 (1,)");
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return bad(e);

  thread_local EntryCache cache;
  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return bad(why);

  GemmArgs g = common_args(m, n, k, a, b, bias, has_bias, d, workspace, 1, sm_count);
  g.a_sf = a_sf.untyped_data();
  g.b_sf = b_sf.untyped_data();
  g.a_global_scale = has_global ? static_cast<const float*>(a_global.untyped_data()) : nullptr;
  g.b_global_scale = has_global ? static_cast<const float*>(b_global.untyped_data()) : nullptr;
  return launch(entry, g, stream);
}

}  // namespace
}  // namespace jax_gmma

// Graph safety: JAX_GMMA_GRAPH_SAFE_TRAITS (ffi/graph_safety.h), shared by every handler.

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8Gemm, jax_gmma::Fp8GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_scale
                                  .Arg<ffi::AnyBuffer>()  // b_scale
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("splits")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<int32_t>("swizzle")   // tile order, see GemmArgs
                                  .Attr<int32_t>("raster"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

// The handler's address for the nanobind module (which does not include the XLA headers).
extern "C" __attribute__((visibility("default"))) void* jax_gmma_fp8_gemm_handler() {
  return reinterpret_cast<void*>(&JaxGmmaFp8Gemm);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaFp8BlockwiseGemm, jax_gmma::Fp8BlockwiseGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_scales (kernel layout)
                                  .Arg<ffi::AnyBuffer>()  // b_scales (kernel layout)
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<std::string_view>("config")
                                  .Attr<int32_t>("splits")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<int32_t>("swizzle")   // tile order, see GemmArgs
                                  .Attr<int32_t>("raster"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

extern "C" __attribute__((visibility("default"))) void* jax_gmma_fp8_blockwise_gemm_handler() {
  return reinterpret_cast<void*>(&JaxGmmaFp8BlockwiseGemm);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaMxGemm, jax_gmma::MxGemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // a (fp8, or packed fp4/fp6 bytes)
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a_sf (swizzled, uint8)
                                  .Arg<ffi::AnyBuffer>()  // b_sf
                                  .Arg<ffi::AnyBuffer>()  // a_global (f32 (1,))
                                  .Arg<ffi::AnyBuffer>()  // b_global
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Ret<ffi::AnyBuffer>()  // d
                                  .Ret<ffi::AnyBuffer>()  // workspace
                                  .Attr<std::string_view>("config")
                                  .Attr<std::string_view>("a_dtype")
                                  .Attr<std::string_view>("b_dtype")
                                  .Attr<int64_t>("k")
                                  .Attr<int32_t>("sf_vec")
                                  .Attr<int32_t>("sm_count")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_global"),
                              JAX_GMMA_GRAPH_SAFE_TRAITS);

extern "C" __attribute__((visibility("default"))) void* jax_gmma_mx_gemm_handler() {
  return reinterpret_cast<void*>(&JaxGmmaMxGemm);
}

extern "C" void jax_gmma_count_execution(bool captured) {
  (captured ? jax_gmma::g_captured : jax_gmma::g_eager).fetch_add(1, std::memory_order_relaxed);
}

// Counters of executions under stream capture / eager (see g_captured above).
extern "C" __attribute__((visibility("default"))) void jax_gmma_capture_stats(uint64_t* captured,
                                                                            uint64_t* eager) {
  *captured = jax_gmma::g_captured.load();
  *eager = jax_gmma::g_eager.load();
}

// Handler calls and the host nanoseconds spent in them (see g_host_ns above).
extern "C" __attribute__((visibility("default"))) void jax_gmma_host_stats(uint64_t* calls,
                                                                         uint64_t* ns) {
  *calls = jax_gmma::g_host_calls.load();
  *ns = jax_gmma::g_host_ns.load();
}
