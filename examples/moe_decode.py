#!/usr/bin/env python3
"""A mixture-of-experts decoder (random weights) in a jitted decode loop, its experts in bf16
(jax.lax.ragged_dot), FP8 block-scaled (fp8_128x128) and MXFP4 (PackedWeight) formats
(jax_gmma.ragged_dot).

    python3 -P examples/moe_decode.py                                    # tiny preset, a CPU
    python3 -P examples/moe_decode.py --preset gpt-oss-20b --json out.json         # H200
    python3 -P examples/moe_decode.py --preset qwen3-30b-a3b --batch 8 --layers 8
    python3 -P examples/moe_decode.py --preset gpt-oss-20b --allow-reference

The model: ``--layers`` decoder blocks, each ``h + MoE(RMSNorm(h))``, then a final RMSNorm.
Attention (and the embedding / lm_head) is omitted: the numbers are those of a decoder's MoE
part. The MoE is examples/moe.py's layer (imported, not copied): a float32 router picks the
top-k experts of each token and their softmax weights, the (token, expert) assignments are
sorted by expert and counted into ``group_sizes`` on the device, the experts' SwiGLU MLP runs as
two grouped GEMMs (gate/up fused, then down), and the rows are un-sorted and combined with the
router weights. Presets: ``tiny`` (CPU), ``qwen3-30b-a3b`` (hidden 2048, 128 experts, top-8,
expert inter 768, 48 layers) and ``gpt-oss-20b`` (hidden 2880, 32 experts, top-4, inter 2880,
24 layers); ``--layers`` and the other flags override them. Weights are random (seeded normal /
sqrt(fan_in)), one bf16 master copy; the router and the norms stay float32 / bf16 in every
variant.

Formats (``--formats``; ``bf16`` always runs, it is the reference):

* ``bf16``: ``jax.lax.ragged_dot`` on the bf16 master weights, stored (E, K, N) as it takes
  them (bf16 out).
* ``fp8_128x128`` (default) and the other QuantizedArray formats examples/moe.py takes
  (``fp8_channel``, ``mxfp8``, ...): the experts quantized once per expert
  (``jax.vmap(lambda e: jax_gmma.quantize(e, fmt))``), every grouped GEMM
  ``jax_gmma.ragged_dot(x, w, group_sizes)`` with x quantized on the fly (fp8_1x128 blocks for
  128x128 weights).
* ``wo:mxfp4`` (default) and the other ``wo:FMT``: FP4 / FP6 experts as a PackedWeight
  (``jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))``), bf16 activations.

Decode: a batch of ``--batch`` sequences. Each step takes one hidden state per sequence through
the blocks; its output is the next step's input (a stand-in for embedding the sampled token, so
that the steps depend on each other). ``--steps`` steps run as a ``lax.fori_loop`` (the blocks a
``lax.scan``) inside **one** jitted function: the whole generation is one XLA program.

Reported per format: decode tokens/s (batch x steps / wall time of the loop, median of
``--repeats``), ms per step, speed relative to bf16, and agreement with the bf16 model:
teacher-forced (every step fed the bf16 model's input of that step): the cosine of each output
row with bf16's (mean, worst) and the relative error of all outputs; free-running (each model fed
its own outputs): how many steps stay above a mean cosine of 0.99 with bf16's. Errors compound
there, and a token whose router logits are close picks other experts: random weights make the
recurrence chaotic, so the free-running outputs decorrelate after a few steps in every format.

``jax_gmma.ragged_dot`` on a CUDA GPU without grouped GEMM kernels: by default the quantized
formats are skipped, with jax-gmma's reason; ``--allow-reference`` runs its pure-JAX reference
instead (``jax_gmma.allow_reference()``) and the output says so: a reference's speed, not a
kernel's. On a CPU the reference is all there is; the timings are a smoke test there.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_gmma
from jax_gmma import _backend

# examples/ on sys.path, for moe.py (run as a script, with -P, or by path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe  # noqa: E402  (examples/moe.py: the MoE layer, expert quantization, format specs)

BF16 = jnp.bfloat16
F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Config:
  hidden: int
  inter: int
  experts: int
  top_k: int
  layers: int
  eps: float = 1e-6

  def __post_init__(self):
    for name in ("hidden", "inter", "experts", "top_k", "layers"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.top_k > self.experts:
      raise ValueError(f"top_k ({self.top_k}) must be at most experts ({self.experts})")

  def expert_params(self) -> int:
    return self.layers * self.experts * 3 * self.hidden * self.inter


PRESETS = {
    "tiny": Config(hidden=256, inter=128, experts=8, top_k=2, layers=2),
    "qwen3-30b-a3b": Config(hidden=2048, inter=768, experts=128, top_k=8, layers=48),
    "gpt-oss-20b": Config(hidden=2880, inter=2880, experts=32, top_k=4, layers=24),
}
DEFAULT_FORMATS = ("bf16", "fp8_128x128", "wo:mxfp4")


# -- weights ------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("shape", "fan_in"))
def _normal_bf16(key, *, shape, fan_in):
  """normal / sqrt(fan_in) in bf16, one slice of the leading (layer) axis at a time: the float32
  intermediates stay one layer's size."""
  def one(k):
    return (jax.random.normal(k, shape[1:], F32) / np.sqrt(fan_in)).astype(BF16)
  return lax.map(one, jax.random.split(key, shape[0]))


