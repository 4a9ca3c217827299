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
#include "params_cache.cuh"

namespace jax_gmma::sm90_blockwise {

using namespace cute;

template <DType T> struct CutlassType;
template <> struct CutlassType<DType::kF8E4M3> { using type = cutlass::float_e4m3_t; };
template <> struct CutlassType<DType::kF8E5M2> { using type = cutlass::float_e5m2_t; };
template <> struct CutlassType<DType::kBF16> { using type = cutlass::bfloat16_t; };
template <> struct CutlassType<DType::kF16> { using type = cutlass::half_t; };
template <> struct CutlassType<DType::kF32> { using type = float; };

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
    const int km = static_cast<int>(kSwap ? g.n : g.m);
    const int kn = static_cast<int>(kSwap ? g.m : g.n);
    const int k = static_cast<int>(g.k);
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideD = typename GemmKernel::StrideD;
    StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(km, k, 1));
    StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(kn, k, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(km, kn, 1));

    Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {km, kn, k, 1};
    args.mainloop.ptr_A = static_cast<const KElA*>(kSwap ? g.b : g.a);
    args.mainloop.dA = sa;
    args.mainloop.ptr_B = static_cast<const KElB*>(kSwap ? g.a : g.b);
    args.mainloop.dB = sb;
    args.mainloop.ptr_SFA = kSwap ? g.b_block_scale : g.a_block_scale;
    args.mainloop.layout_SFA =
        scale_layout<LayoutSFA, kGranKM>(k, kSwap ? g.b_block_scale_ld : g.a_block_scale_ld);
    args.mainloop.ptr_SFB = kSwap ? g.a_block_scale : g.b_block_scale;
    args.mainloop.layout_SFB =
        scale_layout<LayoutSFB, kGranKN>(k, kSwap ? g.a_block_scale_ld : g.b_block_scale_ld);
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = static_cast<ElD*>(g.d);
    args.epilogue.dD = sd;
    auto& bias = args.epilogue.thread.op_1;  // Fusion = Add(Acc, Bias): children op_0, op_1
    if constexpr (kSwap) {
      bias.ptr_col = static_cast<const ElD*>(g.bias);
      bias.null_default = ElD(0);
    } else {
      bias.ptr_row = static_cast<const ElD*>(g.bias);
      bias.null_default = ElD(0);
    }
    args.hw_info.device_id = g.device;
    args.hw_info.sm_count = g.sm_count;
    using Raster = decltype(args.scheduler.raster_order);
    args.scheduler.max_swizzle_size = g.swizzle;
    args.scheduler.raster_order = g.raster == 1   ? Raster::AlongM
                                  : g.raster == 2 ? Raster::AlongN
                                                  : Raster::Heuristic;
    if constexpr (Cfg::kStreamK) {
      using Decomp = cutlass::gemm::kernel::detail::DecompositionMode;
      using Reduce = cutlass::gemm::kernel::detail::ReductionMode;
      // splits: 0 = CUTLASS's stream-K heuristic, 1 = data-parallel, > 1 = split-K.
      args.scheduler.splits = g.splits > 1 ? g.splits : 1;
      args.scheduler.decomposition_mode = g.splits == 0   ? Decomp::Heuristic
                                          : g.splits > 1 ? Decomp::SplitK
                                                         : Decomp::DataParallel;
      // Deterministic turnstile reduction: results are bit-identical run to run.
      args.scheduler.reduction_mode = Reduce::Deterministic;
    }
    return args;
  }

  static const char* can_implement(const GemmArgs& g) {
    if constexpr (!Cfg::kStreamK) {
      if (g.splits != 1) return "this config does not split K (splits must be 1)";
    }
    if (g.splits < 0) return "splits must be >= 0";
    if (g.swizzle != 1 && g.swizzle != 2 && g.swizzle != 4 && g.swizzle != 8)
      return "swizzle must be 1, 2, 4 or 8";
    if (g.raster < 0 || g.raster > 2) return "raster must be 0 (heuristic), 1 (along M) or 2 (along N)";
    if (!g.a_block_scale || !g.b_block_scale)
      return "block-scaled kernel called without block scales (wrong handler?)";
    const int64_t rows_b = (g.n + kGranB - 1) / kGranB;
    if (g.a_block_scale_ld < g.m || g.a_block_scale_ld % 4 || g.b_block_scale_ld < rows_b ||
        g.b_block_scale_ld % 4)
      return "scale leading dimensions must be >= rows and multiples of 4";
    auto args = make_arguments(g);
    if (GemmKernel::can_implement(args)) return nullptr;
    return "CUTLASS can_implement rejected the problem (alignment or shape)";
  }

  static size_t workspace_size(const GemmArgs& g) {
    return GemmKernel::get_workspace_size(make_arguments(g));
  }

  static cudaError_t prepare() {
    constexpr int smem = GemmKernel::SharedStorageSize;
    if constexpr (smem >= (48 << 10)) {
      return cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    }
    return cudaSuccess;
  }

  // Kernel Params cached per thread, keyed by the whole argument set (as Sm90Fp8Gemm does):
  // in steady state a call only enqueues the workspace memset (split-K) and the launch.

  static bool same(const GemmArgs& x, const GemmArgs& y) {
    return x.m == y.m && x.n == y.n && x.k == y.k && x.a == y.a && x.b == y.b &&
           x.a_block_scale == y.a_block_scale && x.b_block_scale == y.b_block_scale &&
           x.a_block_scale_ld == y.a_block_scale_ld && x.b_block_scale_ld == y.b_block_scale_ld &&
           x.bias == y.bias && x.d == y.d && x.workspace == y.workspace &&
           x.workspace_bytes == y.workspace_bytes && x.splits == y.splits &&
           x.sm_count == y.sm_count && x.device == y.device && x.swizzle == y.swizzle &&
           x.raster == y.raster;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    if (!g.a_block_scale || !g.b_block_scale) return cudaErrorInvalidValue;
    return run_cached<GemmKernel>(g, &same, &make_arguments, stream);
  }

  static KernelEntry entry(const char* name) {
    return KernelEntry{name, kA, kB, kD, &can_implement, &workspace_size, &prepare, &run,
                       static_cast<int32_t>(GemmKernel::SharedStorageSize),
                       static_cast<int32_t>(GemmKernel::MaxThreadsPerBlock)};
  }
};

}  // namespace jax_gmma::sm90_blockwise
