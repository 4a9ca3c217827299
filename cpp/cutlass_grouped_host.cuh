// Host entry points shared by the CUTLASS grouped (mixture-of-experts) families whose setup
// kernel writes each expert's shape and operand addresses into the workspace (sm90 grouped
// blockwise FP8, sm90 grouped bf16, sm100 grouped block-scaled): CUTLASS's workspace,
// can_implement, the workspace size, a run's checks and the launch of the grouped kernel with
// cached Params. A family derives from GroupedHost<Family> and provides GemmKernel, Arrays,
// carve(g, base, &arrays) (its workspace regions for the problem g from a 128-byte aligned base;
// base 0 sizes them), make_arguments(g, arrays, sms) and check(g). It may hide two defaults:
// has_work(g) (whether the problem needs a workspace: G >= 1) and tma_addresses(g) (the OR of
// the operand addresses that must be 16-byte aligned: A, B and D). Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass_gemm_host.cuh"
#include "params_cache.cuh"

namespace jax_gmma::cutlass_host {

template <class Family>
struct GroupedHost {
  static bool has_work(const GemmArgs& g) { return g.groups >= 1; }

  static uintptr_t tma_addresses(const GemmArgs& g) {
    return reinterpret_cast<uintptr_t>(g.a) | reinterpret_cast<uintptr_t>(g.b) |
           reinterpret_cast<uintptr_t>(g.d);
  }

  // Bytes of CUTLASS's workspace for `sms` SMs.
  static size_t cutlass_workspace(const GemmArgs& g, int sms) {
    typename Family::Arrays w;
    Family::carve(g, kGroupedAlign, &w);  // any aligned stand-in address: nothing is read
    return Family::GemmKernel::get_workspace_size(Family::make_arguments(g, w, sms));
  }

  static const char* can_implement(const GemmArgs& g) {
    if (const char* msg = Family::check(g)) return msg;
    const int sms = grouped_sm_count(g);
    if (sms <= 0) return "no SM count (and no device to ask)";
    typename Family::Arrays w;
    Family::carve(g, kGroupedAlign, &w);
    return cutlass_can_implement<typename Family::GemmKernel>(Family::make_arguments(g, w, sms));
  }

  // From the shapes and the SM count only (never the group sizes): the family's regions,
  // CUTLASS's workspace and the slack that aligns the workspace's start to 128 bytes.
  static size_t workspace_size(const GemmArgs& g) {
    if (!Family::has_work(g)) return 0;
    typename Family::Arrays w;
    const int sms = grouped_sm_count(g);
    return kGroupedAlign + Family::carve(g, 0, &w) + cutlass_workspace(g, sms > 0 ? sms : 1);
  }

  // The checks of a run and the arrays carved from the workspace (*w, *sms); cudaSuccess when
  // the call may go on. TMA needs 16-byte aligned operands (tma_addresses; row offsets keep it:
  // the families' K and N rules).
  template <class Arrays>  // Family::Arrays (a template parameter: Family is incomplete here)
  static cudaError_t prepare_run(const GemmArgs& g, Arrays* w, int* sms) {
    if (Family::check(g)) return cudaErrorInvalidValue;
    *sms = grouped_sm_count(g);
    if (*sms <= 0) return cudaErrorInvalidValue;
    const uintptr_t base = grouped_workspace_base(g);
    const size_t arrays = Family::carve(g, base, w);
    if (!grouped_workspace_fits(g, base, arrays, cutlass_workspace(g, *sms))) return cudaErrorInvalidValue;
    if (Family::tma_addresses(g) % 16) return cudaErrorMisalignedAddress;
    return cudaSuccess;
  }

  // The grouped GEMM over the arrays the setup kernel wrote (Params cached per thread, keyed by
  // what they depend on: same_grouped_args).
  template <class Arrays>  // Family::Arrays
  static cudaError_t launch(const GemmArgs& g, const Arrays& w, int sms, cudaStream_t stream) {
    using GemmKernel = typename Family::GemmKernel;
    auto& e = thread_params_cache<GemmKernel>().lookup(g, &same_grouped_args, [&](auto& entry) {
      entry.params = GemmKernel::to_underlying_arguments(Family::make_arguments(g, w, sms), w.cutlass);
      entry.grid = GemmKernel::get_grid_shape(entry.params);
      entry.needs_workspace_init = false;  // per-SM TMA descriptors, written by the kernel itself
    });
    return launch_gemm_kernel<GemmKernel>(e.params, e.grid, stream);
  }
};

}  // namespace jax_gmma::cutlass_host
