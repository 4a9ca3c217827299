#!/usr/bin/env python3
"""Block-scaled FP8 GEMM benchmark: jax_gmma.blockwise_gemm against its peers, side by
side, one process.

    python3 -P benchmarks/bench_blockwise.py --suite {smoke,large,decode,quant,all}
        [--out DIR] [--repeats N] [--repeat-ms MS] [--no-torch] [--no-plot]

Writes DIR/bench_blockwise.json (every measurement), DIR/bench_blockwise.md (tables and the
target bars) and DIR/bench_blockwise.png (time of each impl / time of ours_1d2d; only when
matplotlib is importable), and prints the tables. Exit status as bench_fp8.py: 1 when a
correctness check of ours fails or a shape crashes (after writing everything), 2 on bad usage.
A failing peer is noted, not fatal. Timing loop, L2 rotation, JSON/markdown conventions and the
torch plumbing are bench_fp8.py's (imported from it, see its docstring).

Implementations ("impl"; every one has bf16 output)
  ours_1d2d        jax_gmma.blockwise_gemm(a, b, a_scales, b_scales, out_dtype=bf16): fp8 operands
                   quantized with jax_gmma.quantize(x, "fp8_1x128") (one float32 scale per row and
                   128 of K) and quantize(w, "fp8_128x128") (one per 128x128 block). Config and
                   splits (jax_gmma.blockwise_configs.select_blockwise_config) are recorded.
  ours_pertensor   jax_gmma.fp8_gemm(a, b, sa, sb, out_dtype=bf16), default two-level accumulation,
                   on the same source values quantized with one scale per tensor ("fp8_tensor"):
                   our tensorwise kernel, the reference point. In decode chains the
                   activation is quantized per token ("fp8_channel", sa of shape (M,)).
  xla_fp8          the per-tensor fp8 operands straight into lax.dot_general(..., precision=HIGHEST,
                   preferred_element_type=bf16), times sa * sb (bench_fp8's xla_fp8_precise: XLA's
                   cuBLASLt FP8 GEMM without fast accumulation).
  ours_mxfp8       jax_gmma.mx_gemm(a_q, b_q, out_dtype=bf16) (its automatic path: on Hopper the
                   kernel below M = 512, the exact bf16 route -- "path": "dequant" -- from there;
                   the large suite adds a row ours_mxfp8[kernel] forcing the kernel) on the same
                   MXFP8 operands as
                   jax.nn.scaled_matmul's (elements and E8M0 scales unchanged, the scales swizzled
                   once to the kernel layout, as quantize(x, "mxfp8", layout="sm100_128x4") stores
                   them): on Hopper jax-gmma's own MXFP8 kernel (every 32-K block's scales applied
                   exactly in float32; config from jax_gmma.mx.select_sm90_config). In decode
                   chains the activation is quantized with quantize(x, "mxfp8", layout=...).
  jax_nn_scaled_matmul_mxfp8
                   jax.nn.scaled_matmul(lhs (1, M, K), rhs (1, N, K), e8m0 scales (1, M, K/32),
                   (1, N, K/32), preferred_element_type=bf16) on MXFP8 operands made by JAX's own
                   quantizer (jax._src.cudnn.scaled_matmul_stablehlo.quantize with
                   jax.nn.get_scaled_dot_general_config("mxfp8"); fallback: jax_gmma.quantize(x,
                   "mxfp8") + to_jax_scaled_matmul_inputs; "quantizer" field says which). On Hopper
                   XLA has no block-scaled GEMM for it (cuDNN's needs Blackwell) and dequantizes.
                   Without a GPU (no lowering for CPU in jax 0.10.2) the row is its documented maths
                   in float32 (path "emulated"), so the smoke suite still checks the plumbing.
  torch_blockwise  torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=bf16) with cuBLASLt's
                   DeepSeek scaling (torch >= 2.9 + CUDA >= 12.9, sm90): a (M, K) fp8 row-major,
                   scale_a float32 (M, K/128) "outer-dim-major" (stride (1, M):
                   s.t().contiguous().t()), b (N, K) row-major so b.t() is column-major, scale_b =
                   s_b.t() with s_b (ceil(N/128), K/128) row-major (a (K/128, N/128) view); the
                   scaling type is inferred from those shapes/strides (BlockWise1x128 x
                   BlockWise128x128). If _scaled_mm rejects it, torch.nn.functional.scaled_mm with
                   explicit ScalingType recipes is tried, then a K-block-padded scale_b; the form
                   that ran (and whose error is small) is recorded in "torch_recipe"; if none
                   does, a note says why. Own data (torch.randn, same quantization). Large suite.
  bf16             jnp.dot of the dequantized per-tensor values as bf16 (large suite).

Suites
  large   8192^3 and M=4096 with (N, K) in (7168, 16384), (2112, 7168), (24576, 1536), (4096, 7168).
          TFLOP/s; ratios of ours_1d2d vs torch_blockwise (bar >= 1.0x, goal 1.15x), vs
          jax.nn.scaled_matmul (bar >= 2x at 8192^3), vs ours_pertensor.
  decode  chains of 32 dependent GEMMs at M in (1, 16, 64, 128), (N, K) in (8192, 8192),
          (28672, 8192): out_i = GEMM(x_i, W_i), x_{i+1} = quantize(out_i[:, :K]) to the impl's
          activation format (1x128 / per token / MXFP8), inside one jitted function. Distinct
          weights per step as bench_fp8 (largest power of two <= 32 within 4 GiB of fp8 per
          format). jax.nn.scaled_matmul runs a shorter chain (8 steps, --slow-chain): it
          dequantizes its operands and is ~100x slower. Per-GEMM us and weight GB/s (fp8 bytes
          plus scale bytes). Bars: ours_1d2d within 1.15x of ours_pertensor; >= 15x faster than
          jax.nn.scaled_matmul. --mx-configs A,B adds rows ours_mxfp8[A], ... with mx_gemm forced
          onto those Hopper configs (to measure a config the heuristic does not pick).
  quant   jax_gmma.quantize of a 4096x7168 bf16 activation to fp8_1x128 vs the 4096xNx7168
          block-scaled GEMM it feeds, N in (2112, 7168, 24576). Each jitted call runs QUANT_OPS
          independent operations on distinct inputs (so JAX's per-call dispatch, ~20-25 us for a
          call returning a QuantizedArray, is amortized and inputs rotate past L2); times are
          per operation. Bar: quantize <= 15% of the GEMM. On a Hopper GPU quantize runs the CUDA kernel
          (jax_gmma.ops.quantize; "path" says which ran, and its output is checked bit for bit
          against the pure-JAX path); there the pure-JAX path (quantize(..., use_kernel=False))
          is timed too, as quantize_1x128_jax. Also: the per-token (fp8_channel) quantize, and
          quantize + GEMM in one jitted function (what XLA makes of the pair).
  smoke   tiny shapes of the three above (4-step chains): plumbing, also on CPU (ours is the
          pure-JAX reference there; set JAX_GMMA_ALLOW_REFERENCE=1 to allow it on a GPU without
          kernels). < 1 min.
  all     large + decode + quant.

Fields as bench_fp8 (median_us, tflops, gbps, rel_err, lowered_to, config, splits, path), plus
  speedup_vs   (ours_1d2d rows) t_peer / t_ours_1d2d per peer: > 1 means ours_1d2d is faster.
  ours_speedup (every row) t_this / t_ours_1d2d.
  rel_err      ||out - ref||_F / ||ref||_F, ref = float32 product of the impl's own dequantized
               operands (each format quantizes the same std-normal source values). ours_1d2d and
               ours_pertensor must be < 2e-2 (else exit 1).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:  # `python -P` does not put the script's directory on sys.path
  sys.path.insert(0, _HERE)

# bench_fp8 sets XLA_PYTHON_CLIENT_PREALLOCATE=false (torch shares the GPU) and imports jax_gmma
# (from this checkout when it is not installed). Run holds a TorchPeer (torch or a note why not).
from bench_fp8 import (F8, BF16, F32, F8_MAX, TN, HIGHEST, TOL, H200_SMS, ROTATE_BYTES,  # noqa: E402
                       MAX_SETS, Run, compile_jax, time_jax, rel_err, reference,
                       dequant_bf16, ours_gemm, xla_fp8_precise_gemm, bf16_gemm, _fmt, _ratio,
                       md_tail, md_header, plot_vs_baseline, suites_of, _by_shape, warm_gpu, exit_code)

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import numpy as np  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jaxlib  # noqa: E402
from jax import lax  # noqa: E402

import jax_gmma  # noqa: E402
from jax_gmma import _backend  # noqa: E402
from jax_gmma.ops import blockwise_configs as bwc  # noqa: E402
from jax_gmma.numerics import shapes as gshapes  # noqa: E402
try:  # the activation-quantization kernel (absent from an older installed jax_gmma)
  from jax_gmma.ops import quantize as _qk  # noqa: E402
except ImportError:  # pragma: no cover
  _qk = None

OURS, PERT, XLA, JNN, TORCH, BF = ("ours_1d2d", "ours_pertensor", "xla_fp8",
                                   "jax_nn_scaled_matmul_mxfp8", "torch_blockwise", "bf16")
MXO = "ours_mxfp8"
MXJ = "ours_mxfp8_jaxquant"  # decode chains: ours_mxfp8 with the activations quantized by XLA
IMPLS = (OURS, PERT, XLA, MXO, MXJ, JNN, TORCH, BF)
OURS_DECODE = (OURS, PERT, MXO, MXJ)  # decode chains: ours, checked (errors fail the run)
QUANT, QUANT_CH, GEMM, FUSED = ("quantize_1x128", "quantize_fp8_channel", "ours_1d2d_gemm",
                                "quantize_1x128+ours_1d2d")
QUANT_JAX = "quantize_1x128_jax"  # the pure-JAX path, timed where the kernel runs
MX_BLOCK = 32

LARGE_SHAPES = [(8192, 8192, 8192), (4096, 7168, 16384), (4096, 2112, 7168), (4096, 24576, 1536),
                (4096, 4096, 7168)]
DECODE_MS = (1, 16, 64, 128)
DECODE_NK = [(8192, 8192), (28672, 8192)]
CHAIN = 32
SLOW_CHAIN = 8  # jax.nn.scaled_matmul's decode chain (it dequantizes: ~1 ms per GEMM)
DECODE_WEIGHT_BUDGET = 4 << 30  # fp8 bytes of distinct chain weights, per format
QUANT_M, QUANT_K, QUANT_NS = 4096, 7168, (2112, 7168, 24576)

SMOKE_SHAPES = [(128, 256, 512), (256, 384, 512)]
SMOKE_DECODE_MS = (1, 16)
SMOKE_DECODE_NK = [(512, 512)]
SMOKE_CHAIN = 4
SMOKE_DECODE_BUDGET = 1 << 20
SMOKE_QUANT = (256, 512, (256,))
SMOKE_SETS = 3

#: The target bars (reported in the markdown and the JSON, never an exit status).
BAR_VS_TORCH, GOAL_VS_TORCH = 1.0, 1.15
BAR_VS_JNN_LARGE = 2.0  # at 8192^3
BAR_DECODE_VS_PERT = 1.15  # t_ours_1d2d / t_ours_pertensor <=
BAR_DECODE_VS_JNN = 15.0  # t_jnn / t_ours_1d2d >= (M <= 128)
BAR_QUANT = 0.15  # t_quantize / t_gemm <=
BAR_MX_VS_1D2D = 0.85  # MXFP8: t_ours_1d2d / t_ours_mxfp8 >= (large)


# -- data -----------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("shape", "std"))
def normal(key, shape, std=1.0):
  return jax.random.normal(key, shape, F32) * std


def _jax_mx_quantizer():
  """JAX's own MXFP8 quantizer (what jax.nn.scaled_dot_general uses), or None."""
  try:
    from jax._src.cudnn import scaled_matmul_stablehlo as sms
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    return functools.partial(sms.quantize, config=cfg)
  except Exception:  # pragma: no cover - private module moved
    return None


