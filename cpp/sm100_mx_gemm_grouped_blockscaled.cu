// Kernel family: grouped (mixture-of-experts) block-scaled GEMM on Blackwell (sm_100a, B200 /
// GB200): CUTLASS's sm100 grouped (ptr-array) GEMM with tcgen05 block-scaled UMMA ("sm100_grouped_*"
// configs), MXFP8 x MXFP8, NVFP4 x NVFP4 and MXFP4 x MXFP4 experts and tokens:
//
//   D[m, n] = alpha_e * sum_kb  sfa[m, kb] * sfb_e[n, kb] * sum_{k in block kb} A[m, k] * B_e[n, k]  (+ bias_e[n])
//
// for row m of expert e, K blocks of 32 (MX formats, E8M0 scales) or 16 (NVFP4, E4M3 scales),
// alpha_e = a_global * b_global[e] (NVFP4's float32 global scales; 1 for the MX formats).
//
// NOT RUN ON HARDWARE by this project: there is no Blackwell GPU here. These kernels are
// compiled, registered, checked on the host (can_implement, workspace) and their SASS is
// inspected (tools/check_sass.py), nothing more.
//
// Operands (the grouped contract of cpp/sm90_fp8_gemm_grouped_blockwise.cu, in the formats of
// cpp/sm1xx_mx_gemm_blockscaled.cuh): A (M, K) tokens sorted by expert, K-major (float8_e4m3fn,
// or FP4 packed 2 per byte); B (G, N, K) the experts back to back, the same element format;
// group_sizes (G,) int32 on the device: expert e takes the global rows [end_e - size_e, end_e),
// end = cumsum(group_sizes), and A's row 0 is global row row_ids[0] (on the device). Scale
// factors in CUTLASS's Sm1xxBlockScaledConfig layout, jax_gmma's "sm100_128x4" (rows padded to
// 128, K blocks to 4, 512-byte 128x4 atoms, K-atom fastest): sfa covers A's M rows
// (mx_sf_bytes(M, K, vec) bytes), sfb each expert's N rows (G x mx_sf_bytes(N, K, vec) bytes,
// back to back). NVFP4: a_global (1,) and b_global (G,) float32 on the device. D (M, N) bfloat16
// or float32 row-major; bias (G, N) in D's dtype. Rows past the groups' total come out zero; a
// negative group size (whose overlapping groups jax.lax.ragged_dot sums) is not multiplied:
// every row of D is NaN and no expert runs, so the result is detectably invalid.
//
// Graph safety: the host never reads the group sizes. Each call enqueues three kernels:
//  1. a setup kernel: CTA 0 reads group_sizes / row_ids and writes, into the workspace, each
//     expert's problem shape (M_e, N, K) -- M_e its rows in this shard, 0 for an empty expert
//     or one outside the shard, 0 for all when a size is negative -- and the per-expert arrays
//     CUTLASS's grouped kernel reads (A / B / D / scale-factor / bias pointers, strides,
//     scale-factor layouts, alpha_e), plus the table of the scale re-layout below. The other
//     CTAs (a grid sized from M and N only) fill the rows past the total with zeros (every row
//     with NaN when a size is negative);
//  2. the scale re-layout (below), a grid sized from M and G only;
//  3. CUTLASS's grouped kernel with device-only problem shapes (no host copy of them): a
//     persistent grid of sm_count CTAs whose group tile scheduler walks the experts' tiles from
//     the shapes in the workspace, updating its TMA descriptors on the device per expert. An
//     expert with M_e = 0 has no tiles; a tile's rows past M_e read zeros (TMA bounds) and are
//     not stored.
// The kernel's Params depend only on the workspace address, G, the SM count, the raster order
// and whether there is a bias (every operand address, and alpha_e, lives in the workspace), so
// they are cached per thread like the dense kernels' (params_cache.cuh).
//
// Scale factors of the activations (the one layout problem of the grouped form): the MMA reads
// an operand's scale factors through a TMA descriptor over the 128-row atoms of that operand,
// so an expert's scale rows must start an atom. The weights' do (each expert's N rows are a
// layout of their own: a pointer offset per expert); the tokens' do not (expert e's rows start
// at any row of A). So kernel 2 copies each expert's activation scale rows into a region of its
// own in the workspace, padded to whole 128-row atoms (the pad rows zero): expert e's region
// starts at atom Q_e = sum_{f < e} ceil(M_f / 128). Regions total at most ceil(M / 128) +
// min(G, M) atoms (each non-empty expert wastes less than one), so the workspace is sized from
// M, G and K only: that many atoms of ceil(K / vec / 4) x 512 bytes -- 1/32 (MXFP8), 1/16 (MXFP4)
// or 1/8 (NVFP4) of A's bytes plus 512 bytes per expert and K-atom -- next to the per-expert arrays and
// CUTLASS's per-SM TMA descriptors. Each destination atom's CTA finds its expert by a binary
// search of the atoms' prefix sums (written by kernel 1) and copies 4-byte words (4 K blocks of
// one row), coalesced on the destination side. Only the scale factors move, never A.
//
// Epilogue: D = cast(alpha_e * acc + bias_e) in float32: alpha_e a per-expert scalar broadcast
// (a workspace array indexed by the expert, written by kernel 1), bias_e through the row
// broadcast in its array-of-pointers form, as in the sm90 grouped family.
//
// Configs, per format pair (the f8f6f4 MMA kind for MXFP8, K tile 128; nvf4 / mxf4 for NVFP4 /
// MXFP4, K tile 256), each for bfloat16 and float32 output: 1-SM ("..._128x128x<K>_1sm": one CTA
// per 128-row tile, cluster 1x1) and 2-SM ("..._256x128x<K>_2sm": a cluster of two CTAs, one
// 256-row MMA over the SM pair, each CTA loading its 128 rows of A and of the scale factors; a
// tile's rows past M_e, in either CTA, read zeros). The 2-SM tiles suit experts with many rows
// (jax_gmma's grouped_configs.select_sm100_config). K % 32 == 0 (the scale block, 16-byte TMA
// rows of A and B), N % 8 (bf16) or N % 4 (f32) (16-byte TMA rows of D).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include <cutlass/gemm/group_array_problem_shape.hpp>