def init_master(cfg: Config, seed: int = 0) -> Dict[str, Any]:
  """bf16 master weights, the layers stacked on a leading axis: router (L, H, E) float32, expert
  gate/up (L, E, H, 2 I) and down (L, E, I, H) in jax.lax.ragged_dot's (E, K, N) layout."""
  k = jax.random.split(jax.random.key(seed), 3)
  L, E, H, I = cfg.layers, cfg.experts, cfg.hidden, cfg.inter  # noqa: E741
  return {"layers": {"norm": jnp.ones((L, H), BF16),
                     "router": _normal_bf16(k[0], shape=(L, H, E), fan_in=H).astype(F32),
                     "gate_up": _normal_bf16(k[1], shape=(L, E, H, 2 * I), fan_in=H),
                     "down": _normal_bf16(k[2], shape=(L, E, I, H), fan_in=I)},
          "final_norm": jnp.ones((H,), BF16)}


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnums=(0,))
def _put_layer(stacked, w, i, *, spec):
  """Layer i of the (L, E, K, N) bf16 experts in ``spec`` (moe.quantize_experts on (E, N, K)),
  written in place into ``stacked`` (donated), the experts of every layer."""
  q = moe.quantize_experts(jnp.swapaxes(lax.dynamic_index_in_dim(w, i, keepdims=False), 1, 2), spec)
  return jax.tree.map(lambda s, a: lax.dynamic_update_index_in_dim(s, a, i, 0), stacked, q)


def _quantize_layers(w, *, spec):
  """(L, E, K, N) bf16 -> the experts of every layer in ``spec``: arrays with leading (layer,
  expert) axes, filled one layer at a time in place. A jitted loop over the stacked layers made
  XLA copy the whole stack first (24 GiB for gpt-oss-20b's gate/up), and stacking per-layer
  results holds them twice; either way the master and the quantized experts did not fit an
  80 GB GPU."""
  shapes = jax.eval_shape(lambda wl: moe.quantize_experts(jnp.swapaxes(wl, 1, 2), spec),
                          jax.ShapeDtypeStruct(w.shape[1:], w.dtype))
  stacked = jax.tree.map(lambda a: jnp.zeros((w.shape[0],) + a.shape, a.dtype), shapes)
  for i in range(w.shape[0]):
    stacked = _put_layer(stacked, w, i, spec=spec)
  return stacked


def prepare(master, spec: str):
  """The variant's parameters: the master itself for bf16, else the experts quantized."""
  if spec == "bf16":
    return master
  layers = dict(master["layers"])
  for name in ("gate_up", "down"):
    layers[name] = _quantize_layers(master["layers"][name], spec=spec)
  return {"layers": layers, "final_norm": master["final_norm"]}


def tree_nbytes(tree) -> int:
  return int(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree)))


# -- the model ----------------------------------------------------------------------------------

def bf16_gmm(x, w, group_sizes):
  """jax.lax.ragged_dot on bf16 (E, K, N) experts, bf16 out."""
  return lax.ragged_dot(x.astype(BF16), w, group_sizes, preferred_element_type=BF16)


def gmm_of(spec: str):
  return bf16_gmm if spec == "bf16" else moe.jax_gmma_gmm


def rms_norm(x, gain, eps):
  x32 = x.astype(F32)
  y = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  return (y * gain.astype(F32)).astype(BF16)


