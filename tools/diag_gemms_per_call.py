"""How the time per GEMM depends on the GEMMs per jitted call (ours vs XLA's FP8 dot).

  python3 -P tools/diag_gemms_per_call.py [M N K]   (default 4096 2112 7168; GPU only)

Times jitted functions holding G = 1, 2 and 8 independent GEMMs (one activation, G distinct
weights, L2-resident activation) and prints the time per GEMM for each. Session 11 used it to
find why the large suite's 4096x2112x7168 ratio moved with the measurement: ours 103.6 / 104.4 /
98.8 us at G = 1 / 2 / 8, XLA's cuBLASLt FP8 dot 97.3 / 113.4 / 108.1 (XLA autotunes each
jitted module on its own, so its algorithm, and time, can differ between G).
"""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_fp8 import ours_fast_gemm, warm_gpu, xla_fp8_gemm  # noqa: E402
from sweep import time_fn  # noqa: E402


def main():
  m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 2112, 7168)
  a = jax.random.normal(jax.random.PRNGKey(0), (m, k)).astype(jnp.float8_e4m3fn)
  bs = [jax.random.normal(jax.random.PRNGKey(i + 1), (n, k)).astype(jnp.float8_e4m3fn) for i in range(8)]
  s = jnp.float32(1 / 64)
  warm_gpu(2.0)
  for name, gemm in (("ours_fast", ours_fast_gemm), ("xla_fp8", xla_fp8_gemm)):
    for g in (1, 2, 8):
      f = jax.jit(lambda a, bs, g=g, gemm=gemm: [gemm(a, bs[i], s, s) for i in range(g)])
      us = time_fn(f, (a, bs[:g]), 7, iters=max(20, 160 // g)) / g * 1e6
      print(f"{name:10s} {m}x{n}x{k} G={g}: {us:7.1f} us/GEMM", flush=True)


if __name__ == "__main__":
  main()
