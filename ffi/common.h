// What the XLA FFI handlers of jax-gmma share (ffi/*_ffi.cc): error construction, the XLA ->
// jax_gmma dtype mapping, operand checks, the kernel lookup with its per-call-site cache, the
// GEMM launch path and the host-time accounting. The execution counters (captured / eager) and
// their readers are defined in ffi/common.cc; graph safety is declared in ffi/graph_safety.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <cuda_runtime_api.h>

#include "jax_gmma/gemm_api.h"
#include "xla/ffi/api/ffi.h"
#include "graph_safety.h"

// The handler's address for the nanobind module (which does not include the XLA headers):
// defines `extern "C" void* fn()` returning the XLA_FFI_DEFINE_HANDLER_SYMBOL `handler`.
#define JAX_GMMA_EXPORT_HANDLER(fn, handler)                                  \
  extern "C" __attribute__((visibility("default"))) void* fn() {             \
    return reinterpret_cast<void*>(&handler);                                \
  }

namespace ffi = xla::ffi;

namespace jax_gmma::ffi_common {

// The reason a handler of an sm_90a kernel fails in a build without sm_90a kernels.
inline constexpr const char* kNoSm90 = "this build has no sm_90a kernels (JAX_GMMA_CUDA_ARCHS lacks 90a)";

// An invalid-argument error, prefixed with the FFI target's name.
ffi::Error fail(std::string_view target, std::string_view msg);

// An internal error for a failed CUDA call: "<what>: <CUDA error string>".
ffi::Error cuda_fail(std::string_view what, cudaError_t err);

// XLA element type -> jax_gmma DType (fp8, bf16, f16, f32); false for any other type.
bool to_dtype(ffi::DataType t, DType* out);

// Whether `x` is a float32 (1,) buffer (a per-tensor scale).
bool is_f32_scalar(const ffi::AnyBuffer& x);

// The structural checks the FP8 handlers share (the Python shape rules enforce them at trace
// time already): a (M, K), b (N, K), d (M, N), all 2-D, with supported dtypes. "" when fine.
std::string check_fp8_operands(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                               const ffi::AnyBuffer& d, int64_t* m, int64_t* n, int64_t* k,
                               DType* ta, DType* tb, DType* td);

// bias: (N,) in the output dtype of d when has_bias (else an ignored placeholder). "" when fine.
std::string check_bias(const ffi::AnyBuffer& bias, const ffi::AnyBuffer& d, bool has_bias, int64_t n);

// The grouped handlers' expert bookkeeping: group_sizes (G,) int32, row_ids (M,) int32, and a
// bias (G, N) in the output dtype of d when has_bias. "" when fine.
std::string check_groups(const ffi::AnyBuffer& group_sizes, const ffi::AnyBuffer& row_ids,
                         const ffi::AnyBuffer& bias, const ffi::AnyBuffer& d, bool has_bias,
                         int64_t groups, int64_t m, int64_t n);

// A block-scaled (MX / NVFP4) operand of `rows` x K logical elements of type t: e4m3 / e5m2
// elements one per byte, FP4 / FP6 packed in uint8 bytes. "" when fine, else a message naming it.
std::string check_mx_operand(const ffi::AnyBuffer& x, DType t, int64_t rows, int64_t k, const char* name);

// The block-scaled handlers' element types: the operands' logical dtypes from their attributes
// (dtype_name spelling), the output d's (bfloat16 or float32). "" when fine.
std::string mx_dtypes(std::string_view a_dtype, std::string_view b_dtype, const ffi::AnyBuffer& d,
                      DType* ta, DType* tb, DType* td);

// The block-scaled handlers' scale factors: uint8 bytes in the swizzled 128x4-atom layout,
// mx_sf_bytes(a_rows, K, sf_vec) for a and `groups` x mx_sf_bytes(b_rows, K, sf_vec) for b
// (the experts' back to back; 1 group for a dense GEMM), sf_vec 16 (NVFP4) or 32 (MX). "" when
// fine.
std::string check_mx_scale_factors(const ffi::AnyBuffer& a_sf, const ffi::AnyBuffer& b_sf, int32_t sf_vec,
                                   int64_t a_rows, int64_t b_rows, int64_t groups, int64_t k);

// The scale-factor and NVFP4 global-scale fields of the block-scaled GemmArgs.
void set_mx_args(GemmArgs& g, const ffi::AnyBuffer& a_sf, const ffi::AnyBuffer& b_sf,
                 const ffi::AnyBuffer& a_global, const ffi::AnyBuffer& b_global, bool has_global);

// The GemmArgs fields every GEMM handler fills the same way (operand, bias, output and workspace
// pointers, problem size, split count, SM count); scale fields are the caller's.
void set_common_args(GemmArgs& g, int64_t m, int64_t n, int64_t k, const ffi::AnyBuffer& a,
                     const ffi::AnyBuffer& b, const ffi::AnyBuffer& bias, bool has_bias,
                     ffi::Result<ffi::AnyBuffer>& d, ffi::Result<ffi::AnyBuffer>& workspace,
                     int32_t splits, int32_t sm_count);

// The kernel a handler's call site asked for. Each handler keeps a thread-local one-entry cache
// (the same call site hits it every step).
struct EntryCache {
  const KernelEntry* entry = nullptr;
  std::string name;
};

// The kernel `config` for (ta, tb, td); nullptr, with `why`, when this build lacks it.
const KernelEntry* lookup(EntryCache& cache, std::string_view config, DType ta, DType tb, DType td,
                          std::string* why);

// The execute path every GEMM handler shares (graph-safety rules: ffi/graph_safety.h): device
// from cudaGetDevice, one-time kernel setup if it has not happened yet, capture accounting, and
// the launch (plus any stream-K workspace memset the kernel needs).
ffi::Error launch(const KernelEntry* entry, GemmArgs& g, cudaStream_t stream);

// The body of the two FP8 GEMM handlers (tensorwise, block-scaled): operand, scale-dtype
// (float32) and bias checks, the kernel lookup (`cache`: the call site's), GemmArgs and the
// launch. `set_scales(m, n, k, g)` checks the scale operands' sizes and fills g's scale fields;
// it returns "" or the reason they do not fit.
template <class SetScales>
ffi::Error run_fp8_gemm(std::string_view target, EntryCache& cache, cudaStream_t stream,
                        const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& a_scale,
                        const ffi::AnyBuffer& b_scale, const ffi::AnyBuffer& bias,
                        ffi::Result<ffi::AnyBuffer>& d, ffi::Result<ffi::AnyBuffer>& workspace,
                        std::string_view config, int32_t splits, int32_t sm_count, bool has_bias,
                        int32_t swizzle, int32_t raster, SetScales&& set_scales) {
  int64_t m, n, k;
  DType ta, tb, td;
  if (auto e = check_fp8_operands(a, b, *d, &m, &n, &k, &ta, &tb, &td); !e.empty()) return fail(target, e);
  if (a_scale.element_type() != ffi::DataType::F32 || b_scale.element_type() != ffi::DataType::F32)
    return fail(target, "scales must be float32");
  GemmArgs g;
  if (auto e = set_scales(m, n, k, g); !e.empty()) return fail(target, e);
  if (auto e = check_bias(bias, *d, has_bias, n); !e.empty()) return fail(target, e);

  std::string why;
  const KernelEntry* entry = lookup(cache, config, ta, tb, td, &why);
  if (!entry) return fail(target, why);

  set_common_args(g, m, n, k, a, b, bias, has_bias, d, workspace, splits, sm_count);
  g.swizzle = swizzle;  // checked by the kernel's can_implement at trace time
  g.raster = raster;
  return launch(entry, g, stream);
}

// Host time spent inside a GEMM handler (checks, kernel lookup, parameter cache, launch), so the
// benchmark can report our share of the per-call host cost apart from XLA's own
// (_gmma_ext.host_stats()). One on the stack of each GEMM handler.
struct HostTimer {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~HostTimer();
};

}  // namespace jax_gmma::ffi_common

