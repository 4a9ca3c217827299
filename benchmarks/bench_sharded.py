#!/usr/bin/env python3
"""Sharded GEMM benchmark: one M x N x K GEMM split over D devices of one host (tensor parallel,
column- and row-parallel), bf16, XLA's FP8 and jax-gmma's formats, one process.

    python3 -P benchmarks/bench_sharded.py [--devices 1,2,4] [--m M --n N --k K] [--out DIR]
        [--formats ...] [--splits column,row] [--llama] [--repeats N] [--repeat-ms MS]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
      python3 -P benchmarks/bench_sharded.py --tiny --llama --out DIR     # CPU smoke, < 1 min
    python3 -P benchmarks/bench_sharded.py --render-only --out DIR        # re-render DIR's JSON

Writes DIR/bench_sharded.json (every cell: metadata, measurements, checks, collectives),
DIR/bench_sharded.md (tables, also printed) and DIR/bench_sharded.png (TFLOP/s against D per
format and split; only when matplotlib is importable). Exit status 1 when a correctness check
of ours fails or a cell of ours crashes (after writing everything; the other cells still run),
2 on bad usage. A cell where ours has no kernel (jax_gmma.KernelUnavailable) is recorded as
unavailable with the reason. NCCL_NVLS_ENABLE=0 is set unless already set (NVLink multicast
off).

Devices: D in --devices (default 1,2,4) among the visible devices (the others are noted and
skipped); a 1-D mesh of the first D devices, axis "d". On a CPU, virtual devices:
XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts.

Splits (x (M, K) bf16 in, y (M, N) bf16 out; the weight (N, K))
  column   the weight split by output features N (its scales with it: per-channel scales, 128-row
           block scales, a PackedWeight's 16-row strips), x replicated; y split by N (no
           collective)
  row      the weight and x split by K; every device a partial product, summed (y replicated):
           XLA's all-reduce for bf16 / xla_fp8; jax_gmma.sharding's float32 partials and psum for
           fp8_channel / fp8_128x128 (their partition rules keep K split); mxfp8 and the FP4
           weight-only kernel keep K whole, so their row split is jax.shard_map over per-device
           weights (the (N, K) weight cut into D K-ranges, each quantized / prepared on its own,
           stacked, the stack split over "d") and an explicit psum of float32 partials ("how":
           shard_map)
  (D = 1: one cell per format, split "none".)

Formats
  bf16          lax.dot_general(x, w bf16, NT, preferred_element_type=bf16)
  xla_fp8       XLA's FP8 GEMM: x quantized per token in plain jnp (e4m3, amax / 448), the fp8
                operands straight into lax.dot_general(x8, w8, NT, preferred_element_type=bf16)
                (cuBLASLt FP8 on Hopper), then the per-token and per-channel scales multiplied in
  fp8_channel   jax_gmma.dot(x, quantize(w, "fp8_channel")): x quantized per token on the fly
  fp8_128x128   jax_gmma.dot(x, quantize(w, "fp8_128x128")): x quantized to fp8_1x128
  mxfp8         jax_gmma.dot(x, quantize(w, "mxfp8")): x quantized to mxfp8
  wo_nvfp4      jax_gmma.dot(x, weightonly.prepare(w, "nvfp4")): the FP4 weight-only GEMM, x bf16

Method
  * Correctness first: each cell's compiled program runs once on the first input set and up to
    --check-rows rows of its output (first, last, random) are compared with a float64 product
    of the cell's own dequantized operands (x quantized and dequantized as the format does, the
    weight dequantized; numpy on the host): rel_err = ||out - ref||_F / ||ref||_F against
    TOLERANCES. A cell of ours that fails is not timed (exit 1).
  * Timing (bench_fp8.time_jax): the program compiled ahead of time (jit with the operands placed
    by NamedSharding and out_shardings fixed), warmed up on every input set, then --repeats
    samples of back-to-back calls (each >= --repeat-ms), median. Input sets (x and the weight)
    rotate so that consecutive calls never find their operands in L2: max(2, ceil(200 MB / the
    bf16 operand bytes of one device at the largest D)) sets, at most 8.
  * The compiled program's collectives (all-reduce, all-gather, ...) are recorded per cell, and
    any jax_gmma ShardingWarning (a split a rule could not keep: the operand gathered) with it.
  * --llama: examples/llama_decode.py's decode loop (its run(); --llama-preset, default
    llama3-70b, --llama-layers 2) with --tensor-parallel D for each D: tokens/s per format.

Fields (JSON rows, kind "gemm")
  median_us     per GEMM call; tflops = 2 M N K / time (the whole GEMM over all D devices)
  vs_bf16       t(bf16) / t(format) at the same D and split (> 1: faster than bf16)
  vs_xla_fp8    t(xla_fp8) / t(format) at the same D and split
  vs_1dev       t(format at D = 1) / t(format at D): the scaling
  rel_err       see Method; status ok | failed | unavailable | error, with "reason"
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast (NVLS) off for NCCL
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)
_EXAMPLES = os.path.join(os.path.dirname(_HERE), "examples")

# bench_fp8 sets XLA_PYTHON_CLIENT_PREALLOCATE=false and imports jax_gmma (from this checkout
# when it is not installed).
from bench_fp8 import (BF16, F32, F8, F8_MAX, TN, ROTATE_BYTES, RunBase, exit_code, list_arg,  # noqa: E402
                       md_tail, render_only, report_parser, save_plot, time_jax, write_report)

import datetime  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma import _backend  # noqa: E402
from jax_gmma.ops import weightonly  # noqa: E402
from jax_gmma.sharding import ShardingWarning  # noqa: E402

NAME = "bench_sharded"
AXIS = "d"
BASE, XLA = "bf16", "xla_fp8"
OURS = ("fp8_channel", "fp8_128x128", "mxfp8", "wo_nvfp4")
FORMATS = (BASE, XLA) + OURS
SPLITS = ("column", "row")
#: the activation format jax_gmma.dot quantizes x to, per weight format (None: x bf16 as is)
X_FORMAT = {"fp8_channel": "fp8_channel", "fp8_128x128": "fp8_1x128", "mxfp8": "mxfp8",
            "wo_nvfp4": None}
#: weight formats whose K the partition rules never split: row split by shard_map instead
K_WHOLE = ("mxfp8", "wo_nvfp4")
#: rel_err tolerance against the float64 product of the cell's own dequantized operands: bf16
#: output rounding (~2e-3), plus for the FP8 paths the accumulation order (cuBLASLt's fast
#: accumulation for XLA's FP8 dot) and, split by K, bf16 partial sums in XLA's all-reduce.
TOLERANCES = {**{f: 2e-2 for f in FORMATS}, BASE: 1e-2}
DEFAULT_MNK = (8192, 8192, 8192)
TINY_MNK = (64, 2048, 512)
DEVICES = (1, 2, 4)
MAX_SETS = 8
CHECK_ROWS = 64
LLAMA_FORMATS = ("bf16", "xla_fp8", "fp8_channel", "fp8_128x128", "wo:nvfp4")
TINY_LLAMA_FORMATS = ("bf16", "fp8_channel")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


class Run(RunBase):
  def __init__(self, args):
    super().__init__(args)
    self.rng = np.random.default_rng(args.seed)
    self.check_rows = None  # the output rows every cell checks (bench_gemms)
    self.refs: dict = {}    # (format, K ranges) -> float64 reference rows

  def log(self, msg):
    print(msg, flush=True)

  def fail(self, msg):
    self.failures.append(msg)
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)


# -- the GEMMs --------------------------------------------------------------------------------

def quantize_per_token(x):
  """(M, K) -> (M, K) e4m3, (M,) float32 dequantization scales (amax / 448 per row)."""
  x32 = x.astype(F32)
  amax = jnp.max(jnp.abs(x32), axis=-1)
  scale = jnp.where(amax > 0, jnp.maximum(amax / F8_MAX, np.finfo(np.float32).tiny), 1.0)
  return jnp.clip(x32 / scale[:, None], -F8_MAX, F8_MAX).astype(F8), scale


def bf16_fn(x, w):
  return lax.dot_general(x, w, TN, preferred_element_type=BF16)


def xla_fp8_fn(x, w8, sw):
  x8, sx = quantize_per_token(x)
  y = lax.dot_general(x8, w8, TN, preferred_element_type=BF16)  # fp8 x fp8 -> cuBLASLt FP8
  return (y.astype(F32) * sx[:, None] * sw[None, :]).astype(BF16)


def make_weight(fmt, w):
  """The weight of format ``fmt`` from the float (N, K) ``w``: a pytree (the GEMM's operand)."""
  if fmt == BASE:
    return w.astype(BF16)
  if fmt == XLA:
    q = jax_gmma.quantize(w, "fp8_channel")
    return (q.data, q.scales.reshape(-1))
  if fmt == "wo_nvfp4":
    return weightonly.prepare(w, "nvfp4")
  return jax_gmma.quantize(w, fmt)


def dequantized_weight(fmt, w) -> np.ndarray:
  """float64 (N, K): the weight ``make_weight(fmt, w)`` multiplies (quantized, dequantized)."""
  if fmt == BASE:
    return np.asarray(w.astype(BF16).astype(F32), np.float64)
  if fmt == XLA:
    data, s = make_weight(fmt, w)
    return np.asarray(data.astype(F32), np.float64) * np.asarray(s, np.float64)[:, None]
  # (wo_nvfp4: weightonly.prepare lays out exactly quantize(w, "nvfp4"))
  q = jax_gmma.quantize(w, "nvfp4" if fmt == "wo_nvfp4" else fmt)
  return np.asarray(jax_gmma.dequantize(q, F32), np.float64)


def dequantized_x(fmt, x) -> np.ndarray:
  """float64 (M, K): x as the format's GEMM multiplies it."""
  if fmt == XLA:
    x8, sx = quantize_per_token(x)
    return np.asarray(x8.astype(F32), np.float64) * np.asarray(sx, np.float64)[:, None]
  xf = X_FORMAT.get(fmt)
  if xf is None:
    return np.asarray(x.astype(F32), np.float64)
  return np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x, xf), F32), np.float64)


