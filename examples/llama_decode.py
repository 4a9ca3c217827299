#!/usr/bin/env python3
"""A Llama-3-8B-shaped decoder (random weights; ``--preset llama3-70b`` for Llama-3-70B's shapes)
as a Flax NNX model, with a KV cache and a jitted decode loop (on one device or tensor parallel
over several), its Linear layers in bf16, XLA's FP8, jax-gmma's FP8 GEMMs, jax-gmma's FP4/FP6
weight-only GEMMs, and emulated block-scaled formats.

Shapes are Llama-3-8B's (hidden 4096, 32 query heads, 8 KV heads (GQA), head dim 128, SwiGLU FFN
14336, vocab 128256, RMSNorm eps 1e-5, RoPE theta 500000, no rope scaling); the layer count is a
flag (``--layers``, default 2; 32 is the full model) and every size can be overridden for a tiny
CPU run (``--preset tiny`` or ``--hidden/--ffn/--heads/--kv-heads/--vocab``).

The float model is :class:`Llama`, an ``nnx.Module`` in bf16: per layer, Q/K/V are one fused
``nnx.Linear`` (``wqkv``) and gate/up another (``w_gate_up``), as inference engines store them;
``wo`` and ``w_down`` are the other two: four GEMMs per layer, at module paths
``layers/<i>/wqkv`` etc. Its weights are random (seeded normal / sqrt(fan_in); ``Llama(cfg,
seed=...)`` stands in for loading a checkpoint). The token embedding, the RMSNorm gains and the
lm_head are plain parameters, no ``nnx.Linear``: they stay bf16 in every variant (as most FP8
checkpoints keep them); the KV cache is bf16.

Each *format* is a variant: a copy of the float model (``nnx.clone``: the arrays it does not
convert stay shared) whose four Linears per layer are converted by rules on their paths
(:data:`LAYER_LINEARS`, :func:`convert_model`):

* ``bf16``: :class:`Bf16Linear`, ``lax.dot_general`` on bf16 operands with the (N, K) = (out,
  in) weight (bf16 out) -- the baseline.
* ``xla_fp8``: :class:`XlaFp8Linear`, XLA's own FP8 path: the weight stored as float8_e4m3fn with
  per-channel scales, the activation quantized per token in plain jnp, both fp8 operands straight
  into ``lax.dot_general(x_fp8, w_fp8, (((1,), (1,)), ((), ())), preferred_element_type=bf16)``
  (what XLA rewrites to a cuBLASLt FP8 GEMM on Hopper), then the scales multiplied in.
* ``fp8_channel``, ``fp8_tensor``, ``fp8_128x128``, ``fp8_1x128`` (the formats ``jax_gmma.dot``
  has a GEMM kernel for): ``jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, FMT)])`` makes
  each Linear a ``jax_gmma.nn.QuantizedLinear``: the weight quantized once, every call
  ``jax_gmma.dot(x, w_q)`` (x bf16, quantized on the fly; bf16 out). The CUTLASS kernel on
  Hopper, the pure-JAX reference elsewhere.
* ``wo:nvfp4``, ``wo:mxfp4``, ``wo:mxfp6_e2m3``, ``wo:mxfp6_e3m2`` (``jax_gmma.weightonly.
  WEIGHT_FORMATS``): ``quantize_model`` with the same spec, FP4 / FP6 *weight-only* GEMMs. The
  weight is quantized once and laid out for the Hopper kernel (a ``jax_gmma.PackedWeight``, N a
  multiple of 16), every call is ``jax_gmma.dot(x, w_p)`` with the bf16 activation as is (no
  activation quantization; bf16 out). The sm_90a weight-only kernel (FP4 widened to bf16 in
  registers, bf16 MMA, float32 accumulation) on Hopper, the pure-JAX reference elsewhere.
* ``emu:FMT`` for any format in ``jax_gmma.FORMATS``: an **emulation, not a kernel**
  (``quantized_linear.EmulatedLinear``). The weight is quantized and dequantized once (kept in
  float32), the activation is quantized and dequantized on every call (per token for FP8
  per-tensor/per-channel weights, 1x128 for 128x128 weights, the same format for MX/NVFP4), and a
  float32 dot multiplies them. It shows what the format's rounding does to the model; its speed
  is not a kernel's speed.

The spec grammar and the emulation live in ``examples/quantized_linear.py`` (shared with
``minilm.py``); ``bf16`` and ``xla_fp8`` are this example's own layers, swapped in by the same
rules.

Quantize, save, reload and run, as a user would (``--save DIR`` / ``--load DIR`` do this per
format; orbax-checkpoint needed)::

  from flax import nnx
  import jax_gmma.nn
  from jax_gmma import checkpoint_orbax

  model = Llama(cfg, seed=0)                                   # the float (bf16) model
  jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, "fp8_channel")])   # in place
  checkpoint_orbax.save_orbax("ckpt/fp8_channel", nnx.state(model))

  # later: an abstract model of the same variant (nothing computed), then the saved arrays
  abstract = nnx.eval_shape(lambda: build_variant(Llama(cfg), parse_variant("fp8_channel")))
  graphdef, target = nnx.split(abstract)
  model = nnx.merge(graphdef, checkpoint_orbax.restore_orbax("ckpt/fp8_channel", target=target))

  graphdef, state = nnx.split(model)           # the jitted functions take both, and merge inside
  logits, cache = prefill(graphdef, state, prompt, max_seq=64)

Generation: one jitted prefill over the prompt fills the cache, then ``--gen-tokens`` greedy
(argmax) decode steps run as a ``lax.fori_loop`` inside **one** jitted function
(:func:`generate`: ``nnx.merge(graphdef, state)`` at trace time, so the quantized weights enter
the program as arguments and nothing is re-quantized per step), so the whole generation is one
XLA program (XLA's command buffers / CUDA graphs apply on a GPU as configured by default).
Reported per format: decode tokens/s (batch x steps / wall time), ms per decode step, speedups vs
bf16 and vs xla_fp8 of the same run, the final-prompt-position logits against the bf16 model's
(cosine, relative error) and greedy-token agreement with the bf16 model (free-running, and
teacher-forced on bf16's tokens).

Tensor parallelism (``--tensor-parallel N``, Megatron-style, on a 1-D mesh of the first N devices,
axis ``tp``; the decode loop stays one jitted program, partitioned by XLA): the float model's
fused projections are first regrouped per device (:func:`tp_layout`: wqkv's output features as
``[q_0 k_0 v_0 | q_1 k_1 v_1 | ...]``, w_gate_up's as ``[gate_0 up_0 | ...]``; the same function).
Then every variant's weights are placed with ``NamedSharding`` (:func:`tp_specs`): wqkv and
w_gate_up column-parallel (output features split; each device whole query and KV heads),
wo and w_down row-parallel (K split; the partial products are summed by an all-reduce: XLA's
for bf16 / xla_fp8 / emulations, jax_gmma.sharding's float32 partials and psum for the FP8
GEMMs), the KV cache split by KV heads, the lm_head by vocabulary rows, the embedding and the
norms replicated. A quantized weight's arrays follow its data (per-channel and 128-row block
scales with N; K-block scales with K; a PackedWeight's 16-row strips with N). The FP4/FP6
weight-only kernel keeps K whole, so its row-parallel GEMMs are :class:`RowParallelWeightOnlyLinear`:
the weight cut into N K-ranges, each prepared on its own, multiplied per device inside
``jax.shard_map`` and summed. ``--check-tp`` also runs every variant on one device and reports
the logits' difference and greedy-token agreement; the JSON records the degree, the per-device
weight bytes and the collectives of the compiled decode loop. Heads, KV heads and the FFN must
divide by N (``--preset tiny-tp`` runs N = 2 and 4 in every format on virtual CPU devices);
``--save`` / ``--load`` need N = 1.

Usage::

  python examples/llama_decode.py --preset tiny                  # seconds on a CPU
  XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \
    python examples/llama_decode.py --preset tiny-tp --tensor-parallel 4 --check-tp
  python3 -P examples/llama_decode.py --preset llama3-70b --layers 4 --tensor-parallel 4 \
    --check-tp --formats bf16,xla_fp8,fp8_channel,fp8_128x128,wo:nvfp4 --json tp4.json  # 4 GPUs
  python examples/llama_decode.py --preset tiny --formats fp8_channel,wo:nvfp4 --save ckpt
  python examples/llama_decode.py --preset tiny --formats fp8_channel,wo:nvfp4 --load ckpt
  python3 -P examples/llama_decode.py --layers 32 --gen-tokens 128 --json out.json   # H200
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import re
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_gmma
from jax_gmma import _backend
from jax_gmma.numerics import shapes
from jax_gmma.sharding import ShardingWarning
from jax_gmma.ops import weightonly

# examples/ on sys.path, for the shared quantized_linear.py (run as a script, with -P, or by path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantized_linear import (  # noqa: E402,F401 (EMU_ACTIVATION_FORMAT: re-exported)
    EMU_ACTIVATION_FORMAT, FrozenWeight, Spec, UnknownFormat, check_checkpoint_dirs,
    checkpoint_path, convert, gemm_formats, kernel_nk, parse_spec, restore_model, save_model,
    weightonly_formats)

BF16 = jnp.bfloat16
F32 = jnp.float32
E4M3_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max)  # 448
F32_TINY = float(np.finfo(np.float32).tiny)
NT = (((1,), (1,)), ((), ()))  # (M, K) x (N, K) -> (M, N)

#: The block-scaled formats: each runs as ``emu:FMT`` by default (fp8_1x128, fp8_128x128 and mxfp8
#: also as a GEMM, by their plain name).
BLOCK_FORMATS = ("fp8_1x128", "fp8_128x128", "mxfp8", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4", "mxfp4")
#: The FP4/FP6 weight-only GEMMs (real kernels on Hopper): each runs as ``wo:FMT`` by default.
WEIGHTONLY_FORMATS = tuple(f"wo:{f}" for f in weightonly_formats())
DEFAULT_FORMATS = ("bf16", "xla_fp8", "fp8_tensor", "fp8_channel") + tuple(
    f"emu:{f}" for f in BLOCK_FORMATS) + WEIGHTONLY_FORMATS
BASELINES = ("bf16", "xla_fp8")

#: The Linears every format converts (module paths, ``re.search``): the four GEMMs of each
#: decoder layer. The embedding, the norms and the lm_head are no ``nnx.Linear``: always bf16.
LAYER_LINEARS = r"^layers/\d+/(wqkv|wo|w_gate_up|w_down)$"
#: File in a ``--save`` directory with the model shape its checkpoints were saved with.
CONFIG_FILE = "config.json"


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Model shape. Defaults: Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json), 2 layers."""
  vocab: int = 128256
  hidden: int = 4096
  layers: int = 2
  heads: int = 32
  kv_heads: int = 8
  head_dim: int = 128
  ffn: int = 14336
  eps: float = 1e-5
  rope_theta: float = 500000.0

  def __post_init__(self):
    for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.heads % self.kv_heads:
      raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even (RoPE), got {self.head_dim}")

  @property
  def qkv_out(self) -> int:
    return (self.heads + 2 * self.kv_heads) * self.head_dim

  def linear_shapes(self) -> Dict[str, Tuple[int, int]]:
    """(N, K) = (out, in) of the four GEMMs of a layer."""
    return {"wqkv": (self.qkv_out, self.hidden), "wo": (self.hidden, self.heads * self.head_dim),
            "w_gate_up": (2 * self.ffn, self.hidden), "w_down": (self.hidden, self.ffn)}

  def n_params(self) -> int:
    per_layer = sum(n * k for n, k in self.linear_shapes().values()) + 2 * self.hidden
    return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden

  def check_gemm_shapes(self) -> None:
    """jax_gmma.dot (and TMA) need K % 16 == 0 and N % 8 == 0 for every GEMM."""
    for name, (n, k) in self.linear_shapes().items():
      if k % shapes.K_ALIGN or n % shapes.N_ALIGN:
        raise ValueError(f"{name}: (N, K) = ({n}, {k}); jax_gmma GEMMs need K % {shapes.K_ALIGN}"
                         f" == 0 and N % {shapes.N_ALIGN} == 0 (choose --hidden/--ffn/--heads/"
                         "--kv-heads/--head-dim accordingly)")

  def check_weightonly_shapes(self) -> None:
    """The FP4 weight-only kernel (wo:FMT) needs N % 16 == 0 (its 16-row tiles; K is padded)."""
    for name, (n, k) in self.linear_shapes().items():
      if n % weightonly.TILE_ROWS:
        raise ValueError(f"{name}: (N, K) = ({n}, {k}); the FP4/FP6 weight-only GEMM (wo:FMT) needs "
                         f"N % {weightonly.TILE_ROWS} == 0 (choose --hidden/--ffn/--heads/"
                         "--kv-heads/--head-dim accordingly)")

  def check_shapes(self, kinds) -> None:
    """The shape rules of the jax-gmma GEMM kinds among ``kinds``."""
    if "gemm" in kinds:
      self.check_gemm_shapes()
    if "weightonly" in kinds:
      self.check_weightonly_shapes()


