#!/usr/bin/env python3
"""Batched-decode sweep of every weight format: ``jax_gmma.dot`` on a bfloat16 activation as a
decode step runs it, M from 1 to 256 tokens, chains of dependent GEMMs in one jitted program,
against XLA's FP8 dot (the anchor), bf16 and ``jax.nn.scaled_matmul`` (MXFP8).

  python3 -P benchmarks/decode_sweep.py [--out DIR] [--nk 8192x8192,...] [--ms 1,16,64]
                                        [--formats fp8_channel,wo:nvfp4,...]
  python3 benchmarks/decode_sweep.py --report DIR   # re-render DIR's JSON as md + PNG

Rows (every one takes a bf16 activation and gives bf16):

  fp8_tensor, fp8_channel, fp8_128x128, mxfp8
                  jax_gmma.dot(x, quantize(w, FORMAT)): x quantized on the fly as dot does (per
                  token; 1x128 for 128x128 weights; MXFP8 for MXFP8 weights), the library's pick
  wo:nvfp4, wo:mxfp4, wo:mxfp6_e2m3, wo:mxfp6_e3m2
                  jax_gmma.dot(x, weightonly.prepare(w, FORMAT)): the weight-only kernels (mma.sync
                  up to 16 tokens, wgmma beyond) or the prefill route, as "auto" picks
  wo:FMT/kernel   (--wo-kernel) weightonly_gemm(x, w, path="kernel"): the kernels at every M,
                  where "auto" takes a prefill route (from weightonly.PREFILL_MIN_M tokens)
  xla_fp8         x quantized per token in jnp, fp8 operands straight into lax.dot_general
                  (cuBLASLt FP8 GEMM), scales multiplied after: the anchor of every ratio
  bf16            lax.dot_general on bf16 operands
  jnn_mxfp8       jax.nn.scaled_matmul on MXFP8 operands (x quantized in the step by JAX's own
                  quantizer, the weight once)
  torch_fp8       torch._scaled_mm with row-wise scales (x quantized per token in torch, M padded
                  to a multiple of 16 as its FP8 GEMM requires), the chain captured in one CUDA
                  graph and replayed (timed with CUDA events), when torch with CUDA is importable
                  (--no-torch: skipped). Its weights are its own random e4m3 matrices of the same
                  shape; its check is the same float64 product of its dequantized operands. The
                  JSON's meta says whether a 4-bit torch kernel (gemlite, torchao) is importable;
                  none is timed yet.

Correctness first: one GEMM of each row against a float64 product of the dequantized operands
(the activation as the row quantizes it), relative Frobenius error, tolerance TOL. Timing: CHAIN
(16) dependent GEMMs per jitted call, each step's output (tiled or sliced to K, times 1.01) the
next activation, distinct weight copies cycled (>= 600 MB of FP8 weights per chain where the shape
allows: HBM, not the 60 MB L2); µs per GEMM = median chain time / CHAIN (bench_fp8.time_rounds,
the rows of one (shape, M) interleaved). XLA's default flags (command buffers on).

Writes DIR/decode_sweep.json (every measurement), .md (ratio to XLA FP8 per cell, cells short of
the batched-decode goals in bold, GOALS; then each cell's ceiling: XLA's time over the row's
physical floor, floor_us) and .png (needs matplotlib).
"""
from __future__ import annotations

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
from jax_gmma.ops import weightonly  # noqa: E402
from bench_fp8 import TorchPeer, exit_code, time_rounds, torch_rows_e4m3, warm_gpu  # noqa: E402
from bench_blockwise import q_mx  # noqa: E402
from blockwise_decode_sweep import (CHAIN, NT, chain_of, grid, rerender, save_figure, shape_axes,  # noqa: E402
                                    sweep_meta, sweep_parser, write_sweep, xla_fp8)

