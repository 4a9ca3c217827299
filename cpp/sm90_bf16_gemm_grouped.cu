// Kernel family: grouped (mixture-of-experts) bfloat16 GEMM on Hopper (sm_90a) for prefill
// ("grouped_bf16_<tile>" configs): CUTLASS's sm90 grouped (ptr-array) GEMM on bfloat16 operands,
// float32 accumulation.
//
//   D[m, n] = alpha_e * sum_k A[m, k] * B_e[n, k]  (+ bias_e[n])
//
// for row m of expert e, in float32 with one rounding to D. jax_gmma.ragged_dot feeds it the
// exact bfloat16 form of block-scaled experts whose scales Hopper's tensor cores cannot apply per
// 32 of K (MXFP8: an e4m3 element times its power-of-two scale is exact in bfloat16; FP4 / FP6
// PackedWeight experts unpacked without their float32 global scale, which is alpha_e), so
// prefill runs on the bf16 tensor cores instead of re-reading each expert's weights per 16
// tokens.
//
// Operands (the contract of cpp/sm90_fp8_gemm_grouped_blockwise.cu without the scales): A (M, K)
// bfloat16 tokens sorted by expert, K-major; B (G, N, K) bfloat16, the experts back to back;
// alpha (G,) float32 on the device (GemmArgs::b_global_scale; nullptr: every alpha_e is 1);
// group_sizes (G,) int32 on the device: expert e takes the global rows [end_e - size_e, end_e),
// end = cumsum(group_sizes), and A's row 0 is global row row_ids[0] (on the device). Rows past
// the groups' total come out zero; a negative group size makes every row NaN (no expert runs).
// D (M, N) bfloat16 or float32 row-major; bias (G, N) in D's dtype, added in float32.
//
// Graph safety, workspace and Params caching: as the FP8 grouped family (a setup kernel writes
// each expert's shape, operand addresses and strides into the XLA-owned workspace from the group
// sizes on the device; then one persistent CUTLASS grouped kernel; two launches a call).
//
// Tiles: 128x256x64 cooperative (two consumer warpgroups on one tile: the bf16 tensor cores'
// best shape for experts with hundreds of rows) and 64x128x64 ping-pong (experts with few
// rows). K % 8 == 0 (TMA: 16-byte rows of A and B), N % 8 (bf16 D) or N % 4 (f32 D).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "jax_gmma/gemm_api.h"
#include "jax_gmma/group_setup.cuh"
#include "cutlass_gemm_host.cuh"
#include "cutlass_grouped_host.cuh"

namespace jax_gmma::sm90_grouped_bf16 {
namespace {

using namespace cute;
using cutlass_host::CutlassType;

constexpr int kSetupThreads = 256;  // the setup kernel's CTA

template <class Tile_, class Kernel_, class Epi_>
struct Config {
  using Tile = Tile_;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epi_;
};
using CfgCoop = Config<Shape<_128, _256, _64>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using CfgPp64 = Config<Shape<_64, _128, _64>, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) grouped_setup_kernel(const typename Gemm::Setup s);

template <DType kD, class Cfg>
struct Sm90Bf16GroupedGemm : cutlass_host::GroupedHost<Sm90Bf16GroupedGemm<kD, Cfg>> {
  using Host = cutlass_host::GroupedHost<Sm90Bf16GroupedGemm>;
  using ElA = cutlass::bfloat16_t;
  using ElB = cutlass::bfloat16_t;
  using ElD = typename CutlassType<kD>::type;
  using LayoutA = cutlass::layout::RowMajor;     // (M_e, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) stored as (N, K), K contiguous
  using LayoutD = cutlass::layout::RowMajor;     // (M_e, N)
  static constexpr int kAlignAB = 8;                // 16 bytes of bf16
  static constexpr int kAlignD = 16 / sizeof(ElD);  // 16 bytes of output
  using Tile = typename Cfg::Tile;
  using Cluster = Shape<_1, _1, _1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ExpertShape = typename ProblemShape::UnderlyingProblemShape;

  // Epilogue: D = cast(alpha_e * acc + bias_e): alpha_e read from the (G,) array at the group
  // index (the tile's L coordinate), bias_e from a per-expert pointer array.
  using Alpha = cutlass::epilogue::fusion::Sm90ScalarBroadcastPtrArray<float, Stride<_0, _0, int64_t>>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElD*, float, Stride<_0, _1, _0>, 1>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Scale = cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Add = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElD, float, kRound>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<Scale, cutlass::epilogue::fusion::Sm90AccFetch, Alpha>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Add, Scaled, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no C operand
      ElD, LayoutD*, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElA, LayoutA*, kAlignAB, ElB, LayoutB*,
      kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Arguments = typename GemmKernel::Arguments;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;

  // The per-expert arrays of the workspace (G entries each, every array 128-byte aligned),
  // followed by CUTLASS's own workspace (per-SM TMA descriptors).
  struct Arrays {
    ExpertShape* shapes;
    const ElA** a;
    const ElB** b;
    ElD** d;
    const ElD** bias;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
    void* cutlass;
  };

