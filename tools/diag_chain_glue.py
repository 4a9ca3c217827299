"""What the cast between dependent FP8 GEMMs costs in a decode chain (ours vs XLA's FP8 dot).

  python3 -P tools/diag_chain_glue.py [MxNxK,...]   (default 1x8192x8192,16x28672x8192,64x28672x8192; GPU)

For each shape, one jitted call of 32 GEMMs, timed two ways with the same weights (cycled over
enough distinct copies to exceed the 60 MB L2):
  chain  the benchmark's decode chain: x_{i+1} = out_i[:, :K].astype(e4m3), a slice + cast
         fusion between our custom calls (XLA fuses the cast into its own GEMM's prologue),
  indep  32 independent GEMMs on 32 distinct fp8 activations made outside the call (no glue).
chain - indep is what the glue costs per GEMM, dependency included.
"""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_fp8 import CHAIN, _n_distinct, ours_gemm, warm_gpu, xla_fp8_gemm  # noqa: E402
from sweep import time_fn  # noqa: E402

F8 = jnp.float8_e4m3fn
STEPS = CHAIN  # 32, the benchmark's chain length


def main():
  spec = sys.argv[1] if len(sys.argv) > 1 else "1x8192x8192,16x28672x8192,64x28672x8192"
  shapes = [tuple(int(v) for v in s.split("x")) for s in spec.split(",")]
  warm_gpu(2.0)
  s = jnp.float32(1 / 64)
  gen = jax.jit(lambda kk, shape: (jax.random.normal(kk, shape) * 2).astype(F8), static_argnums=1)
  for m, n, k in shapes:
    d = _n_distinct(n, k, 3 << 30)
    ws = [gen(jax.random.PRNGKey(100 + i), (n, k)) for i in range(d)]
    xs = [gen(jax.random.PRNGKey(i), (m, k)) for i in range(STEPS)]
    for name, gemm in (("ours", ours_gemm), ("xla_fp8", xla_fp8_gemm)):
      def chain(x, ws, gemm=gemm):
        out = None
        for i in range(STEPS):
          out = gemm(x, ws[i % d], s, s)
          x = out[:, :k].astype(F8)
        return out

      def indep(xs, ws, gemm=gemm):
        return [gemm(xs[i], ws[i % d], s, s) for i in range(STEPS)]

      tc = time_fn(jax.jit(chain), (xs[0], ws), 9, iters=8) / STEPS * 1e6
      ti = time_fn(jax.jit(indep), (xs, ws), 9, iters=8) / STEPS * 1e6
      print(f"{name:8s} {m}x{n}x{k}: chain {tc:7.2f} us/GEMM, indep {ti:7.2f}, glue {tc - ti:+6.2f}",
            flush=True)
    ws = xs = None


if __name__ == "__main__":
  main()
