// Sweep-only kernels of the sm90 FP8 tensorwise family (e4m3 x e4m3 -> bf16 only): the
// production configs with explicit mainloop stage counts, and candidate tiles under evaluation.
// benchmarks/sweep.py times them; the heuristic (jax_gmma/configs.py) never picks them.
// Names: <production name>_s<stages>, or a tile name for a candidate.
#include "sm90_fp8_gemm_tensorwise.cuh"

namespace jax_gmma {
namespace sm90 {

// Ping-pong 2-level: each consumer warpgroup owns a whole 64xN tile, so one warpgroup's
// promotion (which drains its wgmma queue) overlaps the other's MMAs.
using CfgP64x192Pp2l = Config<Shape<_64, _192, _128>, Shape<_1, _2, _1>,
                              sched::KernelTmaWarpSpecializedPingpong,
                              epi::TmaWarpSpecialized, void, false>;
using CfgP64x128Pp2l = Config<Shape<_64, _128, _128>, Shape<_1, _2, _1>,
                              sched::KernelTmaWarpSpecializedPingpong,
                              epi::TmaWarpSpecialized, void, false>;

// Candidates for M = 33..64 with many weight rows: a 4x1 cluster sharing the
// 64-token activation tile four ways (two-level and fast), and the unswapped 64-token tile
// (ping-pong 64x128, a 1x2 cluster sharing the activation tile) with fast accumulation.
template <int TN>
using CfgDecodeSwapC4 = CfgDecodeSwapCoop<128, TN, 4>;
using CfgP64x128PpFast = Config<Shape<_64, _128, _128>, Shape<_1, _2, _1>,
                                sched::KernelTmaWarpSpecializedPingpongFP8FastAccum,
                                epi::TmaWarpSpecialized, void, false>;

template <class Cfg>
using K = Sm90Fp8Gemm<DType::kF8E4M3, DType::kF8E4M3, DType::kBF16, Cfg>;

}  // namespace sm90

int sm90_fp8_tensorwise_sweep_entries(KernelEntry* out) {
  using namespace sm90;
  int i = 0;
#if !defined(JAX_GMMA_SMOKE_BUILD)
  out[i++] = K<WithStages<CfgL256CoopFast, 2>>::entry("128x256x128_c2x1_coop_fast_s2");
  out[i++] = K<WithStages<CfgL256CoopFast, 3>>::entry("128x256x128_c2x1_coop_fast_s3");
  out[i++] = K<WithStages<CfgL256CoopFast, 4>>::entry("128x256x128_c2x1_coop_fast_s4");
  out[i++] = K<WithStages<CfgM128Coop2l, 2>>::entry("128x128x128_c2x1_coop_2lvl_s2");
  out[i++] = K<WithStages<CfgM128Coop2l, 3>>::entry("128x128x128_c2x1_coop_2lvl_s3");
  out[i++] = K<WithStages<CfgM128Coop2l, 4>>::entry("128x128x128_c2x1_coop_2lvl_s4");
  out[i++] = K<WithStages<CfgM128Coop2l, 5>>::entry("128x128x128_c2x1_coop_2lvl_s5");
  out[i++] = K<WithStages<CfgM128Coop2l, 6>>::entry("128x128x128_c2x1_coop_2lvl_s6");
  out[i++] = K<WithStages<CfgP128PpFast, 3>>::entry("128x128x128_c1x2_pingpong_fast_s3");
  out[i++] = K<WithStages<CfgP128PpFast, 4>>::entry("128x128x128_c1x2_pingpong_fast_s4");
  out[i++] = K<WithStages<CfgDecodeSwapPp<16>, 4>>::entry("swap_64x16x128_pingpong_2lvl_s4");
  out[i++] = K<WithStages<CfgDecodeSwapPp<16>, 8>>::entry("swap_64x16x128_pingpong_2lvl_s8");
  out[i++] = K<WithStages<CfgDecodeSwapPp<64>, 4>>::entry("swap_64x64x128_pingpong_2lvl_s4");
  out[i++] = K<WithStages<CfgDecodeSwapPp<64>, 8>>::entry("swap_64x64x128_pingpong_2lvl_s8");
  out[i++] = K<WithStages<CfgM192Coop2l, 4>>::entry("128x192x128_c2x1_coop_2lvl_s4");
  out[i++] = K<CfgP64x192Pp2l>::entry("64x192x128_c1x2_pingpong_2lvl");
  out[i++] = K<CfgP64x128Pp2l>::entry("64x128x128_c1x2_pingpong_2lvl");
  out[i++] = K<CfgDecodeSwapC4<64>>::entry("swap_128x64x128_c4x1_coop_streamk_2lvl");
  out[i++] = K<CfgDecodeSwapCoopFast<64, 4>>::entry("swap_128x64x128_c4x1_coop_streamk_fast");
  out[i++] = K<CfgP64x128PpFast>::entry("64x128x128_c1x2_pingpong_fast");
#endif
  return i;
}

}  // namespace jax_gmma
