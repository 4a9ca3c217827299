"""GPU tests of the model-level API: an NNX model quantized with jax_gmma.nn.quantize_model and
with the qwix provider runs jax-gmma's kernels under jax.jit (their custom calls in the compiled
program), agrees with the same model on the CPU (the pure-JAX reference GEMMs of the same
quantized operands) and, for FP8, with qwix's own PTQ model; an orbax round trip on the GPU
gives the same outputs bit for bit. Skipped without a Hopper GPU and built kernels, flax, qwix or
orbax (per test)."""
from __future__ import annotations

import pytest

pytest.importorskip("flax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jax_gmma  # noqa: E402
import jax_gmma.nn as gnn  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::DeprecationWarning:qwix.*")]

#: the custom call each format spec's GEMM lowers to on Hopper
TARGET = {"fp8_channel": "jax_gmma_fp8_gemm", "fp8_128x128": "jax_gmma_fp8_blockwise_gemm",
          "mxfp8": "jax_gmma_mx_gemm", "wo:nvfp4": "jax_gmma_weightonly_gemm",
          "wo:mxfp4": "jax_gmma_weightonly_gemm"}
#: relative Frobenius error of the GPU model against the same model on the CPU (float32 out)
TOL = 2e-3


def _normal(seed, shape, dtype=jnp.float32):
  return jnp.asarray(np.random.default_rng(6000 + seed).standard_normal(shape).astype(np.float32),
                     dtype)


class Block(nnx.Module):
  """An MLP block with an einsum projection, Llama-like widths scaled down."""

  def __init__(self, d=256, f=512, seed=0):
    rngs = nnx.Rngs(seed)
    self.up = nnx.Linear(d, f, rngs=rngs)
    self.down = nnx.Linear(f, d, rngs=rngs)
    self.proj = nnx.Einsum("btd,dnh->btnh", (d, 4, 64), (4, 64), rngs=rngs)
    for i, layer in enumerate((self.up, self.down, self.proj)):
      layer.bias.set_value(0.1 * _normal(10 + i, layer.bias.shape))

  def __call__(self, x):
    return self.proj(self.down(jax.nn.gelu(self.up(x))))


def _rel(got, want):
  got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
  want = np.asarray(jnp.asarray(want, jnp.float32), np.float64)
  assert got.shape == want.shape and np.all(np.isfinite(got))
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _on_cpu(model, x):
  """The same model and input on JAX's CPU device (the reference GEMMs)."""
  cpu = jax.devices("cpu")[0]
  graphdef, state = nnx.split(model)
  state = jax.device_put(state, cpu)
  with jax.default_device(cpu):
    return nnx.merge(graphdef, state)(jax.device_put(x, cpu))


def _compiled(model, x):
  graphdef, state = nnx.split(model)
  f = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
  return f.lower(state, x).compile().as_text(), f(state, x)


@pytest.mark.parametrize("fmt", sorted(TARGET))
def test_quantize_model_runs_the_kernels(fmt):
  model = Block()
  summary = gnn.quantize_model(model, {".*": fmt})
  assert len(summary.converted) == 3
  x = _normal(0, (2, 4, 256), jnp.bfloat16 if fmt.startswith("wo:") else jnp.float32)
  text, y = _compiled(model, x)
  assert text.count(TARGET[fmt]) >= 3, f"{fmt}: {TARGET[fmt]} not in the compiled program"
  # FP8 formats re-quantize the activations between layers: an input one float32 ulp apart on
  # the two devices can round to the neighbouring e4m3 value (up to 6% apart), so a three-layer
  # chain gets the bfloat16 bound
  assert _rel(y, _on_cpu(model, x)) < (1e-2 if y.dtype == jnp.bfloat16 or "fp8" in fmt else TOL)


def test_qwix_provider_runs_the_kernels_and_matches_qwix_ptq():
  qwix = pytest.importorskip("qwix")
  from jax_gmma import qwix_provider as gq
  model = Block()
  x = _normal(1, (2, 4, 256))
  rule = qwix.QuantizationRule(module_path=".*", weight_qtype=jnp.float8_e4m3fn,
                               act_qtype=jnp.float8_e4m3fn)
  ours = qwix.quantize_model(model, gq.GmmaProvider([rule]), x)
  theirs = qwix.quantize_model(model, qwix.PtqProvider([rule]), x)
  text, y = _compiled(ours, x)
  assert text.count("jax_gmma_fp8_gemm") >= 3
  assert _rel(y, _on_cpu(ours, x)) < 1e-2  # three FP8 layers: the bound of the test above
  assert _rel(y, theirs(x)) < 1e-2  # the same scales; XLA's FP8 dot vs our kernel
  assert _rel(y, model(x)) < 0.1


def test_orbax_round_trip_on_the_gpu(tmp_path):
  pytest.importorskip("orbax.checkpoint")
  from jax_gmma import checkpoint_orbax
  model = Block()
  gnn.quantize_model(model, {"up|down": "wo:mxfp4", "proj": "fp8_128x128"})
  x = _normal(2, (2, 4, 256), jnp.bfloat16)
  _, state = nnx.split(model)
  checkpoint_orbax.save_orbax(tmp_path / "ckpt", state)
  restored = checkpoint_orbax.restore_orbax(tmp_path / "ckpt")
  graphdef, _ = nnx.split(model)
  again = nnx.merge(graphdef, restored)
  a, b = np.asarray(model(x)), np.asarray(again(x))
  assert a.tobytes() == b.tobytes()
