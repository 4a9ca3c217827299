// Host-side pieces shared by the CUTLASS 3.x GEMM families (sm90 FP8 tensorwise and block-scaled,
// Blackwell block-scaled MX): the dtype -> CUTLASS type map, the tile-scheduler arguments
// (swizzle, raster, stream-K / split-K decomposition) and their checks, the bias argument of the
// epilogue, the one-time shared-memory setup and the KernelEntry of a kernel. Host code only:
// nothing here is compiled for the device.
#pragma once

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
