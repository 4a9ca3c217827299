// Host-side numerics of the sanitizer driver (tools/sanitize/driver.cu): element decoders and
// encoders (bf16, f16, e4m3, e5m2, E8M0), the weight-only prepared-layout decoder and a seeded
// random source. Plain C++17, no CUDA: tools/sanitize/check_host_ref.py compiles it with g++ and
// compares the weight-only decoder with jax_gmma.weightonly.dequantize_packed on the CPU, so a
// layout change in the library shows up there instead of as a driver mismatch.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace sanitize {

// -- scalar conversions ------------------------------------------------------------------------

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(1024 + m), e - 25);
  return s ? -v : v;
}

// float8_e4m3fn: bias 7, no infinities, S.1111.111 is NaN.
inline float e4m3_to_f32(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  float v;
  if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -9);
  else v = std::ldexp(static_cast<float>(8 + m), e - 10);
  return s ? -v : v;
}

// float8_e5m2: bias 15, IEEE-like.
inline float e5m2_to_f32(uint8_t c) {
  const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
  float v;
  if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (e == 0) v = std::ldexp(static_cast<float>(m), -16);
  else v = std::ldexp(static_cast<float>(4 + m), e - 17);
  return s ? -v : v;
}

// float32 -> e4m3fn, round to nearest even, saturating to +-448 (cvt.rn.satfinite); NaN -> 0x7F
// with the sign. Exhaustive search over the 127 finite magnitudes: slow but obviously right.
inline uint8_t f32_to_e4m3_sat(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  const float a = std::fabs(x);
  if (a >= 448.f) return static_cast<uint8_t>(sign | 0x7E);
  int best = 0;
  float best_d = a;
  for (int c = 1; c <= 0x7E; ++c) {
    const float d = std::fabs(e4m3_to_f32(static_cast<uint8_t>(c)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

// E8M0: 2^(c - 127); 255 is NaN.
inline float e8m0_to_f32(uint8_t c) {
  if (c == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.f, static_cast<int>(c) - 127);
}

// -- a seeded random source (xorshift64*: the same stream on every platform) -------------------

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {
    if (s == 0) s = 1;
    for (int i = 0; i < 4; ++i) next();
  }
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
  int range(int lo, int hi) { return lo + static_cast<int>(u32() % static_cast<uint32_t>(hi - lo + 1)); }  // [lo, hi]
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(u32() >> 8) * (1.f / 16777216.f); }
};

inline uint64_t hash_name(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<uint8_t>(*s)) * 1099511628211ull;
  return h;
}

// Nonzero fp8 codes of moderate magnitude: e4m3 in [2^-2, 2^2), e5m2 likewise.
inline uint8_t random_e4m3(Rng& r) {
  return static_cast<uint8_t>((r.range(0, 1) << 7) | (r.range(5, 8) << 3) | r.range(0, 7));
}
inline uint8_t random_e5m2(Rng& r) {
  return static_cast<uint8_t>((r.range(0, 1) << 7) | (r.range(13, 16) << 2) | r.range(0, 3));
}

// -- the weight-only prepared layout (jax_gmma/ops/weightonly.py module docstring) -------------

enum WoFmt { kNvfp4 = 0, kMxfp4 = 1, kMxfp6E2M3 = 2, kMxfp6E3M2 = 3 };

inline const char* wo_fmt_name(int f) {
  switch (f) {
    case kNvfp4: return "nvfp4";
    case kMxfp4: return "mxfp4";
    case kMxfp6E2M3: return "mxfp6_e2m3";
    case kMxfp6E3M2: return "mxfp6_e3m2";
  }
  return "?";
}
inline int wo_tile_bytes(int f) { return f >= kMxfp6E2M3 ? 768 : 512; }
inline int wo_scale_bytes(int f) { return f == kNvfp4 ? 64 : 32; }
inline int wo_block_k(int f) { return f == kNvfp4 ? 16 : 32; }

// Element value of a code: e2m1 (4 bits), e2m3 / e3m2 (6 bits); sign in the top bit.
inline float wo_elem(int f, uint32_t code) {
  int ebits, mbits, bias;
  if (f <= kMxfp4) ebits = 2, mbits = 1, bias = 1;
  else if (f == kMxfp6E2M3) ebits = 2, mbits = 3, bias = 1;
  else ebits = 3, mbits = 2, bias = 3;
  const int nbits = 1 + ebits + mbits;
  const int s = (code >> (nbits - 1)) & 1;
  const int e = (code >> mbits) & ((1 << ebits) - 1);
  const int m = code & ((1 << mbits) - 1);
  float v = e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - mbits)
                   : std::ldexp(static_cast<float>((1 << mbits) + m), e - bias - mbits);
  return s ? -v : v;
}

