// Kernel-alone timing of sm90 FP8 tensorwise decode (swap-AB) configs, including candidate
// configs that are not in the library: small tiles with an explicit stage count, so that
// several CTAs share an SM (the structure of XLA's Triton GEMM at M = 64, N = 28672: 448 CTAs
// of 128 threads, ~4 per SM), non-persistent or persistent with sm_count scaled.
//
// Build (CPU machine, ~2 min):
//   C=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//        -cudart static -Icpp/include -Icpp -I$C/include -I$C/tools/util/include \
//        benchmarks/kernels/bench_fp8_decode_kernel.cu -o fp8_decode_bench
// Run (GPU): ./fp8_decode_bench [M N K [reps [words]]]   (default 64 28672 8192)
//
// e4m3 x e4m3 -> bf16, per-tensor scales, two-level accumulation unless the name says fast.
// Each row: µs per GEMM, median of 9 repeats of 32 back-to-back launches over 16 distinct
// weights (3.8 GB at the default shape: every launch streams its weight from HBM), and the
// max |difference| to the first row's output (same arithmetic: 0 or rounding of the split).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "sm90_fp8_gemm_tensorwise.cuh"

#include "../../tools/cuda_check.h"

namespace fp8_decode_bench {
using namespace jax_gmma;
using namespace jax_gmma::sm90;

constexpr DType E4 = DType::kF8E4M3;
constexpr DType BF = DType::kBF16;

// Candidates beside the library's configs (64x64 tiles compiled for 2-4 CTAs per SM through
// Config's MinBlocks_ were timed too and lost).
template <int TN, int S>
using WsFastC2 = Config<Shape<_64, Int<TN>, _128>, Shape<_2, _1, _1>, sched::KernelTmaWarpSpecializedFP8FastAccum,
                        epi::TmaWarpSpecialized, void, true, S>;
// 256 weight rows per cooperative CTA with fast accumulation.
template <int TN, int CX>
using Coop256Fast = Config<Shape<_256, Int<TN>, _128>, Shape<Int<CX>, _1, _1>,
                           sched::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                           epi::TmaWarpSpecializedCooperative, cutlass::gemm::StreamKScheduler, true>;
// The non-persistent 64-row tile with fast accumulation (B resident CTAs per SM).
template <int TN, int S, int B>
using WsFastMb = Config<Shape<_64, Int<TN>, _128>, Shape<_1, _1, _1>,
                        sched::KernelTmaWarpSpecializedFP8FastAccum, epi::TmaWarpSpecialized, void, true, S, B>;

struct Row {
  const char* name;
  KernelEntry e;
  int sm_mult;  // sm_count = 132 * sm_mult (persistent schedulers launch that many CTAs)
  int splits;
  int regs = 0, local = 0, occ = 0;  // registers / local (spill) bytes per thread, CTAs per SM
};

// A row with the kernel's resource usage (cudaFuncGetAttributes) and occupancy.
template <class Cfg>
Row row(const char* name, int sm_mult, int splits) {
  using G = Sm90Fp8Gemm<E4, E4, BF, Cfg>;
  Row r{name, G::entry(name), sm_mult, splits};
  const void* fn = reinterpret_cast<const void*>(&cutlass::device_kernel<typename G::GemmKernel>);
  CHECK(r.e.prepare());
  cudaFuncAttributes at;
  CHECK(cudaFuncGetAttributes(&at, fn));
  r.regs = at.numRegs, r.local = static_cast<int>(at.localSizeBytes);
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.occ, fn, r.e.threads, r.e.smem_bytes));
  return r;
}

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
      row<CfgDecodeSwapC2<64>>("lib swap_128x64 c2x1 coop streamk 2lvl (pick)", 1, 0),
      row<CfgDecodeSwapCoopFast<64, 2>>("lib swap_128x64 c2x1 coop streamk fast", 1, 0),
      row<CfgDecodeSwapPp<64>>("lib swap_64x64 pingpong 2lvl", 1, 1),
      row<CfgDecodeSwapWs<64, 6>>("ws 64x64 s6 (non-persistent)", 1, 1),
      row<WsFastMb<64, 3, 1>>("ws fast 64x64 s3", 1, 1),
      // cuBLASLt's shapes (read with ncu): 256x64 tiles in 4x1 clusters at M = 64 (one wave
      // of 112 CTAs, activations multicast to 4 CTAs), 128x8 / 128x16 tiles in 2x1 clusters
      // with 11-12 stages at M = 1 / 16.
      row<CfgDecodeSwapCoop<256, 64, 4>>("coop 256x64 c4x1 streamk 2lvl", 1, 0),
      row<CfgDecodeSwapCoop<256, 64, 4>>("coop 256x64 c4x1 dp 2lvl", 1, 1),
      row<Coop256Fast<64, 4>>("coop 256x64 c4x1 dp fast", 1, 1),
      row<CfgDecodeSwapCoop<256, 64, 2>>("coop 256x64 c2x1 dp 2lvl", 1, 1),
      row<CfgDecodeSwapCoop<128, 64, 4>>("coop 128x64 c4x1 streamk 2lvl", 1, 0),
      row<CfgDecodeSwapWsC2<64, 6>>("ws 64x64 c2x1 s6 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWsC2<64, 4>>("ws 64x64 c2x1 s4 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWsC2<64, 3>>("ws 64x64 c2x1 s3 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWs<64, 4>>("ws 64x64 s4 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWs<64, 3>>("ws 64x64 s3 (non-persistent)", 1, 1),
      row<WsFastC2<64, 4>>("ws fast 64x64 c2x1 s4", 1, 1),
      row<WsFastC2<64, 3>>("ws fast 64x64 c2x1 s3", 1, 1),
      row<CfgDecodeSwapPp<32>>("lib swap_64x32 pingpong 2lvl", 1, 1),
      row<CfgDecodeSwapWsC2<32, 4>>("ws 64x32 c2x1 s4 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWsC2<32, 6>>("ws 64x32 c2x1 s6 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWs<32, 4>>("ws 64x32 s4 (non-persistent)", 1, 1),
      row<CfgDecodeSwapWs<16, 4>>("ws 64x16 s4", 1, 1),
      row<CfgDecodeSwapWs<16, 8>>("ws 64x16 s8", 1, 1),
      row<CfgDecodeSwapWs<16, 10>>("ws 64x16 s10 (non-persistent)", 1, 1),
      row<WsFastMb<16, 10, 1>>("ws fast 64x16 s10", 1, 1),
      row<CfgDecodeSwap<16>>("lib swap_128x16 coop streamk 2lvl", 1, 0),
      row<CfgDecodeSwapCoop<128, 16, 2>>("coop 128x16 c2x1 streamk 2lvl", 1, 0),
      row<CfgDecodeSwapCoop<128, 16, 2>>("coop 128x16 c2x1 dp 2lvl", 1, 1),
      row<CfgDecodeSwapCoop<128, 8, 2>>("coop 128x8 c2x1 streamk 2lvl", 1, 0),
      row<CfgDecodeSwapCoop<256, 16, 2>>("coop 256x16 c2x1 dp 2lvl", 1, 1),
      row<CfgDecodeSwapWsC2<16, 8>>("ws 64x16 c2x1 s8 (non-persistent)", 1, 1),
  };
  // Optional 5th argument: only rows whose name contains one of these comma-separated words
  // (row 0 always runs: it is the output reference).
  if (argc > 5) {
    std::vector<Row> keep = {rows[0]};
    std::string words = argv[5];
    for (size_t r = 1; r < rows.size(); ++r) {
      size_t p = 0;
      while (p <= words.size()) {
        size_t q = words.find(',', p);
        if (q == std::string::npos) q = words.size();
        std::string w = words.substr(p, q - p);
        if (!w.empty() && std::string(rows[r].name).find(w) != std::string::npos) {
          keep.push_back(rows[r]);
          break;
        }
        p = q + 1;
      }
    }
    rows = keep;
  }
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
    std::printf("%-48s %8.2f us  (%.0f GB/s of weights)  smem %d B  regs %d  local %d B  %d CTA/SM  maxdiff %g\n",
                row.name, t[t.size() / 2], double(n) * k / (t[t.size() / 2] * 1e3), row.e.smem_bytes, row.regs,
                row.local, row.occ, md);
    if (ws) CHECK(cudaFree(ws));
  }
  return 0;
}

}  // namespace fp8_decode_bench

int main(int argc, char** argv) { return fp8_decode_bench::bench_main(argc, argv); }
