// Kernel family: Hopper (sm_90a) block-scaled FP8 GEMM, DeepSeek-V3 style ("blockwise").
//
//   D[m, n] = sum_kb  sa[m, kb] * sb[n / G, kb] * sum_{k in block kb} A[m, k] * B[n, k]  (+ bias[n])
//
// with 128-wide K blocks and float32 scales: A has 1x128 scales (one per row and K block), B
// has 128x128 scales (G = 128, variant "1d2d") or 1x128 scales (G = 1, variant "1d1d", what
// jax.nn.scaled_matmul with block size 128 computes).
//
// Mainloop: CUTLASS's sm90 FP8 blockwise-scaling collective (TMA + warp-specialized wgmma /
// QGMMA). Each 128-wide K tile is accumulated in the tensor cores' accumulators, then promoted
// into a float32 accumulator multiplied by the tile's scales (sa * sb), so scales are applied
// in fp32 in the mainloop, once per 128 of K. The epilogue is D = cast(acc + bias).
//
// Scale memory layout read by the kernels (the collective supports only MN-major scales on
// sm90): each scale matrix with `rows` rows (M for A; ceil(N/128) or N for B) and
// kb = ceil(K/128) K blocks is stored transposed, scale (r, kb) at [kb * ld + r], with the
// leading dimension ld = round_up(rows, 4) (16-byte aligned columns, so the collective may load
// it with TMA). The padding feeds only rows past the problem's edge, which are never stored.
// `block_scale_ld()` (gemm_api.h) is the rule; jax_gmma/blockwise.py produces this layout.
//
// Swap-AB configs (decode, M <= 64) compute D^T = B A^T: the weights become the kernel's A
// (with their 128x128 or 1x128 scales), the few tokens the kernel's N tile, whose scales then
// have granularity 1 along the kernel's N. With 128x128 weight scales the kernel's M tile must
// be a multiple of 128 (the collective requires the scale granularity to divide the tile), so
// the 64-row ping-pong swap tiles exist only for the 1d1d variant.
#pragma once

#include <memory>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "jax_gmma/gemm_api.h"
#include "cutlass_gemm_host.cuh"
#include "params_cache.cuh"

namespace jax_gmma::sm90_blockwise {

using namespace cute;
using cutlass_host::CutlassType;

// Scale granularity of the weight operand (user B): 128 rows ("1d2d") or 1 row ("1d1d").
enum class Variant { k1d2d, k1d1d };

constexpr int kScaleK = 128;  // K block of every scale (the collective needs >= 128 for fp8)

// ---------------------------------------------------------------------------------------
// Configs. Names must match jax_gmma/blockwise_configs.py.
// ---------------------------------------------------------------------------------------
namespace sched = cutlass::gemm;
namespace epi = cutlass::epilogue;

template <class Tile_, class Cluster_, class Kernel_, class Epi_, class Scheduler_, bool kSwap_>
struct Config {
  using Tile = Tile_;
  using Cluster = Cluster_;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epi_;
  using TileScheduler = Scheduler_;
  static constexpr bool kSwap = kSwap_;
  static constexpr bool kStreamK = std::is_same_v<Scheduler_, cutlass::gemm::StreamKScheduler>;
};

// Large M: 128x128 cooperative (each consumer warpgroup 64x128 outputs plus the fp32
// promotion accumulator), data-parallel persistent or stream-K/split-K; 64x128 ping-pong.
using CfgCoop = Config<Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                       sched::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                       epi::TmaWarpSpecializedCooperative, void, false>;
using CfgCoopSk = Config<Shape<_128, _128, _128>, Shape<_1, _1, _1>,
                         sched::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                         epi::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler, false>;
using CfgPp64 = Config<Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                       sched::KernelTmaWarpSpecializedPingpongFP8BlockScaledAccum,
                       epi::TmaWarpSpecialized, void, false>;
// Decode (swap-AB): weights along the kernel's M, tokens are a 16/32/64-wide N tile.
template <int TN>
using CfgSwapCoopSk = Config<Shape<_128, Int<TN>, _128>, Shape<_1, _1, _1>,
                             sched::KernelTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                             epi::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler,
                             true>;
template <int TN>
using CfgSwapPp = Config<Shape<_64, Int<TN>, _128>, Shape<_1, _1, _1>,
                         sched::KernelTmaWarpSpecializedPingpongFP8BlockScaledAccum,
                         epi::TmaWarpSpecialized, void, true>;

// ---------------------------------------------------------------------------------------
// The kernel for one (A, B, D) dtype triple, scale variant and config.
// ---------------------------------------------------------------------------------------
template <DType kA, DType kB, DType kD, Variant kVariant, class Cfg>
struct Sm90Fp8BlockwiseGemm {
  using ElA = typename CutlassType<kA>::type;  // user A (M, K): activations, 1x128 scales
  using ElB = typename CutlassType<kB>::type;  // user B (N, K): weights, 128x128 or 1x128 scales
  using ElD = typename CutlassType<kD>::type;
  static constexpr bool kSwap = Cfg::kSwap;
  static constexpr int kGranB = kVariant == Variant::k1d2d ? 128 : 1;  // user-B scale rows
  // Kernel operands: with swap-AB the kernel's A is the user's B and vice versa.
  using KElA = std::conditional_t<kSwap, ElB, ElA>;
  using KElB = std::conditional_t<kSwap, ElA, ElB>;
  static constexpr int kGranKM = kSwap ? kGranB : 1;  // scale granularity along kernel M
  static constexpr int kGranKN = kSwap ? 1 : kGranB;  // ... along kernel N
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<kGranKM, kGranKN, kScaleK>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using LayoutA = cutlass::layout::RowMajor;     // (kM, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, kN) stored as (kN, K), K contiguous
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;               // 16 bytes of fp8
  static constexpr int kAlignD = 16 / sizeof(ElD);  // 16 bytes of output
  using Tile = typename Cfg::Tile;