// A block scale from its prepared code: NVFP4 bits(bf16 F) = 16 c + 0x7000, MX bits(F) =
// 128 (c + bias) with bias 116 (e2m1, e2m3) or 114 (e3m2); scale = F * 2^-bias.
inline float wo_scale_value(int f, uint8_t c) {
  if (f == kNvfp4) return std::ldexp(bf16_to_f32(static_cast<uint16_t>(16 * c + 0x7000)), -116);
  const int bias = f == kMxfp6E3M2 ? 114 : 116;
  return std::ldexp(bf16_to_f32(static_cast<uint16_t>(128 * (c + bias))), -bias);
}

// FP4: bit positions (sign, c2, c1, c0) of value v = h * 4 + kk of a 32-bit word.
inline const int* wo_fp4_bits(int v) {
  static const int pair_bits[4][2][4] = {
      {{15, 8, 7, 6}, {31, 24, 23, 22}},
      {{11, 4, 3, 2}, {27, 20, 19, 18}},
      {{5, 30, 29, 28}, {21, 14, 13, 12}},
      {{9, 10, 1, 0}, {25, 26, 17, 16}},
  };
  const int h = v / 4, kk = v % 4;
  return pair_bits[h + 2 * (kk / 2)][kk % 2];
}

// FP6: stream bit (0..95 of a 3-word group) of bit b of element e = 2 v + half, from the
// extraction pieces (lo, hi, r, shl, mask) of FP6_PIECES (weightonly.py, fp6_stream_bits).
struct Fp6Src {
  int bit[16][6];
  bool ok = true;
};
inline Fp6Src wo_fp6_src(int f) {
  struct Piece {
    int lo, hi, r, shl;
    uint32_t mask;
  };
  static const Piece e2m3[8][2] = {
      {{0, -1, 0, 4, 0x000081F0u}, {0, -1, 0, 14, 0x81F00000u}},
      {{0, 1, 8, 0, 0x000081F0u}, {0, -1, 0, 2, 0x81F00000u}},
      {{0, 1, 20, 0, 0x000081F0u}, {0, 1, 20, 10, 0x81F00000u}},
      {{1, -1, 0, 0, 0x000081F0u}, {1, -1, 0, 4, 0x81F00000u}},
      {{1, 2, 6, 0, 0x000081F0u}, {2, -1, 0, 12, 0x81F00000u}},
      {{1, 2, 18, 0, 0x000081F0u}, {1, 2, 18, 10, 0x81F00000u}},
      {{2, -1, 0, 2, 0x000081F0u}, {2, -1, 0, 6, 0x81F00000u}},
      {{2, 0, 22, 0, 0x000081F0u}, {2, -1, 0, 0, 0x81F00000u}},
  };
  static const Piece e3m2[8][3] = {
      {{0, -1, 0, 0, 0x83E083E0u}},
      {{0, -1, 0, 5, 0x83E083E0u}},
      {{1, -1, 0, 0, 0x83E083E0u}},
      {{1, -1, 0, 5, 0x83E083E0u}},
      {{2, -1, 0, 0, 0x83E083E0u}},
      {{2, -1, 0, 5, 0x83E083E0u}},
      {{0, -1, 6, 0, 0x01E001E0u}, {2, -1, 2, 0, 0x02000200u}, {2, -1, 0, 2, 0x80008000u}},
      {{1, -1, 6, 0, 0x01E001E0u}, {2, -1, 3, 0, 0x02000200u}, {2, -1, 0, 1, 0x80008000u}},
  };
  Fp6Src out;
  const int base = f == kMxfp6E2M3 ? 4 : 5;
  const int npieces = f == kMxfp6E2M3 ? 2 : 3;
  bool seen[96] = {};
  for (int v = 0; v < 8; ++v)
    for (int half = 0; half < 2; ++half)
      for (int b = 0; b < 6; ++b) {
        const int p = 16 * half + (b == 5 ? 15 : base + b);
        int hits = 0, st = -1;
        for (int i = 0; i < npieces; ++i) {
          const Piece& pc = f == kMxfp6E2M3 ? e2m3[v][i] : e3m2[v][i];
          if (pc.mask == 0 || !((pc.mask >> p) & 1u)) continue;
          ++hits;
          const int j = p - pc.shl + pc.r;
          if (p < pc.shl || (pc.hi < 0 && j >= 32)) out.ok = false;
          st = j < 32 ? 32 * pc.lo + j : 32 * pc.hi + j - 32;
        }
        if (hits != 1 || st < 0 || st >= 96 || seen[st]) out.ok = false;
        else seen[st] = true;
        out.bit[2 * v + half][b] = st < 0 ? 0 : st;
      }
  return out;
}

