// Host-side pieces shared by the CUTLASS 3.x GEMM families (sm90 FP8 tensorwise and block-scaled,
// Blackwell block-scaled MX, the grouped families): the dtype -> CUTLASS type map, the
// tile-scheduler arguments (swizzle, raster, stream-K / split-K decomposition) and their checks,
// the bias argument of the epilogue, the grouped kernels' workspace, arguments and checks, the
// one-time shared-memory setup and the KernelEntry of a kernel. Host code only:
// nothing here is compiled for the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/numeric_types.h>
#include <cutlass/util/packed_stride.hpp>

#include "jax_gmma/gemm_api.h"

namespace jax_gmma::cutlass_host {

template <DType T> struct CutlassType;
template <> struct CutlassType<DType::kF8E4M3> { using type = cutlass::float_e4m3_t; };
template <> struct CutlassType<DType::kF8E5M2> { using type = cutlass::float_e5m2_t; };
template <> struct CutlassType<DType::kBF16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassType<DType::kF16> { using type = cutlass::half_t; };
template <> struct CutlassType<DType::kF32> { using type = float; };

// The problem, operand and output fields of a CUTLASS 3.x GEMM's Arguments from GemmArgs (user
// A (M, K), B (N, K), D (M, N), all packed; no C operand). With kSwap the kernel computes
// D^T = B A^T: its A is the user's B and its M the user's N. KElA / KElB: the kernel's operand
// element types. Each family then fills its scales, epilogue and scheduler fields.
template <bool kSwap, class GemmKernel, class KElA, class KElB, class ElD>
typename GemmKernel::Arguments gemm_arguments(const GemmArgs& g) {
  const int km = static_cast<int>(kSwap ? g.n : g.m);
  const int kn = static_cast<int>(kSwap ? g.m : g.n);
  const int k = static_cast<int>(g.k);
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  const StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(km, kn, 1));
  typename GemmKernel::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {km, kn, k, 1};
  args.mainloop.ptr_A = static_cast<const KElA*>(kSwap ? g.b : g.a);
  args.mainloop.dA = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(km, k, 1));
  args.mainloop.ptr_B = static_cast<const KElB*>(kSwap ? g.a : g.b);
  args.mainloop.dB = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(kn, k, 1));
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = sd;
  args.epilogue.ptr_D = static_cast<ElD*>(g.d);
  args.epilogue.dD = sd;
  return args;
}

// The checks of GemmArgs' scheduler fields (splits, swizzle, raster) for a persistent sm90 tile
// scheduler, stream-K or not. nullptr when fine, else a static message.
template <bool kStreamK>
const char* check_scheduler_args(const GemmArgs& g) {
  if constexpr (!kStreamK) {
    if (g.splits != 1) return "this config does not split K (splits must be 1)";
  }
  if (g.splits < 0) return "splits must be >= 0";
  if (g.swizzle != 1 && g.swizzle != 2 && g.swizzle != 4 && g.swizzle != 8)
    return "swizzle must be 1, 2, 4 or 8";
  if (g.raster < 0 || g.raster > 2) return "raster must be 0 (heuristic), 1 (along M) or 2 (along N)";
  return nullptr;
}

// Hardware info and tile-scheduler arguments of CUTLASS Arguments from GemmArgs: device, SM
// count, max swizzle size, raster order and, for stream-K schedulers, the decomposition
// (splits: 0 = CUTLASS's stream-K heuristic, 1 = data-parallel, > 1 = split-K) with a
// deterministic reduction.
template <bool kStreamK, class Arguments>
void set_scheduler_args(Arguments& args, const GemmArgs& g) {
  args.hw_info.device_id = g.device;
  args.hw_info.sm_count = g.sm_count;
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = g.swizzle;
  args.scheduler.raster_order = g.raster == 1   ? Raster::AlongM
                                : g.raster == 2 ? Raster::AlongN
                                                : Raster::Heuristic;
  if constexpr (kStreamK) {
    using Decomp = cutlass::gemm::kernel::detail::DecompositionMode;
    using Reduce = cutlass::gemm::kernel::detail::ReductionMode;
    args.scheduler.splits = g.splits > 1 ? g.splits : 1;
    args.scheduler.decomposition_mode = g.splits == 0   ? Decomp::Heuristic
                                        : g.splits > 1 ? Decomp::SplitK
                                                       : Decomp::DataParallel;
    // Deterministic turnstile reduction: results are bit-identical run to run.
    args.scheduler.reduction_mode = Reduce::Deterministic;
  }
}