F8, BF, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32
NAME = "decode_sweep"
#: Llama-3-8B / 70B and Qwen2.5-32B projection shapes (N x K).
DEFAULT_NK = "4096x4096,14336x4096,4096x14336,8192x8192,28672x8192,8192x28672,5120x27648"
DEFAULT_MS = "1,2,4,8,16,24,32,48,64,96,128,192,256"
OURS = ("fp8_tensor", "fp8_channel", "fp8_128x128", "mxfp8", "wo:nvfp4", "wo:mxfp4", "wo:mxfp6_e2m3",
        "wo:mxfp6_e3m2")
PEERS = ("xla_fp8", "bf16", "jnn_mxfp8")
TORCH_FP8 = "torch_fp8"
#: 4-bit torch kernels looked for (module names); none is a dependency of the benchmark.
TORCH_4BIT = ("gemlite", "torchao")
#: The activation format dot quantizes x to, per weight format (the reference's x).
X_FORMAT = {"fp8_tensor": "fp8_channel", "fp8_channel": "fp8_channel", "fp8_128x128": "fp8_1x128",
            "mxfp8": "mxfp8"}
TOL = 1e-2
#: Batched-decode goals: (largest M of the band, least speed vs XLA FP8), per format; mxfp8's
#: goal is relative to our fp8_channel at the same cell (MXFP8_VS_CHANNEL).
GOALS = {
    "wo:nvfp4": ((16, 1.5), (64, 1.3), (256, 1.0)),
    "wo:mxfp4": ((16, 1.5), (64, 1.3), (256, 1.0)),
    "wo:mxfp6_e2m3": ((16, 1.2), (64, 1.1), (256, 1.0)),
    "wo:mxfp6_e3m2": ((16, 1.2), (64, 1.1), (256, 1.0)),
    "fp8_tensor": ((256, 1.0),),
    "fp8_channel": ((256, 1.0),),
}
MXFP8_VS_CHANNEL = 0.95
#: Physical floors (datasheets): HBM bytes per second by device (H200 4.8 TB/s, H100 SXM 3.35;
#: others: the H200's), dense tensor-core FLOP/s by operand type (the same on both). FP4 / FP6
#: weights run on bf16 tensor cores (Hopper has no FP4 / FP6 MMA).
HBM_BPS = 4.8e12
HBM_BPS_BY_DEVICE = {"H100": 3.35e12, "H200": 4.8e12}
TC_FLOPS = {"fp8": 1979e12, "bf16": 989e12}


def hbm_bps(device: str) -> float:
  """The HBM bandwidth of the floors for a device name (jax's device_kind)."""
  for key, bps in HBM_BPS_BY_DEVICE.items():
    if key in device:
      return bps
  return HBM_BPS
#: Weight bytes per element, scales included (K-blocked scales amortized over their block).
WEIGHT_BYTES = {"fp8_tensor": 1.0, "fp8_channel": 1.0, "fp8_128x128": 1.0 + 4 / 128 ** 2,
                "mxfp8": 1.0 + 1 / 32, "wo:nvfp4": 0.5 + 1 / 16, "wo:mxfp4": 0.5 + 1 / 32,
                "wo:mxfp6_e2m3": 0.75 + 1 / 32, "wo:mxfp6_e3m2": 0.75 + 1 / 32, "xla_fp8": 1.0,
                "bf16": 2.0, "jnn_mxfp8": 1.0 + 1 / 32, TORCH_FP8: 1.0}


def goal(fmt: str, m: int):
  """The least ratio vs XLA FP8 `fmt` should reach at M = m, or None (no goal)."""
  for top, g in GOALS.get(fmt, ()):
    if m <= top:
      return g
  return None


def floor_us(name: str, m: int, n: int, k: int, bps: float = HBM_BPS) -> float:
  """The physical floor of one GEMM of row `name`: weight and activation bytes over HBM
  bandwidth `bps`, or FLOPs over the tensor-core rate of its operand type, whichever is larger."""
  name = name.split("/")[0]
  nbytes = n * k * WEIGHT_BYTES[name] + 2 * m * (k + n)
  rate = TC_FLOPS["bf16" if name.startswith("wo:") or name == "bf16" else "fp8"]
  return 1e6 * max(nbytes / bps, 2.0 * m * n * k / rate)


