"""jax_gmma.ragged_dot under jax.jit with sharded operands (jax_gmma.sharding).

The rule (which dimensions stay sharded, and why not) is pure and tested here on the primitive's
operands as ``ragged_dot`` binds them; the end-to-end checks run in a subprocess on a 2 x 2 mesh
of four virtual CPU devices, where the primitive lowers to its pure-JAX reference inside XLA's
partition callback: each sharded program gives the single-device result (bit-identical, or to
float32 rounding when the contraction is split), with exactly the collectives the split needs.
"""
import jax
import numpy as np
import pytest

import jax_gmma
from jax_gmma import sharding
from jax_gmma.ops import grouped
from test_sharding import run_script  # noqa: E402 (tests/ helper)

G, N, K, M = 4, 256, 256, 32


def _bound(fmt, x_format=None, bias=True, layout="rowmajor", m=M, n=N, k=K, x=None, packed=True):
  """(avals, params) of the ragged_dot primitive as ``jax_gmma.ragged_dot`` binds it (FP4 / FP6
  experts as a PackedWeight unless not packed: then a QuantizedArray)."""
  w = np.ones((G, n, k), np.float32)
  if fmt in grouped.weightonly.WEIGHT_FORMATS and packed:
    wq = jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  elif fmt == "fp8_tensor":
    wq = jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)
  else:
    wq = jax_gmma.quantize(w, fmt, layout=layout)
  x = np.ones((m, k), np.float32) if x is None else x
  b = np.ones((G, n), np.float32) if bias else None
  jaxpr = jax.make_jaxpr(lambda x, s: jax_gmma.ragged_dot(x, wq, s, bias=b, x_format=x_format))(
      x, np.zeros(G, np.int32))
  eqn, = _eqns(jaxpr.jaxpr)
  return [v.aval for v in eqn.invars], dict(eqn.params)


def _eqns(jaxpr):
  """The ragged_dot equations of a jaxpr, its sub-jaxprs (custom_vjp) included."""
  out = []
  for e in jaxpr.eqns:
    if e.primitive is grouped.ragged_dot_p:
      out.append(e)
    for v in e.params.values():
      sub = getattr(v, "jaxpr", v)
      if hasattr(sub, "eqns"):
        out += _eqns(sub)
  return out


def _rule(*args, **kw):
  avals, params = _bound(*args, **kw)
  return sharding.RULES["jax_gmma_ragged_dot"](avals, params), avals, params


def _plan(rule, mesh, **dims):
  """plan() with the operands sharded by factor: dims = {factor: mesh axis}."""
  specs = [tuple(dims.get(rule.leader(f)) for f in labels) for labels in rule.operands]
  return sharding.plan(rule, mesh, specs)


@pytest.mark.parametrize("fmt,block", (("nvfp4", 16), ("mxfp4", 32)))
def test_partition_rule_of_fp4_quantized_experts(fmt, block):
  """The rows, the features and the contraction of FP4 QuantizedArray experts (the Blackwell
  grouped kernels' operands) split as the mxfp8 ones do: the scales' K blocks (NVFP4: per 16)
  with K, the one global scale of a (G, N, K) quantization replicated."""
  rule, _, params = _rule(fmt, packed=False)
  assert rule.compound == {"k": ("kb", "kr", block)}
  nx = params["x_tree"].num_leaves
  w_ops = rule.operands[nx:nx + params["w_tree"].num_leaves]
  assert w_ops[0] == ("g", "n", "k") and w_ops[1] == ("g", "n", "kb")
  if fmt == "nvfp4":
    assert w_ops[2] == () and rule.operands[nx - 1] == ()  # the global scales
  assert _plan(rule, {"x": 2, "y": 2}, m="x", n="y") == ({"m": ("x",), "n": ("y",)}, [])
  assert _plan(rule, {"x": 2}, k="x") == ({"k": ("x",)}, [])