#include "jax_gmma/group_setup.cuh"
#include "sm1xx_mx_gemm_blockscaled.cuh"
#include "cutlass_grouped_host.cuh"

namespace jax_gmma::sm100_grouped_mx {
namespace {

using namespace cute;
using sm1xx_mx::MxF4;
using sm1xx_mx::MxF8E4M3;
using sm1xx_mx::NvF4;
using sm1xx_mx::OutType;

constexpr int kSetupThreads = 256;  // the setup and re-layout kernels' CTA
constexpr int64_t kAtomRows = 128;  // rows of one scale-factor atom
constexpr int64_t kAtomBytes = 512;  // bytes of one atom (128 rows x 4 K blocks)
constexpr int64_t kKAlign = 32;      // K: the MX scale block, 16 bytes of FP4

// ---------------------------------------------------------------------------------------------
// Configs. Names: "sm100_grouped_<A format>x<B format>_<MMA tile>_<1sm|2sm>" (jax_gmma's grouped
// configs, jax_gmma/ops/grouped_configs.py).
// ---------------------------------------------------------------------------------------------
// 1-SM: one CTA per 128-row MMA tile. 2-SM: a cluster of two CTAs, one 256-row MMA spanning the
// SM pair (each CTA holds 128 rows of the tile, its own half of A's rows and scale factors).
template <class Tile_, class Kernel_, bool k2Sm_ = false>
struct Config {
  static constexpr bool k2Sm = k2Sm_;
  using Tile = Tile_;
  using Cluster = Shape<Int<k2Sm ? 2 : 1>, _1, _1>;
  using CtaTile = Shape<Int<decltype(size<0>(Tile_{}))::value / (k2Sm ? 2 : 1)>,
                        Int<decltype(size<1>(Tile_{}))::value>, Int<decltype(size<2>(Tile_{}))::value>>;
  using KernelSchedule = Kernel_;
  using EpilogueSchedule = cute::conditional_t<k2Sm, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
                                               cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;
};
// f8f6f4 kind (MXFP8): K tile 128 (128 bytes of fp8 per row).
using CfgMxf8 = Config<Shape<_128, _128, _128>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf8f6f4Sm100>;
using CfgMxf8_2Sm = Config<Shape<_256, _128, _128>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100, true>;
// mxf4 / nvf4 kinds (packed FP4 in shared memory): K tile 256 (128 bytes per row).
using CfgMxf4 = Config<Shape<_128, _128, _256>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf4Sm100>;
using CfgMxf4_2Sm = Config<Shape<_256, _128, _256>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmMxf4Sm100, true>;
using CfgNvf4 = Config<Shape<_128, _128, _256>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>;
using CfgNvf4_2Sm = Config<Shape<_256, _128, _256>,
                        cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmNvf4Sm100, true>;

template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) grouped_setup_kernel(const typename Gemm::Setup s);
template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) sf_relayout_kernel(const typename Gemm::Setup s);

