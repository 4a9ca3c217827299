#!/usr/bin/env python3
"""FP8 training benchmark: one linear layer's forward + backward (y, dx, dw) per step.

    python3 -P benchmarks/bench_train.py [--shapes MxNxK,...] [--out DIR]

Implementations (same process, timed in interleaved rounds; bf16 x and w in, bf16 y / dx / dw
out, the output gradient g given):
  ours_fp8   jax.vjp of jax_gmma.fp8_linear: per-tensor current scaling, e4m3 x / w, e5m2 g,
             three jax-gmma FP8 GEMMs (forward tensor-core accumulation, dgrad / wgrad
             promoted every 128 of K: TransformerEngine's defaults).
  xla_fp8    the same recipe and the same quantization code, the three GEMMs as fp8 operands
             straight into lax.dot_general (XLA's cuBLASLt FP8 GEMM; precision DEFAULT = fast
             accumulation for the forward, HIGHEST for dgrad / wgrad).
  ours_fp8_blockwise  fp8_linear(recipe="blockwise"): DeepSeek-V3's recipe, e4m3 everywhere, 1x128
             activation / gradient blocks, 128x128 weight blocks, on jax-gmma's block-scaled
             kernels (no XLA peer: XLA has no block-scaled FP8 GEMM).
  ours_fp8_fastbwd  (diagnostic, not in the default list) ours with tensor-core-only accumulation
             in dgrad / wgrad too (fast_accum_bwd=True): what the two-level backward costs.
  bf16       jax.vjp of x @ w.T in bf16 (XLA's bf16 GEMMs, float32 accumulation).

Each step is one jitted call (y, dx, dw) = step(x, w, g); two input sets alternate (each
larger than the 60 MB L2). rel_err columns: each output against a float32 (HIGHEST) product of
the bf16 inputs, on the GPU: the cost of the FP8 recipe itself (e5m2 gradients ~2^-3 per
element). Writes DIR/bench_train.json and DIR/bench_train.md after every shape.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
  sys.path.insert(0, _HERE)

from bench_fp8 import BF16, F32, TN, compile_jax, md_tail, time_rounds  # noqa: E402

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma.train import _quant as _q  # the recipe's own quantization  # noqa: E402

SHAPES = ((8192, 8192, 8192), (8192, 28672, 8192), (8192, 8192, 28672), (4096, 4096, 4096))
IMPLS = ("ours_fp8", "ours_fp8_blockwise", "xla_fp8", "bf16")
HIGHEST = lax.Precision.HIGHEST


def _xla_mm(a, b, sa, sb, precision, out_dtype):
  acc = lax.dot_general(a, b, TN, precision=precision, preferred_element_type=BF16)
  return (acc.astype(F32) * (sa * sb)).astype(out_dtype)


@jax.custom_vjp
def xla_fp8_linear(x, w):
  return _xla_fwd(x, w)[0]


def _xla_fwd(x, w):
  x8, sx = _q(x, jnp.float8_e4m3fn)
  w8, sw = _q(w, jnp.float8_e4m3fn)
  return _xla_mm(x8, w8, sx, sw, None, x.dtype), (x8, sx, w8, sw)


def _xla_bwd(res, g):
  x8, sx, w8, sw = res
  g8, sg = _q(g, jnp.float8_e5m2)
  dx = _xla_mm(g8, w8.T, sg, sw, HIGHEST, BF16)
  dw = _xla_mm(g8.T, x8.T, sg, sx, HIGHEST, BF16)
  return dx, dw


xla_fp8_linear.defvjp(_xla_fwd, _xla_bwd)

LINEARS = {
    "ours_fp8": jax_gmma.fp8_linear,
    "xla_fp8": xla_fp8_linear,
    "ours_fp8_blockwise": functools.partial(jax_gmma.fp8_linear, recipe="blockwise"),
    "ours_fp8_fastbwd": functools.partial(jax_gmma.fp8_linear, fast_accum_bwd=True),
    "bf16": lambda x, w: jnp.dot(x, w.T),
}


def step(lin, x, w, g):
  y, vjp = jax.vjp(lin, x, w)
  dx, dw = vjp(g)
  return y, dx, dw


def reference(x, w, g):
  f = functools.partial(jnp.dot, precision=HIGHEST, preferred_element_type=F32)
  x, w, g = x.astype(F32), w.astype(F32), g.astype(F32)
  return f(x, w.T), f(g, w), f(g.T, x)


def rel(a, b):
  a = a.astype(F32)
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def write(rows, failures, notes, args, dev, final=False):
  """Ratios, then the JSON and markdown (after every shape, so a cut-short run keeps its rows)."""
  by = {(r["m"], r["n"], r["k"], r["impl"]): r for r in rows}
  for r in rows:
    for peer in ("xla_fp8", "bf16"):
      q = by.get((r["m"], r["n"], r["k"], peer))
      if q:
        r[f"vs_{peer}"] = q["us"] / r["us"]
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              device=str(getattr(dev, "device_kind", dev)), jax=jax.__version__,
              jax_gmma=jax_gmma.__version__, rounds=args.rounds, repeats=args.repeats)
  L = [f"# FP8 training step (forward + dgrad + wgrad), {meta['device']}, {meta['date']}", "",
       "µs per step (median of pooled interleaved rounds); ratio = peer time / ours (> 1: ours faster).",
       "", "| M x N x K | impl | µs/step | TFLOP/s | vs xla_fp8 | vs bf16 | rel_err y / dx / dw |",
       "|---|---|---|---|---|---|---|"]
  for r in rows:
    L.append(f"| {r['m']}x{r['n']}x{r['k']} | {r['impl']} | {r['us']:.1f} | {r['tflops']:.0f} | "
             f"{r.get('vs_xla_fp8', float('nan')):.3f} | {r.get('vs_bf16', float('nan')):.3f} | "
             f"{r['rel_err_y']:.1e} / {r['rel_err_dx']:.1e} / {r['rel_err_dw']:.1e} |")
  L += [""] + md_tail(notes, failures)
  if final:
    print("\n".join(L))
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_train.json"), "w") as f:
      json.dump(dict(meta=meta, rows=rows, failures=failures), f, indent=1)
    with open(os.path.join(args.out, "bench_train.md"), "w") as f:
      f.write("\n".join(L) + "\n")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                 help="MxNxK,...: M tokens, N outputs, K inputs")
  p.add_argument("--impls", default=",".join(IMPLS))
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--target-s", type=float, default=0.2)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
  impls = [i for i in args.impls.split(",") if i]
  dev = jax.devices()[0]
  rows, failures, notes = [], [], []
  key = jax.random.PRNGKey(0)
  for m, n, k in shapes:
    sets = []
    for _ in range(2):
      key, k1, k2, k3 = jax.random.split(key, 4)
      sets.append((jax.random.normal(k1, (m, k), F32).astype(BF16),
                   (jax.random.normal(k2, (n, k), F32) / k ** 0.5).astype(BF16),
                   jax.random.normal(k3, (m, n), F32).astype(BF16)))
    ref = reference(*sets[0])
    fns, errs, targets = {}, {}, {}
    for impl in impls:
      try:
        t0 = time.perf_counter()
        fn, tg = compile_jax(functools.partial(step, LINEARS[impl]), sets[0])
        out = fn(*sets[0])
        errs[impl] = [rel(o, r) for o, r in zip(out, ref)]
        fns[impl], targets[impl] = fn, tg
        print(f"  {m}x{n}x{k} {impl}: compiled and checked in {time.perf_counter() - t0:.1f} s",
              flush=True)
      except Exception as e:  # noqa: BLE001
        failures.append(f"{impl} {m}x{n}x{k}: {type(e).__name__}: {str(e)[:300]}")
    del ref
    st = time_rounds(fns, sets, args.repeats, args.target_s, args.rounds,
                     on_error=lambda name, e: failures.append(f"{name} {m}x{n}x{k}: {e}"))
    flops = 3 * 2 * m * n * k
    for impl, s in st.items():
      rows.append(dict(m=m, n=n, k=k, impl=impl, us=s["median_us"], min_us=s["min_us"],
                       max_us=s["max_us"], tflops=flops / s["median_us"] / 1e6,
                       rel_err_y=errs[impl][0], rel_err_dx=errs[impl][1], rel_err_dw=errs[impl][2],
                       targets=targets[impl], rounds=s["rounds"], repeats=s["repeats"]))
      print(f"{m}x{n}x{k} {impl:9s} {s['median_us']:9.1f} us/step {rows[-1]['tflops']:7.1f} TF/s "
            f"rel_err y/dx/dw {errs[impl][0]:.2e}/{errs[impl][1]:.2e}/{errs[impl][2]:.2e}",
            flush=True)
    write(rows, failures, notes, args, dev)
  write(rows, failures, notes, args, dev, final=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