def test_rule_splits_tokens_features_and_contraction():
  rule, avals, _ = _rule("fp8_channel")
  # x data, x scales, w data, w scales, group_sizes, bias, row_ids
  assert rule.operands[0] == ("m", "k") and rule.operands[2] == ("g", "n", "k")
  assert rule.operands[-3:] == (("g",), ("g", "n"), ("m",))
  assert rule.reduction == ("k",)
  chosen, dropped = _plan(rule, {"x": 2, "y": 2}, m="x", n="y")
  assert chosen == {"m": ("x",), "n": ("y",)} and dropped == []
  chosen, dropped = _plan(rule, {"x": 2}, k="x")
  assert chosen == {"k": ("x",)} and dropped == []
  text, factors = rule.sdy_rule()
  assert text.endswith("-> m n"), text
  assert factors["reduction_factors"] == ("k",) and "g" in factors["need_replication_factors"]


def test_rule_never_splits_the_experts():
  rule, _, _ = _rule("mxfp8")
  chosen, dropped = _plan(rule, {"x": 2, "y": 2}, g="x", n="y")
  assert chosen == {"n": ("y",)}
  assert [(f, why) for f, _, why in dropped] == [("g", "this op does not split that dimension")]


def test_rule_block_scales_split_with_their_rows_and_k_blocks():
  rule, _, _ = _rule("fp8_128x128")
  assert rule.compound == {"k": ("kb", "kr", 128), "n": ("nb", "nr", 128)}
  assert rule.operands[3] == ("g", "nb", "kb")  # w's (G, N / 128, K / 128) scales
  assert _plan(rule, {"x": 2, "y": 2}, n="x", k="y")[0] == {"n": ("x",), "k": ("y",)}
  # 4 shards of 64 rows would cut the 128-row scale blocks; 4 shards of 64 K likewise
  chosen, dropped = _plan(rule, {"z": 4}, n="z")
  assert chosen == {} and "each shard's N (64) would not be a multiple of 128" in dropped[0][2]
  chosen, dropped = _plan(rule, {"z": 4}, k="z")
  assert chosen == {} and "each shard's K (64) would not be a multiple of 128" in dropped[0][2]
  rule, _, _ = _rule("mxfp8")
  assert rule.compound == {"k": ("kb", "kr", 32)} and rule.operands[3] == ("g", "n", "kb")


def test_rule_packed_weights_split_strips_not_k():
  rule, _, _ = _rule("nvfp4")
  assert rule.shardable == ("m", "n") and rule.reduction == ()
  chosen, dropped = _plan(rule, {"x": 2, "y": 2}, m="x", n="y")
  assert chosen == {"m": ("x",), "n": ("y",)} and dropped == []
  specs = [(None, "y")] + [(None,) * len(l) for l in rule.operands[1:]]
  chosen, dropped = sharding.plan(rule, {"y": 2}, specs)
  assert chosen == {} and [(f, why) for f, _, why in dropped] == [("kx", "this op does not split that dimension")]


def test_rule_refuses_what_a_shard_cannot_take():
  rule, _, _ = _rule("fp8_channel", m=6)
  chosen, dropped = _plan(rule, {"z": 4}, m="z")
  assert chosen == {} and "M = 6 is not a multiple of the 4 shards" in dropped[0][2]
  rule, _, _ = _rule("mxfp8", layout="sm100_128x4")
  chosen, dropped = _plan(rule, {"y": 2}, n="y")
  assert chosen == {} and "w's scales are in the sm100_128x4 layout" in dropped[0][2]
  rule, _, _ = _rule("fp8_1x128", k=320)  # K not a whole number of 128-blocks: padded
  chosen, dropped = _plan(rule, {"y": 2}, k="y")
  assert chosen == {} and "K = 320 is padded to whole 128-blocks (384)" in dropped[0][2]
  rule, _, _ = _rule("fp8_channel", k=48)
  chosen, dropped = _plan(rule, {"y": 2}, k="y")
  assert chosen == {} and "each shard's K (24) would not be a multiple of 16" in dropped[0][2]