PRESETS = {
    "llama3-8b": dict(vocab=128256, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336),
    # Llama-3-70B / 3.1-70B / 3.3-70B (80 layers in the full model; --layers picks how many run)
    "llama3-70b": dict(vocab=128256, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672),
    # Tiny, same proportions (GQA group 2, FFN 3.5x hidden): a CPU smoke test in seconds.
    "tiny": dict(vocab=2048, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=896),
    # Tiny for --tensor-parallel 2 and 4: every format's splits stay whole (8 heads, 4 KV heads;
    # each device's share of N a multiple of 512 rows at 4 devices: whole 128x128 scale blocks in
    # the block-scaled kernel's padded scale layout).
    "tiny-tp": dict(vocab=2048, hidden=1024, heads=8, kv_heads=4, head_dim=128, ffn=2048),
}


# ----------------------------------------------------------------------------------------------
# Progress bar: tqdm when importable, else a one-line stderr bar
# ----------------------------------------------------------------------------------------------
class _SimpleBar:
  def __init__(self, total: int, desc: str = "", disable: bool = False, file=None):
    self.total, self.desc, self.disable = max(int(total), 1), desc, disable
    self.file = file or sys.stderr
    self.n, self.postfix, self.t0, self._last = 0, "", time.perf_counter(), ""
    self._draw()

  def _draw(self):
    if self.disable:
      return
    width = 24
    fill = int(width * min(self.n, self.total) / self.total)
    line = (f"{self.desc}: [{'#' * fill}{'.' * (width - fill)}] {self.n}/{self.total} "
            f"{time.perf_counter() - self.t0:.0f}s {self.postfix}")
    if line != self._last:
      self.file.write("\r" + line.ljust(len(self._last)))
      self.file.flush()
      self._last = line

  def update(self, n: int = 1):
    self.n += n
    self._draw()

  def set_postfix_str(self, s: str, refresh: bool = True):
    self.postfix = s
    if refresh:
      self._draw()

  def close(self):
    if not self.disable and self._last:
      self.file.write("\n")
      self.file.flush()
    self.disable = True

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _interactive() -> bool:
  try:
    return sys.stderr.isatty()
  except Exception:  # noqa: BLE001
    return False


def progress_bar(total: int, desc: str, enable: bool = True):
  """A bar on stderr. Stage changes (``stage(bar, text)``) redraw it only on a terminal, so a
  log file gets one line per step, not one per stage."""
  try:
    from tqdm.auto import tqdm
  except Exception:  # noqa: BLE001 - tqdm is optional
    return _SimpleBar(total, desc, disable=not enable)
  return tqdm(total=total, desc=desc, disable=not enable, file=sys.stderr, dynamic_ncols=True,
              leave=True, mininterval=0.5 if _interactive() else 30.0)


def stage(bar, text: str) -> None:
  if bar is not None:
    bar.set_postfix_str(text, refresh=_interactive())


# ----------------------------------------------------------------------------------------------
# The float model (Flax NNX, bf16)
# ----------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("shape", "std"))
def _normal_bf16(key, *, shape, std):
  return (jax.random.normal(key, shape, F32) * std).astype(BF16)


@functools.partial(jax.jit, static_argnames=("shape", "std"))
def _kernel_bf16(key, *, shape, std):
  """The (N, K) = shape weight ~ N(0, std^2) in bf16, returned as nnx.Linear's (K, N) kernel."""
  return _normal_bf16(key, shape=shape, std=std).T


def _linear(kernel, rngs: nnx.Rngs) -> nnx.Linear:
  """An ``nnx.Linear`` (bf16, no bias) holding ``kernel`` (in, out)."""
  k, n = kernel.shape
  return nnx.Linear(k, n, use_bias=False, dtype=BF16, param_dtype=BF16,
                    kernel_init=lambda *_: kernel, rngs=rngs)


