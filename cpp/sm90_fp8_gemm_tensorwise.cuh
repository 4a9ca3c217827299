// Kernel family: Hopper (sm_90a) FP8 GEMM with per-tensor or per-row/per-column
// ("tensorwise" / channel) float32 scales, optional bias, bf16/f16/f32 output.
//
// Built from CUTLASS 3.x collectives: TMA loads, warp-specialized wgmma (QGMMA) mainloop,
// TMA-store epilogue with an epilogue visitor tree (EVT):
//     D = cast( col_scale[m] * (row_scale[n] * acc) + bias )
// Scales are read on the device; each scale vector's stride is a runtime bool
// (CUTLASS "dynamic broadcast"), so one kernel serves per-tensor and per-row scales.
//
// A config is a struct of types; `Sm90Fp8Gemm<ElA, ElB, ElD, Cfg>` turns it into a kernel
// and type-erased entry points (see gemm_api.h). Swap-AB configs compute D^T = B A^T so that
// a small M becomes the kernel's N tile (decode): the weights then stream along the kernel's M.
#pragma once

#include <memory>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "jax_gmma/gemm_api.h"
#include "cutlass_gemm_host.cuh"
#include "params_cache.cuh"

namespace jax_gmma::sm90 {

using namespace cute;
using cutlass_host::CutlassType;

// ---------------------------------------------------------------------------------------
// Configs. Names must match jax_gmma/configs.py (checked by a test when the library is built).
// ---------------------------------------------------------------------------------------
namespace sched = cutlass::gemm;
namespace epi = cutlass::epilogue;

// Stages_ = 0: CUTLASS's automatic count (as many mainloop stages as shared memory holds after
// the epilogue's carve-out); > 0: exactly that many (the stage sweep's kernels).
// MinBlocks_ > 1: the kernel is compiled for that many resident CTAs per SM
// (__launch_bounds__ min blocks: the register budget per thread shrinks to fit); 1 = CUTLASS's.
template <class Tile_, class Cluster_, class Kernel_, class Epi_, class Scheduler_, bool kSwap_,
          int Stages_ = 0, int MinBlocks_ = 1>
struct Config {
  using Tile = Tile_;
  using Cluster = Cluster_;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epi_;
  using TileScheduler = Scheduler_;
  static constexpr bool kSwap = kSwap_;
  static constexpr bool kStreamK = std::is_same_v<Scheduler_, cutlass::gemm::StreamKScheduler>;
  static constexpr int kStages = Stages_;
  static constexpr int kMinBlocks = MinBlocks_;
};

// A config with an explicit mainloop stage count.
template <class Cfg, int S>
using WithStages = Config<typename Cfg::Tile, typename Cfg::Cluster, typename Cfg::KernelSchedule,
                          typename Cfg::EpilogueSchedule, typename Cfg::TileScheduler, Cfg::kSwap, S,
                          Cfg::kMinBlocks>;

// A CUTLASS kernel with another min-blocks launch bound (cutlass::device_kernel reads
// Operator::MinBlocksPerMultiprocessor); everything else is the base kernel's.
template <class Base, int B>
struct WithLaunchMinBlocks : Base {
  static constexpr uint32_t MinBlocksPerMultiprocessor = B;
};

// Large tiles. Two-level (promoting) accumulation keeps a second fp32 accumulator per thread,
// so its tiles give each consumer warpgroup at most 64x192 outputs (128x256 cooperative and
// 128x128 ping-pong tiles spill registers with promotion; measured 3x slower). 128x192 was the
// fastest two-level tile of the sweep at every large shape (and fits N = 2112 = 11 x 192).
using CfgL256CoopFast = Config<Shape<_128, _256, _128>, Shape<_2, _1, _1>,
                               sched::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                               epi::TmaWarpSpecializedCooperative, void, false>;
using CfgM128Coop2l = Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                             sched::KernelTmaWarpSpecializedCooperative,
                             epi::TmaWarpSpecializedCooperative, void, false>;
using CfgM192Coop2l = Config<Shape<_128, _192, _128>, Shape<_2, _1, _1>,
                             sched::KernelTmaWarpSpecializedCooperative,
                             epi::TmaWarpSpecializedCooperative, void, false>;
using CfgM192CoopFast = Config<Shape<_128, _192, _128>, Shape<_2, _1, _1>,
                               sched::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                               epi::TmaWarpSpecializedCooperative, void, false>;
using CfgP128PpFast = Config<Shape<_128, _128, _128>, Shape<_1, _2, _1>,
                             sched::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                             epi::TmaWarpSpecialized, void, false>;
// Stream-K (or split-K) for grids that fill the GPU badly.
using CfgL256CoopSkFast = Config<Shape<_128, _256, _128>, Shape<_1, _1, _1>,
                                 sched::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                                 epi::TmaWarpSpecializedCooperative,
                                 cutlass::gemm::StreamKScheduler, false>;
using CfgS128CoopSk = Config<Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                             sched::KernelTmaWarpSpecializedCooperative,
                             epi::TmaWarpSpecializedCooperative,
                             cutlass::gemm::StreamKScheduler, false>;
// Decode: swap-AB so the weights (N) run along the kernel's M and the few tokens (M) are the
// kernel's N tile. Cooperative + stream-K/split-K (TM weight rows per CTA, CX CTAs per cluster
// along the weights), or ping-pong 64-row tiles with no workspace.
template <int TM, int TN, int CX>
using CfgDecodeSwapCoop = Config<Shape<Int<TM>, Int<TN>, _128>, Shape<Int<CX>, _1, _1>,
                                 sched::KernelTmaWarpSpecializedCooperative,
                                 epi::TmaWarpSpecializedCooperative,
                                 cutlass::gemm::StreamKScheduler, true>;
template <int TN>
using CfgDecodeSwap = CfgDecodeSwapCoop<128, TN, 1>;
// The same with fast accumulation (wgmma accumulators only), XLA's default for FP8 dots: no
// promotion pass per 128 K. Measured 1-5% faster at N = 28672, K = 8192, M = 1..64
// (decode sweep on the H200, measured 2026-11-30).
template <int TN, int CX>
using CfgDecodeSwapCoopFast = Config<Shape<_128, Int<TN>, _128>, Shape<Int<CX>, _1, _1>,
                                     sched::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                                     epi::TmaWarpSpecializedCooperative,
                                     cutlass::gemm::StreamKScheduler, true>;
template <int TN>
using CfgDecodeSwapPp = Config<Shape<_64, Int<TN>, _128>, Shape<_1, _1, _1>,
                               sched::KernelTmaWarpSpecializedPingpong,
                               epi::TmaWarpSpecialized, void, true>;
// Decode with at most one wave of 64-row weight tiles (N <= 64 x SMs): one warp-specialized CTA
// per tile (a producer warp, one consumer warpgroup; not persistent) with an explicit stage
// count. Kernel alone on the H200 at N = K = 8192, M = 1 / 16 / 64 (the FP8 decode kernel
// bench): 20.8 / 21.2 / 22.3 us vs 22.0 / 22.1 / 23.3 for the
// persistent ping-pong kernel with the same tile and CUTLASS's automatic stage count.
template <int TN, int S>
using CfgDecodeSwapWs = Config<Shape<_64, Int<TN>, _128>, Shape<_1, _1, _1>,
                               sched::KernelTmaWarpSpecialized, epi::TmaWarpSpecialized, void, true, S>;
// The same in a 2x1 cluster: the two CTAs of a cluster share the activation tile by TMA
// multicast. With 4 stages (66 KB of shared memory, 3 CTAs per SM) it is the short-K 64-token
// tile when the weight tiles fit in one wave of 3 per SM (configs.select_config).
template <int TN, int S>
using CfgDecodeSwapWsC2 = Config<Shape<_64, Int<TN>, _128>, Shape<_2, _1, _1>,
                                 sched::KernelTmaWarpSpecialized, epi::TmaWarpSpecialized, void, true, S>;
// Decode at M = 33..64 with many weight rows: the 64-token activation tile is re-read by every
// weight tile (at N = 28672 about half as many bytes again as the weights, from L2); a 2x1
// cluster's CTAs share it by TMA multicast. (256-row weight tiles, the other way to halve it,
// measured 7-9% slower at M = 48 / 64, N = 28672, and were dropped.)
template <int TN>
using CfgDecodeSwapC2 = CfgDecodeSwapCoop<128, TN, 2>;

// ---------------------------------------------------------------------------------------
// The kernel for one (A, B, D) dtype triple and one config.
// ---------------------------------------------------------------------------------------
template <DType kA, DType kB, DType kD, class Cfg>
struct Sm90Fp8Gemm {
  using ElA = typename CutlassType<kA>::type;  // user A (M, K)
  using ElB = typename CutlassType<kB>::type;  // user B (N, K)
  using ElD = typename CutlassType<kD>::type;
  static constexpr bool kSwap = Cfg::kSwap;
  // Kernel operands: with swap-AB the kernel's A is the user's B and vice versa.
  using KElA = std::conditional_t<kSwap, ElB, ElA>;
  using KElB = std::conditional_t<kSwap, ElA, ElB>;
  using LayoutA = cutlass::layout::RowMajor;     // (kM, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, kN) stored as (kN, K), K contiguous
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;                              // 16 bytes of fp8
  static constexpr int kAlignD = 16 / sizeof(ElD);                 // 16 bytes of output
  using Tile = typename Cfg::Tile;

