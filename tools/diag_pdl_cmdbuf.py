"""Does programmatic dependent launch (PDL) survive XLA's command buffers? (issue #2 / #4 probe)

Jits a chain of 32 dependent custom calls of tools/diag_pdl_cmdbuf.cu's probe kernel, with and
without the PDL launch attribute, and prints per call: the gap from call i's end to call i + 1's
start (negative: the calls overlapped, so PDL took effect), the time per call, and how many
executions ran inside a CUDA-graph capture. Run under XLA's default flags (command buffers on)
and again with XLA_FLAGS=--xla_gpu_enable_command_buffer= (plain stream launches):

  python3 tools/diag_pdl_cmdbuf.py prebuilt/libpdl_probe.so
"""
import ctypes
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
lib = ctypes.cdll.LoadLibrary(sys.argv[1] if len(sys.argv) > 1 else "libpdl_probe.so")
jax.ffi.register_ffi_target("jax_gmma_pdl_probe", jax.ffi.pycapsule(lib.JaxGmmaPdlProbe),
                            platform="CUDA")
CHAIN, SPIN_NS = 32, 20_000


def probe(x, pdl):
  return jax.ffi.ffi_call("jax_gmma_pdl_probe",
                          (jax.ShapeDtypeStruct(x.shape, x.dtype),
                           jax.ShapeDtypeStruct((2,), jnp.uint64)))(
                              x, spin_ns=np.int64(SPIN_NS), pdl=np.int64(pdl))


def chain(x, pdl):
  ts = []
  for _ in range(CHAIN):
    x, t = probe(x, pdl)
    ts.append(t)
  return x, jnp.stack(ts)


x0 = jnp.arange(1 << 16, dtype=jnp.float32)
for pdl in (0, 1, 0, 1):
  f = jax.jit(lambda x, pdl=pdl: chain(x, pdl))
  y, ts = jax.block_until_ready(f(x0))
  c0, k0 = lib.pdl_probe_calls(), lib.pdl_probe_captured()
  runs = []
  for _ in range(20):
    t0 = time.perf_counter()
    y, ts = jax.block_until_ready(f(x0))
    runs.append((time.perf_counter() - t0) / CHAIN * 1e6)
  calls, captured = lib.pdl_probe_calls() - c0, lib.pdl_probe_captured() - k0
  ts = np.asarray(ts).astype(np.int64)
  gaps = (ts[1:, 0] - ts[:-1, 1]) / 1e3
  ok = bool(np.array_equal(np.asarray(y), np.asarray(x0) + CHAIN))
  print(f"pdl={pdl}: end->next start median {np.median(gaps):+.2f} us (min {gaps.min():+.2f}, "
        f"max {gaps.max():+.2f}); kernel {np.median((ts[:, 1] - ts[:, 0]) / 1e3):.2f} us; "
        f"wall {np.median(runs):.2f} us per call; executions {calls}, captured {captured}; "
        f"result {'ok' if ok else 'WRONG'}", flush=True)
