#!/usr/bin/env python3
"""Grouped-GEMM (mixture-of-experts) benchmark: jax_gmma.ragged_dot on quantized expert weights
against jax.lax.ragged_dot in bf16, the FP8 spellings XLA offers a JAX user, and torch's grouped
GEMMs, one process, one GPU.

    python3 -P benchmarks/bench_moe.py [--presets deepseek-v3,qwen3-30b-a3b,...] [--out DIR]
    python3 -P benchmarks/bench_moe.py --quick --out DIR        # tiny shapes, < 1 min on a CPU
    python3 -P benchmarks/bench_moe.py --render-only --out DIR  # re-render DIR's JSON (md + PNG)
    python3 -P benchmarks/bench_moe.py --merge DIR1,DIR2 --out DIR  # several runs as one report

Writes DIR/bench_moe.json (every cell: metadata, measurements, checks, reasons), DIR/bench_moe.md
(one table per preset and phase, also printed) and DIR/bench_moe.png (speed relative to
jax.lax.ragged_dot bf16 per cell; only when matplotlib is importable); the JSON and markdown are
rewritten after each cell (marked partial until the end), so a run stopped early keeps the cells
it finished. ``--report DIR`` is the
same as ``--out DIR``. Exit status 1 when a correctness check of ours fails or ours crashes
(after writing everything; the other cells still run), 2 on bad usage (a model preset on a
machine without a CUDA GPU: use --quick). A failing or unavailable peer is noted, not fatal.

Presets (the experts' SwiGLU MLP: gate/up fused (G, 2 x inter, hidden), down (G, hidden, inter))

  deepseek-v3     routed experts: 32 local experts of 256 (expert parallel over 8 devices),
                  top-8, hidden 7168, expert inter 2048 (native format fp8_128x128)
  qwen3-30b-a3b   128 experts, top-8, hidden 2048, inter 768
  mixtral-8x7b    8 experts, top-2, hidden 4096, inter 14336
  gpt-oss-20b     32 experts, top-4, hidden 2880, inter 2880 (native format MXFP4: wo:mxfp4)
  tiny            8 experts, top-2, hidden 256, inter 128 (--quick; the only preset on a CPU)

Cells: tokens T in --decode-tokens (1, 16, 64) and --prefill-tokens (4096, 16384), routing in
--routings (uniform, zipf). One device's grouped GEMM takes M = T x top_k x G / E rows: the rows
an expert-parallel layer delivers to the device's G of E experts (DeepSeek-V3: 8 x 32 / 256 = 1
row per token; the other presets hold every expert, M = T x top_k). The routing runs on the
device as a model's does (examples/moe.py's router: a float32 top-(top_k x G / E) over the G
experts, then the rows sorted by expert and counted into group_sizes): ``uniform`` on random
tokens and a random router; ``zipf`` the same logits plus log(1 / rank^s), s = --zipf (1.2),
the ranks a fixed random permutation of the experts (a few hot experts, a long cold tail).

Implementations ("impl"; bf16 activations in, bf16 out)
  ours_fp8_128x128   jax_gmma.ragged_dot(x, w, group_sizes): w = fp8_128x128 experts, x quantized
                     on the fly to fp8_1x128
  ours_fp8_channel   ... fp8_channel experts, x per token (fp8_channel)
  ours_mxfp8         ... mxfp8 experts and activations
  ours_wo_mxfp4      ... MXFP4 experts as a PackedWeight (jax.vmap of weightonly.prepare), x bf16
  ours_wo_nvfp4      ... NVFP4 experts as a PackedWeight, x bf16
                     (all five: the weights quantized per expert as examples/moe.py does; on a
                     platform where ours has no kernel -- jax_gmma.KernelUnavailable -- the cell
                     is recorded as unavailable with the reason, unless --allow-reference runs the
                     pure-JAX reference; "path" says which ran)
  dense_fp8_128x128  (prefill cells) the anchor of the prefill goal: jax_gmma.dot, our dense GEMM,
                     of all M rows against one expert's fp8_128x128 weight (x fp8_1x128): the
                     same FLOPs as the grouped GEMM in one dense GEMM; "vs dense" of
                     ours_fp8_128x128 = t(dense) / t(ours) (no quant err: the rows do not
                     multiply their own experts)
  dense_fp8_channel  ... against one expert's fp8_channel weight (x per token): the anchor of
                     ours_fp8_channel
  lax_ragged_dot_bf16  jax.lax.ragged_dot(x, w (G, K, N) bf16, group_sizes,
                     preferred_element_type=bf16): what a JAX MoE runs without quantization
  xla_fp8_loop       a Python loop over the experts of FP8 dot_generals (XLA's FP8 GEMM): x
                     quantized per token, each expert's window of C rows (lax.dynamic_slice at its
                     group's start) times its per-channel e4m3 weight, scaled, written back masked
  xla_fp8_capacity   the capacity-padded batched spelling: the rows gathered into a (G, C, K)
                     buffer (per-token e4m3), one batched FP8 dot_general against (G, N, K),
                     the results gathered back
  xla_fp8_gather     (decode cells, when M x N x K <= 1 GiB) each row's expert weight gathered,
                     a batched (M, 1, K) x (M, N, K) FP8 dot_general: reads only the active
                     experts' weights, the usual decode spelling
                     (C, the capacity, is the largest group of the measured routings, rounded up
                     to 8 rows: the smallest buffer that drops no row, an oracle a model does
                     not have; the best case of these spellings. XLA's default precision: on a
                     GPU cuBLASLt's FP8 GEMM with fast accumulation, float32 out, then scaled
                     and rounded to bf16 once.)
  torch_grouped_mm_bf16      torch._grouped_mm(x, w.transpose(-2, -1), offs=cumsum(sizes)),
                     bf16; on a CUDA GPU when torch is importable and has it (else a note)
  torch_scaled_grouped_mm_fp8  torch._scaled_grouped_mm(x_e4m3, w_e4m3.transpose(-2, -1),
                     per-token scales, per-channel scales, offs=..., out_dtype=bf16): torch's
                     own data (same distributions, the same group sizes), chains captured in a
                     CUDA graph
  "best XLA FP8" of a cell is the fastest of the xla_fp8_* rows that ran.

Method
  * Correctness first: before a cell is timed, each impl runs one grouped GEMM of each shape
    (gate/up and down) on fresh random inputs (a fresh routing, fresh activations; the timed
    weights) and up to 24 rows (the first, last and random rows of the largest, first and last
    non-empty groups) are compared with a float64 product of the impl's own dequantized
    operands (numpy on the host): rel_err = ||out - ref||_F / ||ref||_F, per-impl tolerance
    (TOLERANCES). An impl that fails is not timed (ours failing: exit 1). quant_err compares the
    same rows with the float64 product of the unquantized bf16 operands: what the format costs
    (reported, not checked).
  * Timing: each cell is a chain of --layers (decode, 8) or --prefill-layers (prefill, 2) expert
    MLPs in one jitted program -- examples/moe.py's expert_mlp (grouped GEMM gate/up, SwiGLU,
    grouped GEMM down) then an RMS normalization of the rows, the next layer's input -- so the
    grouped GEMMs depend on each other and XLA cannot merge calls. Distinct weight sets are
    cycled so that consecutive layers never find their active experts' weights in the 60 MB L2
    (enough sets for >= 200 MB of active FP8 weights per cycle, at most --weight-budget-gb of
    bf16 weights). Two input sets (two routings of fresh tokens) alternate. Timing loop
    (bench_fp8.time_jax): every program compiled ahead of time and warmed up on every input set,
    then repeats of back-to-back calls, median. On a GPU 1 s of bf16 matmuls first.
  * Impls run one after the other per preset (each builds, times and frees its weights).

Fields (JSON rows)
  median_us          per grouped GEMM: chain time / (2 x layers) (the SwiGLU and normalization
                     glue included, the same for every impl)
  tflops             active FLOPs: 2 x M x (2 x inter x hidden + hidden x inter) per layer / time
  gbps               (decode) bytes of the active experts' weights (experts with rows, in the
                     impl's format, scales included) per layer / time per layer
  vs_bf16            t(lax_ragged_dot_bf16) / t(impl): > 1 means impl is faster
  vs_best_xla_fp8    t(best XLA FP8 spelling) / t(impl)
  status             ok | unavailable | skipped | failed | error, with "reason"
  path               ours: kernel | reference
  active_experts     experts with at least one row (mean over the input sets); max_group
"""
from __future__ import annotations