class RMSNorm(nnx.Module):
  """Llama's RMSNorm: float32 math, bf16 out; the gain (hidden,) bf16, initialized to 1."""

  def __init__(self, gain, eps: float):
    self.scale = nnx.Param(gain)
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(F32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return (y * self.scale.get_value().astype(F32)).astype(BF16)


#: The mesh axis of tensor parallelism (``--tensor-parallel N``: a 1-D mesh of N devices).
TP_AXIS = "tp"


def tp_degree() -> int:
  """The size of the ``tp`` axis of the mesh this program is traced under (``jax.set_mesh``), 1
  without one: the model's sharding constraints and the row-parallel weight-only layer read it."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or TP_AXIS not in mesh.axis_names:
    return 1
  return int(mesh.shape[TP_AXIS])


def tp_constraint(x, *spec):
  """``x`` constrained to ``PartitionSpec(*spec)`` under a tensor-parallel mesh (activations
  split by heads / features between a column- and a row-parallel GEMM, the KV cache by KV
  heads); ``x`` itself on one device."""
  if tp_degree() == 1:
    return x
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec(*spec))


def rope(x, pos, theta):
  """Rotary embedding, HF Llama convention (rotate_half). x (B, T, n, D), pos (T,) int."""
  d = x.shape[-1]
  inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=F32) / d))
  ang = pos.astype(F32)[:, None] * inv[None, :]                   # (T, D/2)
  cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
  x1, x2 = x[..., : d // 2].astype(F32), x[..., d // 2:].astype(F32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(BF16)


def attention(q, k, v, q_pos):
  """Causal GQA attention. q (B, T, H, D) at absolute positions q_pos (T,); k, v (B, S, KV, D) at
  positions 0..S-1 (cache slots past the current position are masked)."""
  b, t, h, d = q.shape
  kvh = k.shape[2]
  qg = q.reshape(b, t, kvh, h // kvh, d)
  s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=F32) / math.sqrt(d)
  mask = jnp.arange(k.shape[1])[None, :] <= q_pos[:, None]      # (T, S)
  s = jnp.where(mask, s, -1e30)
  p = jax.nn.softmax(s, axis=-1).astype(BF16)
  o = jnp.einsum("bkgts,bskd->btkgd", p, v, preferred_element_type=F32).astype(BF16)
  return o.reshape(b, t, h * d)


class DecoderLayer(nnx.Module):
  """One Llama block: RMSNorm, fused QKV, RoPE, GQA attention, o_proj, RMSNorm, fused gate/up,
  SwiGLU, down_proj. The four projections are ``nnx.Linear`` until a variant converts them."""

  def __init__(self, cfg: LlamaConfig, key, ones, rngs: nnx.Rngs):
    w = {name: _kernel_bf16(jax.random.fold_in(key, j), shape=(n, k), std=1.0 / math.sqrt(k))
         for j, (name, (n, k)) in enumerate(cfg.linear_shapes().items())}
    self.cfg = cfg
    self.attn_norm = RMSNorm(ones, cfg.eps)
    self.wqkv = _linear(w["wqkv"], rngs)
    self.wo = _linear(w["wo"], rngs)
    self.ffn_norm = RMSNorm(ones, cfg.eps)
    self.w_gate_up = _linear(w["w_gate_up"], rngs)
    self.w_down = _linear(w["w_down"], rngs)
    # Groups of the fused wqkv / w_gate_up output features (see tp_layout): 1 = [q | k | v] and
    # [gate | up]; G = per group g, [q_g | k_g | v_g] and [gate_g | up_g] (heads, KV heads and FFN
    # features split in G contiguous ranges), so that a split of the output features over G
    # devices gives each device whole heads and matching gate / up features.
    self.groups = 1

  def __call__(self, h, pos, kv):
    """h (B, T, hidden) bf16 at positions pos (T,) = start + arange(T). kv: None (attend to this
    call's own keys; start must be 0) or this layer's (k, v) cache (B, S, KV, D), updated at pos
    and returned."""
    cfg = self.cfg
    bsz, t, _ = h.shape
    nh, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    g = self.groups
    x = self.attn_norm(h)
    qkv = self.wqkv(x).reshape(bsz, t, g, -1)  # (g = 1: [q | k | v])
    qh, kh = nh // g * d, nkv // g * d
    q = tp_constraint(qkv[..., :qh].reshape(bsz, t, nh, d), None, None, TP_AXIS, None)
    k = tp_constraint(qkv[..., qh:qh + kh].reshape(bsz, t, nkv, d), None, None, TP_AXIS, None)
    v = tp_constraint(qkv[..., qh + kh:].reshape(bsz, t, nkv, d), None, None, TP_AXIS, None)
    q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    if kv is not None:
      kc = jax.lax.dynamic_update_slice(kv[0], k, (0, pos[0], 0, 0))
      vc = jax.lax.dynamic_update_slice(kv[1], v, (0, pos[0], 0, 0))
      kc = tp_constraint(kc, None, None, TP_AXIS, None)
      vc = tp_constraint(vc, None, None, TP_AXIS, None)
      kv = (kc, vc)
      k, v = kc, vc
    h = h + self.wo(tp_constraint(attention(q, k, v, pos), None, None, TP_AXIS))
    x = self.ffn_norm(h)
    gu = self.w_gate_up(x).reshape(bsz, t, g, 2, cfg.ffn // g)  # (g = 1: [gate | up])
    act = (jax.nn.silu(gu[..., 0, :].astype(F32)) * gu[..., 1, :].astype(F32)).astype(BF16)
    h = h + self.w_down(tp_constraint(act.reshape(bsz, t, cfg.ffn), None, None, TP_AXIS))
    return h, kv


class Llama(nnx.Module):
  """The float (bf16) decoder with seeded random weights: Linear weights (N, K) ~ N(0, 1/K)
  (unit-variance outputs for unit-variance inputs), embedding ~ N(0, 1), lm_head (vocab, hidden)
  ~ N(0, 1/hidden), RMSNorm gains 1. Generated on the default device one matrix at a time (under
  ``nnx.eval_shape``: nothing generated, an abstract model).

  ``model(tokens, start, cache, last_only)``: tokens (B, T) at positions start.. -> float32
  logits (B, T, V) (or (B, V) at the last position) and the updated cache (a list of per-layer
  (k, v), or None)."""

  def __init__(self, cfg: LlamaConfig, *, seed: int = 0, progress: bool = False):
    root = jax.random.PRNGKey(seed)
    rngs = nnx.Rngs(seed)  # nnx.Linear's constructor takes one; the kernels are given
    ones = jnp.ones((cfg.hidden,), BF16)
    self.cfg = cfg
    self.embed = nnx.Param(_normal_bf16(jax.random.fold_in(root, 1_000_000),
                                        shape=(cfg.vocab, cfg.hidden), std=1.0))
    layers = []
    with progress_bar(cfg.layers, "random weights (layers)", progress) as bar:
      for i in range(cfg.layers):
        layers.append(DecoderLayer(cfg, jax.random.fold_in(root, i), ones, rngs))
        if progress:
          jax.block_until_ready(nnx.state(layers[-1]))
        bar.update()
    self.layers = nnx.List(layers)
    self.final_norm = RMSNorm(ones, cfg.eps)
    self.lm_head = nnx.Param(_normal_bf16(jax.random.fold_in(root, 1_000_001),
                                          shape=(cfg.vocab, cfg.hidden),
                                          std=1.0 / math.sqrt(cfg.hidden)))

  def __call__(self, tokens, start, cache, last_only: bool):
    t = tokens.shape[1]
    pos = start + jnp.arange(t, dtype=jnp.int32)
    h = self.embed.get_value()[tokens]
    new_cache = []
    for i, layer in enumerate(self.layers):
      h, kv = layer(h, pos, None if cache is None else cache[i])
      new_cache.append(kv)
    if last_only:
      h = h[:, -1]
    h = self.final_norm(h)
    logits = jnp.einsum("...k,vk->...v", h, self.lm_head.get_value(), preferred_element_type=F32)
    return logits, (None if cache is None else new_cache)


# ----------------------------------------------------------------------------------------------
# Formats (model variants)
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Variant(Spec):
  """A format spec: kind "bf16", "xla_fp8", or a jax-gmma GEMM / emulation / weight-only spec
  (``quantized_linear``). Hashable."""

  @property
  def description(self) -> str:
    return {"bf16": "bf16 dot (baseline)",
            "xla_fp8": "XLA fp8 dot_general",
            "gemm": "jax_gmma.dot GEMM",
            "weightonly": "FP4/FP6 weight-only GEMM (x bf16)",
            "emulated": f"emulation (x {self.x_format})"}[self.kind]


def parse_variant(spec: str) -> Variant:
  """``bf16`` | ``xla_fp8`` | a jax_gmma.dot GEMM format | ``emu:FMT`` (quantize/dequantize) |
  ``wo:FMT`` (FP4/FP6 weight-only GEMM)."""
  spec = spec.strip()
  if spec in ("bf16", "xla_fp8"):
    return Variant(label=spec, kind=spec)
  try:
    return parse_spec(spec, Variant)
  except UnknownFormat:
    raise ValueError(f"{spec}: unknown format; use bf16, xla_fp8, a GEMM format "
                     f"({', '.join(gemm_formats())}), emu:FMT with FMT in "
                     f"{', '.join(jax_gmma.FORMATS)}, or wo:FMT (FP4/FP6 weight-only GEMM) with FMT "
                     f"in {', '.join(weightonly_formats())}") from None


class Bf16Linear(nnx.Module):
  """``bf16``: ``y = x @ w.T`` as ``lax.dot_general`` on bf16 operands, bf16 out, with the
  (N, K) = (out, in) weight (the layout every other variant multiplies)."""

  def __init__(self, w):
    self.kernel = FrozenWeight(w)

  @classmethod
  def from_linear(cls, linear: nnx.Linear) -> "Bf16Linear":
    return cls(kernel_nk(linear))

  def __call__(self, x):
    lead, k = x.shape[:-1], x.shape[-1]
    y = jax.lax.dot_general(x.reshape(-1, k), self.kernel.get_value(), NT,
                            preferred_element_type=BF16)
    return y.reshape(*lead, y.shape[-1])


def _quantize_per_token_e4m3(x2):
  """(M, K) float -> (M, K) float8_e4m3fn, (M,) float32 dequantization scales (amax / 448 per
  row, zero rows -> 1): jax_gmma's fp8_channel rule, spelled in plain jnp for the XLA path."""
  x32 = x2.astype(F32)
  amax = jnp.max(jnp.abs(x32), axis=-1)
  scale = jnp.where(amax > 0, jnp.maximum(amax / E4M3_MAX, F32_TINY), 1.0)
  q = jnp.clip(x32 / scale[:, None], -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
  return q, scale


class XlaFp8Linear(nnx.Module):
  """``xla_fp8``: XLA's FP8 GEMM. The (N, K) weight as float8_e4m3fn with (N,) float32
  per-channel scales (``jax_gmma.quantize(w, "fp8_channel")``, once); every call quantizes x per
  token in plain jnp and hands both fp8 operands to ``lax.dot_general`` (bf16 out), then
  multiplies the scales in."""

  def __init__(self, w8, scales):
    self.kernel = FrozenWeight(w8)
    self.scales = FrozenWeight(scales)

  @classmethod
  def from_linear(cls, linear: nnx.Linear) -> "XlaFp8Linear":
    q = jax_gmma.quantize(kernel_nk(linear), "fp8_channel")  # data (N, K) e4m3, scales (N, 1)
    return cls(q.data, q.scales.reshape(-1))

  def __call__(self, x):
    lead, k = x.shape[:-1], x.shape[-1]
    x8, sx = _quantize_per_token_e4m3(x.reshape(-1, k))
    y = jax.lax.dot_general(x8, self.kernel.get_value(), NT,
                            preferred_element_type=BF16)  # fp8 x fp8 -> bf16
    y = (y.astype(F32) * sx[:, None] * self.scales.get_value()[None, :]).astype(BF16)
    return y.reshape(*lead, y.shape[-1])


def own_layer(linear: nnx.Linear, variant: Variant) -> nnx.Module:
  """This example's own layers (``convert``'s ``make``): bf16, xla_fp8, and the row-parallel
  weight-only GEMMs of a tensor-parallel model."""
  if variant.kind == "bf16":
    return Bf16Linear.from_linear(linear)
  if variant.kind == "xla_fp8":
    return XlaFp8Linear.from_linear(linear)
  if variant.kind == "wo_rows":
    return RowParallelWeightOnlyLinear.from_linear(linear, variant.fmt, variant.shards)
  raise ValueError(f"{variant.label}: no layer of kind {variant.kind!r}")


def rules(variant: Variant, tp: int = 1):
  """The conversion rules of a variant: the four Linears of every layer to its spec (the rest
  has no ``nnx.Linear``); with ``tp`` > 1 a weight-only format's row-parallel GEMMs (wo,
  w_down) become :class:`RowParallelWeightOnlyLinear` (its kernel keeps K whole)."""
  if variant.kind == "weightonly" and tp > 1:
    rows = RowShards(label=f"{variant.label}/rows", kind="wo_rows", fmt=variant.fmt, shards=tp)
    return [(ROW_PATTERN, rows), (LAYER_LINEARS, variant)]
  return [(LAYER_LINEARS, variant)]


def convert_model(model: Llama, variant: Variant, tp: int = 1):
  """Converts the float ``model`` to ``variant`` in place: jax-gmma formats through
  ``jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, spec)])``, bf16 / xla_fp8 / emu:FMT
  through this example's layers (``tp``: see :func:`rules`). Returns quantize_model's summary
  (None for the others)."""
  return convert(model, rules(variant, tp), own_layer)


def build_variant(model: Llama, variant: Variant, tp: int = 1) -> Llama:
  """A converted copy of the float ``model`` (``nnx.clone``: it shares the arrays it does not
  convert, e.g. the embedding and lm_head); the float model is left as it is."""
  out = nnx.clone(model)
  convert_model(out, variant, tp)
  return out


def tree_nbytes(tree) -> int:
  return int(sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape))
                 for a in jax.tree_util.tree_leaves(tree)))


