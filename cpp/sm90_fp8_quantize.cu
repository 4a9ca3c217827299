// Activation quantization to float8_e4m3fn with per-row K-block scales (fp8_1x128 and mxfp8),
// bit-identical to jax_gmma.quantize as XLA runs it on the GPU. Plain CUDA (no CUTLASS); the
// C interface and the exact maths are in cpp/include/jax_gmma/quantize_api.h.
//
// Work split (bandwidth bound: read 2 or 4 bytes, write 1 per element): the padded matrix is
// cut into row segments of 128 elements; 8 consecutive threads own one segment, 16
// consecutive elements each, read with back-to-back 16-byte loads (two for 16-bit inputs, four
// for float32) that are all in flight together. A block of 256 threads owns 32 consecutive
// segments (row-major order, so a warp reads 1 KB of contiguous bf16 when K % 128 == 0). The
// block amax is a butterfly of warp shuffles among the 8 threads of a segment (block 128) or
// the 2 threads of a 32-block (MX); no shared memory, no second pass. Each thread stores its
// 16 fp8 bytes with one 16-byte store; the first thread of each scale block stores the scale
// (MXFP8: row-major, or straight into the swizzled 128 x 4 atoms the GEMMs read, whose padding
// rows are zeroed by extra CTAs of the same launch).
//
// Bit-exactness with the reference (jax_gmma.quantize._quantize_impl compiled by XLA):
//  * scale: XLA's algebraic simplifier rewrites `amax / 448` into `amax * f32(1/448)`, so the
//    kernel multiplies by the same rounded constant; then max(., 2^-126), and 1 for amax == 0;
//  * elements: `x / scale` is an f32 fdiv, which XLA's NVPTX backend lowers to div.full.f32
//    (-nvptx-prec-divf32=1): the kernel issues the same instruction (JAX_GMMA_QUANT_DIV_XLA_GPU;
//    the IEEE and reciprocal variants exist in case a JAX version compiles it otherwise);
//  * the e4m3 conversion is XLA's: cvt.rn.satfinite.e4m3x2.f32 (round to nearest even) after
//    the clip to +-448, with +-Inf mapped to NaN (0x7F | sign) as XLA's conversion does;
//    NaN goes through the same cvt;
//  * MX: exponent from the float32 bits of amax (= frexp), elements x * 2^-e (exact scaling).
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "jax_gmma/gemm_api.h"  // mx_sf_word_offset
#include "jax_gmma/quantize_api.h"

namespace {

constexpr int kSeg = 128;                           // elements of one row segment
constexpr int kVec = 16;                            // consecutive elements per thread
constexpr int kSegThreads = kSeg / kVec;            // 8 threads per segment
constexpr int kThreads = 256;
constexpr int kSegsPerBlock = kThreads / kSegThreads;  // 32

constexpr float kInvE4M3Max = 0x1.24924ap-9f;  // float32(1) / float32(448), rounded to nearest
constexpr float kF32Tiny = 0x1p-126f;          // smallest normal float32 (minimum scale)
constexpr int kMxEmaxE4M3 = 8;                 // exponent of e4m3's largest normal (1.75 * 2^8)

// Quotient of n < 2^31 by a fixed divisor d >= 1 with one multiply-high: m = ceil(2^p / d)
// with p = 31 + ceil(log2 d) fits in 32 bits, and floor(n * m / 2^p) == n / d for n < 2^31.
struct FastDiv {
  uint32_t d = 1, mul = 0, shr = 0;
  explicit FastDiv(uint32_t divisor) : d(divisor) {
    if (d == 1) return;
    uint32_t l = 0;
    while ((uint64_t{1} << l) < d) ++l;
    const uint32_t p = 31 + l;
    mul = static_cast<uint32_t>(((uint64_t{1} << p) + d - 1) / d);
    shr = p - 32;
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return d == 1 ? n : __umulhi(n, mul) >> shr;
  }
};

// -- loads: 16 consecutive elements, widened exactly to float32 -----------------------------

// Element storage types; from_bits widens one 16-bit pattern.
struct Bf16 {
  uint16_t bits;
  static __device__ __forceinline__ float from_bits(uint32_t b) { return __uint_as_float(b << 16); }
};
struct F16 {
  uint16_t bits;
  static __device__ __forceinline__ float from_bits(uint32_t b) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  }
};
__device__ __forceinline__ float to_f32(Bf16 v) { return Bf16::from_bits(v.bits); }
__device__ __forceinline__ float to_f32(F16 v) { return F16::from_bits(v.bits); }
__device__ __forceinline__ float to_f32(float v) { return v; }

