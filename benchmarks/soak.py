#!/usr/bin/env python3
"""Soak, determinism and concurrency check of jax-gmma's GEMM families and quantize.

    python3 -P benchmarks/soak.py [--calls 100000] [--chunk 1000] [--families a,b] [--quick] [--out DIR]

For each family, one jitted program runs a chunk of --chunk dependent calls (``lax.fori_loop``;
each call's output is fed back into the next call's input, so XLA can neither hoist nor merge
them), always from the same input; the program runs --calls / --chunk times. XLA's default flags
(command buffers on). Checks, each a column of the table:

  identical   every chunk's output is bit-identical to the first chunk's;
  recompiled  the same program, traced and compiled again, gives bit-identical output;
  memory      device bytes in use after the last chunk within 1 MiB of after the first, and the
              peak unchanged (``jax.devices()[0].memory_stats()``; "n/a" where the backend
              reports none, e.g. CPU);
  threads     two Python threads tracing, compiling and running different families at once
              (each thread half of the families) give bit-identical results to the single-thread
              run.

Families: fp8_channel (M=128), fp8_decode_m1 / fp8_decode_m16, fp8_tensor (per-tensor weight and
activation), fp8_splitk (split-K, 3 splits, forced config), fp8_streamk (stream-K, forced
config), fp8_128x128, mxfp8, nvfp4 / mxfp4 / mxfp6_e2m3 / mxfp6_e3m2 (weight-only PackedWeight,
decode M=16), mxfp4_prefill (M=256), quantize (fp8_1x128 and mxfp8). On CPU (the reference) the
shapes are the --quick ones.

Writes DIR/soak.json (every row, the memory series, run metadata), DIR/soak.md (the table) and
DIR/soak.png (device memory over calls per family). Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_gmma

SW = "sm100_128x4"
ALL = ("fp8_channel", "fp8_decode_m1", "fp8_decode_m16", "fp8_tensor", "fp8_splitk", "fp8_streamk",
       "fp8_128x128", "mxfp8", "nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_prefill",
       "quantize")
MEM_SLACK = 1 << 20  # bytes


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--calls", type=int, default=None,
                 help="calls per family (default 100000; 2000 with --quick)")
  p.add_argument("--chunk", type=int, default=1000,
                 help="calls per jitted program (default 1000; at most a quarter of --calls)")
  p.add_argument("--families", default="", type=lambda v: [c for c in v.split(",") if c],
                 help=f"comma list (default all): {','.join(ALL)}")
  p.add_argument("--quick", action="store_true", help="small shapes, 2000 calls by default")
  p.add_argument("--out", default="bench_out", help="output directory (default bench_out/)")
  p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
  p.add_argument("--no-threads", action="store_true", help="skip the two-thread check")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  bad = [f for f in args.families if f not in ALL]
  if bad:
    p.error(f"unknown families {bad}; choose from {','.join(ALL)}")
  if args.calls is None:
    args.calls = 2000 if args.quick else 100000
  if args.calls < 1 or args.chunk < 1:
    p.error("--calls and --chunk must be positive")
  args.families = args.families or list(ALL)
  return args


# -- the families -------------------------------------------------------------------------------

def _feedback(y, x0):
  """The next call's input from this call's output (every family's output has x0's shape, N = K):
  bounded, and never the same as x0, so no two calls can be merged."""
  y = y.astype(jnp.float32).reshape(x0.shape)
  return (jnp.tanh(y / math.sqrt(x0.shape[-1])) + x0.astype(jnp.float32)).astype(x0.dtype)


def build(name, quick, seed):
  """(description, step(x, consts) -> output, x0, consts) of a family."""
  rng = np.random.default_rng(seed + sum(map(ord, name)))
  n = k = 256 if quick else 2048

  def arr(shape, dtype=jnp.bfloat16, scale=1.0):
    return jnp.asarray((rng.standard_normal(shape) * scale).astype(np.float32), dtype)

  w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
  dot = jax_gmma.dot
  if name in ("fp8_channel", "fp8_decode_m1", "fp8_decode_m16", "fp8_splitk", "fp8_streamk"):
    m = {"fp8_channel": 128, "fp8_decode_m1": 1, "fp8_decode_m16": 16, "fp8_splitk": 16,
         "fp8_streamk": 256}[name]
    kw = {"fp8_splitk": dict(config="swap_128x16x128_coop_streamk_2lvl", splits=3),
          "fp8_streamk": dict(config="128x128x128_c1x1_coop_streamk_2lvl", splits=0)}.get(name, {})
    wq = jax_gmma.quantize(w, "fp8_channel")
    return (f"dot fp8_channel {m}x{n}x{k} {kw or ''}".strip(),
            lambda x, c: dot(x, c, **kw), arr((m, k)), wq)
  if name == "fp8_tensor":
    return (f"dot fp8_tensor (x_format fp8_tensor) 64x{n}x{k}",
            lambda x, c: dot(x, c, x_format="fp8_tensor"), arr((64, k)), jax_gmma.quantize(w, "fp8_tensor"))
  if name == "fp8_128x128":
    return (f"dot fp8_128x128 128x{n}x{k}", lambda x, c: dot(x, c), arr((128, k)),
            jax_gmma.quantize(w, "fp8_128x128"))
  if name == "mxfp8":
    return (f"dot mxfp8 32x{n}x{k}", lambda x, c: dot(x, c), arr((32, k)),
            jax_gmma.quantize(w, "mxfp8", layout=SW))
  if name in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4_prefill"):
    fmt, m = (("mxfp4", 256) if name == "mxfp4_prefill" else (name, 16))
    return (f"dot PackedWeight {fmt} {m}x{n}x{k}", lambda x, c: dot(x, c), arr((m, k)),
            jax_gmma.weightonly.prepare(w, fmt))
  if name == "quantize":
    def step(x, c):
      a = jax_gmma.dequantize(jax_gmma.quantize(x, "fp8_1x128"))
      b = jax_gmma.dequantize(jax_gmma.quantize(x, "mxfp8", layout=SW))
      return a * 0.75 + b * 0.5
    return (f"quantize fp8_1x128 + mxfp8 (layout {SW}) {512 if not quick else 64}x{k}", step,
            arr((512 if not quick else 64, k), jnp.float32), None)
  raise ValueError(name)


def chunk_fn(step, chunk):
  """A fresh jitted program: `chunk` dependent calls of step from x0; returns the last output."""
  def run(x0, consts):
    y0 = step(x0, consts)

    def body(_, carry):
      _, y = carry
      x = _feedback(y, x0)
      return x, step(x, consts)

    return lax.fori_loop(1, chunk, body, (x0, y0))[1]
  return jax.jit(run)


def _bits(a):
  a = np.asarray(a)
  return a.view(np.uint8).tobytes()


def _mem():
  try:
    s = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001 (a backend without stats)
    s = None
  if not s:
    return None, None
  return int(s.get("bytes_in_use", 0)), int(s.get("peak_bytes_in_use", 0))


# -- the soak -----------------------------------------------------------------------------------

def soak(name, args, chunk, log):
  desc, step, x0, consts = build(name, args.quick, args.seed)
  nchunks = max(1, math.ceil(args.calls / chunk))
  row = dict(family=name, what=desc, calls=nchunks * chunk, chunk=chunk, chunks=nchunks)
  mem0, peak0 = _mem()
  f = chunk_fn(step, chunk)
  t = time.perf_counter()
  first = f(x0, consts)
  first.block_until_ready()
  row["compile_first_s"] = round(time.perf_counter() - t, 3)
  first_bits = _bits(first)
  series = [(chunk, _mem()[0])]
  mem1, peak1 = _mem()
  mismatched = []
  t = time.perf_counter()
  for i in range(1, nchunks):
    out = f(x0, consts)
    if _bits(out) != first_bits:
      mismatched.append(i)
    del out
    series.append(((i + 1) * chunk, _mem()[0]))
  run_s = time.perf_counter() - t
  row["run_s"] = round(run_s, 3)
  row["us_per_call"] = round(1e6 * run_s / max(1, (nchunks - 1) * chunk), 3) if nchunks > 1 else None
  mem2, peak2 = _mem()
  row.update(mem_before=mem0, mem_after_first=mem1, mem_end=mem2, peak_after_first=peak1, peak_end=peak2)
  row["identical"] = not mismatched
  row["mismatched_chunks"] = mismatched[:20]
  again = chunk_fn(step, chunk)(x0, consts)  # a new function: traced and compiled again
  row["recompiled"] = _bits(again) == first_bits
  if mem1 is None:
    row["memory"] = "n/a"
  else:
    row["memory"] = "flat" if (mem2 - mem1 <= MEM_SLACK and peak2 <= peak1 + MEM_SLACK) else "GREW"
  row["finite"] = bool(np.isfinite(np.asarray(first, np.float32)).all())
  log(f"{name:15s} {row['calls']} calls in {nchunks} chunks: identical={row['identical']} "
      f"recompiled={row['recompiled']} memory={row['memory']} ({row['run_s']} s)")
  return row, series, first_bits, (step, x0, consts)


def two_threads(progs, chunk, expected, log):
  """Each thread: its half of the families, each traced and compiled anew, run twice."""
  names = sorted(progs)
  # Half of the families each; a single family runs in both threads.
  halves = [names[0::2], names[1::2]] if len(names) > 1 else [names, names]
  errors, done = [], {}
  barrier = threading.Barrier(2)

  def worker(mine):
    try:
      barrier.wait()
      for name in mine:
        step, x0, consts = progs[name]
        f = chunk_fn(step, chunk)
        for _ in range(2):
          if _bits(f(x0, consts)) != expected[name]:
            errors.append(f"{name}: differs from the single-thread result")
        done[name] = True
    except Exception as e:  # noqa: BLE001 (reported)
      errors.append(f"{mine}: {type(e).__name__}: {e}")

  t = time.perf_counter()
  threads = [threading.Thread(target=worker, args=(h,)) for h in halves]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  res = dict(threads=len(threads), halves=halves, ok=not errors and len(done) == len(names),
             errors=errors, wall_s=round(time.perf_counter() - t, 3))
  log(f"two threads {halves}: {'ok' if res['ok'] else 'FAILED ' + '; '.join(errors)}")
  return res


def markdown(meta, rows, thr, failures):
  L = [f"# Soak: {meta['calls']} calls per family, chunks of {meta['chunk']}", "",
       f"{meta['device_kind']} ({meta['backend']}), jax {meta['jax']}, jax-gmma {meta['jax_gmma']}, "
       f"{meta['date']}, XLA_FLAGS={meta['xla_flags'] or '(default)'}", "",
       "| family | what | calls | compile+first (s) | µs / call | identical | recompiled | memory "
       "| bytes in use (first -> end) | peak (first -> end) |",
       "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    mem = "n/a" if r["mem_after_first"] is None else f"{r['mem_after_first']} -> {r['mem_end']}"
    peak = "n/a" if r["peak_after_first"] is None else f"{r['peak_after_first']} -> {r['peak_end']}"
    L.append(f"| {r['family']} | {r['what']} | {r['calls']} | {r['compile_first_s']} | "
             f"{r['us_per_call'] if r['us_per_call'] is not None else 'n/a'} | "
             f"{'yes' if r['identical'] else '**NO**'} | {'yes' if r['recompiled'] else '**NO**'} | "
             f"{r['memory'] if r['memory'] != 'GREW' else '**GREW**'} | {mem} | {peak} |")
  L.append("")
  if thr is not None:
    L += [f"Two threads ({' / '.join(','.join(h) for h in thr['halves'])}), each tracing, compiling "
          f"and running its families at once: {'bit-identical to one thread' if thr['ok'] else '**FAILED**'} "
          f"({thr['wall_s']} s).", ""]
  if failures:
    L += ["**FAILURES:**", ""] + [f"- {f}" for f in failures] + [""]
  return "\n".join(L)


def plot(path, rows, series):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except Exception as e:  # noqa: BLE001
    return f"plot skipped (matplotlib not importable: {type(e).__name__})"
  fig, ax = plt.subplots(figsize=(9, 5))
  drawn = False
  for r in rows:
    pts = [(c, m) for c, m in series[r["family"]] if m is not None]
    if pts:
      ax.plot([c for c, _ in pts], [m / 2**20 for _, m in pts], label=r["family"], marker=".")
      drawn = True
  ax.set_xlabel("calls")
  ax.set_ylabel("device bytes in use (MiB)")
  ax.set_title("jax-gmma soak: device memory over calls")
  if drawn:
    ax.legend(fontsize=7, ncol=2)
  else:
    ax.text(0.5, 0.5, "no memory statistics on this backend", ha="center", va="center",
            transform=ax.transAxes)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return None


def main(argv=None) -> int:
  args = parse_args(argv)
  dev = jax.devices()[0]
  on_gpu = dev.platform == "gpu"
  if not on_gpu:
    args.quick = True  # the reference on CPU: small shapes
  chunk = min(args.chunk, max(1, args.calls // 4))
  lines = []

  def log(s):
    print(s, flush=True)
    lines.append(s)

  t0 = time.perf_counter()
  rows, series, expected, progs, failures = [], {}, {}, {}, []
  for name in args.families:
    try:
      row, ser, bits, prog = soak(name, args, chunk, log)
    except Exception as e:  # noqa: BLE001 (reported as a failure, the others still run)
      failures.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
      log(f"{name}: ERROR {type(e).__name__}: {e}")
      continue
    rows.append(row)
    series[name] = ser
    expected[name] = bits
    progs[name] = prog
    for check in ("identical", "recompiled", "finite"):
      if not row[check]:
        failures.append(f"{name}: {check} check failed")
    if row["memory"] == "GREW":
      failures.append(f"{name}: device memory grew: {row['mem_after_first']} -> {row['mem_end']} bytes "
                      f"in use, peak {row['peak_after_first']} -> {row['peak_end']}")
  thr = None
  if not args.no_threads and len(progs) >= 1:
    thr = two_threads(progs, chunk, expected, log)
    if not thr["ok"]:
      failures.append("two threads: " + "; ".join(thr["errors"] or ["not every family ran"]))
  import jaxlib
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              suite="soak", argv=sys.argv, backend=dev.platform, device_kind=dev.device_kind,
              python=platform.python_version(), jax=jax.__version__, jaxlib=jaxlib.__version__,
              jax_gmma=jax_gmma.__version__, numpy=np.__version__,
              xla_flags=os.environ.get("XLA_FLAGS", ""), calls=rows[0]["calls"] if rows else args.calls,
              chunk=chunk, quick=args.quick, families=args.families, seed=args.seed,
              mem_slack_bytes=MEM_SLACK, wall_s=round(time.perf_counter() - t0, 1))
  os.makedirs(args.out, exist_ok=True)
  png = os.path.join(args.out, "soak.png")
  notes = []
  if not args.no_plot:
    why = plot(png, rows, series)
    if why:
      notes.append(why)
  md = markdown(meta, rows, thr, failures)
  with open(os.path.join(args.out, "soak.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows, memory_series=series, threads=thr, notes=notes,
                   failures=failures, log=lines), f, indent=1, default=str)
  with open(os.path.join(args.out, "soak.md"), "w") as f:
    f.write(md + "\n")
  print()
  print(md)
  print(f"wrote {args.out}/soak.json, soak.md{'' if args.no_plot or not os.path.exists(png) else ', soak.png'}"
        f" ({meta['wall_s']} s)")
  if failures:
    print(f"\n{len(failures)} FAILURE(S):", file=sys.stderr)
    for f in failures:
      print(f"  - {f}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