  // Scale vectors: dynamic broadcast (bool stride: vector or scalar), alignment 1 so any
  // M/N works. Kernel-col vector varies along kernel M, kernel-row vector along kernel N.
  using ColScale = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, Tile, float, float, Stride<bool, _0, int64_t>, 1>;
  using RowScale = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, Tile, float, float, Stride<_0, bool, int64_t>, 1>;
  // Bias runs along the user's N: kernel rows when swapped, kernel columns otherwise.
  using Bias = std::conditional_t<
      kSwap,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElD, float, Stride<_1, _0, int64_t>, 1>,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElD, float, Stride<_0, _1, int64_t>, 1>>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Mul = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Add = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElD, float, kRound>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      Mul, ColScale,
      cutlass::epilogue::fusion::Sm90EVT<Mul, RowScale, cutlass::epilogue::fusion::Sm90AccFetch>>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Add, Scaled, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD,  // no C operand
      ElD, LayoutD, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, KElA, LayoutA, kAlignAB, KElB, LayoutB,
      kAlignAB, float, Tile, typename Cfg::Cluster,
      std::conditional_t<(Cfg::kStages > 0), cutlass::gemm::collective::StageCount<Cfg::kStages>,
                         cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
                             sizeof(typename CollectiveEpilogue::SharedStorage))>>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using BaseKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                           CollectiveEpilogue, typename Cfg::TileScheduler>;
  using GemmKernel = std::conditional_t<(Cfg::kMinBlocks > 1),
                                        WithLaunchMinBlocks<BaseKernel, Cfg::kMinBlocks>, BaseKernel>;
  using Arguments = typename GemmKernel::Arguments;