def gemm_fn(fmt, treedef):
  """y = x @ w.T for the format: (x, *weight leaves) -> (M, N) bf16."""
  if fmt == BASE:
    return lambda x, w: bf16_fn(x, w)
  if fmt == XLA:
    return lambda x, w8, sw: xla_fp8_fn(x, w8, sw)
  return lambda x, *leaves: jax_gmma.dot(x, jax.tree.unflatten(treedef, leaves), out_dtype=BF16)


def shard_map_rows_fn(fmt, treedef_local, mesh):
  """The row split of a weight whose K the partition rules keep whole: per-device weights (the
  stacked K ranges, leading axis split over the mesh), float32 partials, psum."""
  def body(x, *leaves):
    w = jax.tree.unflatten(treedef_local, [leaf[0] for leaf in leaves])
    return lax.psum(jax_gmma.dot(x, w, out_dtype=F32), AXIS)

  def fn(x, *leaves):
    y = jax.shard_map(body, mesh=mesh, in_specs=(P(None, AXIS),) + (P(AXIS),) * len(leaves),
                      out_specs=P())(x, *leaves)
    return y.astype(BF16)
  return fn


def _split_spec(shape, axis):
  return P(*[AXIS if a == axis else None for a in range(len(shape))])


def leaf_specs(leaves, split, how):
  """PartitionSpecs of the weight's leaves: column -> axis 0 of every leaf with more than one
  row (data, per-channel / block scales, strips; a per-tensor scale stays whole); row ->
  axis 1 of every 2-D+ leaf with more than one column (data, K-block scales; per-channel scales
  stay whole); row by shard_map -> the stacked leading axis."""
  out = []
  for leaf in leaves:
    shape = tuple(leaf.shape)
    if split == "none":
      out.append(P())
    elif how == "shard_map":
      out.append(_split_spec(shape, 0))
    elif split == "column":
      out.append(_split_spec(shape, 0) if shape and shape[0] > 1 else P())
    else:
      out.append(_split_spec(shape, 1) if len(shape) >= 2 and shape[1] > 1 else P())
  return out


