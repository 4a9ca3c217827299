// Kernel family: Blackwell block-scaled ("microscaling") GEMMs, sm_100a (B200/GB200, tcgen05
// UMMA with scale factors in tensor memory) and sm_120a (RTX 50 / RTX PRO, warp-level
// block-scaled MMA), for the OCP MX formats and NVIDIA's NVFP4:
//
//   D[m, n] = alpha * sum_kb  sfa[m, kb] * sfb[n, kb] * sum_{k in block kb} A[m, k] * B[n, k]  (+ bias[n])
//
// with K blocks of 32 (MX formats, E8M0 scales) or 16 (NVFP4, E4M3 scales), and
// alpha = a_global * b_global (NVFP4's float32 per-tensor scales, read on the device in the
// epilogue; 1 for the MX formats). The scale factors are multiplied in by the tensor cores
// (block-scaled MMA instructions); the epilogue computes D = cast(alpha * acc + bias).
//
// NOT RUN ON HARDWARE by this project: there is no Blackwell GPU here. These kernels are
// compiled, registered, checked on the host (can_implement, workspace) and their SASS is
// inspected (tools/check_sass.py), nothing more.
//
// Operands (user coordinates, gemm_api.h): A (M, K) and B (N, K), both K-major. FP8 elements
// are one per byte; FP6 elements are packed 4 per 3 bytes and FP4 2 per byte, element i at bit
// 6i / 4i of the row's little-endian bit stream (jax_gmma.quantize.pack_fp6 / pack_fp4).
// Scale factors: CUTLASS's Sm1xxBlockScaledConfig layout, i.e. jax_gmma's "sm100_128x4"
// swizzled layout (jax_gmma/layouts.py): rows padded to 128, K blocks to 4, 512-byte 128x4
// atoms, K-atom fastest; sfa covers M rows, sfb N rows.
//
// The same template serves both archs; the config (cpp/sm100_mx_gemm_blockscaled_inst.cuh,
// cpp/sm120_mx_gemm_blockscaled_inst.cuh) picks the arch tag, tile, cluster and schedules.
#pragma once

#include <memory>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/float_subbyte.h>
#include <cutlass/detail/sm100_blockscaled_layout.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "jax_gmma/gemm_api.h"
#include "cutlass_gemm_host.cuh"
#include "params_cache.cuh"

namespace jax_gmma::sm1xx_mx {

using namespace cute;

template <DType T> struct OutType;
template <> struct OutType<DType::kBF16> { using type = cutlass::bfloat16_t; };
template <> struct OutType<DType::kF32> { using type = float; };

// Operand formats: the CUTLASS block-scaled wrapper type, the DType at the interface, the
// scale-vector size, and the operand alignment (elements) the builder requires.
//  * FP8 elements: 16 elements (16 bytes).
//  * FP4/FP6 elements inside the f8f6f4 MMA kind (mixed with FP8, or MXFP6): 128 elements.
//  * FP4 elements of the mxf4 / nvf4 MMA kinds: 32 elements (16 bytes).
struct MxF8E4M3 { using type = cutlass::mx_float8_t<cutlass::float_e4m3_t>; static constexpr DType dt = DType::kF8E4M3; static constexpr int vec = 32; static constexpr int align = 16; };
struct MxF6E2M3 { using type = cutlass::mx_float6_t<cutlass::float_e2m3_t>; static constexpr DType dt = DType::kF6E2M3; static constexpr int vec = 32; static constexpr int align = 128; };
struct MxF6E3M2 { using type = cutlass::mx_float6_t<cutlass::float_e3m2_t>; static constexpr DType dt = DType::kF6E3M2; static constexpr int vec = 32; static constexpr int align = 128; };
struct MxF4F8f6f4 { using type = cutlass::mx_float4_t<cutlass::float_e2m1_t>; static constexpr DType dt = DType::kF4E2M1; static constexpr int vec = 32; static constexpr int align = 128; };
struct MxF4 { using type = cutlass::mx_float4_t<cutlass::float_e2m1_t>; static constexpr DType dt = DType::kF4E2M1; static constexpr int vec = 32; static constexpr int align = 32; };
struct NvF4 { using type = cutlass::nv_float4_t<cutlass::float_e2m1_t>; static constexpr DType dt = DType::kF4E2M1; static constexpr int vec = 16; static constexpr int align = 32; };

// A config: arch tag and number, MMA tile (M x N x K of one MMA group: for 2-SM configs the
// pair of SMs), cluster, mainloop and epilogue schedules.
template <class Arch_, int kArch_, class Tile_, class Cluster_, class Kernel_, class Epi_>
struct Config {
  using Arch = Arch_;
  static constexpr int kArch = kArch_;
  using Tile = Tile_;
  using Cluster = Cluster_;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epi_;
  static constexpr int kTileM = decltype(size<0>(Tile_{}))::value;
  static constexpr int kTileN = decltype(size<1>(Tile_{}))::value;
  static constexpr int kTileK = decltype(size<2>(Tile_{}))::value;
  static constexpr bool k2Sm = kArch_ == 100 && decltype(size<0>(Cluster_{}))::value == 2;
  // Tile of one CTA (2-SM MMA: each SM owns half of the MMA tile's M).
  using CtaTile = Shape<Int<kTileM / (k2Sm ? 2 : 1)>, Int<kTileN>, Int<kTileK>>;
};

// ---------------------------------------------------------------------------------------
// The kernel for one (A format, B format, D dtype, config).
// ---------------------------------------------------------------------------------------
template <class FA, class FB, DType kD, class Cfg>
struct MxGemm {
  static_assert(FA::vec == FB::vec, "A and B must share the scale-vector size");
  using ElA = typename FA::type;
  using ElB = typename FB::type;
  using ElD = typename OutType<kD>::type;
  using LayoutA = cutlass::layout::RowMajor;     // (M, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) stored as (N, K), K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 16 / sizeof(ElD);  // 16-byte output rows
  using Tile = typename Cfg::Tile;
  using CtaTile = typename Cfg::CtaTile;

