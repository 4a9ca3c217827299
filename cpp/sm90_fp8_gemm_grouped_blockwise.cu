// Kernel family: grouped (mixture-of-experts) block-scaled FP8 GEMM on Hopper (sm_90a) for
// prefill, many tokens per expert ("grouped_blockwise_<variant>_<tile>" configs): CUTLASS's
// sm90 grouped (ptr-array) GEMM with the FP8 blockwise-scaling mainloop, DeepSeek-V3 semantics.
//
//   D[m, n] = sum_kb  sa[m, kb] * sb_e[n / R, kb] * sum_{k in block kb} A[m, k] * B_e[n, k]  (+ bias_e[n])
//
// for row m of expert e. Operands (the contract of cpp/sm90_fp8_gemm_grouped_stream.cu): A (M, K)
// float8_e4m3fn tokens sorted by expert, K-major; B (G, N, K) float8_e4m3fn, the experts back to
// back; group_sizes (G,) int32 on the device: expert e takes the global rows [end_e - size_e,
// end_e), end = cumsum(group_sizes), and A's row 0 is global row row_ids[0] (on the device).
// Rows past the groups' total come out zero. Scales float32 per 128 of K, MN-major (gemm_api.h's
// layout): A's 1x128 scales (kb, round_up(M, 4)), scale (m, j) at [j * ld_a + m]; B's per expert
// (G, kb, round_up(rows_b, 4)) with rows_b = ceil(N/128) (128x128 blocks, R = 128, "1d2d") or N
// (1x128 blocks, R = 1, "1d1d"). D (M, N) bfloat16 or float32 row-major; bias (G, N) in D's dtype.
// A negative group size (whose overlapping groups jax.lax.ragged_dot sums) is not multiplied:
// every row of D is NaN and no expert runs, so the result is detectably invalid.
//
// Graph safety: the host never reads the group sizes. Each call enqueues two kernels:
//  1. a setup kernel: CTA 0 reads group_sizes / row_ids and writes, into the workspace, each
//     expert's problem shape (M_e, N, K) -- M_e = its rows in this shard, 0 for an empty expert
//     or one outside the shard, 0 for all when a size is negative -- and the per-expert operand
//     arrays CUTLASS's grouped kernel reads: A / B / D / scale / bias pointers, strides and
//     scale layouts. The other CTAs (a grid sized from M and N only) fill the rows past the
//     total with zeros (every row with NaN when a size is negative);
//  2. CUTLASS's grouped kernel with device-only problem shapes (no host copy of them): a
//     persistent grid of sm_count CTAs whose group tile scheduler walks the experts' tiles
//     from the shapes in the workspace. An expert with M_e = 0 has no tiles (the scheduler
//     skips it); a tile's rows past M_e read zeros (TMA bounds) and are not stored.
// The kernel's Params depend only on the workspace address, G, the SM count, the raster order
// and whether there is a bias (every operand address lives in the workspace), so they are
// cached per thread like the dense kernels' (params_cache.cuh): a call is two launches.
//
// Scale layouts per expert: CUTLASS's grouped blockwise mainloop, as shipped, ignores its
// layout_SFA / layout_SFB arguments and takes each expert's scales as packed (leading dimension
// M_e for A's, ceil(N / R) for B's). Ours share A's leading dimension ld_a across the experts
// (expert e's 1x128 scales are sa + begin_e with stride ld_a: a pointer offset) and pad B's to
// round_up(rows_b, 4), so the mainloop is wrapped (PerGroupScaleMainloop) to build each
// expert's scale tensors from per-expert layouts the setup kernel writes: no scale is copied.
// The scales are loaded with 4-byte cp.async (not TMA), so any row offset is aligned.
//
// Bias: per expert through the epilogue's row broadcast in its array-of-pointers form (one
// bias row pointer per expert, in the workspace), added in float32 before the cast, as in the
// dense family.
//
// Tiles: 128x128x128 cooperative (two consumer warpgroups on one tile) and 64x128x128 ping-pong
// (two consumer warpgroups on alternating tiles: half the wasted rows when experts have few
// tokens). K % 16 == 0 (TMA rows of 16 bytes), N % 8 (bf16) or N % 4 (f32) (TMA rows of D).
// Workspace (workspace_size): about 124 bytes per expert plus 512 bytes per SM (CUTLASS's
// per-SM TMA descriptors), from G and the SM count only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/numeric_types.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
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

