"""jax.vmap and differentiation of the GEMMs: vmap rules of the primitives (fold into M, or one
GEMM per batch element), jax.grad through `dot` (activation gradient, weight constant) and
`fp8_linear` (FP8 GEMMs forward and backward), and the error for the raw primitives.

These run on JAX's default backend: the pure-JAX reference on CPU (CI), the kernels on a
Hopper GPU with jax-gmma built (the GPU machine runs this file too). Oracles are float64
products of the dequantized operands; fresh random inputs per case.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from jax_gmma.ops import weightonly as wo

E4, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2
F64 = np.float64
_seed = [0]


def _key():
  _seed[0] += 1
  return jax.random.PRNGKey(5000 + _seed[0])


def _normal(shape, scale=1.0, dtype=jnp.float32):
  return (jax.random.normal(_key(), shape, jnp.float32) * scale).astype(dtype)


def rel(a, b):
  a = np.asarray(jnp.asarray(a, jnp.float32), F64)
  b = np.asarray(jnp.asarray(b, jnp.float32), F64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def _np(x):
  return np.asarray(jnp.asarray(x, jnp.float32), F64)


# -- vmap ------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_axis", [0, 1])
@pytest.mark.parametrize("a_scale", ["row", "tensor", "none"])
def test_vmap_fp8_gemm_rows(in_axis, a_scale):
  """Only the activation side batched: one GEMM over the folded rows, equal to a loop."""
  bsz, m, n, k = 3, 5, 32, 64
  a = _normal((bsz, m, k), 2.0).astype(E4)
  b = _normal((n, k), 2.0).astype(E4)
  sb = jnp.abs(_normal((n,))) + 0.5
  sa = {"row": jnp.abs(_normal((bsz, m))) + 0.5, "tensor": jnp.abs(_normal((bsz,))) + 0.5,
        "none": None}[a_scale]
  f = lambda a, sa: jax_gmma.fp8_gemm(a, b, sa, sb, out_dtype=jnp.float32)  # noqa: E731
  ax = jnp.moveaxis(a, 0, in_axis)
  if sa is None:
    got = jax.jit(jax.vmap(lambda a: f(a, None), in_axes=in_axis))(ax)
    want = [f(a[i], None) for i in range(bsz)]
  else:
    got = jax.jit(jax.vmap(f, in_axes=(in_axis, 0)))(ax, sa)
    want = [f(a[i], sa[i]) for i in range(bsz)]
  assert got.shape == (bsz, m, n)
  assert rel(got, jnp.stack(want)) < 1e-6


def test_vmap_fp8_gemm_weights_batched():
  """A different weight per batch element: lax.map over the batch (one GEMM each)."""
  bsz, m, n, k = 3, 4, 16, 32
  a = _normal((m, k), 2.0).astype(E4)
  b = _normal((bsz, n, k), 2.0).astype(E4)
  bias = _normal((bsz, n))
  f = lambda b, bias: jax_gmma.fp8_gemm(a, b, 0.5, 2.0, bias=bias, out_dtype=jnp.float32)  # noqa: E731
  got = jax.jit(jax.vmap(f))(b, bias)
  want = jnp.stack([f(b[i], bias[i]) for i in range(bsz)])
  assert rel(got, want) < 1e-6
  ref = np.einsum("mk,bnk->bmn", _np(a), _np(b)) + _np(bias)[:, None, :]
  assert rel(got, ref) < 1e-3


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_tensor", "fp8_128x128", "fp8_1x128", "mxfp8"])
def test_vmap_dot(fmt):
  bsz, m, n, k = 2, 3, 128, 256
  kw = {"layout": "sm100_128x4"} if fmt == "mxfp8" else {}
  wq = jax_gmma.quantize(_normal((n, k), 0.1), fmt, **kw)
  x = _normal((bsz, m, k))
  got = jax.jit(jax.vmap(lambda x: jax_gmma.dot(x, wq, out_dtype=jnp.float32)))(x)
  want = jnp.stack([jax_gmma.dot(x[i], wq, out_dtype=jnp.float32) for i in range(bsz)])
  assert got.shape == (bsz, m, n)
  assert rel(got, want) < 1e-6


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp6_e3m2"])
def test_vmap_weightonly(fmt):
  """Tokens batched (folded, CTA re-picked) and weights batched (stacked PackedWeights)."""
  bsz, m, n, k = 3, 2, 64, 128
  wp = wo.prepare(_normal((n, k), 0.1), fmt)
  x = _normal((bsz, m, k), 1.0, jnp.bfloat16)
  got = jax.jit(jax.vmap(lambda x: jax_gmma.weightonly_gemm(x, wp, out_dtype=jnp.float32)))(x)
  want = jnp.stack([jax_gmma.weightonly_gemm(x[i], wp, out_dtype=jnp.float32) for i in range(bsz)])
  assert rel(got, want) < 1e-6
  wps = [wo.prepare(_normal((n, k), 0.1), fmt) for _ in range(bsz)]
  stacked = jax.tree.map(lambda *l: jnp.stack(l), *wps)
  got = jax.jit(jax.vmap(lambda w: jax_gmma.weightonly_gemm(x[0], w, out_dtype=jnp.float32)))(stacked)
  want = jnp.stack([jax_gmma.weightonly_gemm(x[0], w, out_dtype=jnp.float32) for w in wps])
  assert rel(got, want) < 1e-6


def test_vmap_weightonly_repicks_cta():
  """Folding 4 x 8 tokens into 32 changes the kernel's CTA pick unless it was forced."""
  n, k = 64, 128
  wp = wo.prepare(_normal((n, k), 0.1), "mxfp4")
  x = _normal((4, 8, k), 1.0, jnp.bfloat16)
  jaxpr = jax.make_jaxpr(jax.vmap(lambda x: jax_gmma.weightonly_gemm(x, wp)))(x)
  eqn = [e for e in jaxpr.jaxpr.eqns if e.primitive is wo.weightonly_gemm_p][0]
  assert (eqn.params["rows"], eqn.params["tokens"], eqn.params["k_warps"]) == wo.pick_cta(32, n, wp.padded_k, "mxfp4")
  forced = jax.make_jaxpr(jax.vmap(lambda x: jax_gmma.weightonly_gemm(x, wp, rows=16, tokens=8, k_warps=4)))(x)
  eqn = [e for e in forced.jaxpr.eqns if e.primitive is wo.weightonly_gemm_p][0]
  assert (eqn.params["rows"], eqn.params["tokens"], eqn.params["k_warps"]) == (16, 8, 4)


