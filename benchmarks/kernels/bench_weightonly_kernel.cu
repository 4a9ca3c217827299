// Kernel-level timing of the FP4 / FP6 weight-only GEMMs (cpp/sm90_fp{4,6}_gemm_weightonly.cu) for tuning:
// no JAX, no correctness (tests/test_weightonly.py does that), CUDA events around back-to-back
// launches on enough distinct weight copies to defeat the 60 MB L2. Build (CPU machine) and run:
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include [-DJAX_GMMA_WO_DEPTH=4] benchmarks/kernels/bench_weightonly_kernel.cu -o wo_bench
//   Tuning hooks (never set by the library build): -include a header that defines
//   JAX_GMMA_WO_CTA_SHAPES (another kWoCtaShapes table, weightonly_common.cuh; the first row is
//   the reference of the shape check), -DJAX_GMMA_WO_MIN_WARPS=W (FP4 kernels: __launch_bounds__
//   asks for W resident warps per SM, capping registers), -DJAX_GMMA_WO_DEPTH=D (even; every FP4
//   tile, the library's 2-step rule for the 16x8 kw8 tile off).
//   -DJAX_GMMA_WO_ABLATE=1 / 2 (weightonly_common.cuh: drop MMAs / activation loads, wrong results,
//   timing only); -DJAX_GMMA_WO_TC_ABLATE=1 / 2 / 3 (weightonly_wgmma.cuh, the tensor-core kernel:
//   drop the register-ring activation traffic / the weight traffic / both; timing only).
//
//   ./wo_bench [iters] [format]   # format: nvfp4 (default), mxfp4, mxfp6_e2m3, mxfp6_e3m2, all
//                                 # prints one line per (format, shape, M, CTA shape): us, GB/s
//   ./wo_bench one FMT M N K [ROWS TOKENS KWARPS] [ITERS]   # one point (the tensor-core shapes
//                                 # read an x already tiled, as jax_gmma.weightonly.tiled_x writes it)
//   ./wo_bench unpack [iters] [format]   # the prefill unpack kernel (weightonly_unpack_run):
//       first checks bf16 and e4m3 outputs bit-exactly against a host decode of random prepared
//       bytes (incl. poisoned blocks and extreme row exponents; exit code 1 on a mismatch),
//       then times N x K = 8192 x 8192 and 28672 x 8192: us and GB/s of bytes read + written.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <cstring>

#include "../../cpp/sm90_fp4_gemm_weightonly.cu"
#include "../../cpp/sm90_fp6_gemm_weightonly.cu"

#include "../../tools/cuda_check.h"

namespace timing {
using jax_gmma::WoScale;

// Prepared-weight copies of one N x K (codes 0x35, every block scale 1.0), enough of them to
// exceed 256 MB, so that each timed launch streams its weight from HBM, not from the L2.
struct WeightCopies {
  int64_t wbytes, sbytes;
  std::vector<void*> w, s;
  WeightCopies(WoScale f, int64_t n, int64_t k)
      : wbytes(n * k / 1024 * jax_gmma::weightonly_tile_bytes(f)),
        sbytes(n * k / 1024 * jax_gmma::weightonly_scale_bytes(f)) {
    const int copies = static_cast<int>((256LL << 20) / (wbytes + sbytes)) + 2;
    w.resize(copies);
    s.resize(copies);
    for (int c = 0; c < copies; ++c) {
      CHECK(cudaMalloc(&w[c], wbytes));
      CHECK(cudaMalloc(&s[c], sbytes));
      CHECK(cudaMemset(w[c], 0x35, wbytes));
      CHECK(cudaMemset(s[c], f == WoScale::kNv16 ? 0x98 : 127, sbytes));
    }
  }
  ~WeightCopies() {
    for (size_t c = 0; c < w.size(); ++c) {
      cudaFree(w[c]);
      cudaFree(s[c]);
    }
  }
  int count() const { return static_cast<int>(w.size()); }
};

// Microseconds per launch: launch(w, s) once per copy (warm-up), then `iters` times cycling
// through the copies between two CUDA events.
template <class Launch>
double us_per_launch(const WeightCopies& wc, int iters, Launch&& launch) {
  for (int i = 0; i < wc.count(); ++i) CHECK(launch(wc.w[i], wc.s[i]));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) launch(wc.w[i % wc.count()], wc.s[i % wc.count()]);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return ms * 1e3 / iters;
}

