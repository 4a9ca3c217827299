"""Where the FP8 prefill route's time goes (MX weights x FP8 activations, M = 4096), on a Hopper GPU.

  python3 -P tools/diag_prefill_route.py OUT.json [SHAPES] [FORMATS]
  e.g. /tmp/route.json 4096x8192x8192,4096x28672x8192 mxfp4,mxfp6_e2m3,mxfp6_e3m2

Per shape, in one process and interleaved (bench_fp8.time_rounds: 3 rounds of 5 samples), µs per
GEMM, several weight sets per call so the weights come from HBM:
  route_F     weightonly_gemm(x8, w, path="fp8"): row exponents + unpack + fp8_gemm
  unpack_F    the route's first half alone (row exponents + unpack to e4m3)
  gemm_F      the route's second half alone: fp8_gemm on the already unpacked e4m3 weight with its
              per-channel power-of-two scale
  fp8_tensor  fp8_gemm on a random e4m3 weight with a per-tensor scale (the issue's anchor,
              bench_weightonly's ours_fp8)
  fp8_channel the same weight with a per-channel scale
  xla_fp8     fp8 operands straight into lax.dot_general (cuBLASLt), scale after
Activations are cast to e4m3 once, outside the timed calls (bench_weightonly casts inside)."""
import json
import math
import sys
import time

sys.path.insert(0, "benchmarks")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
import bench_fp8 as B  # noqa: E402
import jax_gmma  # noqa: E402
from jax_gmma import weightonly as wo  # noqa: E402

OUT = sys.argv[1]
SHAPES = [tuple(map(int, s.split("x"))) for s in
          (sys.argv[2] if len(sys.argv) > 2 else "4096x8192x8192,4096x28672x8192").split(",")]
FORMATS = (sys.argv[3] if len(sys.argv) > 3 else "mxfp4,mxfp6_e2m3,mxfp6_e3m2").split(",")
F8, F32, BF16 = jnp.float8_e4m3fn, jnp.float32, jnp.bfloat16
TN = (((1,), (1,)), ((), ()))
L2 = 60 << 20

res = {}
key = jax.random.PRNGKey(0)
for (m, n, k) in SHAPES:
  key, kx = jax.random.split(key)
  x8 = jax.random.normal(kx, (m, k), F32).astype(F8)
  nsets = min(16, max(2, math.ceil(2 * L2 / (n * k))))
  w32s = []
  for _ in range(nsets):
    key, kw = jax.random.split(key)
    w32s.append(jax.random.normal(kw, (n, k), F32) / math.sqrt(k))
  fns = {}
  for fmt in FORMATS:
    wps = [wo.prepare(w, fmt) for w in w32s]
    assert all(w.fp8_exact for w in wps), fmt
    un = [(wo.unpack(w, F8, row_exp=wo.row_exponents(w)),
           jnp.ldexp(jnp.ones((n,), F32), wo.row_exponents(w) - 127)) for w in wps]
    fns[f"route_{fmt}"] = (lambda w: jax_gmma.weightonly_gemm(x8, w, path="fp8"), wps)
    fns[f"unpack_{fmt}"] = (lambda w: wo.unpack(w, F8, row_exp=wo.row_exponents(w)), wps)
    fns[f"gemm_{fmt}"] = (lambda w8, s: jax_gmma.fp8_gemm(x8, w8, None, s, out_dtype=BF16), un)
  tq = []
  for w in w32s:
    s = jnp.max(jnp.abs(w)) / 448.0
    tq.append(((w / s).astype(F8), s.astype(F32)))
  fns["fp8_tensor"] = (lambda w8, s: jax_gmma.fp8_gemm(x8, w8, None, s, out_dtype=BF16), tq)
  fns["fp8_channel"] = (lambda w8, s: jax_gmma.fp8_gemm(x8, w8, None, jnp.full((n,), s), out_dtype=BF16), tq)
  fns["xla_fp8"] = (lambda w8, s: (lax.dot_general(x8, w8, TN, preferred_element_type=F32) * s).astype(BF16), tq)
  compiled = {}
  for name, (f, sets) in fns.items():
    sets = tuple(s if isinstance(s, tuple) else (s,) for s in sets)
    compiled[name] = (lambda c=B._per_call(f, sets), sets=sets: c(sets))
  stats = B.time_rounds(compiled, [()], 5, 0.15, 3)
  r = {name: st["median_us"] / nsets for name, st in stats.items()}
  res[f"{m}x{n}x{k}"] = dict(us_per_gemm=r, sets=nsets)
  print(f"{m}x{n}x{k} sets={nsets}: " + ", ".join(f"{a}={b:.1f}" for a, b in sorted(r.items(), key=lambda x: x[1])),
        flush=True)
  for fmt in FORMATS:
    print(f"  {fmt}: route/fp8_tensor = {r['fp8_tensor'] / r[f'route_{fmt}']:.3f}x, unpack {r[f'unpack_{fmt}']:.1f}, "
          f"gemm {r[f'gemm_{fmt}']:.1f} (sum {r[f'unpack_{fmt}'] + r[f'gemm_{fmt}']:.1f} vs route {r[f'route_{fmt}']:.1f})",
          flush=True)
  del fns, compiled, w32s, tq
json.dump(dict(date=time.strftime("%Y-%m-%d"), gpu=str(jax.devices()[0].device_kind), shapes=res),
          open(OUT, "w"), indent=1)