def hlo_collectives(text: str) -> dict:
  """op -> count in a compiled program's HLO (async -start ops counted once)."""
  out = {}
  for op in COLLECTIVES:
    n = len(re.findall(rf"\s{op}(?:-start)?\(", text))
    if n:
      out[op] = n
  return out


# -- one cell ---------------------------------------------------------------------------------

def _mesh(d):
  return jax.make_mesh((d,), (AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:d])


def _weights(fmt, w, d, how):
  """(the weight of one input set, the tree structure of one device's weight under shard_map
  or None). shard_map: the D K ranges quantized / prepared one by one, their leaves stacked."""
  if how != "shard_map":
    return make_weight(fmt, w), None
  kk = w.shape[1] // d
  parts = [make_weight(fmt, w[:, i * kk:(i + 1) * kk]) for i in range(d)]
  leaves = [jnp.stack(ls) for ls in zip(*(jax.tree.leaves(p) for p in parts))]
  local = jax.tree.structure(parts[0])
  return jax.tree.unflatten(local, leaves), local


def bench_cell(run: Run, fmt: str, d: int, split: str, m: int, n: int, k: int, sets_w, sets_x):
  how = "shard_map" if (split == "row" and fmt in K_WHOLE) else ("partitioner" if d > 1 else "single")
  row = dict(kind="gemm", format=fmt, family="ours" if fmt in OURS else "peer", devices=d,
             split=split, how=how, m=m, n=n, k=k, tolerance=TOLERANCES[fmt])
  run.rows.append(row)
  mesh = _mesh(d)
  t0 = time.perf_counter()
  try:
    arg_sets, treedef_local = [], None
    for i, (w, x) in enumerate(zip(sets_w, sets_x)):
      wt, treedef_local = _weights(fmt, w, d, how)
      leaves = jax.tree.leaves(wt)
      if i == 0:
        treedef = jax.tree.structure(wt)
        specs = leaf_specs(leaves, split, how)
        x_spec = P(None, AXIS) if split == "row" else P()
        row["weight_bytes_per_device"] = int(sum(
            np.prod(NamedSharding(mesh, s).shard_shape(tuple(lf.shape))) * np.dtype(lf.dtype).itemsize
            for lf, s in zip(leaves, specs)))
      placed = [jax.device_put(x, NamedSharding(mesh, x_spec))] + [
          jax.device_put(lf, NamedSharding(mesh, s)) for lf, s in zip(leaves, specs)]
      arg_sets.append(tuple(placed))
    fn = shard_map_rows_fn(fmt, treedef_local, mesh) if how == "shard_map" else gemm_fn(fmt, treedef)
    out_spec = P(None, AXIS) if split == "column" else P()
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", ShardingWarning)
      compiled = jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec)).lower(*arg_sets[0]).compile()
    row["sharding_warnings"] = sorted({str(w.message) for w in caught if issubclass(w.category, ShardingWarning)})
    text = compiled.as_text() or ""
    row["collectives"] = hlo_collectives(text)
    row["custom_calls"] = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    if fmt in OURS:
      row["path"] = "kernel" if any(c.startswith("jax_gmma") for c in row["custom_calls"]) else "reference"
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    # correctness first: up to CHECK_ROWS rows of set 0 against float64
    rows_idx = run.check_rows
    got = np.asarray(compiled(*arg_sets[0])[jnp.asarray(rows_idx)].astype(F32), np.float64)
    ranges = d if how == "shard_map" else 1  # the weight quantized as `ranges` K ranges
    ref = run.refs.get((fmt, ranges))
    if ref is None:
      xd = dequantized_x(fmt, sets_x[0])[rows_idx]
      kk = k // ranges
      ref = sum(xd[:, i * kk:(i + 1) * kk] @ dequantized_weight(fmt, sets_w[0][:, i * kk:(i + 1) * kk]).T
                for i in range(ranges))
      run.refs[(fmt, ranges)] = ref
    row["rel_err"] = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300))
    row["finite"] = bool(np.all(np.isfinite(got)))
    if not row["finite"] or row["rel_err"] > TOLERANCES[fmt]:
      row["status"] = "failed"
      row["reason"] = f"rel_err {row['rel_err']:.3g} > {TOLERANCES[fmt]} (or non-finite)"
      msg = f"{fmt} D={d} {split}: {row['reason']}"
      if fmt in OURS:
        run.fail(msg)
      else:
        run.notes.append(f"peer {msg}")
      return row
    stats = time_jax(compiled, arg_sets, run.args.repeats, run.target_s)
    row.update(stats)
    row["tflops"] = 2.0 * m * n * k / (row["median_us"] * 1e-6) / 1e12
    row["status"] = "ok"
  except jax_gmma.KernelUnavailable as e:
    row.update(status="unavailable", reason=str(e).splitlines()[0][:300])
  except Exception as e:  # noqa: BLE001 - one cell must not take the others down
    row.update(status="error", reason=f"{type(e).__name__}: {str(e).strip()[:300]}")
    if fmt in OURS:
      run.fail(f"{fmt} D={d} {split} crashed:\n{traceback.format_exc()}")
    else:
      run.notes.append(f"peer {fmt} D={d} {split} failed: {row['reason']}")
  finally:
    gc.collect()
  return row