def decode_step(params, h, cfg: Config, gmm):
  """One step: h (B, H) bf16 through the blocks (a lax.scan over the stacked layers) and the
  final norm."""
  def block(h, lp):
    x = rms_norm(h, lp["norm"], cfg.eps)
    y = moe.moe_layer(x, lp["router"], lp["gate_up"], lp["down"], top_k=cfg.top_k, gmm=gmm)
    return (h.astype(F32) + y).astype(BF16), None
  h, _ = lax.scan(block, h, params["layers"])
  return rms_norm(h, params["final_norm"], cfg.eps)


def generate(params, h0, forced, use_forced, *, cfg: Config, gmm, steps: int):
  """``steps`` decode steps in one XLA program (a fori_loop): step i takes the previous step's
  output (h0 at i = 0), or ``forced[i]`` when ``use_forced`` (teacher forcing). Returns every
  step's output (steps, B, H) bf16."""
  def body(i, carry):
    h, outs = carry
    out = decode_step(params, jnp.where(use_forced, forced[i], h), cfg, gmm)
    return out, lax.dynamic_update_index_in_dim(outs, out, i, 0)
  _, outs = lax.fori_loop(0, steps, body, (h0, jnp.zeros((steps,) + h0.shape, BF16)))
  return outs


# -- where ragged_dot runs ----------------------------------------------------------------------

class Skip(Exception):
  """A format that cannot run here (the reason)."""


def on_cuda() -> bool:
  return bool(_backend.cuda_devices()) and jax.default_backend() == "gpu"


def compile_variant(fn, args, spec: str, allow_reference: bool):
  """(compiled, path): bf16 -> "xla"; ours -> "kernel" when it lowers with the reference refused,
  else "reference" (CPU; on a CUDA GPU only with allow_reference, otherwise Skip(reason))."""
  jitted = jax.jit(fn)
  if spec == "bf16":
    return jitted.lower(*args).compile(), "xla"
  if not on_cuda():
    return jitted.lower(*args).compile(), "reference"
  try:
    with jax_gmma.allow_reference(False):
      return jitted.lower(*args).compile(), "kernel"
  except jax_gmma.KernelUnavailable as e:
    if not allow_reference:
      raise Skip(str(e)) from None
  with jax_gmma.allow_reference(True):
    return jitted.lower(*args).compile(), "reference"


def probe(spec: str, cfg: Config, allow_reference: bool) -> str:
  """Where ``spec``'s grouped GEMM runs, decided on two experts of the model's gate/up shape
  before the model's weights are quantized (Skip(reason) when it cannot run)."""
  if spec == "bf16":
    return "xla"
  if not on_cuda():
    return "reference"
  w = moe.quantize_experts(jnp.ones((2, 2 * cfg.inter, cfg.hidden), BF16), spec)
  x = jnp.ones((8, cfg.hidden), BF16)
  return compile_variant(moe.jax_gmma_gmm, (x, w, jnp.array([5, 3], jnp.int32)), spec,
                         allow_reference)[1]


def custom_calls(compiled) -> Dict[str, int]:
  try:
    return dict(Counter(re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())))
  except Exception:  # noqa: BLE001 - informational
    return {}


# -- metrics and the driver -----------------------------------------------------------------------

def agreement(ref: np.ndarray, got: np.ndarray) -> Dict[str, float]:
  """ref, got (..., H): the cosine of each row (mean, min) and the relative Frobenius error."""
  r = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
  g = got.reshape(-1, got.shape[-1]).astype(np.float64)
  cos = np.sum(r * g, 1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1))
  return {"cos_mean": float(np.mean(cos)), "cos_min": float(np.min(cos)),
          "rel_err": float(np.linalg.norm(g - r) / np.linalg.norm(r))}


def free_running(ref: np.ndarray, got: np.ndarray, threshold: float = 0.99) -> Dict[str, Any]:
  """Each model fed its own outputs (steps, B, H): the mean cosine with bf16's per step, and the
  first step whose mean cosine falls below ``threshold`` (steps when none does)."""
  per_step = [agreement(r, g)["cos_mean"] for r, g in zip(ref, got)]
  below = [i for i, c in enumerate(per_step) if c < threshold]
  return {"cos_mean_per_step": per_step, "threshold": threshold,
          "steps_above": below[0] if below else len(per_step)}