// Vectorized path: p 16-byte aligned, all 16 elements inside the row. ld.global.cs: the input
// is read once (evict-first in L1 and L2, which keeps L2 for the GEMM that reads our output).
template <typename T>
constexpr int kLoads = kVec * static_cast<int>(sizeof(T)) / 16;  // 16-byte loads per thread

template <typename T>
__device__ __forceinline__ void load_raw(const T* p, uint4 (&w)[kLoads<T>]) {
#pragma unroll
  for (int i = 0; i < kLoads<T>; ++i) w[i] = __ldcs(reinterpret_cast<const uint4*>(p) + i);
}

template <typename T>
__device__ __forceinline__ void convert_raw(const uint4 (&w)[kLoads<T>], float (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < kLoads<T>; ++i) {
    const uint32_t words[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (sizeof(T) == 4) {
        v[4 * i + j] = __uint_as_float(words[j]);
      } else {  // little endian: the even element is the low half of a word
        v[8 * i + 2 * j] = T::from_bits(words[j] & 0xFFFFu);
        v[8 * i + 2 * j + 1] = T::from_bits(words[j] >> 16);
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ void load_scalar(const T* row, int64_t col, int64_t k, float (&v)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = col + i < k ? to_f32(row[col + i]) : 0.0f;
}

// -- element maths --------------------------------------------------------------------------

__device__ __forceinline__ float div_full(float a, float b) {
  float q;
  asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
  return q;
}

__device__ __forceinline__ bool is_finite(float v) {
  return (__float_as_uint(v) & 0x7F800000u) != 0x7F800000u;
}

// Four float32 values -> four e4m3 codes in one word, the first in the low byte: round to
// nearest even, saturating to +-448 (so the reference's clip needs no instruction of its
// own), NaN -> NaN. (cvt d, a, b puts a in the high byte of d.)
__device__ __forceinline__ uint32_t cvt_e4m3x4(float a, float b, float c, float d) {
  uint32_t out;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(out) : "f"(a), "f"(b), "f"(c), "f"(d));
  return out;
}

// max(a, b) propagating NaN (PTX max.NaN): one chain finds the amax and flags NaN / Inf.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// XLA's f32 -> e4m3fn conversion maps +-Inf to NaN with its sign (0x7F / 0xFF), where the
// saturating cvt gives +-448: patch the code of an infinite input.
__device__ __forceinline__ uint32_t fix_inf(uint32_t code, float a, int shift) {
  if (!isinf(a)) return code;
  const uint32_t nan = 0x7Fu | ((__float_as_uint(a) >> 24) & 0x80u);
  return (code & ~(0xFFu << shift)) | (nan << shift);
}

// The kernel. kBlock 128: float32 scales (kDiv picks the division); kBlock 32: E8M0 bytes.
// Segments handled per thread: their loads are issued together, so a thread keeps
// kUnroll x 32 bytes in flight. Measured on the H200 with benchmarks/kernels/bench_quantize_kernel.cu
// (4096 x 7168 bf16 -> fp8_1x128, kernel alone): 25.6 / 25.9 / 26.3 / 30.1 us at unroll
// 1 / 2 / 4 / 8, i.e. ~3.4 TB/s, 0.85x the time of a cudaMemcpy of the bf16 input (3.8 TB/s).
#ifndef JAX_GMMA_QUANT_UNROLL
#define JAX_GMMA_QUANT_UNROLL 4
#endif
constexpr int kUnroll = JAX_GMMA_QUANT_UNROLL;

// Where this thread's part of segment `seg` is: (live, row, first column).
__device__ __forceinline__ void locate(uint32_t seg, uint32_t num_segs, FastDiv segs_per_row,
                                      bool* live, int64_t* row, int64_t* col) {
  *live = seg < num_segs;
  const uint32_t r = *live ? segs_per_row.div(seg) : 0;
  *row = r;
  *col = static_cast<int64_t>(*live ? seg - r * segs_per_row.d : 0) * kSeg +
         (threadIdx.x % kSegThreads) * kVec;
}

// Where the scales go: row-major (M, nb), or for block 32 optionally the swizzled 128 x 4
// atoms of jax_gmma.layouts "sm100_128x4" (jax_gmma::mx_sf_word_offset, k_atoms = ceil(nb / 4)),
// whose K padding (blocks nb .. 4 k_atoms - 1 of a row) the thread of block nb - 1 zeroes.
struct ScaleOut {
  void* p;
  int64_t nb;
  int64_t k_atoms;  // 0: row-major
};

// One segment (16 elements of this thread, 128 with its 7 neighbours): amax, scale, convert,
// store. Every thread of the warp calls it for every segment (the amax is a warp shuffle).
template <typename T, int kBlock, int kDiv, bool kVectorized>
__device__ __forceinline__ void quantize_segment(const T* __restrict__ x, int64_t k, int64_t kp,
                                                 ScaleOut so, bool live, int64_t row, int64_t col,
                                                 const uint4 (&raw)[kLoads<T>],
                                                 uint8_t* __restrict__ data,
                                                 bool data_aligned16) {
  constexpr int kBlockThreads = kBlock / kVec;  // threads per scale block: 8 or 2
  const int lane = threadIdx.x % kSegThreads;

  float v[kVec];
  if (live && col < k) {
    if constexpr (kVectorized) convert_raw<T>(raw, v);  // K % 16 == 0: all 16 inside
    else load_scalar(x + row * k, col, k, v);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = 0.0f;
  }

  // amax over the finite values. Fast path: one NaN-propagating max chain; a NaN or Inf
  // (rare) makes it non-finite and sends this thread through the exact element-wise variant.
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) amax = max_nan(amax, fabsf(v[i]));
  const bool nonfinite = !(amax < INFINITY);
  if (nonfinite) {
    amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) amax = fmaxf(amax, is_finite(v[i]) ? fabsf(v[i]) : 0.0f);
  }
  // Butterfly among the threads of one scale block. Every thread of the warp takes part (dead
  // segments hold zeros and their partners are dead too), so the full mask is exact.
#pragma unroll
  for (int off = kBlockThreads / 2; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));

  float scale = 1.0f, inv = 1.0f;
  uint8_t e8m0 = 127;
  if constexpr (kBlock == 128) {
    const float s = fmaxf(__fmul_rn(amax, kInvE4M3Max), kF32Tiny);
    scale = amax > 0.0f ? s : 1.0f;
    // XLA divides each element with div.full.f32(x, scale). For a divisor in [2^-126, 2^126]
    // ptxas expands that to x * rcp.approx(scale) with no operand scaling (checked in the
    // SASS), and every scale lies there: scale >= 2^-126 and scale <= FLT_MAX / 448 < 2^120.
    // So the reciprocal is taken once per block, by the same instruction: div.full(1, scale).
    if constexpr (kDiv == JAX_GMMA_QUANT_DIV_XLA_GPU) inv = div_full(1.0f, scale);
  } else {
    // e = floor(log2(amax)) - 8 from the exponent bits (amax is finite), clamped to
    // [-126, 127]; 0 for zero or subnormal amax. 2^-e is then a normal float32 (e <= 119).
    int e = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFFu) - 127 - kMxEmaxE4M3;
    e = amax >= kF32Tiny ? max(-126, min(127, e)) : 0;
    e8m0 = static_cast<uint8_t>(e + 127);
    inv = __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
  }

  // Elements: the saturating cvt does the reference's clip to +-448. Non-finite inputs keep
  // their own value (NaN through the same cvt as XLA's; Inf patched to NaN).
  float t[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if constexpr (kBlock == 128 && kDiv == JAX_GMMA_QUANT_DIV_IEEE) t[i] = __fdiv_rn(v[i], scale);
    else t[i] = __fmul_rn(v[i], inv);
  }
  uint32_t codes[kVec / 4];
  if (!nonfinite) {
#pragma unroll
    for (int i = 0; i < kVec; i += 4) codes[i / 4] = cvt_e4m3x4(t[i], t[i + 1], t[i + 2], t[i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) t[i] = is_finite(v[i]) ? t[i] : v[i];
#pragma unroll
    for (int i = 0; i < kVec; i += 4) {
      uint32_t c = cvt_e4m3x4(t[i], t[i + 1], t[i + 2], t[i + 3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) c = fix_inf(c, v[i + j], 8 * j);
      codes[i / 4] = c;
    }
  }
  if (!live || col >= kp) return;  // MX: the segment may run past Kp (a multiple of 32)
  uint8_t* out = data + row * kp + col;  // a multiple of 16 bytes past data (Kp % 32 == 0)
  if (data_aligned16) {
    *reinterpret_cast<uint4*>(out) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
  } else {  // never with XLA's buffers; kept for the C interface's "any alignment" promise
#pragma unroll
    for (int i = 0; i < kVec; ++i) out[i] = static_cast<uint8_t>(codes[i / 4] >> (8 * (i % 4)));
  }
  if (lane % kBlockThreads == 0) {
    const int64_t kb = col / kBlock;
    if constexpr (kBlock == 128) {
      static_cast<float*>(so.p)[row * so.nb + kb] = scale;
    } else if (so.k_atoms == 0) {
      static_cast<uint8_t*>(so.p)[row * so.nb + kb] = e8m0;
    } else {
      uint8_t* word =
          static_cast<uint8_t*>(so.p) + jax_gmma::mx_sf_word_offset(row, kb >> 2, so.k_atoms);
      word[kb & 3] = e8m0;
      if (kb == so.nb - 1)
        for (int64_t b = (kb & 3) + 1; b < 4; ++b) word[b] = 0;  // the row's K padding
    }
  }
}

// The swizzled layout's row padding (rows M .. 128 ceil(M / 128) - 1): zero words, one per
// thread, in the CTAs after the quantizing ones.
__device__ __forceinline__ void zero_pad_rows(int64_t m, int64_t k_atoms, uint32_t cta,
                                              uint8_t* __restrict__ scales) {
  const int64_t i = static_cast<int64_t>(cta) * kThreads + threadIdx.x;
  const int64_t pad_rows = (m + 127) / 128 * 128 - m;
  if (i >= pad_rows * k_atoms) return;
  const int64_t r = m + i / k_atoms, j = i % k_atoms;
  *reinterpret_cast<uint32_t*>(scales + jax_gmma::mx_sf_word_offset(r, j, k_atoms)) = 0u;
}

template <typename T, int kBlock, int kDiv, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
fp8_quantize_kernel(const T* __restrict__ x, int64_t m, int64_t k, int64_t kp, ScaleOut so,
                    uint32_t num_segs, uint32_t quant_ctas, FastDiv segs_per_row,
                    uint8_t* __restrict__ data, bool data_aligned16) {
  if (blockIdx.x >= quant_ctas) {  // swizzled scales: the padding rows
    zero_pad_rows(m, so.k_atoms, blockIdx.x - quant_ctas, static_cast<uint8_t*>(so.p));
    return;
  }
  bool live[kUnroll];
  int64_t row[kUnroll], col[kUnroll];
  uint4 raw[kUnroll][kLoads<T>];
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const uint32_t seg = (blockIdx.x * kUnroll + j) * kSegsPerBlock + threadIdx.x / kSegThreads;
    locate(seg, num_segs, segs_per_row, &live[j], &row[j], &col[j]);
    if constexpr (kVectorized)
      if (live[j] && col[j] < k) load_raw<T>(x + row[j] * k + col[j], raw[j]);
  }
#pragma unroll
  for (int j = 0; j < kUnroll; ++j)
    quantize_segment<T, kBlock, kDiv, kVectorized>(x, k, kp, so, live[j], row[j], col[j], raw[j],
                                                   data, data_aligned16);
}