def bench_gemms(run: Run, devices, m, n, k):
  a = run.args
  per_dev = (m * k * 2 + n * k * 2) / max(devices)  # bf16 operands of the smallest share
  n_sets = int(min(MAX_SETS, max(2, math.ceil(ROTATE_BYTES / per_dev))))
  run.check_rows = np.unique(np.concatenate([[0, m - 1], run.rng.integers(0, m, CHECK_ROWS)]))[:CHECK_ROWS]
  keys = jax.random.split(jax.random.PRNGKey(a.seed), 2 * n_sets)
  sets_w = [jax.random.normal(keys[i], (n, k), F32) / math.sqrt(k) for i in range(n_sets)]
  sets_x = [jax.random.normal(keys[n_sets + i], (m, k), F32).astype(BF16) for i in range(n_sets)]
  run.log(f"GEMM {m} x {n} x {k}; {n_sets} input sets rotated; devices {list(devices)}")
  for d in devices:
    splits = ("none",) if d == 1 else a.splits
    for split in splits:
      for fmt in a.formats:
        r = bench_cell(run, fmt, d, split, m, n, k, sets_w, sets_x)
        run.log(f"  D={d} {split:6s} {fmt:12s} {r.get('status'):11s} "
                + (f"{r['median_us']:10.1f} us {r['tflops']:8.2f} TFLOP/s rel_err {r['rel_err']:.1e}"
                   if r.get("status") == "ok" else r.get("reason", ""))
                + (f"  collectives {r.get('collectives')}" if r.get("collectives") else "")
                + ("  SHARDING WARNING" if r.get("sharding_warnings") else ""))
  _add_ratios(run.rows)