# ----------------------------------------------------------------------------------------------
# Tensor parallelism (--tensor-parallel N): Megatron-style placement on a 1-D mesh of N devices
# ----------------------------------------------------------------------------------------------
#: Column-parallel GEMMs (output features split: each device computes whole heads / FFN
#: features) and row-parallel GEMMs (K split: each device a partial product, summed by an
#: all-reduce that XLA inserts, or jax_gmma's partitioning rule: float32 partials and a psum).
COLUMN_LINEARS = ("wqkv", "w_gate_up")
ROW_LINEARS = ("wo", "w_down")
ROW_PATTERN = r"^layers/\d+/(wo|w_down)$"
#: The collectives of a compiled program (hlo_collectives).
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e8m0fnu": 1, "f4e2m1fn": 1,
              "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
              "s64": 8, "u64": 8}


def check_tp_shapes(cfg: LlamaConfig, tp: int) -> None:
  """The shape rules of ``--tensor-parallel tp``: every device holds whole query heads, whole
  KV heads (no KV head replication) and ffn / tp FFN features."""
  if tp < 1:
    raise ValueError(f"--tensor-parallel must be >= 1, got {tp}")
  for name, v in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads), ("ffn", cfg.ffn)):
    if v % tp:
      raise ValueError(f"--tensor-parallel {tp}: {name} ({v}) must be a multiple of it (each device "
                       "holds whole query heads, whole KV heads and an equal share of the FFN)")


