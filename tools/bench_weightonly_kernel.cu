// Kernel-level timing of the FP4 / FP6 weight-only GEMMs (cpp/sm90_fp{4,6}_gemm_weightonly.cu) for tuning:
// no JAX, no correctness (tests/test_weightonly.py does that), CUDA events around back-to-back
// launches on enough distinct weight copies to defeat the 50 MB L2. Build (CPU machine) and run:
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include [-DJAX_GMMA_WO_DEPTH=4] tools/bench_weightonly_kernel.cu -o wo_bench
//   ./wo_bench [iters] [format]   # format: nvfp4 (default), mxfp4, mxfp6_e2m3, mxfp6_e3m2, all
//                                 # prints one line per (format, shape, M, CTA shape): us, GB/s
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cstring>

#include "../cpp/sm90_fp4_gemm_weightonly.cu"
#include "../cpp/sm90_fp6_gemm_weightonly.cu"

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

int main(int argc, char** argv) {
  using namespace jax_gmma;
  struct Shape { int64_t n, k; };
  const Shape shapes[] = {{28672, 8192}, {8192, 8192}, {8192, 28672}, {4096, 14336}};
  const int ms[] = {1, 4, 16};
  const int tiles[][2] = {{0, 0}, {16, 8}, {32, 8}, {64, 8}, {16, 16}, {32, 16}, {64, 16}};
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  const char* fsel = argc > 2 ? argv[2] : "nvfp4";
  struct Fmt { const char* name; WoScale s; };
  const Fmt fmts[] = {{"nvfp4", WoScale::kNv16}, {"mxfp4", WoScale::kMx32},
                      {"mxfp6_e2m3", WoScale::kMx6E2M3}, {"mxfp6_e3m2", WoScale::kMx6E3M2}};
  std::printf("depth fp4 %d fp6 %d, %d launches per point\n", JAX_GMMA_WO_DEPTH, JAX_GMMA_WO6_DEPTH, iters);
  for (const Fmt& f : fmts) {
    if (std::strcmp(fsel, "all") != 0 && std::strcmp(fsel, f.name) != 0) continue;
    for (const Shape& sh : shapes) {
      const int64_t wbytes = sh.n * sh.k / 1024 * weightonly_tile_bytes(f.s);
      const int64_t sbytes = sh.n * sh.k / 1024 * weightonly_scale_bytes(f.s);
      const int copies = (int)((256LL << 20) / (wbytes + sbytes)) + 2;
      std::vector<void*> w(copies), s(copies);
      for (int c = 0; c < copies; ++c) {
        CHECK(cudaMalloc(&w[c], wbytes));
        CHECK(cudaMalloc(&s[c], sbytes));
        CHECK(cudaMemset(w[c], 0x35, wbytes));                                // arbitrary codes
        CHECK(cudaMemset(s[c], f.s == WoScale::kNv16 ? 0x98 : 127, sbytes));  // scale 1.0
      }
      void *x, *d;
      CHECK(cudaMalloc(&x, 16 * sh.k * 2));
      CHECK(cudaMemset(x, 0x3f, 16 * sh.k * 2));
      CHECK(cudaMalloc(&d, 16 * sh.n * 4));
      for (int m : ms) {
        for (auto& t : tiles) {
          WoArgs a;
          a.m = m; a.n = sh.n; a.k = sh.k; a.x = x; a.d = d;
          a.rows_per_cta = t[0]; a.tokens_per_cta = t[1];
          a.scale = f.s;
          a.w_packed = w[0]; a.w_scales = s[0];
          if (weightonly_check(a)) continue;
          cudaEvent_t e0, e1;
          CHECK(cudaEventCreate(&e0));
          CHECK(cudaEventCreate(&e1));
          for (int i = 0; i < copies; ++i) {
            a.w_packed = w[i % copies]; a.w_scales = s[i % copies];
            CHECK(weightonly_run(a, 0));
          }
          CHECK(cudaEventRecord(e0));
          for (int i = 0; i < iters; ++i) {
            a.w_packed = w[i % copies]; a.w_scales = s[i % copies];
            weightonly_run(a, 0);
          }
          CHECK(cudaEventRecord(e1));
          CHECK(cudaEventSynchronize(e1));
          float ms_total = 0;
          CHECK(cudaEventElapsedTime(&ms_total, e0, e1));
          const double us = ms_total * 1e3 / iters;
          const int32_t pick = weightonly_pick(m, sh.n, sh.k);
          std::printf("%-10s N=%6lld K=%6lld M=%2d tile %2dx%2d%s  %8.2f us  %6.0f GB/s\n", f.name,
                      (long long)sh.n, (long long)sh.k, m, t[0] ? t[0] : pick / 100,
                      t[1] ? t[1] : pick % 100, t[0] ? "      " : " (pick)", us,
                      (wbytes + sbytes) / (us * 1e-6) / 1e9);
          CHECK(cudaEventDestroy(e0));
          CHECK(cudaEventDestroy(e1));
        }
      }
      for (int c = 0; c < copies; ++c) {
        CHECK(cudaFree(w[c]));
        CHECK(cudaFree(s[c]));
      }
      CHECK(cudaFree(x));
      CHECK(cudaFree(d));
    }
  }
  return 0;
}