def _weights(fmt, w):
  if fmt.startswith("wo:"):
    return weightonly.prepare(w, fmt[3:])
  return jax_gmma.quantize(w, fmt)


def _reference(fmt, x, wq):
  """float64 x_q @ w_q.T of the dequantized operands (x as the row quantizes it)."""
  wd = np.asarray(jax_gmma.dequantize(wq, F32) if not fmt.startswith("wo:")
                  else weightonly.dequantize_packed(wq), np.float64)
  if fmt.startswith("wo:"):
    xd = np.asarray(x.astype(F32), np.float64)
  else:
    xd = np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x, X_FORMAT[fmt]), F32), np.float64)
  return xd @ wd.T


def _rel(out, ref):
  out = np.asarray(jnp.asarray(out, F32), np.float64)
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def _jnn_step(x, w):
  a, sa = q_mx(x)
  return jax.nn.scaled_matmul(a, w[0], sa, w[1], preferred_element_type=BF)[0]


def _wo_kernel_step(x, w):
  return weightonly.weightonly_gemm(x, w, path="kernel")


# -- torch peer ---------------------------------------------------------------------------------

def torch_fp8_step(t):
  """One decode GEMM as a torch user writes it: x (M, K) bf16 quantized per token, rows padded
  to a multiple of 16, torch._scaled_mm against (w_e4m3 (N, K), scale (1, N)), bf16 out."""
  def step(x, w):
    w8, sw = w
    m = x.shape[0]
    pad = -m % 16
    xp = t.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    x8, sx = torch_rows_e4m3(t, xp)
    y = t._scaled_mm(x8, w8.t(), scale_a=sx.unsqueeze(1), scale_b=sw, out_dtype=t.bfloat16)
    y = y[0] if isinstance(y, tuple) else y
    return y[:m]
  return step


def torch_chain(t, step, k, ws):
  """The chain of blockwise_decode_sweep.chain_of in torch (same next activation)."""
  def f(x):
    out = None
    for i in range(CHAIN):
      out = step(x, ws[i % len(ws)])
      n = out.shape[1]
      nxt = out.repeat(1, math.ceil(k / n)) if n < k else out
      x = nxt[:, :k] * 1.01
    return out
  return f


def torch_fp8_cell(tp, m, n, k, d, repeats, rounds, target_s):
  """(µs per GEMM, rel_err) of the torch FP8 peer at one cell; its own weights (d copies)."""
  t = tp.torch
  ws = []
  for _ in range(d):
    w = (t.randn((n, k), device="cuda", generator=tp.gen) / math.sqrt(k)).to(t.bfloat16)
    w8, sw = torch_rows_e4m3(t, w)
    ws.append((w8, sw.reshape(1, n)))
  step = torch_fp8_step(t)
  x = t.randn((m, k), device="cuda", generator=tp.gen).to(t.bfloat16)
  x8, sx = torch_rows_e4m3(t, x)
  ref = (x8.double() * sx.double().unsqueeze(1)) @ (ws[0][0].double() * ws[0][1].double().reshape(n, 1)).t()
  out = step(x, ws[0]).double()
  err = float(t.linalg.norm(out - ref) / t.linalg.norm(ref))
  graph, _ = tp.capture(torch_chain(t, step, k, ws), x)
  samples = []
  for _ in range(rounds):
    samples.append(tp.time(graph.replay, [()], repeats, target_s)["median_us"])
  del graph, ws
  tp.free()
  return float(np.median(samples)) / CHAIN, err


