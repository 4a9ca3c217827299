// Kernel-level check and timing of the Hopper MXFP8 x MXFP8 GEMM (cpp/sm90_mxf8_gemm_blockscaled.cu),
// no JAX. Build (CPU machine) and run on the GPU:
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include -I<cutlass>/include benchmarks/kernels/bench_mxf8_kernel.cu -o mxf8_bench
//   ./mxf8_bench [iters] [skip | large]   (skip: decode timings only; large: large-M timings only)
//   ./mxf8_bench iters one CONFIG M N K   (one config at one shape, e.g. under ncu)
//
// Correctness: random e4m3 elements (every finite code) and E8M0 scales (a spread of 12
// binades, plus code 0 = 2^-127 at three positions) in the swizzled 128x4-atom layout, float32
// output poisoned with NaN before the
// run, checked against a float64 host reference on every element (small shapes) or on 4096
// sampled elements (large shapes): relative Frobenius error, exit code 1 above 3e-4 (the FP8
// tensor core sums a 32-K block to about 2^-13 relative; measured ~1e-4). Then
// timing: CUDA events around `iters` launches, each on one of several operand copies when one
// copy fits in the 50 MB L2; prints us, TFLOP/s and GB/s of operand + scale bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "../../cpp/sm90_mxf8_gemm_blockscaled.cu"
#include "../../cpp/sm90_mxf8_gemm_blockscaled_stream.cu"

#include "../../tools/cuda_check.h"

using namespace jax_gmma;

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

__global__ void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t b = hash32(seed * 0x9E3779B97F4A7C15ULL + i) & 0xff;
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN
    p[i] = b;
  }
}

__global__ void fill_e8m0(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = 121 + hash32(seed * 0x9E3779B97F4A7C15ULL + i) % 12;  // 2^-6 .. 2^5
}

double e4m3_value(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -v : v;
}

int64_t sf_offset(int64_t row, int64_t kb, int64_t kb4) {
  return mx_sf_word_offset(row, kb / 4, kb4) + kb % 4;
}

struct Operands {
  int64_t m, n, k;
  std::vector<uint8_t*> a, b, asf, bsf;  // copies
};

Operands make(int64_t m, int64_t n, int64_t k, int copies, uint64_t seed) {
  Operands o{m, n, k};
  const int64_t kb4 = (k / 32 + 3) / 4;
  for (int c = 0; c < copies; ++c) {
    uint8_t *a, *b, *sa, *sb;
    const int64_t sa_bytes = (m + 127) / 128 * 128 * kb4 * 4, sb_bytes = (n + 127) / 128 * 128 * kb4 * 4;
    CHECK(cudaMalloc(&a, m * k));
    CHECK(cudaMalloc(&b, n * k));
    CHECK(cudaMalloc(&sa, sa_bytes));
    CHECK(cudaMalloc(&sb, sb_bytes));
    fill_e4m3<<<1024, 256>>>(a, m * k, seed + 4 * c);
    fill_e4m3<<<1024, 256>>>(b, n * k, seed + 4 * c + 1);
    fill_e8m0<<<256, 256>>>(sa, sa_bytes, seed + 4 * c + 2);
    fill_e8m0<<<256, 256>>>(sb, sb_bytes, seed + 4 * c + 3);
    o.a.push_back(a);
    o.b.push_back(b);
    o.asf.push_back(sa);
    o.bsf.push_back(sb);
  }
  CHECK(cudaDeviceSynchronize());
  return o;
}

void release(Operands& o) {
  for (auto* v : {&o.a, &o.b, &o.asf, &o.bsf})
    for (auto* p : *v) cudaFree(p);
}

KernelEntry g_entries[64];  // both families' rows (registry.cc's fill buffer has the same size)
const int g_count = [] {
  const int n = sm90_mx_mxf8_entries(g_entries);
  return n + sm90_mx_mxf8_stream_entries(g_entries + n);
}();

const KernelEntry* entry_for(const char* config, DType d) {
  for (int i = 0; i < g_count; ++i)
    if (g_entries[i].d == d && !std::strcmp(g_entries[i].config, config)) return &g_entries[i];
  std::fprintf(stderr, "no MXFP8 kernel config named %s; the configs:", config);
  for (int i = 0; i < g_count; i += 2) std::fprintf(stderr, " %s", g_entries[i].config);
  std::fprintf(stderr, "\n");
  std::exit(2);
}

GemmArgs args(const Operands& o, int c, void* d, const void* bias) {
  GemmArgs g;
  g.m = o.m;
  g.n = o.n;
  g.k = o.k;
  g.a = o.a[c];
  g.b = o.b[c];
  g.a_sf = o.asf[c];
  g.b_sf = o.bsf[c];
  g.d = d;
  g.bias = bias;
  g.sm_count = 0;
  return g;
}

