"""A/B of the block-scaled 1d2d kernel's tile orders and the two-level route's peers, on a Hopper GPU.

  python3 -P tools/diag_blockwise_tile_order.py SHAPES ORDERS OUT.json
  e.g. 8192x8192x8192,4096x2112x7168 1:auto,8:m /tmp/order.json

Per shape, in one process: blockwise_gemm on `128x128x128_c1x1_coop` under each SWIZZLE:RASTER
of ORDERS (bw_*), blockwise_gemm's own pick (bw_auto_pick), fp8_gemm's default two-level
(which may take the block-scaled route), the tensorwise two-level 128x192 tile forced, and XLA's
precise FP8 dot. One GEMM per input set, all sets in one jitted call; 3 interleaved rounds of 5
samples (bench_fp8.time_rounds); µs per GEMM. Session 16's results: benchmarks/results/2026-12-01-h200/session16/."""
import json
import sys
import time

sys.path.insert(0, "benchmarks")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import bench_fp8 as B  # noqa: E402
import bench_blockwise as BB  # noqa: E402
import jax_gmma  # noqa: E402

SHAPES = [tuple(map(int, s.split("x"))) for s in sys.argv[1].split(",")]
ORDERS = [tuple(o.split(":")) for o in sys.argv[2].split(",")]
OUT = sys.argv[3]
BF16 = jnp.bfloat16
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
  for sw, ra in ORDERS:
    f = lambda a, b, sa, sb, sw=int(sw), ra=ra: jax_gmma.blockwise_gemm(
        a, b, sa, sb, out_dtype=BF16, config="128x128x128_c1x1_coop", swizzle=sw, raster=ra)
    fns[f"bw_{sw}:{ra}"] = (f, bw)
  fns["bw_auto_pick"] = (lambda a, b, sa, sb: jax_gmma.blockwise_gemm(a, b, sa, sb, out_dtype=BF16), bw)
  fns["tw_2lvl_128x192"] = (lambda a, b, sa, sb: jax_gmma.fp8_gemm(
      a, b, sa, sb, out_dtype=BF16, config="128x192x128_c2x1_coop_2lvl"), pt)
  fns["fp8_gemm_default"] = (B.ours_gemm, pt)
  fns["xla_precise"] = (B.xla_fp8_precise_gemm, pt)
  compiled = {}
  for name, (f, s) in fns.items():
    compiled[name] = (B._per_call(f, s), s)
  r = {}
  allfns = {name: (lambda sets_=s, c=c: c(tuple(sets_))) for name, (c, s) in compiled.items()}
  stats = B.time_rounds({n_: (lambda f=f: f()) for n_, f in allfns.items()}, [()], 5, 0.15, 3)
  for name, st in stats.items():
    r[name] = st["median_us"] / nsets
  res[f"{m}x{n}x{k}"] = r
  print(f"{m}x{n}x{k} sets={nsets}: " + ", ".join(f"{a}={b:.1f}" for a, b in sorted(r.items(), key=lambda x: x[1])), flush=True)
  del sets, bw, pt, compiled, allfns
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=str(jax.devices()[0].device_kind), us_per_gemm=res),
          open(OUT, "w"), indent=1)