def test_vmap_blockwise_scales_batched():
  bsz, m, n, k = 2, 6, 128, 256
  xq = jax_gmma.quantize(_normal((bsz, m, k)), "fp8_1x128")
  wq = jax_gmma.quantize(_normal((n, k), 0.1), "fp8_128x128")
  f = lambda a, sa: jax_gmma.blockwise_gemm(a, wq.data, sa, wq.scales, out_dtype=jnp.float32)  # noqa: E731
  got = jax.jit(jax.vmap(f))(xq.data, xq.scales)
  want = jnp.stack([f(xq.data[i], xq.scales[i]) for i in range(bsz)])
  assert rel(got, want) < 1e-6


# -- gradients through dot -------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_tensor", "fp8_128x128", "mxfp8",
                                 "wo:nvfp4", "wo:mxfp4", "wo:mxfp6_e2m3"])
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_dot_grad_x(fmt, x_dtype):
  """dx = g @ dequantize(w) (quantization of x passed straight through), dbias = sum g, a zero
  cotangent for the weight; under jit, with leading batch dims."""
  n, k = 128, 256
  w = _normal((n, k), 0.1)
  if fmt.startswith("wo:"):
    wq = wo.prepare(w, fmt[3:])
    wd = _np(wq.dequantize())
  else:
    wq = jax_gmma.quantize(w, fmt, **({"layout": "sm100_128x4"} if fmt == "mxfp8" else {}))
    wd = _np(jax_gmma.dequantize(wq))
  x = _normal((2, 3, k), 1.0, x_dtype)
  bias = _normal((n,))
  f = jax.jit(lambda x, b, w: jax_gmma.dot(x, w, bias=b))
  y, vjp = jax.vjp(f, x, bias, wq)
  g = _normal(y.shape, 1.0, y.dtype)
  dx, db, dw = vjp(g)
  assert dx.dtype == x.dtype and dx.shape == x.shape
  gd = _np(g).reshape(-1, n)
  assert rel(dx.reshape(-1, k), gd @ wd) < 5e-3
  assert rel(db, gd.sum(0)) < 1e-5
  for leaf in jax.tree.leaves(dw):  # JAX's zeros (e8m0 has no zero: skipped)
    if leaf.dtype not in (jax.dtypes.float0, jnp.float8_e8m0fnu):
      assert not np.any(np.asarray(leaf, np.float32))


