// Host cost of one GEMM launch through the kernel library's C++ interface (what our XLA FFI
// handler does per call, minus XLA), next to the CUDA calls it is made of. No JAX.
//
// Build, against the library of the installed package (jax_gmma/libjax_gmma_cuda.so):
//   L=$(cd /tmp && python3 -c "import jax_gmma, os; print(os.path.dirname(jax_gmma.__file__))")
//   nvcc -std=c++17 -O2 -Icpp/include tools/host_cost.cu -L"$L" -ljax_gmma_cuda \
//        -cudart static -Xlinker -rpath,"$L" -o host_cost
// Run (GPU): ./host_cost [iters]
//
// Each row: host microseconds per call, median of 7 repeats of `iters` calls enqueued back to
// back on one stream (no synchronization inside a repeat), and the GPU microseconds per call
// (events around the repeat). Problem: M=16, N=256, K=256, e4m3 x e4m3 -> bf16, per-tensor scales
// (the benchmark's host-cost shape).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "jax_gmma/gemm_api.h"

#include "cuda_check.h"

namespace {

__global__ void empty_kernel(int) {}

struct Big {  // about the size of a CUTLASS sm90 GEMM's Params (TMA descriptors and all)
  char bytes[1024];
};
__global__ void big_param_kernel(__grid_constant__ const Big p) {
  if (p.bytes[threadIdx.x] == 1) asm volatile("trap;");
}


struct Timing {
  double host_us, gpu_us;
};

Timing time_calls(const std::function<void()>& call, cudaStream_t s, int iters) {
  for (int i = 0; i < 20; ++i) call();
  CHECK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<double> host, gpu;
  for (int r = 0; r < 7; ++r) {
    CHECK(cudaEventRecord(e0, s));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) call();
    auto t1 = std::chrono::steady_clock::now();
    CHECK(cudaEventRecord(e1, s));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
    gpu.push_back(ms * 1e3 / iters);
  }
  std::sort(host.begin(), host.end());
  std::sort(gpu.begin(), gpu.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return {host[3], gpu[3]};
}

void row(const std::string& what, Timing t) {
  std::printf("| %-58s | %7.2f | %7.2f |\n", what.c_str(), t.host_us, t.gpu_us);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace jax_gmma;
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  int dev = 0;
  CHECK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const int64_t m = 16, n = 256, k = 256;
  void *a, *b, *d, *ws;
  float* scale;
  CHECK(cudaMalloc(&a, m * k));
  CHECK(cudaMalloc(&b, n * k));
  CHECK(cudaMalloc(&d, m * n * 2));
  CHECK(cudaMalloc(&ws, 1 << 20));
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMemset(a, 0x38, m * k));  // e4m3 1.0
  CHECK(cudaMemset(b, 0x38, n * k));
  const float one = 1.f;
  CHECK(cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice));

  std::printf("# host cost per call on %s (%d SMs), %d calls per repeat, median of 7\n\n",
              prop.name, prop.multiProcessorCount, iters);
  std::printf("| call | host us | GPU us |\n|---|---|---|\n");

  row("empty kernel <<<1, 32>>>", time_calls([&] { empty_kernel<<<1, 32, 0, s>>>(0); }, s, iters));
  row("cudaLaunchKernelEx (empty kernel)", time_calls([&] {
        cudaLaunchConfig_t c{};
        c.gridDim = dim3(1);
        c.blockDim = dim3(32);
        c.stream = s;
        cudaLaunchKernelEx(&c, empty_kernel, 0);
      }, s, iters));
  {
    Big big{};
    row("empty kernel, 1 KB __grid_constant__ parameter <<<1, 32>>>",
        time_calls([&] { big_param_kernel<<<1, 32, 0, s>>>(big); }, s, iters));
    // The driver API directly (entry point fetched at run time: no link against libcuda).
    using LaunchFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void**, void**);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK(cudaGetDriverEntryPoint("cuLaunchKernel", &fn, cudaEnableDefault, &q));
    auto launch = reinterpret_cast<LaunchFn>(fn);
    cudaFunction_t f_empty, f_big;
    CHECK(cudaGetFuncBySymbol(&f_empty, reinterpret_cast<const void*>(empty_kernel)));
    CHECK(cudaGetFuncBySymbol(&f_big, reinterpret_cast<const void*>(big_param_kernel)));
    int zero = 0;
    void* args_empty[] = {&zero};
    void* args_big[] = {&big};
    row("cuLaunchKernel (driver) empty kernel", time_calls([&] {
          launch(reinterpret_cast<CUfunction>(f_empty), 1, 1, 1, 32, 1, 1, 0, s, args_empty, nullptr);
        }, s, iters));
    row("cuLaunchKernel (driver) 1 KB parameter", time_calls([&] {
          launch(reinterpret_cast<CUfunction>(f_big), 1, 1, 1, 32, 1, 1, 0, s, args_big, nullptr);
        }, s, iters));
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    row("cudaLaunchKernelEx 1 KB parameter, cluster 2x1x1", time_calls([&] {
          cudaLaunchConfig_t c{};
          c.gridDim = dim3(2);
          c.blockDim = dim3(32);
          c.stream = s;
          c.attrs = attr;
          c.numAttrs = 1;
          cudaLaunchKernelEx(&c, big_param_kernel, big);
        }, s, iters));
    CHECK(cudaFuncSetAttribute(big_param_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    row("1 KB parameter, 384 threads, 200 KB dynamic smem <<<4, 384>>>", time_calls([&] {
          big_param_kernel<<<4, 384, 200 << 10, s>>>(big);
        }, s, iters));
    row("1 KB parameter, 384 threads, 0 smem <<<4, 384>>>", time_calls([&] {
          big_param_kernel<<<4, 384, 0, s>>>(big);
        }, s, iters));
    row("1 KB parameter, 384 threads, 40 KB smem <<<4, 384>>>", time_calls([&] {
          big_param_kernel<<<4, 384, 40 << 10, s>>>(big);
        }, s, iters));
    row("cudaFuncSetAttribute (non-portable cluster size)", time_calls([&] {
          cudaFuncSetAttribute(big_param_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        }, s, iters));
  }
  row("cudaMemsetAsync 64 B", time_calls([&] { cudaMemsetAsync(ws, 0, 64, s); }, s, iters));
  row("cudaStreamIsCapturing", time_calls([&] {
        cudaStreamCaptureStatus st;
        cudaStreamIsCapturing(s, &st);
      }, s, iters));
  row("cudaGetDevice", time_calls([&] { int x; cudaGetDevice(&x); }, s, iters));

  struct Case {
    const char* config;
    int splits;
  };
  const Case cases[] = {
      {"swap_64x16x128_pingpong_2lvl", 1},
      {"swap_128x16x128_coop_streamk_2lvl", 1},
      {"swap_128x16x128_coop_streamk_2lvl", 2},
      {"swap_128x16x128_coop_streamk_2lvl", 0},
      {"128x128x128_c2x1_coop_2lvl", 1},
      {"128x128x128_c1x2_pingpong_fast", 1},
  };
  for (const Case& c : cases) {
    const KernelEntry* e = find_kernel(c.config, DType::kF8E4M3, DType::kF8E4M3, DType::kBF16);
    if (!e) {
      std::printf("| %-58s | missing |\n", c.config);
      continue;
    }
    CHECK(ensure_prepared(e, dev));
    GemmArgs g;
    g.m = m, g.n = n, g.k = k, g.a = a, g.b = b, g.a_scale = scale, g.b_scale = scale, g.d = d;
    g.workspace = ws, g.workspace_bytes = 1 << 20, g.splits = c.splits;
    g.sm_count = prop.multiProcessorCount, g.device = dev;
    if (const char* why = e->can_implement(g)) {
      std::printf("| %-58s | can_implement: %s |\n", c.config, why);
      continue;
    }
    const size_t wsb = e->workspace_size(g);
    char name[160];
    std::snprintf(name, sizeof name, "%s splits=%d (ws %zu B)", c.config, c.splits, wsb);
    row(name, time_calls([&] { e->run(g, s); }, s, iters));
  }
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaGetLastError());
  return 0;
}