// Atoms of the activations' scale-factor regions for M rows and G experts (header comment).
inline int64_t sfa_atoms(int64_t m, int64_t groups) {
  return (m + kAtomRows - 1) / kAtomRows + std::min(groups, m);
}

// ---------------------------------------------------------------------------------------------
// The kernel for one (A format, B format, D dtype, config).
// ---------------------------------------------------------------------------------------------
template <class FA, class FB, DType kD, class Cfg>
struct Sm100MxGroupedGemm : cutlass_host::GroupedHost<Sm100MxGroupedGemm<FA, FB, kD, Cfg>> {
  using Host = cutlass_host::GroupedHost<Sm100MxGroupedGemm>;
  static_assert(FA::vec == FB::vec, "A and B must share the scale-vector size");
  using ElA = typename FA::type;
  using ElB = typename FB::type;
  using ElD = typename OutType<kD>::type;
  using LayoutA = cutlass::layout::RowMajor;     // (M_e, K), K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // (K, N) stored as (N, K), K contiguous
  using LayoutD = cutlass::layout::RowMajor;     // (M_e, N)
  static constexpr int kAlignD = 16 / sizeof(ElD);  // 16-byte output rows
  static constexpr int kBitsA = cutlass::sizeof_bits<typename ElA::DataType>::value;
  static constexpr int kBitsB = cutlass::sizeof_bits<typename ElB::DataType>::value;
  using Tile = typename Cfg::Tile;
  using Cluster = typename Cfg::Cluster;
  using CtaTile = typename Cfg::CtaTile;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ExpertShape = typename ProblemShape::UnderlyingProblemShape;

  // Epilogue: D = cast(alpha_e * acc + bias_e). alpha_e: a scalar broadcast whose batch stride
  // (1) walks a per-expert array (the batch index of the grouped epilogue is the expert); bias_e
  // from a per-expert pointer array.
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Alpha = cutlass::epilogue::fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>, 1>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, CtaTile, ElD*, float, Stride<_0, _1, _0>, 1>;
  using Fma = cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElD, float, kRound>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<Fma, Alpha, cutlass::epilogue::fusion::Sm90AccFetch, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no C operand
      ElD, LayoutD*, kAlignD, typename Cfg::EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElA, LayoutA*, FA::align, ElB,
      LayoutB*, FB::align, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Arguments = typename GemmKernel::Arguments;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using ExpertLayoutSFA = typename CollectiveMainloop::InternalLayoutSFA;
  using ExpertLayoutSFB = typename CollectiveMainloop::InternalLayoutSFB;
  using SfConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElSF = typename CollectiveMainloop::ElementSF;
  using ArrayA = typename CollectiveMainloop::ArrayElementA;
  using ArrayB = typename CollectiveMainloop::ArrayElementB;

  // The per-expert arrays of the workspace (G entries each), the scale re-layout's table and
  // destination, then CUTLASS's own workspace (per-SM TMA descriptors); every region 128-byte
  // aligned.
  struct Arrays {
    ExpertShape* shapes;
    const ArrayA** a;
    const ArrayB** b;
    const ElSF** sfa;
    const ElSF** sfb;
    ElD** d;
    const ElD** bias;
    float* alpha;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
    ExpertLayoutSFA* layout_sfa;
    ExpertLayoutSFB* layout_sfb;
    int64_t* atom_end;  // expert e's regions end at atom atom_end[e] (inclusive prefix sum)
    int64_t* src_row;   // expert e's first row of A (A's numbering)
    uint8_t* sfa_rows;  // the experts' activation scale factors, atom-aligned regions
    void* cutlass;
  };