def test_dot_grad_value_and_grad_loss():
  """jax.grad of a scalar loss through dot, compared with the same loss on the dequantized
  weight in float32 autodiff."""
  n, k = 64, 128
  wq = jax_gmma.quantize(_normal((n, k), 0.1), "fp8_channel")
  wd = jax_gmma.dequantize(wq)
  x = _normal((4, k))
  t = _normal((4, n))
  loss = lambda x: jnp.sum((jax_gmma.dot(x, wq, out_dtype=jnp.float32) - t) ** 2)  # noqa: E731
  loss_ref = lambda x: jnp.sum((x @ wd.T - t) ** 2)  # noqa: E731
  assert rel(jax.jit(jax.grad(loss))(x), jax.grad(loss_ref)(x)) < 5e-2


def test_raw_primitives_not_differentiable():
  a = _normal((4, 32)).astype(E4)
  b = _normal((16, 32)).astype(E4)
  with pytest.raises(jax_gmma.NotDifferentiable, match="fp8_linear"):
    jax.grad(lambda s: jax_gmma.fp8_gemm(a, b, s, out_dtype=jnp.float32).sum())(1.0)
  wp = wo.prepare(_normal((16, 64), 0.1), "mxfp4")
  with pytest.raises(jax_gmma.NotDifferentiable, match="weightonly_gemm"):
    jax.grad(lambda x: jax_gmma.weightonly_gemm(x, wp, out_dtype=jnp.float32).sum())(
        _normal((2, 64), 1.0, jnp.bfloat16))


# -- fp8_linear --------------------------------------------------------------------------------

def _fp8(v, dtype):
  """Per-tensor current scaling as fp8_linear does it: (dequantized float64, fp8 data, scale)."""
  q = jax_gmma.quantize(v, "fp8_tensor", dtype=dtype)
  return _np(jax_gmma.dequantize(q))


@pytest.mark.parametrize("m", [7, 64])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_fp8_linear_matches_emulation(m, dtype):
  """Forward and both gradients equal float64 products of the FP8-quantized operands (e4m3 x,
  w; e5m2 g), to the output dtype's rounding; M = 7 exercises the wgrad padding."""
  n, k = 48, 96
  x = _normal((m, k), 1.0, dtype)
  w = _normal((n, k), 0.1, dtype)
  bias = _normal((n,), 1.0, dtype)
  y, vjp = jax.vjp(jax.jit(jax_gmma.fp8_linear), x, w, bias)
  g = _normal(y.shape, 1.0, y.dtype)
  dx, dw, db = vjp(g)
  assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (dtype,) * 4
  xd, wd, gd = _fp8(x, E4), _fp8(w, E4), _fp8(g, E5)
  tol = 1e-2 if dtype == jnp.bfloat16 else 1e-3
  assert rel(y, xd @ wd.T + _np(bias)) < tol
  assert rel(dx, gd @ wd) < tol
  assert rel(dw, gd.T @ xd) < tol
  assert rel(db, _np(g).sum(0)) < (1e-5 if dtype == jnp.float32 else 1e-2)
  # and close to the float64 truth within FP8's precision (e5m2 gradients: ~2^-3 per element)
  assert rel(y, _np(x) @ _np(w).T + _np(bias)) < 5e-2
  assert rel(dx, _np(g) @ _np(w)) < 0.1
  assert rel(dw, _np(g).T @ _np(x)) < 0.1


@pytest.mark.parametrize("m", [5, 200])
def test_fp8_linear_blockwise_matches_emulation(m):
  """recipe='blockwise': forward 1x128 x 128x128, dgrad 1x128 x transposed 128x128 grid,
  wgrad 1x128 x 1x128 along the tokens (M = 5 and 200: padded token blocks), all e4m3; equal to
  float64 products of the quantized operands."""
  n, k = 256, 384
  x = _normal((m, k), 1.0, jnp.bfloat16)
  w = _normal((n, k), 0.1, jnp.float32)
  bias = _normal((n,))
  y, vjp = jax.vjp(jax.jit(lambda x, w, b: jax_gmma.fp8_linear(x, w, b, recipe="blockwise")),
                   x, w, bias)
  g = _normal(y.shape, 1.0, y.dtype)
  dx, dw, db = vjp(g)
  assert (y.dtype, dx.dtype, dw.dtype, db.dtype) == (x.dtype, x.dtype, w.dtype, bias.dtype)
  deq = lambda v, fmt, **kw: _np(jax_gmma.dequantize(jax_gmma.quantize(v, fmt, **kw)))  # noqa: E731
  xd, wd, gd = deq(x, "fp8_1x128"), deq(w, "fp8_128x128"), deq(g, "fp8_1x128")
  xtd, gtd = deq(x, "fp8_1x128", axis=0), deq(g, "fp8_1x128", axis=0)
  assert rel(y, xd @ wd.T + _np(bias)) < 1e-2
  assert rel(dx, gd @ wd) < 1e-2
  assert rel(dw, gtd.T @ xtd) < 1e-3  # FP8 tensor cores: each 128-K chunk summed in < float32
  assert rel(db, _np(g).sum(0)) < 1e-5
  # e4m3 gradients with 1x128 scales: closer to the truth than the tensor recipe's e5m2
  assert rel(dx, _np(g) @ _np(w)) < 0.05
  assert rel(dw, _np(g).T @ _np(x)) < 0.05


