"""Child process for test_weightonly.test_command_buffers_*: a jitted chain of 32 dependent FP4/FP6
weight-only GEMM custom calls (all four formats, several CTA shapes) under the XLA_FLAGS it was
started with; prints a JSON line with the result hash and the capture counters."""
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import _backend, weightonly as wo


def main():
  m, n = 4, 1024
  key = jax.random.PRNGKey(0)
  kx, kw = jax.random.split(key)
  x0 = jax.random.normal(kx, (m, n), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (4, n, n), jnp.float32) / np.sqrt(n)
  wps = [wo.prepare(w[0], "nvfp4"), wo.prepare(w[1], "mxfp4"), wo.prepare(w[2], "mxfp6_e2m3"),
         wo.prepare(w[3], "mxfp6_e3m2")]
  tiles = [(16, 8), (32, 16), (64, 8), (16, 16)]

  @jax.jit
  def chain(x, wps):
    for i in range(32):
      rows, tokens = tiles[i % 4]
      y = jax_gmma.weightonly_gemm(x, wps[(i // 4 + i) % 4], rows=rows, tokens=tokens)
      x = y
    return y

  out = None
  for _ in range(3):
    out = np.asarray(chain(x0, wps).astype(jnp.float32))
  assert np.isfinite(out).all() and np.abs(out).max() > 0
  captured, eager = _backend.ext().capture_stats()
  print(json.dumps({"chain": hashlib.sha256(out.tobytes()).hexdigest(), "captured": captured,
                    "eager": eager}))


if __name__ == "__main__":
  main()
