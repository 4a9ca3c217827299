"""jax.export of programs that take QuantizedArrays (CPU, JAX 0.10 and 0.11).

A jitted program taking a QuantizedArray weight exports with a symbolic token dimension,
round-trips through serialize / deserialize and, called, gives exactly what the jitted program
gives. QuantizedArray's static fields serialize as JSON; a QuantizedArray whose shape is
symbolic cannot be serialized (its shape is static metadata) and says so.
"""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_gmma
from jax_gmma import QuantizedArray
from jax_gmma.ops import tensorwise

DOT_FORMATS = ("fp8_channel", "fp8_tensor", "fp8_128x128", "fp8_1x128", "mxfp8", "nvfp4")
SWIZZLED = ("mxfp8", "nvfp4")
N, K = 256, 512


def _x(shape, seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32).astype(dtype)


def _round_trip(exported):
  """serialize / deserialize (needs flatbuffers, as jax.export does)."""
  pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
  return export.deserialize(exported.serialize())


def _same(a, b):
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


# On a Hopper GPU these formats run CUDA kernels that plan by M when lowered: a symbolic token
# dimension is refused there by name (one export per token bucket); NVFP4 x NVFP4 has no Hopper
# kernel and exports its reference, opted in.
KERNEL_PLANS_BY_M = ("fp8_channel", "fp8_tensor", "fp8_128x128", "fp8_1x128", "mxfp8")


def _refused_on_gpu(fmt):
  return jax.default_backend() == "gpu" and fmt in KERNEL_PLANS_BY_M


def _weight(fmt):
  layout = "sm100_128x4" if fmt in SWIZZLED else "rowmajor"
  return jax_gmma.quantize(_x((N, K), 1) * 0.1, fmt, layout=layout)


@pytest.mark.parametrize("fmt", DOT_FORMATS)
def test_dot_exports_with_symbolic_tokens(fmt):
  w = _weight(fmt)
  f = jax.jit(lambda x, w: jax_gmma.dot(x, w))
  m, = export.symbolic_shape("m")
  if _refused_on_gpu(fmt):
    with pytest.raises(ValueError, match="jax_gmma.dot: a symbolic dimension"):
      export.export(f)(jax.ShapeDtypeStruct((m, K), jnp.bfloat16), w)
    return
  with jax_gmma.allow_reference():
    exp = export.export(f, disabled_checks=jax_gmma.export_disabled_checks())(
        jax.ShapeDtypeStruct((m, K), jnp.bfloat16), w)
  assert "m" in str(exp.in_avals[0].shape)
  back = _round_trip(exp)
  with jax_gmma.allow_reference():
    for rows in (1, 8, 130):
      x = _x((rows, K), rows, jnp.bfloat16)
      _same(back.call(x, w), f(x, w))
      _same(exp.call(x, w), f(x, w))


@pytest.mark.parametrize("fmt", DOT_FORMATS)
def test_dot_exports_with_bias_and_batch(fmt):
  w = _weight(fmt)
  bias = _x((N,), 7)
  f = jax.jit(lambda x, w, b: jax_gmma.dot(x, w, bias=b, out_dtype=jnp.float32))
  m, = export.symbolic_shape("m")
  if _refused_on_gpu(fmt):
    with pytest.raises(ValueError, match="symbolic dimension"):
      export.export(f)(jax.ShapeDtypeStruct((2, m, K), jnp.float32), w, bias)
    return
  with jax_gmma.allow_reference():
    exp = export.export(f)(jax.ShapeDtypeStruct((2, m, K), jnp.float32), w, bias)
  back = _round_trip(exp)
  x = _x((2, 5, K), 3)
  with jax_gmma.allow_reference():
    _same(back.call(x, w, bias), f(x, w, bias))