@pytest.mark.parametrize("recipe", ["tensor", "blockwise"])
def test_fp8_linear_zeros(recipe):
  """All-zero activations, weights or gradients give zeros, not NaN (amax 0: a finite scale)."""
  x = _normal((8, 128))
  w = _normal((128, 128), 0.1)
  f = lambda x, w: jax_gmma.fp8_linear(x, w, recipe=recipe)  # noqa: E731
  y, vjp = jax.vjp(f, x, w)
  dx, dw = vjp(jnp.zeros_like(y))
  assert not np.any(_np(dx)) and not np.any(_np(dw))
  y, vjp = jax.vjp(f, jnp.zeros_like(x), w)
  dx, dw = vjp(jnp.ones_like(y))
  assert not np.any(_np(y)) and not np.any(_np(dw)) and np.all(np.isfinite(_np(dx)))


def test_fp8_linear_training_step():
  """A few SGD steps of a least-squares fit with FP8 GEMMs reduce the loss like float32 does;
  leading batch dims, no bias, grad of a scalar loss."""
  k, n = 64, 32
  w_true = _normal((n, k), 0.2)
  x = _normal((4, 16, k))
  t = x @ w_true.T
  def loss(w, lin):
    return jnp.mean((lin(x, w).astype(jnp.float32) - t) ** 2)
  step = jax.jit(lambda w: w - 0.5 * jax.grad(loss)(w, jax_gmma.fp8_linear))
  w = jnp.zeros((n, k))
  l0 = loss(w, jax_gmma.fp8_linear)
  for _ in range(20):
    w = step(w)
  l1 = loss(w, lambda x, w: x @ w.T)
  assert l1 < 0.2 * l0


def test_fp8_linear_scan_remat():
  """Layers stacked for lax.scan under jax.checkpoint (how deep models are trained): the same
  gradients as the unrolled loop."""
  layers, n = 3, 128
  ws = _normal((layers, n, n), 1 / 16)
  x = _normal((8, n))

  def layer(h, w):
    return jnp.tanh(jax_gmma.fp8_linear(h, w).astype(jnp.float32)), None

  def loss_scan(ws):
    h, _ = jax.lax.scan(jax.checkpoint(layer), x, ws)
    return (h ** 2).sum()

  def loss_loop(ws):
    h = x
    for i in range(layers):
      h, _ = layer(h, ws[i])
    return (h ** 2).sum()

  assert rel(jax.jit(jax.grad(loss_scan))(ws), jax.jit(jax.grad(loss_loop))(ws)) < 1e-6


def test_fp8_linear_vmap_per_example_grads():
  k, n, bsz = 32, 16, 3
  w = _normal((n, k), 0.1)
  xs = _normal((bsz, 5, k))
  per = jax.jit(jax.vmap(jax.grad(lambda w, x: jax_gmma.fp8_linear(x, w).sum()), in_axes=(None, 0)))(w, xs)
  want = jnp.stack([jax.grad(lambda w: jax_gmma.fp8_linear(xs[i], w).sum())(w) for i in range(bsz)])
  assert per.shape == (bsz, n, k)
  assert rel(per, want) < 1e-6


@pytest.mark.parametrize("args, err, match", [
    (((4, 30), (16, 30)), ValueError, "K = 30 must be a multiple of 16"),
    (((4, 32), (20, 32)), ValueError, "N = 20 must be a multiple of 16"),
    (((4, 32), (16, 64)), ValueError, "x must be"),
    (((4, 32), (16, 32, 1)), ValueError, "2-D"),
])
def test_fp8_linear_errors(args, err, match):
  xs, ws = args
  with pytest.raises(err, match=match):
    jax_gmma.fp8_linear(jnp.ones(xs), jnp.ones(ws))


def test_fp8_linear_recipe_errors():
  with pytest.raises(ValueError, match="recipe must be one of"):
    jax_gmma.fp8_linear(jnp.ones((4, 128)), jnp.ones((128, 128)), recipe="mx")
  with pytest.raises(ValueError, match="multiples of 128.*K = 64"):
    jax_gmma.fp8_linear(jnp.ones((4, 64)), jnp.ones((128, 64)), recipe="blockwise")
  with pytest.raises(ValueError, match="recipe='tensor' only"):
    jax_gmma.fp8_linear(jnp.ones((4, 128)), jnp.ones((128, 128)), recipe="blockwise",
                        fast_accum_fwd=True)