// The bias broadcast's arguments (an Sm90ColBroadcast when kSwap -- the user's N runs along the
// kernel's rows --, else an Sm90RowBroadcast): g.bias, or 0 when it is nullptr.
template <bool kSwap, class ElD, class BiasArgs>
void set_bias_args(BiasArgs& bias, const GemmArgs& g) {
  if constexpr (kSwap) {
    bias.ptr_col = static_cast<const ElD*>(g.bias);
  } else {
    bias.ptr_row = static_cast<const ElD*>(g.bias);
  }
  bias.null_default = ElD(0);
}

// Key equality of the GemmArgs fields every CUTLASS GEMM family reads (problem size, operand,
// bias, output and workspace pointers, SM count, device); each family adds its own fields.
inline bool same_common_args(const GemmArgs& x, const GemmArgs& y) {
  return x.m == y.m && x.n == y.n && x.k == y.k && x.a == y.a && x.b == y.b && x.bias == y.bias &&
         x.d == y.d && x.workspace == y.workspace && x.workspace_bytes == y.workspace_bytes &&
         x.sm_count == y.sm_count && x.device == y.device;
}

// ... plus the tile-scheduler fields (splits, swizzle, raster) of the sm90 families.
inline bool same_scheduler_args(const GemmArgs& x, const GemmArgs& y) {
  return same_common_args(x, y) && x.splits == y.splits && x.swizzle == y.swizzle && x.raster == y.raster;
}

// -- Grouped (ptr-array) GEMMs whose per-expert shapes and operands a setup kernel writes into
// the workspace on the device (the mixture-of-experts families: sm90 grouped blockwise and
// bfloat16, sm100 grouped block-scaled). --

// Alignment of the workspace's regions (TMA descriptors need 64 bytes).
constexpr size_t kGroupedAlign = 128;

// Lays a grouped family's workspace out from `base` (kGroupedAlign-aligned; 0 only sizes it):
// regions in the order taken, each kGroupedAlign-aligned, then CUTLASS's own workspace.
class WorkspaceCarver {
 public:
  WorkspaceCarver(uintptr_t base, int64_t groups) : base_(base), groups_(static_cast<size_t>(groups)) {}

  // One array per argument, one entry (the pointee type) per expert.
  template <class... T>
  WorkspaceCarver& per_expert(T*&... arrays) {
    (take(arrays, sizeof(T) * groups_), ...);
    return *this;
  }

  // A region of `bytes` bytes.
  template <class T>
  WorkspaceCarver& region(T*& p, size_t bytes) {
    take(p, bytes);
    return *this;
  }

  // CUTLASS's workspace (*cutlass) starts after the regions; returns their bytes.
  size_t finish(void** cutlass) const {
    *cutlass = reinterpret_cast<void*>(base_ + off_);
    return off_;
  }

 private:
  template <class T>
  void take(T*& p, size_t bytes) {
    p = reinterpret_cast<T*>(base_ + off_);
    off_ += (bytes + kGroupedAlign - 1) / kGroupedAlign * kGroupedAlign;
  }

  uintptr_t base_;
  size_t groups_;
  size_t off_ = 0;
};

// The host checks every grouped family shares (expert bookkeeping, sizes, 16-byte rows of D of
// `align_d` elements, the scheduler fields); nullptr when fine. Each family adds its operand
// and K rules.
inline const char* check_grouped_args(const GemmArgs& g, int align_d) {
  if (!g.group_sizes || !g.row_ids || g.groups < 1)
    return "the grouped kernels need group_sizes, row_ids and G >= 1";
  if (g.groups > INT32_MAX / 2) return "G must be below 2^30";
  if (g.m <= 0 || g.n <= 0 || g.k <= 0) return "M, N and K must be positive";
  if (g.m > INT32_MAX / 2 || g.n > INT32_MAX / 2 || g.k > INT32_MAX / 2)
    return "M, N and K must be below 2^30";
  if (g.n % align_d)
    return align_d == 8 ? "N must be a multiple of 8 for bfloat16 output (TMA: 16-byte rows of D)"
                        : "N must be a multiple of 4 for float32 output (TMA: 16-byte rows of D)";
  if (g.splits != 1) return "the grouped kernels do not split K (splits must be 1)";
  if (g.swizzle != 1)
    return "the grouped kernels take no swizzle (swizzle must be 1: the group scheduler's tile "
           "order cannot depend on the device-side group sizes)";
  if (g.raster < 0 || g.raster > 2) return "raster must be 0 (heuristic), 1 (along M) or 2 (along N)";
  return nullptr;
}

