"""Sweep the compiled kernel configs (and K splits) of jax-gmma's sm90 FP8 GEMM over shapes,
on the GPU, and print a table with the heuristic's pick marked. Used to tune
jax_gmma.configs.select_config.

  python3 -P benchmarks/sweep.py --suite decode|large|all [--out DIR]

Per row: median over repeats of a jitted function running 32 independent GEMMs over a pool
of distinct weight matrices (>= 200 MB, so weights come from HBM, not L2), divided by 32,
after a GPU warm-up (idle clocks would skew the first rows).
Stage counts are not swept: each config is compiled with CUTLASS's automatic stage count
(as many stages as shared memory allows after the epilogue's carve-out).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import configs, shapes

DECODE = [(m, n, k) for (n, k) in [(8192, 8192), (28672, 8192)] for m in (1, 16, 64)]
LARGE = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 8192), (4096, 7168, 16384),
         (4096, 2112, 7168), (4096, 24576, 1536), (129, 8192, 8192), (256, 8192, 8192)]


def candidates(m):
  out = []
  for c in configs.CONFIGS.values():
    if c.swap_ab and m > c.tile[1]:
      continue
    if not c.swap_ab and m <= 16:
      continue
    if c.stream_k:
      for s in ((1, 2, 3, 4) if c.swap_ab else (0, 1, 2)):
        out.append((c, s))
    else:
      out.append((c, 1))
  return out


def time_fn(f, args, repeats, iters=4):
  """Median seconds per call: `iters` calls are enqueued back to back per repeat (dispatch
  overlaps execution), after a warm-up."""
  for _ in range(2):
    jax.block_until_ready(f(*args))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(iters):
      out = f(*args)
    jax.block_until_ready(out)
    ts.append((time.perf_counter() - t0) / iters)
  return float(np.median(ts))


def warm_gpu(seconds=1.0):
  """Brings the clocks up before the first timed config (idle clocks skew the first rows)."""
  x = jnp.ones((8192, 8192), jnp.bfloat16)
  f = jax.jit(lambda x: x @ x)
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    jax.block_until_ready(f(x))


def sweep_shape(m, n, k, repeats, sm_count):
  key = jax.random.PRNGKey(m * 7 + n + k)
  # G = 32 GEMMs per call over a pool of distinct weights of >= 200 MB (cycled), so the
  # weights stream from HBM and per-call dispatch is amortized.
  g = 32
  pool = max(2, min(g, math.ceil(200e6 / (n * k))))
  ka, kw = jax.random.split(key)
  a = (jax.random.normal(ka, (m, k)) * 2).astype(jnp.float8_e4m3fn)
  ws = (jax.random.normal(kw, (pool, n, k)) * 2).astype(jnp.float8_e4m3fn)
  sa, sb = jnp.float32(1 / 64), jnp.float32(1 / 64)
  prob = shapes.fp8_gemm_problem((m, k), a.dtype, (n, k), ws.dtype)
  pick = configs.select_config(prob, sm_count)
  pick_fast = configs.select_config(prob, sm_count, fast_accum=True)
  rows = []
  for cfg, s in candidates(m):
    def f(a, ws, cfg=cfg, s=s):
      return [jax_gmma.fp8_gemm(a, ws[i % pool], sa, sb, config=cfg.name, splits=s) for i in range(g)]
    try:
      t = time_fn(jax.jit(f), (a, ws), repeats) / g
    except Exception as e:  # a config that cannot run this shape
      rows.append(dict(m=m, n=n, k=k, config=cfg.name, splits=s, error=str(e).splitlines()[0][:120]))
      continue
    rows.append(dict(m=m, n=n, k=k, config=cfg.name, splits=s, us=t * 1e6,
                     tflops=2 * m * n * k / t / 1e12, weight_gbs=n * k / t / 1e9,
                     pick=(cfg.name, s) == (pick[0].name, pick[1]),
                     pick_fast=(cfg.name, s) == (pick_fast[0].name, pick_fast[1])))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", choices=("decode", "large", "all"), default="decode")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--out", default="bench_out")
  args = p.parse_args()
  dev = jax.devices()[0]
  sm = int(getattr(dev, "core_count", 132))
  shapes_ = {"decode": DECODE, "large": LARGE, "all": DECODE + LARGE}[args.suite]
  rows = []
  warm_gpu()
  for m, n, k in shapes_:
    rs = sweep_shape(m, n, k, args.repeats, sm)
    rows += rs
    ok = [r for r in rs if "us" in r]
    best = min(ok, key=lambda r: r["us"]) if ok else None
    print(f"\nM={m} N={n} K={k}")
    for r in sorted(ok, key=lambda r: r["us"]):
      mark = ("<- pick" if r["pick"] else "") + (" <- pick(fast)" if r["pick_fast"] else "")
      print(f"  {r['config']:36s} splits={r['splits']}  {r['us']:9.2f} us  {r['tflops']:7.1f} TF/s "
            f"{r['weight_gbs']:7.0f} GB/s  {r['us'] / best['us']:.2f}x best {mark}")
    for r in rs:
      if "error" in r:
        print(f"  {r['config']:36s} splits={r['splits']}  ERROR {r['error']}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"sweep_{args.suite}.json"), "w") as f:
    json.dump(dict(device=dev.device_kind, date=time.strftime("%Y-%m-%d"), rows=rows), f, indent=1)


if __name__ == "__main__":
  main()