def tp_mesh(tp: int):
  """A 1-D mesh of the first ``tp`` devices, axis ``tp`` (Auto: XLA propagates the shardings)."""
  devs = jax.devices()
  if tp > len(devs):
    raise ValueError(f"--tensor-parallel {tp}: only {len(devs)} {jax.default_backend()} device(s) "
                     "visible (on a CPU: XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  return jax.make_mesh((tp,), (TP_AXIS,), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devs[:tp])


def tp_layout(model: Llama, groups: int) -> Llama:
  """Reorders, in place, the output features of the float model's fused projections into
  ``groups`` groups (``DecoderLayer.groups``): wqkv's ``[q | k | v]`` becomes ``[q_0 k_0 v_0 |
  q_1 k_1 v_1 | ...]`` (group g: query heads g * H / G.., KV heads g * KV / G..) and w_gate_up's
  ``[gate | up]`` becomes ``[gate_0 up_0 | gate_1 up_1 | ...]``, so that splitting the output
  features over G devices gives each whole heads with their KV heads and matching gate / up
  features (vLLM's QKVParallelLinear / MergedColumnParallelLinear). The model computes the same
  function (a permutation of the rows of two weights; per-row scales follow their rows), but
  block-scaled formats quantize the permuted weight (other 128-row blocks). Returns ``model``."""
  cfg = model.cfg
  check_tp_shapes(cfg, groups)
  if groups == 1:
    return model
  nh, nkv, d, f = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn
  qs, ks = nh // groups * d, nkv // groups * d
  qkv = np.concatenate([np.concatenate([np.arange(g * qs, (g + 1) * qs),
                                        nh * d + np.arange(g * ks, (g + 1) * ks),
                                        (nh + nkv) * d + np.arange(g * ks, (g + 1) * ks)])
                        for g in range(groups)])
  fs = f // groups
  gate_up = np.concatenate([np.concatenate([np.arange(g * fs, (g + 1) * fs),
                                            f + np.arange(g * fs, (g + 1) * fs)])
                            for g in range(groups)])
  for layer in model.layers:
    if layer.groups != 1:
      raise ValueError("tp_layout: the model is laid out for tensor parallelism already")
    for lin, idx in ((layer.wqkv, qkv), (layer.w_gate_up, gate_up)):
      lin.kernel.set_value(jnp.asarray(lin.kernel.get_value())[:, idx])  # (K, N): columns = N
    layer.groups = groups
  return model


@dataclasses.dataclass(frozen=True)
class RowShards(Variant):
  """A weight-only format on the row-parallel GEMMs of a tensor-parallel model (this example's
  own layer, :class:`RowParallelWeightOnlyLinear`): K cut into ``shards`` ranges."""
  shards: int = 1


def _partial_products(x, packed, scales, global_scale, *, meta):
  """sum_g x[:, g-th K range] @ w_g.T in float32, over the stacked weights' leading axis."""
  kk = meta["k"]
  acc = None
  for g in range(packed.shape[0]):
    w = weightonly.PackedWeight(packed[g], scales[g], global_scale[g], **meta)
    y = jax_gmma.dot(x[:, g * kk:(g + 1) * kk], w, out_dtype=F32)
    acc = y if acc is None else acc + y
  return acc


class RowParallelWeightOnlyLinear(nnx.Module):
  """``wo:FMT`` on a row-parallel GEMM (wo, w_down) of a tensor-parallel model. The FP4/FP6
  weight-only kernel keeps K whole (packed K tiles, padded K: ``jax_gmma.sharding`` never splits
  it), so the (N, K) weight is cut into ``shards`` K ranges, each quantized and laid out as an (N,
  K / shards) weight: one stacked PackedWeight (``weightonly.prepare`` of the (shards, N, K /
  shards) ranges) whose leading axis is split over the mesh. Under a ``tp`` mesh each device
  multiplies its columns of x by its ranges (float32) inside ``jax.shard_map`` and the partials
  are summed (``psum``, the all-reduce); on one device the ranges run in turn and are summed:
  the same weights, the same products (up to the order of float32 additions)."""

  def __init__(self, stacked: weightonly.PackedWeight):
    self.kernel_shards = FrozenWeight(stacked)
    self.format = stacked.format

  @classmethod
  def from_linear(cls, linear: nnx.Linear, fmt: str, shards: int) -> "RowParallelWeightOnlyLinear":
    w = kernel_nk(linear)
    n, k = w.shape
    if k % shards:
      raise ValueError(f"K = {k} is not a multiple of the {shards} tensor-parallel shards")
    return cls(weightonly.prepare(w.reshape(n, shards, k // shards).transpose(1, 0, 2), fmt))

  def __call__(self, x):
    w = self.kernel_shards.get_value()
    lead, k = x.shape[:-1], x.shape[-1]
    leaves = (w.packed, w.scales, w.global_scale)
    meta = dict(format=w.format, n=w.n, k=w.k, fp8_exact=w.fp8_exact, layout=w.layout)
    x2 = x.reshape(-1, k).astype(BF16)
    if tp_degree() == 1:
      y = _partial_products(x2, *leaves, meta=meta)
    else:
      P = jax.sharding.PartitionSpec
      body = lambda x, *l: jax.lax.psum(_partial_products(x, *l, meta=meta), TP_AXIS)  # noqa: E731
      y = jax.shard_map(body, mesh=jax.sharding.get_abstract_mesh(),
                        in_specs=(P(None, TP_AXIS),) + (P(TP_AXIS),) * 3, out_specs=P())(x2, *leaves)
    return y.astype(x.dtype).reshape(*lead, w.n)


def _key_names(path) -> list:
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def tp_specs(params, tp: int, vocab_split: bool = True):
  """The PartitionSpec of every leaf of a variant's state (``nnx.to_pure_dict``) on a ``tp``
  mesh: column-parallel GEMMs (wqkv, w_gate_up) split along their output features N -- every
  leaf of the weight along its first axis: bf16 / fp8 data, per-channel and 128-row block
  scales, a PackedWeight's 16-row strips (a per-tensor scale stays whole); row-parallel GEMMs
  (wo, w_down) along K -- the second axis of the data and of K-block scales (per-channel scales
  stay whole), the leading (range) axis of a RowParallelWeightOnlyLinear's stacked weight; the
  lm_head split by vocabulary rows (``vocab_split``, when the vocabulary divides); the
  embedding and the norms replicated. These are the splits jax_gmma.sharding's rules keep
  (N, and K for the FP8 GEMMs); a dimension that does not divide raises ValueError."""
  P = jax.sharding.PartitionSpec

  def spec(path, leaf):
    names = _key_names(path)
    shape = tuple(leaf.shape)

    def split(axis):
      if shape[axis] % tp:
        raise ValueError(f"{'/'.join(names)}: axis {axis} of shape {shape} does not split into "
                         f"{tp} tensor-parallel shards")
      return P(*[TP_AXIS if a == axis else None for a in range(len(shape))])

    if "kernel_shards" in names:
      return split(0)
    if names and names[0] == "layers":
      lin = next((n for n in names if n in COLUMN_LINEARS + ROW_LINEARS), None)
      if lin in COLUMN_LINEARS and len(shape) >= 1 and shape[0] > 1:
        return split(0)
      if lin in ROW_LINEARS and len(shape) >= 2 and shape[1] > 1:
        return split(1)
      return P()
    if vocab_split and names == ["lm_head"] and shape[0] % tp == 0:
      return split(0)
    return P()

  return jax.tree_util.tree_map_with_path(spec, params)


def place(params, mesh):
  """``params`` on ``mesh`` per :func:`tp_specs`."""
  specs = tp_specs(params, mesh.shape[TP_AXIS])
  shardings = jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs)
  return jax.device_put(params, shardings)


def per_device_nbytes(tree) -> int:
  """Bytes of ``tree``'s arrays that one device holds (the largest share)."""
  per: Counter = Counter()
  for a in jax.tree_util.tree_leaves(tree):
    item = np.dtype(a.dtype).itemsize
    sh = getattr(a, "sharding", None)
    if sh is None:
      per["-"] += item * int(np.prod(a.shape))
      continue
    for dev, idx in sh.devices_indices_map(tuple(a.shape)).items():
      size = 1
      for i, n in zip(idx, a.shape):
        start, stop, _ = i.indices(n)
        size *= stop - start
      per[dev] += item * size
  return int(max(per.values(), default=0))


def hlo_collectives(text: str) -> Dict[str, Dict[str, Any]]:
  """The collectives of a compiled program's HLO text: op -> count and the bytes of its largest
  result array (``-start`` / ``-done`` async pairs counted once)."""
  out: Dict[str, Dict[str, Any]] = {}
  for line in text.splitlines():
    m = re.search(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
    if not m:
      continue
    sizes = [_HLO_BYTES.get(dt, 4) * math.prod(int(x) for x in dims.split(",") if x)
             for dt, dims in re.findall(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]", m.group(1))]
    rec = out.setdefault(m.group(2), {"count": 0, "max_bytes": 0})
    rec["count"] += 1
    rec["max_bytes"] = max(rec["max_bytes"], max(sizes, default=0))
  return out


# ----------------------------------------------------------------------------------------------
# Checkpoints (orbax, through jax_gmma.checkpoint_orbax; quantized_linear's helpers)
# ----------------------------------------------------------------------------------------------
def abstract_variant(cfg: LlamaConfig, variant: Variant) -> Llama:
  """The variant's model without values (``nnx.eval_shape``: nothing generated or quantized):
  the target a checkpoint is restored into."""
  return nnx.eval_shape(lambda: build_variant(Llama(cfg), variant))


def load_model(path, cfg: LlamaConfig, variant: Variant) -> Llama:
  """The variant saved at ``path`` by ``save_model``, bit-exact."""
  return restore_model(path, abstract_variant(cfg, variant))


def _check_checkpoint_dirs(cfg: LlamaConfig, labels: Sequence[str], save_dir, load_dir) -> None:
  """Refuse, before any weight is built: a --load directory of another model shape or lacking a
  format, a --save directory of another shape or already holding a format."""
  want = dataclasses.asdict(cfg)
  for root, loading in ((load_dir, True), (save_dir, False)):
    if root is None:
      continue
    cfile = Path(root) / CONFIG_FILE
    if cfile.is_file():
      saved = json.loads(cfile.read_text()).get("config")
      if saved != want:
        raise ValueError(f"{root} holds checkpoints of the model {saved}, not {want}: pass the "
                         "same shape flags (--preset/--layers/--hidden/...) as when it was saved"
                         + ("" if loading else ", or another --save directory"))
    elif loading:
      raise ValueError(f"--load {root}: no {CONFIG_FILE} there (write it with --save {root})")
  check_checkpoint_dirs(labels, save_dir, load_dir)


# ----------------------------------------------------------------------------------------------
# Jitted programs: the graphdef static, the state (an nnx.State, or its nnx.to_pure_dict) an
# argument, nnx.merge inside (at trace time: the weights enter the program as its arguments)
# ----------------------------------------------------------------------------------------------
def empty_cache(cfg: LlamaConfig, batch: int, max_seq: int):
  shape = (batch, max_seq, cfg.kv_heads, cfg.head_dim)
  return [(jnp.zeros(shape, BF16), jnp.zeros(shape, BF16)) for _ in range(cfg.layers)]


@functools.partial(jax.jit, static_argnums=0)
def forward(graphdef, state, tokens):
  """No KV cache: logits (B, T, V) float32 for the whole sequence (causal), recomputed."""
  model = nnx.merge(graphdef, state)
  return model(tokens, 0, None, last_only=False)[0]


@functools.partial(jax.jit, static_argnums=0, static_argnames=("max_seq",))
def prefill(graphdef, state, tokens, *, max_seq: int):
  """One call over the prompt (B, P): last-position logits (B, V) float32 and the KV cache
  (B, max_seq, KV, D) per layer with slots 0..P-1 filled."""
  model = nnx.merge(graphdef, state)
  cache = empty_cache(model.cfg, tokens.shape[0], max_seq)
  return model(tokens, 0, cache, last_only=True)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("steps", "collect_logits"),
                   donate_argnames=("cache",))
def generate(graphdef, state, cache, tok0, start, forced, use_forced, *, steps: int,
             collect_logits: bool = False):
  """``steps`` greedy decode steps in one XLA program (a fori_loop over tokens).

  Step i feeds one token per sequence at position start + i -- tok0 at i = 0, then the previous
  step's argmax; or ``forced[:, i]`` when ``use_forced`` (teacher forcing) -- and writes the
  argmax of its logits to tokens[:, i]. Returns tokens (B, steps) int32, the cache, and with
  ``collect_logits`` the float32 logits (steps, B, V)."""
  model = nnx.merge(graphdef, state)
  bsz = tok0.shape[0]
  toks = jnp.zeros((bsz, steps), jnp.int32)
  logits_acc = jnp.zeros((steps, bsz, model.cfg.vocab), F32) if collect_logits else None

  def body(i, carry):
    cache, tok, toks, logits_acc = carry
    tok_in = jnp.where(use_forced, forced[:, i], tok)
    logits, cache = model(tok_in[:, None], start + i, cache, last_only=True)
    nxt = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    toks = jax.lax.dynamic_update_slice(toks, nxt[:, None], (0, i))
    if logits_acc is not None:
      logits_acc = jax.lax.dynamic_update_slice(logits_acc, logits[None], (i, 0, 0))
    return cache, nxt, toks, logits_acc

  cache, _, toks, logits_acc = jax.lax.fori_loop(
      0, steps, body, (cache, tok0.astype(jnp.int32), toks, logits_acc))
  return (toks, cache, logits_acc) if collect_logits else (toks, cache)


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def logits_metrics(ref: np.ndarray, got: np.ndarray) -> Dict[str, float]:
  """ref, got (..., V): cosine per row (mean, min), relative L2 error, top-1 agreement."""
  r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
  g = got.reshape(-1, got.shape[-1]).astype(np.float64)
  cos = np.sum(r * g, 1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1))
  return {"cos_mean": float(np.mean(cos)), "cos_min": float(np.min(cos)),
          "rel_err": float(np.linalg.norm(g - r) / np.linalg.norm(r)),
          "top1_agree": float(np.mean(np.argmax(r, 1) == np.argmax(g, 1)))}


def token_agreement(ref: np.ndarray, got: np.ndarray) -> Dict[str, Any]:
  """ref, got (B, T) token ids: fraction equal, and per sequence the first index that differs
  (T when none does)."""
  eq = ref == got
  first = [int(np.argmin(row)) if not row.all() else int(row.size) for row in eq]
  return {"agree": float(np.mean(eq)), "first_divergence": first}


def hlo_custom_calls(compiled) -> Dict[str, int]:
  """custom_call targets in a compiled program, with counts (on a GPU: which GEMM each dot
  became, e.g. __cublas$lt$matmul$f8 for XLA's FP8 path, jax_gmma's FFI target for dot)."""
  try:
    text = compiled.as_text()
  except Exception:  # noqa: BLE001 - best effort
    return {}
  return dict(Counter(re.findall(r'custom_call_target="([^"]+)"', text)))


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
def _sync(x):
  return jax.block_until_ready(x)


class Programs:
  """A variant's compiled prefill and decode loop on one device or a ``tp`` mesh, with the
  decode loop's compiled HLO text and the ShardingWarnings its compilation raised."""

  def __init__(self, graphdef, params, prompt, steps: int, max_seq: int, mesh=None):
    self.params, self.prompt, self.mesh = params, prompt, mesh
    bsz, plen = prompt.shape
    self.start = jnp.asarray(plen, jnp.int32)
    self.no_force = jnp.zeros((bsz, steps), jnp.int32)
    self.flags = {False: jnp.asarray(False), True: jnp.asarray(True)}  # on device before timing
    with self._context(), warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", ShardingWarning)
      t0 = time.perf_counter()
      self.pre_c = prefill.lower(graphdef, params, prompt, max_seq=max_seq).compile()
      logits0, cache = self.pre_c(params, prompt)
      tok0 = jnp.argmax(logits0, -1).astype(jnp.int32)
      self.gen_c = generate.lower(graphdef, params, cache, tok0, self.start, self.no_force,
                                  self.flags[False], steps=steps).compile()
      self.compile_s = time.perf_counter() - t0
    self.sharding_warnings = sorted({str(w.message) for w in caught
                                     if issubclass(w.category, ShardingWarning)})
    for w in caught:  # the others as they would have been shown
      if not issubclass(w.category, ShardingWarning):
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    try:
      self.hlo = self.gen_c.as_text()
    except Exception:  # noqa: BLE001 - informational
      self.hlo = ""

  def _context(self):
    return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

  def once(self, forced=None):
    """(prefill + first token) and (decode loop) wall times; only device work in between.
    ``forced``: teacher-force these (B, steps) tokens."""
    use = forced is not None
    forced = self.no_force if forced is None else forced
    with self._context():
      t_a = time.perf_counter()
      logits0, cache = self.pre_c(self.params, self.prompt)
      tok0 = _sync(jnp.argmax(logits0, -1).astype(jnp.int32))
      _sync(cache)
      t_b = time.perf_counter()
      toks, _ = _sync(self.gen_c(self.params, cache, tok0, self.start, forced, self.flags[use]))
      t_c = time.perf_counter()
    return logits0, tok0, toks, t_b - t_a, t_c - t_b


def _generations(programs: Programs, repeats: int, label: str, bar=None):
  """A warm-up, then ``repeats`` timed generations: (logits0 (B, V) float32, tokens (B, steps +
  1), prefill times, decode times)."""
  stage(bar, f"{label}: warm-up")
  programs.once()
  pre_t, gen_t = [], []
  for r in range(repeats):
    stage(bar, f"{label}: generate {r + 1}/{repeats}")
    logits0, tok0, toks, tp, tg = programs.once()
    pre_t.append(tp)
    gen_t.append(tg)
  logits0 = np.asarray(logits0, np.float32)
  tokens = np.concatenate([np.asarray(tok0)[:, None], np.asarray(toks)], axis=1)
  return logits0, tokens, pre_t, gen_t


def tp_difference(one: Dict[str, np.ndarray], tp: Dict[str, np.ndarray]) -> Dict[str, Any]:
  """The tensor-parallel run against the same variant on one device: prefill logits (max abs
  and relative (Frobenius) difference, top-1 agreement) and the greedy tokens."""
  r, g = one["logits0"].astype(np.float64), tp["logits0"].astype(np.float64)
  return {"logits_max_abs_diff": float(np.max(np.abs(g - r))),
          "logits_rel_diff": float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)),
          "logits_max_abs": float(np.max(np.abs(r))),
          "top1_agree": float(np.mean(np.argmax(r, -1) == np.argmax(g, -1))),
          "greedy": token_agreement(one["tokens"], tp["tokens"]),
          "greedy_equal": bool(np.array_equal(one["tokens"], tp["tokens"]))}


def run_variant(variant: Variant, model: Optional[Llama], cfg: LlamaConfig, prompt, steps: int,
                max_seq: int, repeats: int, bar=None, ref: Optional[Dict[str, np.ndarray]] = None,
                save_dir=None, load_dir=None, mesh=None,
                check_tp: bool = False) -> Tuple[Dict[str, Any], Dict[str, np.ndarray]]:
  """Build the variant from the float ``model`` (or load it from ``load_dir``; save it to
  ``save_dir``), compile, generate (timed ``repeats`` times) and, given the bf16 run ``ref``,
  teacher-force it on bf16's tokens. With ``mesh`` (tensor parallelism; ``model`` laid out by
  :func:`tp_layout`) the weights are placed by :func:`tp_specs` and the programs are
  partitioned over the mesh; ``check_tp`` also runs the same variant on one device and
  compares. Returns (row, arrays)."""
  tp = 1 if mesh is None else int(mesh.shape[TP_AXIS])
  t0 = time.perf_counter()
  if load_dir is not None:
    stage(bar, f"{variant.label}: load")
    vmodel = load_model(checkpoint_path(load_dir, variant.label), cfg, variant)
  else:
    stage(bar, f"{variant.label}: convert")
    vmodel = build_variant(model, variant, tp)
  graphdef, state = nnx.split(vmodel)
  # The compiled programs take the state as a plain nested dict (nnx.to_pure_dict; nnx.merge
  # takes it as it takes the State): the cheapest pytree to flatten on every call.
  params = _sync(nnx.to_pure_dict(state))
  params_one = params
  if mesh is not None:
    stage(bar, f"{variant.label}: place on {tp} devices")
    params = _sync(place(params, mesh))
  prep_s = time.perf_counter() - t0
  checkpoint: Dict[str, Any] = {}
  if load_dir is not None:
    checkpoint["loaded"] = str(checkpoint_path(load_dir, variant.label))
  if save_dir is not None:
    stage(bar, f"{variant.label}: save")
    path = checkpoint_path(save_dir, variant.label)
    t0 = time.perf_counter()
    save_model(path, vmodel)
    checkpoint.update(saved=str(path), save_s=time.perf_counter() - t0)
  weight_bytes = tree_nbytes(state)
  layer_bytes = tree_nbytes(nnx.state(vmodel.layers))
  bsz, plen = prompt.shape

  stage(bar, f"{variant.label}: compile")
  progs = Programs(graphdef, params, prompt, steps, max_seq, mesh)
  calls = hlo_custom_calls(progs.gen_c)
  logits0, tokens, pre_t, gen_t = _generations(progs, repeats, variant.label, bar)
  gen_s = float(np.median(gen_t))
  row: Dict[str, Any] = {
      "format": variant.label, "kind": variant.kind, "what_runs": variant.description,
      "tokens_per_s": bsz * steps / gen_s, "ms_per_token": 1e3 * gen_s / steps,
      "decode_s": gen_s, "decode_s_all": gen_t, "prefill_ms": 1e3 * float(np.median(pre_t)),
      "prefill_ms_all": [1e3 * x for x in pre_t], "compile_s": progs.compile_s, "prepare_s": prep_s,
      "layer_weight_bytes": layer_bytes, "weight_bytes": weight_bytes,
      "custom_calls": calls, "tp": tp,
  }
  if mesh is not None:
    row["weight_bytes_per_device"] = per_device_nbytes(params)
    row["layer_weight_bytes_per_device"] = per_device_nbytes(params["layers"])
    row["collectives"] = hlo_collectives(progs.hlo)
    row["sharding_warnings"] = progs.sharding_warnings
  if checkpoint:
    row["checkpoint"] = checkpoint
  if not np.all(np.isfinite(logits0)):
    raise FloatingPointError(f"{variant.label}: non-finite prefill logits")
  arrays = {"logits0": logits0, "tokens": tokens}
  if mesh is not None and check_tp:
    stage(bar, f"{variant.label}: the same on one device")
    one = Programs(graphdef, params_one, prompt, steps, max_seq)
    l1, t1, _, g1 = _generations(one, repeats, f"{variant.label} (1 device)", bar)
    row["tp_check"] = tp_difference({"logits0": l1, "tokens": t1}, arrays)
    row["tp_check"]["tokens_per_s_1dev"] = bsz * steps / float(np.median(g1))
    row["tp_check"]["speedup_vs_1dev"] = row["tokens_per_s"] / row["tp_check"]["tokens_per_s_1dev"]
    del one
  if ref is not None:
    stage(bar, f"{variant.label}: teacher-forced vs bf16")
    ref_tokens = ref["tokens"]
    _, tf0, tf_toks, _, _ = progs.once(jnp.asarray(ref_tokens[:, :steps], jnp.int32))
    tf = np.concatenate([np.asarray(tf0)[:, None], np.asarray(tf_toks)], axis=1)
    row["logits_vs_bf16"] = logits_metrics(ref["logits0"], logits0)
    row["greedy_vs_bf16"] = token_agreement(ref_tokens, tokens)
    row["teacher_forced_vs_bf16"] = token_agreement(ref_tokens, tf)
  return row, arrays


def run(formats: Sequence[str] = DEFAULT_FORMATS, cfg: LlamaConfig = LlamaConfig(),
        batch: int = 1, prompt_len: int = 32, gen_tokens: int = 32, max_seq: Optional[int] = None,
        repeats: int = 3, seed: int = 0, progress: bool = True, log=print, save_dir=None,
        load_dir=None, tp: int = 1, check_tp: bool = False) -> Dict[str, Any]:
  """Build the float (bf16) model, then run every format on the same prompt. The bf16 model
  always runs first (it is the reference of every comparison). ``save_dir``: save every variant
  there (orbax, one directory per format); ``load_dir``: load every variant from there instead
  of building it (no float model is generated). ``tp`` > 1: tensor parallelism over the first
  ``tp`` devices (:func:`tp_layout`, :func:`tp_specs`); ``check_tp``: each format also runs on
  one device, compared (``tp_check`` of its row)."""
  variants = [parse_variant(f) for f in formats]
  labels = [v.label for v in variants]
  if len(set(labels)) != len(labels):
    raise ValueError(f"duplicate formats in {labels}")
  variants = [parse_variant("bf16")] + [v for v in variants if v.label != "bf16"]
  if gen_tokens < 1 or prompt_len < 1 or batch < 1 or repeats < 1:
    raise ValueError("batch, prompt_len, gen_tokens and repeats must be >= 1")
  need = prompt_len + gen_tokens
  max_seq = max_seq or need
  if max_seq < need:
    raise ValueError(f"max_seq ({max_seq}) must be >= prompt_len + gen_tokens ({need})")
  kinds = {v.kind for v in variants}
  cfg.check_shapes(kinds)
  check_tp_shapes(cfg, tp)
  if tp > 1 and (save_dir is not None or load_dir is not None):
    raise ValueError("--save / --load work with --tensor-parallel 1 only")
  mesh = tp_mesh(tp) if tp > 1 else None
  _check_checkpoint_dirs(cfg, [v.label for v in variants], save_dir, load_dir)
  if kinds & {"gemm", "weightonly"}:
    if _backend.cuda_devices():  # fail now, not after building 16 GB of weights
      if "gemm" in kinds:
        _backend.check_cuda_kernels("dot")
      if "weightonly" in kinds:
        _backend.check_cuda_kernels("weightonly_gemm")

  dev = jax.devices()[0]
  log(f"backend: {jax.default_backend()} ({dev.device_kind}); jax {jax.__version__}; "
      f"jax_gmma from {Path(jax_gmma.__file__).parent}; "
      f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
  log(f"model: {cfg} ({cfg.n_params() / 1e9:.3f} B params, bf16 weights "
      f"{2 * cfg.n_params() / 2**30:.2f} GiB)")
  log(f"batch {batch}, prompt {prompt_len} tokens, {gen_tokens} decode steps, KV cache "
      f"{max_seq} slots, {repeats} timed repeat(s)")
  if mesh is not None:
    devs = ", ".join(str(d) for d in mesh.devices.flat)
    log(f"tensor parallel over {tp} devices (mesh axis {TP_AXIS!r}: {devs}):"
        " wqkv / w_gate_up split by output features, wo / w_down by K (all-reduce), KV cache by"
        " KV heads, lm_head by vocabulary rows, embedding and norms replicated"
        + ("; each format also runs on one device (--check-tp)" if check_tp else ""))

  if jax.default_backend() == "cpu" and cfg.hidden >= 4096:
    log("note: full Llama-3-8B widths on a CPU take about a second per decode step per format; "
        "--preset tiny is the quick smoke run")
  t0 = time.perf_counter()
  if load_dir is None:
    model = Llama(cfg, seed=seed, progress=progress)
    if tp > 1:
      tp_layout(model, tp)
  else:
    model = None
    log(f"weights: every format loaded from {load_dir}")
  init_s = time.perf_counter() - t0
  if save_dir is not None:
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    (Path(save_dir) / CONFIG_FILE).write_text(
        json.dumps({"config": dataclasses.asdict(cfg)}, indent=2) + "\n")
  prompt = jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab, (batch, prompt_len)),
                       jnp.int32)

  rows, ref = [], None
  with progress_bar(len(variants), "formats", progress) as bar:
    for v in variants:
      row, arrays = run_variant(v, model, cfg, prompt, gen_tokens, max_seq, repeats, bar, ref,
                                save_dir=save_dir, load_dir=load_dir, mesh=mesh,
                                check_tp=check_tp)
      if mesh is not None:
        log(f"{v.label}: weights {row['weight_bytes_per_device'] / 2**20:.1f} MiB per device "
            f"({row['weight_bytes'] / 2**20:.1f} MiB in all); collectives in the decode loop: "
            + (", ".join(f"{k} x{c['count']}" for k, c in row["collectives"].items()) or "none"))
        for w in row["sharding_warnings"]:
          log(f"{v.label}: sharding warning: {w}")
      if ref is None:
        ref = arrays
      rows.append(row)
      gc.collect()  # the variant's weights and programs are gone: free them before the next
      bar.update()
  notes = []
  if jax.default_backend() == "gpu":
    for r in rows:
      f8 = [t for t in r["custom_calls"] if "f8" in t.lower()]
      if r["kind"] == "xla_fp8" and not f8:
        notes.append(f"{r['format']}: no FP8 GEMM (no custom call with 'f8' in its target) in the "
                     "compiled decode program: XLA did not rewrite the fp8 dot_general to cuBLASLt"
                     " FP8; its timing is not XLA's FP8 path")
  else:
    notes.append(f"backend {jax.default_backend()}: jax_gmma.dot runs its pure-JAX reference and "
                 "XLA computes fp8 dots in software here; the timings are a smoke test, not a "
                 "performance number")
  base = {r["format"]: r["tokens_per_s"] for r in rows if r["format"] in BASELINES}
  for r in rows:
    for b in BASELINES:
      r[f"speedup_vs_{b}"] = r["tokens_per_s"] / base[b] if b in base else None
  return {
      "backend": jax.default_backend(), "device": dev.device_kind, "jax": jax.__version__,
      "jax_gmma": str(Path(jax_gmma.__file__).parent),
      "xla_flags": os.environ.get("XLA_FLAGS", ""), "gemm_formats": list(gemm_formats()),
      "config": dataclasses.asdict(cfg), "n_params": cfg.n_params(), "batch": batch,
      "prompt_len": prompt_len, "gen_tokens": gen_tokens, "max_seq": max_seq,
      "repeats": repeats, "seed": seed, "init_s": init_s, "tensor_parallel": tp,
      "tp_devices": [] if mesh is None else [str(d) for d in mesh.devices.flat],
      "check_tp": bool(check_tp and mesh is not None),
      "save_dir": None if save_dir is None else str(save_dir),
      "load_dir": None if load_dir is None else str(load_dir),
      "lm_head": "bf16 in every variant (as are the embedding and the norms)",
      "bf16_tokens": ref["tokens"].tolist(), "notes": notes, "results": rows,
  }


