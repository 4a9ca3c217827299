// Bandwidth of the activation-quantization kernel (cpp/sm90_fp8_quantize.cu) on its own, with
// build-time variants (-DJAX_GMMA_QUANT_UNROLL=N), against a plain
// device-to-device copy of the same bytes. No JAX.
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include benchmarks/kernels/bench_quantize_kernel.cu -o quant_bench
//   ./quant_bench [M K]   (default 4096 7168, bf16 input, fp8_1x128 and mxfp8)
//
// Inputs rotate over enough copies to exceed the 60 MB L2; median of 15 repeats of 20 launches.
#include "../../cpp/sm90_fp8_quantize.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../../tools/cuda_check.h"


template <class F>
float median_us(F&& launch, int sets) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2 * sets; ++i) launch(i % sets);
  std::vector<float> t;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) launch(i % sets);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e3f / 20);
  }
  std::sort(t.begin(), t.end());
  return t[7];
}

int main(int argc, char** argv) {
  const int64_t m = argc > 2 ? std::atoll(argv[1]) : 4096, k = argc > 2 ? std::atoll(argv[2]) : 7168;
  const size_t in_bytes = m * k * 2;
  const int sets = static_cast<int>(std::max<size_t>(2, (200u << 20) / in_bytes + 1));
  std::vector<void*> x(sets), data(sets), scales(sets), copy(sets);
  for (int i = 0; i < sets; ++i) {
    CHECK(cudaMalloc(&x[i], in_bytes));
    CHECK(cudaMalloc(&data[i], m * (k + 128)));
    CHECK(cudaMalloc(&scales[i], m * ((k + 31) / 32) * 4));
    CHECK(cudaMalloc(&copy[i], in_bytes));
    std::vector<uint16_t> h(m * k);
    uint32_t st = 12345u + i;
    for (auto& v : h) {  // random bf16 in about +-4, no NaN/Inf
      st = st * 1664525u + 1013904223u;
      v = static_cast<uint16_t>(0x3C00u + (st >> 20) % 0x0500u) | ((st & 1u) << 15);
    }
    CHECK(cudaMemcpy(x[i], h.data(), in_bytes, cudaMemcpyHostToDevice));
  }
  std::printf("# quantize %lld x %lld bf16, unroll %d, %d input sets\n", (long long)m,
              (long long)k, kUnroll, sets);
  const double copy_bytes = 2.0 * in_bytes;
  float tc = median_us([&](int i) { CHECK(cudaMemcpyAsync(copy[i], x[i], in_bytes, cudaMemcpyDeviceToDevice)); }, sets);
  std::printf("| copy (read+write %zu MB) | %.1f us | %.0f GB/s |\n", in_bytes >> 20, tc, copy_bytes / tc / 1e3);
  for (int block : {128, 32}) {
    const int64_t kp = jax_gmma_quantize_padded_k(k, block);
    const double bytes = in_bytes + m * kp + m * (kp / block) * (block == 128 ? 4 : 1);
    float tq = median_us([&](int i) {
      CHECK(jax_gmma_fp8_quantize(x[i], JAX_GMMA_QUANT_IN_BF16, m, k, block, JAX_GMMA_QUANT_DIV_XLA_GPU,
                                  data[i], scales[i], nullptr));
    }, sets);
    std::printf("| quantize block %d | %.1f us | %.0f GB/s | %.2f x copy time |\n", block, tq,
                bytes / tq / 1e3, tq / tc);
  }
  return 0;
}
