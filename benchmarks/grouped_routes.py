#!/usr/bin/env python3
"""The prefill routes of ``jax_gmma.ragged_dot`` side by side at the rows per expert where they
cross: the measurements behind ``grouped_configs.PREFILL_128_MIN_ROWS`` (the 64-row ping-pong
tiles against the 128-row cooperative tiles, both prefill kinds) and
``grouped_configs.WEIGHTONLY_BF16_MIN_ROWS`` (FP4 / FP6 experts on the grouped weight-only
kernel against the exact bf16 route: one unpack launch, then the grouped bf16 GEMM).

    python3 -P benchmarks/grouped_routes.py [--shapes 32x2048x7168,32x5760x2880]
        [--specs fp8_128x128,mxfp8,wo:mxfp4] [--rows 64,96,128,160,192,256] [--out DIR]
    python3 -P benchmarks/grouped_routes.py --render-only DIR   # DIR/grouped_routes.json -> .md
    python3 -P benchmarks/grouped_routes.py --quick --out DIR   # tiny shapes, CPU plumbing

Per cell (G experts of N x K in format SPEC, every expert ROWS rows, x bf16 quantized on the fly
as ragged_dot does) and route: the threshold forced for the trace, one jitted program of
``--calls`` independent ragged_dot calls, median of ``--repeats`` runs, µs per call. Each route's
output is checked against the first route's (relative Frobenius difference, at most 1e-2: the
routes differ only in rounding) and expert 0's rows against float64 (the bf16 activation and
the dequantized weights; the fp8 formats' own activation rounding within 4e-2). The custom calls
of each route's program are listed. Writes DIR/grouped_routes.json and .md (also printed).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_gmma  # noqa: E402
import moe as moe_example  # noqa: E402
from jax_gmma.ops import grouped, grouped_configs as gc  # noqa: E402
from grouped_stream_configs import finish, median_s, new_run  # noqa: E402

NAME = "grouped_routes"
NEVER = 2 ** 40
#: the routes of each spec kind: name -> the thresholds forced for the trace
ROUTES = {
    "wo": {"weightonly": {"WEIGHTONLY_BF16_MIN_ROWS": NEVER}, "bf16_route": {"WEIGHTONLY_BF16_MIN_ROWS": 0}},
    "quantized": {"tiles_64": {"PREFILL_128_MIN_ROWS": NEVER}, "tiles_128": {"PREFILL_128_MIN_ROWS": 0}},
}
ROUTE_DIFF = 1e-2
TOLERANCE = {"wo": 1e-2, "quantized": 4e-2}


def kind(spec: str) -> str:
  return "wo" if spec.startswith("wo:") else "quantized"


@contextlib.contextmanager
def forced(**thresholds):
  saved = {k: getattr(gc, k) for k in thresholds}
  for k, v in thresholds.items():
    setattr(gc, k, v)
  try:
    yield
  finally:
    for k, v in saved.items():
      setattr(gc, k, v)


def rel(a, b) -> float:
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def bench(args, run):
  for g, n, k in args.shapes:
    master = (jax.random.normal(jax.random.PRNGKey(n + k), (g, n, k), jnp.float32) * 0.05).astype(jnp.bfloat16)
    for spec in args.specs:
      wq = jax.block_until_ready(jax.jit(lambda m: moe_example.quantize_experts(m, spec))(master))
      w0 = np.asarray(jax.jit(lambda w: grouped.dequantized_w(w)[0])(wq), np.float64)
      for rows in args.rows:
        m = rows * g
        x = jax.random.normal(jax.random.PRNGKey(rows), (m, k), jnp.float32).astype(jnp.bfloat16)
        gs = jnp.full((g,), rows, jnp.int32)
        ref64 = np.asarray(x[:rows], np.float64) @ w0.T
        first = None
        for route, thresholds in ROUTES[kind(spec)].items():
          row = dict(g=g, n=n, k=k, spec=spec, rows=rows, route=route)
          try:
            with forced(**thresholds):
              one = jax.jit(lambda x, w, s: jax_gmma.ragged_dot(x, w, s))
              out = np.asarray(one(x, wq, gs)[: min(m, 4 * rows)], np.float64)
              hlo = one.lower(x, wq, gs).as_text()
              calls = jax.jit(lambda x, w, s: jnp.stack(
                  [jax_gmma.ragged_dot(x + i * 1e-3, w, s)[0, 0].astype(jnp.float32) for i in range(args.calls)]))
              s = median_s(calls, (x, wq, gs), args.repeats)
            first = out if first is None else first
            row.update(status="ok", us=s / args.calls * 1e6, rel_vs_first=rel(out, first),
                       rel_err=rel(out[:rows], ref64),
                       calls=sorted(set(re.findall(r"custom_call @(jax_gmma\w+)", hlo))))
            tol = TOLERANCE[kind(spec)]
            if not (row["rel_err"] <= tol and row["rel_vs_first"] <= ROUTE_DIFF):
              run["failures"].append(f"{g}x{n}x{k} {spec} {rows} rows {route}: rel_err {row['rel_err']:.2e}, "
                                     f"vs the first route {row['rel_vs_first']:.2e}")
              row["status"] = "failed"
          except Exception as e:  # noqa: BLE001  (a cell's error is reported, the run goes on)
            row.update(status="error", reason=str(e).splitlines()[0][:300])
          run["rows"].append(row)
          print(json.dumps(row), flush=True)


def picked(spec: str, g: int, rows: int) -> str:
  """The route the library's thresholds take for the cell."""
  if kind(spec) == "wo":
    return "bf16_route" if rows >= gc.WEIGHTONLY_BF16_MIN_ROWS else "weightonly"
  return "tiles_128" if rows >= gc.PREFILL_128_MIN_ROWS else "tiles_64"


