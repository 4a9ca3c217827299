// Per-thread cache of CUTLASS kernel parameters (Params: TMA descriptors, scheduler state),
// keyed by the whole argument set of a call. Building Params costs microseconds (several
// cuTensorMapEncode calls); XLA reuses buffer addresses between executions of a compiled
// program, so in steady state every call site of a program hits its entry and a call only
// enqueues the launch (and the split-K workspace memset).
//
// A hit costs one kernel launch, issued here with the grid computed when the entry was built
// (plus, for stream-K/split-K, CUTLASS's workspace initialization: one memset of the reduction
// flags). CUTLASS's own GemmUniversalAdapter::run() would also set a function attribute
// (non-portable cluster size) on every call of a cluster kernel; our clusters are 2 CTAs, which
// are portable, so nothing but the launch is needed.
//
// Set-associative (kSets x kWays entries, round-robin replacement within a set), so programs
// with hundreds of GEMM call sites keep hitting; the first version was direct-mapped with 64
// slots, where colliding call sites evict each other. (Measured on an H200 in a program of 32
// tiny GEMMs: 8.1 us of handler time per call before this change, 7.6 after: there the launch
// and the split-K workspace memset dominate, not parameter building.)
#pragma once

#include <cstdint>
#include <memory>

#include <cute/tensor.hpp>
#include <cutlass/device_kernel.h>

#include "jax_gmma/gemm_api.h"

namespace jax_gmma {

inline uint64_t gemm_args_hash(const GemmArgs& g) {
  auto p = [](const void* q) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(q) >> 8); };
  uint64_t h = p(g.a) * 0x9E3779B97F4A7C15ull ^ p(g.b) * 0xC2B2AE3D27D4EB4Full ^
               p(g.d) * 0x165667B19E3779F9ull ^
               static_cast<uint64_t>(g.m * 131 + g.n * 7 + g.k) * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

template <class Params, int kSets = 64, int kWays = 4>
struct ParamsCache {
  struct Entry {
    GemmArgs key;
    Params params;
    dim3 grid;
    bool valid = false;
    bool needs_workspace_init = false;
  };
  Entry entries[kSets][kWays];
  uint8_t victim[kSets] = {};

  // The entry for `g`: a hit when an entry's key is `same` as g, else `build(entry)` fills a
  // free (or the set's next victim) entry's params and needs_workspace_init.
  template <class Same, class Build>
  Entry& lookup(const GemmArgs& g, Same&& same, Build&& build) {
    const int set = static_cast<int>(gemm_args_hash(g) % kSets);
    Entry* row = entries[set];
    for (int w = 0; w < kWays; ++w)
      if (row[w].valid && same(row[w].key, g)) return row[w];
    int w = 0;
    while (w < kWays && row[w].valid) ++w;
    if (w == kWays) {
      w = victim[set];
      victim[set] = static_cast<uint8_t>((victim[set] + 1) % kWays);
    }
    Entry& e = row[w];
    e.valid = false;
    build(e);
    e.key = g;
    e.valid = true;
    return e;
  }
};

// The calling thread's cache for one kernel type, allocated on the thread's first call of it.
template <class GemmKernel>
ParamsCache<typename GemmKernel::Params>& thread_params_cache() {
  thread_local std::unique_ptr<ParamsCache<typename GemmKernel::Params>> cache;
  if (!cache) cache.reset(new ParamsCache<typename GemmKernel::Params>());
  return *cache;
}

// One launch of CUTLASS's kernel entry point with cached Params and grid: block size and
// dynamic shared memory are the kernel's constants (the shared-memory attribute was set once by
// the KernelEntry's prepare()), the cluster shape a launch attribute when it has more than one CTA.
template <class GemmKernel>
cudaError_t launch_gemm_kernel(const typename GemmKernel::Params& params, dim3 grid,
                               cudaStream_t stream) {
  using Cluster = typename GemmKernel::DispatchPolicy::ClusterShape;
  constexpr unsigned cx = cute::size<0>(Cluster{}), cy = cute::size<1>(Cluster{}),
                     cz = cute::size<2>(Cluster{});
  static_assert(cx * cy * cz <= 8, "clusters above 8 CTAs need the non-portable size attribute");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = GemmKernel::get_block_shape();
  cfg.dynamicSmemBytes = GemmKernel::SharedStorageSize;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  if constexpr (cx * cy * cz > 1) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cx;
    attr[0].val.clusterDim.y = cy;
    attr[0].val.clusterDim.z = cz;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  void* args[] = {const_cast<typename GemmKernel::Params*>(&params)};
  return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(&cutlass::device_kernel<GemmKernel>),
                             args);
}

// The run() of a CUTLASS sm90 GEMM KernelEntry: cached Params and grid for the argument set
// (`same` is key equality, `make_arguments` builds CUTLASS Arguments from GemmArgs), the
// stream-K workspace initialization where the kernel has a workspace, then the launch.
template <class GemmKernel, class Same, class MakeArgs>
cudaError_t run_cached(const GemmArgs& g, Same&& same, MakeArgs&& make_arguments, cudaStream_t stream) {
  auto& e = thread_params_cache<GemmKernel>().lookup(g, same, [&](auto& entry) {
    auto args = make_arguments(g);
    entry.params = GemmKernel::to_underlying_arguments(args, g.workspace);
    entry.grid = GemmKernel::get_grid_shape(entry.params);
    entry.needs_workspace_init = GemmKernel::get_workspace_size(args) > 0;
  });
  if (e.needs_workspace_init) {
    // Stream-K/split-K: zero the reduction flags (a memset node under capture).
    if (GemmKernel::initialize_workspace(make_arguments(g), g.workspace, stream) !=
        cutlass::Status::kSuccess)
      return cudaErrorUnknown;
  }
  return launch_gemm_kernel<GemmKernel>(e.params, e.grid, stream);
}

}  // namespace jax_gmma