  // Epilogue: D = cast(alpha * acc + bias), alpha = product of two device scalars (NVFP4's
  // global scales; nullptr pointers read as 1), bias a row vector along N (or 0).
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Alpha = cutlass::epilogue::fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>, 2>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, CtaTile, ElD, float, Stride<_0, _1, int64_t>, 1>;
  using Fma = cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElD, float, kRound>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Fma, Alpha, cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      typename Cfg::Arch, cutlass::arch::OpClassBlockScaledTensorOp, Tile, typename Cfg::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD,  // no C operand
      ElD, LayoutD, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      typename Cfg::Arch, cutlass::arch::OpClassBlockScaledTensorOp, ElA, LayoutA, FA::align, ElB,
      LayoutB, FB::align, float, Tile, typename Cfg::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, void>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using Arguments = typename GemmKernel::Arguments;
  using SfConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElSF = typename ElA::ScaleFactorType;
  using DataA = typename ElA::DataType;
  using DataB = typename ElB::DataType;

  static Arguments make_arguments(const GemmArgs& g) {
    const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideD = typename GemmKernel::StrideD;
    Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {m, n, k, 1};
    args.mainloop.ptr_A = static_cast<const DataA*>(g.a);
    args.mainloop.dA = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1));
    args.mainloop.ptr_B = static_cast<const DataB*>(g.b);
    args.mainloop.dB = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, k, 1));
    args.mainloop.ptr_SFA = static_cast<const ElSF*>(g.a_sf);
    args.mainloop.layout_SFA = SfConfig::tile_atom_to_shape_SFA(cute::make_shape(m, n, k, 1));
    args.mainloop.ptr_SFB = static_cast<const ElSF*>(g.b_sf);
    args.mainloop.layout_SFB = SfConfig::tile_atom_to_shape_SFB(cute::make_shape(m, n, k, 1));
    StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1));
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = sd;
    args.epilogue.ptr_D = static_cast<ElD*>(g.d);
    args.epilogue.dD = sd;
    // Fusion = Fma(Alpha, Acc, Bias): children op_0, op_1, op_2.
    auto& alpha = args.epilogue.thread.op_0;
    alpha.scalars[0] = 1.f;
    alpha.scalars[1] = 1.f;
    alpha.scalar_ptrs[0] = g.a_global_scale;  // nullptr -> scalars[0]
    alpha.scalar_ptrs[1] = g.b_global_scale;
    auto& bias = args.epilogue.thread.op_2;
    bias.ptr_row = static_cast<const ElD*>(g.bias);
    bias.null_default = ElD(0);
    args.hw_info.device_id = g.device;
    args.hw_info.sm_count = g.sm_count;
    return args;
  }

  static const char* can_implement(const GemmArgs& g) {
    if (g.splits != 1) return "block-scaled MX/NV kernels do not split K (splits must be 1)";
    if (!g.a_sf || !g.b_sf) return "block-scaled kernel called without scale factors (wrong handler?)";
    if (g.k % FA::vec) return "K must be a multiple of the scale block (32 MX, 16 NVFP4)";
    if (g.k % FA::align || g.k % FB::align)
      return "K is not a multiple of the operands' alignment (16 fp8, 32 fp4, 128 fp4/fp6 mixed with fp8)";
    return cutlass_host::cutlass_can_implement<GemmKernel>(make_arguments(g));
  }

  static size_t workspace_size(const GemmArgs& g) { return GemmKernel::get_workspace_size(make_arguments(g)); }

  // Kernel Params cached per thread, keyed by the whole argument set (params_cache.cuh, as the
  // sm90 families); launched by CUTLASS's adapter (cluster launch as the arch needs it).

  static bool same(const GemmArgs& x, const GemmArgs& y) {
    return cutlass_host::same_common_args(x, y) && x.a_sf == y.a_sf && x.b_sf == y.b_sf &&
           x.a_global_scale == y.a_global_scale && x.b_global_scale == y.b_global_scale;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    if (!g.a_sf || !g.b_sf) return cudaErrorInvalidValue;
    auto& e = thread_params_cache<GemmKernel>().lookup(g, &same, [&](auto& entry) {
      entry.params = GemmKernel::to_underlying_arguments(make_arguments(g), g.workspace);
    });
    cutlass::Status st = Gemm::run(e.params, stream);
    if (st != cutlass::Status::kSuccess) return cudaErrorLaunchFailure;
    return cudaPeekAtLastError();
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<MxGemm>(name, FA::dt, FB::dt, kD, Cfg::kArch);
  }
};

}  // namespace jax_gmma::sm1xx_mx
