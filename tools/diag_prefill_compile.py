"""Time the compile (and one run) of weight-only GEMMs on the prefill path vs the decode kernel
at MiniLM's shapes and token count (the MiniLM GPU run with wo: rows did not finish within 150 s
once M >= PREFILL_MIN_M took the dequantize + bf16 GEMM path). Prints, per format, path and
shape: lower+compile seconds, run milliseconds, and the fusion kinds / custom calls XLA made.
Run on the GPU machine: python3 -P tools/diag_prefill_compile.py [--m 1680]"""
import argparse
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import weightonly as wo

SHAPES = [(1152, 384), (384, 384), (1536, 384), (384, 1536)]  # MiniLM qkv, o, up, down


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--m", type=int, default=1680)
  ap.add_argument("--formats", default="nvfp4,mxfp6_e2m3")
  args = ap.parse_args()
  print("backend", jax.default_backend(), jax.devices()[0].device_kind, "jax", jax.__version__)
  rng = np.random.default_rng(0)
  for fmt in args.formats.split(","):
    for n, k in SHAPES:
      wp = wo.prepare(rng.standard_normal((n, k)).astype(np.float32), fmt)
      x = jnp.asarray(rng.standard_normal((args.m, k)), jnp.bfloat16)
      for path in ("kernel", "dequant"):
        f = jax.jit(lambda x, wp, path=path: jax_gmma.weightonly_gemm(x, wp, path=path))
        t0 = time.perf_counter()
        compiled = f.lower(x, wp).compile()
        t1 = time.perf_counter()
        jax.block_until_ready(compiled(x, wp))
        t2 = time.perf_counter()
        jax.block_until_ready(compiled(x, wp))
        t3 = time.perf_counter()
        txt = compiled.as_text()
        kinds = sorted(set(re.findall(r'kind=(k\w+)', txt)))
        ccs = sorted(set(re.findall(r'custom_call_target="([^"]+)"', txt)))
        tri = len(re.findall(r'__triton', txt))
        print(f"{fmt:11s} {path:8s} M={args.m} N={n:5d} K={k:5d} compile {t1 - t0:7.2f} s  "
              f"first run {1e3 * (t2 - t1):8.2f} ms  run {1e3 * (t3 - t2):7.3f} ms  "
              f"fusion kinds {kinds} custom calls {ccs} triton mentions {tri}", flush=True)


if __name__ == "__main__":
  main()
