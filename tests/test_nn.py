"""Flax NNX layers (jax_gmma.nn): QuantizedLinear / QuantizedEinsum against a float64 oracle of
the dequantized weight (and loosely against the float layers), NNX state handling (named state
paths, split / merge, eval_shape, jit), quantize_model, dot_general, Fp8Linear training, and
the error messages. CPU (the pure-JAX reference GEMMs); skipped without flax."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("flax")
optax = pytest.importorskip("optax")  # a dependency of flax

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jax_gmma  # noqa: E402
import jax_gmma.nn as gnn  # noqa: E402

#: Activation format jax_gmma.dot pairs with each weight format (MX / NVFP4: the weight's own).
X_FORMAT = {"fp8_tensor": "fp8_channel", "fp8_channel": "fp8_channel",
            "fp8_128x128": "fp8_1x128", "fp8_1x128": "fp8_1x128"}
#: Largest error against the float layer, relative to max |y|: the weight's (and the
#: activation's) rounding.
FLOAT_TOL = {"fp8_tensor": 0.06, "fp8_channel": 0.06, "fp8_128x128": 0.06, "fp8_1x128": 0.06,
             "mxfp8": 0.06, "mxfp6_e2m3": 0.1, "mxfp6_e3m2": 0.1, "mxfp4": 0.25, "nvfp4": 0.25,
             "wo:nvfp4": 0.2, "wo:mxfp4": 0.2, "wo:mxfp6_e2m3": 0.06, "wo:mxfp6_e3m2": 0.08}
#: Largest error against the oracle of the quantized operands, relative to max |y|, by output
#: dtype (the reference GEMM accumulates in float32; a bfloat16 output is rounded once).
ORACLE_TOL = {np.dtype(jnp.float32): 1e-3, np.dtype(jnp.bfloat16): 1e-2}
FORMATS = ("fp8_channel", "fp8_128x128", "mxfp8", "nvfp4", "wo:nvfp4")


def _rng(seed):
  return np.random.default_rng(4000 + seed)


def _normal(seed, shape, dtype=jnp.float32):
  return jnp.asarray(_rng(seed).standard_normal(shape).astype(np.float32), dtype)


def _linear(k, n, seed=0, use_bias=True):
  """An nnx.Linear with a random (not zero) bias."""
  lin = nnx.Linear(k, n, use_bias=use_bias, rngs=nnx.Rngs(seed))
  if use_bias:
    lin.bias.set_value(_normal(seed + 100, (n,)))
  return lin


def _x_dtype(fmt):
  return jnp.bfloat16 if fmt.startswith("wo:") else jnp.float32


def _oracle(x, w, bias=None):
  """float64 x_q @ dequantize(w).T + bias, x_q: x quantized as jax_gmma.dot quantizes it for w
  (bf16 for a PackedWeight)."""
  k = x.shape[-1]
  x2 = jnp.asarray(x, jnp.float32).reshape(-1, k)
  if isinstance(w, jax_gmma.PackedWeight):
    wd = np.asarray(w.dequantize(jnp.float32), np.float64)
    xd = np.asarray(x2.astype(jnp.bfloat16), np.float64)
  else:
    wd = np.asarray(jax_gmma.dequantize(w, jnp.float32), np.float64).reshape(-1, k)
    xq = jax_gmma.quantize(x2, X_FORMAT.get(w.format.name, w.format.name))
    xd = np.asarray(jax_gmma.dequantize(xq, jnp.float32), np.float64)
  y = xd @ wd.T
  if bias is not None:
    y = y + np.asarray(bias, np.float64).reshape(-1)
  return y.reshape(*x.shape[:-1], -1)


def _close(got, want, tol):
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  want = np.asarray(want, np.float64)
  assert got.shape == want.shape
  assert np.all(np.isfinite(got))
  err = np.max(np.abs(got - want)) / np.max(np.abs(want))
  assert err <= tol, f"relative error {err:.3g} > {tol}"


def _paths(tree):
  """'/'-joined key paths of the leaves of a pytree (an nnx.State included)."""
  def name(k):
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        return str(getattr(k, attr))
    return str(k)
  return {"/".join(name(k) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for u, v in zip(la, lb):
    assert u.shape == v.shape and u.dtype == v.dtype
    assert np.array_equal(np.asarray(u).view(np.uint8), np.asarray(v).view(np.uint8))


# -- QuantizedLinear ---------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS + ("fp8_tensor", "wo:mxfp6_e2m3"))
def test_quantized_linear_from_linear(fmt):
  k, n = 256, 64
  lin = _linear(k, n, seed=1)
  layer = gnn.QuantizedLinear.from_linear(lin, fmt)
  assert (layer.in_features, layer.out_features, layer.format) == (k, n, fmt)
  w = layer.kernel.get_value()
  assert isinstance(w, jax_gmma.PackedWeight if fmt.startswith("wo:") else jax_gmma.QuantizedArray)
  x = _normal(2, (2, 3, k), _x_dtype(fmt))
  y = layer(x)
  assert y.shape == (2, 3, n) and y.dtype == x.dtype
  _close(y, _oracle(x, w, layer.bias.get_value()), ORACLE_TOL[np.dtype(y.dtype)])
  _close(y, lin(x.astype(jnp.float32)), FLOAT_TOL[fmt])
  # the weight is the Linear's kernel transposed, quantized along K (prepare() is lossless)
  wd = np.asarray(w.dequantize(jnp.float32))
  want = jax_gmma.quantize(lin.kernel.get_value().T, fmt.removeprefix("wo:"))
  np.testing.assert_allclose(wd, np.asarray(jax_gmma.dequantize(want, jnp.float32)), rtol=1e-6,
                             atol=0)


def test_quantized_linear_constructor_and_options():
  k, n = 128, 32
  wf = _normal(3, (n, k))
  b = _normal(4, (n,))
  q = jax_gmma.quantize(wf, "fp8_channel")
  layer = gnn.QuantizedLinear(q, b, out_dtype=jnp.bfloat16, x_format="fp8_tensor")
  x = _normal(5, (7, k))
  y = layer(x)
  assert y.dtype == jnp.bfloat16 and y.shape == (7, n)
  want = jax_gmma.dot(x, q, bias=b, out_dtype=jnp.bfloat16, x_format="fp8_tensor")
  assert np.array_equal(np.asarray(y, np.float32), np.asarray(want, np.float32))
  # no bias; 1-D x; the same quantized weight from quantize_weight
  layer = gnn.QuantizedLinear(gnn.quantize_weight(wf, "fp8_channel"))
  assert layer.bias is None
  _close(layer(x[0]), _oracle(x[:1], q)[0], 1e-3)


def test_state_paths_name_the_weight_leaves():
  lin = _linear(128, 32)
  st = nnx.state(gnn.QuantizedLinear.from_linear(lin, "nvfp4"))
  assert _paths(st) == {"bias/value", "kernel/value/data", "kernel/value/scales",
                        "kernel/value/global_scale"}
  st = nnx.state(gnn.QuantizedLinear.from_linear(lin, "wo:nvfp4"))
  assert _paths(st) == {"bias/value", "kernel/value/packed", "kernel/value/scales",
                        "kernel/value/global_scale"}
  layer = gnn.QuantizedLinear.from_linear(lin, "fp8_channel")
  # the quantized weight is no nnx.Param (frozen); the bias is
  assert _paths(nnx.state(layer, nnx.Param)) == {"bias/value"}
  assert _paths(nnx.state(layer, gnn.QuantizedParam)) == {"kernel/value/data", "kernel/value/scales"}


@pytest.mark.parametrize("fmt", ("mxfp8", "wo:nvfp4"))
def test_split_merge_eval_shape_jit(fmt):
  k, n = 128, 32
  lin = _linear(k, n, seed=6)
  layer = gnn.QuantizedLinear.from_linear(lin, fmt)
  x = _normal(7, (4, k), _x_dtype(fmt))
  y = layer(x)
  graphdef, state = nnx.split(layer)
  clone = nnx.merge(graphdef, state)
  _leaves_equal(nnx.state(clone), state)
  assert np.array_equal(np.asarray(clone(x), np.float32), np.asarray(y, np.float32))
  # an abstract layer (no quantization runs) has the concrete one's state structure ...
  abstract = nnx.eval_shape(lambda: gnn.QuantizedLinear.from_linear(
      nnx.Linear(k, n, rngs=nnx.Rngs(0)), fmt))
  a_state = nnx.state(abstract)
  assert _paths(a_state) == _paths(state)
  for a, c in zip(jax.tree.leaves(a_state), jax.tree.leaves(state)):
    assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (c.shape, c.dtype)
  # ... and takes the concrete state (a checkpoint restore)
  nnx.update(abstract, state)
  assert np.array_equal(np.asarray(abstract(x), np.float32), np.asarray(y, np.float32))
  y_jit = nnx.jit(lambda m, v: m(v))(layer, x)
  _close(y_jit, np.asarray(y, np.float32), 1e-5)


def test_qlora_base_layer():
  """nnx.LoRA over a QuantizedLinear: the LoRA parameters train, the quantized weight is frozen;
  gradients pass through the quantized GEMM of a second layer."""
  k, n, r = 64, 64, 4

  class Model(nnx.Module):
    def __init__(self):
      self.l1 = nnx.LoRA(k, r, n, base_module=gnn.QuantizedLinear.from_linear(_linear(k, n, 8), "mxfp8"),
                         rngs=nnx.Rngs(1))
      self.l2 = nnx.LoRA(n, r, n, base_module=gnn.QuantizedLinear.from_linear(_linear(n, n, 9), "fp8_channel"),
                         rngs=nnx.Rngs(2))
      self.l1.lora_b.set_value(_normal(10, (r, n)) * 0.1)

    def __call__(self, x):
      return self.l2(jax.nn.relu(self.l1(x)))

  model = Model()
  x = _normal(11, (8, k))
  frozen = nnx.state(model, gnn.QuantizedParam)
  loss = lambda m: jnp.mean(m(x) ** 2)
  grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
  assert _paths(grads) == {f"{l}/lora_{ab}/value" for l in ("l1", "l2") for ab in "ab"}
  g = grads["l1"]["lora_a"].get_value()
  assert np.all(np.isfinite(np.asarray(g))) and float(jnp.max(jnp.abs(g))) > 0
  before = float(loss(model))
  for _ in range(3):
    grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    nnx.update(model, jax.tree.map(lambda p, dp: p - 0.5 * dp, nnx.state(model, nnx.LoRAParam), grads))
  assert float(loss(model)) < before
  _leaves_equal(nnx.state(model, gnn.QuantizedParam), frozen)


# -- QuantizedEinsum ---------------------------------------------------------------------------

EINSUMS = (
  ("btd,dnh->btnh", (128, 4, 16), (4, 16), (2, 3, 128)),
  ("btnh,nhd->btd", (4, 32, 64), (64,), (2, 3, 4, 32)),
  ("...d,hdk->...hk", (2, 128, 16), None, (5, 128)),
)


def _einsum_oracle(eq, x, einsum_layer, w):
  """np.einsum of the quantized x (quantized as one (..., K) row per token, as the layer folds
  it) and the dequantized weight moved back into the kernel's layout."""
  kernel_shape = tuple(einsum_layer.kernel.shape)
  plan = gnn.einsum_plan(eq, kernel_shape)
  nk = len(plan.k_shape)
  lead = x.shape[:x.ndim - nk]
  k = plan.k
  x2 = jnp.asarray(x, jnp.float32).reshape(-1, k)
  if isinstance(w, jax_gmma.PackedWeight):
    xd = np.asarray(x2.astype(jnp.bfloat16), np.float64)
    wd = np.asarray(w.dequantize(jnp.float32), np.float64)
  else:
    xd = np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x2, X_FORMAT.get(w.format.name, w.format.name))),
                    np.float64)
    wd = np.asarray(jax_gmma.dequantize(w), np.float64)
  kernel = np.transpose(wd.reshape(*plan.n_shape, *plan.k_shape), np.argsort(plan.perm))
  assert kernel.shape == kernel_shape
  y = np.einsum(eq, xd.reshape(*lead, *plan.k_shape), kernel)
  if einsum_layer.bias is not None:
    y = y + np.asarray(einsum_layer.bias.get_value(), np.float64).reshape(plan.n_shape)
  return y