namespace jax_gmma::sm90_grouped_blockwise {
namespace {

using namespace cute;
using cutlass_host::CutlassType;

// Scale granularity of the weights: 128 rows ("1d2d") or 1 row ("1d1d").
enum class Variant { k1d2d, k1d1d };

constexpr int kScaleK = 128;       // K block of every scale
constexpr int kSetupThreads = 256;  // the setup kernel's CTA

// ---------------------------------------------------------------------------------------------
// The mainloop: CUTLASS's grouped FP8 blockwise-scaling collective whose scale tensors come from
// the per-expert layouts (Params::layout_SFA / layout_SFB, device arrays indexed by the expert)
// instead of packed layouts derived from the expert's problem shape. The kernel calls load_init
// once (a placeholder: its scale tensors are never read) and tensors_perform_update before the
// first tile of every expert; both return the same tuple type. Everything else is the base's.
// ---------------------------------------------------------------------------------------------
template <class Base>
struct PerGroupScaleMainloop : Base {
  using Params = typename Base::Params;
  using ExpertLayoutSFA = typename Base::InternalLayoutSFA;
  using ExpertLayoutSFB = typename Base::InternalLayoutSFB;
  using Scale = typename Base::ElementBlockScale;

  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto with_scales(ProblemShapeMNKL const& shape, Params const& p, Scale const* sfa,
                                  ExpertLayoutSFA const& lsfa, Scale const* sfb,
                                  ExpertLayoutSFB const& lsfb) const {
    auto ab = Base::load_init(shape, p);  // the TMA tensors of A and B
    return cute::make_tuple(get<0>(ab), get<1>(ab), make_tensor(make_gmem_ptr(sfa), lsfa),
                            make_tensor(make_gmem_ptr(sfb), lsfb));
  }

  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& shape, Params const& p) const {
    return with_scales(shape, p, nullptr, ExpertLayoutSFA{}, nullptr, ExpertLayoutSFB{});
  }

  template <class InputTensors, class ProblemShapeMNKL>
  CUTLASS_DEVICE InputTensors tensors_perform_update(InputTensors const&, Params const& p,
                                                     ProblemShapeMNKL shape, int32_t group) {
    return with_scales(shape, p, p.ptr_SFA[group], p.layout_SFA[group], p.ptr_SFB[group],
                       p.layout_SFB[group]);
  }
};

// ---------------------------------------------------------------------------------------------
// Configs. Names: "grouped_blockwise_<variant>_<name>" (jax_gmma's grouped configs).
// ---------------------------------------------------------------------------------------------
template <class Tile_, class Kernel_, class Epi_>
struct Config {
  using Tile = Tile_;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = Epi_;
};
using CfgCoop = Config<Shape<_128, _128, _128>,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8BlockScaledAccum,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
using CfgPp64 = Config<Shape<_64, _128, _128>,
                       cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8BlockScaledAccum,
                       cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) grouped_setup_kernel(const typename Gemm::Setup s);

// ---------------------------------------------------------------------------------------------
// The kernel for one output dtype, scale variant and config.
// ---------------------------------------------------------------------------------------------
template <DType kD, Variant kVariant, class Cfg>
struct Sm90Fp8GroupedBlockwiseGemm : cutlass_host::GroupedHost<Sm90Fp8GroupedBlockwiseGemm<kD, kVariant, Cfg>> {
  using Host = cutlass_host::GroupedHost<Sm90Fp8GroupedBlockwiseGemm>;
  using ElA = cutlass::float_e4m3_t;
  using ElB = cutlass::float_e4m3_t;
  using ElD = typename CutlassType<kD>::type;
  static constexpr int kGranB = kVariant == Variant::k1d2d ? 128 : 1;  // weight scale rows
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kGranB, kScaleK>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using LayoutA = cutlass::layout::RowMajor;     // (M_e, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) stored as (N, K), K contiguous
  using LayoutD = cutlass::layout::RowMajor;     // (M_e, N)
  static constexpr int kAlignAB = 16;               // 16 bytes of fp8
  static constexpr int kAlignD = 16 / sizeof(ElD);  // 16 bytes of output
  using Tile = typename Cfg::Tile;
  using Cluster = Shape<_1, _1, _1>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ExpertShape = typename ProblemShape::UnderlyingProblemShape;