  // Carves the arrays for g's G experts from `base` (128-byte aligned); returns the offset where
  // CUTLASS's workspace starts (also w->cutlass). base = 0 sizes them.
  static size_t carve(const GemmArgs& g, uintptr_t base, Arrays* w) {
    return cutlass_host::WorkspaceCarver(base, g.groups)
        .per_expert(w->shapes, w->a, w->b, w->d, w->bias, w->stride_a, w->stride_b, w->stride_d)
        .finish(&w->cutlass);
  }

  // The setup kernel's parameters.
  struct Setup {
    const int32_t* sizes;
    const int32_t* row_ids;
    int64_t groups, m, n, k;
    const ElA* a;
    const ElB* b;
    ElD* d;
    const ElD* bias;
    Arrays w;
  };

  static Arguments make_arguments(const GemmArgs& g, const Arrays& w, int sms) {
    Arguments args;
    cutlass_host::set_grouped_arguments</*kScales=*/false>(args, g, w, sms);
    // Fusion = Add(Scale(Acc, Alpha), Bias): children op_0 (its own op_0, op_1), op_1. A null
    // bias array means no bias (adds 0).
    args.epilogue.thread.op_0.op_1.scalars[0] = 1.f;  // read when there is no array
    args.epilogue.thread.op_0.op_1.scalar_ptrs[0] = g.b_global_scale;
    args.epilogue.thread.op_0.op_1.dScalar[0] = Stride<_0, _0, int64_t>{_0{}, _0{}, 1};
    args.epilogue.thread.op_1.ptr_row = g.bias ? w.bias : nullptr;
    args.epilogue.thread.op_1.null_default = ElD(0);
    return args;
  }

  static const char* check(const GemmArgs& g) {
    if (const char* msg = cutlass_host::check_grouped_args(g, kAlignD)) return msg;
    if (g.k % kAlignAB) return "K must be a multiple of 8 (TMA: 16-byte rows of A and B)";
    return nullptr;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    Arrays w;
    int sms = 0;
    if (cudaError_t err = Host::prepare_run(g, &w, &sms); err != cudaSuccess) return err;

    Setup s;
    s.sizes = g.group_sizes;
    s.row_ids = g.row_ids;
    s.groups = g.groups;
    s.m = g.m;
    s.n = g.n;
    s.k = g.k;
    s.a = static_cast<const ElA*>(g.a);
    s.b = static_cast<const ElB*>(g.b);
    s.d = static_cast<ElD*>(g.d);
    s.bias = static_cast<const ElD*>(g.bias);
    s.w = w;
    grouped_setup_kernel<Sm90Bf16GroupedGemm>
        <<<cutlass_host::grouped_setup_ctas(g, sizeof(ElD), kSetupThreads, sms), kSetupThreads, 0,
           stream>>>(s);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

    return Host::launch(g, w, sms, stream);
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<Sm90Bf16GroupedGemm>(name, DType::kBF16, DType::kBF16, kD);
  }
};

// The setup kernel: CTA 0 writes each expert's arrays, the others the rows past the total.
template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) grouped_setup_kernel(const typename Gemm::Setup s) {
  const int64_t r0 = __ldg(s.row_ids);
  int64_t total;
  bool negative;
  group_setup::group_total<kSetupThreads>(s.sizes, s.groups, &total, &negative);
  if (blockIdx.x > 0) {
    group_setup::fill_rows_past_total<kSetupThreads>(s.d, s.m, s.n, total, r0, negative);
    return;
  }
  const typename Gemm::Arrays& w = s.w;
  group_setup::for_each_expert<kSetupThreads>(
      s.sizes, s.groups, r0, s.m, negative, [&](int64_t e, int64_t lo, int64_t me) {
        w.shapes[e] = make_shape(static_cast<int>(me), static_cast<int>(s.n), static_cast<int>(s.k));
        w.a[e] = s.a + lo * s.k;
        w.b[e] = s.b + e * s.n * s.k;
        w.d[e] = s.d + lo * s.n;
        w.bias[e] = s.bias ? s.bias + e * s.n : nullptr;
        const auto shape_a = make_shape(static_cast<int>(me), static_cast<int>(s.k), 1);
        const auto shape_b = make_shape(static_cast<int>(s.n), static_cast<int>(s.k), 1);
        const auto shape_d = make_shape(static_cast<int>(me), static_cast<int>(s.n), 1);
        w.stride_a[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideA{}, shape_a);
        w.stride_b[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideB{}, shape_b);
        w.stride_d[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideD{}, shape_d);
      });
}

}  // namespace
}  // namespace jax_gmma::sm90_grouped_bf16

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): the 128x256 cooperative and 64x128
// ping-pong tiles, each for bfloat16 and float32 output.
int sm90_bf16_grouped_entries(KernelEntry* out) {
  using namespace sm90_grouped_bf16;
  int n = 0;
#define JG_ENTRY(name, cfg)                                                 \
  out[n++] = Sm90Bf16GroupedGemm<DType::kBF16, cfg>::entry(name);           \
  out[n++] = Sm90Bf16GroupedGemm<DType::kF32, cfg>::entry(name);
  JG_ENTRY("grouped_bf16_128x256x64_coop", CfgCoop)
  JG_ENTRY("grouped_bf16_64x128x64_pingpong", CfgPp64)
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
