// Graph safety of jax-gmma's XLA FFI handlers, declared in one place.
//
// Every handler of this library (ffi/*.cc) is command-buffer compatible because its execute
// path follows these rules, proven by tests that check capture (tests/cmdbuf_child.py):
//  * the stream comes from the platform context and is asked nothing but cudaStreamIsCapturing
//    (cudaStreamGetDevice on a capturing stream invalidates the capture);
//  * the device comes from cudaGetDevice(), which capture allows;
//  * one-time setup (shared-memory attributes) happens once per device, before capture;
//  * only kernel launches and memsets are enqueued; nothing synchronizes or copies device
//    memory to the host (scales are read by the kernels).
#pragma once

#include <cuda_runtime_api.h>

#include "xla/ffi/api/ffi.h"

#define JAX_GMMA_GRAPH_SAFE_TRAITS {xla::ffi::Traits::kCmdBufferCompatible}

// Counts one handler execution as captured (inside a CUDA graph capture) or eager; defined in
// ffi/common.cc, read by _gmma_ext.capture_stats().
extern "C" void jax_gmma_count_execution(bool captured);

// The execute path's one stream query: is the stream capturing? Counts the execution as
// captured or eager; false when CUDA cannot say (the handler then fails with an internal error).
inline bool jax_gmma_note_execution(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) return false;
  jax_gmma_count_execution(capture == cudaStreamCaptureStatusActive);
  return true;
}