_MXQ = _jax_mx_quantizer()
MX_QUANTIZER = ("jax._src.cudnn.scaled_matmul_stablehlo.quantize (mxfp8 config)" if _MXQ
                else "jax_gmma.quantize(x, 'mxfp8') + to_jax_scaled_matmul_inputs")


def q_1x128(x):
  q = jax_gmma.quantize(x, "fp8_1x128")
  return q.data, q.scales


def q_1x128_jax(x):  # the pure-JAX path of quantize, even where the kernel would run
  q = jax_gmma.quantize(x, "fp8_1x128", use_kernel=False)
  return q.data, q.scales


def quant_path(calls):
  """Which fp8_1x128 quantizer a compiled function ran: the CUDA kernel or XLA's fusion."""
  return "kernel" if _qk is not None and _qk.FP8_QUANTIZE_TARGET in calls else "jax"


def q_128x128(w):
  q = jax_gmma.quantize(w, "fp8_128x128")
  return q.data, q.scales


def q_tensor(x):
  q = jax_gmma.quantize(x, "fp8_tensor")
  return q.data, q.scales


def q_channel(x):  # per token: scales (M,)
  q = jax_gmma.quantize(x, "fp8_channel")
  return q.data, q.scales.reshape(q.scales.shape[:-1])


def q_mx(x):
  """(rows, K) -> MXFP8 (1, rows, K) float8_e4m3fn, (1, rows, K/32) float8_e8m0fnu."""
  if _MXQ is not None:
    return _MXQ(x.reshape(1, *x.shape))
  from jax_gmma.ops.quantize import to_jax_scaled_matmul_inputs
  d, s, _ = to_jax_scaled_matmul_inputs(jax_gmma.quantize(x, "mxfp8"))
  return d, s


def _operands(qa, qb):
  return (qa[0], qb[0], qa[1], qb[1])  # (a, b, a_scales, b_scales): the impls' argument order


@jax.jit
def make_operands(a, b):
  """The same float32 source values in every format the impls use."""
  return dict(bw=_operands(q_1x128(a), q_128x128(b)), pt=_operands(q_tensor(a), q_tensor(b)),
              mx=_operands(q_mx(a), q_mx(b)))


# -- implementations ------------------------------------------------------------------------

def ours_1d2d_gemm(a, b, sa, sb):
  return jax_gmma.blockwise_gemm(a, b, sa, sb, out_dtype=BF16)


@jax.jit
def mx_operands(a, b, sa, sb):  # jax.nn.scaled_matmul's MXFP8 form -> mx_gemm's operands
  return (jax_gmma.mx.mxfp8_operand(a[0], sa[0]), jax_gmma.mx.mxfp8_operand(b[0], sb[0]))


def ours_mx_gemm(a_q, b_q):  # mx_gemm's automatic path (Hopper: exact bf16 route from M = 512)
  return jax_gmma.mx_gemm(a_q, b_q, out_dtype=BF16)


def ours_mx_kernel(a_q, b_q):  # the MXFP8 kernel at every M
  return jax_gmma.mx_gemm(a_q, b_q, out_dtype=BF16, path="kernel")


def q_mx_ours(x):
  return jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4")


def q_mx_ours_jax(x):  # the pure-JAX path of quantize (an XLA fusion), even where the kernel runs
  return jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4", use_kernel=False)


@jax.jit
def ref_mx_q(a_q, b_q):
  return jnp.dot(jax_gmma.dequantize(a_q), jax_gmma.dequantize(b_q).T, precision=HIGHEST)


def mx_config(m, n):
  return jax_gmma.mx.select_sm90_config(m, n)