def run_format(spec: str, master, cfg: Config, h0, steps: int, repeats: int, allow_reference: bool,
               ref: Optional[Dict[str, np.ndarray]] = None, log=print) -> Dict[str, Any]:
  path = probe(spec, cfg, allow_reference)
  t0 = time.perf_counter()
  params = prepare(master, spec)
  jax.block_until_ready(params)
  prep_s = time.perf_counter() - t0
  fn = functools.partial(generate, cfg=cfg, gmm=gmm_of(spec), steps=steps)
  no_force = jnp.zeros((steps,) + h0.shape, BF16)
  t0 = time.perf_counter()
  gen, path = compile_variant(fn, (params, h0, no_force, jnp.asarray(False)), spec, allow_reference)
  compile_s = time.perf_counter() - t0
  flags = {False: jnp.asarray(False), True: jnp.asarray(True)}
  outs = jax.block_until_ready(gen(params, h0, no_force, flags[False]))  # warm-up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    outs = jax.block_until_ready(gen(params, h0, no_force, flags[False]))
    times.append(time.perf_counter() - t0)
  outs = np.asarray(outs.astype(F32))
  if not np.all(np.isfinite(outs)):
    raise FloatingPointError(f"{spec}: non-finite decode outputs")
  t = float(np.median(times))
  batch = h0.shape[0]
  row: Dict[str, Any] = {
      "format": spec, "path": path, "tokens_per_s": batch * steps / t, "ms_per_step": 1e3 * t / steps,
      "decode_s": t, "decode_s_all": times, "compile_s": compile_s, "prepare_s": prep_s,
      "expert_weight_bytes": tree_nbytes({k: params["layers"][k] for k in ("gate_up", "down")}),
      "custom_calls": custom_calls(gen)}
  if ref is not None:
    forced = jnp.asarray(ref["inputs"], BF16)
    tf = np.asarray(gen(params, h0, forced, flags[True]).astype(F32))
    row["teacher_forced_vs_bf16"] = agreement(ref["outs"], tf)
    row["free_running_vs_bf16"] = free_running(ref["outs"], outs)
  del params, gen
  return row, outs


def run(formats: Sequence[str] = DEFAULT_FORMATS, cfg: Config = PRESETS["tiny"], batch: int = 4,
        steps: int = 16, repeats: int = 3, seed: int = 0, allow_reference: bool = False,
        log=print) -> Dict[str, Any]:
  """bf16 first (the reference), then every other format on the same master weights and inputs.
  A format that cannot run here is listed in ``skipped`` with the reason."""
  for spec in formats:
    if spec != "bf16":
      moe.check_spec(spec)
  if batch < 1 or steps < 1 or repeats < 1:
    raise ValueError("batch, steps and repeats must be >= 1")
  specs = ["bf16"] + [s for s in dict.fromkeys(formats) if s != "bf16"]
  dev = jax.devices()[0]
  log(f"backend: {jax.default_backend()} ({dev.device_kind}); jax {jax.__version__}; "
      f"jax_gmma from {Path(jax_gmma.__file__).parent}")
  log(f"model: {cfg} ({cfg.expert_params() / 1e9:.3f} B expert parameters, bf16 "
      f"{2 * cfg.expert_params() / 2**30:.2f} GiB); batch {batch}, {steps} decode steps, "
      f"{repeats} timed repeat(s)")
  t0 = time.perf_counter()
  master = init_master(cfg, seed)
  h0 = jax.random.normal(jax.random.key(seed + 1), (batch, cfg.hidden), F32).astype(BF16)
  jax.block_until_ready(master)
  init_s = time.perf_counter() - t0
  rows, skipped, ref = [], {}, None
  for spec in specs:
    try:
      row, outs = run_format(spec, master, cfg, h0, steps, repeats, allow_reference, ref, log)
    except Skip as e:
      skipped[spec] = str(e)
      log(f"{spec}: skipped: {e}")
      continue
    if ref is None:
      ref = {"outs": outs, "inputs": np.concatenate([np.asarray(h0.astype(F32))[None], outs[:-1]])}
    rows.append(row)
    log(f"{spec}: {row['tokens_per_s']:.1f} tok/s ({row['path']})")
    gc.collect()
  base = rows[0]["tokens_per_s"]
  for r in rows:
    r["speedup_vs_bf16"] = r["tokens_per_s"] / base
  notes = []
  refs = [r["format"] for r in rows if r["path"] == "reference"]
  if refs and on_cuda():
    notes.append(f"{', '.join(refs)}: jax_gmma.ragged_dot ran its pure-JAX reference on the GPU "
                 "(--allow-reference: jax_gmma.allow_reference()): a reference's speed, not a "
                 "kernel's")
  elif refs:
    notes.append(f"backend {jax.default_backend()}: jax_gmma.ragged_dot runs its pure-JAX reference "
                 f"({', '.join(refs)}); the timings are a smoke test, not a performance number")
  for spec, why in skipped.items():
    notes.append(f"{spec} skipped: {why}")
  return {"backend": jax.default_backend(), "device": dev.device_kind, "jax": jax.__version__,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "config": dataclasses.asdict(cfg),
          "batch": batch, "steps": steps, "repeats": repeats, "seed": seed,
          "allow_reference": allow_reference, "init_s": init_s,
          "attention": "omitted (MoE blocks only)", "results": rows, "skipped": skipped,
          "notes": notes}