@pytest.mark.parametrize("fmt", tuple(jax_gmma.FORMATS))
def test_dequantize_exports(fmt):
  layouts = ("rowmajor", "sm100_128x4") if fmt not in (
    "fp8_tensor", "fp8_channel", "fp8_1x128", "fp8_128x128") else ("rowmajor",)
  for layout in layouts:
    q = jax_gmma.quantize(_x((130, 100)), fmt, layout=layout)
    f = jax.jit(jax_gmma.dequantize)
    back = _round_trip(export.export(f)(q))
    _same(back.call(q), f(q))
    # the deserialized calling convention rebuilds the QuantizedArray's static fields
    (qa,), _ = jax.tree_util.tree_unflatten(back.in_tree, [None] * back.in_tree.num_leaves)
    assert isinstance(qa, QuantizedArray)
    assert (qa.format, qa.shape, qa.axis, qa.dtype, qa.layout) == \
      (q.format, q.shape, q.axis, q.dtype, q.layout)


@pytest.mark.parametrize("fmt", tuple(jax_gmma.FORMATS))
def test_quantize_dequantize_exports_with_symbolic_rows(fmt):
  layout = "sm100_128x4" if fmt in SWIZZLED else "rowmajor"
  f = jax.jit(lambda x: jax_gmma.dequantize(jax_gmma.quantize(x, fmt, layout=layout)))
  m, = export.symbolic_shape("m")
  back = _round_trip(export.export(f)(jax.ShapeDtypeStruct((m, 100), jnp.float32)))
  for rows in (1, 130):
    x = _x((rows, 100), rows)
    np.testing.assert_array_equal(np.asarray(back.call(x)), np.asarray(f(x)))


def test_symbolic_quantized_array_is_not_serialized():
  """A QuantizedArray output with a symbolic shape cannot keep its (static) shape: refused at
  serialization, naming the type and the remedy."""
  pytest.importorskip("flatbuffers", reason="jax.export serialization needs flatbuffers")
  m, = export.symbolic_shape("m")
  exp = export.export(jax.jit(lambda x: jax_gmma.quantize(x, "mxfp8")))(
      jax.ShapeDtypeStruct((m, 64), jnp.float32))
  with pytest.raises(ValueError, match=r"jax_gmma\.QuantizedArray: cannot serialize a "
                     r"QuantizedArray whose shape \(m, 64\) has symbolic dimensions"):
    exp.serialize()
  # the parts as plain arrays export fine
  f = jax.jit(lambda x: jax_gmma.ops.quantize.quantize_parts(x, "mxfp8")[:2])
  back = _round_trip(export.export(f)(jax.ShapeDtypeStruct((m, 64), jnp.float32)))
  x = _x((3, 64))
  for a, b in zip(back.call(x), f(x)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def test_quantized_array_with_abstract_leaves_exports():
  """An abstract weight (jax.ShapeDtypeStruct leaves) exports; the concrete one calls it."""
  w = _weight("mxfp8")
  sds = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
  wa = QuantizedArray(sds(w.data), sds(w.scales), format="mxfp8", shape=w.shape, layout=w.layout)
  f = jax.jit(jax_gmma.dequantize)
  back = _round_trip(export.export(f)(wa))
  _same(back.call(w), f(w))


def test_cuda_lowering_refuses_symbolic_m_by_name(fake_hopper):
  """A symbolic token dimension that reaches a CUDA kernel planned by M is refused at lowering,
  naming the function the user called (Hopper faked on CPU)."""
  w = _weight("fp8_channel")
  m, = export.symbolic_shape("m")
  jaxpr = jax.make_jaxpr(lambda x, w: jax_gmma.dot(x, w))(jax.ShapeDtypeStruct((m, K), jnp.bfloat16), w)

  def eqns(jx):
    for e in jx.eqns:
      yield e
      for v in e.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            yield from eqns(inner)
  eqn = next(e for e in eqns(jaxpr.jaxpr) if e.primitive is tensorwise.FP8_GEMM.p)
  ctx = types.SimpleNamespace(avals_in=[v.aval for v in eqn.invars], avals_out=[v.aval for v in eqn.outvars])
  with pytest.raises(ValueError, match=r"^jax_gmma.dot: a symbolic dimension"):
    tensorwise.FP8_GEMM.cuda_lowering(ctx, *eqn.invars, **eqn.params)