def torch_4bit_note():
  """Which 4-bit torch kernels are importable here (None: at least one is)."""
  missing = []
  for mod in TORCH_4BIT:
    try:
      __import__(mod)
    except Exception:  # noqa: BLE001 -- any failure to import means "not available here"
      missing.append(mod)
  return None if len(missing) < len(TORCH_4BIT) else f"no 4-bit torch kernel importable ({', '.join(missing)})"


def measure(nk, ms, formats, log, repeats=5, rounds=2, wo_kernel=False, torch_peer=None,
            on_row=None):
  """Every (shape, M) cell; on_row(rows, failures) after each (the partial report)."""
  rows, failures = [], []
  warm_gpu(1.0)
  bps = hbm_bps(jax.devices()[0].device_kind)
  key = jax.random.PRNGKey(0)
  for n, k in nk:
    d = max(1, min(CHAIN, math.ceil(600e6 / (n * k))))
    ws = {name: [] for name in (*formats, *PEERS)}
    for _ in range(d):
      key, sk = jax.random.split(key)
      w = (jax.random.normal(sk, (n, k), F32) / math.sqrt(k)).astype(BF)
      for fmt in formats:
        ws[fmt].append(_weights(fmt, w))
      q = jax_gmma.quantize(w, "fp8_channel")
      ws["xla_fp8"].append((q.data, q.scales.reshape(-1)))
      ws["bf16"].append(w)
      b, sb = q_mx(w)
      ws["jnn_mxfp8"].append((b, sb))
    steps = {fmt: (lambda x, w: jax_gmma.dot(x, w)) for fmt in formats}
    steps["xla_fp8"] = xla_fp8
    steps["bf16"] = lambda x, w: lax.dot_general(x, w, NT, preferred_element_type=BF)
    steps["jnn_mxfp8"] = _jnn_step
    if wo_kernel:  # the weight-only kernel path at every M (auto takes a prefill route from 128)
      for fmt in formats:
        if fmt.startswith("wo:"):
          steps[fmt + "/kernel"] = _wo_kernel_step
          ws[fmt + "/kernel"] = ws[fmt]
    for m in ms:
      key, sk = jax.random.split(key)
      x = jax.random.normal(sk, (m, k), F32).astype(BF)
      errs, compiled = {}, {}
      for name, step in steps.items():
        try:
          if name.split("/")[0] in formats:
            base = name.split("/")[0]
            errs[name] = _rel(jax.jit(step)(x, ws[name][0]), _reference(base, x, ws[name][0]))
            if not errs[name] <= TOL:
              failures.append(f"{name} {m}x{n}x{k}: rel. error {errs[name]:.3g} > {TOL}")
          compiled[name] = (jax.jit(chain_of(step, k)).lower(x, tuple(ws[name])).compile(), tuple(ws[name]))
        except Exception as e:  # noqa: BLE001 -- a peer without a lowering here (CPU) is skipped
          log(f"  {name} at {m}x{n}x{k}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
      stats = time_rounds({nm: (lambda c=c, w_=w_: c(x, w_)) for nm, (c, w_) in compiled.items()},
                          [()], repeats, 0.02, rounds)
      row = dict(m=m, n=n, k=k, chain=CHAIN, distinct_weights=d,
                 us={nm: st["median_us"] / CHAIN for nm, st in stats.items()}, rel_err=errs,
                 floor_us={nm: floor_us(nm, m, n, k, bps) for nm in (*steps, TORCH_FP8)})
      if torch_peer is not None and torch_peer.ok:
        try:
          us, err = torch_fp8_cell(torch_peer, m, n, k, d, repeats, rounds, 0.02)
          errs[TORCH_FP8] = err
          if err <= TOL:
            row["us"][TORCH_FP8] = us
          else:
            failures.append(f"{TORCH_FP8} {m}x{n}x{k}: rel. error {err:.3g} > {TOL}")
        except Exception as e:  # noqa: BLE001 -- a failing peer is noted, not fatal
          log(f"  {TORCH_FP8} at {m}x{n}x{k}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
      rows.append(row)
      log(f"{m:4d} x {n} x {k}: " + ", ".join(f"{nm} {v:.1f}" for nm, v in row["us"].items()))
      if on_row is not None:
        on_row(rows, failures)
    del ws
  return rows, failures


def ratio(row, name):
  us = row["us"]
  if name not in us or "xla_fp8" not in us:
    return None
  return us["xla_fp8"] / us[name]


def misses(row, name):
  """Whether the cell is short of its goal (None: no goal or not measured)."""
  r = ratio(row, name)
  if r is None:
    return None
  if name == "mxfp8":
    c = ratio(row, "fp8_channel")
    return None if c is None else r < MXFP8_VS_CHANNEL * c
  g = goal(name, row["m"])
  return None if g is None else r < g


#: Token bands of the goal summary (the bands of GOALS).
BANDS = ((1, 16), (17, 64), (65, 256))


def goal_summary(rows, names):
  """Markdown lines: per format with a goal and per token band, the cells that meet it, the
  range and the median of the ratio the goal is stated in (mxfp8: against our fp8_channel)."""
  out = ["| format | ratio to | " + " | ".join(f"{lo}-{hi} tokens" for lo, hi in BANDS) + " |",
         "|---|---|" + "---|" * len(BANDS)]
  for nm in names:
    if nm not in GOALS and nm != "mxfp8":
      continue
    cells = []
    for lo, hi in BANDS:
      vals = []
      for r in rows:
        if lo <= r["m"] <= hi and misses(r, nm) is not None:
          v = ratio(r, nm) / (ratio(r, "fp8_channel") if nm == "mxfp8" else 1.0)
          vals.append((v, not misses(r, nm)))
      if not vals:
        cells.append("-")
        continue
      vs = sorted(v for v, _ in vals)
      cells.append(f"{sum(ok for _, ok in vals)} / {len(vals)} meet; {vs[0]:.2f}-{vs[-1]:.2f}x, "
                   f"median {vs[len(vs) // 2]:.2f}x")
    out.append(f"| {nm} | {'our fp8_channel' if nm == 'mxfp8' else 'XLA FP8'} | " + " | ".join(cells) + " |")
  return out


def markdown(meta, rows):
  extra = sorted({nm for r in rows for nm in r["us"] if "/" in nm})
  names = [nm for nm in (*OURS, *extra, "bf16", "jnn_mxfp8", TORCH_FP8)
           if any(nm in r["us"] for r in rows)]
  out = ["# Batched-decode sweep: every weight format against XLA's FP8 dot", ""]
  if meta.get("partial"):
    out += ["**Partial: the run stopped before its end; these are the cells it finished.**", ""]
  out += [f"- date: {meta['date']}", f"- device: {meta['device']}",
          f"- jax {meta['jax']}, jax-gmma {meta['jax_gmma']}; XLA_FLAGS='{meta['xla_flags']}'",
          f"- chains of {CHAIN} dependent GEMMs in one jitted program, bf16 activation in and out, "
          "µs per GEMM (median); cells: speed vs XLA's FP8 dot (XLA µs / ours; > 1: faster)",
          "- goals (bold: short of it): FP4 >= 1.5x up to 16 tokens, 1.3x up to 64, 1.0x up to 256; "
          f"FP6 1.2x / 1.1x / 1.0x; fp8_channel / fp8_tensor >= 1.0x; mxfp8 >= {MXFP8_VS_CHANNEL}x our "
          "fp8_channel", "",
          "| N x K | M | XLA FP8 µs | " + " | ".join(names) + " |",
          "|---|---|---|" + "---|" * len(names)]
  for r in rows:
    cells = []
    for nm in names:
      v = ratio(r, nm)
      if v is None:
        cells.append("-")
      else:
        cells.append(f"**{v:.2f}x**" if misses(r, nm) else f"{v:.2f}x")
    xla = r["us"].get("xla_fp8")
    out.append(f"| {r['n']} x {r['k']} | {r['m']} | {xla:.1f} | " if xla else
               f"| {r['n']} x {r['k']} | {r['m']} | - | ")
    out[-1] += " | ".join(cells) + " |"
  out += ["", "Goals per token band (cells that meet their goal; the range and median of the ratio):", "",
          *goal_summary(rows, names)]
  bps = hbm_bps(meta["device"])
  out += ["", "Ceilings: the most each row could reach against the measured XLA FP8 time, XLA µs / "
          f"the row's physical floor (bytes / {bps / 1e12:.2f} TB/s or FLOPs / "
          f"{TC_FLOPS['fp8'] / 1e12:.0f} (FP8) or {TC_FLOPS['bf16'] / 1e12:.0f} (bf16, FP4 / FP6 "
          "weights) TFLOP/s, the larger). A goal above its ceiling cannot be met on this "
          "hardware with that operand type.", "",
          "| N x K | M | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
  for r in rows:
    xla = r["us"].get("xla_fp8")
    cells = [f"{xla / floor_us(nm, r['m'], r['n'], r['k'], bps):.2f}x" if xla and nm in r["us"] else "-"
             for nm in names]
    out.append(f"| {r['n']} x {r['k']} | {r['m']} | " + " | ".join(cells) + " |")
  out += ["", f"Relative errors (float64 reference of the dequantized operands, tolerance {TOL}) and "
          "absolute µs of every row are in the JSON.", ""]
  return "\n".join(out)


def plot(path, rows):
  made = shape_axes(rows)
  if made is None:
    return None
  plt, fig, axes, shapes_ = made
  names = [nm for nm in (*OURS, "bf16") if any(nm in r["us"] for r in rows)]
  for ax, (n, k) in zip(axes, shapes_):
    rs = sorted((r for r in rows if (r["n"], r["k"]) == (n, k)), key=lambda r: r["m"])
    for nm in names:
      pts = [(r["m"], ratio(r, nm)) for r in rs if ratio(r, nm) is not None]
      if pts:
        ax.plot(*zip(*pts), "o-" if nm.startswith("wo:") else "s--", ms=3, label=nm)
  return save_figure(plt, fig, axes, path)


def main(argv=None):
  p = sweep_parser(__doc__, DEFAULT_NK, DEFAULT_MS)
  p.add_argument("--formats", default=",".join(OURS), help=f"comma list of {OURS}")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--wo-kernel", action="store_true",
                 help="also time the weight-only kernel path at every M (rows wo:FMT/kernel)")
  p.add_argument("--no-torch", action="store_true", help="skip the torch peers")
  a = p.parse_args(argv)
  if a.report:
    return rerender(a.report, NAME, markdown, plot, a.out)
  nk, ms = grid(a)
  formats = tuple(f for f in a.formats.split(",") if f)
  bad = [f for f in formats if f not in OURS]
  if bad:
    p.error(f"--formats: unknown {bad}; choose from {OURS}")
  meta = sweep_meta(tol=TOL)
  tp = TorchPeer(not a.no_torch)
  meta["torch"] = tp.version if tp.ok else tp.note
  meta["torch_4bit"] = torch_4bit_note() if tp.ok else tp.note
  t0 = time.time()
  # After every cell the JSON and the table are rewritten, marked partial, so a run stopped early
  # keeps what it measured (the plot comes at the end).
  partial = lambda rows, failures: write_sweep(a.out, NAME, dict(meta, failures=failures, partial=True),
                                               rows, markdown, None)
  rows, failures = measure(nk, ms, formats, lambda s: print(s, flush=True), a.repeats, a.rounds,
                           a.wo_kernel, tp, partial)
  meta.update(failures=failures, partial=False)
  write_sweep(a.out, NAME, meta, rows, markdown, plot)
  print(f"wrote {a.out}/{NAME}.{{json,md,png}} in {time.time() - t0:.0f} s")
  return exit_code(failures)


if __name__ == "__main__":
  sys.exit(main())