  // Carves the arrays for g's G experts and the activations' scale atoms (sfa_atoms of
  // k_atoms K-atoms each) from `base` (128-byte aligned); returns the offset where CUTLASS's
  // workspace starts (also w->cutlass). base = 0 sizes them.
  static size_t carve(const GemmArgs& g, uintptr_t base, Arrays* w) {
    const int64_t atoms = sfa_atoms(g.m, g.groups);
    return cutlass_host::WorkspaceCarver(base, g.groups)
        .per_expert(w->shapes, w->a, w->b, w->sfa, w->sfb, w->d, w->bias, w->alpha, w->stride_a,
                    w->stride_b, w->stride_d, w->layout_sfa, w->layout_sfb, w->atom_end, w->src_row)
        .region(w->sfa_rows, static_cast<size_t>(atoms * k_atoms(g.k) * kAtomBytes))
        .finish(&w->cutlass);
  }

  // K blocks (of the scale vector) in 4-block atoms.
  static int64_t k_atoms(int64_t k) { return (k / FA::vec + 3) / 4; }

  // The setup and re-layout kernels' parameters.
  struct Setup {
    const int32_t* sizes;
    const int32_t* row_ids;
    int64_t groups, m, n, k, k_atoms;
    const uint8_t* a;   // A's bytes
    const uint8_t* b;   // B's bytes
    const uint8_t* sa;  // A's scale factors (swizzled, M rows)
    const uint8_t* sb;  // B's scale factors (swizzled, N rows per expert, back to back)
    const float* a_global;  // NVFP4 global scales (nullptr: 1)
    const float* b_global;  // (G,)
    ElD* d;
    const ElD* bias;
    Arrays w;
  };

  // CUTLASS Arguments of the grouped kernel over the arrays `w`: every operand is reached
  // through them, so the arguments depend on nothing else of the problem.
  static Arguments make_arguments(const GemmArgs& g, const Arrays& w, int sms) {
    Arguments args;
    cutlass_host::set_grouped_arguments(args, g, w, sms);
    // Fusion = Fma(Alpha, Acc, Bias): children op_0, op_1, op_2.
    auto& alpha = args.epilogue.thread.op_0;
    alpha.scalars[0] = 1.f;
    alpha.scalar_ptrs[0] = w.alpha;
    alpha.dScalar[0] = make_stride(_0{}, _0{}, int64_t{1});  // one scalar per expert
    auto& bias = args.epilogue.thread.op_2;
    bias.ptr_row = g.bias ? w.bias : nullptr;  // a null array adds 0
    bias.null_default = ElD(0);
    return args;
  }

  // The host checks (no device needed); nullptr when the problem fits the family.
  static const char* check(const GemmArgs& g) {
    if (const char* msg = cutlass_host::check_grouped_args(g, kAlignD)) return msg;
    if (!g.a_sf || !g.b_sf) return "block-scaled kernel called without scale factors (wrong handler?)";
    if (FA::vec == 32 && (g.a_global_scale || g.b_global_scale))
      return "the MX formats have no global scale (only NVFP4 does)";
    if (g.k % kKAlign)
      return "K must be a multiple of 32 (the MX scale block; 16-byte TMA rows of FP4 A and B)";
    return nullptr;
  }

  // GroupedHost's defaults, widened: the activations' scale regions need M and K too, and TMA
  // also reads the scale factors (16-byte aligned; the re-layout reads them as 4-byte words).
  static bool has_work(const GemmArgs& g) { return g.groups >= 1 && g.m >= 1 && g.k >= 1; }

  static uintptr_t tma_addresses(const GemmArgs& g) {
    return Host::tma_addresses(g) | reinterpret_cast<uintptr_t>(g.a_sf) |
           reinterpret_cast<uintptr_t>(g.b_sf);
  }

  static cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
    // the checks and the carved workspace; 16-byte aligned operands and scale factors (row and
    // expert offsets keep it: K % 32, N * sizeof(D) % 16, 512-byte atoms)
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
    s.k_atoms = k_atoms(g.k);
    s.a = static_cast<const uint8_t*>(g.a);
    s.b = static_cast<const uint8_t*>(g.b);
    s.sa = static_cast<const uint8_t*>(g.a_sf);
    s.sb = static_cast<const uint8_t*>(g.b_sf);
    s.a_global = g.a_global_scale;
    s.b_global = g.b_global_scale;
    s.d = static_cast<ElD*>(g.d);
    s.bias = static_cast<const ElD*>(g.bias);
    s.w = w;