@pytest.mark.parametrize("eq,kshape,bshape,xshape", EINSUMS, ids=[e[0] for e in EINSUMS])
@pytest.mark.parametrize("fmt", ("fp8_channel", "nvfp4", "wo:nvfp4"))
def test_quantized_einsum(eq, kshape, bshape, xshape, fmt):
  ein = nnx.Einsum(eq, kshape, bshape, rngs=nnx.Rngs(12))
  if bshape is not None:
    ein.bias.set_value(_normal(13, bshape))
  layer = gnn.QuantizedEinsum.from_einsum(ein, fmt)
  x = _normal(14, xshape, _x_dtype(fmt))
  y = layer(x)
  want = ein(x.astype(jnp.float32))
  assert y.shape == want.shape and y.dtype == x.dtype
  _close(y, _einsum_oracle(eq, x, ein, layer.kernel.get_value()), ORACLE_TOL[np.dtype(y.dtype)])
  _close(y, want, FLOAT_TOL[fmt])
  y_jit = nnx.jit(lambda m, v: m(v))(layer, x)
  _close(y_jit, np.asarray(y, np.float32), 1e-2)


def test_quantized_einsum_constructor():
  eq, kshape = "btnh,nhd->btd", (4, 32, 64)
  kernel = _normal(15, kshape)
  plan = gnn.einsum_plan(eq, kshape)
  assert (plan.n, plan.k, plan.n_shape, plan.k_shape) == (64, 128, (64,), (4, 32))
  w = gnn.quantize_weight(gnn.einsum_weight(kernel, plan), "fp8_channel")
  layer = gnn.QuantizedEinsum(eq, kshape, w)
  x = _normal(16, (2, 5, 4, 32))
  want = jnp.einsum(eq, x, kernel, precision=jax.lax.Precision.HIGHEST)
  _close(layer(x), want, FLOAT_TOL["fp8_channel"])
  with pytest.raises(ValueError, match=r"QuantizedEinsum: einsum 'btnh,nhd->btd' with kernel shape "
                                       r"\(4, 32, 64\) needs an \(N, K\) = \(64, 128\) weight, got \(128, 64\)"):
    gnn.QuantizedEinsum(eq, kshape, jax_gmma.quantize(_normal(17, (128, 64)), "fp8_channel"))


