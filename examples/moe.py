#!/usr/bin/env python3
"""A mixture-of-experts layer on quantized expert weights (jax_gmma.ragged_dot), on one device and
expert-parallel.

    python3 -P examples/moe.py [--preset tiny|small] [--formats fp8_channel,mxfp8,wo:nvfp4]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python3 -P examples/moe.py --preset tiny --expert-parallel      # 4 virtual CPU devices

The layer (a SwiGLU expert MLP, top-k routing) on T tokens of width d:

1. a float32 router picks the top-k of E experts per token and their softmax weights;
2. the T * k (token, expert) assignments are sorted by expert, the tokens gathered in that
   order, and ``group_sizes`` counts each expert's rows;
3. ``jax_gmma.ragged_dot`` multiplies them by the stacked gate / up projection (E, 2 * d_ff, d),
   then, after SiLU(gate) * up, by the down projection (E, d, d_ff): quantized expert weights,
   one grouped GEMM each, the activations quantized on the fly for the weights' format;
4. the rows are put back in assignment order and each token's k results are summed with its
   routing weights.

Expert formats (``--formats``): ``fp8_channel`` and ``mxfp8`` (QuantizedArrays, the activations
quantized per token / per 1x32 block), ``wo:FMT`` for FP4 / FP6 experts as a PackedWeight
(``wo:nvfp4``: bfloat16 activations). The weights are quantized once, per expert, with
``jax.vmap`` (``jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)``): a QuantizedArray of one
(N, K) expert whose arrays carry the leading expert axis, so that the experts can be split over
devices like any array.

``--expert-parallel``: expert parallelism, written in the model with ``jax.shard_map`` (the op
never splits the experts itself). The D devices of a mesh axis ``ep`` each hold E / D experts
(every array of the stacked weights split along its leading axis) and T / D tokens. Each device
routes its tokens, packs them into one buffer per destination device (the device holding the
chosen expert), exchanges the buffers with ``jax.lax.all_to_all``, runs the two grouped GEMMs
on the rows it received with its own experts, sends the results back with a second all-to-all
and combines them. The buffers have room for every assignment of a device (capacity T / D * k
rows per device pair), so that no token is ever dropped and the result is the single-device
layer's; a production layer sizes them with a capacity factor (dropping the overflow) or
exchanges only the rows that exist (``jax.lax.ragged_all_to_all``). The example checks that
the expert-parallel result equals the single-device one (bit for bit on CPU; on a GPU, whose
dots may round a different number of rows differently, to an ulp of the activations) and exits
with status 1 if it does not.

It prints the collectives of the compiled expert-parallel program (three all-to-alls: the
tokens, their expert indices, the results; nothing gathers the weights).

Also reported per format: the relative error of the layer against the same layer with the
float32 expert weights (``jax.lax.ragged_dot``). ``jax_gmma.ragged_dot`` runs its grouped kernels
on a Hopper GPU and its pure-JAX reference on CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_gmma
from jax_gmma import _backend


@dataclasses.dataclass(frozen=True)
class Config:
  tokens: int
  d_model: int
  d_ff: int
  experts: int
  top_k: int


PRESETS = {
    "tiny": Config(tokens=64, d_model=128, d_ff=128, experts=8, top_k=2),
    "small": Config(tokens=512, d_model=256, d_ff=512, experts=16, top_k=2),
}
DEFAULT_FORMATS = "fp8_channel,mxfp8,wo:nvfp4"
#: formats a QuantizedArray expert weight may have; wo:FMT takes jax_gmma.weightonly's formats
QUANTIZED = ("fp8_tensor", "fp8_channel", "fp8_1x128", "fp8_128x128", "mxfp8")
F32 = jnp.float32


def init(cfg: Config, seed: int = 0):
  """Float32 parameters: router (d, E), stacked gate / up (E, 2 * d_ff, d), down (E, d, d_ff)
  (nn.Linear layout: output features first, the contraction last)."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  e, d, f = cfg.experts, cfg.d_model, cfg.d_ff
  return {"router": jax.random.normal(k1, (d, e), F32) / d ** 0.5,
          "gate_up": jax.random.normal(k2, (e, 2 * f, d), F32) / d ** 0.5,
          "down": jax.random.normal(k3, (e, d, f), F32) / f ** 0.5}