    // 1. The per-expert arrays (CTA 0) and the rows past the total (the other CTAs).
    grouped_setup_kernel<Sm100MxGroupedGemm>
        <<<cutlass_host::grouped_setup_ctas(g, sizeof(ElD), kSetupThreads, sms), kSetupThreads, 0,
           stream>>>(s);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

    // 2. The activations' scale factors into atom-aligned per-expert regions.
    const int64_t relayout_ctas = std::min<int64_t>(sfa_atoms(g.m, g.groups), 2 * sms);
    sf_relayout_kernel<Sm100MxGroupedGemm>
        <<<static_cast<unsigned>(std::max<int64_t>(relayout_ctas, 1)), kSetupThreads, 0, stream>>>(s);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;

    // 3. The grouped GEMM over the arrays (Params cached per thread, keyed by what they depend
    // on: see the header comment).
    return Host::launch(g, w, sms, stream);
  }

  static KernelEntry entry(const char* name) {
    return cutlass_host::make_entry<Sm100MxGroupedGemm>(name, FA::dt, FB::dt, kD, 100);
  }
};

// ---------------------------------------------------------------------------------------------
// The setup kernel.
// ---------------------------------------------------------------------------------------------

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

  // CTA 0: expert e's rows in this shard, [lo, hi) in A's numbering, its arrays and its
  // activation scale-factor region (atoms [atom_end - ceil(M_e / 128), atom_end)).
  const typename Gemm::Arrays& w = s.w;
  const float a_global = s.a_global ? __ldg(s.a_global) : 1.f;
  const int64_t a_row_bytes = s.k * Gemm::kBitsA / 8;
  const int64_t b_expert_bytes = s.n * s.k * Gemm::kBitsB / 8;
  const int64_t atom_row_bytes = s.k_atoms * kAtomBytes;  // one 128-row atom over all of K
  const int64_t sfb_expert_bytes = (s.n + kAtomRows - 1) / kAtomRows * atom_row_bytes;
  int64_t base = 0;       // rows of the experts before this chunk
  int64_t atom_base = 0;  // scale atoms of the experts before this chunk
  for (int64_t c = 0; c < s.groups; c += kSetupThreads) {
    const int64_t e = c + threadIdx.x;
    const int64_t size = e < s.groups ? static_cast<int64_t>(__ldg(s.sizes + e)) : 0;
    int64_t chunk;
    const int64_t end = base + group_setup::block_inclusive_scan<kSetupThreads>(size, &chunk);
    const int64_t begin = end - size;
    base += chunk;
    const int64_t lo = min(max(begin - r0, int64_t{0}), s.m);
    const int64_t hi = min(max(end - r0, int64_t{0}), s.m);
    const int64_t me = (negative || e >= s.groups) ? 0 : max(hi - lo, int64_t{0});  // 0: no tiles
    const int64_t atoms = (me + kAtomRows - 1) / kAtomRows;
    int64_t chunk_atoms;
    const int64_t atom_end =
        atom_base + group_setup::block_inclusive_scan<kSetupThreads>(atoms, &chunk_atoms);
    atom_base += chunk_atoms;
    if (e >= s.groups) continue;
    const int m_e = static_cast<int>(me), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    w.shapes[e] = make_shape(m_e, n, k);
    w.a[e] = reinterpret_cast<const typename Gemm::ArrayA*>(s.a + lo * a_row_bytes);
    w.b[e] = reinterpret_cast<const typename Gemm::ArrayB*>(s.b + e * b_expert_bytes);
    w.sfa[e] = reinterpret_cast<const typename Gemm::ElSF*>(w.sfa_rows + (atom_end - atoms) * atom_row_bytes);
    w.sfb[e] = reinterpret_cast<const typename Gemm::ElSF*>(s.sb + e * sfb_expert_bytes);
    w.d[e] = s.d + lo * s.n;
    w.bias[e] = s.bias ? s.bias + e * s.n : nullptr;
    w.alpha[e] = s.b_global ? a_global * __ldg(s.b_global + e) : a_global;
    w.stride_a[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideA{}, make_shape(m_e, k, 1));
    w.stride_b[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideB{}, make_shape(n, k, 1));
    w.stride_d[e] = cutlass::make_cute_packed_stride(typename Gemm::StrideD{}, make_shape(m_e, n, 1));
    w.layout_sfa[e] = Gemm::SfConfig::tile_atom_to_shape_SFA(make_shape(m_e, n, k, 1));
    w.layout_sfb[e] = Gemm::SfConfig::tile_atom_to_shape_SFB(make_shape(m_e, n, k, 1));
    w.atom_end[e] = atom_end;
    w.src_row[e] = lo;
  }
}

