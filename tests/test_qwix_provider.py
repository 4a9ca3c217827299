"""The qwix provider (jax_gmma.qwix_provider): an NNX model quantized by
``qwix.quantize_model(model, GmmaProvider(rules), x)`` against qwix's own PTQ provider, the
float model and a float64 oracle of its quantized operands; jax-gmma's GEMM in the jaxpr;
rule mapping (None keeps a layer float, first match wins) and the errors for qtypes jax-gmma
has no GEMM for; NNX state handling; ``quantize_with_qwix_rules``. CPU (the pure-JAX reference
GEMMs); skipped without qwix or flax."""
from __future__ import annotations

import pytest

pytest.importorskip("flax")
qwix = pytest.importorskip("qwix")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jax_gmma  # noqa: E402
import jax_gmma.nn as gnn  # noqa: E402
from jax_gmma import qwix_provider as gq  # noqa: E402

# qwix's own use of deprecated flax names (Variable.value, VariableState).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:qwix.*")

FP8 = dict(weight_qtype=jnp.float8_e4m3fn, act_qtype=jnp.float8_e4m3fn)


def _rule(path=".*", **kw):
  return qwix.QuantizationRule(module_path=path, **kw)


def _normal(seed, shape, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(5000 + seed).standard_normal(shape).astype(np.float32),
                     dtype)


class MLP(nnx.Module):
  """Two Linear layers and an einsum projection (random biases)."""

  def __init__(self, seed=0):
    rngs = nnx.Rngs(seed)
    self.up = nnx.Linear(64, 128, rngs=rngs)
    self.down = nnx.Linear(128, 64, rngs=rngs)
    self.proj = nnx.Einsum("btd,dnh->btnh", (64, 2, 16), (2, 16), rngs=rngs)
    for i, layer in enumerate((self.up, self.down, self.proj)):
      layer.bias.set_value(0.1 * _normal(10 + i, layer.bias.shape))

  def __call__(self, x):
    return self.proj(self.down(jax.nn.gelu(self.up(x))))


class One(nnx.Module):
  """One Linear layer (its output is the model's)."""

  def __init__(self, k=128, n=64, dtype=None):
    self.lin = nnx.Linear(k, n, dtype=dtype, rngs=nnx.Rngs(1))
    self.lin.bias.set_value(_normal(20, (n,)))

  def __call__(self, x):
    return self.lin(x)


def _rel(got, want):
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  want = np.asarray(jnp.asarray(want, jnp.float32), np.float64)
  assert got.shape == want.shape and np.all(np.isfinite(got))
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.fixture(scope="module")
def fp8_models():
  model = MLP()
  x = _normal(0, (2, 8, 64))
  ours = qwix.quantize_model(model, gq.GmmaProvider([_rule(**FP8)]), x)
  theirs = qwix.quantize_model(model, qwix.PtqProvider([_rule(**FP8)]), x)
  return model, ours, theirs, x


def test_fp8_matches_qwix_ptq_and_the_float_model(fp8_models):
  model, ours, theirs, x = fp8_models
  y, y_ours, y_theirs = model(x), ours(x), theirs(x)
  assert y_ours.shape == y.shape == (2, 8, 2, 16)
  # FP8 e4m3 weights and activations: a few percent of the output's norm.
  assert _rel(y_theirs, y) < 0.1
  assert _rel(y_ours, y) < 0.1
  # The same per-channel weight / per-token activation scales as qwix: nearly the same model. On
  # a GPU, qwix's dots are XLA's FP8 GEMM (fast accumulation, about 1e-3 per product) and each of
  # the three layers re-quantizes its input, where one ulp can move an e4m3 value: the bf16 bound.
  assert _rel(y_ours, y_theirs) < (1e-3 if jax.default_backend() == "cpu" else 1e-2)


