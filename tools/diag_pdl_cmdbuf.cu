// Does programmatic dependent launch (PDL) survive XLA's command buffers? A probe for issue #2/#4
// decode chains (32 dependent custom calls): if call i + 1 may start while call i finishes, a
// weight-streaming kernel could prefetch its (independent) weights under the previous one's tail.
//
// The kernel records %globaltimer at its start and end (block 0, thread 0) into its own output;
// with PDL (attr pdl = 1) it triggers its dependents at once, spins `spin_ns` of independent work,
// then waits on its predecessor (griddepcontrol.wait) before the dependent work y = x + 1.
// tools/diag_pdl_cmdbuf.py jits a chain of these calls and prints the overlaps.
//
// Build (no Python dependency; XLA FFI headers from jaxlib):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC \
//        -cudart static -I$(python3 -c "import jaxlib,os;print(os.path.dirname(jaxlib.__file__))")/include \
//        tools/diag_pdl_cmdbuf.cu -o libpdl_probe.so
#include <cstdint>

#include <cuda_runtime.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

__device__ __forceinline__ uint64_t gtime() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__global__ void probe_kernel(const float* x, float* y, uint64_t* ts, int64_t n, int64_t spin_ns,
                             int pdl) {
  const uint64_t t0 = gtime();
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  while (gtime() - t0 < static_cast<uint64_t>(spin_ns)) {
  }
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = x[i] + 1.0f;
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    ts[0] = t0;
    ts[1] = gtime();
  }
}

static int g_calls = 0, g_captured = 0;  // executions seen, and how many inside a capture
extern "C" int pdl_probe_calls() { return g_calls; }
extern "C" int pdl_probe_captured() { return g_captured; }

static ffi::Error ProbeImpl(cudaStream_t stream, ffi::Buffer<ffi::F32> x,
                            ffi::ResultBuffer<ffi::F32> y, ffi::ResultBuffer<ffi::U64> ts,
                            int64_t spin_ns, int64_t pdl) {
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) return ffi::Error::Internal("capture query");
  ++g_calls;
  g_captured += cap == cudaStreamCaptureStatusActive;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(132);
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, probe_kernel, x.typed_data(), y->typed_data(),
                                           ts->typed_data(), static_cast<int64_t>(x.element_count()),
                                           spin_ns, static_cast<int>(pdl));
  if (e != cudaSuccess) return ffi::Error::Internal(cudaGetErrorString(e));
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxGmmaPdlProbe, ProbeImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::U64>>()
                                  .Attr<int64_t>("spin_ns")
                                  .Attr<int64_t>("pdl"),
                              {ffi::Traits::kCmdBufferCompatible});
