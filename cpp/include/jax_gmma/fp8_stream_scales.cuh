// jax-gmma: the scale policies of the FP8 weight-streaming kernels (cpp/include/jax_gmma/
// fp8_stream.cuh), one per way the FP8 formats scale along K. The dense streaming families
// (cpp/sm90_fp8_gemm_blockwise_stream.cu, cpp/sm90_mxf8_gemm_blockscaled_stream.cu) and the
// grouped one (cpp/sm90_fp8_gemm_grouped_stream.cu) take them from here.
//
// Besides fp8_stream.cuh's interface (Args, Word, kGroup, kSpecial, load_w, load_x, scale,
// special), each policy's Args has sb (the weight scales) and sb_expert, the distance between
// two experts' weight scales in elements of sb, set by the host for the grouped kernel (the
// dense kernels leave it 0): fp8_stream.cuh's expert_scales() moves sb to expert e's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "jax_gmma/e8m0.cuh"
#include "jax_gmma/fp8_stream.cuh"
#include "jax_gmma/gemm_api.h"

namespace jax_gmma::fp8_stream {

// float32 scales per 128 of K (DeepSeek-V3 style): one per token and 128-K step (1x128) and per
// weight row block r / G and step (G = 128: 128x128 blocks, G = 1: 1x128), in the MN-major
// layout of gemm_api.h. The four MMAs of a 128-K step accumulate into one fresh fragment.
template <int G>
struct Block128Scales {
  struct Args {
    const float* sa;  // (kb, lda): token m, block kb at [kb * lda + m]
    const float* sb;  // (kb, ldb): weight row block r / G at [kb * ldb + r / G]
    int64_t lda, ldb;
    int64_t sb_expert;
  };
  using Word = float;
  static constexpr int kGroup = 4;
  static constexpr bool kSpecial = false;
  __device__ static Word load_w(const Args& s, int64_t row, int64_t j) {
    return __ldg(s.sb + j * s.ldb + row / G);
  }
  __device__ static Word load_x(const Args& s, int64_t tok, int64_t j) {
    return __ldg(s.sa + j * s.lda + tok);
  }
  template <bool kExact>
  __device__ static float scale(Word v, int) { return v; }
  __device__ static uint32_t special(Word) { return 0; }
};

// MXFP8: E8M0 codes in the swizzled 128x4-atom layout, one 32-bit word (four 32-K blocks) per
// row and 128-K step; per 32-K block one MMA into a fresh fragment.
struct MxScales {
  struct Args {
    const uint8_t* sa;  // swizzled E8M0, M rows
    const uint8_t* sb;  // swizzled E8M0, N rows
    int64_t k_atoms;    // 4-block atoms along K: ceil(K / 128)
    int64_t sb_expert;  // bytes
  };
  using Word = uint32_t;
  static constexpr int kGroup = 1;
  static constexpr bool kSpecial = true;
  __device__ static Word load_w(const Args& s, int64_t row, int64_t j) {
    return ld_u32_nc(s.sb + mx_sf_word_offset(row, j, s.k_atoms));
  }
  __device__ static Word load_x(const Args& s, int64_t tok, int64_t j) {
    return __ldg(reinterpret_cast<const uint32_t*>(s.sa + mx_sf_word_offset(tok, j, s.k_atoms)));
  }
  // Block b's float32 scale. Fast: the code shifted into the float32 exponent (exact for codes
  // 1 .. 254); a step whose codes include 0 (2^-127) or 255 (NaN) takes the exact conversion
  // (the tail step always does).
  template <bool kExact>
  __device__ static float scale(Word v, int b) {
    if constexpr (kExact) return e8m0_to_float((v >> (8 * b)) & 0xff);
    return __uint_as_float((b < 3 ? v << (23 - 8 * b) : v >> 1) & 0x7F800000u);
  }
  __device__ static uint32_t special(Word v) {  // a byte equal to 0x00 or 0xFF
    return ((v - 0x01010101u) & ~v & 0x80808080u) | ((~v - 0x01010101u) & v & 0x80808080u);
  }
};

// FP8 per-tensor / per-channel scales (float32, constant along K): one per token or one for all
// tokens, one per weight row or one per weight. Applied every 128 of K like the block scales
// (acc += (sb * sa) * part): the same value as scaling the whole sum once, up to the float32
// rounding of the partial sums.
struct RowScales {
  struct Args {
    const float* sa;       // (M,) or (1,)
    const float* sb;       // (N,) or (1,) per expert
    int64_t sa_step, sb_step;  // 1: per row, 0: per tensor
    int64_t sb_expert;
  };
  using Word = float;
  static constexpr int kGroup = 4;
  static constexpr bool kSpecial = false;
  __device__ static Word load_w(const Args& s, int64_t row, int64_t) { return __ldg(s.sb + row * s.sb_step); }
  __device__ static Word load_x(const Args& s, int64_t tok, int64_t) { return __ldg(s.sa + tok * s.sa_step); }
  template <bool kExact>
  __device__ static float scale(Word v, int) { return v; }
  __device__ static uint32_t special(Word) { return 0; }
};

}  // namespace jax_gmma::fp8_stream