def test_fp8_linear_dtype_errors():
  with pytest.raises(TypeError, match="x must be bfloat16, float16 or float32"):
    jax_gmma.fp8_linear(jnp.ones((4, 32), E4), jnp.ones((16, 32)))
  with pytest.raises(TypeError, match="out_dtype"):
    jax_gmma.fp8_linear(jnp.ones((4, 32)), jnp.ones((16, 32)), out_dtype=jnp.int8)
  with pytest.raises(ValueError, match="bias"):
    jax_gmma.fp8_linear(jnp.ones((4, 32)), jnp.ones((16, 32)), jnp.ones((8,)))


_SHARD_MAP_SCRIPT = r'''
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np, jax_gmma
from jax.sharding import Mesh, PartitionSpec as P
from jax import shard_map
mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
x = jax.random.normal(jax.random.PRNGKey(0), (16, 128))
w = jax.random.normal(jax.random.PRNGKey(1), (128, 128)) / 16
b = jax.random.normal(jax.random.PRNGKey(2), (128,))
close = lambda a, e: float(jnp.abs(a - e).max()) <= 1e-5 * float(jnp.abs(e).max())
for recipe in ("tensor", "blockwise"):
  loss = lambda w, b, x: (jax_gmma.fp8_linear(x, w, b, recipe=recipe).astype(jnp.float32) ** 2).sum()
  halves = [jax.grad(loss, (0, 1))(w, b, x[i * 8:(i + 1) * 8]) for i in range(2)]
  want = [halves[0][j] + halves[1][j] for j in range(2)]
  # check_vma=True (default): the gradients of the replicated w and b come out summed, as JAX's
  # own ops give them
  got = jax.jit(shard_map(lambda w, b, x: jax.grad(loss, (0, 1))(w, b, x), mesh=mesh,
                          in_specs=(P(), P(), P("data")), out_specs=(P(), P())))(w, b, x)
  assert all(close(g, e) for g, e in zip(got, want)), ("check_vma=True", recipe)
  # check_vma=False: per-shard gradients, summed by the caller
  dp = lambda w, b, x: jax.lax.psum(jax.grad(loss, (0, 1))(w, b, x), "data")
  got = jax.jit(shard_map(dp, mesh=mesh, in_specs=(P(), P(), P("data")), out_specs=(P(), P()),
                          check_vma=False))(w, b, x)
  assert all(close(g, e) for g, e in zip(got, want)), ("check_vma=False", recipe)
  # dx of the sharded activations stays sharded
  dx = jax.jit(shard_map(lambda w, b, x: jax.grad(loss, 2)(w, b, x), mesh=mesh,
                         in_specs=(P(), P(), P("data")), out_specs=P("data")))(w, b, x)
  # (each shard quantizes its own x and g: compared with the halves run alone)
  want_dx = jnp.concatenate([jax.grad(loss, 2)(w, b, x[i * 8:(i + 1) * 8]) for i in range(2)])
  assert close(dx, want_dx), ("dx", recipe)
wq = jax_gmma.quantize(w, "fp8_channel")
loss_q = lambda x: (jax_gmma.dot(x, wq, out_dtype=jnp.float32) ** 2).sum()
dx = jax.jit(shard_map(jax.grad(loss_q), mesh=mesh, in_specs=P("data"), out_specs=P("data")))(x)
assert close(dx, jnp.concatenate([jax.grad(loss_q)(x[:8]), jax.grad(loss_q)(x[8:])])), "dot dx"
f = lambda x: jax.lax.psum(jax_gmma.dot(x, wq, out_dtype=jnp.float32).sum(), "data")
got = jax.jit(shard_map(f, mesh=mesh, in_specs=P("data"), out_specs=P()))(x)
assert abs(float(got) - float(jax_gmma.dot(x, wq, out_dtype=jnp.float32).sum())) < 1e-3
print("ok")
'''


def test_shard_map_data_parallel():
  """Data parallelism with shard_map on two (virtual CPU) devices, both fp8_linear recipes and
  dot: with check_vma=True the primitives' outputs vary over the axes their inputs vary over,
  and the replicated weight's and bias's gradients come out summed over the shards (as JAX's
  own ops give them); with check_vma=False the caller's psum gives the same sums."""
  import os  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-P", "-c", _SHARD_MAP_SCRIPT], env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
