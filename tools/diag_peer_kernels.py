"""Which kernels the peers run: cuBLASLt via torch._scaled_mm (blockwise and tensorwise) and
XLA's FP8 dot (default = fast accumulation, HIGHEST = precise): cuBLASLt's kernel names carry
its tile, cluster and schedule. Each call runs 3 times under torch's
profiler; it prints each distinct GPU kernel's name, launches, grid, block, registers:

  python3 -P tools/diag_peer_kernels.py [--shapes 4096x7168x16384,8192x8192x8192]

Session 16 ran an earlier version that attributed kernels to calls by CPU timestamps (wrongly);
this listing version has not run on a GPU yet. Results:
benchmarks/results/2026-12-01-h200/session16/peer_kernels/.
"""
import argparse
import sys

sys.path.insert(0, "benchmarks")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import bench_blockwise as BB  # noqa: E402  (its torch quantizers and _scaled_mm recipe)


CALLS = []


def add_call(name, fn):
  fn()  # compile and warm up outside the profiled range
  torch.cuda.synchronize()
  CALLS.append((name, fn))


def profile(trace_path):
  """Runs every call 3 times under torch's profiler (CUPTI sees JAX's kernels too) and prints
  each distinct GPU kernel with its launch count, grid, block, registers and shared memory.
  (Attributing kernels to calls by CPU timestamps went wrong in session 16, so it is not done.)"""
  import collections
  import json
  from torch.profiler import ProfilerActivity, profile as tprofile
  with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for name, fn in CALLS:
      print("call", name, flush=True)
      for _ in range(3):
        r = fn()
        if hasattr(r, "block_until_ready"):
          r.block_until_ready()
        torch.cuda.synchronize()
  prof.export_chrome_trace(trace_path)
  ev = json.load(open(trace_path))["traceEvents"]
  seen = collections.OrderedDict()
  for k in ev:
    if k.get("cat") == "kernel":
      a = k.get("args", {})
      key = (k["name"], str(a.get("grid")), str(a.get("block")))
      n, durs, regs, smem = seen.get(key, (0, [], a.get("registers per thread"), a.get("shared memory")))
      seen[key] = (n + 1, durs + [k["dur"]], regs, smem)
  for (name, grid, block), (n, durs, regs, smem) in seen.items():
    print(f"{n:4d}x median {sorted(durs)[len(durs) // 2]:9.1f} us grid={grid} block={block} regs={regs} "
          f"smem={smem} {name[:160]}")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--shapes", default="4096x7168x16384,8192x8192x8192")
  ap.add_argument("--decode", default="64x28672x8192")
  args = ap.parse_args()
  blockwise_form = BB._torch_recipes(torch)[0][1]  # the form bench_blockwise tries first
  for shp in [s for s in (args.shapes + "," + args.decode).split(",") if s]:
    m, n, k = map(int, shp.split("x"))
    a, sa = BB._torch_quant_1x128(torch, torch.randn(m, k, device="cuda"))
    b, sb = BB._torch_quant_128x128(torch, torch.randn(n, k, device="cuda"))
    one = torch.ones((), device="cuda")
    # Every lambda binds this shape's operands now: the calls run after the loop (profile()).
    if m >= 128:
      add_call(f"torch_blockwise_{shp}", blockwise_form(a, b, sa, sb)[0])
    add_call(f"torch_tensorwise_{shp}", lambda a=a, b=b, one=one: torch._scaled_mm(
        a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    ja = jnp.asarray(np.asarray(a.view(torch.uint8).cpu())).view(jnp.float8_e4m3fn)
    jb = jnp.asarray(np.asarray(b.view(torch.uint8).cpu())).view(jnp.float8_e4m3fn)
    for prec in ("DEFAULT", "HIGHEST"):
      f = jax.jit(lambda x, y, p=prec: jax.lax.dot_general(
          x, y, (((1,), (1,)), ((), ())), precision=getattr(jax.lax.Precision, p),
          preferred_element_type=jnp.bfloat16))
      add_call(f"xla_{prec.lower()}_{shp}", lambda f=f, ja=ja, jb=jb: f(ja, jb))
  profile("/tmp/peer_trace.json")


if __name__ == "__main__":
  sys.exit(main())
