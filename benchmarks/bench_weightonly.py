#!/usr/bin/env python3
"""FP4 / FP6 weight-only GEMM benchmark (jax_gmma.weightonly_gemm on Hopper) against its peers.

    python3 -P benchmarks/bench_weightonly.py --suite {decode,prefill,smoke,all} [--out DIR]

Writes DIR/bench_weightonly.json and DIR/bench_weightonly.md and prints the tables. Exit status 1
when a correctness check of ours fails.

Implementations (same process, same run; every one gets bf16 activations in and bf16 out)
  ours_nvfp4 / ours_mxfp4  jax_gmma.weightonly_gemm(x, prepare(w, fmt)): FP4 weights (packed codes
                     + scale codes streamed), bf16 activations.
  ours_mxfp6_e2m3 / ours_mxfp6_e3m2  the same with MXFP6 weights (0.78 byte per weight).
  ours_fp8           jax_gmma.fp8_gemm on an fp8 (e4m3, per-tensor scale) copy of the weights,
                     activation cast to fp8 in the chain: our FP8 decode kernel.
  xla_fp8            XLA's FP8 GEMM (fp8 operands straight into lax.dot_general -> cuBLASLt FP8
                     or XLA's Triton GEMM), activation cast to fp8 in the chain.
  ours_*_fp8         (prefill suite) FP8 activations (cast in the step) through the exact FP8 prefill
                     route, weightonly_gemm(x8, w, path="fp8"), MX weights.
  ours_nvfp4_fp8r    (prefill suite) the same with NVFP4 weights rounded to e4m3,
                     path="fp8_rounded" (asked for explicitly; rel_err includes the rounding).
  ours_nvfp4_x8 / ours_mxfp4_x8  (decode suite, only when named in --impls) FP8 activations (cast
                     in the step) in the FP4 decode kernel, widened to bf16 exactly there.
  bf16               jnp.dot(x, w_bf16.T).
  xla_dequant_nvfp4  what JAX users write today: jnp.dot(x, jax_gmma.dequantize(w_q).astype(bf16).T)
                     inside the jitted step (XLA fuses the dequantize, then a bf16 GEMM).

Decode suite: chains of 32 dependent GEMMs per jitted call (x_{i+1} is made from out_i, so XLA
cannot merge calls: by default the first M*K elements of out_i, a contiguous prefix that costs no
kernel; --glue columns takes out_i[:, :K] (the older method), a copy kernel per step for the
bf16-input impls when M > 1 and N > K), cycling over enough distinct weight copies to exceed the
60 MB L2; the impls of one (shape, M) timed in --rounds interleaved rounds (not one impl after the
other); reported per GEMM, with the streamed weight bytes per second (FP4:
packed codes + scale codes) and the kernel-launching ops per chain (32 when the glue adds none). --decode-shapes /
--decode-ms narrow the suite. Prefill suite: single GEMMs at M = 4096, distinct weights rotated,
the impls timed in --rounds interleaved rounds (not sequentially, one impl after the other).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)

from bench_fp8 import F8, BF16, F32, MAX_SETS, TN, _nk_list, compile_jax, md_tail, time_rounds  # noqa: E402

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma.ops import weightonly as wo  # noqa: E402

CHAIN = 32
L2_BYTES = 60e6
DECODE_SHAPES = ((28672, 8192), (8192, 8192), (8192, 28672), (4096, 14336))
DECODE_MS = (1, 4, 16)
PREFILL_SHAPES = ((8192, 8192), (28672, 8192))
TOL = {"ours_nvfp4_kernel": 1e-2, "ours_nvfp4_dequant": 1e-2, "ours_nvfp4": 1e-2, "ours_mxfp4": 1e-2, "ours_mxfp6_e2m3": 1e-2, "ours_mxfp6_e3m2": 1e-2,
       "ours_fp8": 5e-2}
WO_IMPLS = {"ours_nvfp4": "nvfp4", "ours_mxfp4": "mxfp4", "ours_mxfp6_e2m3": "mxfp6_e2m3",
            "ours_mxfp6_e3m2": "mxfp6_e3m2", "ours_nvfp4_kernel": "nvfp4",
            "ours_nvfp4_dequant": "nvfp4"}
#: The FP8 prefill route (weightonly_gemm(..., path="fp8")): FP8 activations x MX weights unpacked
#: to e4m3 with a power-of-two scale per row, then jax-gmma's FP8 GEMM. Prefill suite only.
FP8_ROUTE = {"ours_mxfp4_fp8": "mxfp4", "ours_mxfp6_e2m3_fp8": "mxfp6_e2m3",
             "ours_mxfp6_e3m2_fp8": "mxfp6_e3m2"}
#: path="fp8_rounded" (asked for explicitly): the same route for any format, weights rounded to
#: nearest e4m3 (rel_err here is against the exact weights: it includes that rounding).
FP8_ROUNDED = {"ours_nvfp4_fp8r": "nvfp4"}
#: FP4 weights x FP8 activations in the decode kernel (decode suite; not in the default impls):
#: the chain's bf16 activation cast to e4m3 in the step, as for ours_fp8, and widened to bf16
#: exactly in the kernel (half the activation bytes of the bf16 impls).
X8_DECODE = {"ours_nvfp4_x8": "nvfp4", "ours_mxfp4_x8": "mxfp4"}
WO_IMPLS.update(FP8_ROUTE)
WO_IMPLS.update(FP8_ROUNDED)
WO_IMPLS.update(X8_DECODE)
for _i in (*FP8_ROUTE, *FP8_ROUNDED, *X8_DECODE):
  TOL[_i] = 5e-2
# impls whose activations are cast to FP8
FP8_X = ("ours_fp8", "xla_fp8", *FP8_ROUTE, *FP8_ROUNDED, *X8_DECODE)
PREFILL_ONLY = (*FP8_ROUTE, *FP8_ROUNDED)  # not in the decode chains


GLUES = ("prefix", "columns")


def _to_k(y, k, glue="prefix"):
  """Next chain input (M, K) bf16 from out (M, N).

  ``prefix`` (default): for N >= K the first M * K elements of out, a contiguous prefix of its
  buffer that XLA passes on without a copy; ``columns`` (the older method):
  out[:, :K], a strided slice that takes a copy kernel between the GEMMs for M > 1 -- which the
  FP8 impls fuse into their cast to FP8 and the bf16-input impls (ours weight-only, bf16, XLA
  dequantize) pay as an extra kernel per step. N < K: out tiled along N, then cut (both glues).
  """
  m, n = y.shape
  if n >= k and glue == "prefix":
    return y.reshape(-1)[:m * k].reshape(m, k).astype(BF16)
  if n < k:
    y = jnp.concatenate([y] * math.ceil(k / n), axis=1)
  return y[:, :k].astype(BF16)


def _chain(step, k, glue="prefix"):
  def chain(x, ws):
    out = None
    for i in range(CHAIN):
      out = step(x, ws[i % len(ws)])
      x = _to_k(out, k, glue)
    return out
  return chain


def _steps(k):
  return {
      "ours_nvfp4": lambda x, w: jax_gmma.weightonly_gemm(x, w),
      "ours_mxfp4": lambda x, w: jax_gmma.weightonly_gemm(x, w),
      "ours_mxfp6_e2m3": lambda x, w: jax_gmma.weightonly_gemm(x, w),
      "ours_mxfp6_e3m2": lambda x, w: jax_gmma.weightonly_gemm(x, w),
      "ours_nvfp4_kernel": lambda x, w: jax_gmma.weightonly_gemm(x, w, path="kernel"),
      "ours_nvfp4_dequant": lambda x, w: jax_gmma.weightonly_gemm(x, w, path="dequant"),
      **{i: (lambda x, w: jax_gmma.weightonly_gemm(x.astype(F8), w, path="fp8")) for i in FP8_ROUTE},
      **{i: (lambda x, w: jax_gmma.weightonly_gemm(x.astype(F8), w, path="fp8_rounded"))
         for i in FP8_ROUNDED},
      **{i: (lambda x, w: jax_gmma.weightonly_gemm(x.astype(F8), w)) for i in X8_DECODE},
      "ours_fp8": lambda x, w: jax_gmma.fp8_gemm(x.astype(F8), w[0], None, w[1], out_dtype=BF16),
      "xla_fp8": lambda x, w: (lax.dot_general(x.astype(F8), w[0], TN, preferred_element_type=F32)
                               * w[1]).astype(BF16),
      "bf16": lambda x, w: jnp.dot(x, w.T),
      "xla_dequant_nvfp4": lambda x, w: jnp.dot(x, jax_gmma.dequantize(w).astype(BF16).T),
  }


def _weights(impl, w32):
  if impl in WO_IMPLS:
    return wo.prepare(w32, WO_IMPLS[impl])
  if impl in ("ours_fp8", "xla_fp8"):
    s = jnp.max(jnp.abs(w32)) / 448.0
    return ((w32 / s).astype(F8), s.astype(F32))
  if impl == "bf16":
    return w32.astype(BF16)
  return jax_gmma.quantize(w32, "nvfp4")


def _dequant(impl, w):
  if impl in WO_IMPLS:
    return wo.dequantize_packed(w)
  if impl in ("ours_fp8", "xla_fp8"):
    return w[0].astype(F32) * w[1]
  if impl == "bf16":
    return w.astype(F32)
  return jax_gmma.dequantize(w)


def _wbytes(impl, n, k):
  if impl.startswith("ours_nv"):
    return n * k // 2 + n * k // 16
  if impl.startswith("ours_mxfp6"):
    return n * k * 3 // 4 + n * k // 32
  if impl.startswith("ours_mx"):
    return n * k // 2 + n * k // 32
  if impl in ("ours_fp8", "xla_fp8"):
    return n * k
  if impl == "bf16":
    return 2 * n * k
  return n * k // 2 + n * k // 16  # nvfp4 QuantizedArray read by the dequantize fusion


def _entry_launches(compiled):
  """Kernel-launching ops (fusions, custom calls, copies) in the compiled chain's entry
  computation: 32 for a chain whose glue adds no kernel of its own."""
  try:
    text = compiled.as_text()
  except Exception:  # pragma: no cover - informational only
    return None
  entry = text[text.find("\nENTRY"):]
  entry = entry[:entry.find("\n}")]
  return sum(1 for line in entry.splitlines()
             if " fusion(" in line or " custom-call(" in line or " copy(" in line)


def _check(fails, suite, impl, x, out, w0, mnk):
  """Relative Frobenius error of out (from activations x, bf16) against a float64 product of
  impl's own operands (x cast to FP8 for the FP8-activation impls; w0 its dequantized weight);
  a failure beyond TOL is appended to fails. Returns the error."""
  xin = np.asarray(x.astype(F8).astype(F32) if impl in FP8_X else x.astype(F32), np.float64)
  ref = xin @ np.asarray(w0, np.float64).T
  err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
  if impl in TOL and not err < TOL[impl]:
    fails.append(f"{suite} {impl} {'x'.join(map(str, mnk))}: rel_err {err:.2e}")
  return err


def distinct_weights(key, impl, n, k):
  """(key, weights): enough distinct random (N, K) weights in impl's form that a chain cycling
  over them streams at least twice the L2 (2 to CHAIN copies)."""
  d = max(2, min(CHAIN, math.ceil(2 * L2_BYTES / _wbytes(impl, n, k))))
  ws = []
  for _ in range(d):
    key, sub = jax.random.split(key)
    ws.append(_weights(impl, jax.random.normal(sub, (n, k), F32) / math.sqrt(k)))
  return key, tuple(ws)


def bench_decode(args, rows, fails, shapes, ms, impls):
  """Decode chains per (N, K) and M: every impl's weights made first, every chain compiled and
  its single GEMM checked against a float64 reference, then all chains timed in
  ``args.rounds`` interleaved rounds (bench_fp8.time_rounds), so that the ratios between impls
  (FP6 vs our FP8, FP4 vs XLA's FP8) come from the same clocks and temperature; no impl is timed on its own, one after the other."""
  key = jax.random.PRNGKey(0)
  for n, k in shapes:
    weights = {}
    for impl in impls:
      key, ws = distinct_weights(key, impl, n, k)
      w0 = np.asarray(_dequant(impl, ws[0]), np.float32)  # exact in float32 for every format
      weights[impl] = (ws, w0, _wbytes(impl, n, k), len(ws))
    for m in ms:
      key, sub = jax.random.split(key)
      x = jax.random.normal(sub, (m, k), F32).astype(BF16)
      timed, meta = {}, {}
      for impl in impls:
        ws, w0, wb, d = weights[impl]
        step = _steps(k)[impl]
        one, _ = compile_jax(step, (x, ws[0]))
        out = np.asarray(one(x, ws[0]).astype(F32), np.float64)
        err = _check(fails, "decode", impl, x, out, w0, (m, n, k))
        chain, calls = compile_jax(_chain(step, k, args.glue), (x, ws))
        timed[impl] = lambda chain=chain, ws=ws: chain(x, ws)
        meta[impl] = (err, calls, _entry_launches(chain))
        del one
      stats = time_rounds(timed, [()], args.repeats, args.repeat_ms / 1e3, args.rounds)
      for impl in impls:
        ws, w0, wb, d = weights[impl]
        err, calls, launches = meta[impl]
        us = stats[impl]["median_us"] / CHAIN
        row = dict(suite="decode", impl=impl, m=m, n=n, k=k, us=us, chain_us=stats[impl]["median_us"],
                   weight_bytes=wb, gbps=wb / (us * 1e-6) / 1e9, rel_err=err, distinct_weights=d,
                   lowered_to=calls, glue=args.glue, launches_per_chain=launches, rounds=args.rounds)
        if impl.startswith("ours_") and impl != "ours_fp8":
          row["tile"] = wo.pick_cta(m, n, k, WO_IMPLS[impl])
        rows.append(row)
        print(f"  {m:3d}x{n}x{k} {impl:18s} {us:8.2f} us/GEMM {row['gbps']:7.0f} GB/s "
              f"rel_err {err:.1e} {launches} ops/chain [{', '.join(calls) or 'XLA'}]", flush=True)
      del timed
    del weights


def bench_prefill(args, rows, fails, shapes, impls, m=4096):
  """Single GEMMs at M = m: every impl compiled and checked first, then timed in
  ``args.rounds`` interleaved rounds (bench_fp8.time_rounds: slow drifts of clocks and
  temperature hit every impl alike), each call on the next of its distinct weight copies."""
  key = jax.random.PRNGKey(1)
  for n, k in shapes:
    key, sub = jax.random.split(key)
    x = jax.random.normal(sub, (m, k), F32).astype(BF16)
    timed, meta = {}, {}
    for impl in impls:
      wb = _wbytes(impl, n, k)
      d = max(2, min(MAX_SETS, math.ceil(2 * L2_BYTES / wb)))  # bench_fp8's cap: tiny weights made ~15000 copies
      ws = []
      for _ in range(d):
        key, sub = jax.random.split(key)
        ws.append(_weights(impl, jax.random.normal(sub, (n, k), F32) / math.sqrt(k)))
      step = _steps(k)[impl]
      fn, calls = compile_jax(step, (x, ws[0]))
      w0 = np.asarray(_dequant(impl, ws[0]), np.float64)
      out = np.asarray(fn(x, ws[0])[:64].astype(F32), np.float64)
      err = _check(fails, "prefill", impl, x[:64], out, w0, (m, n, k))
      it = itertools.cycle(ws)
      timed[impl] = lambda fn=fn, it=it: fn(x, next(it))
      meta[impl] = (err, calls)
    stats = time_rounds(timed, [()], args.repeats, args.repeat_ms / 1e3, args.rounds)
    for impl in impls:
      us = stats[impl]["median_us"]
      err, calls = meta[impl]
      row = dict(suite="prefill", impl=impl, m=m, n=n, k=k, us=us, tflops=2 * m * n * k / us / 1e6,
                 rel_err=err, lowered_to=calls, rounds=args.rounds)
      rows.append(row)
      print(f"  {m}x{n}x{k} {impl:18s} {us:9.1f} us {row['tflops']:7.1f} TFLOP/s rel_err {err:.1e}",
            flush=True)
    del timed, meta, stats


def _prefill_table(rows):
  sel = [r for r in rows if r["suite"] == "prefill"]
  if not sel:
    return ""
  lines = ["### prefill", "", "| M x N x K | impl | us | TFLOP/s | vs ours_fp8 | vs bf16 | rel err |",
           "|---|---|---|---|---|---|---|"]
  for key in dict.fromkeys((r["m"], r["n"], r["k"]) for r in sel):
    by = {r["impl"]: r for r in sel if (r["m"], r["n"], r["k"]) == key}
    for impl, r in by.items():
      rel = [f"{by[p]['us'] / r['us']:.2f}x" if p in by else "-" for p in ("ours_fp8", "bf16")]
      lines.append(f"| {key[0]}x{key[1]}x{key[2]} | {impl} | {r['us']:.1f} | {r['tflops']:.1f} | "
                   f"{rel[0]} | {rel[1]} | {r['rel_err']:.1e} |")
  return "\n".join(lines) + "\n"


def _table(rows, suite):
  sel = [r for r in rows if r["suite"] == suite]
  if not sel:
    return ""
  impls = list(dict.fromkeys(r["impl"] for r in sel))
  keys = list(dict.fromkeys((r["m"], r["n"], r["k"]) for r in sel))
  unit = "us/GEMM" if suite == "decode" else "us"
  head = "| M x N x K | " + " | ".join(f"{i} {unit}" for i in impls)
  head += " | nvfp4 vs ours_fp8 | nvfp4 vs xla_fp8 | nvfp4 vs bf16 | nvfp4 GB/s |"
  fp6 = [i for i in ("ours_mxfp6_e2m3", "ours_mxfp6_e3m2") if i in impls]
  head += "".join(f" {i[5:]} vs ours_fp8 | {i[5:]} GB/s |" for i in fp6)
  lines = [head, "|" + "---|" * (len(impls) + 5 + 2 * len(fp6))]
  for key in keys:
    by = {r["impl"]: r for r in sel if (r["m"], r["n"], r["k"]) == key}
    cells = [f"{by[i]['us']:.2f}" if i in by else "-" for i in impls]

    def ratio(peer):
      if "ours_nvfp4" in by and peer in by:
        return f"{by[peer]['us'] / by['ours_nvfp4']['us']:.2f}x"
      return "-"
    gb = f"{by['ours_nvfp4']['gbps']:.0f}" if "ours_nvfp4" in by and "gbps" in by["ours_nvfp4"] else "-"
    extra = ""
    for i in fp6:
      r6 = f"{by['ours_fp8']['us'] / by[i]['us']:.2f}x" if i in by and "ours_fp8" in by else "-"
      g6 = f"{by[i]['gbps']:.0f}" if i in by and "gbps" in by[i] else "-"
      extra += f" {r6} | {g6} |"
    lines.append(f"| {key[0]}x{key[1]}x{key[2]} | " + " | ".join(cells) +
                 f" | {ratio('ours_fp8')} | {ratio('xla_fp8')} | {ratio('bf16')} | {gb} |" + extra)
  return f"### {suite}\n\n" + "\n".join(lines) + "\n"


def _int_list(v):
  try:
    out = tuple(int(c) for c in v.split(",") if c)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {v!r}")
  if not out or min(out) < 1:
    raise argparse.ArgumentTypeError(f"expected positive integers, got {v!r}")
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--suite", default="smoke", choices=["smoke", "decode", "prefill", "all"])
  p.add_argument("--out", default="bench_weightonly_out")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--repeat-ms", type=float, default=50.0)
  p.add_argument("--rounds", type=int, default=3,
                 help="interleaved rounds over the impls (each of --repeats samples), per decode "
                      "(shape, M) and per prefill shape")
  p.add_argument("--prefill-ms", default="4096",
                 help="prefill token counts M,M (default 4096); e.g. 32,64,128,256 to place "
                      "weightonly.PREFILL_MIN_M with impls ours_nvfp4_kernel,ours_nvfp4_dequant")
  p.add_argument("--impls", default="ours_nvfp4,ours_mxfp4,ours_mxfp6_e2m3,ours_mxfp6_e3m2,ours_fp8,"
                 "xla_fp8,bf16,xla_dequant_nvfp4,ours_mxfp4_fp8,ours_mxfp6_e2m3_fp8,ours_mxfp6_e3m2_fp8,"
                 "ours_nvfp4_fp8r",
                 help="the *_fp8 impls (FP8 activations through the FP8 prefill route) run in the "
                      "prefill suite only")
  p.add_argument("--glue", choices=GLUES, default="prefix",
                 help="decode chains: how out (M, N) becomes the next x (M, K) (see _to_k; "
                      "'columns' is the older method)")
  p.add_argument("--decode-shapes", type=_nk_list, default=DECODE_SHAPES,
                 help="decode suite: N:K list, e.g. 28672:8192,8192:8192 (as bench_fp8.py)")
  p.add_argument("--decode-ms", type=_int_list, default=DECODE_MS,
                 help="decode suite: token counts, e.g. 1,4,16")
  p.add_argument("--prefill-shapes", type=_nk_list, default=PREFILL_SHAPES,
                 help="prefill suite: N:K list (default 8192:8192,28672:8192)")
  args = p.parse_args(argv)
  impls = args.impls.split(",")
  rows, fails = [], []
  dev = jax.devices()[0]
  print(f"device: {dev.device_kind}, jax {jax.__version__}", flush=True)
  if args.suite == "smoke":
    bench_decode(args, rows, fails, ((4096, 4096),), (1, 16), [i for i in impls if i not in PREFILL_ONLY])
  if args.suite in ("decode", "all"):
    bench_decode(args, rows, fails, args.decode_shapes, args.decode_ms,
                 [i for i in impls if i not in PREFILL_ONLY])
  if args.suite in ("prefill", "all"):
    for m in (int(v) for v in args.prefill_ms.split(",") if v):
      bench_prefill(args, rows, fails, args.prefill_shapes,
                    [i for i in impls if i != "xla_dequant_nvfp4"], m=m)
  os.makedirs(args.out, exist_ok=True)
  meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              device=dev.device_kind, jax=jax.__version__, chain=CHAIN, suite=args.suite, glue=args.glue)
  with open(os.path.join(args.out, "bench_weightonly.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows, failures=fails), f, indent=1, default=str)
  md = (f"# FP4 / FP6 weight-only GEMM ({meta['device']}, {meta['date']}, jax {meta['jax']})\n\n"
        + _table(rows, "decode") + "\n" + _prefill_table(rows))
  md += "\n".join(["", *md_tail([], fails)])
  with open(os.path.join(args.out, "bench_weightonly.md"), "w") as f:
    f.write(md)
  print(md)
  return 1 if fails else 0


if __name__ == "__main__":
  sys.exit(main())