// The fields of a grouped kernel's CUTLASS Arguments that every operand reaches through the
// workspace's per-expert arrays `w` (shapes, A / B / scale pointers, strides and scale layouts,
// D and its strides; no C operand), and the persistent scheduler over `sms` SMs. The problem
// shapes are device-only (no host copy: grid = sms CTAs). Each family adds its epilogue fusion.
// kScales: the mainloop takes per-expert scale pointers and layouts (w.sfa / w.sfb and
// w.layout_sfa / w.layout_sfb); false for unscaled operands.
template <bool kScales = true, class Arguments, class Arrays>
void set_grouped_arguments(Arguments& args, const GemmArgs& g, const Arrays& w, int sms) {
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = decltype(args.problem_shape){static_cast<int32_t>(g.groups), w.shapes, nullptr};
  args.mainloop.ptr_A = w.a;
  args.mainloop.dA = w.stride_a;
  args.mainloop.ptr_B = w.b;
  args.mainloop.dB = w.stride_b;
  if constexpr (kScales) {
    args.mainloop.ptr_SFA = w.sfa;
    args.mainloop.layout_SFA = w.layout_sfa;
    args.mainloop.ptr_SFB = w.sfb;
    args.mainloop.layout_SFB = w.layout_sfb;
  }
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = w.stride_d;
  args.epilogue.ptr_D = w.d;
  args.epilogue.dD = w.stride_d;
  args.hw_info.device_id = g.device;
  args.hw_info.sm_count = sms;
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.max_swizzle_size = 1;
  args.scheduler.raster_order = g.raster == 1   ? Raster::AlongM
                                : g.raster == 2 ? Raster::AlongN
                                                : Raster::Heuristic;
}

// Key equality of a grouped kernel's cached Params: every operand lives in the workspace, so
// they depend only on its address and size, G, the SM count, the device, the raster order and
// whether there is a bias.
inline bool same_grouped_args(const GemmArgs& x, const GemmArgs& y) {
  return x.workspace == y.workspace && x.workspace_bytes == y.workspace_bytes && x.groups == y.groups &&
         x.sm_count == y.sm_count && x.device == y.device && x.raster == y.raster &&
         (x.bias != nullptr) == (y.bias != nullptr);
}

// The workspace's first kGroupedAlign-aligned address.
inline uintptr_t grouped_workspace_base(const GemmArgs& g) {
  return (reinterpret_cast<uintptr_t>(g.workspace) + kGroupedAlign - 1) / kGroupedAlign * kGroupedAlign;
}

// Whether the workspace holds, from `base`, `arrays` bytes of per-expert arrays then
// `cutlass_bytes` of CUTLASS's own workspace.
inline bool grouped_workspace_fits(const GemmArgs& g, uintptr_t base, size_t arrays, size_t cutlass_bytes) {
  return g.workspace &&
         g.workspace_bytes >= (base - reinterpret_cast<uintptr_t>(g.workspace)) + arrays + cutlass_bytes;
}

// CTAs of a grouped setup kernel of `threads` threads: CTA 0 writes the per-expert arrays, the
// others (at most 2 per SM, 4 16-byte vectors per thread) fill D's rows past the groups' total.
inline unsigned grouped_setup_ctas(const GemmArgs& g, size_t out_bytes, int threads, int sms) {
  const int64_t vecs = g.m * g.n * static_cast<int64_t>(out_bytes) / 16;  // of D, at most
  const int64_t per_cta = static_cast<int64_t>(threads) * 4;
  const int64_t fill = std::min<int64_t>((vecs + per_cta - 1) / per_cta, 2 * static_cast<int64_t>(sms));
  return static_cast<unsigned>(1 + std::max<int64_t>(fill, 1));
}

// CUTLASS's can_implement of the problem as a KernelEntry message.
template <class GemmKernel, class Arguments>
const char* cutlass_can_implement(const Arguments& args) {
  if (GemmKernel::can_implement(args)) return nullptr;
  return "CUTLASS can_implement rejected the problem (alignment or shape)";
}

// One-time per-device setup of a kernel: the dynamic shared-memory limit when it needs more
// than the default 48 KB (not a stream operation).
template <class GemmKernel>
cudaError_t prepare_kernel() {
  constexpr int smem = GemmKernel::SharedStorageSize;
  if constexpr (smem >= (48 << 10)) {
    return cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  }
  return cudaSuccess;
}

// The KernelEntry of a CUTLASS GEMM type `Gemm` (a family's struct with can_implement,
// workspace_size, run and GemmKernel) named `name`.
template <class Gemm>
KernelEntry make_entry(const char* name, DType a, DType b, DType d, int32_t arch = 90) {
  using GemmKernel = typename Gemm::GemmKernel;
  KernelEntry e{name, a, b, d, &Gemm::can_implement, &Gemm::workspace_size, &prepare_kernel<GemmKernel>,
                &Gemm::run, static_cast<int32_t>(GemmKernel::SharedStorageSize),
                static_cast<int32_t>(GemmKernel::MaxThreadsPerBlock)};
  e.arch = arch;
  return e;
}

}  // namespace jax_gmma::cutlass_host
