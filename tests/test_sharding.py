"""Multi-device partitioning of the primitives under jax.jit (jax_gmma.sharding).

The rules themselves (which dimensions stay sharded, and why not) are pure and tested here; the
end-to-end checks run in a subprocess with four virtual CPU devices (a 2 x 2 mesh), where the
primitives lower to their pure-JAX reference inside XLA's partition callback exactly as the CUDA
kernels do on GPUs. The same script runs on a multi-GPU machine (tests/test_gpu_sharding.py).
"""
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
from jax.core import ShapedArray

from jax_gmma import sharding

E4 = np.dtype(jnp.float8_e4m3fn)
F32 = np.dtype(np.float32)
BF16 = np.dtype(jnp.bfloat16)


def _gemm_rule(m, n, k, per_row=True, bias=True):
  avals = [ShapedArray((m, k), E4), ShapedArray((n, k), E4), ShapedArray((m if per_row else 1,), F32),
           ShapedArray((n if per_row else 1,), F32), ShapedArray((n if bias else 1,), BF16)]
  return sharding.RULES["jax_gmma_fp8_gemm"](avals, dict(has_bias=bias, out_dtype=BF16))


def _specs(*specs):
  return [tuple(s) for s in specs]


def test_plan_keeps_token_and_feature_splits():
  rule = _gemm_rule(64, 512, 256)
  chosen, dropped = sharding.plan(rule, {"x": 2, "y": 2},
                                  _specs(("x", None), ("y", None), ("x",), ("y",), ("y",)))
  assert chosen == {"m": ("x",), "n": ("y",)} and dropped == []


def test_plan_contraction_split_is_a_reduction():
  rule = _gemm_rule(64, 512, 256)
  chosen, dropped = sharding.plan(rule, {"x": 2}, _specs((None, "x"), (None, "x"), (None,), (None,), (None,)))
  assert chosen == {"k": ("x",)} and dropped == []
  assert rule.reduction == ("k",)
  text, factors = rule.sdy_rule()
  assert text == "m k, n k, m, n, n -> m n" and factors["reduction_factors"] == ("k",)


def test_plan_same_axis_twice_keeps_the_first():
  rule = _gemm_rule(64, 512, 256)
  chosen, dropped = sharding.plan(rule, {"x": 2}, _specs(("x", None), ("x", None), (None,), (None,), (None,)))
  assert chosen == {"m": ("x",)}
  assert [(f, why) for f, _, why in dropped] == [("n", "mesh axes ('x',) already split another dimension")]


def test_plan_refuses_shards_that_break_kernel_rules():
  rule = _gemm_rule(64, 520, 256)
  chosen, dropped = sharding.plan(rule, {"x": 4}, _specs((None, None), ("x", None), (None,), (None,), (None,)))
  assert chosen == {}
  assert "each shard's N (130) would not be a multiple of 8" in dropped[0][2]
  rule = _gemm_rule(6, 512, 256)
  chosen, dropped = sharding.plan(rule, {"x": 4}, _specs(("x", None), (None, None), (None,), (None,), (None,)))
  assert chosen == {} and "M = 6 is not a multiple of the 4 shards" in dropped[0][2]


def test_plan_per_tensor_scales_stay_whole():
  rule = _gemm_rule(64, 512, 256, per_row=False, bias=False)
  assert rule.operands[2:] == (("sa",), ("sb",), ("c",))
  text, factors = rule.sdy_rule()
  assert factors["need_replication_factors"] == ("sa", "sb", "c")


def test_blockwise_rule_ties_scale_blocks_to_their_rows():
  m, n, k = 64, 1024, 512
  avals = [ShapedArray((m, k), E4), ShapedArray((n, k), E4), ShapedArray((4, m), F32),
           ShapedArray((4, 8), F32), ShapedArray((1,), BF16)]
  rule = sharding.RULES["jax_gmma_fp8_blockwise_gemm"](avals, dict(variant="1d2d", has_bias=False, out_dtype=BF16))
  chosen, _ = sharding.plan(rule, {"x": 2, "y": 2}, _specs(("x", None), ("y", None), (None, None), (None, None), (None,)))
  assert chosen == {"m": ("x",), "n": ("y",)}
  assert tuple(sharding._named(_abstract_mesh(), rule.operands[3], chosen, rule).spec) == (None, "y")
  # 512 rows of weights are 4 scale rows: two shards of 2 would need the layout's padding
  avals[1], avals[3] = ShapedArray((512, k), E4), ShapedArray((4, 4), F32)
  rule = sharding.RULES["jax_gmma_fp8_blockwise_gemm"](avals, dict(variant="1d2d", has_bias=False, out_dtype=BF16))
  chosen, dropped = sharding.plan(rule, {"y": 2}, _specs((None, None), ("y", None), (None, None), (None, None), (None,)))
  assert chosen == {} and "kernel layout's padding" in dropped[0][2]