// Returns the relative Frobenius error of the float32 output vs a float64 reference, or -1 when
// the config cannot run the shape (can_implement).
double check(const char* config, int64_t m, int64_t n, int64_t k, bool with_bias, uint64_t seed) {
  const KernelEntry* e = entry_for(config, DType::kF32);
  Operands o = make(m, n, k, 1, seed);
  const int64_t kb4 = (k / 32 + 3) / 4;
  // E8M0 code 0 (2^-127, a float32 subnormal) at a few scale positions: the kernels' exact
  // conversion paths, on K steps where only some lanes of a warp see such a code.
  const uint8_t zero = 0;
  const int64_t kbs = k / 32;
  for (auto [sf, rows, r, kb] : {std::tuple<void*, int64_t, int64_t, int64_t>{o.asf[0], m, 2 % m, 3 % kbs},
                                 {o.bsf[0], n, 5 % n, 2 % kbs}, {o.bsf[0], n, n - 1, kbs - 1}})
    CHECK(cudaMemcpy(static_cast<uint8_t*>(sf) + sf_offset(r, kb, kb4), &zero, 1, cudaMemcpyHostToDevice));
  std::vector<uint8_t> ha(m * k), hb(n * k), hsa((m + 127) / 128 * 128 * kb4 * 4), hsb((n + 127) / 128 * 128 * kb4 * 4);
  CHECK(cudaMemcpy(ha.data(), o.a[0], ha.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hb.data(), o.b[0], hb.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hsa.data(), o.asf[0], hsa.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hsb.data(), o.bsf[0], hsb.size(), cudaMemcpyDeviceToHost));
  std::vector<float> hbias(n);
  for (int64_t j = 0; j < n; ++j) hbias[j] = std::ldexp(static_cast<double>((j * 37) % 17) - 8.0, 4);
  float *d, *bias = nullptr;
  CHECK(cudaMalloc(&d, m * n * 4));
  CHECK(cudaMemset(d, 0xff, m * n * 4));  // NaN poison
  if (with_bias) {
    CHECK(cudaMalloc(&bias, n * 4));
    CHECK(cudaMemcpy(bias, hbias.data(), n * 4, cudaMemcpyHostToDevice));
  }
  GemmArgs g = args(o, 0, d, bias);
  if (e->can_implement(g)) {
    cudaFree(d);
    if (bias) cudaFree(bias);
    release(o);
    return -1;
  }
  CHECK(e->prepare());
  CHECK(e->run(g, nullptr));
  CHECK(cudaDeviceSynchronize());
  std::vector<float> hd(m * n);
  CHECK(cudaMemcpy(hd.data(), d, hd.size() * 4, cudaMemcpyDeviceToHost));
  const bool full = m * n * k <= (int64_t(1) << 28);
  const int64_t samples = full ? m * n : 4096;
  double lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = e4m3_value(static_cast<uint8_t>(c));
  double num = 0, den = 0;
  uint64_t rng = seed * 2654435761u + 1;
  for (int64_t s = 0; s < samples; ++s) {
    int64_t i, j;
    if (full) {
      i = s / n;
      j = s % n;
    } else {
      rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
      i = (rng >> 33) % m;
      j = (rng >> 13) % n;
    }
    double ref = with_bias ? hbias[j] : 0.0;
    for (int64_t kb = 0; kb < k / 32; ++kb) {
      double blk = 0;
      for (int64_t kk = 32 * kb; kk < 32 * kb + 32; ++kk) blk += lut[ha[i * k + kk]] * lut[hb[j * k + kk]];
      ref += blk * std::ldexp(1.0, hsa[sf_offset(i, kb, kb4)] - 127) * std::ldexp(1.0, hsb[sf_offset(j, kb, kb4)] - 127);
    }
    const double got = hd[i * n + j];
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  cudaFree(d);
  if (bias) cudaFree(bias);
  release(o);
  return std::sqrt(num / den);
}

void bench(const char* config, int64_t m, int64_t n, int64_t k, int iters) {
  const KernelEntry* e = entry_for(config, DType::kBF16);
  const double bytes = double(m) * k + double(n) * k + (m + n) * k / 32.0;
  const int copies = std::max(1, std::min(8, static_cast<int>(std::ceil(150e6 / bytes))));
  Operands o = make(m, n, k, copies, 1234);
  void* d;
  CHECK(cudaMalloc(&d, m * n * 2));
  CHECK(e->prepare());
  for (int i = 0; i < 3; ++i) CHECK(e->run(args(o, i % copies, d, nullptr), nullptr));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  std::vector<float> times;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK(cudaEventRecord(t0));
    for (int i = 0; i < iters; ++i) CHECK(e->run(args(o, i % copies, d, nullptr), nullptr));
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    times.push_back(ms * 1000 / iters);
  }
  std::sort(times.begin(), times.end());
  const double us = times[times.size() / 2];
  std::printf("%-34s %6lld x %6lld x %6lld  %9.2f us  %7.1f TFLOP/s  %6.0f GB/s\n", config, (long long)m, (long long)n,
              (long long)k, us, 2.0 * m * n * k / us / 1e6, bytes / us / 1e3);
  cudaFree(d);
  release(o);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  // argv[2] "one" CONFIG M N K: time one config at one shape (e.g. under ncu).
  if (argc > 6 && std::string(argv[2]) == "one") {
    bench(argv[3], std::atoll(argv[4]), std::atoll(argv[5]), std::atoll(argv[6]), iters);
    return 0;
  }
  // argv[2]: none (checks, large shapes, decode), "large" (the large shapes' timings only) or
  // anything else, e.g. "skip" (the decode timings only).
  const std::string mode = argc > 2 ? argv[2] : "";
  const bool run_checks = mode.empty(), run_large = mode.empty() || mode == "large";
  struct Shape { int64_t m, n, k; bool bias; };
  const char* large = "sm90_mxf8_blockscaled_128x128";
  // The decode (swap) configs: every other row of the family's table, in its order.
  std::vector<const char*> swaps;
  for (int i = 0; i < g_count; ++i)
    if (g_entries[i].d == DType::kBF16 && std::strcmp(g_entries[i].config, large)) swaps.push_back(g_entries[i].config);
  const int n_swaps = static_cast<int>(swaps.size());
  const Shape checks[] = {{128, 128, 128, false}, {1, 256, 4096, true},    {200, 384, 1056, false},
                          {300, 130, 160, true},  {129, 1000, 7168, false}, {4096, 4096, 4096, false},
                          {16, 28672, 8192, true}, {33, 300, 2080, true},   {70, 4096, 1024, false}};
  bool ok = true;
  uint64_t seed = 7;
  for (const Shape& s : checks) {
    if (!run_checks) break;
    for (int c = 0; c <= n_swaps; ++c) {
      const char* cfg = c == 0 ? large : swaps[c - 1];
      if (c > 0 && s.m > 256) continue;
      // MXF8_CHECK_ONLY=text: check only the configs whose name contains text.
      if (const char* only = std::getenv("MXF8_CHECK_ONLY"); only && !std::strstr(cfg, only)) continue;
      const double err = check(cfg, s.m, s.n, s.k, s.bias, seed++);
      if (err < 0) {
        std::printf("check %-34s %5lld x %5lld x %5lld: not implementable, skipped\n", cfg, (long long)s.m,
                    (long long)s.n, (long long)s.k);
        continue;
      }
      const bool pass = err < 3e-4;  // Hopper FP8 MMA: ~2^-13 inside a 32-K block
      ok = ok && pass;
      std::printf("check %-34s %5lld x %5lld x %5lld bias=%d  rel err %.3e  %s\n", cfg, (long long)s.m,
                  (long long)s.n, (long long)s.k, s.bias, err, pass ? "ok" : "FAIL");
    }
  }
  if (!ok) return 1;
  const Shape times[] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {4096, 7168, 16384}, {4096, 2112, 7168}};
  for (const Shape& s : times) {
    if (!run_large) break;
    bench(large, s.m, s.n, s.k, iters);
  }
  // MXF8_SHAPES="MxNxK,...": time the decode configs (those whose name contains MXF8_TIME_ONLY,
  // when set) at these shapes only.
  if (const char* list = std::getenv("MXF8_SHAPES")) {
    const char* only = std::getenv("MXF8_TIME_ONLY");
    for (const char* q = list; *q;) {
      long long m, n, k;
      int used = 0;
      if (std::sscanf(q, "%lldx%lldx%lld%n", &m, &n, &k, &used) != 3) break;
      for (const char* cfg : swaps) {
        bool pick = !only;  // MXF8_TIME_ONLY: '|'-separated name fragments
        for (const char* o = only; o && *o && !pick;) {
          const char* e = std::strchr(o, '|');
          const std::string frag(o, e ? e - o : std::strlen(o));
          pick = std::strstr(cfg, frag.c_str()) != nullptr;
          o = e ? e + 1 : "";
        }
        if (pick) bench(cfg, m, n, k, iters);
      }
      q += used;
      if (*q == ',') ++q;
    }
    return 0;
  }
  if (mode == "large") {
    for (int64_t n : {28672, 8192}) bench(large, 128, n, 8192, iters);
    return 0;
  }
  for (int64_t n : {28672, 8192})
    for (int64_t m : {1, 16, 32, 64, 128}) {
      bench(large, m, n, 8192, iters);
      for (const char* cfg : swaps) bench(cfg, m, n, 8192, iters);
    }
  return 0;
}