def quantize_experts(w, spec: str):
  """Stacked (E, N, K) float expert weights in format ``spec``, one expert at a time (jax.vmap):
  a QuantizedArray (or PackedWeight, ``wo:FMT``) whose arrays carry the leading expert axis."""
  if spec.startswith("wo:"):
    fmt = spec[3:]
    return jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  return jax.vmap(lambda e: jax_gmma.quantize(e, spec))(w)


def check_spec(spec: str) -> None:
  fmt = spec[3:] if spec.startswith("wo:") else spec
  allowed = jax_gmma.weightonly.WEIGHT_FORMATS if spec.startswith("wo:") else QUANTIZED
  if fmt not in allowed:
    raise SystemExit(f"moe.py: unknown expert format {spec!r}: use one of {', '.join(QUANTIZED)}, or "
                     f"wo:FMT with FMT one of {', '.join(jax_gmma.weightonly.WEIGHT_FORMATS)}")


# -- the layer --------------------------------------------------------------------------------

def route(x, router, top_k: int):
  """(expert ids (T, k) int32, routing weights (T, k) float32): top-k of a float32 router."""
  logits = jnp.dot(x.astype(F32), router, precision=jax.lax.Precision.HIGHEST)
  top, ids = jax.lax.top_k(logits, top_k)
  return ids.astype(jnp.int32), jax.nn.softmax(top, axis=-1)


def expert_mlp(rows, gate_up, down, group_sizes, gmm):
  """The experts' SwiGLU MLP on rows sorted by expert: two grouped GEMMs ``gmm(x, w, sizes)``."""
  h = gmm(rows, gate_up, group_sizes)
  gate, up = jnp.split(h.astype(F32), 2, axis=-1)
  return gmm((jax.nn.silu(gate) * up).astype(rows.dtype), down, group_sizes)


def combine(y_flat, weights):
  """(T * k, d) expert outputs in assignment order -> (T, d): each token's weighted sum."""
  t, k = weights.shape
  y = y_flat.reshape(t, k, -1).astype(F32)
  return jnp.einsum("tkd,tk->td", y, weights, precision=jax.lax.Precision.HIGHEST)