  // Epilogue: D = cast(acc + bias_e), bias_e from a per-expert pointer array.
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, Tile, ElD*, float, Stride<_0, _1, _0>, 1>;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Add = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElD, float, kRound>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Add, cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no C operand
      ElD, LayoutD*, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using StockMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElA, cute::tuple<LayoutA*, LayoutSFA*>,
      kAlignAB, ElB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;
  using CollectiveMainloop = PerGroupScaleMainloop<StockMainloop>;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Arguments = typename GemmKernel::Arguments;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using ExpertLayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using ExpertLayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;

  // The per-expert arrays of the workspace (G entries each, every array 128-byte aligned),
  // followed by CUTLASS's own workspace (per-SM TMA descriptors).
  struct Arrays {
    ExpertShape* shapes;
    const ElA** a;
    const ElB** b;
    const float** sfa;
    const float** sfb;
    ElD** d;
    const ElD** bias;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
    ExpertLayoutSFA* layout_sfa;
    ExpertLayoutSFB* layout_sfb;
    void* cutlass;
  };

  // Carves the arrays for g's G experts from `base` (128-byte aligned); returns the offset where
  // CUTLASS's workspace starts (also w->cutlass). base = 0 sizes them.
  static size_t carve(const GemmArgs& g, uintptr_t base, Arrays* w) {
    return cutlass_host::WorkspaceCarver(base, g.groups)
        .per_expert(w->shapes, w->a, w->b, w->sfa, w->sfb, w->d, w->bias, w->stride_a, w->stride_b,
                    w->stride_d, w->layout_sfa, w->layout_sfb)
        .finish(&w->cutlass);
  }

  // The setup kernel's parameters.
  struct Setup {
    const int32_t* sizes;
    const int32_t* row_ids;
    int64_t groups, m, n, k, kb, ld_a, ld_b, rows_b;
    const ElA* a;
    const ElB* b;
    const float* sa;
    const float* sb;
    ElD* d;
    const ElD* bias;
    Arrays w;
  };

  // CUTLASS Arguments of the grouped kernel over the arrays `w`: every operand is reached
  // through them, so the arguments depend on nothing else of the problem.
  static Arguments make_arguments(const GemmArgs& g, const Arrays& w, int sms) {
    Arguments args;
    cutlass_host::set_grouped_arguments(args, g, w, sms);
    // Fusion = Add(Acc, Bias): children op_0, op_1. A null array means no bias (adds 0).
    args.epilogue.thread.op_1.ptr_row = g.bias ? w.bias : nullptr;
    args.epilogue.thread.op_1.null_default = ElD(0);
    return args;
  }

  // The host checks (no device needed); nullptr when the problem fits the family.
  static const char* check(const GemmArgs& g) {
    if (const char* msg = cutlass_host::check_grouped_args(g, kAlignD)) return msg;
    if (!g.a_block_scale || !g.b_block_scale)
      return "block-scaled kernel called without block scales (wrong handler?)";
    if (g.k % 16) return "K must be a multiple of 16 (TMA: 16-byte rows of A and B)";
    const int64_t rows_b = (g.n + kGranB - 1) / kGranB;
    if (g.a_block_scale_ld < g.m || g.a_block_scale_ld % 4 || g.b_block_scale_ld < rows_b ||
        g.b_block_scale_ld % 4)
      return "scale leading dimensions must be >= rows and multiples of 4";
    const int64_t kb = (g.k + kScaleK - 1) / kScaleK;
    if (kb * g.a_block_scale_ld > INT32_MAX || kb * g.b_block_scale_ld > INT32_MAX)
      return "a scale matrix must have fewer than 2^31 elements";
    return nullptr;
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    Arrays w;
    int sms = 0;
    if (cudaError_t err = Host::prepare_run(g, &w, &sms); err != cudaSuccess) return err;

    // 1. The per-expert arrays (CTA 0) and the rows past the total (the other CTAs).
    Setup s;
    s.sizes = g.group_sizes;
    s.row_ids = g.row_ids;
    s.groups = g.groups;
    s.m = g.m;
    s.n = g.n;
    s.k = g.k;
    s.kb = (g.k + kScaleK - 1) / kScaleK;
    s.ld_a = g.a_block_scale_ld;
    s.ld_b = g.b_block_scale_ld;
    s.rows_b = (g.n + kGranB - 1) / kGranB;
    s.a = static_cast<const ElA*>(g.a);
    s.b = static_cast<const ElB*>(g.b);
    s.sa = g.a_block_scale;
    s.sb = g.b_block_scale;
    s.d = static_cast<ElD*>(g.d);
    s.bias = static_cast<const ElD*>(g.bias);
    s.w = w;
    grouped_setup_kernel<Sm90Fp8GroupedBlockwiseGemm>
        <<<cutlass_host::grouped_setup_ctas(g, sizeof(ElD), kSetupThreads, sms), kSetupThreads, 0,
           stream>>>(s);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

    // 2. The grouped GEMM over the arrays (Params cached per thread, keyed by what they depend
    // on: see the header comment).
    return Host::launch(g, w, sms, stream);
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<Sm90Fp8GroupedBlockwiseGemm>(name, DType::kF8E4M3, DType::kF8E4M3, kD);
  }
};