struct Fmt { const char* name; WoScale s; };
constexpr Fmt kFormats[] = {{"nvfp4", WoScale::kNv16}, {"mxfp4", WoScale::kMx32},
                            {"mxfp6_e2m3", WoScale::kMx6E2M3}, {"mxfp6_e3m2", WoScale::kMx6E3M2}};

}  // namespace timing


namespace unpack_bench {
using namespace jax_gmma;
using timing::Fmt;

// e4m3 code of x: round to nearest even, saturating to +-448 (cvt.rn.satfinite); x finite.
uint8_t e4m3_rn_sat(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  if (a < std::ldexp(1.0, -6)) {  // subnormal: multiples of 2^-9 (8 -> the min normal, code 8)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0));
  }
  int e;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int E = e - 1;                       // a = (2m) 2^E, 2m in [1, 2)
  int q = static_cast<int>(std::nearbyint((2.0 * m - 1.0) * 8.0));
  if (q == 8) { q = 0; ++E; }
  const int code = ((E + 7) << 3) | q;
  return sign | static_cast<uint8_t>(code > 0x7E ? 0x7E : code);
}

uint16_t bf16_bits(double x) {  // x exactly representable (or Inf / NaN)
  if (std::isnan(x)) return 0x7FC0;
  float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

double bf16_value(uint32_t bits) {
  uint32_t u = (bits & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Value of a code: e2m1 (3-bit magnitude), e2m3 / e3m2 (5-bit magnitude).
double code_value(WoScale s, uint32_t sign, uint32_t mag) {
  double v;
  if (s == WoScale::kNv16 || s == WoScale::kMx32) {
    static const double t[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    v = t[mag];
  } else if (s == WoScale::kMx6E2M3) {
    const int E = mag >> 3, M = mag & 7;
    v = E == 0 ? M / 8.0 : std::ldexp(1.0 + M / 8.0, E - 1);
  } else {
    const int E = mag >> 2, M = mag & 3;
    v = E == 0 ? M / 16.0 : std::ldexp(1.0 + M / 4.0, E - 3);
  }
  return sign ? -v : v;
}

// Stream bit of bit b (5: sign) of FP6 code e = 2 v + half, from the kernel's piece table (the
// C++ port of jax_gmma.weightonly.fp6_stream_bits).
template <WoScale S>
void fp6_stream_bits(int (&out)[16][6]) {
  const int base = S == WoScale::kMx6E2M3 ? 4 : 5;
  for (int v = 0; v < 8; ++v)
    for (int half = 0; half < 2; ++half)
      for (int b = 0; b < 6; ++b) {
        const int p = 16 * half + (b == 5 ? 15 : base + b);
        int hits = 0;
        for (int i = 0; i < 3; ++i) {
          const fp6::Piece pc = fp6::Fp6Pieces<S>::get(v, i);
          if (!((pc.mask >> p) & 1u)) continue;
          ++hits;
          const int j = p - pc.shl + pc.r;
          out[2 * v + half][b] = j < 32 ? 32 * pc.lo + j : 32 * pc.hi + j - 32;
        }
        if (hits != 1) { std::printf("bad FP6 piece table\n"); std::exit(1); }
      }
}

// w[r * k + c] (double: exact value * scale; Inf / NaN for poisoned blocks) from prepared bytes.
void host_decode(WoScale s, int64_t n, int64_t k, const std::vector<uint8_t>& pk,
                 const std::vector<uint8_t>& sc, std::vector<double>& w) {
  const int64_t ks = k / 64;
  const int tb = (int)weightonly_tile_bytes(s), sb = (int)weightonly_scale_bytes(s);
  const bool fp6 = s == WoScale::kMx6E2M3 || s == WoScale::kMx6E3M2;
  int bits[16][6];
  if (s == WoScale::kMx6E2M3) fp6_stream_bits<WoScale::kMx6E2M3>(bits);
  if (s == WoScale::kMx6E3M2) fp6_stream_bits<WoScale::kMx6E3M2>(bits);
  // jax_gmma.weightonly.FP4_PAIR_BITS: [pair][half] = bit positions of (sign, c2, c1, c0)
  static const int fp4_bits[4][2][4] = {{{15, 8, 7, 6}, {31, 24, 23, 22}},
                                        {{11, 4, 3, 2}, {27, 20, 19, 18}},
                                        {{5, 30, 29, 28}, {21, 14, 13, 12}},
                                        {{9, 10, 1, 0}, {25, 26, 17, 16}}};
  w.assign(n * k, 0.0);
  for (int64_t st = 0; st < n / 16; ++st)
    for (int64_t j = 0; j < ks; ++j) {
      const uint8_t* tile = pk.data() + (st * ks + j) * tb;
      const uint8_t* tsc = sc.data() + (st * ks + j) * sb;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        uint32_t words[6];
        std::memcpy(words, tile + 16 * lane, 16);
        if (fp6) std::memcpy(words + 4, tile + 512 + 8 * lane, 8);
        // 16 elements per row half h: (q, i, half) -> k 16t + 4q + 2 (i / 2) + half, row g + 8 (i % 2)
        for (int q = 0; q < 4; ++q)
          for (int i = 0; i < 4; ++i)
            for (int half = 0; half < 2; ++half) {
              uint32_t sign, mag;
              if (!fp6) {
                const uint32_t wd = words[q];
                const int* bb = fp4_bits[i][half];
                sign = (wd >> bb[0]) & 1;
                mag = (((wd >> bb[1]) & 1) << 2) | (((wd >> bb[2]) & 1) << 1) | ((wd >> bb[3]) & 1);
              } else {
                const int G = q >> 1, v = 4 * (q & 1) + i, e = 2 * v + half;
                uint32_t code = 0;
                for (int b = 0; b < 6; ++b) {
                  const int sbit = bits[e][b];
                  code |= ((words[3 * G + sbit / 32] >> (sbit % 32)) & 1u) << b;
                }
                sign = code >> 5;
                mag = code & 31;
              }
              const int h = i & 1;
              const int kk = 16 * t + 4 * q + 2 * (i >> 1) + half;
              const int blk = s == WoScale::kNv16 ? kk / 16 : kk / 32;
              const uint32_t c = tsc[2 * (8 * blk + g) + h];
              uint32_t fbits;
              if (s == WoScale::kNv16) fbits = 16 * c + 0x7000;
              else fbits = 128 * (c + (s == WoScale::kMx6E3M2 ? 114 : 116));
              const double F = bf16_value(fbits & 0xFFFF);
              const double scale_bias = s == WoScale::kMx6E3M2 ? 114 : 116;  // F = scale 2^bias
              const double v = code_value(s, sign, mag);
              const double val = v * F * std::ldexp(1.0, -(int)scale_bias);
              w[(16 * st + g + 8 * h) * k + 64 * j + kk] = val;
            }
      }
    }
}

// Random prepared bytes: any code bytes; scale codes mostly near 1 (plus the whole exact
// range, plus ~1% poisoned blocks).
void fill_random(WoScale s, std::mt19937& rng, std::vector<uint8_t>& pk, std::vector<uint8_t>& sc) {
  for (auto& b : pk) b = static_cast<uint8_t>(rng());
  int lo_n, hi_n, lo_w, hi_w, poison0, poison1;
  if (s == WoScale::kNv16) { lo_n = 0x98 - 24; hi_n = 0x98 + 24; lo_w = 0; hi_w = 247; poison0 = 255; poison1 = 248; }
  else if (s == WoScale::kMx6E3M2) { lo_n = 120; hi_n = 134; lo_w = 8; hi_w = 140; poison0 = poison1 = 141; }
  else { lo_n = 120; hi_n = 134; lo_w = s == WoScale::kMx32 ? 12 : 7; hi_w = 138; poison0 = poison1 = 139; }
  for (auto& b : sc) {
    const uint32_t r = rng() % 1000;
    if (r < 5) b = static_cast<uint8_t>(poison0);
    else if (r < 10) b = static_cast<uint8_t>(poison1);
    else if (r < 100) b = static_cast<uint8_t>(lo_w + rng() % (hi_w - lo_w + 1));
    else b = static_cast<uint8_t>(lo_n + rng() % (hi_n - lo_n + 1));
  }
}

// Bit-exact check of both outputs for one shape; returns the number of mismatches.
int64_t verify(const Fmt& f, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t tiles = n / 16 * (k / 64);
  std::vector<uint8_t> pk(tiles * weightonly_tile_bytes(f.s)), sc(tiles * weightonly_scale_bytes(f.s));
  fill_random(f.s, rng, pk, sc);
  std::vector<int32_t> rexp(n);
  for (int64_t r = 0; r < n; ++r) rexp[r] = 118 + (int32_t)(rng() % 20);
  const int32_t extremes[] = {0, 255, -1000, 1000, 1, 254, 137, 100};
  for (int i = 0; i < 8 && i < n; ++i) rexp[(i * 7919) % n] = extremes[i];
  std::vector<double> w;
  host_decode(f.s, n, k, pk, sc, w);

  void *dpk, *dsc, *dexp, *dout;
  CHECK(cudaMalloc(&dpk, pk.size()));
  CHECK(cudaMalloc(&dsc, sc.size()));
  CHECK(cudaMalloc(&dexp, 4 * n));
  CHECK(cudaMalloc(&dout, 2 * n * k));
  CHECK(cudaMemcpy(dpk, pk.data(), pk.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dsc, sc.data(), sc.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dexp, rexp.data(), 4 * n, cudaMemcpyHostToDevice));
  WoUnpackArgs a;
  a.n = n; a.k = k; a.scale = f.s; a.w_packed = dpk; a.w_scales = dsc; a.out = dout;
  if (const char* why = weightonly_unpack_check(a)) { std::printf("check: %s\n", why); std::exit(1); }
  int64_t bad = 0;
  // bf16
  CHECK(cudaMemset(dout, 0xAB, 2 * n * k));
  CHECK(weightonly_unpack_run(a, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> ob(n * k);
  CHECK(cudaMemcpy(ob.data(), dout, 2 * n * k, cudaMemcpyDeviceToHost));
  int64_t nan_ref = 0, inf_ref = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    const double x = w[i];
    bool ok;
    if (std::isnan(x)) { ++nan_ref; ok = (ob[i] & 0x7F80) == 0x7F80 && (ob[i] & 0x7F); }
    else { if (std::isinf(x)) ++inf_ref; ok = ob[i] == bf16_bits(x); }
    if (!ok && bad++ < 5)
      std::printf("  bf16 mismatch r=%lld k=%lld: got 0x%04x want %.9g (0x%04x)\n", (long long)(i / k),
                  (long long)(i % k), ob[i], x, bf16_bits(x));
  }
  // fp8
  a.out_fp8 = true;
  a.row_exp = static_cast<const int32_t*>(dexp);
  CHECK(cudaMemset(dout, 0xAB, n * k));
  CHECK(weightonly_unpack_run(a, 0));
  CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> o8(n * k);
  CHECK(cudaMemcpy(o8.data(), dout, n * k, cudaMemcpyDeviceToHost));
  int64_t bad8 = 0, sat = 0, zero = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    const double x = w[i];
    const int64_t r = i / k;
    uint8_t want;
    if (!std::isfinite(x)) want = 0x7F;
    else {
      const int32_t e = rexp[r];
      const int32_t c = 127 - (e < -2000 ? -2000 : (e > 2000 ? 2000 : e));
      want = e4m3_rn_sat(std::ldexp(x, c));
      if ((want & 0x7F) == 0x7E) ++sat;
      if ((want & 0x7F) == 0) ++zero;
    }
    if (o8[i] != want && bad8++ < 5)
      std::printf("  fp8 mismatch r=%lld k=%lld (row_exp %d): got 0x%02x want 0x%02x (w = %.9g)\n",
                  (long long)r, (long long)(i % k), rexp[r], o8[i], want, x);
  }
  std::printf("verify %-10s N=%6lld K=%6lld: bf16 %s (%lld bad), e4m3 %s (%lld bad)  "
              "[ref: %lld NaN, %lld Inf, e4m3 %lld saturated, %lld zero]\n",
              f.name, (long long)n, (long long)k, bad ? "FAIL" : "ok", (long long)bad,
              bad8 ? "FAIL" : "ok", (long long)bad8, (long long)nan_ref, (long long)inf_ref,
              (long long)sat, (long long)zero);
  CHECK(cudaFree(dpk));
  CHECK(cudaFree(dsc));
  CHECK(cudaFree(dexp));
  CHECK(cudaFree(dout));
  return bad + bad8;
}

void time_shape(const Fmt& f, int64_t n, int64_t k, int iters) {
  const timing::WeightCopies wc(f.s, n, k);
  void *out, *rexp;
  CHECK(cudaMalloc(&out, 2 * n * k));
  CHECK(cudaMalloc(&rexp, 4 * n));
  {
    const std::vector<int32_t> e127(n, 127);
    CHECK(cudaMemcpy(rexp, e127.data(), 4 * n, cudaMemcpyHostToDevice));
  }
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    WoUnpackArgs a;
    a.n = n; a.k = k; a.scale = f.s; a.out = out; a.out_fp8 = fp8;
    a.row_exp = static_cast<const int32_t*>(rexp);
    a.w_packed = wc.w[0]; a.w_scales = wc.s[0];
    if (const char* why = weightonly_unpack_check(a)) { std::printf("check: %s\n", why); std::exit(1); }
    const double us = timing::us_per_launch(wc, iters, [&](void* w, void* s) {
      a.w_packed = w; a.w_scales = s;
      return weightonly_unpack_run(a, 0);
    });
    const int64_t obytes = n * k * (fp8 ? 1 : 2) + (fp8 ? 4 * n : 0);
    std::printf("unpack %-10s N=%6lld K=%6lld -> %-5s  %8.2f us  %6.0f GB/s  (read %.1f MB, write %.1f MB)\n",
                f.name, (long long)n, (long long)k, fp8 ? "e4m3" : "bf16", us,
                (wc.wbytes + wc.sbytes + obytes) / (us * 1e-6) / 1e9, (wc.wbytes + wc.sbytes) / 1e6,
                obytes / 1e6);
  }
  CHECK(cudaFree(out));
  CHECK(cudaFree(rexp));
}

int run(int argc, char** argv) {
  const int iters = argc > 2 ? std::atoi(argv[2]) : 50;
  const char* fsel = argc > 3 ? argv[3] : "all";
  const auto& fmts = timing::kFormats;
  std::printf("unpack: %d tiles per warp, bf16 lane exchange %d, %d launches per point\n",
              wo_detail::kUnpackTiles, JAX_GMMA_WO_UNPACK_XCHG, iters);
  int64_t bad = 0;
  for (const Fmt& f : fmts) {
    if (std::strcmp(fsel, "all") != 0 && std::strcmp(fsel, f.name) != 0) continue;
    bad += verify(f, 16, 64, 1);
    bad += verify(f, 272, 320, 2);     // 85 tiles: a partial last CTA
    bad += verify(f, 8192, 8192, 3);
  }
  for (const Fmt& f : fmts) {
    if (std::strcmp(fsel, "all") != 0 && std::strcmp(fsel, f.name) != 0) continue;
    time_shape(f, 8192, 8192, iters);
    time_shape(f, 28672, 8192, iters);
  }
  std::printf(bad ? "UNPACK VERIFY FAILED (%lld mismatches)\n" : "unpack verify: all ok\n", (long long)bad);
  return bad ? 1 : 0;
}

}  // namespace unpack_bench

// Every CTA shape of kWoCtaShapes against the first one on random codes and activations,
// float32 output (the K sums differ only in order): the max relative difference per shape.
// Returns the number of shapes over 1e-5.
int verify_shapes(jax_gmma::WoScale fmt, const char* name, int64_t n, int64_t k, int m) {
  using namespace jax_gmma;
  const int64_t wbytes = n * k / 1024 * weightonly_tile_bytes(fmt);
  const int64_t sbytes = n * k / 1024 * weightonly_scale_bytes(fmt);
  std::mt19937 rng(1234);
  std::vector<uint8_t> hw(wbytes);
  for (auto& b : hw) b = static_cast<uint8_t>(rng());
  std::vector<uint16_t> hx(m * k);
  std::normal_distribution<float> nd;
  for (auto& v : hx) { float f = nd(rng); uint32_t u; std::memcpy(&u, &f, 4); v = u >> 16; }
  void *w, *sc, *x, *d;
  CHECK(cudaMalloc(&w, wbytes));
  CHECK(cudaMalloc(&sc, sbytes));
  CHECK(cudaMalloc(&x, hx.size() * 2));
  CHECK(cudaMalloc(&d, m * n * 4));
  CHECK(cudaMemcpy(w, hw.data(), wbytes, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(sc, fmt == WoScale::kNv16 ? 0x98 : 127, sbytes));
  CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> ref(m * n), out(m * n);
  int bad = 0;
  for (const auto& c : wo_detail::kWoCtaShapes) {
    WoArgs a;
    a.m = m; a.n = n; a.k = k; a.x = x; a.d = d; a.d_is_f32 = true; a.scale = fmt;
    a.w_packed = w; a.w_scales = sc;
    a.rows_per_cta = c.rows(); a.tokens_per_cta = 8 * c.nt; a.k_warps = c.wk;
    if (weightonly_check(a)) continue;
    CHECK(cudaMemset(d, 0xFF, m * n * 4));  // poison (NaN)
    CHECK(weightonly_run(a, 0));
    CHECK(cudaMemcpy(out.data(), d, m * n * 4, cudaMemcpyDeviceToHost));
    if (&c == &wo_detail::kWoCtaShapes[0]) ref = out;
    double num = 0, den = 0, worst = 0;
    for (int64_t i = 0; i < m * n; ++i) {
      const double e = std::fabs(double(out[i]) - ref[i]);
      num += e * e; den += double(ref[i]) * ref[i];
      if (!(e <= 1e-3 * (std::fabs(ref[i]) + 1.0))) worst = std::max(worst, e);
    }
    const double rel = std::sqrt(num / den);
    const bool ok = rel < 1e-5 && worst == 0 && std::isfinite(rel);
    bad += !ok;
    std::printf("verify %-10s N=%6lld K=%6lld M=%2d cta %3dx%2d kw%d  rel %.2e %s\n", name,
                (long long)n, (long long)k, m, c.rows(), 8 * c.nt, c.wk, rel, ok ? "ok" : "BAD");
  }
  CHECK(cudaFree(w)); CHECK(cudaFree(sc)); CHECK(cudaFree(x)); CHECK(cudaFree(d));
  return bad;
}

// One point, for ncu and quick checks: ./wo_bench one FMT M N K [ROWS TOKENS KWARPS] [ITERS]
// (ROWS 0 = the pick). Prints the time like the sweep.
int time_one(int argc, char** argv) {
  using namespace jax_gmma;
  if (argc < 6) {
    std::fprintf(stderr, "usage: wo_bench one FMT M N K [ROWS TOKENS KWARPS] [ITERS]\n");
    return 2;
  }
  const char* name = argv[2];
  const timing::Fmt* fmt = nullptr;
  for (const auto& f : timing::kFormats)
    if (std::strcmp(name, f.name) == 0) fmt = &f;
  if (!fmt) { std::fprintf(stderr, "unknown format %s\n", name); return 2; }
  const WoScale s = fmt->s;
  WoArgs a;
  a.m = std::atoll(argv[3]); a.n = std::atoll(argv[4]); a.k = std::atoll(argv[5]); a.scale = s;
  if (argc > 8 && std::atoi(argv[6]) > 0) {
    a.rows_per_cta = std::atoi(argv[6]); a.tokens_per_cta = std::atoi(argv[7]); a.k_warps = std::atoi(argv[8]);
  }
  const int iters = argc > 9 ? std::atoi(argv[9]) : 200;
  const timing::WeightCopies wc(s, a.n, a.k);
  void *x, *d;
  const WoCta c = weightonly_resolve(a);
  a.x_rows = weightonly_x_rows(a.m, c);  // the tensor-core shapes read x tiled (contents: timing only)
  const int64_t xbytes = std::max<int64_t>(a.m, a.x_rows) * a.k * 2;
  CHECK(cudaMalloc(&x, xbytes));
  CHECK(cudaMemset(x, 0x3f, xbytes));
  CHECK(cudaMalloc(&d, a.m * a.n * 4));
  a.x = x; a.d = d;
  a.w_packed = wc.w[0]; a.w_scales = wc.s[0];
  if (const char* err = weightonly_check(a)) { std::fprintf(stderr, "rejected: %s\n", err); return 2; }
  const double us = timing::us_per_launch(wc, iters, [&](void* w, void* sc) {
    a.w_packed = w; a.w_scales = sc;
    return weightonly_run(a, 0);
  });
  std::printf("%-10s N=%6lld K=%6lld M=%2lld cta %3dx%2d kw%d  %8.2f us  %6.0f GB/s\n", name,
              (long long)a.n, (long long)a.k, (long long)a.m, c.rows, c.tokens, c.k_warps, us,
              (wc.wbytes + wc.sbytes) / (us * 1e-6) / 1e9);
  CHECK(cudaFree(x));
  CHECK(cudaFree(d));
  return 0;
}

int main(int argc, char** argv) {
  using namespace jax_gmma;
  if (argc > 1 && std::strcmp(argv[1], "unpack") == 0) return unpack_bench::run(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "one") == 0) return time_one(argc, argv);
  struct Shape { int64_t n, k; };
  const Shape shapes[] = {{28672, 8192}, {8192, 8192}, {8192, 28672}, {4096, 14336}};
  const int ms[] = {1, 4, 16, 64};
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  const char* fsel = argc > 2 ? argv[2] : "nvfp4";
  using timing::Fmt;
  const auto& fmts = timing::kFormats;
  std::printf("depth fp4 %d%s fp6 %d, %d launches per point\n", JAX_GMMA_WO_DEPTH,
              JAX_GMMA_WO_SHALLOW_RING ? " (2 for the 16x8 kw8 tile at K <= 8192)" : "",
              JAX_GMMA_WO6_DEPTH, iters);
  int bad = 0;
  for (const Fmt& f : fmts) {
    if (std::strcmp(fsel, "all") != 0 && std::strcmp(fsel, f.name) != 0) continue;
    for (int m : {1, 5, 16}) bad += verify_shapes(f.s, f.name, 1024, 1536, m);
  }
  std::printf(bad ? "VERIFY FAILED (%d shapes)\n" : "verify: all CTA shapes agree\n", bad);
  for (const Fmt& f : fmts) {
    if (std::strcmp(fsel, "all") != 0 && std::strcmp(fsel, f.name) != 0) continue;
    for (const Shape& sh : shapes) {
      const timing::WeightCopies wc(f.s, sh.n, sh.k);
      void *x, *d;
      CHECK(cudaMalloc(&x, 128 * sh.k * 2));  // M <= 64, or tiled: M padded to <= 128 tokens
      CHECK(cudaMemset(x, 0x3f, 128 * sh.k * 2));
      CHECK(cudaMalloc(&d, 64 * sh.n * 4));
      for (int m : ms) {
        for (int ti = -1; ti < wo_detail::kWoCtaShapeCount; ++ti) {
          WoArgs a;
          a.m = m; a.n = sh.n; a.k = sh.k; a.x = x; a.d = d;
          if (ti >= 0) {
            const auto& c = wo_detail::kWoCtaShapes[ti];
            a.rows_per_cta = c.rows(); a.tokens_per_cta = 8 * c.nt; a.k_warps = c.wk;
          }
          a.scale = f.s;
          a.w_packed = wc.w[0]; a.w_scales = wc.s[0];
          a.x_rows = weightonly_x_rows(m, weightonly_resolve(a));
          if (weightonly_check(a)) continue;
          const WoCta c = weightonly_resolve(a);
          const double us = timing::us_per_launch(wc, iters, [&](void* w, void* s) {
            a.w_packed = w; a.w_scales = s;
            return weightonly_run(a, 0);
          });
          std::printf("%-10s N=%6lld K=%6lld M=%2d cta %3dx%2d kw%d%s  %8.2f us  %6.0f GB/s\n", f.name,
                      (long long)sh.n, (long long)sh.k, m, c.rows, c.tokens, c.k_warps,
                      ti < 0 ? " (pick)" : "       ", us, (wc.wbytes + wc.sbytes) / (us * 1e-6) / 1e9);
        }
      }
      CHECK(cudaFree(x));
      CHECK(cudaFree(d));
    }
  }
  return bad ? 1 : 0;
}