def format_table(result: Dict[str, Any]) -> str:
  head = ("format", "what runs", "tok/s", "ms/tok", "x bf16", "x xla_fp8", "prefill ms",
          "weights GiB", "cos vs bf16", "rel err", "greedy agree", "1st diff", "forced agree")
  tp = result.get("tensor_parallel", 1) > 1
  check = result.get("check_tp", False)
  if tp:
    head += ("GiB/device",)
  if check:
    head += ("x 1 device", "max|d| vs 1 dev", "rel d vs 1 dev", "greedy = 1 dev")
  lines = []
  f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
  for r in result["results"]:
    lm = r.get("logits_vs_bf16")
    line = (r["format"], r["what_runs"], f(r["tokens_per_s"], ".1f"),
            f(r["ms_per_token"], ".2f"), f(r["speedup_vs_bf16"], ".2f"),
            f(r["speedup_vs_xla_fp8"], ".2f"), f(r["prefill_ms"], ".1f"),
            f(r["weight_bytes"] / 2**30, ".3f"),
            "(ref)" if lm is None else f"{lm['cos_mean']:.5f}",
            "(ref)" if lm is None else f"{lm['rel_err']:.4f}",
            "(ref)" if lm is None else f"{r['greedy_vs_bf16']['agree']:.3f}",
            "(ref)" if lm is None else str(min(r["greedy_vs_bf16"]["first_divergence"])),
            "(ref)" if lm is None else f"{r['teacher_forced_vs_bf16']['agree']:.3f}")
    if tp:
      line += (f(r.get("weight_bytes_per_device", 0) / 2**30, ".3f"),)
    if check:
      c = r.get("tp_check") or {}
      line += (f(c.get("speedup_vs_1dev"), ".2f"), f(c.get("logits_max_abs_diff"), ".2e"),
               f(c.get("logits_rel_diff"), ".2e"),
               "-" if not c else f"{c['greedy']['agree']:.3f}")
    lines.append(line)
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths))  # noqa: E731
  return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines])


