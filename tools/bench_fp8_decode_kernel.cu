// Kernel-alone timing of sm90 FP8 tensorwise decode (swap-AB) configs, including candidate
// configs that are not in the library: small tiles with an explicit stage count, so that
// several CTAs share an SM (the structure of XLA's Triton GEMM at M = 64, N = 28672: 448 CTAs
// of 128 threads, ~4 per SM), non-persistent or persistent with sm_count scaled.
//
// Build (CPU machine, ~2 min):
//   C=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -cudart static -Icpp/include -Icpp -I$C/include -I$C/tools/util/include \
//        tools/bench_fp8_decode_kernel.cu -o prebuilt/fp8_decode_bench
// Run (GPU): prebuilt/fp8_decode_bench [M N K [reps]]   (default 64 28672 8192)
//
// e4m3 x e4m3 -> bf16, per-tensor scales, two-level accumulation unless the name says fast.
// Each row: µs per GEMM, median of 9 repeats of 32 back-to-back launches over 16 distinct
// weights (3.8 GB at the default shape: every launch streams its weight from HBM), and the
// max |difference| to the first row's output (same arithmetic: 0 or rounding of the split).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "sm90_fp8_gemm_tensorwise.cuh"

#include "cuda_check.h"

namespace fp8_decode_bench {
using namespace jax_gmma;
using namespace jax_gmma::sm90;

constexpr DType E4 = DType::kF8E4M3;
constexpr DType BF = DType::kBF16;

// Candidates: the library's decode configs with explicit stage counts (WithStages), and a
// 128-row tile on the non-persistent warp-specialized kernel of CfgDecodeSwapWs.
template <int TN, int S>
using Ws128Swap = Config<Shape<_128, Int<TN>, _128>, Shape<_1, _1, _1>, sched::KernelTmaWarpSpecialized,
                         epi::TmaWarpSpecialized, void, true, S>;
template <int TN, int S>
using PpSwap = WithStages<CfgDecodeSwapPp<TN>, S>;
template <int TN, int S>
using CoopSwapS = WithStages<CfgDecodeSwap<TN>, S>;
template <int TN, int S>
using CoopSwapFastS = WithStages<CfgDecodeSwapCoopFast<TN, 1>, S>;

struct Row {
  const char* name;
  KernelEntry e;
  int sm_mult;  // sm_count = 132 * sm_mult (persistent schedulers launch that many CTAs)
  int splits;
};

__global__ void fill_fp8(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    // e4m3 with exponent field 4..9 (|x| in [2^-3, 2^3)), random sign and mantissa
    p[i] = uint8_t((h & 0x80) | ((4 + (h >> 8) % 6) << 3) | ((h >> 16) & 7));
  }
}

__global__ void bf16_maxdiff(const uint16_t* a, const uint16_t* b, size_t n, float* out) {
  float m = 0.f;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float x = __uint_as_float(uint32_t(a[i]) << 16), y = __uint_as_float(uint32_t(b[i]) << 16);
    m = (x != x || y != y) ? INFINITY : fmaxf(m, fabsf(x - y));  // poison left = inf
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));
}