import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)
_EXAMPLES = os.path.join(os.path.dirname(_HERE), "examples")
if _EXAMPLES not in sys.path:  # examples/moe.py: the router, the expert MLP, expert quantization
  sys.path.insert(0, _EXAMPLES)

# bench_fp8 sets XLA_PYTHON_CLIENT_PREALLOCATE=false (torch shares the GPU) and imports jax_gmma
# (from this checkout when it is not installed).
from bench_fp8 import (F8, BF16, F32, F8_MAX, TN, ROTATE_BYTES, RunBase, TorchPeer, compile_jax,  # noqa: E402
                       exit_code, list_arg, md_tail, render_only, report_parser, save_plot, time_jax,
                       torch_rows_e4m3, write_report)

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
from jax import lax  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma import _backend  # noqa: E402
from jax_gmma.ops import grouped  # noqa: E402

import moe as moe_example  # noqa: E402  (examples/moe.py)

NAME = "bench_moe"


@dataclasses.dataclass(frozen=True)
class Preset:
  name: str
  experts: int        # G: the experts of one device (the grouped GEMM's groups)
  total_experts: int  # E: the model's experts
  top_k: int
  hidden: int
  inter: int
  native: str = "—"   # the format the released checkpoint uses

  @property
  def local_k(self) -> int:
    """Rows per token on this device: top_k x G / E (a whole number for every preset)."""
    return self.top_k * self.experts // self.total_experts

  def rows(self, tokens: int) -> int:
    return tokens * self.local_k

  def shapes(self):
    """(name, N, K) of the two grouped GEMMs of the expert MLP."""
    return (("gate_up", 2 * self.inter, self.hidden), ("down", self.hidden, self.inter))


PRESETS = {p.name: p for p in (
    Preset("deepseek-v3", 32, 256, 8, 7168, 2048, "fp8_128x128"),
    Preset("qwen3-30b-a3b", 128, 128, 8, 2048, 768, "bf16"),
    Preset("mixtral-8x7b", 8, 8, 2, 4096, 14336, "bf16"),
    Preset("gpt-oss-20b", 32, 32, 4, 2880, 2880, "wo:mxfp4"),
    Preset("tiny", 8, 8, 2, 256, 128),
)}
MODEL_PRESETS = ("deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b")
DECODE_TOKENS = (1, 16, 64)
PREFILL_TOKENS = (4096, 16384)
ROUTINGS = ("uniform", "zipf")
QUICK_DECODE_TOKENS, QUICK_PREFILL_TOKENS = (4,), (64,)
DECODE_LAYERS, PREFILL_LAYERS, QUICK_LAYERS = 8, 2, 2
INPUT_SETS = 2
ZIPF_S = 1.2
WEIGHT_BUDGET_GB = 24.0
GATHER_MAX_BYTES = 1 << 30    # xla_fp8_gather: gathered fp8 weights per GEMM
CAPACITY_MAX_BYTES = 16 << 30  # xla_fp8_capacity: the (G, C, K) + (G, C, N) buffers
CHECK_EXPERTS_ROWS = 8        # rows checked per chosen expert (3 experts at most)

OURS = ("ours_fp8_128x128", "ours_fp8_channel", "ours_mxfp8", "ours_wo_mxfp4", "ours_wo_nvfp4")
#: our dense GEMM at the same FLOPs (prefill), and the grouped impl each one anchors
DENSE = {"dense_fp8_128x128": "ours_fp8_128x128", "dense_fp8_channel": "ours_fp8_channel"}
LAX_BF16 = "lax_ragged_dot_bf16"
XLA_FP8 = ("xla_fp8_loop", "xla_fp8_capacity", "xla_fp8_gather")
TORCH_BF16, TORCH_FP8 = "torch_grouped_mm_bf16", "torch_scaled_grouped_mm_fp8"
IMPLS = OURS + tuple(DENSE) + (LAX_BF16,) + XLA_FP8 + (TORCH_BF16, TORCH_FP8)
#: rel_err tolerance against the float64 product of the impl's own dequantized operands: bf16
#: output rounding (~2e-3) plus, for the FP8 paths, accumulation order (cuBLASLt's FP8 fast
#: accumulation for XLA's dots). The formats' own quantization error is quant_err, not checked.
TOLERANCES = {**{i: 2e-2 for i in IMPLS}, LAX_BF16: 1e-2, TORCH_BF16: 1e-2}
HIGHEST = lax.Precision.HIGHEST
F32_TINY = float(np.finfo(np.float32).tiny)


# -- quantization and the implementations ---------------------------------------------------

def q_rows(a):
  """Per-row (last axis) e4m3 quantization, as a JAX user writes it: (a_e4m3, scale (...,))."""
  af = a.astype(F32)
  s = jnp.maximum(jnp.max(jnp.abs(af), axis=-1) / F8_MAX, F32_TINY)
  return (af / s[..., None]).astype(F8), s


def row_groups(gs, m: int):
  """(group of each of the m rows (G for rows past sum(gs)), start of each group)."""
  end = jnp.cumsum(gs)
  return jnp.searchsorted(end, jnp.arange(m, dtype=end.dtype), side="right"), end - gs


def xla_fp8_loop(x, w, gs, *, cap):
  w8, sw = w
  m, k = x.shape
  x8, sx = q_rows(x)
  _, start = row_groups(gs, m)
  x8 = jnp.concatenate([x8, jnp.zeros((cap, k), F8)])  # every window fits
  sx = jnp.concatenate([sx, jnp.ones((cap,), F32)])
  out = jnp.zeros((m + cap, w8.shape[1]), BF16)
  for e in range(w8.shape[0]):
    xs = lax.dynamic_slice(x8, (start[e], 0), (cap, k))
    ss = lax.dynamic_slice(sx, (start[e],), (cap,))
    y = lax.dot_general(xs, w8[e], TN, preferred_element_type=F32)
    y = (y.astype(F32) * ss[:, None] * sw[e][None, :]).astype(BF16)
    cur = lax.dynamic_slice(out, (start[e], 0), (cap, out.shape[1]))
    keep = (jnp.arange(cap) < gs[e])[:, None]
    out = lax.dynamic_update_slice(out, jnp.where(keep, y, cur), (start[e], 0))
  return out[:m]


def xla_fp8_capacity(x, w, gs, *, cap):
  w8, sw = w
  m, k = x.shape
  g = w8.shape[0]
  x8, sx = q_rows(x)
  grp, start = row_groups(gs, m)
  x8 = jnp.concatenate([x8, jnp.zeros((1, k), F8)])  # row m: the padding
  sx = jnp.concatenate([sx, jnp.zeros((1,), F32)])
  slot = jnp.arange(cap)[None, :]
  idx = jnp.where(slot < gs[:, None], start[:, None] + slot, m)  # (G, C)
  y = lax.dot_general(x8[idx], w8, (((2,), (2,)), ((0,), (0,))), preferred_element_type=F32)
  y = (y.astype(F32) * sx[idx][..., None] * sw[:, None, :]).astype(BF16)  # (G, C, N)
  valid = grp < g
  gi = jnp.minimum(grp, g - 1)
  ci = jnp.clip(jnp.arange(m) - start[gi], 0, cap - 1)
  return jnp.where(valid[:, None], y[gi, ci], jnp.zeros((), BF16))


def xla_fp8_gather(x, w, gs, *, cap=None):
  del cap
  w8, sw = w
  m = x.shape[0]
  g = w8.shape[0]
  x8, sx = q_rows(x)
  grp, _ = row_groups(gs, m)
  gi = jnp.minimum(grp, g - 1)
  y = lax.dot_general(x8[:, None, :], w8[gi], (((2,), (2,)), ((0,), (0,))),
                      preferred_element_type=F32)[:, 0]
  y = (y.astype(F32) * sx[:, None] * sw[gi]).astype(BF16)
  return jnp.where((grp < g)[:, None], y, jnp.zeros((), BF16))