def test_local_params_describe_the_shard():
  rule, avals, params = _rule("fp8_1x128")
  local = [list(a.shape) for a in avals]
  local[0][0] //= 2; local[1][0] //= 2; local[-1][0] //= 2           # M split: x, its scales, row_ids
  local[2][1] //= 2; local[3][1] //= 2; local[-2][1] //= 2           # N split: w, its scales, bias
  p = rule.local_params(params, [tuple(s) for s in local])
  assert p["n"] == N // 2
  assert jax.tree.unflatten(p["x_tree"], [0, 0]).canonical_shape == (M // 2, K)
  assert jax.tree.unflatten(p["w_tree"], [0, 0]).canonical_shape == (G, N // 2, K)
  rule, avals, params = _rule("nvfp4")
  local = [list(a.shape) for a in avals]
  local[1][1] //= 2; local[2][1] //= 2
  p = rule.local_params(params, [tuple(s) for s in local])
  assert p["n"] == N // 2 and jax.tree.unflatten(p["w_tree"], [0, 0, 0]).n == N // 2


_SCRIPT = r'''
import os, warnings
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
import jax_gmma
from jax_gmma.sharding import ShardingWarning
from _sharding_check import check_sharded

devs = jax.devices()
assert len(devs) == 4, devs
mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=devs)
mesh_z = jax.make_mesh((4,), ("z",), axis_types=(AxisType.Auto,), devices=devs)
rng = np.random.default_rng(0)
F32, BF16 = jnp.float32, jnp.bfloat16
G, N, K, M = 4, 256, 256, 32
SIZES = jnp.asarray([7, 0, 13, 9], jnp.int32)  # an empty expert, 3 rows of no expert, groups across shards


def normal(*shape):
  return jnp.asarray(rng.standard_normal(shape), F32)


def run(fn, args, specs, want_collectives=(), warn=None, exact=True, mesh=mesh):
  # inexact only for the contraction split: float32 partial sums added in another order
  return check_sharded(fn, args, specs, mesh, want_collectives, warn, exact, 1e-5)


def stacked(fmt, w):
  if fmt == "fp8_tensor":
    return jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)
  if fmt in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2"):
    return jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  return jax_gmma.quantize(w, fmt)


w = normal(G, N, K) / 16
x = normal(M, K)
bias = normal(G, N)


def op(wq, **kw):
  """(x, group_sizes, bias, *w's leaves) -> ragged_dot, w rebuilt from its sharded leaves."""
  tree = jax.tree.structure(wq)
  return lambda x, s, b, *leaves: jax_gmma.ragged_dot(x, jax.tree.unflatten(tree, leaves), s, bias=b, **kw)


# N (tensor parallel inside the experts): w, its scales and bias split by output features;
# tokens split by rows (each shard applies the group boundaries to its rows' global indices)
for fmt, w_specs in (("fp8_channel", [P(None, "y"), P(None, "y")]),
                     ("fp8_128x128", [P(None, "y"), P(None, "y")]),
                     ("mxfp8", [P(None, "y"), P(None, "y")]),
                     ("fp8_tensor", [P(None, "y"), None]),
                     ("nvfp4", [P(None, "y"), P(None, "y"), None])):
  wq = stacked(fmt, w)
  args = (x, SIZES, bias, *jax.tree.leaves(wq))
  run(op(wq), args, [None, None, P(None, "y")] + w_specs)                 # N
  run(op(wq), args, [P("x"), None, None] + [None] * len(w_specs))          # M
  run(op(wq), args, [P("x"), None, P(None, "y")] + w_specs)               # M x N
  print(fmt, "m n ok", flush=True)

# a per-tensor scale of x over split tokens: its amax is reduced across the shards (all-reduce),
# the product stays split; explicit mesh axes (sharding in types) partition alike
wq = stacked("fp8_tensor", w)
args = (x, SIZES, bias, *jax.tree.leaves(wq))
run(op(wq, x_format="fp8_tensor"), args, [P("x"), None, P(None, "y"), P(None, "y"), None], ("all-reduce",))
emesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=devs)
run(op(wq), args, [P("x"), None, P(None, "y"), P(None, "y"), None], mesh=emesh)
print("fp8_tensor x, explicit mesh ok", flush=True)

# K: x and w split along the contraction: float32 partial products, one all-reduce, bias once
for fmt, xf in (("fp8_channel", "fp8_channel"), ("fp8_128x128", "fp8_1x128"), ("mxfp8", "mxfp8")):
  wq, xq = stacked(fmt, w), jax_gmma.quantize(x, xf)
  xt, wt = jax.tree.structure(xq), jax.tree.structure(wq)
  f = lambda xd, xs, s, b, wd, ws: jax_gmma.ragged_dot(
      jax.tree.unflatten(xt, [xd, xs]), jax.tree.unflatten(wt, [wd, ws]), s, bias=b, out_dtype=F32)
  per_k = P(None, "x") if xf != "fp8_channel" else None  # 1x128 / 1x32 scales split with K
  args = (xq.data, xq.scales, SIZES, bias, wq.data, wq.scales)
  run(f, args, [P(None, "x"), per_k, None, None, P(None, None, "x"), P(None, None, "x") if per_k else None],
      ("all-reduce",), exact=False)
  run(f, args, [P("y", "x"), P("y", "x") if per_k else P("y"), None, P(None, None), P(None, None, "x"),
                P(None, None, "x") if per_k else None], ("all-reduce",), exact=False)   # M x K
  print(fmt, "k ok", flush=True)

# the group boundaries of every value (negative sizes, a total above M) under an M split
wq = stacked("fp8_1x128", w)
g = lambda x, s, *leaves: op(wq)(x, s, None, *leaves)
for sizes in ((30, -5, 10, 3), (20, 20, 20, 0), (0, 0, 0, 0), (-3, 40, 0, 0)):
  run(g, (x, jnp.asarray(sizes, jnp.int32), *jax.tree.leaves(wq)), [P("x"), None, None, None])
print("values ok", flush=True)

# the gradient (x and bias) of a token-parallel program
wq = stacked("fp8_channel", w)
loss = lambda x, b, s, *leaves: (op(wq, out_dtype=F32)(x, s, b, *leaves) ** 2).sum()
run(jax.grad(loss, (0, 1)), (x, bias, SIZES, *jax.tree.leaves(wq)), [P("x"), None, None, None, None],
    ("all-reduce",), exact=False)
print("grad ok", flush=True)

# splits the op refuses are gathered, with a warning: the experts (expert parallelism is the
# model's: jax.shard_map), the packed K of FP4 weights, 128-row blocks cut in two
wq = stacked("fp8_channel", w)
run(op(wq), (x, SIZES, bias, *jax.tree.leaves(wq)), [None, None, None, P("x"), P("x")], ("all-gather",),
    warn="this op does not split that dimension")
wq = stacked("nvfp4", w)
run(op(wq), (x.astype(BF16), SIZES, bias, *jax.tree.leaves(wq)), [P(None, "x"), None, None, None, None, None],
    ("all-gather",), warn="this op does not split that dimension")
wq = stacked("fp8_128x128", w)
run(op(wq), (x, SIZES, bias, *jax.tree.leaves(wq)), [None, None, P(None, "z"), P(None, "z"), None],
    ("all-gather",), warn="each shard's N (64) would not be a multiple of 128", mesh=mesh_z)
print("ok")
'''


def test_partitioned_under_jit_on_four_cpu_devices():
  """Sharded jit programs of ragged_dot on a 2 x 2 mesh of virtual CPU devices give the
  single-device results, with no collective for token / feature splits, one all-reduce for a
  split contraction, and a warning (and a gather) where a split is refused."""
  r = run_script(_SCRIPT, {"JAX_PLATFORMS": "cpu"}, timeout=900)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-2000:], r.stderr[-4000:])