def _add_ratios(rows):
  t = {(r["devices"], r["split"], r["format"]): r["median_us"]
       for r in rows if r.get("kind") == "gemm" and r.get("status") == "ok"}
  for r in rows:
    if r.get("kind") != "gemm" or r.get("status") != "ok":
      continue
    key = (r["devices"], r["split"])
    for peer, field in ((BASE, "vs_bf16"), (XLA, "vs_xla_fp8")):
      r[field] = t[key + (peer,)] / r["median_us"] if key + (peer,) in t else None
    one = t.get((1, "none", r["format"]))
    r["vs_1dev"] = one / r["median_us"] if one else None


def bench_llama(run: Run, devices):
  """examples/llama_decode.py's decode loop per D (its run(), --tensor-parallel D)."""
  if _EXAMPLES not in sys.path:
    sys.path.insert(0, _EXAMPLES)
  import llama_decode as ld  # noqa: E402 (needs flax)
  a = run.args
  shape = dict(ld.PRESETS[a.llama_preset])
  cfg = ld.LlamaConfig(layers=a.llama_layers, **shape)
  for d in devices:
    try:
      ld.check_tp_shapes(cfg, d)
      res = ld.run(a.llama_formats, cfg, batch=a.llama_batch, prompt_len=a.llama_prompt,
                   gen_tokens=a.llama_gen_tokens, repeats=a.llama_repeats, seed=a.seed,
                   progress=False, log=lambda *_: None, tp=d)
    except Exception as e:  # noqa: BLE001
      run.fail(f"llama_decode D={d} crashed:\n{traceback.format_exc()}")
      run.rows.append(dict(kind="llama", devices=d, status="error",
                           reason=f"{type(e).__name__}: {str(e)[:300]}"))
      continue
    for r in res["results"]:
      row = dict(kind="llama", devices=d, format=r["format"], status="ok",
                 preset=a.llama_preset, layers=a.llama_layers, batch=a.llama_batch,
                 tokens_per_s=r["tokens_per_s"], ms_per_token=r["ms_per_token"],
                 weight_bytes=r["weight_bytes"],
                 weight_bytes_per_device=r.get("weight_bytes_per_device", r["weight_bytes"]),
                 collectives={k: v["count"] for k, v in r.get("collectives", {}).items()},
                 sharding_warnings=r.get("sharding_warnings", []),
                 cos_vs_bf16=(r.get("logits_vs_bf16") or {}).get("cos_mean"))
      run.rows.append(row)
      run.log(f"  llama D={d} {r['format']:12s} {r['tokens_per_s']:10.1f} tok/s "
              f"{row['weight_bytes_per_device'] / 2**20:10.1f} MiB weights/device")
  one = {r["format"]: r["tokens_per_s"] for r in run.rows if r.get("kind") == "llama"
         and r["devices"] == 1 and r.get("status") == "ok"}
  for r in run.rows:
    if r.get("kind") == "llama" and r.get("status") == "ok":
      r["vs_1dev"] = r["tokens_per_s"] / one[r["format"]] if r["format"] in one else None