def _abstract_mesh():
  """A 2 x 2 mesh without devices, enough for NamedSharding in _named."""
  from jax.sharding import AbstractMesh
  try:
    return AbstractMesh((2, 2), ("x", "y"))
  except TypeError:  # older signature
    return AbstractMesh((("x", 2), ("y", 2)))


def test_weightonly_rule_splits_strips_not_k():
  avals = [ShapedArray((4, 512), BF16), ShapedArray((1,), F32), ShapedArray((16, 8, 512), np.uint8),
           ShapedArray((16, 8, 32), np.uint8), ShapedArray((1,), F32), ShapedArray((1,), BF16)]
  params = dict(fmt="nvfp4", n=256, k=512, out_dtype=BF16, has_x_scale=False, has_bias=False, rows=16,
                tokens=8, k_warps=16)
  rule = sharding.RULES["jax_gmma_weightonly_gemm"](avals, params)
  chosen, dropped = sharding.plan(rule, {"x": 2, "y": 2},
                                  _specs(("x", "y"), (None,), ("y", None, None), ("y", None, None), (None,), (None,)))
  assert chosen == {"m": ("x",), "n": ("y",)}
  assert [(f, why) for f, _, why in dropped] == [("kp", "this op does not split that dimension")]
  assert rule.local_params(params, [(2, 512), (1,), (8, 8, 512)])["n"] == 128