template <typename T, int kBlock, int kDiv>
cudaError_t launch(const void* x, int64_t m, int64_t k, void* data, void* scales, bool swizzled,
                   cudaStream_t stream) {
  const int64_t kp = jax_gmma_quantize_padded_k(k, kBlock);
  const int64_t nb = kp / kBlock;
  const ScaleOut so{scales, nb, swizzled ? (nb + 3) / 4 : 0};
  const int64_t segs_per_row = (kp + kSeg - 1) / kSeg;
  if (m > ((int64_t{1} << 31) - 1) / segs_per_row) return cudaErrorInvalidValue;  // FastDiv range
  const int64_t num_segs = m * segs_per_row;
  const int64_t segs_per_cta = int64_t{kSegsPerBlock} * kUnroll;
  const int64_t quant_ctas = (num_segs + segs_per_cta - 1) / segs_per_cta;
  const int64_t pad_words = swizzled ? ((m + 127) / 128 * 128 - m) * so.k_atoms : 0;
  const dim3 grid(static_cast<unsigned>(quant_ctas + (pad_words + kThreads - 1) / kThreads));
  const FastDiv div(static_cast<uint32_t>(segs_per_row));
  // 16-byte loads need 16-byte aligned rows and whole 16-element chunks (K % 16 == 0).
  const bool vectorized = k % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const bool data_aligned16 = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  auto* xt = static_cast<const T*>(x);
  auto* d8 = static_cast<uint8_t*>(data);
  if (vectorized)
    fp8_quantize_kernel<T, kBlock, kDiv, true><<<grid, kThreads, 0, stream>>>(
        xt, m, k, kp, so, static_cast<uint32_t>(num_segs), static_cast<uint32_t>(quant_ctas), div,
        d8, data_aligned16);
  else
    fp8_quantize_kernel<T, kBlock, kDiv, false><<<grid, kThreads, 0, stream>>>(
        xt, m, k, kp, so, static_cast<uint32_t>(num_segs), static_cast<uint32_t>(quant_ctas), div,
        d8, data_aligned16);
  return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch_block(const void* x, int64_t m, int64_t k, int block, int div_mode,
                           bool swizzled, void* data, void* scales, cudaStream_t stream) {
  if (block == 32)
    return launch<T, 32, JAX_GMMA_QUANT_DIV_XLA_GPU>(x, m, k, data, scales, swizzled, stream);
  if (swizzled) return cudaErrorInvalidValue;  // float32 1x128 scales stay row-major
  switch (div_mode) {
    case JAX_GMMA_QUANT_DIV_XLA_GPU:
      return launch<T, 128, JAX_GMMA_QUANT_DIV_XLA_GPU>(x, m, k, data, scales, false, stream);
    case JAX_GMMA_QUANT_DIV_IEEE:
      return launch<T, 128, JAX_GMMA_QUANT_DIV_IEEE>(x, m, k, data, scales, false, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) cudaError_t jax_gmma_fp8_quantize_ex(
    const void* x, int in_dtype, int64_t m, int64_t k, int block, int div_mode, int scale_layout,
    void* data, void* scales, cudaStream_t stream) {
  if (m == 0) return cudaSuccess;  // nothing to do (and XLA may hand out null buffers)
  if (m < 0 || k < 1 || (block != 128 && block != 32) || !x || !data || !scales)
    return cudaErrorInvalidValue;
  if (scale_layout != JAX_GMMA_QUANT_SCALES_ROWMAJOR &&
      scale_layout != JAX_GMMA_QUANT_SCALES_SM100_128X4)
    return cudaErrorInvalidValue;
  const bool swz = scale_layout == JAX_GMMA_QUANT_SCALES_SM100_128X4;
  if (swz && reinterpret_cast<uintptr_t>(scales) % 4 != 0) return cudaErrorInvalidValue;
  switch (in_dtype) {
    case JAX_GMMA_QUANT_IN_BF16:
      return dispatch_block<Bf16>(x, m, k, block, div_mode, swz, data, scales, stream);
    case JAX_GMMA_QUANT_IN_F16:
      return dispatch_block<F16>(x, m, k, block, div_mode, swz, data, scales, stream);
    case JAX_GMMA_QUANT_IN_F32:
      return dispatch_block<float>(x, m, k, block, div_mode, swz, data, scales, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

extern "C" __attribute__((visibility("default"))) cudaError_t jax_gmma_fp8_quantize(
    const void* x, int in_dtype, int64_t m, int64_t k, int block, int div_mode, void* data,
    void* scales, cudaStream_t stream) {
  return jax_gmma_fp8_quantize_ex(x, in_dtype, m, k, block, div_mode,
                                  JAX_GMMA_QUANT_SCALES_ROWMAJOR, data, scales, stream);
}
