"""Why a decode chain of our custom calls runs slower at M = 1 than at M = 4 when N != K.

  python3 -P tools/diag_chain_slice.py [--shapes 1x14336x4096,4x14336x4096,...] [--out DIR]   (GPU)

Session 27 measured, per GEMM in the 32-step chain of benchmarks/bench_weightonly.py (prefix glue):
1 x 14336 x 4096 ours NVFP4 26.6 us, ours FP8 31.7, XLA FP8 21.0; 4 x 14336 x 4096 12.0 / 18.9 / 24.1.
This runs the same chains in one child process per XLA flag setting (XLA_FLAGS is read once, at
backend start-up) and prints, per (setting, shape, impl): the time per GEMM, the custom calls and
fusions of the entry computation and what the op that consumes the glue's slice turned into
(custom call, dynamic-slice fusion, ...). The optimized HLO of each chain goes to
DIR/<setting>_<shape>_<impl>_<glue>.hlo.txt.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = {
    "default": "",
    "no_dsfusion": "--xla_gpu_enable_dynamic_slice_fusion=false",
    "no_cmdbuf": "--xla_gpu_enable_command_buffer=",
}


def summarize(text):
  """Entry-computation facts from optimized HLO text (command buffers are formed after HLO
  optimization, so they do not show here)."""
  entry = text[text.find("\nENTRY"):]
  entry = entry[:entry.find("\n}")]
  lines = entry.splitlines()
  ccalls = sum(1 for ln in lines if " custom-call(" in ln)
  fusions = sum(1 for ln in lines if " fusion(" in ln)
  kinds = sorted(set(re.findall(r"kind=(k\w+)", entry)))
  names = sorted(set(re.findall(r'"name":"([\w-]+)"', entry)))
  dsf = len(re.findall(r"dynamic_slice_fusion|address_computation|dynamic-slice-fusion", text))
  return (f"entry: {len(lines)} lines, {ccalls} custom-call, {fusions} fusion, "
          f"dyn-slice-fusion refs {dsf}, kinds {kinds}, custom fusion names {names}")


def child(args):
  sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
  import jax

  import bench_weightonly as bw
  from bench_fp8 import BF16, F32, compile_jax, time_rounds

  setting = os.environ.get("DIAG_SETTING", "default")
  impls = args.impls.split(",")
  key = jax.random.PRNGKey(0)
  for spec in args.shapes.split(","):
    m, n, k = (int(v) for v in spec.split("x"))
    fns = {}
    for impl in impls:
      key, ws = bw.distinct_weights(key, impl, n, k)
      key, sub = jax.random.split(key)
      x = jax.random.normal(sub, (m, k), F32).astype(BF16)
      for glue in args.glues.split(","):
        chain, _ = compile_jax(bw._chain(bw._steps(k)[impl], k, glue), (x, ws))
        text = chain.as_text() or ""
        if args.out:
          with open(os.path.join(args.out, f"{setting}_{spec}_{impl}_{glue}.hlo.txt"), "w") as f:
            f.write(text)
        name = f"{impl}/{glue}"
        print(f"[{setting}] {spec} {name:22s} {summarize(text)}", flush=True)
        fns[name] = lambda chain=chain, x=x, ws=ws: chain(x, ws)
    stats = time_rounds(fns, [()], 5, 0.05, 3)
    for name, st in stats.items():
      print(f"[{setting}] {spec} {name:22s} {st['median_us'] / bw.CHAIN:8.2f} us/GEMM", flush=True)
    fns = None


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--shapes", default="1x14336x4096,4x14336x4096,1x8192x8192,1x28672x8192")
  ap.add_argument("--impls", default="ours_nvfp4,ours_fp8,xla_fp8")
  ap.add_argument("--glues", default="prefix")
  ap.add_argument("--settings", default=",".join(SETTINGS))
  ap.add_argument("--out", default="")
  ap.add_argument("--child", action="store_true")
  args = ap.parse_args()
  if args.out:
    os.makedirs(args.out, exist_ok=True)
  if args.child:
    return child(args)
  rc = 0
  for s in args.settings.split(","):
    env = dict(os.environ, DIAG_SETTING=s,
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + SETTINGS[s]).strip())
    cmd = [sys.executable, "-P", os.path.abspath(__file__), "--child", "--shapes", args.shapes,
           "--impls", args.impls, "--glues", args.glues, "--out", args.out]
    rc |= subprocess.call(cmd, env=env)
  return rc


if __name__ == "__main__":
  sys.exit(main())