  static Arguments make_arguments(const GemmArgs& g) {
    Arguments args = cutlass_host::gemm_arguments<kSwap, GemmKernel, KElA, KElB, ElD>(g);
    // Kernel-col scale varies along kernel M; kernel-row along kernel N.
    const float* col_ptr = kSwap ? g.b_scale : g.a_scale;
    const bool col_vec = kSwap ? g.b_scale_per_col : g.a_scale_per_row;
    const float* row_ptr = kSwap ? g.a_scale : g.b_scale;
    const bool row_vec = kSwap ? g.a_scale_per_row : g.b_scale_per_col;
    auto& fusion = args.epilogue.thread;
    // Fusion = Add(Scaled(ColScale, Mul(RowScale, Acc)), Bias)
    // EVT arguments list children first, then the node: op_0, op_1, op_2.
    auto& scaled = fusion.op_0;
    auto& colscale = scaled.op_0;
    colscale.ptr_col = col_ptr;
    colscale.null_default = 1.f;
    colscale.dCol = {col_vec, _0{}, int64_t(0)};
    auto& inner = scaled.op_1;
    auto& rowscale = inner.op_0;
    rowscale.ptr_row = row_ptr;
    rowscale.null_default = 1.f;
    rowscale.dRow = {_0{}, row_vec, int64_t(0)};
    cutlass_host::set_bias_args<kSwap, ElD>(fusion.op_1, g);
    cutlass_host::set_scheduler_args<Cfg::kStreamK>(args, g);
    return args;
  }

  static const char* can_implement(const GemmArgs& g) {
    if (const char* msg = cutlass_host::check_scheduler_args<Cfg::kStreamK>(g)) return msg;
    return cutlass_host::cutlass_can_implement<GemmKernel>(make_arguments(g));
  }

  static size_t workspace_size(const GemmArgs& g) {
    return GemmKernel::get_workspace_size(make_arguments(g));
  }

  // Host work per call is kept small: the kernel Params are cached per thread, keyed by the
  // whole argument set (params_cache.cuh); `same` is the key equality.

  static bool same(const GemmArgs& x, const GemmArgs& y) {
    return cutlass_host::same_scheduler_args(x, y) && x.a_scale == y.a_scale && x.b_scale == y.b_scale &&
           x.a_scale_per_row == y.a_scale_per_row && x.b_scale_per_col == y.b_scale_per_col;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    return run_cached<GemmKernel>(g, &same, &make_arguments, stream);
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<Sm90Fp8Gemm>(name, kA, kB, kD);
  }
};

}  // namespace jax_gmma::sm90