@dataclasses.dataclass(frozen=True)
class Impl:
  name: str
  family: str                 # ours | lax | xla_fp8
  spec: str                   # the expert format
  prepare: object             # master (G, N, K) bf16 -> the impl's weights
  gemm: object                # (x, w, gs, cap) -> (M, N) bf16
  x_dequant: object           # x (M, K) bf16 -> float32, as the impl quantizes it
  w_dequant: object           # (w, expert indices) -> float32 (S, N, K)
  uses_capacity: bool = False
  decode_only: bool = False
  prefill_only: bool = False


def _ours_x_format(spec):
  return {"fp8_128x128": "fp8_1x128", "fp8_channel": "fp8_channel", "mxfp8": "mxfp8"}.get(spec)


def _ours(name, spec):
  xfmt = _ours_x_format(spec)
  return Impl(
      name, "ours", spec,
      prepare=jax.jit(lambda w: moe_example.quantize_experts(w, spec)),
      gemm=lambda x, w, gs, cap=None: jax_gmma.ragged_dot(x, w, gs),
      x_dequant=lambda x: grouped.dequantized_x(jax_gmma.quantize(x, xfmt)) if xfmt else x.astype(F32),
      w_dequant=lambda w, idx: grouped.dequantized_w(jax.tree.map(lambda a: a[idx], w)))


def _dense(name, spec):
  """Our dense GEMM of all M rows against expert 0's weight (the group sizes unused): the
  grouped GEMM's FLOPs in one jax_gmma.dot."""
  xfmt = _ours_x_format(spec)

  def w_dequant(w, idx):
    one = jnp.moveaxis(jax_gmma.dequantize(w, F32), w.axis, -1)
    return jnp.broadcast_to(one, idx.shape + one.shape)

  return Impl(
      name, "ours", spec, prepare=jax.jit(lambda w: jax_gmma.quantize(w[0], spec)),
      gemm=lambda x, w, gs, cap=None: jax_gmma.dot(x, w, out_dtype=BF16, x_format=xfmt),
      x_dequant=lambda x: grouped.dequantized_x(jax_gmma.quantize(x, xfmt)),
      w_dequant=w_dequant, prefill_only=True)


def _x_dequant_rows(x):
  """x as the XLA spellings quantize it, dequantized to float32. The barrier keeps XLA on GPU
  (xla_allow_excess_precision) from folding convert(convert(v, e4m3), f32) back into v inside
  the check's program, which would compare against the unquantized activation."""
  q, s = lax.optimization_barrier(q_rows(x))
  return q.astype(F32) * s[:, None]


def _xla(name, fn, **kw):
  return Impl(
      name, "xla_fp8", "fp8 per channel (XLA)", prepare=jax.jit(q_rows),
      gemm=lambda x, w, gs, cap=None: fn(x, w, gs, cap=cap),
      x_dequant=_x_dequant_rows,
      w_dequant=lambda w, idx: w[0][idx].astype(F32) * w[1][idx][..., None], **kw)


def make_impls():
  impls = {n: _ours(n, s) for n, s in zip(OURS, ("fp8_128x128", "fp8_channel", "mxfp8", "wo:mxfp4",
                                                 "wo:nvfp4"))}
  impls.update({n: _dense(n, impls[of].spec) for n, of in DENSE.items()})
  impls[LAX_BF16] = Impl(
      LAX_BF16, "lax", "bf16", prepare=jax.jit(lambda w: jnp.swapaxes(w, 1, 2)),
      gemm=lambda x, w, gs, cap=None: lax.ragged_dot(x, w, gs, preferred_element_type=BF16),
      x_dequant=lambda x: x.astype(F32),
      w_dequant=lambda w, idx: jnp.swapaxes(w[idx], 1, 2).astype(F32))
  impls["xla_fp8_loop"] = _xla("xla_fp8_loop", xla_fp8_loop, uses_capacity=True)
  impls["xla_fp8_capacity"] = _xla("xla_fp8_capacity", xla_fp8_capacity, uses_capacity=True)
  impls["xla_fp8_gather"] = _xla("xla_fp8_gather", xla_fp8_gather, decode_only=True)
  return impls


# -- weights, routing and inputs ------------------------------------------------------------

def _expert_key(key, e):
  return jax.random.fold_in(key, e)


@functools.partial(jax.jit, static_argnames=("n", "k"))
def master_experts(key, experts, *, n, k):
  """bf16 (len(experts), N, K) normal / sqrt(K) weights of the given experts: expert e's values
  depend only on (key, e), so the check can regenerate any expert of a set."""
  def one(e):
    return (jax.random.normal(_expert_key(key, e), (n, k), F32) / math.sqrt(k)).astype(BF16)
  return jax.vmap(one)(experts)


def set_key(seed: int, preset: str, s: int, which: str):
  """The key of weight set ``s``'s gate_up or down experts."""
  base = jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(preset.encode()))
  return jax.random.fold_in(jax.random.fold_in(base, 1000 + s), ("gate_up", "down").index(which))


def tree_nbytes(tree) -> int:
  return int(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree)))


@functools.partial(jax.jit, static_argnames=("k", "g"))
def dispatch(x_tok, router, bias, *, k: int, g: int):
  """A model's routing on the device: examples/moe.py's float32 top-k router (logits x @ router
  + bias: the bias rides in as one more input feature of value 1), the rows sorted by expert,
  and group_sizes counted from the choices. Returns (rows (T k, H) bf16, group_sizes (G,))."""
  t = x_tok.shape[0]
  xa = jnp.concatenate([x_tok.astype(F32), jnp.ones((t, 1), F32)], axis=1)
  ra = jnp.concatenate([router, bias[None, :]], axis=0)
  ids, _ = moe_example.route(xa, ra, k)
  flat = ids.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  return x_tok[order // k], jnp.bincount(flat, length=g).astype(jnp.int32)


def routing_bias(preset: Preset, routing: str, zipf_s: float, seed: int):
  """(G,) float32 added to the router's logits: zeros (uniform) or log(1 / rank^s), the ranks a
  fixed random permutation of the experts (zipf)."""
  if routing == "uniform":
    return jnp.zeros((preset.experts,), F32)
  ranks = np.random.default_rng(seed + 17).permutation(preset.experts)
  return jnp.asarray(-zipf_s * np.log1p(ranks), F32)


def make_routed(preset: Preset, tokens: int, routing: str, key, *, zipf_s: float = ZIPF_S,
                seed: int = 0):
  """(rows (M, H) bf16 sorted by expert, group_sizes (G,) int32): fresh tokens (from ``key``)
  routed by the preset's router (fixed by ``seed``)."""
  router = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), 7 + preset.experts),
                             (preset.hidden, preset.experts), F32) / math.sqrt(preset.hidden)
  x_tok = jax.random.normal(key, (tokens, preset.hidden), F32).astype(BF16)
  return dispatch(x_tok, router, routing_bias(preset, routing, zipf_s, seed), k=preset.local_k,
                  g=preset.experts)


def cell_key(seed: int, preset: str, tokens: int, routing: str):
  tag = zlib.crc32(f"{preset}/{tokens}/{routing}".encode())
  return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