def _mx_deq(x, s):
  return x.astype(F32) * jnp.repeat(s.astype(F32), x.shape[-1] // s.shape[-1], axis=-1)


def jnn_emulated(a, b, sa, sb, preferred_element_type=F32):
  """jax.nn.scaled_matmul's documented maths (no CPU lowering in jax 0.10.2)."""
  out = jnp.einsum("bmk,bnk->bmn", _mx_deq(a, sa), _mx_deq(b, sb), precision=HIGHEST,
                   preferred_element_type=F32)
  return out.astype(preferred_element_type)


def make_jnn_gemm(emulate: bool):
  sm = jnn_emulated if emulate else jax.nn.scaled_matmul

  def jnn_gemm(a, b, sa, sb):  # (1, M, K) x (1, N, K) -> (M, N)
    return sm(a, b, sa, sb, preferred_element_type=BF16)[0]
  return jnn_gemm


@jax.jit
def ref_1d2d(a, b, sa, sb):
  return jax_gmma.blockwise_gemm_reference(a, b, sa, sb, out_dtype=F32)


@jax.jit
def ref_mx(a, b, sa, sb):
  return jnn_emulated(a, b, sa, sb)[0]


# -- run context ----------------------------------------------------------------------------

class BRun(Run):
  """bench_fp8's Run plus the block-scaled config and path."""

  def __init__(self, args):
    super().__init__(args)
    self.jnn_emulated = not self.on_gpu
    self.torch_recipe = None  # the torch blockwise form that ran, once found

  def _bw_problem(self, m, n, k):
    return gshapes.fp8_blockwise_problem((m, k), F8, (n, k), F8, (m, -(-k // 128)), F32,
                                         (-(-n // 128), -(-k // 128)), F32, out_dtype=BF16)

  def bw_config_for(self, m, n, k):
    return bwc.select_blockwise_config(self._bw_problem(m, n, k), self.sm_count or H200_SMS)

  def bw_tile_order(self, m, n, k, cfg):
    """The tile order blockwise_gemm picks, as "SWIZZLE:RASTER"."""
    sw, ra = bwc.select_tile_order(self._bw_problem(m, n, k), cfg)
    return f"{sw}:{ra}"

  def bw_path(self, calls):
    return "kernel" if _backend.FP8_BLOCKWISE_GEMM_TARGET in calls else "reference"

  def mx_path(self, calls):
    if _backend.MX_GEMM_TARGET in calls:
      return "kernel"
    return "dequant" if self.on_gpu else "reference"  # mx_gemm's exact bf16 path on a GPU


class _Skip(Exception):
  """An implementation left out by --impls."""


def _n_sets(set_bytes, max_sets):
  return int(min(max_sets, max(3, math.ceil(ROTATE_BYTES / set_bytes))))


def _add_ratios(rows):
  t = {r["impl"]: r["median_us"] for r in rows if r.get("median_us")}
  for r in rows:
    if OURS in t and r.get("median_us"):
      r["ours_speedup"] = r["median_us"] / t[OURS]
    if r["impl"] == OURS and r.get("median_us"):
      r["speedup_vs"] = {p: t[p] / r["median_us"] for p in t if p != OURS}


# -- large / smoke GEMMs --------------------------------------------------------------------

def bench_gemm(run: BRun, suite: str, m: int, n: int, k: int, max_sets: int = MAX_SETS):
  args = run.args
  shape = f"{m}x{n}x{k}"
  set_bytes = m * k + n * k
  n_sets = _n_sets(set_bytes, max_sets)
  cfg, splits = run.bw_config_for(m, n, k)
  run.log(f"[{suite}] {shape}: ours_1d2d -> {cfg.name} splits={splits}; {n_sets} input sets "
          f"({n_sets * set_bytes / 1e6:.0f} MB of fp8 operands per format)")
  ops = []
  for _ in range(n_sets):
    ops.append(make_operands(normal(run.next_key(), (m, k)), normal(run.next_key(), (n, k))))
  sets = {fmt: [o[fmt] for o in ops] for fmt in ("bw", "pt", "mx")}
  sets["mxq"] = [mx_operands(*s) for s in sets["mx"]]
  del ops
  base = dict(suite=suite, kind="gemm", shape=shape, m=m, n=n, k=k, input_sets=n_sets,
              flops=2 * m * n * k)
  rows = []

  def record(impl, stats, err, calls, **extra):
    row = dict(base, impl=impl, **stats, rel_err=err, lowered_to=calls, **extra)
    row["tflops"] = base["flops"] / (row["median_us"] * 1e-6) / 1e12
    rows.append(row)
    run.log(f"    {impl:28s} {row['median_us']:10.1f} us  {row['tflops']:8.1f} TFLOP/s  "
            f"rel_err {err:.2e}  [{', '.join(calls) or 'XLA dot'}]")

  refs = {"bw": ref_1d2d(*sets["bw"][0]), "pt": reference(*sets["pt"][0])}
  plan = [(OURS, ours_1d2d_gemm, "bw"), (PERT, ours_gemm, "pt"), (XLA, xla_fp8_precise_gemm, "pt"),
          (MXO, ours_mx_gemm, "mxq"), (f"{MXO}[kernel]", ours_mx_kernel, "mxq"),
          (JNN, make_jnn_gemm(run.jnn_emulated), "mx")]
  # --configs: the same 1x128 x 128x128 GEMM forced onto other configs (extra rows).
  plan[1:1] = [(f"{OURS}[{spec}]", _forced_gemm(spec), "bw") for spec in args.configs]
  plan = [p for p in plan if not args.impls or p[0] in args.impls or p[0].startswith(f"{OURS}[")
          or (p[0] == f"{MXO}[kernel]" and MXO in args.impls)]
  for impl, fn_, fmt in plan:
    ours_kernel = impl in (OURS, PERT, MXO, f"{MXO}[kernel]") or impl.startswith(f"{OURS}[")  # checked
    try:
      fn, calls = compile_jax(fn_, sets[fmt][0])
      if fmt in ("mx", "mxq") and "mx" not in refs:  # its own reference (frees the others first)
        refs.pop("bw", None)
        refs["mx"] = ref_mx(*sets["mx"][0])
        refs["mxq"] = refs["mx"]
      err = float(rel_err(fn(*sets[fmt][0]), refs[fmt]))
      extra = {}
      if impl == OURS:
        extra = dict(config=cfg.name, splits=splits, tile_order=run.bw_tile_order(m, n, k, cfg),
                     path=run.bw_path(calls), variant="1d2d")
      elif impl.startswith(f"{OURS}["):
        extra = dict(config=impl[len(OURS) + 1:-1], path=run.bw_path(calls), variant="1d2d")
      elif impl == PERT:
        extra = dict(path=run.ours_path(calls))
      elif impl == JNN:
        extra = dict(quantizer=MX_QUANTIZER, path="emulated" if run.jnn_emulated else "jax")
      elif impl in (MXO, f"{MXO}[kernel]"):
        extra = dict(path=run.mx_path(calls))
        if extra["path"] != "dequant":
          extra["config"] = mx_config(m, n)
      if ours_kernel and not err < TOL:  # also catches NaN
        run.fail(f"{suite} {shape} {impl}: rel_err {err:.3e} >= {TOL}")
      record(impl, time_jax(fn, sets[fmt], args.repeats, run.target_s), err, calls, **extra)
      del fn
    except Exception as e:
      if ours_kernel:
        run.fail(f"{suite} {shape} {impl} crashed:\n{traceback.format_exc()}")
      else:
        run.peer_error(f"{suite} {shape} {impl}", e)
  # bf16: the dequantized per-tensor values as bf16 operands.
  try:
    if args.impls and BF not in args.impls:
      raise _Skip()
    bsets = [(dequant_bf16(a, sa), dequant_bf16(b, sb)) for a, b, sa, sb in sets["pt"]]
    fn, calls = compile_jax(bf16_gemm, bsets[0])
    err = float(rel_err(fn(*bsets[0]), refs["pt"]))
    record(BF, time_jax(fn, bsets, args.repeats, run.target_s), err, calls)
  except _Skip:
    pass
  except Exception as e:
    run.peer_error(f"{suite} {shape} {BF}", e)
  fn = bsets = sets = refs = None  # free the device buffers before the torch peer
  gc.collect()
  if run.torch.ok and (not args.impls or TORCH in args.impls):
    try:
      _torch_gemm(run, m, n, k, n_sets, record)
    except Exception as e:  # a peer failing must not take ours' numbers down with it
      run.peer_error(f"{suite} {shape} {TORCH}", e)
    finally:
      run.torch.free()
  _add_ratios(rows)
  run.rows.extend(rows)


def _forced_gemm(spec: str):
  """--configs item "NAME[/SPLITS][@SWIZZLE:RASTER]": a config, optionally its K split (stream-K
  configs; 0 = CUTLASS's stream-K heuristic) and the tile order, e.g. "...coop@8:m",
  "128x128x128_c1x1_coop_streamk/0"."""
  name, _, order = spec.partition("@")
  name, _, splits = name.partition("/")
  kw = dict(config=name)
  if splits:
    kw.update(splits=int(splits))
  if order:
    sw, _, ra = order.partition(":")
    kw.update(swizzle=int(sw), raster=ra or "auto")
  return functools.partial(jax_gmma.blockwise_gemm, out_dtype=BF16, **kw)


# -- torch blockwise peer ---------------------------------------------------------------------

def _torch_quant_1x128(t, x):
  m, k = x.shape
  xb = x.view(m, k // 128, 128)
  amax = xb.abs().amax(dim=-1)
  s = t.where(amax > 0, amax / F8_MAX, t.ones_like(amax)).clamp_min(1.2e-38)
  q = (xb / s[..., None]).clamp(-F8_MAX, F8_MAX).to(t.float8_e4m3fn).view(m, k)
  return q, s.float()  # dequantization scales (M, K/128), row-major


def _torch_quant_128x128(t, w):
  n, k = w.shape
  nb = -(-n // 128)
  wp = t.nn.functional.pad(w, (0, 0, 0, nb * 128 - n)) if nb * 128 != n else w
  wb = wp.view(nb, 128, k // 128, 128)
  amax = wb.abs().amax(dim=(1, 3))
  s = t.where(amax > 0, amax / F8_MAX, t.ones_like(amax)).clamp_min(1.2e-38)
  q = (wb / s[:, None, :, None]).clamp(-F8_MAX, F8_MAX).to(t.float8_e4m3fn)
  return q.view(nb * 128, k)[:n].contiguous(), s.float()  # (ceil(N/128), K/128), row-major


def _torch_recipes(t):
  """(name, fn(a, b, sa_rowmajor, sb_rowmajor) -> (call, scale_a, scale_b)) candidates."""
  F = t.nn.functional
  ST = getattr(F, "ScalingType", None) or getattr(t._C, "_ScalingType", None)

  def outer_major(sa):  # (M, K/128) with stride (1, M)
    return sa.t().contiguous().t()

  def padded_sb(sb):  # (K/128, N/128) view of (N/128, round_up(K/128, 4)) storage
    L = sb.shape[1]
    L4 = -(-L // 4) * 4
    return F.pad(sb, (0, L4 - L))[:, :L].t() if L4 != L else sb.t()

  def v1(sb_fn):
    def make(a, b, sa, sb):
      A, B = outer_major(sa), sb_fn(sb)
      return (lambda: t._scaled_mm(a, b.t(), scale_a=A, scale_b=B, out_dtype=t.bfloat16)), A, B
    return make

  cands = [("torch._scaled_mm(a, b.t(), scale_a=sa.t().contiguous().t(), scale_b=sb.t())",
            v1(lambda sb: sb.t())),
           ("torch._scaled_mm, scale_b K-blocks padded to 4", v1(padded_sb))]
  if hasattr(F, "scaled_mm") and ST is not None:
    def v2(a, b, sa, sb):
      A, B = outer_major(sa), padded_sb(sb)
      return (lambda: F.scaled_mm(a, b.t(), A, ST.BlockWise1x128, B, ST.BlockWise128x128,
                                  output_dtype=t.bfloat16)), A, B
    cands.append(("torch.nn.functional.scaled_mm(BlockWise1x128, BlockWise128x128)", v2))
  return cands


def _torch_gemm(run: BRun, m, n, k, n_sets, record):
  tp = run.torch
  t = tp.torch
  srcs = []
  for _ in range(n_sets):
    a, sa = _torch_quant_1x128(t, t.randn((m, k), device="cuda", generator=tp.gen))
    b, sb = _torch_quant_128x128(t, t.randn((n, k), device="cuda", generator=tp.gen))
    srcs.append((a, b, sa, sb))
  a, b, sa, sb = srcs[0]
  prev = t.backends.cuda.matmul.allow_tf32
  t.backends.cuda.matmul.allow_tf32 = False
  try:
    ad = a.float() * sa.repeat_interleave(128, dim=1)
    bd = b.float() * sb.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)
    ref = ad @ bd.t()
    del ad, bd
  finally:
    t.backends.cuda.matmul.allow_tf32 = prev
  cands = _torch_recipes(t)
  if run.torch_recipe is not None:  # the form that worked on an earlier shape first
    cands.sort(key=lambda c: c[0] != run.torch_recipe)
  tried, chosen = [], None
  for name, make in cands:
    try:
      call, _, _ = make(a, b, sa, sb)
      out = call().float()
      err = float(t.linalg.norm(out - ref) / t.linalg.norm(ref))
    except Exception as e:
      tried.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
      continue
    tried.append(f"{name}: ran, rel_err {err:.2e}")
    if chosen is None or err < chosen[1]:
      chosen = (name, err, make)
    if err < TOL:
      break
  del ref
  if chosen is None:
    raise RuntimeError("torch rejected every blockwise form: " + " | ".join(tried))
  name, err, make = chosen
  run.torch_recipe = name
  if err >= TOL:
    run.notes.append(f"{TORCH} {m}x{n}x{k}: no form gave a small error (recipe doubtful): "
                     + " | ".join(tried))
  calls = [make(*s)[0] for s in srcs]
  stats = tp.time(lambda c: c(), [(c,) for c in calls], run.args.repeats, run.target_s)
  record(TORCH, stats, err, ["torch blockwise (cuBLASLt)"], torch_recipe=name,
         torch_attempts=tried)
  del calls, srcs


# -- decode chains --------------------------------------------------------------------------

def _next_input(out, k):
  """The next step's (M, K) input from out (M, N): its first K columns; for N < K out tiled
  along N first (the DeepSeek shapes 2112 x 7168, 4096 x 7168)."""
  n = out.shape[1]
  if n < k:
    out = jnp.concatenate([out] * -(-k // n), axis=1)
  return out[:, :k]


def _chain_fn(step, k, to_next, steps):
  def chain(x, ws):
    d = len(ws)
    out = None
    for i in range(steps):
      out = step(x, ws[i % d])
      x = to_next(_next_input(out, k))
    return out
  return chain


def _n_distinct(n, k, budget, steps):
  d = steps
  while d > 1 and d * n * k > budget:
    d //= 2
  return d


@jax.jit
def _weight_formats(w):
  return (q_128x128(w), q_tensor(w), q_mx(w), q_mx_ours(w))


def _pert_step(x, w):
  return jax_gmma.fp8_gemm(x[0], w[0], x[1], w[1], out_dtype=BF16)


def _xla_step(x, w):
  acc = lax.dot_general(x[0], w[0], TN, precision=HIGHEST, preferred_element_type=BF16)
  return (acc.astype(F32) * (x[1][:, None] * w[1])).astype(BF16)


def bench_decode(run: BRun, suite: str, n: int, k: int, ms, budget, steps, slow_steps):
  args = run.args
  d = _n_distinct(n, k, budget, steps)
  run.log(f"[{suite}] decode N={n} K={k}: {steps} GEMMs per chain ({slow_steps} for {JNN}), {d} "
          f"distinct weights per format ({d * n * k / 1e9:.2f} GB fp8)")
  wbw, wpt, wmx, wmq = [], [], [], []
  for _ in range(d):
    f_bw, f_pt, f_mx, f_mq = _weight_formats(normal(run.next_key(), (n, k), std=1.0 / math.sqrt(k)))
    wbw.append(f_bw)
    wpt.append(f_pt)
    wmx.append(f_mx)
    wmq.append(f_mq)
  kb = -(-k // 128)
  formats = {
      OURS: (lambda x, w: ours_1d2d_gemm(x[0], w[0], x[1], w[1]), q_1x128, tuple(wbw), ref_1d2d,
             n * k + 4 * (-(-n // 128)) * kb, steps),
      PERT: (_pert_step, q_channel, tuple(wpt), reference, n * k, steps),
      XLA: (_xla_step, q_channel, tuple(wpt), reference, n * k, steps),
      MXO: (ours_mx_gemm, q_mx_ours, tuple(wmq), ref_mx_q, n * k + n * k // MX_BLOCK, steps),
      MXJ: (ours_mx_gemm, q_mx_ours_jax, tuple(wmq), ref_mx_q, n * k + n * k // MX_BLOCK, steps),
      JNN: (lambda x, w: make_jnn_gemm(run.jnn_emulated)(x[0], w[0], x[1], w[1]), q_mx,
            tuple(wmx[:slow_steps]), ref_mx, n * k + n * k // MX_BLOCK, slow_steps),
  }
  for cfg_name in args.mx_configs:  # --mx-configs: ours_mxfp8 forced onto a Hopper config
    formats[f"{MXO}[{cfg_name}]"] = (_forced_mx_gemm(cfg_name), q_mx_ours, tuple(wmq), ref_mx_q,
                                     n * k + n * k // MX_BLOCK, steps)
  rows_by_m = {m: [] for m in ms}
  finite = {}

  def record(m, impl, stats, err, calls, wbytes, chain_steps, n_w, **extra):
    per = dict(stats)
    for f in ("median_us", "min_us", "max_us"):
      per[f] = stats[f] / chain_steps
    row = dict(suite=suite, kind="decode", shape=f"{m}x{n}x{k}", m=m, n=n, k=k,
               chain=chain_steps, distinct_weights=n_w, impl=impl, chain_us=stats["median_us"],
               **per, rel_err=err, lowered_to=calls, weight_bytes=wbytes, **extra)
    row["gbps"] = wbytes / (row["median_us"] * 1e-6) / 1e9
    row["tflops"] = 2 * m * n * k / (row["median_us"] * 1e-6) / 1e12
    rows_by_m[m].append(row)
    run.log(f"    M={m:3d} {impl:28s} {row['median_us']:9.2f} us/GEMM  {row['gbps']:8.0f} GB/s  "
            f"rel_err {err:.2e}  [{', '.join(calls) or 'XLA dot'}]")

  for m in ms:
    cfg, splits = run.bw_config_for(m, n, k)
    run.log(f"  M={m}: ours_1d2d -> {cfg.name} splits={splits}")
    src = normal(run.next_key(), (m, k))
    for impl, (step, to_act, ws, ref_fn, wbytes, chain_steps) in formats.items():
      if args.impls and impl.split("[")[0] not in args.impls:
        continue
      try:
        x = jax.jit(to_act)(src)
        single, _ = compile_jax(step, (x, ws[0]))
        ref = ref_fn(*_ref_args(impl, x, ws[0]))
        err = float(rel_err(single(x, ws[0]), ref))
        del single, ref
        chain, calls = compile_jax(_chain_fn(step, k, to_act, chain_steps), (x, ws))
        finite[(m, impl)] = bool(jnp.isfinite(chain(x, ws).astype(F32)).all())
        extra = {"finite": finite[(m, impl)]}
        if impl == OURS:
          extra.update(config=cfg.name, splits=splits, path=run.bw_path(calls), variant="1d2d")
        elif impl == PERT:
          extra.update(path=run.ours_path(calls))
        elif impl == JNN:
          extra.update(quantizer=MX_QUANTIZER, path="emulated" if run.jnn_emulated else "jax")
        elif impl in (MXO, MXJ):
          extra.update(config=mx_config(m, n), path=run.mx_path(calls))
        elif impl.startswith(f"{MXO}["):
          extra.update(config=impl[len(MXO) + 1:-1], path=run.mx_path(calls))
        if _checked_decode(impl) and not err < TOL:
          run.fail(f"{suite} decode {m}x{n}x{k} {impl}: rel_err {err:.3e} >= {TOL}")
        reps = args.repeats if impl != JNN else max(1, min(args.repeats, 5))
        stats = time_jax(chain, [(x, ws)], reps, run.target_s)
        record(m, impl, stats, err, calls, wbytes, chain_steps, len(ws), **extra)
        del chain
      except Exception as e:
        if _checked_decode(impl):
          run.fail(f"{suite} decode {m}x{n}x{k} {impl} crashed:\n{traceback.format_exc()}")
        else:
          run.peer_error(f"{suite} decode {m}x{n}x{k} {impl}", e)
    for impl in OURS_DECODE:
      if finite.get((m, impl)) is False and finite.get((m, XLA)):
        run.fail(f"{suite} decode {m}x{n}x{k}: {impl}'s chain produced non-finite values")
  del formats, wbw, wpt, wmx, wmq
  gc.collect()
  for m in ms:
    _add_ratios(rows_by_m[m])
    run.rows.extend(rows_by_m[m])


def _checked_decode(impl):
  """Our own decode rows (errors and crashes fail the run): OURS_DECODE and the forced
  ours_mxfp8[CONFIG] rows."""
  return impl in OURS_DECODE or impl.startswith(f"{MXO}[")


def _forced_mx_gemm(config):
  def step(a_q, b_q):
    return jax_gmma.mx_gemm(a_q, b_q, out_dtype=BF16, path="kernel", config=config)
  return step


def _ref_args(impl, x, w):
  if impl in (MXO, MXJ) or impl.startswith(f"{MXO}["):
    return (x, w)
  if impl in (OURS, JNN):
    return (x[0], w[0], x[1], w[1])
  return (x[0], w[0], x[1][:, None], w[1])  # per-token sa broadcasts over N


# -- quantization cost ------------------------------------------------------------------------

#: Operations per jitted call in the quant suite (distinct inputs; per-call dispatch amortized).
QUANT_OPS = 8


def _ops_in_one_call(fn, sets):
  """One jitted function applying fn to every argument tuple of `sets`; compiled, with the
  custom-call targets it lowered to."""
  return compile_jax(lambda all_sets: tuple(fn(*a) for a in all_sets), (sets,))


def _per_op(stats, ops):
  out = dict(stats)
  for key in ("median_us", "min_us", "max_us"):
    out[key] = stats[key] / ops
  out["ops_per_call"] = ops
  return out


def bench_quant(run: BRun, suite: str, m: int, k: int, ns, ops: int = QUANT_OPS):
  args = run.args
  act_bytes = m * k * 2
  n_sets = ops
  run.log(f"[{suite}] quantize {m}x{k} bf16 -> fp8_1x128 vs the {m}xNx{k} GEMM it feeds, "
          f"N in {tuple(ns)}; {n_sets} operations on distinct inputs per jitted call")
  xs = [(normal(run.next_key(), (m, k)).astype(BF16),) for _ in range(n_sets)]
  rows = []
  base = dict(suite=suite, kind="quant", m=m, k=k, input_sets=n_sets)

  def record(impl, n, stats, calls, **extra):
    row = dict(base, shape=f"{m}x{n or '-'}x{k}", n=n, impl=impl, **stats, lowered_to=calls,
               **extra)
    if n:
      row["tflops"] = 2 * m * n * k / (row["median_us"] * 1e-6) / 1e12
    rows.append(row)
    run.log(f"    {impl:28s} N={n or '-':>6} {row['median_us']:10.1f} us  "
            f"[{', '.join(calls) or 'XLA'}]")
    return row

  tq, paths = {}, {}
  impls = [(QUANT, q_1x128), (QUANT_CH, q_channel)]
  kernel = _qk is not None and _qk.kernel_available()
  if kernel:  # the kernel runs for QUANT: time the pure-JAX path next to it
    impls.append((QUANT_JAX, q_1x128_jax))
  for impl, fn_ in impls:
    fn, calls = _ops_in_one_call(fn_, xs)
    extra = dict(path=quant_path(calls)) if impl in (QUANT, QUANT_JAX) else {}
    # bytes moved: bf16 in, fp8 + float32 scales out
    r = record(impl, None, _per_op(time_jax(fn, [(xs,)], args.repeats, run.target_s), n_sets),
               calls, **extra)
    r["gbps"] = (act_bytes + m * k + 4 * m * (-(-k // 128) if impl != QUANT_CH else 1)) / (
        r["median_us"] * 1e-6) / 1e9
    tq[impl] = r["median_us"]
    paths[impl] = r.get("path")
    del fn
  if kernel:  # the kernel must be what ran, and bit-identical to the pure-JAX path
    if paths[QUANT] != "kernel":
      run.fail(f"{suite} quant: the quantization kernel is available but {QUANT} did not run it")
    got, want = jax.jit(q_1x128)(*xs[0]), jax.jit(q_1x128_jax)(*xs[0])
    same = all(np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
               for a, b in zip(got, want))
    if not same:
      run.fail(f"{suite} quant: the quantization kernel is not bit-identical to the pure-JAX path")
  qsets = [jax.jit(q_1x128)(x) for (x,) in xs]
  for n in ns:
    ws = [q_128x128(normal(run.next_key(), (n, k))) for _ in range(n_sets)]
    cfg, splits = run.bw_config_for(m, n, k)
    try:
      gsets = [(qa, w[0], sa, w[1]) for (qa, sa), w in zip(qsets, ws)]
      fn, calls = _ops_in_one_call(ours_1d2d_gemm, gsets)
      g = record(GEMM, n, _per_op(time_jax(fn, [(gsets,)], args.repeats, run.target_s), n_sets),
                 calls, config=cfg.name, splits=splits, path=run.bw_path(calls))
      g["quant_ratio"] = tq[QUANT] / g["median_us"]
      g["quant_channel_ratio"] = tq[QUANT_CH] / g["median_us"]
      if QUANT_JAX in tq:
        g["quant_jax_ratio"] = tq[QUANT_JAX] / g["median_us"]
      fsets = [(x, w[0], w[1]) for (x,), w in zip(xs, ws)]
      fused, calls = _ops_in_one_call(_quant_gemm, fsets)
      f = record(FUSED, n, _per_op(time_jax(fused, [(fsets,)], args.repeats, run.target_s), n_sets),
                 calls, path=run.bw_path(calls))
      f["added_us"] = f["median_us"] - g["median_us"]
      f["added_ratio"] = f["added_us"] / g["median_us"]
      run.log(f"      quantize / GEMM = {g['quant_ratio']:.1%} (bar <= {BAR_QUANT:.0%}); "
              f"in one jitted function it adds {f['added_us']:.1f} us ({f['added_ratio']:.1%})")
      del fn, fused
    except Exception:
      run.fail(f"{suite} quant N={n} crashed:\n{traceback.format_exc()}")
    del ws
  run.rows.extend(rows)


def _quant_gemm(x, b, sb):
  qa, sa = q_1x128(x)
  return ours_1d2d_gemm(qa, b, sa, sb)


# -- reports --------------------------------------------------------------------------------

def bars(rows):
  """The target bars, evaluated on the measured rows (not on smoke rows: tiny shapes)."""
  out = []
  rows = [r for r in rows if r["suite"] != "smoke"]
  for r in rows:
    if r["impl"] != OURS or not r.get("speedup_vs"):
      continue
    sv = r["speedup_vs"]
    where = f"{r['suite']} {r['kind']} {r['shape']}"
    if r["kind"] == "gemm":
      if TORCH in sv:
        out.append(dict(where=where, what="ours_1d2d speedup vs torch_blockwise", value=sv[TORCH],
                        bar=f">= {BAR_VS_TORCH} (goal {GOAL_VS_TORCH})",
                        met=sv[TORCH] >= BAR_VS_TORCH, goal_met=sv[TORCH] >= GOAL_VS_TORCH))
      if JNN in sv and (r["m"], r["n"], r["k"]) == (8192, 8192, 8192):
        out.append(dict(where=where, what="ours_1d2d speedup vs jax.nn.scaled_matmul (MXFP8)",
                        value=sv[JNN], bar=f">= {BAR_VS_JNN_LARGE}", met=sv[JNN] >= BAR_VS_JNN_LARGE))
    elif r["kind"] == "decode":
      if PERT in sv:
        slow = 1.0 / sv[PERT]
        out.append(dict(where=where, what="ours_1d2d time / ours_pertensor time", value=slow,
                        bar=f"<= {BAR_DECODE_VS_PERT}", met=slow <= BAR_DECODE_VS_PERT))
      if JNN in sv and r["m"] <= 128:
        out.append(dict(where=where, what="ours_1d2d speedup vs jax.nn.scaled_matmul (MXFP8)",
                        value=sv[JNN], bar=f">= {BAR_DECODE_VS_JNN}", met=sv[JNN] >= BAR_DECODE_VS_JNN))
  # MXFP8 (ours_mxfp8) against jax.nn.scaled_matmul, ours_1d2d and ours_pertensor.
  t = {(r["suite"], r["kind"], r["shape"], r["impl"]): r.get("median_us") for r in rows}
  for r in rows:
    if r["impl"] != MXO or not r.get("median_us"):
      continue
    key = (r["suite"], r["kind"], r["shape"])
    where = f"{r['suite']} {r['kind']} {r['shape']}"
    jnn, one, pert = t.get(key + (JNN,)), t.get(key + (OURS,)), t.get(key + (PERT,))
    if r["kind"] == "gemm":
      if jnn and (r["m"], r["n"], r["k"]) == (8192, 8192, 8192):
        out.append(dict(where=where, what="ours_mxfp8 speedup vs jax.nn.scaled_matmul (MXFP8)",
                        value=jnn / r["median_us"], bar=f">= {BAR_VS_JNN_LARGE}",
                        met=jnn / r["median_us"] >= BAR_VS_JNN_LARGE))
      if one:
        out.append(dict(where=where, what="ours_mxfp8 speed / ours_1d2d speed", value=one / r["median_us"],
                        bar=f">= {BAR_MX_VS_1D2D}", met=one / r["median_us"] >= BAR_MX_VS_1D2D))
    elif r["kind"] == "decode":
      if jnn and r["m"] <= 128:
        out.append(dict(where=where, what="ours_mxfp8 speedup vs jax.nn.scaled_matmul (MXFP8)",
                        value=jnn / r["median_us"], bar=f">= {BAR_DECODE_VS_JNN}",
                        met=jnn / r["median_us"] >= BAR_DECODE_VS_JNN))
      if pert:
        out.append(dict(where=where, what="ours_mxfp8 time / ours_pertensor time", value=r["median_us"] / pert,
                        bar=f"<= {BAR_DECODE_VS_PERT}", met=r["median_us"] / pert <= BAR_DECODE_VS_PERT))
  for r in rows:
    if r["impl"] == GEMM and r.get("quant_ratio") is not None:
      out.append(dict(where=f"{r['suite']} quant {r['shape']}",
                      what="quantize_1x128 time / block-scaled GEMM time", value=r["quant_ratio"],
                      bar=f"<= {BAR_QUANT}", met=r["quant_ratio"] <= BAR_QUANT))
  return out


def markdown(meta, rows, notes, failures, bar_rows) -> str:
  L = md_header("jax-gmma block-scaled FP8 GEMM benchmark", meta,
                "speedup = t_peer / t_ours_1d2d (> 1: ours_1d2d faster)",
                extra=[f"- MXFP8 quantizer for jax.nn.scaled_matmul: {meta['mx_quantizer']}"],
                off_gpu="ours is the pure-JAX reference and jax.nn.scaled_matmul is emulated;")
  for suite, kind in suites_of(rows):
    groups = _by_shape(rows, kind, suite)
    if kind == "gemm":
      L += [f"## {suite}: GEMM (TFLOP/s)", "",
            "| M×N×K | ours_1d2d config (splits) | rel err | ours_1d2d | ours_pertensor | "
            "torch_blockwise | xla_fp8 | jax.nn mxfp8 | bf16 | vs torch (≥1.0, goal 1.15) | "
            "vs jax.nn | vs pertensor | vs xla_fp8 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
      for shape, g in groups.items():
        o = g.get(OURS, {})
        sv = o.get("speedup_vs", {})
        tf = lambda i: _fmt(g.get(i, {}).get("tflops"))
        order = f" @{o['tile_order']}" if o.get("tile_order", "1:auto") != "1:auto" else ""
        L.append(f"| {shape} | {o.get('config', '—')} ({o.get('splits', '—')}){order} | "
                 f"{_fmt(o.get('rel_err'), '.1e')} | {tf(OURS)} | {tf(PERT)} | {tf(TORCH)} | "
                 f"{tf(XLA)} | {tf(JNN)} | {tf(BF)} | {_ratio(sv.get(TORCH))} | "
                 f"{_ratio(sv.get(JNN))} | {_ratio(sv.get(PERT))} | {_ratio(sv.get(XLA))} |")
    elif kind == "decode":
      L += [f"## {suite}: decode chains (µs per GEMM)", "",
            "| M | N×K | steps (jax.nn) | distinct W | ours_1d2d config (splits) | rel err | "
            "ours_1d2d µs | GB/s | ours_pertensor µs | xla_fp8 µs | jax.nn µs | "
            "1d2d / pertensor (≤1.15) | vs jax.nn (≥15) | vs xla_fp8 |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
      for shape, g in groups.items():
        o = g.get(OURS, {})
        sv = o.get("speedup_vs", {})
        us = lambda i: _fmt(g.get(i, {}).get("median_us"), ".2f")
        rel = 1.0 / sv[PERT] if sv.get(PERT) else None
        b = o or next(iter(g.values()))  # shape fields also when --impls left ours_1d2d out
        L.append(f"| {b.get('m')} | {b.get('n')}×{b.get('k')} | {b.get('chain')} "
                 f"({g.get(JNN, {}).get('chain', '—')}) | {b.get('distinct_weights')} | "
                 f"{o.get('config', '—')} ({o.get('splits', '—')}) | {_fmt(o.get('rel_err'), '.1e')} | "
                 f"{us(OURS)} | {_fmt(o.get('gbps'), '.0f')} | {us(PERT)} | {us(XLA)} | {us(JNN)} | "
                 f"{_ratio(rel)} | {_ratio(sv.get(JNN))} | {_ratio(sv.get(XLA))} |")
    else:
      L += [f"## {suite}: activation quantization cost", "",
            "| impl | shape | config (splits) | path | µs | quantize_1x128 / GEMM (≤15%) | "
            "pure-JAX 1x128 / GEMM | fp8_channel / GEMM | added in one jit |",
            "|---|---|---|---|---|---|---|---|---|"]
      for shape, g in groups.items():
        for impl, r in g.items():
          added = (f"{_fmt(r.get('added_us'), '.1f')} µs ({r['added_ratio']:.1%})"
                   if r.get("added_ratio") is not None else "—")
          L.append(f"| {impl} | {shape} | {r.get('config', '—')} ({r.get('splits', '—')}) | "
                   f"{r.get('path', '—')} | {_fmt(r.get('median_us'), '.1f')} | "
                   f"{format(r['quant_ratio'], '.1%') if r.get('quant_ratio') is not None else '—'} | "
                   f"{format(r['quant_jax_ratio'], '.1%') if r.get('quant_jax_ratio') is not None else '—'} | "
                   f"{format(r['quant_channel_ratio'], '.1%') if r.get('quant_channel_ratio') is not None else '—'} | "
                   f"{added} |")
    L.append("")
  if bar_rows:
    L += ["## The target bars", "", "| where | what | value | bar | met |", "|---|---|---|---|---|"]
    for b in bar_rows:
      met = "yes" if b["met"] else "**no**"
      if "goal_met" in b:
        met += f" (goal: {'yes' if b['goal_met'] else 'no'})"
      L.append(f"| {b['where']} | {b['what']} | {b['value']:.3g} | {b['bar']} | {met} |")
    L.append("")
  L += md_tail(notes, failures)
  return "\n".join(L)


def plot(path, rows):
  impls = [PERT, TORCH, XLA, JNN, BF]
  colors = dict(zip(impls, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:gray")))
  return plot_vs_baseline(path, rows, OURS, impls, colors, speedup=False, log=True,
                          ylabel=f"t_impl / t_{OURS} (log)", title=f"above 1 = {OURS} faster")


# -- main -----------------------------------------------------------------------------------

def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--suite", choices=("smoke", "large", "decode", "quant", "all"), default="smoke",
                 help="smoke: tiny shapes, < 1 min, also on CPU (default); large: big GEMMs; "
                      "decode: 32-GEMM chains at M=1/16/64/128; quant: activation quantization "
                      "cost; all: large + decode + quant")
  p.add_argument("--out", default="bench_out", help="output directory (default bench_out/)")
  p.add_argument("--repeats", type=int, default=10, help="timed repeats; the median is reported "
                 "(default 10; jax.nn.scaled_matmul's decode chains use at most 5)")
  p.add_argument("--repeat-ms", type=float, default=None,
                 help="minimum duration of one repeat in ms (default 20, 5 for smoke)")
  p.add_argument("--slow-chain", type=int, default=SLOW_CHAIN,
                 help=f"steps of jax.nn.scaled_matmul's decode chain (default {SLOW_CHAIN})")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--no-torch", action="store_true", help="skip the torch blockwise peer")
  p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
  p.add_argument("--configs", default="", type=lambda v: [c for c in v.split(",") if c],
                 help="large/smoke suites: extra rows forcing these blockwise configs (comma list; "
                      "NAME[/SPLITS][@SWIZZLE:RASTER] also forces the K split and the tile order, e.g. "
                      "128x128x128_c1x1_coop@8:m, 128x128x128_c1x1_coop_streamk/0)")
  p.add_argument("--impls", default="", type=lambda v: [c for c in v.split(",") if c],
                 help=f"run only these implementations (comma list of {', '.join(IMPLS)}; default all)")
  p.add_argument("--shapes", default="", type=lambda v: [c for c in v.split(",") if c],
                 help="large suite: only these MxNxK shapes (comma list; default the target list)")
  p.add_argument("--decode-ms", default="", type=lambda v: [int(c) for c in v.split(",") if c],
                 help="decode suite: these M (default 1,16,64,128)")
  p.add_argument("--mx-configs", default="", type=lambda v: [c for c in v.split(",") if c],
                 help="decode suite: extra rows ours_mxfp8[CONFIG] forcing these Hopper MXFP8 configs "
                      "(comma list of jax_gmma.mx.KERNELS['sm_90a'] names, e.g. "
                      "sm90_mxf8_blockscaled_swap_128x64)")
  p.add_argument("--decode-nk", default="", type=lambda v: [c for c in v.split(",") if c],
                 help="decode suite: these NxK (default 8192x8192,28672x8192)")
  a = p.parse_args(argv)
  bad = [i for i in a.impls if i not in IMPLS]
  if bad:
    p.error(f"--impls: unknown {', '.join(bad)} (choices: {', '.join(IMPLS)})")
  mx_names = jax_gmma.mx.KERNELS["sm_90a"][("mxfp8", "mxfp8")]
  bad = [c for c in a.mx_configs if c not in mx_names]
  if bad:
    p.error(f"--mx-configs: unknown {', '.join(bad)} (choices: {', '.join(mx_names)})")
  try:
    a.shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes]
    a.decode_nk = [tuple(int(v) for v in s.split("x")) for s in a.decode_nk]
  except ValueError:
    p.error("--shapes / --decode-nk take MxNxK / NxK lists, e.g. 8192x8192x8192")
  if any(len(s) != 3 for s in a.shapes) or any(len(s) != 2 for s in a.decode_nk):
    p.error("--shapes / --decode-nk take MxNxK / NxK lists, e.g. 8192x8192x8192")
  if a.repeats < 1:
    p.error("--repeats must be >= 1")
  if a.slow_chain < 1:
    p.error("--slow-chain must be >= 1")
  if a.repeat_ms is None:
    a.repeat_ms = 5.0 if a.suite == "smoke" else 20.0
  return a


def main(argv=None) -> int:
  args = parse_args(argv)
  if not hasattr(jax_gmma, "blockwise_gemm"):
    print(f"the jax_gmma imported from {os.path.dirname(jax_gmma.__file__)} predates "
          "blockwise_gemm; install this checkout", file=sys.stderr)
    return 2
  run = BRun(args)
  if not run.on_gpu and args.suite != "smoke":
    print(f"--suite {args.suite} needs a CUDA GPU (backend here: {run.backend}); use --suite smoke",
          file=sys.stderr)
    return 2
  if run.on_gpu and not _backend.reference_allowed():
    from jax_gmma.ops import blockwise as _bw
    if not _backend.kernels_built() or not _bw.has_kernels():
      print("jax_gmma has no block-scaled CUDA kernels here (see `python -m jax_gmma info`); "
            "refusing to benchmark the reference path on a GPU", file=sys.stderr)
      return 2
  run.log(f"device: {run.dev.device_kind} (backend={run.backend}, SMs={run.sm_count or '?'}), "
          f"jax {jax.__version__}, kernels built: {_backend.kernels_built()}, "
          f"torch: {run.torch.version or run.torch.note}")
  if run.torch.note:
    run.notes.append(f"{TORCH}: {run.torch.note}")
  if not run.on_gpu:
    run.notes.append(f"no GPU: ours runs the pure-JAX reference and {JNN} its documented maths; "
                     f"configs shown are those the kernel would pick on a {H200_SMS}-SM H100/H200")
  if args.slow_chain != SLOW_CHAIN or args.suite in ("decode", "all"):
    run.notes.append(f"{JNN} decode chains have {args.slow_chain} steps (the others {CHAIN}) and "
                     "at most 5 repeats: it is ~100x slower; its per-GEMM time is chain / steps")
  t_start = time.perf_counter()
  if run.on_gpu:
    warm_gpu()
  if args.suite == "smoke":
    for m, n, k in SMOKE_SHAPES:
      run.guard(f"smoke {m}x{n}x{k}", bench_gemm, "smoke", m, n, k, SMOKE_SETS)
    for n, k in SMOKE_DECODE_NK:
      run.guard(f"smoke decode N={n} K={k}", bench_decode, "smoke", n, k, SMOKE_DECODE_MS,
                SMOKE_DECODE_BUDGET, SMOKE_CHAIN, min(args.slow_chain, SMOKE_CHAIN))
    m, k, ns = SMOKE_QUANT
    run.guard("smoke quant", bench_quant, "smoke", m, k, ns, 2)  # 2 operations per call
  if args.suite in ("large", "all"):
    for m, n, k in args.shapes or LARGE_SHAPES:
      run.guard(f"large {m}x{n}x{k}", bench_gemm, "large", m, n, k)
  if args.suite in ("decode", "all"):
    for n, k in args.decode_nk or DECODE_NK:
      run.guard(f"decode N={n} K={k}", bench_decode, "decode", n, k, args.decode_ms or DECODE_MS,
                DECODE_WEIGHT_BUDGET, CHAIN, args.slow_chain)
  if args.suite in ("quant", "all"):
    run.guard("quant", bench_quant, "quant", QUANT_M, QUANT_K, QUANT_NS)
  if run.on_gpu:  # say so when a column is not what its name promises
    for r in run.rows:
      if r["impl"] == XLA and not any("f8" in c for c in r["lowered_to"]):
        run.notes.append(f"{XLA} {r['suite']} {r['shape']}: XLA did not emit an FP8 cuBLASLt call "
                         f"(lowered_to={r['lowered_to']})")
      if r.get("path") == "reference":
        run.notes.append(f"{r['impl']} {r['suite']} {r['shape']}: ran the pure-JAX reference, "
                         "not the kernel")
      if r["impl"] == QUANT and r.get("path") == "jax":
        run.notes.append(f"{QUANT} {r['suite']}: quantize ran XLA's pure-JAX fusion, not the "
                         "quantization kernel (not built, or not a Hopper GPU)")

  bar_rows = bars(run.rows)
  paths = sorted({r["path"] for r in run.rows if r.get("path") in ("kernel", "reference")})
  meta = dict(
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      suite=args.suite, argv=sys.argv, backend=run.backend, device_kind=run.dev.device_kind,
      device_count=len(jax.devices()), sm_count=run.sm_count or None,
      platform_version=str(getattr(run.dev.client, "platform_version", "")),
      python=platform.python_version(), host=platform.node(), jax=jax.__version__,
      jaxlib=jaxlib.__version__, jax_gmma=jax_gmma.__version__, numpy=np.__version__,
      torch=run.torch.version, torch_note=run.torch.note, torch_recipe=run.torch_recipe,
      kernels_built=_backend.kernels_built(), built_archs=_backend.built_archs(),
      ours_path="/".join(paths) or "n/a", mx_quantizer=MX_QUANTIZER,
      xla_flags=os.environ.get("XLA_FLAGS", ""),
      xla_python_client_preallocate=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
      repeats=args.repeats, repeat_ms=args.repeat_ms, slow_chain=args.slow_chain, seed=args.seed,
      tolerance=TOL, wall_s=round(time.perf_counter() - t_start, 1))
  os.makedirs(args.out, exist_ok=True)
  png = os.path.join(args.out, "bench_blockwise.png")
  if not args.no_plot:
    why = plot(png, run.rows)
    if why:
      run.notes.append(why)
  md = markdown(meta, run.rows, run.notes, run.failures, bar_rows)
  with open(os.path.join(args.out, "bench_blockwise.json"), "w") as f:
    json.dump(dict(meta=meta, rows=run.rows, bars=bar_rows, notes=run.notes,
                   failures=run.failures), f, indent=1, default=str)
  with open(os.path.join(args.out, "bench_blockwise.md"), "w") as f:
    f.write(md + "\n")
  print()
  print(md)
  print(f"wrote {args.out}/bench_blockwise.json, bench_blockwise.md"
        f"{'' if args.no_plot or not os.path.exists(png) else ', bench_blockwise.png'}"
        f" ({meta['wall_s']} s)")
  return exit_code(run.failures)


if __name__ == "__main__":
  sys.exit(main())
