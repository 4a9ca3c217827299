// Kernel-level timing of the FP4 weight-only GEMM (cpp/sm90_fp4_gemm_weightonly.cu) for tuning:
// no JAX, no correctness (tests/test_weightonly.py does that), CUDA events around back-to-back
// launches on enough distinct weight copies to defeat the 50 MB L2. Build (CPU machine) and run:
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include [-DJAX_GMMA_WO_DEPTH=4] tools/bench_weightonly_kernel.cu -o wo_bench
//   ./wo_bench            # prints one line per (shape, M, CTA shape): us and streamed GB/s
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../cpp/sm90_fp4_gemm_weightonly.cu"

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
  std::printf("depth %d, %d launches per point\n", JAX_GMMA_WO_DEPTH, iters);
  for (const Shape& sh : shapes) {
    const int64_t wbytes = sh.n * sh.k / 2, sbytes = sh.n * sh.k / 16;
    const int copies = (int)((256LL << 20) / (wbytes + sbytes)) + 2;
    std::vector<void*> w(copies), s(copies);
    for (int c = 0; c < copies; ++c) {
      CHECK(cudaMalloc(&w[c], wbytes));
      CHECK(cudaMalloc(&s[c], sbytes));
      CHECK(cudaMemset(w[c], 0x35, wbytes));  // arbitrary e2m1 codes
      CHECK(cudaMemset(s[c], 0x98, sbytes));  // scale code of 1.0
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
        a.scale = WoScale::kNv16;
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
        std::printf("N=%6lld K=%6lld M=%2d tile %2dx%2d%s  %8.2f us  %6.0f GB/s\n", (long long)sh.n,
                    (long long)sh.k, m, t[0] ? t[0] : pick / 100, t[1] ? t[1] : pick % 100,
                    t[0] ? "      " : " (pick)", us, (wbytes + sbytes) / (us * 1e-6) / 1e9);
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
  return 0;
}