def capacity(gs_list, m: int) -> int:
  """The largest group of the routings, rounded up to 8 rows, at most M."""
  big = max(int(np.max(g)) for g in gs_list)
  return max(1, min(m, -(-big // 8) * 8))


def expert_chain(gemm, layers: int):
  """``layers`` expert MLPs (examples/moe.py's expert_mlp: gate/up, SwiGLU, down) on rows sorted
  by expert, each layer's output RMS-normalized into the next: one jitted program."""
  def chain(x, gs, wsets):
    d = len(wsets)
    for i in range(layers):
      wgu, wd = wsets[i % d]
      y = moe_example.expert_mlp(x, wgu, wd, gs, gemm).astype(F32)
      x = (y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)).astype(BF16)
    return x
  return chain


# -- run context ------------------------------------------------------------------------------

class Unavailable(Exception):
  """Ours cannot run here (KernelUnavailable, reference not allowed): the reason."""


class Skipped(Exception):
  """A peer is not run in this cell (the reason)."""


class Run(RunBase):
  def __init__(self, args):
    super().__init__(args)
    self.compiled = {}
    self.sources = {}  # the checks' unquantized operands, per cell
    self.impls = make_impls()
    self.torch = TorchPeer(enabled=not args.no_torch and self.on_gpu)
    if not self.on_gpu and not args.no_torch:
      self.torch.note = f"skipped (no CUDA GPU: backend={self.backend})"
    self.torch_impls = []
    if self.torch.ok:
      for name, attr in ((TORCH_BF16, "_grouped_mm"), (TORCH_FP8, "_scaled_grouped_mm")):
        if hasattr(self.torch.torch, attr):
          self.torch_impls.append(name)
        else:
          self.notes.append(f"{name}: skipped (torch {self.torch.version} has no torch.{attr})")
    elif self.torch.note:
      self.notes.append(f"torch peers: {self.torch.note}")

  def log(self, msg):
    print(msg, flush=True)

  def fail(self, msg):
    self.failures.append(msg)
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)

  def compile(self, impl: Impl, key, fn, args):
    """(compiled, custom calls, path): cached by ``key``. Ours on a CUDA GPU: lowered with the
    reference refused first, so that success means a kernel; KernelUnavailable becomes
    Unavailable unless --allow-reference (then the reference, path "reference")."""
    if key in self.compiled:
      return self.compiled[key]
    path = None
    if impl.family != "ours":
      c, calls = compile_jax(fn, args)
    elif not self.on_gpu:
      c, calls = compile_jax(fn, args)
      path = "reference"
    else:
      c, calls, path = compile_ours(fn, args, self.args.allow_reference)
    self.compiled[key] = (c, calls, path)
    return self.compiled[key]


def compile_ours(fn, args, allow_reference: bool):
  """Ours on a CUDA GPU: (compiled, calls, "kernel" | "reference"), or Unavailable(reason)."""
  try:
    with jax_gmma.allow_reference(False):
      c, calls = compile_jax(fn, args)
    return c, calls, "kernel"
  except jax_gmma.KernelUnavailable as e:
    if not allow_reference:
      raise Unavailable(str(e)) from None
  with jax_gmma.allow_reference(True):
    c, calls = compile_jax(fn, args)
  return c, calls, "reference"


# -- correctness ------------------------------------------------------------------------------

def sample_rows(gs: np.ndarray, rng) -> tuple:
  """(rows, their experts): the first, last and random rows of the largest, the first and the
  last non-empty groups, at most CHECK_EXPERTS_ROWS each."""
  end = np.cumsum(gs)
  start = end - gs
  nz = np.nonzero(gs)[0]
  rows = set()
  for e in dict.fromkeys((int(np.argmax(gs)), int(nz[0]), int(nz[-1]))):
    s, n = int(start[e]), int(gs[e])
    pick = {s, s + n - 1}
    if n > 2:
      inner = rng.choice(np.arange(s + 1, s + n - 1), size=min(n, CHECK_EXPERTS_ROWS) - 2,
                         replace=False)
      pick |= {int(r) for r in inner}
    rows |= pick
  rows = np.array(sorted(rows))
  return rows, np.searchsorted(end, rows, side="right")


def _padded(a, size):
  """``a`` (1-D, non-empty) padded to ``size`` by repeating its last entry (fixed shapes: one
  compiled check per impl and shape)."""
  return np.concatenate([a, np.full(size - len(a), a[-1], a.dtype)])


def rel_fro(a, b) -> float:
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def check_program(impl: Impl, preset: Preset, cap):
  """One jitted program: both grouped GEMMs of the expert MLP on the check's inputs, and what
  the float64 references need (the sampled rows' outputs and dequantized activations, the
  chosen experts' dequantized weights)."""
  def f(x, act, gs, weights, rows, sel):
    out = []
    for xin, w in zip((x, act), weights):
      y = impl.gemm(xin, w, gs, cap=cap)
      out.append((y[rows].astype(F32), impl.x_dequant(xin)[rows], impl.w_dequant(w, sel)))
    return out
  return f


@jax.jit
def _source_rows(x, act, rows):
  return x[rows].astype(F32), act[rows].astype(F32)


def source_products(run: Run, preset: Preset, check_in, rows, sel, pos):
  """Per grouped GEMM, the float64 products of the sampled rows with the unquantized bf16
  operands (the same for every impl of a cell: cached)."""
  key = (preset.name, id(check_in))
  if key not in run.sources:
    out = []
    for xs, (which, n, k) in zip(_source_rows(check_in[0], check_in[1], rows), preset.shapes()):
      ws = np.asarray(master_experts(set_key(run.args.seed, preset.name, 0, which), sel,
                                     n=n, k=k).astype(F32), np.float64)
      xs = np.asarray(xs, np.float64)[:len(pos)]
      src = np.empty((len(pos), n))
      for j in range(int(pos.max()) + 1):
        src[pos == j] = xs[pos == j] @ ws[j].T
      out.append(src)
    run.sources[key] = out
  return run.sources[key]


def check_impl(run: Run, impl: Impl, preset: Preset, m: int, weights, check_in, cap):
  """({gemm: (rel_err, quant_err)}, path) for the two grouped GEMMs of the expert MLP on the
  check's fresh inputs: sampled rows against float64 products on the host."""
  x, act, gs = check_in
  rows, experts = sample_rows(np.asarray(gs), np.random.default_rng(run.args.seed + m))
  sel, pos = np.unique(experts, return_inverse=True)
  rows_d = jnp.asarray(_padded(rows, 3 * CHECK_EXPERTS_ROWS), jnp.int32)
  sel_d = jnp.asarray(_padded(sel, 3), jnp.int32)
  args = (x, act, gs, weights[0], rows_d, sel_d)
  c, _, path = run.compile(impl, (impl.name, "check", m, cap), check_program(impl, preset, cap), args)
  sources = source_products(run, preset, check_in, rows_d, sel_d, pos)
  errs = {}
  r = len(rows)
  for (which, n, _), got, src in zip(preset.shapes(), c(*args), sources):
    y, xq, wq = (np.asarray(a, np.float64) for a in got)
    y, xq = y[:r], xq[:r]
    ref = np.empty((r, n))
    for j in range(len(sel)):
      ref[pos == j] = xq[pos == j] @ wq[j].T
    # quant_err: not for the dense anchors (every row multiplies expert 0, not its own)
    errs[which] = (rel_fro(y, ref) if np.all(np.isfinite(y)) else float("inf"),
                   None if impl.name in DENSE else rel_fro(y, src))
  return errs, path


# -- one preset ---------------------------------------------------------------------------------

def cells_of(args, preset: Preset):
  out = [("decode", t, r) for t in args.decode_tokens for r in args.routings]
  return out + [("prefill", t, r) for t in args.prefill_tokens for r in args.routings]


def bench_preset(run: Run, preset: Preset, progress=None):
  args = run.args
  cells = cells_of(args, preset)
  run.log(f"\n== {preset.name}: G={preset.experts} of E={preset.total_experts} experts, "
          f"top-{preset.top_k} ({preset.local_k} rows per token here), hidden {preset.hidden}, "
          f"inter {preset.inter}")
  inputs, checks, ghost = {}, {}, {}
  for phase, tokens, routing in cells:
    key = cell_key(args.seed, preset.name, tokens, routing)
    route = functools.partial(make_routed, preset, tokens, routing, zipf_s=args.zipf, seed=args.seed)
    sets = [route(jax.random.fold_in(key, s)) for s in range(args.sets)]
    inputs[(phase, tokens, routing)] = sets
    ghost[(phase, tokens, routing)] = [np.asarray(gs) for _, gs in sets]
    x, gs = route(jax.random.fold_in(key, 99))  # the check's fresh routing
    act = jax.random.normal(jax.random.fold_in(key, 98), (x.shape[0], preset.inter), F32).astype(BF16)
    checks[(phase, tokens, routing)] = (x, act, gs)
  fp8_expert = 3 * preset.inter * preset.hidden
  decode_active = [np.mean([np.count_nonzero(g) for g in ghost[c]]) for c in cells if c[0] == "decode"]
  # distinct weight sets: >= ROTATE_BYTES of active fp8 expert weights per cycle of the decode
  # chains (at most one per layer), within the bf16 budget
  d = max(1, min(args.layers, math.ceil(ROTATE_BYTES / (min(decode_active) * fp8_expert)))
          if decode_active else 1)
  d = max(1, min(d, int(args.weight_budget_gb * 2**30 // (2 * preset.experts * fp8_expert))))
  run.log(f"   {d} distinct weight set(s) cycled in the chains")
  for name in args.impls:
    if name in (TORCH_BF16, TORCH_FP8):
      if name in run.torch_impls:
        guard_torch(run, name, preset, cells, d, inputs, ghost, checks)
        _progress(run, preset, progress)
      continue
    impl = run.impls[name]
    try:
      t0 = time.perf_counter()
      weights = []
      for s in range(d):
        pair = []
        for which, n, k in preset.shapes():
          master = master_experts(set_key(args.seed, preset.name, s, which),
                                  jnp.arange(preset.experts), n=n, k=k)
          pair.append(impl.prepare(master))
          del master
        weights.append(tuple(pair))
      weights = tuple(weights)
      jax.block_until_ready(weights)
      run.log(f"  {name}: {d} weight set(s) ready in {time.perf_counter() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001
      for c in cells:
        record_error(run, impl, preset, c, e, ghost[c])
      continue
    for c in cells:
      try:
        bench_cell(run, impl, preset, c, weights, inputs[c], ghost[c], checks[c])
      except Exception as e:  # noqa: BLE001
        record_error(run, impl, preset, c, e, ghost[c])
      _progress(run, preset, progress)
    del weights
    run.compiled.clear()
    gc.collect()
  run.sources.clear()
  add_ratios([r for r in run.rows if r["preset"] == preset.name])


def _progress(run: Run, preset: Preset, progress):
  """After each cell: the preset's ratios so far, then ``progress()`` (the partial report)."""
  if progress is not None:
    add_ratios([r for r in run.rows if r["preset"] == preset.name])
    progress()


def base_row(impl_name, family, spec, preset: Preset, cell, gs_list):
  phase, tokens, routing = cell
  m = preset.rows(tokens)
  return dict(preset=preset.name, phase=phase, tokens=tokens, routing=routing, rows=m,
              experts=preset.experts, total_experts=preset.total_experts, top_k=preset.top_k,
              hidden=preset.hidden, inter=preset.inter, impl=impl_name, family=family, format=spec,
              active_experts=float(np.mean([np.count_nonzero(g) for g in gs_list])),
              max_group=int(max(np.max(g) for g in gs_list)), tol=TOLERANCES[impl_name])


def record_error(run: Run, impl: Impl, preset: Preset, cell, e, gs_list):
  row = base_row(impl.name, impl.family, impl.spec, preset, cell, gs_list)
  row.update(status="error", reason=f"{type(e).__name__}: {str(e).strip()[:400]}")
  run.rows.append(row)
  what = f"{preset.name} {cell[0]} T={cell[1]} {cell[2]} {impl.name}"
  if impl.family == "ours":
    run.fail(f"{what} crashed:\n{traceback.format_exc()}")
  else:
    run.notes.append(f"{what} failed: {row['reason'].splitlines()[0][:300]}")
    print(f"WARNING: {what}\n{traceback.format_exc()}", file=sys.stderr, flush=True)


def bench_cell(run: Run, impl: Impl, preset: Preset, cell, weights, sets, gs_list, check_in):
  args = run.args
  phase, tokens, routing = cell
  m = preset.rows(tokens)
  row = base_row(impl.name, impl.family, impl.spec, preset, cell, gs_list)
  label = f"  {phase:7s} T={tokens:<5d} {routing:7s} M={m:<6d} {impl.name:22s}"
  layers = args.layers if phase == "decode" else args.prefill_layers
  cap = capacity(gs_list, m) if impl.uses_capacity else None
  cap_check = capacity([np.asarray(check_in[2])], m) if impl.uses_capacity else None
  try:
    skip_reason(impl, preset, m, phase, max(cap or 0, cap_check or 0))
    errs, path = check_impl(run, impl, preset, m, weights, check_in, cap_check)
  except (Unavailable, Skipped) as e:
    row.update(status="unavailable" if isinstance(e, Unavailable) else "skipped", reason=str(e))
    run.rows.append(row)
    run.log(f"{label} {row['status']}: {str(e)[:160]}")
    return
  row.update(path=path, capacity=cap,
             rel_err=max(v[0] for v in errs.values()),
             quant_err=None if any(v[1] is None for v in errs.values()) else max(v[1] for v in errs.values()),
             rel_err_by_gemm={k: v[0] for k, v in errs.items()},
             quant_err_by_gemm={k: v[1] for k, v in errs.items()})
  if not row["rel_err"] <= row["tol"]:
    row.update(status="failed", reason=f"rel_err {row['rel_err']:.3e} > tolerance {row['tol']:.0e}")
    run.rows.append(row)
    msg = f"{preset.name} {phase} T={tokens} {routing} {impl.name}: {row['reason']}"
    if impl.family == "ours":
      run.fail(msg)
    else:
      run.notes.append(msg)
    run.log(f"{label} FAILED check: {row['reason']}")
    return
  chain = expert_chain(functools.partial(impl.gemm, cap=cap), layers)
  arg_sets = [(x, gs, weights) for x, gs in sets]
  c, calls, _ = run.compile(impl, (impl.name, "chain", layers, m, cap), chain, arg_sets[0])
  finite = bool(np.all(np.isfinite(np.asarray(c(*arg_sets[0]), np.float32))))
  stats = time_jax(c, arg_sets, args.repeats, run.target_s)
  fill_timing(row, preset, layers, len(weights), stats, calls,
              [tree_nbytes(w) / preset.experts for w in weights[0]])
  row.update(status="ok", finite=finite)
  run.rows.append(row)
  run.log(f"{label} {row['median_us']:10.2f} us/GEMM {row['tflops']:8.2f} TFLOP/s "
          + (f"{row['gbps']:7.0f} GB/s " if row.get("gbps") is not None else "")
          + f"rel_err {row['rel_err']:.1e} quant_err {_f(row['quant_err'], '.1e')} [{path or 'XLA'}]")


def skip_reason(impl: Impl, preset: Preset, m: int, phase: str, cap: int):
  if impl.decode_only and phase != "decode":
    raise Skipped("decode cells only")
  if impl.prefill_only and phase != "prefill":
    raise Skipped("prefill cells only")
  if impl.name == "xla_fp8_gather":
    big = max(m * n * k for _, n, k in preset.shapes())
    if big > GATHER_MAX_BYTES:
      raise Skipped(f"the gathered weights would be {big / 2**30:.1f} GiB per GEMM "
                    f"(limit {GATHER_MAX_BYTES / 2**30:.0f} GiB)")
  if impl.name == "xla_fp8_capacity":
    big = max(preset.experts * cap * (n + k) * 2 for _, n, k in preset.shapes())
    if big > CAPACITY_MAX_BYTES:
      raise Skipped(f"its (G, C, K) + (G, C, N) buffers would be {big / 2**30:.1f} GiB "
                    f"(C = {cap} rows; limit {CAPACITY_MAX_BYTES / 2**30:.0f} GiB)")


def fill_timing(row, preset: Preset, layers: int, n_sets: int, stats, calls, bytes_per_expert):
  chain_us = stats["median_us"]
  per = chain_us / (2 * layers)
  flops = 2 * row["rows"] * 3 * preset.inter * preset.hidden  # gate/up 2·I·H + down H·I, per layer
  row.update(layers=layers, grouped_gemms=2 * layers, distinct_weights=n_sets, chain_us=chain_us,
             median_us=per, min_us=stats["min_us"] / (2 * layers),
             max_us=stats["max_us"] / (2 * layers), iters=stats["iters"], repeats=stats["repeats"],
             tflops=flops * layers / (chain_us * 1e-6) / 1e12,
             weight_bytes_per_expert=float(sum(bytes_per_expert)), lowered_to=calls)
  if row["phase"] == "decode":
    active = row["active_experts"] * sum(bytes_per_expert)
    row.update(active_weight_bytes=active, gbps=active * layers / (chain_us * 1e-6) / 1e9)


def add_ratios(rows):
  cells = {}
  for r in rows:
    cells.setdefault((r["phase"], r["tokens"], r["routing"]), []).append(r)
  for group in cells.values():
    ok = {r["impl"]: r["median_us"] for r in group if r.get("status") == "ok"}
    xla = {i: t for i, t in ok.items() if i in XLA_FP8}
    best = min(xla, key=xla.get) if xla else None
    for r in group:
      if r.get("status") != "ok":
        continue
      r["vs_bf16"] = ok[LAX_BF16] / r["median_us"] if LAX_BF16 in ok else None
      r["vs_best_xla_fp8"] = xla[best] / r["median_us"] if best else None
      r["best_xla_fp8"] = best
      dense = next((d for d, of in DENSE.items() if of == r["impl"]), None)
      r["vs_dense"] = ok[dense] / r["median_us"] if dense in ok else None


# -- torch peers ---------------------------------------------------------------------------------

def guard_torch(run: Run, name, preset, cells, d, inputs, ghost, checks):
  tp = run.torch
  t = tp.torch
  impl = Impl(name, "torch", "bf16" if name == TORCH_BF16 else "fp8 per channel (torch)", None, None,
              None, None)
  try:
    weights = torch_weights(tp, name, preset, d)
  except Exception as e:  # noqa: BLE001
    for c in cells:
      record_error(run, impl, preset, c, e, ghost[c])
    return
  for c in cells:
    try:
      torch_cell(run, name, preset, c, weights, ghost[c], np.asarray(checks[c][2]))
    except Exception as e:  # noqa: BLE001
      record_error(run, impl, preset, c, e, ghost[c])
  del weights
  t.cuda.synchronize()
  tp.free()


def torch_weights(tp, name, preset, d):
  t = tp.torch
  out = []
  for _ in range(d):
    pair = []
    for _, n, k in preset.shapes():
      w = t.randn((preset.experts, n, k), device="cuda", generator=tp.gen) / math.sqrt(k)
      w = w.to(t.bfloat16)
      pair.append(w if name == TORCH_BF16 else torch_rows_e4m3(t, w))
      del w
    out.append(tuple(pair))
  return out


def _torch_gemm(t, name):
  if name == TORCH_BF16:
    return lambda x, w, offs: t._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=t.bfloat16)

  def gemm(x, w, offs):
    x8, sx = torch_rows_e4m3(t, x)
    return t._scaled_grouped_mm(x8, w[0].transpose(-2, -1), sx, w[1], offs=offs, out_dtype=t.bfloat16)
  return gemm


def _t_dequant_rows(t, name, a):
  """float64 values of a bf16 operand as the impl multiplies it (FP8: per-row e4m3 x scale)."""
  if name == TORCH_BF16:
    return a.double()
  q, s = torch_rows_e4m3(t, a)
  return q.double() * s.double().unsqueeze(-1)


def _t_dequant_expert(t, name, w, e: int):
  return w[e].double() if name == TORCH_BF16 else w[0][e].double() * w[1][e].double().unsqueeze(-1)


def torch_cell(run: Run, name, preset: Preset, cell, weights, gs_list, gs_check):
  tp, args = run.torch, run.args
  t = tp.torch
  phase, tokens, routing = cell
  m = preset.rows(tokens)
  row = base_row(name, "torch", "bf16" if name == TORCH_BF16 else "fp8 per channel (torch)", preset,
                 cell, gs_list)
  gemm = _torch_gemm(t, name)
  inter = preset.inter

  def offs_of(gs):
    return t.tensor(np.cumsum(gs), dtype=t.int32, device="cuda")

  # correctness: fresh activations, the check routing's group sizes, sampled rows in float64
  rows, experts = sample_rows(gs_check, np.random.default_rng(args.seed + m))
  rows_t = t.as_tensor(rows, device="cuda")
  errs = {}
  for (which, n, k), w in zip(preset.shapes(), weights[0]):
    x = t.randn((m, k), device="cuda", generator=tp.gen).to(t.bfloat16)
    y = gemm(x, w, offs_of(gs_check)).double()[rows_t]
    xd = _t_dequant_rows(t, name, x)[rows_t]
    ref = t.empty_like(y)
    for e in np.unique(experts):
      mine = t.as_tensor(np.nonzero(experts == e)[0], device="cuda")
      ref[mine] = xd[mine] @ _t_dequant_expert(t, name, w, int(e)).T
    errs[which] = float(t.linalg.norm(y - ref) / t.linalg.norm(ref))
  row.update(rel_err=max(errs.values()), rel_err_by_gemm=errs)
  if not row["rel_err"] <= row["tol"]:
    row.update(status="failed", reason=f"rel_err {row['rel_err']:.3e} > tolerance {row['tol']:.0e}")
    run.rows.append(row)
    run.notes.append(f"{preset.name} {phase} T={tokens} {routing} {name}: {row['reason']}")
    return
  layers = args.layers if phase == "decode" else args.prefill_layers

  def chain(x0, offs):
    x = x0
    for i in range(layers):
      wgu, wd = weights[i % len(weights)]
      h = gemm(x, wgu, offs).float()
      y = gemm((t.nn.functional.silu(h[:, :inter]) * h[:, inter:]).to(t.bfloat16), wd, offs).float()
      x = (y * t.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).to(t.bfloat16)
    return x

  fns, note = [], []
  for gs in gs_list:
    x0 = t.randn((m, preset.hidden), device="cuda", generator=tp.gen).to(t.bfloat16)
    offs = offs_of(gs)
    try:  # one CUDA graph per input set (XLA's command buffers do the same)
      fns.append(tp.capture(chain, x0, offs)[0].replay)
    except Exception as e:  # noqa: BLE001
      note.append(f"eager (graph capture failed: {type(e).__name__}: {str(e)[:120]})")
      fns.append(functools.partial(chain, x0, offs))
  stats = tp.time(lambda i: fns[i](), [(i,) for i in range(len(fns))], args.repeats, run.target_s)
  per_expert = [2 * n * k if name == TORCH_BF16 else n * k + 4 * n for _, n, k in preset.shapes()]
  fill_timing(row, preset, layers, len(weights), stats,
              ["torch._grouped_mm" if name == TORCH_BF16 else "torch._scaled_grouped_mm"], per_expert)
  row.update(status="ok", path="CUDA graph" if not note else "eager", note="; ".join(note))
  run.rows.append(row)
  run.log(f"  {phase:7s} T={tokens:<5d} {routing:7s} M={m:<6d} {name:22s} {row['median_us']:10.2f} "
          f"us/GEMM rel_err {row['rel_err']:.1e}")


# -- reports --------------------------------------------------------------------------------------

def _f(x, spec=".1f"):
  return "—" if x is None else format(x, spec)


def markdown(data) -> str:
  meta, rows = data["meta"], data["rows"]
  reasons = []

  def ref(reason):
    if reason not in reasons:
      reasons.append(reason)
    return f"[{reasons.index(reason) + 1}]"

  L = ["# jax-gmma grouped GEMM (mixture-of-experts) benchmark", ""]
  if not meta.get("complete", True):
    L += ["**Partial: the run stopped before its end; these are the cells it finished.**", ""]
  L += [f"- date: {meta['date']}",
        f"- device: {meta['device_kind']} (backend={meta['backend']}); jax {meta['jax']}, jaxlib "
        f"{meta['jaxlib']}, jax-gmma {meta['jax_gmma']}, torch {meta['torch'] or '—'}; "
        f"XLA_FLAGS={meta['xla_flags']!r}",
        f"- chains of expert MLPs in one jitted program ({meta['layers']} layers per decode chain, "
        f"{meta['prefill_layers']} per prefill call; 2 grouped GEMMs each), {meta['sets']} input sets, "
        f"median of {_span(meta, 'repeats')} repeats (>= {_span(meta, 'repeat_ms')} ms); µs per grouped GEMM; "
        "TFLOP/s of active FLOPs; GB/s of the active experts' weights (decode)",
        "- vs bf16 = t(lax.ragged_dot bf16) / t(impl); vs XLA FP8 = t(fastest xla_fp8_* spelling) / "
        "t(impl); vs dense = t(our dense GEMM of the same FLOPs and format) / t(impl): > 1 means "
        "the impl is faster",
        "- rel err: sampled rows against the float64 product of the impl's own dequantized operands "
        "(fresh inputs); quant err: against the unquantized bf16 operands", ""]
  if meta.get("runs"):
    dates = sorted(r["date"][:10] for r in meta["runs"])
    at = next(i for i, line in enumerate(L) if line.startswith("- device:"))
    L.insert(at + 1, f"- merged from {len(meta['runs'])} runs on this device "
             f"({dates[0]} to {dates[-1]}), a later run's cell replacing an earlier one's; each "
             "run's command line is under `runs` in the JSON")
  if meta["backend"] != "gpu":
    L += ["> backend is not a GPU: ours is the pure-JAX reference, torch is skipped; the times are "
          "a plumbing check, not a performance measurement.", ""]
  presets = list(dict.fromkeys(r["preset"] for r in rows))
  for p in presets:
    pr = [r for r in rows if r["preset"] == p]
    r0 = pr[0]
    for phase in ("decode", "prefill"):
      ph = [r for r in pr if r["phase"] == phase]
      if not ph:
        continue
      L += [f"## {p} ({phase}): G={r0['experts']} of {r0['total_experts']} experts, "
            f"top-{r0['top_k']}, hidden {r0['hidden']}, inter {r0['inter']}", "",
            "| tokens | routing | rows M | active experts / max group | impl | path | µs/GEMM | "
            "TFLOP/s | GB/s | rel err | quant err | vs bf16 | vs XLA FP8 | vs dense |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
      for r in ph:
        st = r.get("status")
        if st == "ok":
          us = _f(r["median_us"], ".2f")
        else:
          us = f"{st} {ref(r.get('reason', ''))}"
        L.append(f"| {r['tokens']} | {r['routing']} | {r['rows']} | "
                 f"{_f(r['active_experts'], '.1f')} / {r['max_group']} | {r['impl']} | "
                 f"{r.get('path') or '—'} | {us} | "
                 f"{_f(r.get('tflops'), '.2f')} | {_f(r.get('gbps'), '.0f')} | "
                 f"{_f(r.get('rel_err'), '.1e')} | {_f(r.get('quant_err'), '.1e')} | "
                 f"{_f(r.get('vs_bf16'), '.2f')} | {_f(r.get('vs_best_xla_fp8'), '.2f')} | "
                 f"{_f(r.get('vs_dense'), '.2f')} |")
      L.append("")
  if reasons:
    L += ["Reasons:", ""] + [f"{i + 1}. {r}" for i, r in enumerate(reasons)] + [""]
  L += md_tail(data["notes"], data["failures"])
  return "\n".join(L)


def _span(meta, key: str) -> str:
  """A timing setting of the report: one value, or the range over a merged report's runs."""
  vals = sorted({r[key] for r in meta.get("runs") or [] if r.get(key) is not None} or {meta[key]})
  return f"{vals[0]:g}" if len(vals) == 1 else f"{vals[0]:g}-{vals[-1]:g}"


def plot(path, rows):
  """One panel per (preset, phase): each impl's speed relative to lax.ragged_dot bf16 per cell.
  Returns why no plot was written (None when it was)."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except Exception as e:  # noqa: BLE001
    return f"plot skipped (matplotlib not importable: {type(e).__name__})"
  panels = {}
  for r in rows:
    if r.get("status") == "ok" and r.get("vs_bf16"):
      panels.setdefault((r["preset"], r["phase"]), []).append(r)
  if not panels:
    return f"plot skipped (no cell has a {LAX_BF16} time)"
  fig, axes = plt.subplots(len(panels), 1, figsize=(13, 3.6 * len(panels)), squeeze=False)
  for ax, ((p, phase), pr) in zip(axes[:, 0], panels.items()):
    routings = list(dict.fromkeys(r["routing"] for r in pr))
    cells = sorted(dict.fromkeys((r["tokens"], r["routing"]) for r in pr),
                   key=lambda c: (c[0], routings.index(c[1])))
    impls = [i for i in IMPLS if any(r["impl"] == i for r in pr)]
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
      by = {(r["tokens"], r["routing"]): r["vs_bf16"] for r in pr if r["impl"] == impl}
      ax.bar(np.arange(len(cells)) + (j - (len(impls) - 1) / 2) * width,
             [by.get(c, float("nan")) for c in cells], width, label=impl,
             color=plt.get_cmap("tab20")(IMPLS.index(impl)))
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(cells)))
    ax.set_xticklabels([f"T={t} {r}" for t, r in cells], fontsize=8)
    ax.set_ylabel("speed vs lax.ragged_dot bf16")
    ax.set_title(f"{p} {phase}: higher is faster", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  return save_plot(plt, fig, path)


# -- main -----------------------------------------------------------------------------------------

def parse_args(argv=None):
  p = report_parser(__doc__, NAME)
  p.add_argument("--merge", type=list_arg(str), default=None, metavar="DIR,DIR,...",
                 help="measure nothing: these runs' reports (DIR/bench_moe.json, one device kind) "
                      "as one report in OUT, a later run's cell replacing an earlier one's, the "
                      "ratios recomputed")
  p.add_argument("--quick", action="store_true",
                 help=f"the tiny preset, T = {QUICK_DECODE_TOKENS[0]} (decode) and "
                      f"{QUICK_PREFILL_TOKENS[0]} (prefill), {QUICK_LAYERS}-layer decode chains, "
                      "2 repeats: "
                      "the CPU smoke run (< 1 min)")
  p.add_argument("--presets", type=list_arg(str), default=None,
                 help=f"comma list of {', '.join(PRESETS)} (default: {','.join(MODEL_PRESETS)})")
  p.add_argument("--decode-tokens", type=list_arg(int), default=None, help="default 1,16,64")
  p.add_argument("--prefill-tokens", type=list_arg(int), default=None, help="default 4096,16384")
  p.add_argument("--routings", type=list_arg(str), default=ROUTINGS, help="uniform,zipf (default both)")
  p.add_argument("--zipf", type=float, default=ZIPF_S,
                 help=f"the zipf routing's exponent s (default {ZIPF_S})")
  p.add_argument("--impls", type=list_arg(str), default=IMPLS, help=f"comma list of {', '.join(IMPLS)}")
  p.add_argument("--layers", type=int, default=None,
                 help=f"expert MLPs per decode chain (default {DECODE_LAYERS})")
  p.add_argument("--prefill-layers", type=int, default=None,
                 help=f"expert MLPs per prefill call (default {PREFILL_LAYERS})")
  p.add_argument("--sets", type=int, default=INPUT_SETS, help="input sets (routings) alternated")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed repeats, median reported (default 10; --quick 2)")
  p.add_argument("--repeat-ms", type=float, default=None,
                 help="minimum length of a repeat in ms (default 20; --quick 1)")
  p.add_argument("--weight-budget-gb", type=float, default=WEIGHT_BUDGET_GB,
                 help="bf16 bytes of the distinct weight sets of one impl, at most")
  p.add_argument("--allow-reference", action="store_true",
                 help="on a CUDA GPU where ours has no kernel, time its pure-JAX reference (path "
                      "'reference') instead of recording the cell as unavailable")
  p.add_argument("--no-torch", action="store_true", help="skip the torch peers")
  p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args(argv)
  q = a.quick
  a.presets = a.presets or (("tiny",) if q else MODEL_PRESETS)
  a.decode_tokens = a.decode_tokens if a.decode_tokens is not None else (
      QUICK_DECODE_TOKENS if q else DECODE_TOKENS)
  a.prefill_tokens = a.prefill_tokens if a.prefill_tokens is not None else (
      QUICK_PREFILL_TOKENS if q else PREFILL_TOKENS)
  a.layers = a.layers or (QUICK_LAYERS if q else DECODE_LAYERS)
  a.prefill_layers = a.prefill_layers or (1 if q else PREFILL_LAYERS)
  a.repeats = a.repeats or (2 if q else 10)
  a.repeat_ms = a.repeat_ms if a.repeat_ms is not None else (1.0 if q else 20.0)
  for name, vals, allowed in (("--presets", a.presets, PRESETS), ("--routings", a.routings, ROUTINGS),
                              ("--impls", a.impls, IMPLS)):
    bad = [v for v in vals if v not in allowed]
    if bad:
      p.error(f"{name}: unknown {', '.join(bad)} (choices: {', '.join(allowed)})")
  tokens = a.decode_tokens + a.prefill_tokens
  if not tokens or min(tokens) < 1:
    p.error("--decode-tokens / --prefill-tokens: token counts >= 1, at least one")
  if min(a.layers, a.prefill_layers, a.sets, a.repeats) < 1 or not a.routings or not a.impls:
    p.error("--layers, --prefill-layers, --sets, --repeats must be >= 1; --routings, --impls "
            "non-empty")
  return a


def _out_dir_hidden(argv):
  """A run's command line with its output directory written DIR (where it wrote is not part of
  what it measured)."""
  if not argv:
    return argv
  return [("DIR" if i and argv[i - 1] in ("--out", "--report") else a) for i, a in enumerate(argv)]


_CELL_NOTE = re.compile(r"^(\S+) (decode|prefill) T=(\d+) (\S+) (\S+?):? ")


def _note_holds(note: str, run: int, source) -> bool:
  """Whether run ``run``'s note belongs in a merged report: a note on one cell only while that
  cell's row comes from this run; never a run-wide note on the plot (the merged report draws its
  own), and one on the torch peers only while no run measured them."""
  if note.startswith("plot skipped"):
    return False
  if note.startswith("torch peers"):
    return not any(k[4] in (TORCH_BF16, TORCH_FP8) for k in source)
  m = _CELL_NOTE.match(note)
  if not m:
    return True
  preset, phase, tokens, routing, impl = m.groups()
  return source.get((preset, phase, int(tokens), routing, impl)) == run


def merged(datas):
  """Several runs' reports as one: rows keyed by (preset, phase, tokens, routing, impl), a later
  run's row replacing an earlier one's; rows ordered by preset and impl as they first appear,
  then by cell (decode before prefill, tokens, routing as routings first appear), as one run
  orders them; the ratios recomputed per preset; the first run's metadata, with each run's
  command line, date, wall time and completeness under ``runs`` (a merged report's own runs
  listed one by one). Raises ValueError for runs on different device kinds (their ratios would
  mix devices)."""
  kinds = list(dict.fromkeys(d["meta"]["device_kind"] for d in datas))
  if len(kinds) > 1:
    raise ValueError(f"bench_moe --merge: the runs must be on one device kind, got {', '.join(kinds)}")
  by_key, source = {}, {}
  for i, d in enumerate(datas):
    for r in d["rows"]:
      key = (r["preset"], r["phase"], r["tokens"], r["routing"], r["impl"])
      by_key[key], source[key] = dict(r), i
  presets = list(dict.fromkeys(k[0] for k in by_key))
  routings = list(dict.fromkeys(k[3] for k in by_key))
  impls = {p: list(dict.fromkeys(k[4] for k in by_key if k[0] == p)) for p in presets}
  rows = sorted(by_key.values(),
                key=lambda r: (presets.index(r["preset"]), impls[r["preset"]].index(r["impl"]),
                               r["phase"] != "decode", r["tokens"], routings.index(r["routing"])))
  for p in presets:
    add_ratios([r for r in rows if r["preset"] == p])
  runs = []
  for d in datas:
    m = d["meta"]
    timing = dict(repeats=m.get("repeats"), repeat_ms=m.get("repeat_ms"))
    runs += [dict(timing, **r) for r in m.get("runs") or
             [dict(argv=_out_dir_hidden(m.get("argv")), date=m["date"], wall_s=m.get("wall_s"),
                   complete=m.get("complete", True))]]
  meta = {k: v for k, v in datas[0]["meta"].items() if k != "argv"}
  meta.update(presets=presets, complete=all(d["meta"].get("complete", True) for d in datas),
              runs=runs, wall_s=round(sum(r.get("wall_s") or 0 for r in runs), 1),
              date=max(r["date"] for r in runs))
  notes = list(dict.fromkeys(n for i, d in enumerate(datas) for n in d["notes"]
                             if _note_holds(n, i, source)))
  failures = list(dict.fromkeys(f for d in datas for f in d["failures"]))
  return dict(meta=meta, rows=rows, notes=notes, failures=failures)


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.render_only:
    return render_only(args, NAME, markdown, plot)
  if args.merge:
    datas = []
    for d in args.merge:
      with open(os.path.join(d, NAME + ".json")) as f:
        datas.append(json.load(f))
    try:
      data = merged(datas)
    except ValueError as e:
      print(e, file=sys.stderr)
      return 2
    md, _ = write_report(args.out, NAME, data, markdown, plot, args.no_plot)
    print(md)
    return 0
  run = Run(args)
  if not run.on_gpu and set(args.presets) - {"tiny"}:
    print(f"bench_moe: presets {', '.join(sorted(set(args.presets) - {'tiny'}))} need a CUDA GPU "
          f"(backend here: {run.backend}); use --quick (the tiny preset)", file=sys.stderr)
    return 2
  run.log(f"device: {run.dev.device_kind} (backend={run.backend}), jax {jax.__version__}, "
          f"kernels built: {_backend.kernels_built()}, torch: {run.torch.version or run.torch.note}")
  t_start = run.begin("jax_gmma.ragged_dot")
  for i, name in enumerate(args.presets):
    # the report is rewritten after each cell: an interrupted run keeps every cell it finished
    partial = functools.partial(report, args, run, t_start, done=args.presets[:i + 1],
                                no_plot=True, complete=False)
    try:
      bench_preset(run, PRESETS[name], progress=partial)
    except Exception:  # noqa: BLE001
      run.fail(f"{name} crashed:\n{traceback.format_exc()}")
    gc.collect()
  md, png, meta = report(args, run, t_start, done=args.presets, no_plot=args.no_plot, complete=True)
  print()
  print(md)
  print(f"wrote {args.out}/{NAME}.json, {NAME}.md{', ' + NAME + '.png' if png else ''} "
        f"({meta['wall_s']} s)")
  return exit_code(run.failures)


def report(args, run, t_start, done, no_plot, complete):
  """Writes the JSON, markdown and (unless no_plot) PNG of the presets in ``done`` (the last one
  partly done unless ``complete``); returns the markdown, the PNG path or None, and the
  metadata."""
  paths = sorted({r["path"] for r in run.rows if r["family"] == "ours" and r.get("path")})
  notes = list(run.notes)
  if "reference" in paths and run.on_gpu:
    notes.append("ours ran the pure-JAX reference on the GPU (--allow-reference): those times "
                 "are not a kernel's")
  meta = dict(
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      argv=sys.argv, backend=run.backend, device_kind=run.dev.device_kind,
      device_count=len(jax.devices()), python=platform.python_version(), jax=jax.__version__,
      jaxlib=jaxlib.__version__, jax_gmma=jax_gmma.__version__, numpy=np.__version__,
      torch=run.torch.version, torch_note=run.torch.note, kernels_built=_backend.kernels_built(),
      built_archs=_backend.built_archs(), ours_path="/".join(paths) or "n/a",
      xla_flags=os.environ.get("XLA_FLAGS", ""), presets=list(done), complete=complete,
      decode_tokens=list(args.decode_tokens), prefill_tokens=list(args.prefill_tokens),
      routings=list(args.routings), zipf_s=args.zipf, layers=args.layers,
      prefill_layers=args.prefill_layers, sets=args.sets, repeats=args.repeats,
      repeat_ms=args.repeat_ms, allow_reference=args.allow_reference, seed=args.seed,
      tolerances=TOLERANCES, wall_s=round(time.perf_counter() - t_start, 1))
  data = dict(meta=meta, rows=run.rows, notes=notes, failures=run.failures)
  md, png = write_report(args.out, NAME, data, markdown, plot, no_plot)
  return md, png, meta


if __name__ == "__main__":
  sys.exit(main())
