"""The MiniLM example's Flax NNX model (examples/minilm.py) without the model files: a small
random-weight encoder of the same architecture.

Checks that the variants jax_gmma.nn.quantize_model builds compute what the example computed per
Linear before it used quantize_model (``jax_gmma.dot`` on the quantized (N, K) weight with the
bias: bit-identical for the FP8 GEMMs; the FP4 weight-only GEMM now returns float32 for float32
activations instead of rounding its output to bf16 first, so close, and bit-identical with bf16
activations), that the float32 NNX model equals the hand-written float path, and that a saved and
reloaded variant (orbax) is bit-identical and embeds identically. Needs flax (and orbax-checkpoint
for the round trip); a few seconds on 2 CPU cores.
"""
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx", reason="the example's model is Flax NNX (pip install flax)")

import jax.numpy as jnp  # noqa: E402
import jax_gmma  # noqa: E402
import jax_gmma.nn as gnn  # noqa: E402

from _examples import assert_same_tree, load_example, skip_unless_dot_runs  # noqa: E402

SEED = 0
B, L = 4, 16


@pytest.fixture(scope="module")
def mm():
  skip_unless_dot_runs()
  return load_example("minilm.py", "jax_gmma_minilm_example")


@pytest.fixture(scope="module")
def cfg(mm):
  return mm.BertConfig(hidden=128, layers=2, heads=4, intermediate=256, max_positions=64)


@pytest.fixture(scope="module")
def model(mm, cfg):
  return mm.MiniLMModel(cfg, mm.random_params(cfg, SEED, vocab=200))


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(SEED)
  ids = rng.integers(1, 200, (B, L)).astype(np.int32)
  mask = np.ones((B, L), np.int32)
  mask[1, 10:] = 0
  mask[3, 5:] = 0
  return jnp.asarray(ids), jnp.asarray(mask)


def _embed(mm, m, batch, dtype="float32"):
  return np.asarray(mm.encode(*nnx.split(m), *batch, dtype=dtype))


class _DotLinear(nnx.Module):
  """A Linear wired by hand, as the example computed it before quantize_model: the (N, K) float32
  weight quantized once, every call ``jax_gmma.dot(x, w, bias=b)``; the weight-only GEMM on
  bf16 x and bias, its bf16 output cast to x's dtype."""

  def __init__(self, linear, spec):
    w = jnp.asarray(linear.kernel.get_value(), jnp.float32).T
    self.weightonly = spec.label.startswith("wo:")
    q = (jax_gmma.weightonly.prepare(w, spec.fmt) if self.weightonly else
         jax_gmma.quantize(w, spec.fmt))
    self.w = gnn.QuantizedParam(q)
    self.b = nnx.Param(linear.bias.get_value())

  def __call__(self, x):
    if self.weightonly:
      y = jax_gmma.dot(x.astype(jnp.bfloat16), self.w.get_value(),
                       bias=self.b.get_value().astype(jnp.bfloat16))
      return y.astype(x.dtype)
    return jax_gmma.dot(x, self.w.get_value(), bias=self.b.get_value())


def _by_hand(mm, model, spec):
  out = nnx.clone(model)
  m = mm.parse_method(spec)
  mm.convert(out, [(mm.LAYER_LINEARS, mm.Method(label=spec, kind="by_hand", fmt=m.fmt))],
             _DotLinear)
  return out


@pytest.mark.parametrize("spec", ["fp8_channel", "fp8_tensor", "fp8_128x128", "wo:nvfp4"])
def test_quantize_model_matches_per_layer_dot(mm, cfg, model, batch, spec):
  m = mm.parse_method(spec)
  q = nnx.clone(model)
  summary = mm.convert_model(q, m)
  assert len(summary.converted) == 6 * cfg.layers
  assert {s.format for s in summary.converted} == {spec}
  assert all(type(layer.q) is nnx.Linear for layer in model.layers)  # float model unchanged
  hand = _by_hand(mm, model, spec)
  for dtype in ("float32", "bfloat16"):
    got, want = _embed(mm, q, batch, dtype), _embed(mm, hand, batch, dtype)
    assert np.all(np.isfinite(got))
    if spec.startswith("wo:") and dtype == "float32":
      cos = np.sum(got * want, 1)  # unit vectors
      assert cos.min() > 0.9999, cos
    else:
      np.testing.assert_array_equal(got, want)


def test_float_paths(mm, model, batch):
  """The float32 NNX model (nnx.Linear, Precision.HIGHEST) against the example's hand-written
  float layer (FloatLinear: y = x @ w.T in float32 + b), and the bfloat16 row."""
  f32 = mm.float_method("float32")
  assert mm.build_variant(model, f32) is model
  hand = nnx.clone(model)
  mm.convert(hand, [(mm.LAYER_LINEARS, f32)], mm.own_layer)
  assert isinstance(hand.layers[0].q, mm.FloatLinear)
  ref = _embed(mm, model, batch)
  np.testing.assert_allclose(_embed(mm, hand, batch), ref, rtol=0, atol=1e-6)
  bf = _embed(mm, mm.build_variant(model, mm.float_method("bfloat16")), batch, "bfloat16")
  assert np.sum(bf * ref, 1).min() > 0.999


@pytest.mark.parametrize("spec", ["fp8_channel", "wo:nvfp4", "emu:mxfp8"])
def test_save_load_round_trip(mm, model, batch, spec, tmp_path):
  pytest.importorskip("orbax.checkpoint", reason="needs orbax-checkpoint")
  m = mm.parse_method(spec)
  saved = mm.build_variant(model, m)
  path = mm.checkpoint_path(tmp_path, spec)
  mm.save_model(path, saved)
  loaded = mm.load_model(path, model, m)
  assert nnx.graphdef(loaded) == nnx.graphdef(saved)
  assert_same_tree(nnx.state(loaded), nnx.state(saved))
  np.testing.assert_array_equal(_embed(mm, loaded, batch), _embed(mm, saved, batch))
  with pytest.raises(ValueError):  # a directory that exists is never overwritten
    mm.check_checkpoint_dirs([spec], save_dir=tmp_path)
  with pytest.raises(ValueError, match="no checkpoint of fp8_tensor"):
    mm.check_checkpoint_dirs(["fp8_tensor"], load_dir=tmp_path)