def markdown(run) -> str:
  meta = run["meta"]
  out = [f"# Grouped prefill routes at their crossovers ({meta['device']})", "",
         f"- date: {meta['date']}; jax {meta['jax']}, jax-gmma {meta['jax_gmma']}",
         f"- command: `{meta['command']}`",
         f"- every expert the same rows, x bf16; {meta['calls']} independent ragged_dot calls per "
         f"jitted program, median of {meta['repeats']} runs: µs per call; bold: the faster route; "
         "`pick`: the route of the current thresholds (PREFILL_128_MIN_ROWS = "
         f"{gc.PREFILL_128_MIN_ROWS}, WEIGHTONLY_BF16_MIN_ROWS = {gc.WEIGHTONLY_BF16_MIN_ROWS})",
         "- routes: `tiles_64` / `tiles_128` the 64-row ping-pong and 128-row cooperative tiles of the "
         "prefill kind (fp8 block-scaled, or bf16 for mxfp8); `weightonly` the grouped weight-only "
         "kernel, `bf16_route` the unpack kernel + grouped bf16 GEMM (FP4 / FP6 experts)", "",
         "| experts G x N x K | spec | rows per expert | route A µs | route B µs | B / A speed | pick |",
         "|---|---|---|---|---|---|---|"]
  cells = {}
  for r in run["rows"]:
    cells.setdefault((r["g"], r["n"], r["k"], r["spec"], r["rows"]), []).append(r)
  for (g, n, k, spec, rows), rs in cells.items():
    ok = [r for r in rs if r.get("status") == "ok"]
    best = min((r["us"] for r in ok), default=None)
    vals = []
    for r in rs:
      if r.get("status") != "ok":
        vals.append(f"{r['route']}: {r.get('status')}")
      else:
        v = f"{r['route']} {r['us']:.1f}"
        vals.append(f"**{v}**" if r["us"] == best and len(ok) > 1 else v)
    speed = f"{ok[0]['us'] / ok[1]['us']:.2f}x" if len(ok) == 2 else "-"
    out.append(f"| {g} x {n} x {k} | {spec} | {rows} | " + " | ".join(vals[:2]) + f" | {speed} | "
               f"{picked(spec, g, rows)} |")
  if run["failures"]:
    out += ["", "Failures:", ""] + [f"- {f}" for f in run["failures"]]
  return "\n".join(out) + "\n"


def parse_args(argv=None):
  list_of = lambda conv: (lambda s: [conv(v) for v in s.split(",") if v])  # noqa: E731
  shape = lambda s: tuple(int(v) for v in s.split("x"))  # noqa: E731
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--shapes", type=list_of(shape), default=[(32, 2048, 7168), (128, 1536, 2048), (32, 5760, 2880)],
                 help="GxNxK list (default: DeepSeek-V3's, Qwen3-30B-A3B's and gpt-oss-20b's gate/up experts)")
  p.add_argument("--specs", type=list_of(str), default=["fp8_128x128", "mxfp8", "wo:mxfp4", "wo:nvfp4"])
  p.add_argument("--rows", type=list_of(int), default=[64, 96, 128, 160, 192, 256])
  p.add_argument("--calls", type=int, default=4)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--quick", action="store_true", help="one tiny shape, 2 row counts, 1 call, 2 repeats")
  p.add_argument("--out", default=None, help="directory for the JSON and markdown")
  p.add_argument("--render-only", metavar="DIR", help="measure nothing: DIR/grouped_routes.json as markdown")
  a = p.parse_args(argv)
  if a.quick:
    a.shapes, a.rows, a.calls, a.repeats = [(4, 64, 256)], [8, 16], 1, 2
  for s in a.shapes:
    if len(s) != 3:
      p.error(f"--shapes: GxNxK, got {s}")
  return a


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.render_only:
    with open(os.path.join(args.render_only, f"{NAME}.json")) as f:
      run = json.load(f)
    md = markdown(run)
    with open(os.path.join(args.render_only, f"{NAME}.md"), "w") as f:
      f.write(md)
    print(md)
    return 0
  run = new_run(args, argv)
  bench(args, run)
  return finish(run, markdown(run), args.out, NAME)


if __name__ == "__main__":
  sys.exit(main())