def main(argv: Optional[Sequence[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                  help="comma-separated: bf16, xla_fp8, GEMM formats (%s), emu:FMT emulations, "
                       "wo:FMT FP4/FP6 weight-only GEMMs (FMT in %s) (default: %%(default)s); bf16 "
                       "always runs (the reference)"
                       % (", ".join(gemm_formats()), ", ".join(weightonly_formats())))
  ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b",
                  help="model shape (default: %(default)s); the flags below override it")
  ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2; 32 = full)")
  for name in ("hidden", "ffn", "heads", "kv-heads", "head-dim", "vocab"):
    ap.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
  ap.add_argument("--batch", type=int, default=1, help="sequences decoded together (default 1)")
  ap.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (default 32)")
  ap.add_argument("--gen-tokens", type=int, default=32,
                  help="decode steps timed per generation (default 32)")
  ap.add_argument("--max-seq", type=int, default=None,
                  help="KV cache slots (default prompt-len + gen-tokens)")
  ap.add_argument("--repeats", type=int, default=3,
                  help="timed generations per format, median reported (default 3)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json", metavar="PATH", help="write all results as JSON")
  ap.add_argument("--no-progress", action="store_true", help="no progress bars")
  ap.add_argument("--save", metavar="DIR",
                  help="save every format's model to DIR/<format> (orbax; ':' becomes '-', e.g. "
                       "DIR/wo-nvfp4) and the model shape to DIR/config.json")
  ap.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                  help="tensor parallelism over the first N devices (mesh axis 'tp'): wqkv / "
                       "w_gate_up split by output features, wo / w_down by K (all-reduce), the KV "
                       "cache by KV heads, the lm_head by vocabulary rows (default 1; on a CPU: "
                       "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
  ap.add_argument("--check-tp", action="store_true",
                  help="with --tensor-parallel N > 1: also run every format on one device and "
                       "report the logits' max abs / relative difference and greedy-token "
                       "agreement")
  ap.add_argument("--load", metavar="DIR",
                  help="load every format's model from DIR (written by --save with the same "
                       "shape flags) instead of generating and quantizing the weights")
  args = ap.parse_args(argv)

  shape = dict(PRESETS[args.preset])
  for name in ("hidden", "ffn", "heads", "kv_heads", "head_dim", "vocab"):
    if getattr(args, name) is not None:
      shape[name] = getattr(args, name)
  if (args.hidden is not None or args.heads is not None) and args.head_dim is None:
    shape["head_dim"] = shape["hidden"] // shape["heads"]  # Llama: head_dim = hidden / heads
  formats = [f for f in args.formats.split(",") if f.strip()]
  try:
    cfg = LlamaConfig(layers=args.layers, **shape)
    cfg.check_shapes({parse_variant(fmt).kind for fmt in formats})
    check_tp_shapes(cfg, args.tensor_parallel)
    if args.tensor_parallel > 1 and (args.save or args.load):
      raise ValueError("--save / --load work with --tensor-parallel 1 only")
    if args.save or args.load:
      labels = ["bf16"] + [parse_variant(f).label for f in formats]
      _check_checkpoint_dirs(cfg, list(dict.fromkeys(labels)), args.save, args.load)
  except ValueError as e:
    ap.error(str(e))
  try:
    result = run(formats, cfg, batch=args.batch, prompt_len=args.prompt_len,
                 gen_tokens=args.gen_tokens, max_seq=args.max_seq, repeats=args.repeats,
                 seed=args.seed, progress=not args.no_progress, save_dir=args.save,
                 load_dir=args.load, tp=args.tensor_parallel, check_tp=args.check_tp)
  except jax_gmma.KernelUnavailable as e:
    print(f"llama_decode: {e}", file=sys.stderr)
    return 2
  print()
  print(format_table(result))
  print(f"\ntok/s: decode tokens per second (batch {result['batch']} x {result['gen_tokens']} "
        "steps, one jitted fori_loop, median of the repeats); ms/tok: wall time per decode step; "
        "x bf16 / x xla_fp8: tok/s relative to those rows; prefill ms: one jitted call over the "
        "prompt; weights: all weights the variant holds (emulated weights are float32); cos / "
        "rel err: final-prompt-position logits vs the bf16 model's; greedy agree: fraction of "
        "generated tokens equal to bf16's (free-running, diverged sequences stay diverged); "
        "1st diff: index of the first generated token that differs (earliest sequence); "
        "forced agree: same, fed bf16's tokens (teacher forcing). The lm_head, embedding and "
        "norms are bf16 in every row. emu:FMT rows are a quantize-dequantize emulation in "
        "float32, not a GEMM kernel: their speed is not a format's speed. wo:FMT rows are FP4 "
        "weight-only GEMMs: FP4/FP6 weights, bf16 activations (no activation quantization).")
  if result["tensor_parallel"] > 1:
    print(f"\ntensor parallel over {result['tensor_parallel']} devices: GiB/device: the weights "
          "one device holds; the float model's wqkv / w_gate_up rows are grouped per device "
          "(tp_layout), so block-scaled formats quantize other blocks than a 1-device run of the "
          "plain model."
          + (" x 1 device: tok/s over the same variant's on one device; max|d| / rel d: its "
             "prefill logits against the 1-device run's (max abs, relative Frobenius); greedy = 1 "
             "dev: fraction of generated tokens equal to the 1-device run's."
             if result["check_tp"] else ""))
  calls = {r["format"]: r["custom_calls"] for r in result["results"] if r["custom_calls"]}
  if calls:
    print("\ncustom calls in each compiled decode program:")
    for k, v in calls.items():
      print(f"  {k}: " + ", ".join(f"{t} x{n}" for t, n in sorted(v.items())))
  saved = [r for r in result["results"] if "saved" in r.get("checkpoint", {})]
  if saved:
    print(f"\nsaved {len(saved)} models (orbax) under {args.save}; run again with --load "
          f"{args.save} to use them")
  for note in result["notes"]:
    print(f"\nnote: {note}")
  if args.json:
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