inline uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// The (N, Kp) weight a prepared (packed, scales) pair holds, code value x block scale (NVFP4's
// global scale not applied), row-major into w. False when the FP6 tables are inconsistent.
inline bool wo_decode(int f, int64_t n, int64_t kp, const uint8_t* packed, const uint8_t* scales,
                      std::vector<float>& w) {
  const int64_t strips = n / 16, ks = kp / 64;
  const int tb = wo_tile_bytes(f), sb = wo_scale_bytes(f), bk = wo_block_k(f);
  w.assign(static_cast<size_t>(n * kp), 0.f);
  std::vector<uint32_t> codes(static_cast<size_t>(n * kp), 0);
  Fp6Src src;
  if (f >= kMxfp6E2M3) {
    src = wo_fp6_src(f);
    if (!src.ok) return false;
  }
  for (int64_t s = 0; s < strips; ++s)
    for (int64_t j = 0; j < ks; ++j) {
      const uint8_t* tile = packed + (s * ks + j) * tb;
      for (int g = 0; g < 8; ++g)
        for (int t = 0; t < 4; ++t) {
          const int lane = 4 * g + t;
          if (f <= kMxfp4) {
            for (int q = 0; q < 4; ++q) {
              const uint32_t word = le32(tile + 16 * lane + 4 * q);
              for (int v = 0; v < 8; ++v) {
                const int h = v / 4, kk = v % 4;
                const int* pos = wo_fp4_bits(v);
                uint32_t code = 0;
                for (int i = 0; i < 4; ++i) code |= ((word >> pos[i]) & 1u) << (3 - i);
                const int64_t row = 16 * s + 8 * h + g, k = 64 * j + 16 * t + 4 * q + kk;
                codes[row * kp + k] = code;
              }
            }
          } else {
            uint32_t words[6];
            for (int i = 0; i < 4; ++i) words[i] = le32(tile + 16 * lane + 4 * i);
            for (int i = 0; i < 2; ++i) words[4 + i] = le32(tile + 512 + 8 * lane + 4 * i);
            for (int grp = 0; grp < 2; ++grp)
              for (int e = 0; e < 16; ++e) {
                uint32_t code = 0;
                for (int b = 0; b < 6; ++b) {
                  const int st = src.bit[e][b];
                  code |= ((words[3 * grp + st / 32] >> (st % 32)) & 1u) << b;
                }
                const int v = e / 2, half = e % 2, i = v % 4;
                const int h = i % 2, q = 2 * grp + v / 4, kk = 2 * (i / 2) + half;
                const int64_t row = 16 * s + 8 * h + g, k = 64 * j + 16 * t + 4 * q + kk;
                codes[row * kp + k] = code;
              }
          }
        }
    }
  for (int64_t row = 0; row < n; ++row) {
    const int64_t s = row / 16, h = (row % 16) / 8, g = row % 8;
    for (int64_t k = 0; k < kp; ++k) {
      const int64_t j = k / 64, b = (k % 64) / bk;
      const uint8_t c = scales[(s * ks + j) * sb + b * 16 + g * 2 + h];
      w[row * kp + k] = wo_elem(f, codes[row * kp + k]) * wo_scale_value(f, c);
    }
  }
  return true;
}

}  // namespace sanitize
