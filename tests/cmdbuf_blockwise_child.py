"""Child process for test_gpu_blockwise.test_command_buffers_*: runs a jitted chain of 32
dependent block-scaled FP8 GEMM custom calls (both scale variants, data-parallel, split-K and
ping-pong configs) and a one-call graph under the XLA_FLAGS it was started with, and prints a
JSON line: result hashes and how many handler executions were under stream capture."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _cmdbuf import report  # tests/ helper: the JSON line the parent reads


def main():
  m, n, k = 16, 1024, 1024
  kb = k // 128
  key = jax.random.PRNGKey(0)
  ka, kw, ks = jax.random.split(key, 3)
  x0 = (jax.random.normal(ka, (m, k)) * 2).astype(jnp.float8_e4m3fn)
  ws = (jax.random.normal(kw, (32, n, k)) * 2).astype(jnp.float8_e4m3fn)
  sb2 = jax.random.uniform(ks, (32, n // 128, kb), jnp.float32, 0.8, 1.2)  # 128x128 scales
  sb1 = jnp.repeat(sb2, 128, axis=1)                                        # the same, 1x128
  sa = jnp.full((m, kb), 1 / 64, jnp.float32)  # gain ~ sqrt(K) * rms(w) / 64 = 1: steady magnitude

  @jax.jit
  def chain(x, ws, sb1, sb2):
    for i in range(32):
      if i % 4 == 0:
        y = jax_gmma.blockwise_gemm(x, ws[i], sa, sb2[i], out_dtype=jnp.bfloat16)
      elif i % 4 == 1:
        y = jax_gmma.blockwise_gemm(x, ws[i], sa, sb2[i], out_dtype=jnp.bfloat16,
                                    config="swap_128x16x128_coop_streamk", splits=2)
      elif i % 4 == 2:
        y = jax_gmma.blockwise_gemm(x, ws[i], sa, sb1[i], out_dtype=jnp.bfloat16,
                                    config="swap_64x16x128_pingpong")
      else:
        y = jax_gmma.blockwise_gemm(x, ws[i], sa, sb1[i], out_dtype=jnp.float32,
                                    config="128x128x128_c1x1_coop_streamk", splits=3)
      x = y.astype(jnp.float8_e4m3fn)
    return y

  @jax.jit
  def small(x, w, sb):
    return jax_gmma.blockwise_gemm(x, w, sa, sb, out_dtype=jnp.float32)

  outs = {}
  for _ in range(3):  # first run may trace/instantiate; later runs replay
    outs["chain"] = np.asarray(chain(x0, ws, sb1, sb2))
    outs["small"] = np.asarray(small(x0, ws[0], sb2[0]))
  assert np.isfinite(outs["chain"].astype(np.float32)).all()
  assert np.abs(outs["chain"]).max() > 0  # never all-zeros
  report(outs)


if __name__ == "__main__":
  main()