def test_matched_layers_hold_gmma_weights_and_run_its_gemm(fp8_models):
  _, ours, theirs, x = fp8_models
  for name, layer in (("up", ours.up), ("down", ours.down), ("proj", ours.proj)):
    kernel = layer.kernel
    assert isinstance(kernel, gq.GmmaWeight), name
    assert kernel.format == "fp8_channel"
    assert isinstance(kernel.value.weight, jax_gmma.QuantizedArray)
  assert ours.up.kernel.shape == (64, 128) and ours.up.kernel.contract == 0
  assert ours.up.kernel.value.weight.canonical_shape == (128, 64)  # the kernels' (N, K)
  assert ours.proj.kernel.plan.n_shape == (2, 16)
  jaxpr = str(jax.make_jaxpr(lambda x: ours(x))(x))
  assert jaxpr.count("jax_gmma_fp8_gemm") == 3
  assert "jax_gmma" not in str(jax.make_jaxpr(lambda x: theirs(x))(x))
  # The quantized arrays are QuantizedParam variables (frozen), the biases stay nnx.Param.
  assert len(jax.tree.leaves(nnx.state(ours, gnn.QuantizedParam))) == 6
  assert len(jax.tree.leaves(nnx.state(ours, nnx.Param))) == 3


def test_jit_split_merge_and_eval_shape(fp8_models):
  _, ours, _, x = fp8_models
  y = ours(x)
  np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(ours, x)), np.asarray(y),
                             rtol=1e-5, atol=1e-6)
  graphdef, state = nnx.split(ours)
  np.testing.assert_array_equal(np.asarray(nnx.merge(graphdef, state)(x)), np.asarray(y))
  # An abstract quantized model (for restoring a checkpoint) has the same state structure.
  abstract = nnx.eval_shape(lambda: qwix.quantize_model(MLP(), gq.GmmaProvider([_rule(**FP8)]), x))
  assert (jax.tree.map(lambda a: (a.shape, a.dtype), nnx.state(abstract))
          == jax.tree.map(lambda a: (a.shape, a.dtype), state))
  # Only the method qwix wrapped runs the provider: a submodule on its own refuses clearly.
  with pytest.raises(TypeError, match="call the quantized model"):
    ours.up(x)


def _oracle(x, w, bias, x_format):
  """float64 x_q @ dequantize(w).T + bias, x_q: x quantized as jax_gmma.dot does for w (bf16
  for a PackedWeight)."""
  x2 = jnp.asarray(x, jnp.float32)
  if isinstance(w, jax_gmma.PackedWeight):
    wd = np.asarray(jax_gmma.weightonly.dequantize_packed(w), np.float64)
    xd = np.asarray(x2.astype(jnp.bfloat16), np.float64)
  else:
    wd = np.asarray(jax_gmma.dequantize(w, jnp.float32), np.float64)
    xd = np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x2, x_format), jnp.float32), np.float64)
  return xd @ wd.T + np.asarray(bias, np.float64)


@pytest.mark.parametrize("rule,fmt,x_format", [
    (dict(**FP8), "fp8_channel", "fp8_channel"),
    (dict(tile_size=128, **FP8), "fp8_1x128", "fp8_1x128"),
    (dict(weight_qtype="nvfp4", tile_size=16), "wo:nvfp4", None),
])
# float32 out: 1e-5 where the product runs in float32 (CPU), 1e-3 on a GPU, whose FP8 wgmma
# accumulates below float32 precision (the tolerance of tests/test_gpu_fp8.py).
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5 if jax.default_backend() == "cpu" else 1e-3),
                                       (jnp.bfloat16, 1e-2)])
def test_against_oracle_of_quantized_operands(rule, fmt, x_format, dtype, tol):
  model = One(dtype=dtype)
  x = _normal(1, (16, 128), dtype)
  q = qwix.quantize_model(model, gq.GmmaProvider([_rule(**rule)]), x)
  kernel = q.lin.kernel
  assert kernel.format == fmt
  y = q(x)
  assert y.dtype == dtype
  want = _oracle(x, kernel.value.weight, model.lin.bias.get_value(), x_format)
  assert _rel(y, want) < tol
  assert _rel(y, model(x)) < (0.2 if fmt.startswith("wo:") else 0.1)