_SCRIPT = r'''
import math, os, warnings
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
import jax_gmma
from jax_gmma.ops import quantize as qkernel, weightonly
from jax_gmma.sharding import ShardingWarning
from _sharding_check import COLLECTIVES, check_sharded

devs = jax.devices()
assert len(devs) >= 2 and len(devs) % 2 == 0, devs
# 2 x 2 on four (CPU) devices; 2 x 1 on two GPUs (the y axis then splits nothing)
GRID = (2, min(len(devs), 4) // 2)
mesh = jax.make_mesh(GRID, ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=devs[:math.prod(GRID)])
# the CUDA kernels pick their configs per shape, so a shard's product may round differently
EXACT = os.environ.get("JAX_GMMA_SHARDING_EXACT", "1") == "1"
KERNELS = os.environ.get("JAX_GMMA_SHARDING_KERNELS") == "1"  # assert the FFI kernels ran
rng = np.random.default_rng(0)
E4, BF16, F32 = jnp.float8_e4m3fn, jnp.bfloat16, jnp.float32


def normal(*shape):
  return jnp.asarray(rng.standard_normal(shape), F32)


def run(fn, args, specs, want_collectives=(), warn=None, exact=True, mesh=mesh):
  return check_sharded(fn, args, specs, mesh, want_collectives, warn, exact and EXACT, 2e-2, KERNELS)


# fp8_gemm: tokens / features split locally; a split contraction sums float32 partials
a = normal(64, 256).astype(E4); b = normal(512, 256).astype(E4)
sa = jnp.asarray(rng.uniform(0.5, 2, 64), F32); sb = jnp.asarray(rng.uniform(0.5, 2, 512), F32)
bias = normal(512).astype(BF16)
gemm = lambda a, b, sa, sb, bias: jax_gmma.fp8_gemm(a, b, sa, sb, bias=bias)
args = (a, b, sa, sb, bias)
run(gemm, args, [P("x"), None, P("x"), None, None])
run(gemm, args, [None, P("y"), None, P("y"), P("y")])
run(gemm, args, [P("x"), P("y"), P("x"), P("y"), P("y")])
run(gemm, args, [P(None, "x"), P(None, "x"), None, None, None], ("all-reduce",), exact=False)
run(gemm, args, [P("x", "y"), P(None, "y"), P("x"), None, None], ("all-reduce",) if GRID[1] > 1 else (),
    exact=False)
run(lambda a, b: jax_gmma.fp8_gemm(a.astype(jnp.float8_e5m2), b, out_dtype=F32), (a, b), [P("x"), P("y")])
# a split the kernel cannot take (130 rows of N per shard): gathered, with a warning
nz = math.prod(GRID)
mesh_z = jax.make_mesh((nz,), ("z",), axis_types=(AxisType.Auto,), devices=devs[:nz])
b_odd = normal(nz * 130, 256).astype(E4)
run(lambda a, b: jax_gmma.fp8_gemm(a, b), (a, b_odd), [None, P("z")], ("all-gather",),
    warn="each shard's N (130) would not be a multiple of 8", mesh=mesh_z)

# block-scaled 1x128 x 128x128
xq = jax_gmma.quantize(normal(64, 512), "fp8_1x128")
wq = jax_gmma.quantize(normal(1024, 512), "fp8_128x128")
bw = lambda ad, asc, bd, bsc: jax_gmma.blockwise_gemm(ad, bd, asc, bsc)
bargs = (xq.data, xq.scales, wq.data, wq.scales)
run(bw, bargs, [P("x"), P("x"), P("y"), P("y")])
run(bw, bargs, [P(None, "x"), P(None, "x"), P(None, "x"), P(None, "x")], ("all-reduce",), exact=False)

# dot on a per-channel FP8 weight: x split by tokens, the weight by output features
wc = jax_gmma.quantize(normal(512, 256), "fp8_channel")
dot = lambda x, *leaves: jax_gmma.dot(x, jax.tree.unflatten(jax.tree.structure(wc), leaves))
run(dot, (normal(64, 256).astype(BF16), *jax.tree.leaves(wc)), [P("x"), P("y"), P("y")])

# FP8 training step, data parallel: the weight's gradient is summed over the token shards
x = normal(64, 256); w = normal(512, 256) / 16
loss = lambda x, w: (jax_gmma.fp8_linear(x, w).astype(F32) ** 2).sum()
run(jax.grad(loss, (0, 1)), (x, w), [P("x"), None], ("all-reduce",), exact=False)
# ... and tensor parallel: the weight split by output features (dgrad contracts over them: psum)
run(jax.grad(loss, (0, 1)), (x, w), [P("x"), P("y")], ("all-reduce",), exact=False)

# row quantization kernel's primitive: rows split (row-major and 128-row swizzled scales)
xr = normal(256, 512).astype(BF16)
run(lambda x: qkernel.quantize_rows(x, "fp8_1x128"), (xr,), [P("x")])
run(lambda x: qkernel.quantize_rows(x, "mxfp8", layout="sm100_128x4"), (xr,), [P("x")])

# FP4 / FP6 weight-only: weights split by 16-row strips, tokens by rows
for fmt in ("nvfp4", "mxfp6_e2m3"):
  pw = weightonly.prepare(normal(256, 512), fmt)
  def wo(x, packed, scales, g, pw=pw):
    w = weightonly.PackedWeight(packed, scales, g, format=pw.format, n=pw.n, k=pw.k)
    return jax_gmma.weightonly_gemm(x, w, path="kernel")
  run(wo, (normal(4, 512).astype(BF16), pw.packed, pw.scales, pw.global_scale),
      [P("x"), P("y"), P("y"), None])
  unpack = lambda packed, scales, g, pw=pw: weightonly.unpack(
      weightonly.PackedWeight(packed, scales, g, format=pw.format, n=pw.n, k=pw.k))
  run(unpack, (pw.packed, pw.scales, pw.global_scale), [P("y"), P("y"), None])

# MXFP8 x MXFP8 (mx_gemm): rows split in whole 128-row atoms of the swizzled scales
aq = jax_gmma.quantize(normal(256, 256), "mxfp8", layout="sm100_128x4")
bq = jax_gmma.quantize(normal(512, 256), "mxfp8", layout="sm100_128x4")
ta, tb = jax.tree.structure(aq), jax.tree.structure(bq)
mx = lambda ad, asc, bd, bsc: jax_gmma.mx_gemm(jax.tree.unflatten(ta, [ad, asc]), jax.tree.unflatten(tb, [bd, bsc]))
run(mx, (*jax.tree.leaves(aq), *jax.tree.leaves(bq)), [P("x"), P("x"), P("y"), P("y")])

# explicit mesh axes (sharding in types)
emesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=devs[:4])
run(gemm, args, [P("x"), P("y"), P("x"), P("y"), P("y")], mesh=emesh)
print("ok")
'''


def run_script(script: str, env_extra=None, timeout=600) -> subprocess.CompletedProcess:
  """script in a fresh interpreter (-P), with tests/ on its path for _sharding_check."""
  env = dict(os.environ, **(env_extra or {}))
  env["PYTHONPATH"] = os.pathsep.join(filter(None, (os.path.dirname(os.path.abspath(__file__)),
                                                   env.get("PYTHONPATH"))))
  return subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True,
                        timeout=timeout)


def test_partitioned_under_jit_on_four_cpu_devices():
  """Sharded jit programs of every partitioned primitive on a 2 x 2 mesh of virtual CPU devices
  give the single-device results (bit-identical unless the contraction is split), with no
  collective except the psum of a split contraction, and a warning where a split is refused."""
  r = run_script(_SCRIPT, {"JAX_PLATFORMS": "cpu"})
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-2000:], r.stderr[-4000:])
