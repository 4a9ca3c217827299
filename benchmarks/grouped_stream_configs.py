#!/usr/bin/env python3
"""The grouped weight-streaming kernels of ``jax_gmma.ragged_dot`` alone, config by config: the
measurements behind ``jax_gmma.ops.grouped_configs.stream_config``.

    python3 -P benchmarks/grouped_stream_configs.py [--presets gpt-oss-20b,deepseek-v3,...]
        [--tokens 1,16,64] [--configs stream_16x8_kw4,...] [--formats fp8_channel,wo:mxfp4]
        [--out DIR]
    python3 -P benchmarks/grouped_stream_configs.py --quick --out DIR   # tiny shapes, CPU plumbing

Per cell (a preset's gate/up or down GEMM, T tokens routed uniformly: each token to local_k
distinct experts of the G on this device, M = T x local_k rows sorted by expert) and config:
one jitted program runs ``--calls`` independent ``jax_gmma.ragged_dot`` calls on the same
weights (x + i * 1e-3, bf16, quantized on the fly as ragged_dot does), median of ``--repeats``
runs, µs per call; TB/s counts the bytes of the experts holding rows, in the format with its
scales. The config is forced by substituting ``grouped_configs.select_config`` for the run;
``wo:`` formats (the weight-only grouped kernel, which picks its CTA shape in C++) run as
"auto". Each cell is checked first: sampled experts' rows against the float64 product of the
bf16 activation and the dequantized weights (the activation's own FP8 rounding is within the
tolerance). Writes DIR/grouped_stream_configs.json and .md (also printed).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma import _backend  # noqa: E402
from jax_gmma.ops import grouped, grouped_configs  # noqa: E402
from bench_fp8 import exit_code, warm_gpu  # noqa: E402
from bench_moe import MODEL_PRESETS, PRESETS  # noqa: E402

NAME = "grouped_stream_configs"
TOLERANCE = {"fp8": 4e-2, "wo": 1e-2}  # FP8 activations round to e4m3; wo: bf16 activations
CHECK_EXPERTS = 3


@contextlib.contextmanager
def forced_config(config):
  """``jax_gmma.ragged_dot`` lowers with ``config`` (None: the library's pick) inside."""
  pick = grouped_configs.select_config
  if config is not None:
    grouped_configs.select_config = lambda problem, sm_count: config
  try:
    yield
  finally:
    grouped_configs.select_config = pick


def route(rng, g: int, tokens: int, k: int) -> np.ndarray:
  """Group sizes (G,) int32: each token to k distinct experts, uniformly."""
  sizes = np.zeros(g, np.int32)
  for _ in range(tokens):
    sizes[rng.choice(g, k, replace=False)] += 1
  return sizes


def prepare(w, fmt: str):
  return jax_gmma.weightonly.prepare(w, fmt[3:]) if fmt.startswith("wo:") else jax_gmma.quantize(w, fmt)


def calls_fn(calls: int):
  return jax.jit(lambda x, w, gs: jnp.stack(
      [jax_gmma.ragged_dot(x + i * 1e-3, w, gs)[0, 0].astype(jnp.float32) for i in range(calls)]))


def median_s(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  jax.block_until_ready(fn(*args))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return float(np.median(ts))


def check(x, wq, sizes, fmt: str) -> float:
  """Relative Frobenius error of ragged_dot on up to CHECK_EXPERTS experts' rows against
  float64 (bf16 x, dequantized weights)."""
  # a fresh function: jit would reuse an executable lowered under another config
  out = np.asarray(jax.jit(lambda *a: jax_gmma.ragged_dot(*a))(x, wq, jnp.asarray(sizes)), np.float64)
  experts = np.flatnonzero(sizes)[:CHECK_EXPERTS]
  # dequantized on the device, only the checked experts brought to the host
  w = np.asarray(jax.jit(lambda w: grouped.dequantized_w(w)[experts])(wq), np.float64)
  xs = np.asarray(x, np.float64)
  end = np.cumsum(sizes)
  num = den = 0.0
  for i, e in enumerate(experts):
    rows = slice(end[e] - sizes[e], end[e])
    ref = xs[rows] @ w[i].T
    num += float(np.sum((out[rows] - ref) ** 2))
    den += float(np.sum(ref ** 2))
  return (num / max(den, 1e-300)) ** 0.5


def bench(args, run):
  rng = np.random.default_rng(args.seed)
  for name in args.presets:
    p = PRESETS[name]
    for gemm, n, k in p.shapes():
      w = (jax.random.normal(jax.random.PRNGKey(n * 7 + k), (p.experts, n, k), jnp.float32)
           * 0.05).astype(jnp.bfloat16)
      weights = {f: prepare(w, f) for f in args.formats}
      for t in args.tokens:
        sizes = route(rng, p.experts, t, p.local_k)
        m = int(sizes.sum())
        x = jax.random.normal(jax.random.PRNGKey(t), (m, k), jnp.float32).astype(jnp.bfloat16)
        active = int((sizes > 0).sum())
        problem = grouped_configs.GroupedProblem(m=m, n=n, k=k, g=p.experts, fmt="fp8_channel")
        pick = grouped_configs.stream_config(problem, run["sm_count"])
        for fmt in args.formats:
          wq = weights[fmt]
          nbytes = active * sum(int(a.nbytes) for a in jax.tree.leaves(wq)) / p.experts
          configs = ["auto"] if fmt.startswith("wo:") else args.configs
          for cfg in configs:
            row = dict(preset=name, gemm=gemm, n=n, k=k, g=p.experts, tokens=t, m=m, active=active,
                       format=fmt, config=cfg, pick=pick, active_bytes=nbytes)
            try:
              with forced_config(None if cfg == "auto" else cfg):
                err = check(x, wq, sizes, fmt)
                tol = TOLERANCE["wo" if fmt.startswith("wo:") else "fp8"]
                row.update(rel_err=err, tol=tol)
                if not err <= tol:
                  run["failures"].append(f"{name} {gemm} T={t} {fmt} {cfg}: rel_err {err:.3e} > {tol}")
                  row["status"] = "failed"
                else:
                  s = median_s(calls_fn(args.calls), (x, wq, jnp.asarray(sizes)), args.repeats)
                  row.update(status="ok", us=s / args.calls * 1e6, tb_s=nbytes / (s / args.calls) / 1e12)
            except Exception as e:  # noqa: BLE001  (a cell's error is reported, the run goes on)
              row.update(status="error", reason=str(e).splitlines()[0][:300])
            run["rows"].append(row)
            print(line(row), flush=True)


def line(r) -> str:
  if r.get("status") != "ok":
    return f"{r['preset']} {r['gemm']} T={r['tokens']} {r['format']} {r['config']}: {r.get('status')} {r.get('reason', '')}"
  return (f"{r['preset']:14s} {r['gemm']:7s} {r['n']:5d}x{r['k']:5d} T={r['tokens']:3d} M={r['m']:4d} "
          f"active={r['active']:3d} {r['format']:12s} {r['config']:17s} {r['us']:9.1f} µs "
          f"{r['tb_s']:5.2f} TB/s rel_err {r['rel_err']:.1e}")


def markdown(run) -> str:
  meta = run["meta"]
  out = [f"# Grouped weight-streaming kernels, config by config ({meta['device']})", "",
         f"- date: {meta['date']}; jax {meta['jax']}, jax-gmma {meta['jax_gmma']}",
         f"- command: `{meta['command']}`",
         f"- {meta['calls']} independent ragged_dot calls per jitted program, median of "
         f"{meta['repeats']} runs: µs per call (TB/s of the active experts' bytes); bold: the "
         "fastest of the row; `pick`: grouped_configs.stream_config's choice", ""]
  rows = run["rows"]
  cols = list(dict.fromkeys(f"{r['format']} {r['config']}" for r in rows))
  out.append("| preset | GEMM (N x K) | tokens | rows / active experts | pick | " + " | ".join(cols) + " |")
  out.append("|---|---|---|---|---|" + "---|" * len(cols))
  cells = {}
  for r in rows:
    cells.setdefault((r["preset"], r["gemm"], r["tokens"]), {})[f"{r['format']} {r['config']}"] = r
  for (preset, gemm, t), cs in cells.items():
    r0 = next(iter(cs.values()))
    ok = [c for c in cs.values() if c.get("status") == "ok" and not c["format"].startswith("wo:")]
    best = min((c["us"] for c in ok), default=None)
    vals = []
    for c in cols:
      r = cs.get(c)
      if r is None:
        vals.append("")
      elif r.get("status") != "ok":
        vals.append(r.get("status", "?"))
      else:
        v = f"{r['us']:.1f} ({r['tb_s']:.2f})"
        vals.append(f"**{v}**" if r["us"] == best else v)
    out.append(f"| {preset} | {gemm} ({r0['n']} x {r0['k']}) | {t} | {r0['m']} / {r0['active']} | "
               f"{r0['pick']} | " + " | ".join(vals) + " |")
  if run["failures"]:
    out += ["", "Failures:", ""] + [f"- {f}" for f in run["failures"]]
  return "\n".join(out) + "\n"


def parse_args(argv=None):
  list_of = lambda conv: (lambda s: [conv(v) for v in s.split(",") if v])  # noqa: E731
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--presets", type=list_of(str), default=list(MODEL_PRESETS))
  p.add_argument("--tokens", type=list_of(int), default=[1, 16, 64])
  p.add_argument("--configs", type=list_of(str), default=list(grouped_configs.CONFIGS))
  p.add_argument("--formats", type=list_of(str), default=["fp8_channel", "wo:mxfp4"])
  p.add_argument("--calls", type=int, default=16)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--quick", action="store_true", help="the tiny preset at 4 tokens, 2 calls, 2 repeats")
  p.add_argument("--out", default=None, help="directory for the JSON and markdown")
  a = p.parse_args(argv)
  if a.quick:
    a.presets, a.tokens, a.calls, a.repeats = ["tiny"], [4], 2, 2
  for name in a.presets:
    if name not in PRESETS:
      p.error(f"--presets: unknown preset {name!r} (known: {', '.join(PRESETS)})")
  for c in a.configs:
    if c not in grouped_configs.CONFIGS:
      p.error(f"--configs: unknown config {c!r} (known: {', '.join(grouped_configs.CONFIGS)})")
  return a


def new_run(args, argv) -> dict:
  """A run's record (rows, failures, metadata with the command line), the GPU warmed, or on a
  CPU the reference path allowed (plumbing only)."""
  on_gpu = bool(_backend.cuda_devices())
  if not on_gpu:
    jax_gmma.set_allow_reference(True)
  dev = jax.devices()[0]
  run = {"rows": [], "failures": [], "sm_count": int(getattr(dev, "core_count", 132) or 132),
         "meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "device": getattr(dev, "device_kind", str(dev)), "backend": jax.default_backend(),
                  "jax": jax.__version__, "jax_gmma": jax_gmma.__version__, "calls": args.calls,
                  "repeats": args.repeats, "command": "python3 -P " + " ".join(
                      [os.path.relpath(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv)))}}
  if on_gpu:
    warm_gpu()
  return run


def finish(run, md: str, out, name: str) -> int:
  """Prints the markdown, writes OUT/NAME.json and .md (when OUT), returns the exit status."""
  print("\n" + md)
  if out:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
      json.dump({k: run[k] for k in ("meta", "rows", "failures")}, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
      f.write(md)
  return exit_code(run["failures"])


def main(argv=None) -> int:
  args = parse_args(argv)
  run = new_run(args, argv)
  bench(args, run)
  return finish(run, markdown(run), args.out, NAME)


if __name__ == "__main__":
  sys.exit(main())
