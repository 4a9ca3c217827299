"""Does the activation traffic bound the FP4 weight-only decode kernel at M = 16? (issue #4)

At M = 16, N = 28672, K = 8192 the picked CTA (32 weight rows, 16 tokens, 2 warps along K) reads
its 16 x 8192 activations once per CTA: 896 CTAs x 256 KiB of bf16 = 235 MB through L2 beside
117 MB of packed weights; at M = 1 it is 15 MB. FP8 activations (widened to bf16 in the kernel)
halve those bytes and change nothing else, so if L2 traffic bounds the kernel, e4m3 activations
run faster at M = 16 and not at M = 1. Times the kernel path with bf16 and e4m3 activations, G
independent GEMMs on distinct weight copies per jitted call (past the L2), median of repeats.

  python3 -P tools/diag_wo_activation_bytes.py [--formats nvfp4,mxfp4] [--ms 1,16] [--nk 28672x8192]
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import weightonly as wo


def time_call(f, args, repeats):
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    ts.append(time.perf_counter() - t0)
  return float(np.median(ts))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--formats", default="nvfp4,mxfp4")
  p.add_argument("--ms", default="1,16")
  p.add_argument("--nk", default="28672x8192")
  p.add_argument("--copies", type=int, default=4)
  p.add_argument("--gemms", type=int, default=32)
  p.add_argument("--repeats", type=int, default=20)
  a = p.parse_args()
  n, k = (int(v) for v in a.nk.split("x"))
  rng = np.random.default_rng(0)
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; N={n} K={k}; {a.gemms} GEMMs per call "
        f"over {a.copies} weight copies")
  for fmt in a.formats.split(","):
    w = jnp.asarray(rng.standard_normal((n, k)).astype(np.float32))
    wp = wo.prepare(w, fmt)
    copies = [jax.tree_util.tree_map(lambda t: jnp.array(t, copy=True), wp) for _ in range(a.copies)]
    del w
    for m in (int(v) for v in a.ms.split(",")):
      x = jnp.asarray(rng.standard_normal((a.gemms, m, k)).astype(np.float32))
      xb = x.astype(jnp.bfloat16)
      x8 = x.astype(jnp.float8_e4m3fn)
      s = jnp.ones((m,), jnp.float32)

      def run_bf16(xs, ws):
        return [jax_gmma.weightonly_gemm(xs[i], ws[i % len(ws)], path="kernel") for i in range(a.gemms)]

      def run_fp8(xs, ws):
        return [jax_gmma.weightonly_gemm(xs[i], ws[i % len(ws)], x_scale=s, path="kernel")
                for i in range(a.gemms)]

      tb = time_call(jax.jit(run_bf16), (xb, copies), a.repeats) / a.gemms * 1e6
      t8 = time_call(jax.jit(run_fp8), (x8, copies), a.repeats) / a.gemms * 1e6
      # Same products: an e4m3 activation widened to bf16 is exact, so bf16(x8) gives the same output.
      ref = jax.jit(lambda xs, w: jax_gmma.weightonly_gemm(xs[0].astype(jnp.bfloat16), w, path="kernel"))(x8, copies[0])
      got = jax.jit(lambda xs, w: jax_gmma.weightonly_gemm(xs[0], w, x_scale=s, path="kernel"))(x8, copies[0])
      same = bool(jnp.array_equal(ref, got))
      print(f"{fmt:6s} M={m:3d}: bf16 x {tb:7.2f} us/GEMM   e4m3 x {t8:7.2f} us/GEMM   "
            f"bf16/e4m3 {tb / t8:5.3f}   e4m3 output == bf16(e4m3) output: {same}", flush=True)


if __name__ == "__main__":
  main()