def moe_layer(x, router, gate_up, down, *, top_k: int, gmm):
  """The MoE layer on one device (all experts): (T, d) -> (T, d) float32."""
  ids, weights = route(x, router, top_k)
  e = router.shape[1]
  flat = ids.reshape(-1)                               # (T * k,) expert of each assignment
  order = jnp.argsort(flat, stable=True)               # assignments sorted by expert
  rows = x[order // top_k]                             # their tokens, grouped by expert
  group_sizes = jnp.sum(flat[:, None] == jnp.arange(e)[None, :], axis=0, dtype=jnp.int32)
  y = expert_mlp(rows, gate_up, down, group_sizes, gmm)
  y_flat = jnp.zeros_like(y).at[order].set(y)           # back in assignment order
  return combine(y_flat, weights)


def moe_layer_ep(x, router, gate_up, down, *, top_k: int, gmm, axis: str = "ep"):
  """The MoE layer inside ``jax.shard_map`` over mesh axis ``axis`` (D devices): x (T / D, d)
  this device's tokens, gate_up / down this device's E / D experts (leading axis), router whole.
  Tokens travel to their experts' devices and back with two all-to-alls."""
  d_count = jax.lax.axis_size(axis)
  e_local = jax.tree.leaves(gate_up)[0].shape[0]
  t_local = x.shape[0]
  cap = t_local * top_k                                # room for every assignment: nothing dropped
  ids, weights = route(x, router, top_k)
  flat = ids.reshape(-1)
  dest, local_e = flat // e_local, flat % e_local      # the device holding the expert, its index there
  order = jnp.argsort(flat, stable=True)               # by expert: by device, then by expert there
  dest_s = dest[order]
  counts = jnp.sum(dest[:, None] == jnp.arange(d_count)[None, :], axis=0, dtype=jnp.int32)
  slot = jnp.arange(cap, dtype=jnp.int32) - (jnp.cumsum(counts) - counts)[dest_s]
  send = jnp.zeros((d_count, cap, x.shape[1]), x.dtype).at[dest_s, slot].set(x[order // top_k])
  send_e = jnp.full((d_count, cap), e_local, jnp.int32).at[dest_s, slot].set(local_e[order])
  # the exchange: block s of what a device receives comes from device s
  recv = jax.lax.all_to_all(send, axis, 0, 0, tiled=True).reshape(d_count * cap, -1)
  recv_e = jax.lax.all_to_all(send_e, axis, 0, 0, tiled=True).reshape(-1)
  mine = jnp.argsort(recv_e, stable=True)              # by local expert; empty slots (e_local) last
  group_sizes = jnp.sum(recv_e[:, None] == jnp.arange(e_local)[None, :], axis=0, dtype=jnp.int32)
  y = expert_mlp(recv[mine], gate_up, down, group_sizes, gmm)
  y = jnp.zeros_like(y).at[mine].set(y).reshape(d_count, cap, -1)
  back = jax.lax.all_to_all(y, axis, 0, 0, tiled=True)  # block s: the results from device s
  y_flat = jnp.zeros((cap, y.shape[-1]), y.dtype).at[order].set(back[dest_s, slot])
  return combine(y_flat, weights)


def jax_gmma_gmm(x, w, group_sizes):
  return jax_gmma.ragged_dot(x, w, group_sizes)


def float_gmm(x, w, group_sizes):
  """``jax.lax.ragged_dot`` on float32 (E, N, K) weights (the unquantized baseline)."""
  return jax.lax.ragged_dot(x.astype(F32), jnp.swapaxes(w, 1, 2), group_sizes,
                            precision=jax.lax.Precision.HIGHEST)


def single_device(cfg: Config, gmm):
  return jax.jit(functools.partial(moe_layer, top_k=cfg.top_k, gmm=gmm))


def expert_parallel(cfg: Config, mesh, gmm):
  """The layer split over the mesh's axis ``ep``: tokens and experts sharded, router replicated."""
  body = functools.partial(moe_layer_ep, top_k=cfg.top_k, gmm=gmm, axis="ep")
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P(), P("ep"), P("ep")),
                               out_specs=P("ep")))


def collectives(hlo: str) -> str:
  """How many of each collective a compiled program (HLO text) runs."""
  counts = {c: len(re.findall(rf"\s{c}(?:-start)?\(", hlo))
            for c in ("all-to-all", "all-gather", "all-reduce", "collective-permute")}
  return ", ".join(f"{n} {c}" for c, n in counts.items())


