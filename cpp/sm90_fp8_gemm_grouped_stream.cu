// Kernel family: grouped (mixture-of-experts) FP8 GEMM on Hopper (sm_90a), weight streaming
// ("grouped_*_stream_*" configs), written for jax-gmma: jax_gmma.ragged_dot's kernel.
//
//   D[m, n] = sum_groups  sa * sb_e * sum_k A[m, k] * B_e[n, k]  (+ bias_e[n])  for row m of expert e
//
// A (M, K) holds the tokens sorted by expert (float8_e4m3fn, K-major), B the G experts' (N, K)
// weights back to back (float8_e4m3fn), group_sizes (G,) int32 on the device; the rows past the
// groups' total come out zero. Each expert's weights stream once per 8 or 16 of its tokens
// through cpp/include/jax_gmma/fp8_stream.cuh's grouped kernel (16 weight rows x 8 tokens per
// warp on mma.sync.m16n8k32 e4m3, WK warps splitting K, a deterministic reduction), with the
// scale policy of the weight format (cpp/include/jax_gmma/fp8_stream_scales.cuh):
//
//  * "grouped_blockwise_1d2d_*" / "_1d1d_*": 1x128 token scales x 128x128 / 1x128 weight scales
//    (float32, MN-major per expert: (G, ceil(K/128), ld)), promoted every 128 of K;
//  * "grouped_mxf8_*": MXFP8 (E8M0 per 32 of K, the swizzled 128x4-atom layout per expert);
//  * "grouped_fp8_*": per-token or per-tensor token scales x per-channel or per-expert weight
//    scales (float32), applied every 128 of K.
//
// The "_stream_bulk_*" configs run the same math with the weights staged in shared memory by TMA
// bulk copies on persistent CTAs (cpp/include/jax_gmma/fp8_stream_bulk.cuh); the pick takes the
// 8-token one at one or two rows per expert (jax_gmma/ops/grouped_configs.py: stream_config).
//
// The group sizes never leave the device (every CTA reads them), there is no workspace, only the
// launch: CUDA-graph safe. Any M, any N, K % 32 == 0.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/fp8_stream.cuh"
#include "jax_gmma/fp8_stream_bulk.cuh"
#include "jax_gmma/fp8_stream_scales.cuh"
#include "jax_gmma/gemm_api.h"

