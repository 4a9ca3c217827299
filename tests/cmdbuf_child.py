"""Child process for test_gpu_fp8.test_command_buffers_*: runs a jitted chain of 32 dependent
FP8 GEMM custom calls (and a one-call graph) under the XLA_FLAGS it was started with, and
prints a JSON line: result hashes and how many handler executions were under stream capture."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _cmdbuf import report  # tests/ helper: the JSON line the parent reads


def main():
  n = k = 1024
  key = jax.random.PRNGKey(0)
  ka, kw = jax.random.split(key)
  x0 = (jax.random.normal(ka, (16, k)) * 2).astype(jnp.float8_e4m3fn)
  ws = (jax.random.normal(kw, (32, n, k)) * 2).astype(jnp.float8_e4m3fn)
  scale = jnp.float32(1 / 64)  # keeps the chain's magnitude steady

  @jax.jit
  def chain(x, ws):
    for i in range(32):
      y = jax_gmma.fp8_gemm(x, ws[i], scale, 1.0, out_dtype=jnp.bfloat16, splits=2 if i % 2 else 1,
                            config="swap_128x16x128_coop_streamk_2lvl")
      x = y.astype(jnp.float8_e4m3fn)
    return y

  @jax.jit
  def small(x, w):
    return jax_gmma.fp8_gemm(x, w, scale, 1.0, out_dtype=jnp.float32)

  # N = 2K (the decode benchmark's glue): the next input is the first M * K elements of the
  # output, cast; XLA may fold that slice into the consumer as a dynamic-slice fusion.
  w2 = (jax.random.normal(jax.random.PRNGKey(3), (2, 2 * n, k)) * 2).astype(jnp.float8_e4m3fn)

  @jax.jit
  def sliced(x, ws):
    for i in range(32):
      y = jax_gmma.fp8_gemm(x, ws[i % 2], scale, 1.0, out_dtype=jnp.bfloat16)
      x = y.reshape(-1)[:x.shape[0] * k].reshape(x.shape[0], k).astype(jnp.float8_e4m3fn)
    return y

  outs = {}
  for _ in range(3):  # first run may trace/instantiate; later runs replay
    outs["chain"] = np.asarray(chain(x0, ws))
    outs["small"] = np.asarray(small(x0, ws[0]))
    outs["sliced"] = np.asarray(sliced(x0[:1], w2))
  assert np.isfinite(outs["chain"].astype(np.float32)).all()
  report(outs)


if __name__ == "__main__":
  main()