def relerr(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(cfg: Config, specs, *, expert_parallel_devices: int = 0, dtype=jnp.bfloat16, seed: int = 0,
        log=print):
  """({format: (relative error against the float32 layer, max |EP - single device| or None)},
  whether every expert-parallel result equals the single-device one, to rounding at most)."""
  params = init(cfg, seed)
  x = jax.random.normal(jax.random.key(seed + 1), (cfg.tokens, cfg.d_model), F32).astype(dtype)
  want = single_device(cfg, float_gmm)(x, params["router"], params["gate_up"], params["down"])
  mesh = None
  if expert_parallel_devices:
    mesh = jax.make_mesh((expert_parallel_devices,), ("ep",),
                         devices=jax.devices()[:expert_parallel_devices])
  results, ok = {}, True
  for spec in specs:
    gate_up, down = quantize_experts(params["gate_up"], spec), quantize_experts(params["down"], spec)
    y = single_device(cfg, jax_gmma_gmm)(x, params["router"], gate_up, down)
    diff = None
    if mesh is not None:
      place = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
      args = (place(x, P("ep")), place(params["router"], P()),
              jax.tree.map(lambda a: place(a, P("ep")), gate_up), jax.tree.map(lambda a: place(a, P("ep")), down))
      ep = expert_parallel(cfg, mesh, jax_gmma_gmm)
      if not results:  # the communication of the expert-parallel program, once
        log("expert-parallel program: " + collectives(ep.lower(*args).compile().as_text()))
      y_ep = ep(*args)
      diff = float(np.max(np.abs(np.asarray(y_ep, np.float64) - np.asarray(y, np.float64))))
      # (the same arithmetic row by row: identical on CPU; a GPU's dots may round a product of
      # another row count differently, by an ulp of the activations' dtype)
      rounding = 2 * float(jnp.finfo(dtype).eps) * float(jnp.max(jnp.abs(y)))
      ok = ok and diff <= rounding
    results[spec] = (relerr(y, want), diff)
    if len(results) == 1:
      log(f"{'format':14s} {'rel.err vs float32':>20s}   " + ("EP vs single device" if mesh else ""))
    log(f"{spec:14s} {results[spec][0]:20.4f}   " + (
        "" if diff is None else "identical" if diff == 0 else
        f"max |diff| {diff:.3g} ({'within' if diff <= rounding else 'BEYOND'} rounding)"))
  return results, ok


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
  p.add_argument("--formats", default=DEFAULT_FORMATS,
                 help="comma-separated expert formats: fp8_channel, mxfp8, ... or wo:FMT (PackedWeight)")
  p.add_argument("--expert-parallel", action="store_true",
                 help="also run the layer expert-parallel (jax.shard_map, all-to-all) and compare")
  p.add_argument("--devices", type=int, default=0,
                 help="devices of the expert-parallel mesh (default: all, at most the experts)")
  p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="activations")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  cfg = PRESETS[args.preset]
  specs = [s for s in args.formats.split(",") if s]
  for s in specs:
    check_spec(s)
  n_ep = 0
  if args.expert_parallel:
    n_ep = args.devices or min(len(jax.devices()), cfg.experts)
    if n_ep < 2 or n_ep > len(jax.devices()) or cfg.experts % n_ep or cfg.tokens % n_ep:
      print(f"moe.py: --expert-parallel needs 2 or more devices that divide the {cfg.experts} experts "
            f"and {cfg.tokens} tokens; {len(jax.devices())} visible (on CPU: "
            "XLA_FLAGS=--xla_force_host_platform_device_count=4)", file=sys.stderr)
      return 2
  backend = jax.default_backend()
  path = "grouped kernels" if _backend.cuda_devices() else "pure-JAX reference"
  print(f"MoE layer ({args.preset}): {cfg.tokens} tokens, d_model {cfg.d_model}, d_ff {cfg.d_ff}, "
        f"{cfg.experts} experts, top-{cfg.top_k}, {args.dtype} activations; backend {backend} "
        f"(ragged_dot: {path})")
  if n_ep:
    print(f"expert parallel: {n_ep} devices on mesh axis 'ep', {cfg.experts // n_ep} experts and "
          f"{cfg.tokens // n_ep} tokens each, all-to-all buffers of {cfg.tokens // n_ep * cfg.top_k} rows "
          "per device pair")
  _, ok = run(cfg, specs, expert_parallel_devices=n_ep, dtype=jnp.dtype(args.dtype), seed=args.seed)
  if not ok:
    print("FAILED: the expert-parallel layer differs from the single-device one")
    return 1
  print("ok: expert-parallel == single device" if n_ep else "ok")
  return 0


if __name__ == "__main__":
  sys.exit(main())