namespace jax_gmma::sm90_grouped_stream {
namespace {

using fp8_stream::Block128Scales;
using fp8_stream::GroupedParams;
using fp8_stream::MxScales;
using fp8_stream::RowScales;

enum class Kind { kBlock1d2d, kBlock1d1d, kMx, kRow };

template <Kind kKind>
const char* can_implement(const GemmArgs& g) {
  if (const char* why = fp8_stream::can_implement_common(g.m, g.n, g.k)) return why;
  if (!g.group_sizes || !g.row_ids || g.groups < 1) return "the grouped kernels need group_sizes, row_ids and G >= 1";
  if (g.groups > 65534) return "G must be at most 65534";
  if (g.splits != 1) return "the grouped kernels do not split K across CTAs (splits must be 1)";
  if constexpr (kKind == Kind::kBlock1d2d || kKind == Kind::kBlock1d1d) {
    if (!g.a_block_scale || !g.b_block_scale) return "the block-scaled kernels need both block scales";
  } else if constexpr (kKind == Kind::kMx) {
    if (!g.a_sf || !g.b_sf) return "the MXFP8 kernels need both scale-factor tensors";
    if (g.a_global_scale || g.b_global_scale) return "MXFP8 has no global scale";
  } else {
    if (!g.a_scale || !g.b_scale) return "the FP8 kernels need both scales";
  }
  return nullptr;
}

template <class S>
GroupedParams<S> params(const GemmArgs& g, const typename S::Args& s) {
  return GroupedParams<S>{
      {{g.m, g.n, g.k, static_cast<const uint8_t*>(g.a), static_cast<const uint8_t*>(g.b), g.bias, g.d}, s},
      {g.group_sizes, g.row_ids, g.groups}};
}

// One launch of the register-ring kernel (kBulk false) or the bulk-copy one.
template <bool kBulk, class S, int NT, int WK, typename OutT>
cudaError_t launch(const GroupedParams<S>& p, uintptr_t scale_ptrs, const GemmArgs& g, cudaStream_t stream) {
  if constexpr (kBulk)
    return fp8_stream::launch_grouped_bulk<S, NT, WK, OutT>(p, scale_ptrs, grouped_sm_count(g), stream);
  else
    return fp8_stream::launch_grouped<S, NT, WK, OutT>(p, scale_ptrs, stream);
}

// The scale policy of a kind.
template <Kind kKind>
struct PolicyOf {
  using type = Block128Scales<kKind == Kind::kBlock1d2d ? 128 : 1>;
};
template <>
struct PolicyOf<Kind::kMx> {
  using type = MxScales;
};
template <>
struct PolicyOf<Kind::kRow> {
  using type = RowScales;
};

template <Kind kKind, int NT, int WK, typename OutT, bool kBulk>
cudaError_t run(const GemmArgs& g, cudaStream_t stream) {
  if (can_implement<kKind>(g)) return cudaErrorInvalidValue;
  using S = typename PolicyOf<kKind>::type;
  if constexpr (kKind == Kind::kBlock1d2d || kKind == Kind::kBlock1d1d) {
    const int64_t kb = (g.k + 127) / 128;
    const auto p = params<S>(g, {g.a_block_scale, g.b_block_scale, g.a_block_scale_ld,
                                 g.b_block_scale_ld, kb * g.b_block_scale_ld});
    return launch<kBulk, S, NT, WK, OutT>(
        p, reinterpret_cast<uintptr_t>(g.a_block_scale) | reinterpret_cast<uintptr_t>(g.b_block_scale), g,
        stream);
  } else if constexpr (kKind == Kind::kMx) {
    const auto p = params<S>(g, {static_cast<const uint8_t*>(g.a_sf), static_cast<const uint8_t*>(g.b_sf),
                                 (g.k / 32 + 3) / 4, mx_sf_bytes(g.n, g.k, 32)});
    return launch<kBulk, S, NT, WK, OutT>(
        p, reinterpret_cast<uintptr_t>(g.a_sf) | reinterpret_cast<uintptr_t>(g.b_sf), g, stream);
  } else {
    const auto p = params<S>(g, {g.a_scale, g.b_scale, g.a_scale_per_row ? 1 : 0,
                                 g.b_scale_per_col ? 1 : 0, g.b_scale_per_col ? g.n : 1});
    // float32 scalars: 4-byte alignment is all their loads need
    return launch<kBulk, S, NT, WK, OutT>(p, 0, g, stream);
  }
}

template <Kind kKind, int NT, int WK, typename OutT>
KernelEntry entry(const char* name, DType d) {
  return fp8_stream::table_row(name, d, &can_implement<kKind>, &run<kKind, NT, WK, OutT, false>, WK);
}

template <Kind kKind, int NT, int WK, typename OutT>
KernelEntry bulk_entry(const char* name, DType d) {
  using S = typename PolicyOf<kKind>::type;
  return fp8_stream::bulk_table_row<S, NT, WK, OutT>(name, d, &can_implement<kKind>,
                                                      &run<kKind, NT, WK, OutT, true>);
}

}  // namespace
}  // namespace jax_gmma::sm90_grouped_stream

namespace jax_gmma {

// The kernel table rows of this family (cpp/registry.cc): per scale kind, 16 weight rows x 8
// tokens or x 16 tokens per CTA with 4 or 8 warps splitting K (16 warps spill registers around
// the expert loop), and the bulk-copy kernel's 8 and 16 tokens with 4 warps splitting K (and a
// producer warp), each for bfloat16 and float32 output.
int sm90_fp8_grouped_stream_entries(KernelEntry* out) {
  using namespace sm90_grouped_stream;
  int n = 0;
#define JG_ENTRY(name, kind, nt, wk)                                 \
  out[n++] = entry<kind, nt, wk, __nv_bfloat16>(name, DType::kBF16); \
  out[n++] = entry<kind, nt, wk, float>(name, DType::kF32);
#define JG_BULK(name, kind, nt, wk)                                       \
  out[n++] = bulk_entry<kind, nt, wk, __nv_bfloat16>(name, DType::kBF16); \
  out[n++] = bulk_entry<kind, nt, wk, float>(name, DType::kF32);
#define JG_KIND(v, kind)                                       \
  JG_ENTRY("grouped_" v "_stream_16x8_kw4", kind, 1, 4)       \
  JG_ENTRY("grouped_" v "_stream_16x8_kw8", kind, 1, 8)       \
  JG_ENTRY("grouped_" v "_stream_16x16_kw4", kind, 2, 4)      \
  JG_ENTRY("grouped_" v "_stream_16x16_kw8", kind, 2, 8)      \
  JG_BULK("grouped_" v "_stream_bulk_16x8_kw4", kind, 1, 4)   \
  JG_BULK("grouped_" v "_stream_bulk_16x16_kw4", kind, 2, 4)
  JG_KIND("blockwise_1d2d", Kind::kBlock1d2d)
  JG_KIND("blockwise_1d1d", Kind::kBlock1d1d)
  JG_KIND("mxf8", Kind::kMx)
  JG_KIND("fp8", Kind::kRow)
#undef JG_KIND
#undef JG_BULK
#undef JG_ENTRY
  return n;
}

}  // namespace jax_gmma