# -- output -----------------------------------------------------------------------------------

def _f(x, spec=".1f"):
  return "—" if x is None else format(x, spec)


def markdown(data) -> str:
  meta, rows = data["meta"], data["rows"]
  L = [f"# jax-gmma sharded GEMM benchmark ({meta['m']} x {meta['n']} x {meta['k']})", "",
       f"- date: {meta['date']}",
       f"- devices: {meta['device_count']} x {meta['device_kind']} (backend={meta['backend']}); "
       f"D in {meta['devices']}; ours runs the **{meta['ours_path']}** path",
       f"- jax {meta['jax']}, jaxlib {meta['jaxlib']}, jax-gmma {meta['jax_gmma']}; "
       f"XLA_FLAGS={meta['xla_flags']!r}; NCCL_NVLS_ENABLE={meta['nccl_nvls_enable']}",
       f"- median of {meta['repeats']} repeats (>= {meta['repeat_ms']} ms each), input sets rotated; "
       "TFLOP/s of the whole GEMM (all D devices); x bf16 / x xla_fp8: speed relative to those "
       "formats at the same D and split; x D=1: speed relative to the same format on one device",
       ""]
  if meta["backend"] != "gpu":
    L += ["> backend is not a GPU: ours is the pure-JAX reference and XLA computes fp8 dots in "
          "software; the times are not a performance measurement (plumbing check only).", ""]
  gem = [r for r in rows if r.get("kind") == "gemm"]
  if gem:
    L += ["| D | format | split | how | us | TFLOP/s | x bf16 | x xla_fp8 | x D=1 | rel_err | "
          "weights MiB/dev | collectives | status |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in gem:
      coll = ", ".join(f"{k} x{v}" for k, v in (r.get("collectives") or {}).items()) or "—"
      status = r.get("status", "?") + (" (gathered!)" if r.get("sharding_warnings") else "")
      L.append(f"| {r['devices']} | {r['format']} | {r['split']} | {r['how']} | "
               f"{_f(r.get('median_us'))} | {_f(r.get('tflops'), '.2f')} | "
               f"{_f(r.get('vs_bf16'), '.2f')} | {_f(r.get('vs_xla_fp8'), '.2f')} | "
               f"{_f(r.get('vs_1dev'), '.2f')} | {_f(r.get('rel_err'), '.1e')} | "
               f"{_f((r.get('weight_bytes_per_device') or 0) / 2**20, '.1f')} | {coll} | {status} |")
    L.append("")
  lla = [r for r in rows if r.get("kind") == "llama"]
  if lla:
    L += [f"## llama_decode ({meta.get('llama_preset')}, {meta.get('llama_layers')} layers, batch "
          f"{meta.get('llama_batch')}): decode tokens/s per D", "",
          "| D | format | tok/s | ms/tok | x D=1 | weights MiB/dev | collectives | status |",
          "|---|---|---|---|---|---|---|---|"]
    for r in lla:
      coll = ", ".join(f"{k} x{v}" for k, v in (r.get("collectives") or {}).items()) or "—"
      L.append(f"| {r['devices']} | {r.get('format', '—')} | {_f(r.get('tokens_per_s'))} | "
               f"{_f(r.get('ms_per_token'), '.2f')} | {_f(r.get('vs_1dev'), '.2f')} | "
               f"{_f((r.get('weight_bytes_per_device') or 0) / 2**20, '.1f')} | {coll} | "
               f"{r.get('status')} |")
    L.append("")
  reasons = [f"{r.get('format')} D={r['devices']} {r.get('split', '')}: {r['reason']}"
             for r in rows if r.get("reason")]
  if reasons:
    L += ["Reasons:", ""] + [f"{i + 1}. {x}" for i, x in enumerate(reasons)] + [""]
  L += md_tail(data["notes"], data["failures"])
  return "\n".join(L)


def plot(path, rows):
  """TFLOP/s against D, one panel per split (D = 1 in both). Returns why no plot was written
  (None when it was)."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except Exception as e:  # noqa: BLE001
    return f"plot skipped (matplotlib not importable: {type(e).__name__})"
  gem = [r for r in rows if r.get("kind") == "gemm" and r.get("status") == "ok"]
  if not gem:
    return "plot skipped (no GEMM cell ran)"
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
  for ax, split in zip(axes[0], SPLITS):
    for j, fmt in enumerate(FORMATS):
      pts = sorted((r["devices"], r["tflops"]) for r in gem
                   if r["format"] == fmt and r["split"] in (split, "none"))
      if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=fmt,
                color=plt.get_cmap("tab10")(j))
    ax.set_xlabel("devices D")
    ax.set_ylabel("TFLOP/s (whole GEMM)")
    ax.set_title(f"{split}-parallel", fontsize=10)
    ax.set_xticks(sorted({r["devices"] for r in gem}))
    ax.legend(fontsize=7)
  return save_plot(plt, fig, path)


# -- main -------------------------------------------------------------------------------------

def parse_args(argv=None):
  p = report_parser(__doc__, NAME)
  p.add_argument("--tiny", action="store_true",
                 help=f"M x N x K = {' x '.join(map(str, TINY_MNK))}, 2 repeats of >= 1 ms, the "
                      "tiny-tp llama preset (one layer): the CPU smoke run")
  p.add_argument("--devices", type=list_arg(int), default=DEVICES,
                 help="device counts D (default 1,2,4; those beyond the visible devices are skipped)")
  p.add_argument("--m", type=int, default=None, help=f"tokens M (default {DEFAULT_MNK[0]})")
  p.add_argument("--n", type=int, default=None, help=f"output features N (default {DEFAULT_MNK[1]})")
  p.add_argument("--k", type=int, default=None, help=f"contraction K (default {DEFAULT_MNK[2]})")
  p.add_argument("--formats", type=list_arg(str), default=FORMATS, help=f"comma list of {', '.join(FORMATS)}")
  p.add_argument("--splits", type=list_arg(str), default=SPLITS, help="column,row (default both)")
  p.add_argument("--repeats", type=int, default=None, help="timed repeats, median reported (default 10)")
  p.add_argument("--repeat-ms", type=float, default=None, help="minimum length of a repeat in ms (default 20)")
  p.add_argument("--llama", action="store_true",
                 help="also time examples/llama_decode.py's decode loop with --tensor-parallel D")
  p.add_argument("--llama-preset", default=None, help="llama_decode preset (default llama3-70b; --tiny: tiny-tp)")
  p.add_argument("--llama-layers", type=int, default=None, help="decoder layers (default 2; --tiny 1)")
  p.add_argument("--llama-formats", type=list_arg(str), default=None,
                 help=f"llama_decode formats (default {','.join(LLAMA_FORMATS)}; --tiny "
                      f"{','.join(TINY_LLAMA_FORMATS)})")
  p.add_argument("--llama-batch", type=int, default=1, help="sequences decoded together (default 1)")
  p.add_argument("--llama-prompt", type=int, default=None, help="prompt tokens (default 32; --tiny 4)")
  p.add_argument("--llama-gen-tokens", type=int, default=None, help="decode steps (default 64; --tiny 3)")
  p.add_argument("--llama-repeats", type=int, default=None, help="timed generations (default 3; --tiny 1)")
  p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  t = a.tiny
  mnk = TINY_MNK if t else DEFAULT_MNK
  a.m, a.n, a.k = (v if v is not None else d for v, d in zip((a.m, a.n, a.k), mnk))
  a.repeats = a.repeats or (2 if t else 10)
  a.repeat_ms = a.repeat_ms if a.repeat_ms is not None else (1.0 if t else 20.0)
  a.llama_preset = a.llama_preset or ("tiny-tp" if t else "llama3-70b")
  a.llama_layers = a.llama_layers or (1 if t else 2)
  a.llama_formats = a.llama_formats or (TINY_LLAMA_FORMATS if t else LLAMA_FORMATS)
  a.llama_prompt = a.llama_prompt or (4 if t else 32)
  a.llama_gen_tokens = a.llama_gen_tokens or (3 if t else 64)
  a.llama_repeats = a.llama_repeats or (1 if t else 3)
  for name, vals, allowed in (("--formats", a.formats, FORMATS), ("--splits", a.splits, SPLITS)):
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
      p.error(f"{name}: unknown or none: {', '.join(bad)} (choices: {', '.join(allowed)})")
  if not a.devices or min(a.devices) < 1:
    p.error("--devices: device counts >= 1")
  if min(a.m, a.n, a.k, a.repeats) < 1:
    p.error("--m, --n, --k, --repeats must be >= 1")
  for d in a.devices:
    if a.n % d or a.k % d:
      p.error(f"--devices {d}: N ({a.n}) and K ({a.k}) must be multiples of every D")
  return a


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.render_only:
    return render_only(args, NAME, markdown, plot)
  run = Run(args)
  visible = len(jax.devices())
  devices = tuple(sorted({d for d in args.devices if d <= visible}))
  skipped = sorted({d for d in args.devices if d > visible})
  if skipped:
    run.notes.append(f"D = {', '.join(map(str, skipped))} skipped: {visible} {run.backend} device(s) visible")
  if not devices:
    print(f"{NAME}: none of --devices {','.join(map(str, args.devices))} fits the {visible} visible "
          "device(s)", file=sys.stderr)
    return 2
  run.log(f"device: {visible} x {run.dev.device_kind} (backend={run.backend}), jax {jax.__version__}, "
          f"kernels built: {_backend.kernels_built()}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
  t_start = run.begin("jax_gmma.dot")
  try:
    bench_gemms(run, devices, args.m, args.n, args.k)
  except Exception:  # noqa: BLE001
    run.fail(f"GEMM cells crashed:\n{traceback.format_exc()}")
  if args.llama:
    bench_llama(run, devices)
  warned = sorted({f"{r['format']} D={r['devices']} {r['split']}" for r in run.rows if r.get("sharding_warnings")})
  if warned:
    run.notes.append("a jax_gmma ShardingWarning (an operand gathered, not split) in: " + "; ".join(warned))
  paths = sorted({r["path"] for r in run.rows if r.get("path")})
  meta = dict(
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      argv=sys.argv, backend=run.backend, device_kind=run.dev.device_kind, device_count=visible,
      devices=list(devices), python=platform.python_version(), jax=jax.__version__,
      jaxlib=jaxlib.__version__, jax_gmma=jax_gmma.__version__, numpy=np.__version__,
      kernels_built=_backend.kernels_built(), ours_path="/".join(paths) or "n/a",
      xla_flags=os.environ.get("XLA_FLAGS", ""), nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
      m=args.m, n=args.n, k=args.k, formats=list(args.formats), splits=list(args.splits),
      repeats=args.repeats, repeat_ms=args.repeat_ms, seed=args.seed, tolerances=TOLERANCES,
      llama=args.llama, llama_preset=args.llama_preset, llama_layers=args.llama_layers,
      llama_batch=args.llama_batch, llama_formats=list(args.llama_formats),
      wall_s=round(time.perf_counter() - t_start, 1))
  data = dict(meta=meta, rows=run.rows, notes=run.notes, failures=run.failures)
  md, png = write_report(args.out, NAME, data, markdown, plot, args.no_plot)
  print()
  print(md)
  print(f"wrote {args.out}/{NAME}.json, {NAME}.md{', ' + NAME + '.png' if png else ''} ({meta['wall_s']} s)")
  return exit_code(run.failures)


if __name__ == "__main__":
  sys.exit(main())
