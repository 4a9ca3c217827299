"""A/B of the block-scaled 1d2d kernel's tile orders and the two-level route's peers, on a Hopper GPU.

  python3 -P tools/diag_blockwise_tile_order.py SHAPES ORDERS OUT.json [TW_CONFIGS]
  e.g. 8192x8192x8192,4096x2112x7168 1:auto,8:m /tmp/order.json 128x192x128_c2x1_coop_2lvl

Per shape, in one process: blockwise_gemm on `128x128x128_c1x1_coop` under each SWIZZLE:RASTER
of ORDERS, or on a forced config when an ORDERS item is a bench_blockwise --configs spec
(NAME[/SPLITS][@SWIZZLE:RASTER]) (bw_* rows), blockwise_gemm's own pick (bw_auto_pick), fp8_gemm's default two-level
(which may take the block-scaled route), the tensorwise two-level configs of TW_CONFIGS forced
(default: the 128x192 tile; tw_2lvl_<tile> rows, tile order left to fp8_gemm's rule), and XLA's
precise FP8 dot, and torch._scaled_mm blockwise (cuBLASLt; own data, bench_blockwise's recipe; not
with DIAG_TORCH=0). One GEMM per input set, all sets in one jitted call; 3 interleaved rounds of 5
samples (bench_fp8.time_rounds); µs per GEMM. Session 16's results: benchmarks/results/2026-12-01-h200/session16/."""
import json
import os
import sys
import time

sys.path.insert(0, "benchmarks")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import bench_fp8 as B  # noqa: E402
import bench_blockwise as BB  # noqa: E402
import jax_gmma  # noqa: E402

SHAPES = [tuple(map(int, s.split("x"))) for s in sys.argv[1].split(",")]
ORDERS = sys.argv[2].split(",")
OUT = sys.argv[3]
TW = (sys.argv[4] if len(sys.argv) > 4 else "128x192x128_c2x1_coop_2lvl").split(",")
BF16 = jnp.bfloat16
TORCH = os.environ.get("DIAG_TORCH", "1") == "1" and jax.devices()[0].platform == "gpu"


class _TorchSync:
  """What time_samples blocks on for the torch peer: a CUDA synchronize at the sample's end."""

  def __init__(self, t):
    self.t = t

  def block_until_ready(self):
    self.t.cuda.synchronize()
    return self


def _torch_fn(m, n, k, nsets):
  """torch._scaled_mm blockwise (cuBLASLt) over nsets own input sets, as bench_blockwise runs it;
  None (and a message) when torch cannot run it."""
  import torch as t  # noqa: PLC0415
  g = t.Generator(device="cuda").manual_seed(0)
  srcs = [(*BB._torch_quant_1x128(t, t.randn((m, k), device="cuda", generator=g)),
           *BB._torch_quant_128x128(t, t.randn((n, k), device="cuda", generator=g))) for _ in range(nsets)]
  for name, make in BB._torch_recipes(t):
    try:
      calls = [make(a, b, sa, sb)[0] for a, sa, b, sb in srcs]
      calls[0]()
    except Exception as e:  # noqa: BLE001
      print(f"torch form {name} failed: {type(e).__name__}", flush=True)
      continue
    sync = _TorchSync(t)
    return lambda: ([c() for c in calls], sync)[1]
  raise RuntimeError("torch rejected every blockwise form")


res = {}
key = jax.random.PRNGKey(0)
for (m, n, k) in SHAPES:
  nsets = max(2, min(8, int(4 * 2**30 // 8 // (m * k + n * k))))
  sets = []
  for i in range(nsets):
    key, k1, k2 = jax.random.split(key, 3)
    sets.append(BB.make_operands(BB.normal(k1, (m, k)), BB.normal(k2, (n, k))))
  bw = [s["bw"] for s in sets]
  pt = [s["pt"] for s in sets]
  fns = {}
  for spec in ORDERS:
    fns[f"bw_{spec}"] = (BB._forced_gemm(spec if "@" in spec or "_" in spec else
                                         f"128x128x128_c1x1_coop@{spec}"), bw)
  fns["bw_auto_pick"] = (lambda a, b, sa, sb: jax_gmma.blockwise_gemm(a, b, sa, sb, out_dtype=BF16), bw)
  for cfg in TW:
    fns[f"tw_2lvl_{cfg.split('_')[0]}"] = (lambda a, b, sa, sb, cfg=cfg: jax_gmma.fp8_gemm(
        a, b, sa, sb, out_dtype=BF16, config=cfg), pt)
  fns["fp8_gemm_default"] = (B.ours_gemm, pt)
  fns["xla_precise"] = (B.xla_fp8_precise_gemm, pt)
  compiled = {}
  for name, (f, s) in fns.items():
    compiled[name] = (B._per_call(f, s), s)
  r = {}
  allfns = {name: (lambda sets_=s, c=c: c(tuple(sets_))) for name, (c, s) in compiled.items()}
  if TORCH:
    try:
      allfns["torch_blockwise"] = _torch_fn(m, n, k, nsets)
    except Exception as e:  # noqa: BLE001 -- the peer is optional; say why it is missing
      print(f"torch_blockwise: not run ({type(e).__name__}: {e})", flush=True)
  stats = B.time_rounds({n_: (lambda f=f: f()) for n_, f in allfns.items()}, [()], 5, 0.15, 3)
  for name, st in stats.items():
    r[name] = st["median_us"] / nsets
  res[f"{m}x{n}x{k}"] = r
  print(f"{m}x{n}x{k} sets={nsets}: " + ", ".join(f"{a}={b:.1f}" for a, b in sorted(r.items(), key=lambda x: x[1])), flush=True)
  del sets, bw, pt, compiled, allfns
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=str(jax.devices()[0].device_kind), us_per_gemm=res),
          open(OUT, "w"), indent=1)