@pytest.mark.parametrize("eq,kshape", [
  ("bnth,nhd->btd", (4, 32, 64)),     # contracted dims not trailing in x
  ("btd,dnh->bnth", (128, 4, 16)),    # output not x's dims then the kernel's
  ("bnd,nde->bne", (4, 128, 16)),     # a batched (per-n) weight
  ("btd,dnh", (128, 4, 16)),          # implicit output
  ("btd,de->bt", (128, 16)),          # kernel dim summed away
])
def test_quantized_einsum_unsupported(eq, kshape):
  ein = nnx.Einsum(eq if "->" in eq else eq + "->btnh", kshape, rngs=nnx.Rngs(0))
  ein.einsum_str = eq
  with pytest.raises(ValueError, match=r"QuantizedEinsum.*" + re.escape(repr(eq))):
    gnn.QuantizedEinsum.from_einsum(ein, "fp8_channel")


# -- quantize_model ----------------------------------------------------------------------------

class Block(nnx.Module):
  def __init__(self, d, h, rngs):
    self.q = nnx.Einsum("btd,dnh->btnh", (d, 2, d // 2), (2, d // 2), rngs=rngs)
    self.up = nnx.Linear(d, h, rngs=rngs)
    self.down = nnx.Linear(h, d, rngs=rngs)

  def __call__(self, x):
    a = self.q(x).reshape(x.shape)
    return x + self.down(jax.nn.gelu(self.up(x + a)))


class Model(nnx.Module):
  def __init__(self, d=64, h=128, vocab=40, seed=0):
    rngs = nnx.Rngs(seed)
    self.layers = nnx.List([Block(d, h, rngs) for _ in range(2)])
    self.head = nnx.Linear(d, vocab, rngs=rngs)
    biases = [v for path, v in nnx.iter_graph(self) if isinstance(v, nnx.Param) and path[-1] == "bias"]
    for i, v in enumerate(biases):
      v.set_value(_normal(seed + 200 + i, v.get_value().shape) * 0.1)

  def __call__(self, x):
    for blk in self.layers:
      x = blk(x)
    return self.head(x)


RULES = [
  (r"^head$", None),
  (r"layers/0/down", "wo:nvfp4"),
  (r"/(up|down)$", "fp8_channel"),
  (r"layers/1/q", "mxfp8"),
]


def _fp8_channel_bytes(k, n):
  return n * k + 4 * n + 4 * n  # e4m3 data, float32 scale per row, float32 bias


def test_quantize_model(capsys):
  model = Model()
  ref = Model()
  x = _normal(20, (2, 3, 64))
  y_float = ref(x)
  summary = gnn.quantize_model(model, RULES, verbose=True)
  printed = capsys.readouterr().out
  assert isinstance(model.layers[0].down, gnn.QuantizedLinear)
  assert model.layers[0].down.format == "wo:nvfp4"
  assert model.layers[0].up.format == model.layers[1].up.format == "fp8_channel"
  assert model.layers[1].down.format == "fp8_channel"
  assert isinstance(model.layers[1].q, gnn.QuantizedEinsum) and model.layers[1].q.format == "mxfp8"
  assert type(model.layers[0].q) is nnx.Einsum  # no rule matches
  assert type(model.head) is nnx.Linear         # rule None
  by_path = {s.path: s for s in summary}
  assert sorted(by_path) == sorted(["head", "layers/0/q", "layers/0/up", "layers/0/down",
                                    "layers/1/q", "layers/1/up", "layers/1/down"])
  assert [s.path for s in summary.converted] == [
    "layers/0/down", "layers/0/up", "layers/1/down", "layers/1/q", "layers/1/up"]
  head = by_path["head"]
  assert (head.format, head.rule, head.bytes_before, head.bytes_after) == (None, r"^head$", 4 * 64 * 40 + 4 * 40, 4 * 64 * 40 + 4 * 40)
  assert by_path["layers/0/q"].rule is None
  up = by_path["layers/1/up"]
  assert (up.layer, up.kernel_shape, up.rule) == ("Linear", (64, 128), r"/(up|down)$")
  assert up.bytes_before == 4 * 64 * 128 + 4 * 128
  assert up.bytes_after == _fp8_channel_bytes(64, 128)
  assert by_path["layers/1/down"].bytes_after == _fp8_channel_bytes(128, 64)
  # PackedWeight nvfp4 (N=64, K=128): 0.5 byte per weight + one scale byte per 16 + global scale
  assert by_path["layers/0/down"].bytes_after == 64 * 128 // 2 + 64 * 128 // 16 + 4 + 4 * 64
  # mxfp8 einsum: (N, K) = (64, 64): e4m3 data, an E8M0 byte per 32 of K, float32 bias (2, 32)
  assert by_path["layers/1/q"].bytes_after == 64 * 64 + 64 * 2 + 4 * 64
  assert summary.bytes_before == sum(s.bytes_before for s in summary)
  assert summary.bytes_after == sum(s.bytes_after for s in summary) < summary.bytes_before
  text = str(summary)
  assert printed.strip() == text.strip()
  for s in summary:
    assert s.path in text
  assert "wo:nvfp4" in text and "float (no rule)" in text and "5 of 7 layers quantized" in text
  _close(model(x), y_float, 0.1)
  y_jit = nnx.jit(lambda m, v: m(v))(model, x)
  _close(y_jit, np.asarray(model(x)), 1e-4)
  # split / merge of the whole quantized model is bit exact
  graphdef, state = nnx.split(model)
  _leaves_equal(nnx.state(nnx.merge(graphdef, state)), state)
  assert "layers/0/down/kernel/value/packed" in _paths(state)
  assert "layers/1/up/kernel/value/scales" in _paths(state)


def test_quantize_model_abstract_restore():
  """The abstract quantized model (nnx.eval_shape) takes the state of a concrete one."""
  def build():
    m = Model()
    gnn.quantize_model(m, RULES)
    return m
  concrete = build()
  abstract = nnx.eval_shape(build)
  a_state, c_state = nnx.state(abstract), nnx.state(concrete)
  assert _paths(a_state) == _paths(c_state)
  nnx.update(abstract, c_state)
  x = _normal(21, (1, 2, 64))
  assert np.array_equal(np.asarray(abstract(x)), np.asarray(concrete(x)))


def test_quantize_model_shared_and_containers():
  class Net(nnx.Module):
    def __init__(self):
      rngs = nnx.Rngs(0)
      self.a = nnx.Linear(32, 32, rngs=rngs)
      self.b = self.a                                   # shared
      self.blocks = nnx.data([nnx.Linear(32, 32, rngs=rngs), {"p": nnx.Linear(32, 16, rngs=rngs)}])
      self.seq = nnx.List([nnx.Linear(32, 32, rngs=rngs)])
      self.named = nnx.Dict({"o": nnx.Linear(32, 32, rngs=rngs)})
      self.lora = nnx.LoRALinear(32, 32, lora_rank=2, rngs=rngs)  # a subclass: left alone

  net = Net()
  summary = gnn.quantize_model(net, [(".*", "fp8_channel")])
  assert isinstance(net.a, gnn.QuantizedLinear) and net.b is net.a
  assert isinstance(net.blocks[0], gnn.QuantizedLinear)
  assert isinstance(net.blocks[1]["p"], gnn.QuantizedLinear)
  assert isinstance(net.seq[0], gnn.QuantizedLinear)
  assert isinstance(net.named["o"], gnn.QuantizedLinear)
  assert type(net.lora) is nnx.LoRALinear
  assert sorted(s.path for s in summary) == ["a", "blocks/0", "blocks/1/p", "named/o", "seq/0"]
  with pytest.raises(TypeError, match=r"QuantizedLinear.from_linear: linear is a LoRALinear, which "
                                      r"overrides nnx.Linear.__call__"):
    gnn.QuantizedLinear.from_linear(net.lora, "fp8_channel")
  x = _normal(22, (3, 32))
  assert nnx.jit(lambda m, v: m.named["o"](m.seq[0](v)))(net, x).shape == (3, 32)


def test_quantize_model_errors_leave_model_unchanged():
  model = Model()
  with pytest.raises(ValueError, match=r"quantize_model: layer 'head'.*'wo:nvfp4'.*multiple of 16"):
    gnn.quantize_model(model, [(r"up", "fp8_channel"), (r"head", "wo:nvfp4")])
  assert all(type(b.up) is nnx.Linear for b in model.layers)  # nothing replaced
  summary = gnn.quantize_model(model, [(r"up", "fp8_channel"), (r"head", "wo:nvfp4")],
                               skip_unsupported=True)
  head = {s.path: s for s in summary}["head"]
  assert head.format is None and head.note.startswith("wo:nvfp4") and "multiple of 16" in head.note
  assert "float (unsupported, see below)" in str(summary) and "head: left float: wo:nvfp4" in str(summary)
  assert type(model.head) is nnx.Linear and isinstance(model.layers[0].up, gnn.QuantizedLinear)
  with pytest.raises(ValueError, match=r"quantize_model: rules\[0\].*unknown format 'fp9'"):
    gnn.quantize_model(Model(), [(r"up", "fp9")])
  with pytest.raises(TypeError, match=r"quantize_model: rules\[0\] must be a \(regex, format or None\) pair"):
    gnn.quantize_model(Model(), ["up"])
  with pytest.raises(ValueError, match=r"quantize_model: rules\[0\]: '\(' is not a regular expression"):
    gnn.quantize_model(Model(), [("(", "fp8_channel")])
  class Held(nnx.Module):
    def __init__(self):
      self.t = nnx.data((nnx.Linear(32, 32, rngs=nnx.Rngs(0)),))

  held = Held()
  with pytest.raises(TypeError, match=r"quantize_model: cannot replace layer 't/0' in place: it is "
                                      r"held in a tuple"):
    gnn.quantize_model(held, [(".*", "fp8_channel")])
  assert type(held.t[0]) is nnx.Linear
  with pytest.raises(TypeError, match=r"quantize_model: model is itself an nnx.Linear"):
    gnn.quantize_model(_linear(32, 32), [(".*", "fp8_channel")])


# -- dot_general -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ("fp8_channel", "nvfp4", "wo:nvfp4"))
def test_dot_general(fmt):
  k, n = 128, 32
  lin = _linear(k, n, seed=30)
  q_lin = nnx.Linear(k, n, dot_general=gnn.dot_general(fmt), rngs=nnx.Rngs(30))
  nnx.update(q_lin, nnx.state(lin))
  x = _normal(31, (2, 4, k), _x_dtype(fmt))
  y = q_lin(x)
  # the same numbers as the layer quantized once (nnx.Linear promotes x to the kernel's float32)
  want = gnn.QuantizedLinear.from_linear(lin, fmt)(x.astype(jnp.float32))
  assert y.dtype == want.dtype
  _close(y, np.asarray(want, np.float32), 1e-6)
  _close(nnx.jit(lambda m, v: m(v))(q_lin, x), np.asarray(want, np.float32), 1e-6)
  # gradients: x through jax_gmma.dot, the kernel straight through the quantization
  xf = x.astype(jnp.float32)
  loss = lambda m, v: jnp.sum(jnp.sin(m(v).astype(jnp.float32)))
  (gm, gx), (fm, fx) = (nnx.grad(loss, argnums=(0, 1))(m, xf) for m in (q_lin, lin))
  _close(gx, fx, 0.3)
  _close(gm["kernel"].get_value(), fm["kernel"].get_value(), 0.3)
  _close(gm["bias"].get_value(), fm["bias"].get_value(), 0.3)
  assert gm["kernel"].get_value().dtype == jnp.float32


def test_dot_general_errors():
  dg = gnn.dot_general("fp8_channel")
  x, w = _normal(32, (2, 3, 64)), _normal(33, (64, 32))
  assert dg(x, w, (((2,), (0,)), ((), ()))).shape == (2, 3, 32)
  assert dg(x, w.T, (((2,), (1,)), ((), ()))).shape == (2, 3, 32)
  with pytest.raises(ValueError, match=r"jax_gmma.nn.dot_general: serves lhs \(\.\.\., K\)"):
    dg(x, w, (((1,), (0,)), ((), ())))
  with pytest.raises(ValueError, match=r"jax_gmma.nn.dot_general: serves"):
    dg(x, jnp.ones((2, 64, 32)), (((2,), (1,)), ((0,), (0,))))
  with pytest.raises(ValueError, match=r"jax_gmma.nn.dot_general: unknown format 'fp9'"):
    gnn.dot_general("fp9")
  with pytest.raises(ValueError, match=r"jax_gmma.nn.dot_general: x_format must be None for a weight-only"):
    gnn.dot_general("wo:mxfp4", x_format="fp8_tensor")


# -- Fp8Linear ---------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,k,n", [("tensor", 64, 32), ("blockwise", 128, 128)])
def test_fp8_linear_matches_float(recipe, k, n):
  lin = _linear(k, n, seed=40)
  layer = gnn.Fp8Linear.from_linear(lin, recipe=recipe)
  assert layer.recipe == recipe and layer.kernel.get_value().shape == (k, n)
  assert _paths(nnx.state(layer)) == _paths(nnx.state(lin)) == {"kernel/value", "bias/value"}
  assert layer.kernel is not lin.kernel  # a copy, not a shared variable
  x = _normal(41, (4, 8, k))
  _close(layer(x), lin(x), 0.08)
  loss = lambda m, v: jnp.mean(jnp.sin(m(v)) * jnp.arange(n, dtype=jnp.float32))
  (gm, gx), (fm, fx) = (nnx.grad(loss, argnums=(0, 1))(m, x) for m in (layer, lin))
  _close(gx, fx, 0.15)
  _close(gm["kernel"].get_value(), fm["kernel"].get_value(), 0.15)
  _close(gm["bias"].get_value(), fm["bias"].get_value(), 0.05)


def test_fp8_linear_trains():
  k, n = 32, 16
  model = gnn.Fp8Linear(k, n, rngs=nnx.Rngs(50))
  assert model.kernel.get_value().shape == (k, n) and model.bias.get_value().shape == (n,)
  ref = nnx.Linear(k, n, rngs=nnx.Rngs(50))  # the same default initializers
  assert np.array_equal(np.asarray(model.kernel.get_value()), np.asarray(ref.kernel.get_value()))
  x = _normal(51, (64, k))
  target = x @ _normal(52, (k, n)) * 0.3
  opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
  w0 = np.asarray(model.kernel.get_value())

  @nnx.jit
  def step(model, opt):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - target) ** 2))(model)
    opt.update(model, grads)
    return loss

  losses = [float(step(model, opt)) for _ in range(5)]
  assert not np.array_equal(np.asarray(model.kernel.get_value()), w0)
  assert losses[-1] < losses[0]
  # bfloat16 computation
  bf = gnn.Fp8Linear(k, n, dtype=jnp.bfloat16, rngs=nnx.Rngs(50))
  assert bf(x).dtype == jnp.bfloat16


