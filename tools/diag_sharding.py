"""FP8 GEMMs split across the GPUs of one host under jax.jit: ours vs XLA's FP8 dot, same shardings.

  python3 -P tools/diag_sharding.py [--out DIR] [--shapes MxNxK,...]   (2+ GPUs)

For each shape, G distinct weights per jitted call (they stream from HBM; dispatch amortized),
fast accumulation on both sides (XLA's default for FP8 dots): one GPU, then every GPU with
  "n": the weights split by output features (column-parallel; x replicated),
  "m": the tokens split (data-parallel; weights replicated),
  "k": both split along the contraction (row-parallel; a float32 psum per GEMM for ours, XLA
       places its own all-reduce).
Prints µs per GEMM and the speedup over one GPU, and writes sharding.json / sharding.md.
"""
import argparse
import datetime
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_fp8 import ours_fast_gemm, warm_gpu, xla_fp8_gemm  # noqa: E402
from sweep import time_fn  # noqa: E402

SPLITS = {"1gpu": None, "n": (None, P("x", None)), "m": (P("x", None), None),
          "k": (P(None, "x"), P(None, "x"))}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
  ap.add_argument("--shapes", default="8192x8192x8192,4096x28672x8192,64x28672x8192")
  ap.add_argument("--repeats", type=int, default=7)
  args = ap.parse_args()
  devs = jax.devices()
  if len(devs) < 2:
    sys.exit(f"needs 2 or more GPUs, found {len(devs)}")
  mesh = jax.sharding.Mesh(np.array(devs), ("x",))
  warm_gpu(2.0)
  rows = []
  for spec in args.shapes.split(","):
    m, n, k = (int(v) for v in spec.split("x"))
    g = 8 if m > 64 else 16
    a = (jax.random.normal(jax.random.PRNGKey(0), (m, k)) * 2).astype(jnp.float8_e4m3fn)
    bs = [(jax.random.normal(jax.random.PRNGKey(i + 1), (n, k)) * 2).astype(jnp.float8_e4m3fn)
          for i in range(g)]
    s = jnp.float32(1 / 64)
    for split, sh in SPLITS.items():
      if sh is None:
        a_, bs_ = jax.device_put(a, devs[0]), [jax.device_put(b, devs[0]) for b in bs]
      else:
        put = lambda v, p: jax.device_put(v, NamedSharding(mesh, P() if p is None else p))
        a_, bs_ = put(a, sh[0]), [put(b, sh[1]) for b in bs]
      row = dict(shape=spec, m=m, n=n, k=k, split=split, gpus=1 if sh is None else len(devs), gemms=g)
      for name, gemm in (("ours", ours_fast_gemm), ("xla_fp8", xla_fp8_gemm)):
        f = jax.jit(lambda a, bs, gemm=gemm: [gemm(a, b, s, s) for b in bs])
        try:
          row[f"{name}_us"] = time_fn(f, (a_, bs_), args.repeats, iters=8) / g * 1e6
          hlo = f.lower(a_, bs_).compile().as_text()
          row[f"{name}_collectives"] = sorted({c for c in ("all-gather", "all-reduce", "reduce-scatter",
                                                           "all-to-all", "collective-permute") if c in hlo})
        except Exception as e:  # noqa: BLE001
          row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
      rows.append(row)
      print(json.dumps(row), flush=True)
  base = {(r["shape"], "ours"): r.get("ours_us") for r in rows if r["split"] == "1gpu"}
  base.update({(r["shape"], "xla"): r.get("xla_fp8_us") for r in rows if r["split"] == "1gpu"})
  lines = [f"# FP8 GEMMs across {len(devs)} GPUs ({devs[0].device_kind}), {datetime.date.today()}", "",
           "µs per GEMM, fast accumulation both sides; speedup over one GPU in parentheses.", "",
           "| M x N x K | split | ours | XLA FP8 | ours / XLA | ours collectives | XLA collectives |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    o, x = r.get("ours_us"), r.get("xla_fp8_us")
    so = f" ({base[(r['shape'], 'ours')] / o:.2f}x)" if o and r["split"] != "1gpu" else ""
    sx = f" ({base[(r['shape'], 'xla')] / x:.2f}x)" if x and r["split"] != "1gpu" else ""
    ratio = f"{x / o:.2f}x" if o and x else "-"
    lines.append(f"| {r['shape']} | {r['split']} | {o and f'{o:.1f}'}{so} | {x and f'{x:.1f}'}{sx} | {ratio} | "
                 f"{','.join(r.get('ours_collectives', [])) or '-'} | {','.join(r.get('xla_fp8_collectives', [])) or '-'} |")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "sharding.json"), "w") as fh:
    json.dump(dict(date=str(datetime.date.today()), gpus=len(devs), device=devs[0].device_kind,
                   jax=jax.__version__, rows=rows), fh, indent=1)
  with open(os.path.join(args.out, "sharding.md"), "w") as fh:
    fh.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