def test_rules_first_match_and_none_keeps_float():
  model = MLP()
  x = _normal(0, (2, 8, 64))
  provider = gq.GmmaProvider([_rule("down", weight_qtype=None), _rule("up", weight_qtype="nvfp4"),
                              _rule(".*", tile_size=128, **FP8)])
  assert provider.formats == (None, "wo:nvfp4", "fp8_1x128")
  q = qwix.quantize_model(model, provider, x)
  assert isinstance(q.down.kernel, nnx.Param)
  assert q.up.kernel.format == "wo:nvfp4" and q.proj.kernel.format == "fp8_1x128"
  jaxpr = str(jax.make_jaxpr(lambda x: q(x))(x))
  assert "jax_gmma_weightonly_gemm" in jaxpr and "jax_gmma_fp8_blockwise_gemm" in jaxpr
  assert _rel(q(x), model(x)) < 0.2
  assert provider.get_unused_rules() == []
  # fp8_block_format picks 128 x 128 weight blocks instead.
  q2 = qwix.quantize_model(model, gq.GmmaProvider([_rule(tile_size=128, **FP8)],
                                                  fp8_block_format="fp8_128x128"), x)
  assert q2.up.kernel.format == "fp8_128x128"


@pytest.mark.parametrize("qtype", [jnp.int8, jnp.int4, "nf4", jnp.float8_e5m2])
def test_unsupported_qtype_names_provider_and_rule(qtype):
  rules = [_rule("lm_head", weight_qtype=None),
           _rule("mlp/.*", weight_qtype=qtype, act_qtype=qtype)]
  with pytest.raises(ValueError,
                     match=r"GmmaProvider: rules\[1\].*module_path='mlp/\.\*'.*no GEMM"):
    gq.GmmaProvider(rules)


@pytest.mark.parametrize("kw,match", [
    (dict(weight_qtype=jnp.float8_e4m3fn), "quantize the activation too"),
    (dict(weight_qtype="mxfp8"), "pairs with act_qtype 'mxfp8'"),
    (dict(weight_qtype="nvfp4", act_qtype=jnp.float8_e4m3fn), "pairs with act_qtype"),
    (dict(tile_size=64, **FP8), "tile_size None"),
    (dict(weight_qtype="mxfp4", tile_size=16), "tile_size must be None or 32"),
    (dict(weight_calibration_method="rms,3", **FP8), "absmax"),
    (dict(act_static_scale=True, **FP8), "act_static_scale"),
])
def test_unsupported_rule_options(kw, match):
  with pytest.raises(ValueError, match=match):
    gq.GmmaProvider([_rule(**kw)])
  with pytest.raises(TypeError, match="QuantizationRule"):
    gq.GmmaProvider([("mlp", "fp8_channel")])


def test_unserved_products_raise_with_path_and_rule():
  class Conv(nnx.Module):
    def __init__(self):
      self.conv = nnx.Conv(4, 8, (3,), rngs=nnx.Rngs(0))

    def __call__(self, x):
      return self.conv(x)

  with pytest.raises(ValueError, match=r"module 'conv'.*no convolution"):
    qwix.quantize_model(Conv(), gq.GmmaProvider([_rule(**FP8)]), jnp.ones((1, 8, 4)))
  # K = 40 is no multiple of 16 (the FP8 GEMM's rule): refused at the first call.
  with pytest.raises(ValueError, match=r"module 'lin'.*fp8_channel.*multiple of 16"):
    qwix.quantize_model(One(k=40), gq.GmmaProvider([_rule(**FP8)]), jnp.ones((2, 40)))


def test_quantize_with_qwix_rules_matches_provider(fp8_models):
  model, ours, _, x = fp8_models
  converted = nnx.clone(model)
  summary = gq.quantize_with_qwix_rules(converted, [_rule("pro", **FP8), _rule("up|down", **FP8)])
  # fullmatch, as qwix matches: "pro" does not match "proj".
  assert {s.path: s.format for s in summary} == {"up": "fp8_channel", "down": "fp8_channel",
                                                 "proj": None}
  assert isinstance(converted.up, gnn.QuantizedLinear)
  assert isinstance(converted.proj, nnx.Einsum)
  gq.quantize_with_qwix_rules(converted, [_rule(".*", **FP8)])
  assert isinstance(converted.proj, gnn.QuantizedEinsum)
  assert _rel(converted(x), ours(x)) < 1e-5
  with pytest.raises(ValueError, match=r"quantize_with_qwix_rules: rules\[0\].*no GEMM"):
    gq.quantize_with_qwix_rules(nnx.clone(model), [_rule(weight_qtype=jnp.int8)])