def format_table(result: Dict[str, Any]) -> str:
  head = ("format", "ragged_dot path", "tok/s", "ms/step", "x bf16", "expert GiB", "cos vs bf16",
          "worst cos", "rel err", "free-running steps")
  f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
  lines = []
  for r in result["results"]:
    tf, fr = r.get("teacher_forced_vs_bf16"), r.get("free_running_vs_bf16")
    lines.append((r["format"], r["path"], f(r["tokens_per_s"], ".1f"), f(r["ms_per_step"], ".3f"),
                  f(r["speedup_vs_bf16"], ".2f"), f(r["expert_weight_bytes"] / 2**30, ".3f"),
                  "(ref)" if tf is None else f"{tf['cos_mean']:.5f}",
                  "(ref)" if tf is None else f"{tf['cos_min']:.5f}",
                  "(ref)" if tf is None else f"{tf['rel_err']:.4f}",
                  "(ref)" if fr is None else f"{fr['steps_above']}/{result['steps']}"))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths))  # noqa: E731
  return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines])


def main(argv: Optional[Sequence[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                  help="model shape (default: %(default)s); the flags below override it")
  ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                  help="comma-separated: bf16, QuantizedArray formats (%s) or wo:FMT (FMT in %s) "
                       "(default: %%(default)s); bf16 always runs (the reference)"
                       % (", ".join(moe.QUANTIZED), ", ".join(jax_gmma.weightonly.WEIGHT_FORMATS)))
  ap.add_argument("--layers", type=int, default=None, help="override the preset's decoder blocks")
  for name in ("hidden", "inter", "experts", "top-k"):
    ap.add_argument(f"--{name}", type=int, default=None, help=f"override the preset's {name}")
  ap.add_argument("--batch", type=int, default=4, help="sequences decoded together (default 4)")
  ap.add_argument("--steps", type=int, default=16, help="decode steps per generation (default 16)")
  ap.add_argument("--repeats", type=int, default=3, help="timed generations, median (default 3)")
  ap.add_argument("--allow-reference", action="store_true",
                  help="on a CUDA GPU without grouped GEMM kernels, run jax_gmma.ragged_dot's "
                       "pure-JAX reference (and say so) instead of skipping the quantized formats")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json", metavar="PATH", help="write all results as JSON")
  args = ap.parse_args(argv)
  shape = dataclasses.asdict(PRESETS[args.preset])
  for name in ("layers", "hidden", "inter", "experts", "top_k"):
    if getattr(args, name) is not None:
      shape[name] = getattr(args, name)
  formats = [s.strip() for s in args.formats.split(",") if s.strip()]
  try:
    cfg = Config(**shape)
    result = run(formats, cfg, batch=args.batch, steps=args.steps, repeats=args.repeats,
                 seed=args.seed, allow_reference=args.allow_reference)
  except (ValueError, SystemExit) as e:
    ap.error(str(e))
  print()
  print(format_table(result))
  print(f"\ntok/s: decode tokens per second (batch {result['batch']} x {result['steps']} steps, "
        "one jitted fori_loop, median of the repeats; MoE blocks only, no attention); x bf16: "
        "tok/s relative to bf16; cos / worst cos / rel err: every step's outputs, teacher-forced "
        "on the bf16 model's inputs, against bf16's; free-running steps: steps whose outputs keep "
        "a mean cosine >= 0.99 with bf16's when each model feeds itself. ragged_dot path: kernel, "
        "or reference (jax_gmma.ragged_dot's pure-JAX reference); xla for bf16 "
        "(jax.lax.ragged_dot).")
  for note in result["notes"]:
    print(f"\nnote: {note}")
  if args.json:
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
