"""Sweep the compiled kernel configs (and K splits) of jax-gmma's sm90 FP8 GEMM over shapes,
on the GPU, and print a table with the heuristic's pick marked. Used to tune
jax_gmma.configs.select_config.

  python3 -P benchmarks/sweep.py --suite decode|large|all [--out DIR]

Per row: median over repeats of a jitted function running G independent GEMMs (32 for M <= 64,
8 above), each with its own weight matrix (>= 200 MB per call, so weights come from HBM, not
L2; distinct operands also keep XLA's CSE from merging GEMMs), divided by G,
after a GPU warm-up (idle clocks would skew the first rows).
Stages: the production configs use CUTLASS's automatic stage count (as many stages as shared
memory holds after the epilogue's carve-out); the sweep-only kernels `<config>_s<N>` (built for
e4m3 x e4m3 -> bf16, cpp/sm90_fp8_gemm_tensorwise_sweep.cu) pin 2..6 stages, and a few candidate
tiles are built only for the sweep. --configs REGEX restricts the configs, --shapes MxNxK,...
the shapes. Each shape also gets reference rows timed the same way: XLA's FP8 GEMM (fp8 operands
straight into dot_general, which XLA lowers to cuBLASLt) with DEFAULT precision (XLA's fast
accumulation) and HIGHEST (without it). Each config runs under the tile order of its scheduler
that production picks (configs.select_tile_order); --swizzles 1,2,4,8 and --rasters auto,m,n
time those tile orders instead (runtime arguments, same kernels; rows other than the
heuristic's order are named `<config> sw<N> r<raster>`). Writes OUT/sweep_<suite>.json and OUT/sweep_<suite>.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)

import jax_gmma  # noqa: E402
from jax_gmma import _backend  # noqa: E402
from jax_gmma.ops import tensorwise_configs as configs  # noqa: E402
from jax_gmma.numerics import shapes  # noqa: E402
# XLA's FP8 GEMM as bench_fp8.py times it (the reference rows).
from bench_fp8 import warm_gpu, xla_fp8_gemm, xla_fp8_precise_gemm  # noqa: E402

DECODE = [(m, n, k) for (n, k) in [(8192, 8192), (28672, 8192)] for m in (1, 16, 64)]
LARGE = [(8192, 8192, 8192), (4096, 2112, 7168), (4096, 24576, 1536), (4096, 7168, 16384)]


def candidates(m, pattern=None, with_sweep=True):
  out = []
  for c in configs.CONFIGS.values():
    if pattern and not re.search(pattern, c.name):
      continue
    if c.sweep and not with_sweep:  # not built (JAX_GMMA_SWEEP_KERNELS=0)
      continue
    if c.swap_ab and m > c.tile[1]:
      continue
    # Unswapped tiles at M <= 64: production ones from M = 17, and 64-row sweep candidates.
    if not c.swap_ab and (m <= 16 or (m <= 64 and c.sweep and c.tile[0] != 64)):
      continue
    if c.swap_ab and m > 64:
      continue
    if c.stream_k:
      for s in ((0, 1, 2, 3, 4) if c.swap_ab else (0, 1, 2)):
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


def sweep_shape(m, n, k, repeats, sm_count, pattern=None, orders=((None, None),)):
  key = jax.random.PRNGKey(m * 7 + n + k)
  # G GEMMs per call, each with its own weight, so the weights stream from HBM (>= 200 MB per
  # call at every swept shape) and per-call dispatch is amortized: 32 for small M, 8 for large.
  g = 32 if m <= 64 else 8
  # One distinct weight per GEMM: identical (activation, weight) pairs would be merged by XLA's
  # CSE (the first version of this sweep timed 3 distinct GEMMs per 32 that way).
  pool = g
  ka, kw = jax.random.split(key)
  a = (jax.random.normal(ka, (m, k)) * 2).astype(jnp.float8_e4m3fn)
  gen = jax.jit(lambda kk: (jax.random.normal(kk, (n, k)) * 2).astype(jnp.float8_e4m3fn))
  ws = tuple(gen(kk) for kk in jax.random.split(kw, pool))
  sa, sb = jnp.float32(1 / 64), jnp.float32(1 / 64)
  prob = shapes.fp8_gemm_problem((m, k), a.dtype, (n, k), ws[0].dtype)
  pick = configs.select_config(prob, sm_count)
  pick_fast = configs.select_config(prob, sm_count, fast_accum=True)
  rows = []
  # Reference rows, timed the same way: XLA's own FP8 GEMM (fp8 operands straight into
  # dot_general -> cuBLASLt; DEFAULT precision = fast accumulation, HIGHEST = without it).
  for name, gemm in (("xla_fp8 (reference)", xla_fp8_gemm),
                     ("xla_fp8_precise (reference)", xla_fp8_precise_gemm)):
    def fx(a, ws, gemm=gemm):
      return [gemm(a, ws[i % pool], sa, sb) for i in range(g)]
    t = time_fn(jax.jit(fx), (a, ws), repeats) / g
    rows.append(dict(m=m, n=n, k=k, config=name, splits=1, us=t * 1e6,
                     tflops=2 * m * n * k / t / 1e12, weight_gbs=n * k / t / 1e9,
                     pick=False, pick_fast=False, reference=True))
  for cfg, s in candidates(m, pattern, with_sweep=configs.sweep_kernels_built()):
    heuristic = configs.select_tile_order(prob, cfg)
    for order in orders:
      # None = the heuristic's (swizzle, raster), the tile order production runs.
      sw, ro = configs.select_tile_order(prob, cfg, swizzle=order[0], raster=order[1])
      def f(a, ws, cfg=cfg, s=s, sw=sw, ro=ro):
        return [jax_gmma.fp8_gemm(a, ws[i % pool], sa, sb, config=cfg.name, splits=s, swizzle=sw, raster=ro)
                for i in range(g)]
      # The heuristic's tile order keeps the plain config name (rows compare across sweeps).
      default = (sw, ro) == heuristic
      label = cfg.name if default else f"{cfg.name} sw{sw} r{ro}"
      try:
        t = time_fn(jax.jit(f), (a, ws), repeats) / g
      except Exception as e:  # a config that cannot run this shape
        rows.append(dict(m=m, n=n, k=k, config=label, kernel=cfg.name, splits=s, swizzle=sw, raster=ro,
                         error=str(e).splitlines()[0][:120]))
        continue
      rows.append(dict(m=m, n=n, k=k, config=label, kernel=cfg.name, splits=s, swizzle=sw, raster=ro,
                       us=t * 1e6, tflops=2 * m * n * k / t / 1e12, weight_gbs=n * k / t / 1e9,
                       pick=default and (cfg.name, s) == (pick[0].name, pick[1]),
                       pick_fast=default and (cfg.name, s) == (pick_fast[0].name, pick_fast[1])))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--suite", choices=("decode", "large", "all"), default="decode")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--out", default="bench_out")
  p.add_argument("--configs", default=None, help="regex: only configs whose name matches")
  p.add_argument("--shapes", default=None, type=lambda v: [tuple(int(x) for x in t.split("x"))
                                                           for t in v.split(",") if t],
                 help="comma-separated MxNxK shapes instead of the suite's")
  p.add_argument("--swizzles", default=None, type=lambda v: [int(x) for x in v.split(",") if x],
                 help="tile-order swizzles to time per config (comma list of 1, 2, 4, 8; default: the "
                      "heuristic's, configs.select_tile_order)")
  p.add_argument("--rasters", default=None, type=lambda v: [x for x in v.split(",") if x],
                 help="tile-order rasters to time per config (comma list of auto, m, n; default: the "
                      "heuristic's)")
  args = p.parse_args()
  for sw in args.swizzles or ():
    configs.check_tile_order(sw, None)
  for ro in args.rasters or ():
    configs.check_tile_order(None, ro)
  orders = [(sw, ro) for sw in (args.swizzles or [None]) for ro in (args.rasters or [None])]
  dev = jax.devices()[0]
  sm = int(getattr(dev, "core_count", 132))
  shapes_ = args.shapes or {"decode": DECODE, "large": LARGE, "all": DECODE + LARGE}[args.suite]
  rows = []
  lines = [f"# sweep ({args.suite}) on {dev.device_kind}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
           "", "µs per GEMM (median); `x best` = time / best time of the shape; "
           "pick = the heuristic's choice (two-level / fast accumulation).", ""]
  if not configs.sweep_kernels_built():
    note = ("sweep-only kernels (pinned stages, candidate tiles) not built: production configs only; "
            "reinstall with JAX_GMMA_SWEEP_KERNELS=1 for them")
    print(note, flush=True)
    lines += [f"Note: {note}.", ""]
  warm_gpu()
  for m, n, k in shapes_:
    rs = sweep_shape(m, n, k, args.repeats, sm, args.configs, orders)
    rows += rs
    ok = [r for r in rs if "us" in r]
    best = min(ok, key=lambda r: r["us"]) if ok else None
    print(f"\nM={m} N={n} K={k}", flush=True)
    lines += [f"## M={m} N={n} K={k}", "", "| config | stages | splits | µs | TFLOP/s | weight GB/s | x best | pick |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(ok, key=lambda r: r["us"]):
      mark = ("<- pick" if r["pick"] else "") + (" <- pick(fast)" if r["pick_fast"] else "")
      print(f"  {r['config']:44s} splits={r['splits']}  {r['us']:9.2f} us  {r['tflops']:7.1f} TF/s "
            f"{r['weight_gbs']:7.0f} GB/s  {r['us'] / best['us']:.2f}x best {mark}", flush=True)
      st = "—" if r.get("reference") else configs.CONFIGS[r["kernel"]].stages or "auto"
      lines.append(f"| {r['config']} | {st} | {r['splits']} | {r['us']:.2f} | {r['tflops']:.1f} | "
                   f"{r['weight_gbs']:.0f} | {r['us'] / best['us']:.2f} | {mark.replace('<- ', '')} |")
    for r in rs:
      if "error" in r:
        print(f"  {r['config']:44s} splits={r['splits']}  ERROR {r['error']}", flush=True)
        lines.append(f"| {r['config']} | | {r['splits']} | error: {r['error']} | | | | |")
    lines.append("")
    _write(args, dev, rows, lines)  # after every shape: a time limit keeps what was measured


def _write(args, dev, rows, lines):
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, f"sweep_{args.suite}.json"), "w") as f:
    json.dump(dict(device=dev.device_kind, date=time.strftime("%Y-%m-%d"), rows=rows), f, indent=1)
  with open(os.path.join(args.out, f"sweep_{args.suite}.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