  // Epilogue: D = cast(acc + bias); bias runs along the user's N (kernel rows when swapped).
  using Bias = std::conditional_t<
      kSwap,
      cutlass::epilogue::fusion::Sm90ColBroadcast<0, Tile, ElD, float, Stride<_1, _0, int64_t>, 1>,
      cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElD, float, Stride<_0, _1, int64_t>, 1>>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Add = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElD, float, kRound>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Add, cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD,  // no C operand
      ElD, LayoutD, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, KElA, cute::tuple<LayoutA, LayoutSFA>,
      kAlignAB, KElB, cute::tuple<LayoutB, LayoutSFB>, kAlignAB, float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, typename Cfg::TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename GemmKernel::Arguments;

  // MN-major scale layout ((G, ld), (128, kb), 1) with column stride ld. The layout covers the
  // padded rows too (ld >= ceil(kmn / G), a multiple of 4): CUTLASS checks that a TMA-loaded
  // scale matrix has a multiple of 4 rows, and the padding only feeds rows past the problem's
  // edge, which are never stored.
  template <class L, int G>
  static L scale_layout(int64_t k, int64_t ld) {
    const int kb = static_cast<int>((k + kScaleK - 1) / kScaleK);
    const int lda = static_cast<int>(ld);
    return make_layout(make_shape(make_shape(Int<G>{}, lda), make_shape(Int<kScaleK>{}, kb), 1),
                       make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, lda), lda * kb));
  }

  static Arguments make_arguments(const GemmArgs& g) {
    Arguments args = cutlass_host::gemm_arguments<kSwap, GemmKernel, KElA, KElB, ElD>(g);
    args.mainloop.ptr_SFA = kSwap ? g.b_block_scale : g.a_block_scale;
    args.mainloop.layout_SFA =
        scale_layout<LayoutSFA, kGranKM>(g.k, kSwap ? g.b_block_scale_ld : g.a_block_scale_ld);
    args.mainloop.ptr_SFB = kSwap ? g.a_block_scale : g.b_block_scale;
    args.mainloop.layout_SFB =
        scale_layout<LayoutSFB, kGranKN>(g.k, kSwap ? g.a_block_scale_ld : g.b_block_scale_ld);
    // Fusion = Add(Acc, Bias): children op_0, op_1.
    cutlass_host::set_bias_args<kSwap, ElD>(args.epilogue.thread.op_1, g);
    cutlass_host::set_scheduler_args<Cfg::kStreamK>(args, g);
    return args;
  }

  static const char* can_implement(const GemmArgs& g) {
    if (const char* msg = cutlass_host::check_scheduler_args<Cfg::kStreamK>(g)) return msg;
    if (!g.a_block_scale || !g.b_block_scale)
      return "block-scaled kernel called without block scales (wrong handler?)";
    const int64_t rows_b = (g.n + kGranB - 1) / kGranB;
    if (g.a_block_scale_ld < g.m || g.a_block_scale_ld % 4 || g.b_block_scale_ld < rows_b ||
        g.b_block_scale_ld % 4)
      return "scale leading dimensions must be >= rows and multiples of 4";
    return cutlass_host::cutlass_can_implement<GemmKernel>(make_arguments(g));
  }

  static size_t workspace_size(const GemmArgs& g) {
    return GemmKernel::get_workspace_size(make_arguments(g));
  }

  // Kernel Params cached per thread, keyed by the whole argument set (as Sm90Fp8Gemm does):
  // in steady state a call only enqueues the workspace memset (split-K) and the launch.

  static bool same(const GemmArgs& x, const GemmArgs& y) {
    return cutlass_host::same_scheduler_args(x, y) && x.a_block_scale == y.a_block_scale &&
           x.b_block_scale == y.b_block_scale && x.a_block_scale_ld == y.a_block_scale_ld &&
           x.b_block_scale_ld == y.b_block_scale_ld;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    if (!g.a_block_scale || !g.b_block_scale) return cudaErrorInvalidValue;
    return run_cached<GemmKernel>(g, &same, &make_arguments, stream);
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<Sm90Fp8BlockwiseGemm>(name, kA, kB, kD);
  }
};

}  // namespace jax_gmma::sm90_blockwise
