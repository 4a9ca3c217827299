"""Child process for test_gpu_mx_sm90.test_command_buffers_*: a jitted chain of 32 dependent
MXFP8 GEMM custom calls (every Hopper config) and a one-call graph under the XLA_FLAGS it was
started with; prints a JSON line: result hashes and how many handler executions ran under
stream capture."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _cmdbuf import report  # tests/ helper: the JSON line the parent reads
from jax_gmma.ops import mx

CONFIGS = mx.KERNELS["sm_90a"][("mxfp8", "mxfp8")]


def main():
  m, n, k = 16, 1024, 1024
  ka, kw = jax.random.split(jax.random.PRNGKey(0))
  x0 = jax.random.normal(ka, (m, k))
  ws = [jax_gmma.quantize(w, "mxfp8", layout="sm100_128x4")
        for w in jax.random.normal(kw, (32, n, k)) / 32]  # gain ~ sqrt(K) / 32 = 1

  @jax.jit
  def chain(x, ws):
    for i in range(32):
      xq = jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4")
      y = jax_gmma.mx_gemm(xq, ws[i], out_dtype=jnp.float32, config=CONFIGS[i % len(CONFIGS)])
      x = y
    return y

  @jax.jit
  def small(x, w):
    return jax_gmma.mx_gemm(jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4"), w)

  outs = {}
  for _ in range(3):  # first run may trace/instantiate; later runs replay
    outs["chain"] = np.asarray(chain(x0, ws))
    outs["small"] = np.asarray(small(x0, ws[0]).astype(jnp.float32))
  assert np.isfinite(outs["chain"]).all() and np.abs(outs["chain"]).max() > 0
  report(outs)


if __name__ == "__main__":
  main()