# -- errors ------------------------------------------------------------------------------------

def test_errors_name_the_caller():
  lin = _linear(128, 32)
  with pytest.raises(ValueError, match=r"QuantizedLinear.from_linear: unknown format 'fp9'; formats: fp8_tensor.*wo:nvfp4"):
    gnn.QuantizedLinear.from_linear(lin, "fp9")
  with pytest.raises(ValueError, match=r"QuantizedLinear.from_linear: format 'wo:fp8_channel'"):
    gnn.QuantizedLinear.from_linear(lin, "wo:fp8_channel")
  with pytest.raises(TypeError, match=r"QuantizedLinear.from_linear: format must be a format spec"):
    gnn.QuantizedLinear.from_linear(lin, 8)
  with pytest.raises(TypeError, match=r"QuantizedLinear.from_linear: linear must be an nnx.Linear"):
    gnn.QuantizedLinear.from_linear(gnn.Fp8Linear(32, 32, rngs=nnx.Rngs(0)), "fp8_channel")
  with pytest.raises(ValueError, match=r"QuantizedLinear: kernel must be a 2-D \(N, K\)"):
    gnn.QuantizedLinear(jax_gmma.quantize(_normal(60, (2, 32, 64)), "fp8_channel"))
  with pytest.raises(TypeError, match=r"QuantizedLinear: kernel must be a jax_gmma.QuantizedArray"):
    gnn.QuantizedLinear(_normal(61, (32, 64)))
  with pytest.raises(ValueError, match=r"QuantizedLinear: bias must have shape \(N,\) = \(32,\)"):
    gnn.QuantizedLinear(jax_gmma.quantize(_normal(62, (32, 64)), "fp8_channel"), _normal(63, (16,)))
  with pytest.raises(ValueError, match=r"QuantizedLinear.from_linear: x_format must be None for a weight-only"):
    gnn.QuantizedLinear.from_linear(lin, "wo:nvfp4", x_format="fp8_tensor")
  with pytest.raises(TypeError, match=r"QuantizedLinear.from_linear: out_dtype must be"):
    gnn.QuantizedLinear.from_linear(lin, "fp8_channel", out_dtype=jnp.int32)
  # a shape the format's GEMM cannot serve is refused when the layer is built
  with pytest.raises(ValueError, match=r"QuantizedLinear.from_linear: jax_gmma.dot cannot multiply this "
                                       r"fp8_channel weight \(N, K\) = \(16, 40\).*multiple of 16"):
    gnn.QuantizedLinear.from_linear(_linear(40, 16), "fp8_channel")
  with pytest.raises(ValueError, match=r"QuantizedLinear.from_linear: format 'wo:nvfp4'.*multiple of 16"):
    gnn.QuantizedLinear.from_linear(_linear(64, 24), "wo:nvfp4")
  layer = gnn.QuantizedLinear.from_linear(lin, "fp8_channel")
  with pytest.raises(ValueError, match=r"QuantizedLinear: x must be \(\.\.\., in_features\) with in_features = 128"):
    layer(_normal(64, (3, 64)))
  with pytest.raises(ValueError, match=r"Fp8Linear: recipe='tensor' needs in_features \(K\) and out_features \(N\) multiples of 16"):
    gnn.Fp8Linear(100, 32, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"Fp8Linear.from_linear: recipe='blockwise' needs .* multiples of 128"):
    gnn.Fp8Linear.from_linear(lin, recipe="blockwise")
  with pytest.raises(ValueError, match=r"Fp8Linear: recipe must be one of"):
    gnn.Fp8Linear(32, 32, recipe="delayed", rngs=nnx.Rngs(0))
  ein = nnx.Einsum("btd,dnh->btnh", (128, 4, 16), rngs=nnx.Rngs(0))
  layer = gnn.QuantizedEinsum.from_einsum(ein, "fp8_channel")
  with pytest.raises(ValueError, match=r"QuantizedEinsum: einsum 'btd,dnh->btnh': x must have rank 3, trailing dims \(128,\)"):
    layer(_normal(65, (3, 128)))
  with pytest.raises(TypeError, match=r"QuantizedEinsum.from_einsum: einsum must be an nnx.Einsum"):
    gnn.QuantizedEinsum.from_einsum(lin, "fp8_channel")
