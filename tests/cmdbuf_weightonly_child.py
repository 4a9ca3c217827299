"""Child process for test_weightonly.test_command_buffers_*: a jitted chain of 32 dependent FP4/FP6
weight-only GEMM custom calls (all four formats, several CTA shapes) under the XLA_FLAGS it was
started with; prints a JSON line with the result hash and the capture counters."""
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import _backend
from jax_gmma.ops import weightonly as wo


def main():
  m, n = 4, 1024
  key = jax.random.PRNGKey(0)
  kx, kw = jax.random.split(key)
  x0 = jax.random.normal(kx, (m, n), jnp.float32).astype(jnp.bfloat16)
  w = jax.random.normal(kw, (4, n, n), jnp.float32) / np.sqrt(n)
  wps = [wo.prepare(w[0], "nvfp4"), wo.prepare(w[1], "mxfp4"), wo.prepare(w[2], "mxfp6_e2m3"),
         wo.prepare(w[3], "mxfp6_e3m2")]
  tiles = [(16, 8, 8), (32, 16, 2), (64, 8, 8), (16, 8, 16)]

  @jax.jit
  def chain(x, wps):
    for i in range(32):
      rows, tokens, k_warps = tiles[i % 4]
      y = jax_gmma.weightonly_gemm(x, wps[(i // 4 + i) % 4], rows=rows, tokens=tokens,
                                   k_warps=k_warps)
      x = y
    return y

  # The prefill paths (M >= PREFILL_MIN_M): unpack kernel + bf16 dot (all formats), and unpack
  # to FP8 + jax-gmma's FP8 GEMM (MX formats), each in its own chain of 8.
  def prefill(path, ws):
    @jax.jit
    def run(x, ws):
      for i in range(8):
        xin = x.astype(jnp.float8_e4m3fn) if path == "fp8" else x
        x = jax_gmma.weightonly_gemm(xin, ws[i % len(ws)], path=path)
      return x
    return run

  # N != K (the decode benchmark's glue): the next input is the first M * K elements of the
  # (M, 2K) output, a slice XLA folds into the consumer as a dynamic-slice fusion around our
  # custom call (the handler gets an offset into the producer's buffer, no copy kernel).
  ws2 = [wo.prepare(jax.random.normal(jax.random.PRNGKey(7 + i), (2 * n, n), jnp.float32) / np.sqrt(n), f)
         for i, f in enumerate(("nvfp4", "mxfp6_e2m3"))]

  def sliced(m):
    @jax.jit
    def run(x, ws):
      for i in range(32):
        y = jax_gmma.weightonly_gemm(x, ws[i % 2])
        x = y.reshape(-1)[:m * n].reshape(m, n)
      return y
    return run

  xp = jax.random.normal(kx, (wo.PREFILL_MIN_M, n), jnp.float32).astype(jnp.bfloat16)
  stats = _backend.ext().capture_stats
  res = {}
  for name, fn, args in (("chain", chain, (x0, wps)),
                         ("dequant", prefill("dequant", wps), (xp, wps)),
                         ("fp8", prefill("fp8", wps[1:]), (xp, wps[1:])),
                         ("sliced1", sliced(1), (x0[:1], ws2)),
                         ("sliced4", sliced(4), (x0, ws2))):
    compiled = fn.lower(*args).compile()
    c0, e0 = stats()
    for _ in range(3):
      out = np.asarray(compiled(*args).astype(jnp.float32))
    assert np.isfinite(out).all() and np.abs(out).max() > 0, name
    c1, e1 = stats()
    res[name] = hashlib.sha256(out.tobytes()).hexdigest()
    res[name + "_captured"], res[name + "_eager"] = c1 - c0, e1 - e0
    if name.startswith("sliced"):
      res[name + "_dsfusion"] = "dynamic_slice_fusion" in (compiled.as_text() or "")
  res["captured"], res["eager"] = stats()
  print(json.dumps(res))


if __name__ == "__main__":
  main()
