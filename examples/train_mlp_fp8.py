#!/usr/bin/env python3
"""Train a small MLP with FP8 GEMMs (jax_gmma.fp8_linear) next to the same MLP in bf16.

    python3 -P examples/train_mlp_fp8.py [--steps 300] [--d 256] [--hidden 1024] [--out FILE]

A teacher-student regression: a fixed random teacher MLP makes the targets, a student with the
same shape learns them with Adam. Every student linear layer is one of
  bf16          x @ w.T in bfloat16 (XLA), float32 master weights;
  fp8_tensor    jax_gmma.fp8_linear (per-tensor current scaling, e5m2 gradients);
  fp8_blockwise jax_gmma.fp8_linear(recipe="blockwise") (1x128 / 128x128 blocks, e4m3).
The whole training step (forward, backward, Adam update) is one jitted function. Prints the
loss curves side by side and the final losses; --out writes them as JSON. Runs on CPU (the
pure-JAX reference of the FP8 GEMMs) and unchanged on a Hopper GPU (the kernels).
"""
from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp

import jax_gmma

LAYERS = {
    "bf16": lambda x, w, b: (jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16).T,
                                     preferred_element_type=jnp.float32) + b).astype(jnp.bfloat16),
    "fp8_tensor": lambda x, w, b: jax_gmma.fp8_linear(x.astype(jnp.bfloat16), w, b,
                                                      out_dtype=jnp.bfloat16),
    "fp8_blockwise": lambda x, w, b: jax_gmma.fp8_linear(x.astype(jnp.bfloat16), w, b,
                                                         out_dtype=jnp.bfloat16, recipe="blockwise"),
}


def init(key, d, hidden):
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (hidden, d)) / d ** 0.5, "b1": jnp.zeros((hidden,)),
          "w2": jax.random.normal(k2, (d, hidden)) / hidden ** 0.5, "b2": jnp.zeros((d,))}


def mlp(params, x, layer):
  h = jax.nn.gelu(layer(x, params["w1"], params["b1"]).astype(jnp.float32))
  return layer(h, params["w2"], params["b2"]).astype(jnp.float32)


def loss_fn(params, x, y, layer):
  return jnp.mean((mlp(params, x, layer) - y) ** 2)


def adam_step(params, state, grads, lr, t, b1=0.9, b2=0.999, eps=1e-8):
  m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
  v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
  mh = jax.tree.map(lambda m: m / (1 - b1 ** t), m)
  vh = jax.tree.map(lambda v: v / (1 - b2 ** t), v)
  params = jax.tree.map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + eps), params, mh, vh)
  return params, {"m": m, "v": v}


@functools.partial(jax.jit, static_argnames=("kind",))
def train_step(params, state, x, y, t, *, kind, lr=1e-3):
  loss, grads = jax.value_and_grad(loss_fn)(params, x, y, LAYERS[kind])
  params, state = adam_step(params, state, grads, lr, t)
  return params, state, loss


def run(kinds, steps, d, hidden, batch, seed=0, log_every=None):
  key = jax.random.PRNGKey(seed)
  kt, ks, kx = jax.random.split(key, 3)
  teacher = init(kt, d, hidden)
  student0 = init(ks, d, hidden)
  teach = jax.jit(lambda x: mlp(teacher, x, lambda x, w, b: x @ w.T + b))
  curves, times = {}, {}
  for kind in kinds:
    params = student0
    state = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params)}
    losses = []
    t0 = None
    for t in range(1, steps + 1):
      x = jax.random.normal(jax.random.fold_in(kx, t), (batch, d))
      params, state, loss = train_step(params, state, x, teach(x), t, kind=kind)
      losses.append(float(loss))
      if t == 1:
        t0 = time.perf_counter()  # after the compile
      if log_every and t % log_every == 0:
        print(f"  {kind:13s} step {t:4d} loss {losses[-1]:.5f}", flush=True)
    curves[kind] = losses
    times[kind] = (time.perf_counter() - t0) / max(steps - 1, 1)
  return curves, times


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--d", type=int, default=256, help="model width (a multiple of 128)")
  p.add_argument("--hidden", type=int, default=1024, help="MLP width (a multiple of 128)")
  p.add_argument("--batch", type=int, default=256, help="tokens per step")
  p.add_argument("--kinds", default=",".join(LAYERS))
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  kinds = [k for k in args.kinds.split(",") if k]
  curves, times = run(kinds, args.steps, args.d, args.hidden, args.batch,
                      log_every=max(args.steps // 5, 1))
  first = {k: c[0] for k, c in curves.items()}
  last = {k: sum(c[-10:]) / len(c[-10:]) for k, c in curves.items()}
  print(f"\n{'layer':14s} {'loss at step 1':>15s} {'loss (last 10)':>15s} {'vs bf16':>8s} {'ms/step':>8s}")
  for k in kinds:
    ratio = last[k] / last["bf16"] if "bf16" in last else float("nan")
    print(f"{k:14s} {first[k]:15.5f} {last[k]:15.5f} {ratio:8.3f} {times[k] * 1e3:8.2f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(args=vars(args), device=str(jax.devices()[0]), first=first, last=last,
                     ms_per_step={k: v * 1e3 for k, v in times.items()}, curves=curves), f)
  return last


if __name__ == "__main__":
  main()