// ---------------------------------------------------------------------------------------------
// The setup kernel.
// ---------------------------------------------------------------------------------------------

template <class L, int kGran>
__device__ inline L scale_layout(int64_t rows, int64_t kb, int64_t ld) {
  const int r = static_cast<int>(rows), k = static_cast<int>(kb), l = static_cast<int>(ld);
  return make_layout(make_shape(make_shape(Int<kGran>{}, r), make_shape(Int<kScaleK>{}, k), 1),
                     make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, l), l * k));
}

template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) grouped_setup_kernel(const typename Gemm::Setup s) {
  using ElD = typename Gemm::ElD;
  const int64_t r0 = __ldg(s.row_ids);
  int64_t total;
  bool negative;
  group_setup::group_total<kSetupThreads>(s.sizes, s.groups, &total, &negative);

  if (blockIdx.x > 0) {
    group_setup::fill_rows_past_total<kSetupThreads>(s.d, s.m, s.n, total, r0, negative);
    return;
  }

  // CTA 0: expert e's rows in this shard, [lo, lo + me) in A's numbering, and its arrays.
  const typename Gemm::Arrays& w = s.w;
  group_setup::for_each_expert<kSetupThreads>(
      s.sizes, s.groups, r0, s.m, negative, [&](int64_t e, int64_t lo, int64_t me) {
        w.shapes[e] = make_shape(static_cast<int>(me), static_cast<int>(s.n), static_cast<int>(s.k));
        w.a[e] = s.a + lo * s.k;
        w.b[e] = s.b + e * s.n * s.k;
        w.sfa[e] = s.sa + lo;                 // 1x128 scales of row lo: column offset, same ld
        w.sfb[e] = s.sb + e * s.kb * s.ld_b;  // expert e's (kb, ld_b) matrix
        w.d[e] = s.d + lo * s.n;
        w.bias[e] = s.bias ? s.bias + e * s.n : nullptr;
        const auto shape_a = make_shape(static_cast<int>(me), static_cast<int>(s.k), 1);
        const auto shape_b = make_shape(static_cast<int>(s.n), static_cast<int>(s.k), 1);
        const auto shape_d = make_shape(static_cast<int>(me), static_cast<int>(s.n), 1);
        w.stride_a[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideA{}, shape_a);
        w.stride_b[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideB{}, shape_b);
        w.stride_d[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideD{}, shape_d);
        w.layout_sfa[e] = scale_layout<typename Gemm::ExpertLayoutSFA, 1>(me, s.kb, s.ld_a);
        w.layout_sfb[e] = scale_layout<typename Gemm::ExpertLayoutSFB, Gemm::kGranB>(s.rows_b, s.kb, s.ld_b);
      });
}

}  // namespace
}  // namespace jax_gmma::sm90_grouped_blockwise

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): per scale variant, the 128x128
// cooperative and 64x128 ping-pong tiles, each for bfloat16 and float32 output.
int sm90_fp8_grouped_blockwise_entries(KernelEntry* out) {
  using namespace sm90_grouped_blockwise;
  int n = 0;
#define JG_ENTRY(name, v, cfg)                                                        \
  out[n++] = Sm90Fp8GroupedBlockwiseGemm<DType::kBF16, v, cfg>::entry(name);          \
  out[n++] = Sm90Fp8GroupedBlockwiseGemm<DType::kF32, v, cfg>::entry(name);
  JG_ENTRY("grouped_blockwise_1d2d_128x128x128_coop", Variant::k1d2d, CfgCoop)
  JG_ENTRY("grouped_blockwise_1d1d_128x128x128_coop", Variant::k1d1d, CfgCoop)
  JG_ENTRY("grouped_blockwise_1d2d_64x128x128_pingpong", Variant::k1d2d, CfgPp64)
  JG_ENTRY("grouped_blockwise_1d1d_64x128x128_pingpong", Variant::k1d1d, CfgPp64)
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