// ---------------------------------------------------------------------------------------------
// The scale re-layout: destination atom t (all K atoms of 128 rows) of expert e's region gets
// rows [128 (t - first atom of e), + 128) of the expert's activation scale factors, 4-byte words
// (4 K blocks of one row) from the swizzled layout of all M rows, zero past M_e.
// ---------------------------------------------------------------------------------------------
template <class Gemm>
__global__ void __launch_bounds__(kSetupThreads) sf_relayout_kernel(const typename Gemm::Setup s) {
  const typename Gemm::Arrays& w = s.w;
  const int64_t atoms_total = w.atom_end[s.groups - 1];
  const int64_t words = kAtomRows * s.k_atoms;  // 4-byte words of one destination atom row
  const uint32_t* src = reinterpret_cast<const uint32_t*>(s.sa);
  for (int64_t t = blockIdx.x; t < atoms_total; t += gridDim.x) {
    // The expert whose region holds atom t: the first e with atom_end[e] > t (empty experts
    // share their neighbour's end and are skipped by the search).
    int64_t lo = 0, hi = s.groups - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (w.atom_end[mid] > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int64_t e = lo;
    const int64_t me = get<0>(w.shapes[e]);
    const int64_t row0 = (t - (w.atom_end[e] - (me + kAtomRows - 1) / kAtomRows)) * kAtomRows;
    const int64_t first = w.src_row[e] + row0;  // A's row of the atom's row 0
    uint32_t* dst = reinterpret_cast<uint32_t*>(w.sfa_rows + t * s.k_atoms * kAtomBytes);
    for (int64_t i = threadIdx.x; i < words; i += kSetupThreads) {
      // Word i of the destination: K atom j = i / 128, and within the 512-byte atom word
      // q = i % 128, which holds row (q % 4) * 32 + q / 4 (offset (r % 32) * 16 + (r / 32) * 4).
      const int64_t j = i / kAtomRows, q = i % kAtomRows;
      const int64_t r = (q % 4) * 32 + q / 4;
      uint32_t v = 0;
      if (row0 + r < me) v = __ldg(src + mx_sf_word_offset(first + r, j, s.k_atoms) / 4);
      dst[i] = v;
    }
  }
}

}  // namespace
}  // namespace jax_gmma::sm100_grouped_mx

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): per format pair the 1-SM 128-row tile
// and the 2-SM 256-row one, each for bfloat16 and float32 output.
int sm100_mx_grouped_blockscaled_entries(KernelEntry* out) {
  using namespace sm100_grouped_mx;
  int n = 0;
#define JG_ENTRY(name, fa, fb, cfg)                                    \
  out[n++] = Sm100MxGroupedGemm<fa, fb, DType::kBF16, cfg>::entry(name); \
  out[n++] = Sm100MxGroupedGemm<fa, fb, DType::kF32, cfg>::entry(name);
  JG_ENTRY("sm100_grouped_mxfp8xmxfp8_128x128x128_1sm", MxF8E4M3, MxF8E4M3, CfgMxf8)
  JG_ENTRY("sm100_grouped_mxfp8xmxfp8_256x128x128_2sm", MxF8E4M3, MxF8E4M3, CfgMxf8_2Sm)
  JG_ENTRY("sm100_grouped_nvfp4xnvfp4_128x128x256_1sm", NvF4, NvF4, CfgNvf4)
  JG_ENTRY("sm100_grouped_nvfp4xnvfp4_256x128x256_2sm", NvF4, NvF4, CfgNvf4_2Sm)
  JG_ENTRY("sm100_grouped_mxfp4xmxfp4_128x128x256_1sm", MxF4, MxF4, CfgMxf4)
  JG_ENTRY("sm100_grouped_mxfp4xmxfp4_256x128x256_2sm", MxF4, MxF4, CfgMxf4_2Sm)
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
