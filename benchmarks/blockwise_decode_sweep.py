#!/usr/bin/env python3
"""Decode sweep of the block-scaled FP8 family (fp8_128x128 weights, 1x128 activations) as a
decode step runs it: ``jax_gmma.dot`` on a bfloat16 activation, chains of dependent GEMMs in one
jitted program, against fp8_channel weights, XLA's FP8 dot and bf16.

  python3 -P benchmarks/blockwise_decode_sweep.py [--out DIR] [--nk 4096x4096,...] [--ms 1,8,16,32,64]
  python3 benchmarks/blockwise_decode_sweep.py --report DIR   # re-render DIR's JSON as md + PNG

Per (M, N, K): CHAIN (16) GEMMs in one jitted function, each step's bf16 output (sliced or tiled to
K, times 1.01) the next step's activation, distinct weights cycled (>= 600 MB of FP8 weights per
chain where the shape allows, so weights come from HBM, not the 60 MB L2); µs per GEMM = median
chain time / CHAIN over 2 interleaved rounds of 5 samples (bench_fp8.time_rounds). Rows:

  ours            jax_gmma.dot(x, quantize(w, "fp8_128x128")) as the library picks it (activation
                  quantization and kernel config); timed under the config the heuristic picks
  bw[CONFIG]_xq   the same with the kernel config forced, the activation quantized by XLA ops
                  (fused into the producer; blockwise.XLA_QUANTIZE_MAX_M)
  bw[CONFIG]_kq   ... quantized by the quantize kernel instead
  channel         jax_gmma.dot(x, quantize(w, "fp8_channel")) (per-token x, per-channel w)
  xla_fp8         x quantized per token in jnp, fp8 operands straight into lax.dot_general
                  (cuBLASLt FP8 GEMM on Hopper), scales multiplied after
  bf16            lax.dot_general on bf16 operands

Writes DIR/blockwise_decode_sweep.json (every measurement), .md (the table) and .png (ours and the
peers relative to XLA's FP8 per shape and M; needs matplotlib).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)

import jax_gmma  # noqa: E402
from jax_gmma.numerics import shapes  # noqa: E402
from jax_gmma.ops import blockwise, blockwise_configs as bc  # noqa: E402
from bench_fp8 import time_rounds, warm_gpu  # noqa: E402

F8, BF, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
NT = (((1,), (1,)), ((), ()))
CHAIN = 16
NAME = "blockwise_decode_sweep"
DEFAULT_NK = "4096x4096,6144x4096,28672x4096,4096x14336,8192x8192"
DEFAULT_MS = "1,8,16,32,64"
PEERS = ("channel", "xla_fp8", "bf16")


def next_x(out, k):
  n = out.shape[1]
  if n < k:
    out = jnp.concatenate([out] * math.ceil(k / n), axis=1)
  return out[:, :k]


def chain_of(step, k):
  def f(x, ws):
    out = None
    for i in range(CHAIN):
      out = step(x, ws[i % len(ws)])
      x = next_x(out, k) * 1.01
    return out
  return f


def xla_fp8(x, w):
  wq, ws = w
  xf = x.astype(F32)
  sx = jnp.maximum(jnp.max(jnp.abs(xf), axis=1, keepdims=True) / 448.0, np.finfo(np.float32).tiny)
  y = lax.dot_general((xf / sx).astype(F8), wq, NT, preferred_element_type=BF)
  return (y.astype(F32) * sx * ws[None, :]).astype(BF)


def _bw(config, xla_quantize):
  """jax_gmma.dot on fp8_128x128 weights with the kernel config forced (None: the heuristic's)
  and the activation quantized by XLA ops or by the quantize kernel."""
  def step(x, w):
    old = blockwise.XLA_QUANTIZE_MAX_M
    blockwise.XLA_QUANTIZE_MAX_M = 1 << 30 if xla_quantize else 0
    try:
      return jax_gmma.dot(x, w, config=config)
    finally:
      blockwise.XLA_QUANTIZE_MAX_M = old
  return step


def _candidates(m):
  tn = 16 if m <= 16 else 32 if m <= 32 else 64
  wgmma = f"swap_128x{tn}x128_coop_streamk"
  if m <= 8:
    streams = ["stream_16x8_kw4", "stream_16x8_kw8", "stream_16x8_kw16", "stream_16x16_kw4",
               "stream_16x16_kw8"]
  else:
    streams = ["stream_16x16_kw4", "stream_16x16_kw8", "stream_16x8_kw8"]
  return wgmma, streams


def measure(nk, ms, log):
  rows = []
  warm_gpu(1.0)
  key = jax.random.PRNGKey(0)
  for n, k in nk:
    d = max(1, min(CHAIN, math.ceil(600e6 / (n * k))))
    wb, w128, wch, wx = [], [], [], []
    for _ in range(d):
      key, sk = jax.random.split(key)
      w = (jax.random.normal(sk, (n, k), F32) / math.sqrt(k)).astype(BF)
      wb.append(w)
      w128.append(jax_gmma.quantize(w, "fp8_128x128"))
      q = jax_gmma.quantize(w, "fp8_channel")
      wch.append(q)
      wx.append((q.data, q.scales.reshape(-1)))
    for m in ms:
      key, sk = jax.random.split(key)
      x = jax.random.normal(sk, (m, k), F32).astype(BF)
      wgmma, streams = _candidates(m)
      fns = {f"bw[{wgmma}]_xq": (_bw(wgmma, True), w128), f"bw[{wgmma}]_kq": (_bw(wgmma, False), w128)}
      for s in streams:
        fns[f"bw[{s}]_xq"] = (_bw(s, True), w128)
      fns["channel"] = (lambda x, w: jax_gmma.dot(x, w), wch)
      fns["xla_fp8"] = (xla_fp8, wx)
      fns["bf16"] = (lambda x, w: lax.dot_general(x, w, NT, preferred_element_type=BF), wb)
      compiled, errs = {}, {}
      ref = np.asarray(_bw(wgmma, True)(x, w128[0]).astype(F32))
      for name, (step, ws) in fns.items():
        compiled[name] = (jax.jit(chain_of(step, k)).lower(x, tuple(ws)).compile(), tuple(ws))
        if name.startswith("bw"):
          o = np.asarray(jax.jit(step)(x, w128[0]).astype(F32))
          errs[name] = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
      stats = time_rounds({nm: (lambda c=c, ws=ws: c(x, ws)) for nm, (c, ws) in compiled.items()},
                          [()], 5, 0.02, 2)
      prob = shapes.BlockwiseProblem(m=m, n=n, k=k, batch_shape=(), a_dtype=np.dtype(F8),
                                     b_dtype=np.dtype(F8), out_dtype=np.dtype(BF), variant="1d2d",
                                     has_bias=False)
      row = dict(m=m, n=n, k=k, chain=CHAIN, distinct_weights=d,
                 pick=bc.select_blockwise_config(prob, jax.devices()[0].core_count)[0].name,
                 us={nm: st["median_us"] / CHAIN for nm, st in stats.items()},
                 rel_diff=errs)
      rows.append(row)
      log(f"{m:4d} x {n} x {k}: " + ", ".join(f"{nm} {v:.1f}" for nm, v in row["us"].items()))
    del wb, w128, wch, wx
  return rows


def ours_us(row):
  """µs of the library's choice: the heuristic's config with XLA-fused activation quantization
  (blockwise.dot quantizes M <= XLA_QUANTIZE_MAX_M rows with XLA ops, more with the kernel)."""
  q = "xq" if row["m"] <= blockwise.XLA_QUANTIZE_MAX_M else "kq"
  return row["us"].get(f"bw[{row['pick']}]_{q}")


def markdown(meta, rows):
  out = ["# Block-scaled FP8 decode sweep (fp8_128x128 weights, 1x128 activations)", "",
         f"- date: {meta['date']}", f"- device: {meta['device']}",
         f"- jax {meta['jax']}, jax-gmma {meta['jax_gmma']}; XLA_FLAGS='{meta['xla_flags']}'",
         f"- chains of {CHAIN} dependent GEMMs in one jitted program, bf16 activation in and out, "
         "median of 2 rounds x 5 samples, µs per GEMM; ratio = peer / ours (> 1: ours faster)",
         "- ours = `jax_gmma.dot` on an fp8_128x128 weight: the config the heuristic picks, "
         "activation quantized by XLA ops fused into the producer up to "
         f"{blockwise.XLA_QUANTIZE_MAX_M} tokens", "",
         "| M | N x K | ours config | ours µs | fp8_channel | XLA FP8 | bf16 | vs channel | vs XLA FP8 | "
         "vs bf16 | wgmma swap µs (XLA q / kernel q) |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    us = r["us"]
    o = ours_us(r)
    tn = 16 if r["m"] <= 16 else 32 if r["m"] <= 32 else 64
    wg = f"swap_128x{tn}x128_coop_streamk"
    out.append(f"| {r['m']} | {r['n']} x {r['k']} | {r['pick']} | {o:.1f} | {us['channel']:.1f} | "
               f"{us['xla_fp8']:.1f} | {us['bf16']:.1f} | {us['channel'] / o:.2f}x | "
               f"{us['xla_fp8'] / o:.2f}x | {us['bf16'] / o:.2f}x | "
               f"{us[f'bw[{wg}]_xq']:.1f} / {us[f'bw[{wg}]_kq']:.1f} |")
  out += ["", "Every forced config of each row is in the JSON (`us`), with its relative difference "
          f"(`rel_diff`) from {meta.get('rel_diff_reference', 'the reference config')}.", ""]
  return "\n".join(out)


def shape_axes(rows):
  """matplotlib (plt, fig, axes, shapes): one panel per (N, K) of `rows`, smallest first, M on a
  log2 axis; None without matplotlib."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  shapes_ = sorted({(r["n"], r["k"]) for r in rows}, key=lambda s: (s[0] * s[1], s))
  fig, axes = plt.subplots(1, len(shapes_), figsize=(3.3 * len(shapes_), 3.3), sharey=True)
  axes = np.atleast_1d(axes)
  for ax, (n, k) in zip(axes, shapes_):
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_title(f"{n} x {k}", fontsize=9)
    ax.set_xlabel("M (tokens)")
  axes[0].set_ylabel("speed vs XLA FP8 (x)")
  return plt, fig, axes, shapes_


def save_figure(plt, fig, axes, path):
  axes[0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def plot(path, rows):
  made = shape_axes(rows)
  if made is None:
    return None
  plt, fig, axes, shapes_ = made
  for ax, (n, k) in zip(axes, shapes_):
    rs = sorted((r for r in rows if (r["n"], r["k"]) == (n, k)), key=lambda r: r["m"])
    ms = [r["m"] for r in rs]
    ax.plot(ms, [r["us"]["xla_fp8"] / ours_us(r) for r in rs], "o-", label="ours fp8_128x128")
    ax.plot(ms, [r["us"]["xla_fp8"] / r["us"]["channel"] for r in rs], "s--", label="ours fp8_channel")
    ax.plot(ms, [r["us"]["xla_fp8"] / r["us"]["bf16"] for r in rs], "^:", label="bf16")
  return save_figure(plt, fig, axes, path)


def write_sweep(out_dir, name, meta, rows, markdown_fn, plot_fn):
  """DIR/NAME.json (meta + rows), .md (markdown_fn) and .png (plot_fn; None: no plot, as for the
  partial files a sweep rewrites after every row)."""
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, name)
  with open(base + ".json", "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  with open(base + ".md", "w") as f:
    f.write(markdown_fn(meta, rows))
  if plot_fn is not None:
    plot_fn(base + ".png", rows)


def sweep_parser(doc, default_nk, default_ms):
  """The options every decode sweep takes: --out, --nk, --ms, --report."""
  p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  p.add_argument("--out", default="bench_out")
  p.add_argument("--nk", default=default_nk, help="comma list of NxK")
  p.add_argument("--ms", default=default_ms, help="comma list of M")
  p.add_argument("--report", metavar="DIR[,DIR...]",
                 help="re-render DIR's JSON as markdown and PNG; several DIRs (runs of other "
                      "shapes on the same GPU): their rows merged into --out")
  return p


def rerender(report_dirs, name, markdown_fn, plot_fn, out_dir=None):
  """Re-renders the JSON of one run directory in place, or merges several (comma list) into
  ``out_dir``: the rows in the order given, the first run's meta with every run's meta under
  ``merged`` and the failures of all. Runs on different devices are refused."""
  dirs = [d for d in report_dirs.split(",") if d]
  runs = []
  for d in dirs:
    with open(os.path.join(d, name + ".json")) as f:
      runs.append(json.load(f))
  devices = {r["meta"]["device"] for r in runs}
  if len(devices) > 1:
    raise SystemExit(f"--report: runs of different devices cannot be merged: {sorted(devices)}")
  meta = dict(runs[0]["meta"])
  rows = [row for r in runs for row in r["rows"]]
  if len(runs) > 1:
    # One table: each shape's rows together (shapes in order of first appearance), by M.
    seen = {}
    for row in rows:
      seen.setdefault((row["n"], row["k"]), len(seen))
    cells = [(row["n"], row["k"], row["m"]) for row in rows]
    if len(set(cells)) != len(cells):
      raise SystemExit("--report: the runs measured some (N, K, M) cells twice: "
                       f"{sorted({c for c in cells if cells.count(c) > 1})}")
    rows.sort(key=lambda row: (seen[(row["n"], row["k"])], row["m"]))
    meta["merged"] = [r["meta"] for r in runs]
    meta["failures"] = [f for r in runs for f in r["meta"].get("failures", [])]
    meta["partial"] = any(r["meta"].get("partial", False) for r in runs)
  write_sweep(dirs[0] if len(runs) == 1 else out_dir, name, meta, rows, markdown_fn, plot_fn)
  return 0


def grid(a):
  """(N, K) pairs and Ms of the parsed --nk / --ms."""
  return ([tuple(int(v) for v in s.split("x")) for s in a.nk.split(",") if s],
          [int(v) for v in a.ms.split(",") if v])


def sweep_meta(**extra):
  dev = jax.devices()[0]
  return dict(date=datetime.date.today().isoformat(), device=f"{dev.device_kind} ({dev.platform})",
              jax=jax.__version__, jax_gmma=jax_gmma.__version__,
              xla_flags=os.environ.get("XLA_FLAGS", ""), chain=CHAIN, **extra)


def main(argv=None):
  a = sweep_parser(__doc__, DEFAULT_NK, DEFAULT_MS).parse_args(argv)
  if a.report:
    return rerender(a.report, NAME, markdown, plot, a.out)
  nk, ms = grid(a)
  meta = sweep_meta(rel_diff_reference="the wgmma swap config's output (XLA-quantized activation)")
  t0 = time.time()
  rows = measure(nk, ms, lambda s: print(s, flush=True))
  write_sweep(a.out, NAME, meta, rows, markdown, plot)
  print(f"wrote {a.out}/{NAME}.{{json,md,png}} in {time.time() - t0:.0f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