int bench_main(int argc, char** argv) {
  const int64_t m = argc > 3 ? atoll(argv[1]) : 64, n = argc > 3 ? atoll(argv[2]) : 28672,
                k = argc > 3 ? atoll(argv[3]) : 8192;
  const int reps = argc > 4 ? atoi(argv[4]) : 9;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Row> rows = {
      {"lib swap_128x64 c2x1 coop streamk 2lvl (pick)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapC2<64>>::entry("a"), 1, 0},
      {"lib swap_128x64 c2x1 coop streamk fast", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapCoopFast<64, 2>>::entry("b"), 1, 0},
      {"lib swap_64x64 pingpong 2lvl", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapPp<64>>::entry("p64"), 1, 1},
      {"lib swap_64x32 pingpong 2lvl", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapPp<32>>::entry("p32"), 1, 1},
      {"lib swap_64x16 pingpong 2lvl", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapPp<16>>::entry("p16"), 1, 1},
      {"ws 64x16 s6 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<16, 6>>::entry("w16a"), 1, 1},
      {"ws 64x16 s10 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<16, 10>>::entry("w16b"), 1, 1},
      {"ws 64x16 auto (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<16, 0>>::entry("w16c"), 1, 1},
      {"ws 64x32 s6 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<32, 6>>::entry("w32a"), 1, 1},
      {"ws 64x64 s8 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<64, 8>>::entry("w64b"), 1, 1},
      {"ws 64x64 auto (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<64, 0>>::entry("w64c"), 1, 1},
      {"pp 64x64 s6 (persistent)", Sm90Fp8Gemm<E4, E4, BF, PpSwap<64, 6>>::entry("pp6"), 1, 1},
      {"ws 64x64 s3 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<64, 3>>::entry("c3"), 1, 1},
      {"ws 64x64 s4 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<64, 4>>::entry("c"), 1, 1},
      {"ws 64x64 s6 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, CfgDecodeSwapWs<64, 6>>::entry("d"), 1, 1},
      {"ws 128x64 s4 (non-persistent)", Sm90Fp8Gemm<E4, E4, BF, Ws128Swap<64, 4>>::entry("e"), 1, 1},
      {"pp 64x64 s4 sm x2", Sm90Fp8Gemm<E4, E4, BF, PpSwap<64, 4>>::entry("f"), 2, 1},
      {"pp 64x64 s4 sm x3", Sm90Fp8Gemm<E4, E4, BF, PpSwap<64, 4>>::entry("f"), 3, 1},
      {"coop 128x64 s4 dp sm x2", Sm90Fp8Gemm<E4, E4, BF, CoopSwapS<64, 4>>::entry("g"), 2, 1},
      {"coop 128x64 s4 streamk sm x2", Sm90Fp8Gemm<E4, E4, BF, CoopSwapS<64, 4>>::entry("g"), 2, 0},
      {"coop 128x64 s5 dp sm x2", Sm90Fp8Gemm<E4, E4, BF, CoopSwapS<64, 5>>::entry("h"), 2, 1},
      {"coop fast 128x64 s4 dp sm x2", Sm90Fp8Gemm<E4, E4, BF, CoopSwapFastS<64, 4>>::entry("i"), 2, 1},
  };
  constexpr int kW = 16, kCalls = 32;
  uint8_t *a, *w;
  uint16_t *d, *d0;
  float* scale;
  float* diff;
  CHECK(cudaMalloc(&a, m * k));
  CHECK(cudaMalloc(&w, size_t(kW) * n * k));
  CHECK(cudaMalloc(&d, m * n * 2));
  CHECK(cudaMalloc(&d0, m * n * 2));
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMalloc(&diff, 4));
  const float s = 1.f / 64;
  CHECK(cudaMemcpy(scale, &s, 4, cudaMemcpyHostToDevice));
  fill_fp8<<<1024, 256>>>(a, m * k, 1);
  fill_fp8<<<4096, 256>>>(w, size_t(kW) * n * k, 2);
  CHECK(cudaDeviceSynchronize());
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::printf("M=%lld N=%lld K=%lld, %d SMs; us per GEMM (median of %d x %d launches), max |d - d_row0|\n",
              (long long)m, (long long)n, (long long)k, sms, reps, kCalls);
  for (size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    GemmArgs g;
    g.m = m, g.n = n, g.k = k, g.a = a, g.a_scale = scale, g.b_scale = scale, g.d = d;
    g.splits = row.splits, g.sm_count = sms * row.sm_mult, g.device = 0;
    if (const char* why = row.e.can_implement(g)) {
      std::printf("%-48s can_implement: %s\n", row.name, why);
      continue;
    }
    CHECK(row.e.prepare());
    size_t ws_bytes = row.e.workspace_size(g);
    void* ws = nullptr;
    if (ws_bytes) CHECK(cudaMalloc(&ws, ws_bytes));
    g.workspace = ws, g.workspace_bytes = ws_bytes;
    std::vector<GemmArgs> gs(kW, g);
    for (int i = 0; i < kW; ++i) gs[i].b = w + size_t(i) * n * k;
    for (int i = 0; i < kW; ++i) CHECK(row.e.run(gs[i], st));  // warm (and params cached)
    CHECK(cudaStreamSynchronize(st));
    std::vector<float> t;
    for (int rep = 0; rep < reps; ++rep) {
      CHECK(cudaEventRecord(e0, st));
      for (int c = 0; c < kCalls; ++c) CHECK(row.e.run(gs[c % kW], st));
      CHECK(cudaEventRecord(e1, st));
      CHECK(cudaEventSynchronize(e1));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3f / kCalls);
    }
    std::sort(t.begin(), t.end());
    // Output check on weight 0 against row 0.
    CHECK(cudaMemsetAsync(d, 0xff, m * n * 2, st));  // poison (bf16 NaN)
    CHECK(row.e.run(gs[0], st));
    float md = 0.f;
    if (r == 0) {
      CHECK(cudaMemcpyAsync(d0, d, m * n * 2, cudaMemcpyDeviceToDevice, st));
    } else {
      CHECK(cudaMemsetAsync(diff, 0, 4, st));
      bf16_maxdiff<<<512, 256, 0, st>>>(d, d0, m * n, diff);
      CHECK(cudaMemcpyAsync(&md, diff, 4, cudaMemcpyDeviceToHost, st));
    }
    CHECK(cudaStreamSynchronize(st));
    std::printf("%-48s %8.2f us  (%.0f GB/s of weights)  smem %d B  maxdiff %g\n", row.name, t[t.size() / 2],
                double(n) * k / (t[t.size() / 2] * 1e3), row.e.smem_bytes, md);
    if (ws) CHECK(cudaFree(ws));
  }
  return 0;
}

}  // namespace fp8_decode_bench

int main(int argc, char** argv) { return fp8_decode_bench::bench_main(argc, argv); }
