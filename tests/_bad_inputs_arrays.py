"""Bad inputs of the array type and quantization: ``jax_gmma.QuantizedArray`` (its constructor),
``jax_gmma.quantize``, ``jax_gmma.ops.quantize.quantize_parts``, ``jax_gmma.dequantize`` and
``jax_gmma.arrays.to_layout``. Every case is refused before anything runs."""
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _bad_inputs import Case
from jax_gmma.arrays import to_layout
from jax_gmma.ops.quantize import quantize_parts

QA = "jax_gmma.QuantizedArray"
Q = "jax_gmma.quantize"
SW = "sm100_128x4"


def _x(shape=(4, 32), dtype=np.float32):
  return np.random.default_rng(21).standard_normal(shape).astype(dtype)


@functools.lru_cache(maxsize=None)
def _q(fmt="fp8_channel", layout="rowmajor", shape=(4, 32)):
  return jax_gmma.quantize(_x(shape), fmt, layout=layout)


def _qa(fmt="fp8_channel", layout="rowmajor", base=(4, 32), **change):
  """QuantizedArray(...) from the fields of a valid quantized operand (of shape ``base``) with
  some fields changed; built when called."""
  def call():
    swizzled = layout == SW and jax_gmma.FORMATS[fmt].scale_dtype.itemsize == 1
    q = _q(fmt, SW if swizzled else "rowmajor", base)
    f = dict(data=q.data, scales=q.scales, global_scale=q.global_scale, format=fmt,
             shape=q.shape, axis=q.axis, dtype=q.dtype, layout=layout)
    f.update({k: v() if isinstance(v, types.FunctionType) else v for k, v in change.items()})
    return jax_gmma.QuantizedArray(f.pop("data"), f.pop("scales"), f.pop("global_scale"), **f)
  return call


def _stacked():
  qs = [_q("mxfp8"), _q("mxfp8")]
  return jax.tree.map(lambda *l: jnp.stack(l), *qs)


CASES = {
  # -- QuantizedArray(...) -------------------------------------------------------------------
  "qa-shape-mismatch": Case(_qa(shape=(4, 64)), ValueError, (QA, "data", "shape")),
  "qa-axis-mismatch": Case(_qa(axis=0), ValueError, (QA, "data", "shape")),
  "qa-shape-empty": Case(_qa(shape=(4, 0)), ValueError, (QA, "shape", ">= 1")),
  "qa-shape-rank": Case(_qa("mxfp8", shape=(32,)), ValueError, (QA, "shape", "at least 2")),
  "qa-shape-type": Case(_qa(shape="4x32"), TypeError, (QA, "shape", "tuple of ints")),
  "qa-axis-type": Case(_qa(axis=1.0), TypeError, (QA, "axis", "must be an int")),
  "qa-axis-range": Case(_qa(axis=2), ValueError, (QA, "axis", "out of range")),
  "qa-format-unknown": Case(_qa(format="fp9"), ValueError, (QA, "format", "unknown format")),
  "qa-format-type": Case(_qa(format=8), TypeError, (QA, "format", "format name")),
  "qa-dtype-format": Case(_qa(dtype=jnp.int8), ValueError, (QA, "dtype", "must be one of")),
  "qa-data-not-array": Case(_qa(data=[[0.0] * 32] * 4), TypeError,
                            (QA, "data", "must be an array")),
  "qa-data-dtype": Case(_qa(data=np.zeros((4, 32), jnp.float32)), TypeError,
                        (QA, "data", "float8_e4m3fn", "fp8_channel")),
  "qa-data-container": Case(_qa("mxfp6_e2m3", data=np.zeros((4, 32), jnp.float8_e5m2)),
                            TypeError, (QA, "data", "container", "float6_e2m3fn")),
  "qa-scales-dtype": Case(_qa("mxfp8", scales=np.ones((4, 1), jnp.float32)), TypeError,
                          (QA, "scales", "float8_e8m0fnu", "mxfp8")),
  "qa-scales-broadcast": Case(_qa(scales=np.ones((1, 1), jnp.float32)), ValueError,
                              (QA, "scales", "shape", "(4, 1)")),
  "qa-scales-blocks": Case(_qa("fp8_1x128", base=(4, 300), scales=np.ones((4, 2), jnp.float32)),
                           ValueError, (QA, "scales", "shape", "(4, 3)")),
  "qa-scales-layout": Case(_qa("mxfp8", layout=SW, scales=lambda: _q("mxfp8").scales), ValueError,
                           (QA, "scales", "shape", SW)),
  "qa-global-missing": Case(_qa("nvfp4", global_scale=None), ValueError,
                            (QA, "global_scale", "needs")),
  "qa-global-extra": Case(_qa("mxfp8", global_scale=np.float32(1)), ValueError,
                          (QA, "global_scale", "has no")),
  "qa-global-dtype": Case(_qa("nvfp4", global_scale=np.asarray(1, jnp.bfloat16)), TypeError,
                          (QA, "global_scale", "float32 scalar")),
  "qa-global-shape": Case(_qa("nvfp4", global_scale=np.ones((1,), jnp.float32)), ValueError,
                          (QA, "global_scale", "float32 scalar", "shape ()")),
  "qa-layout-format": Case(_qa(layout=SW), ValueError, (QA, "layout", "only for block-scaled")),
  "qa-layout-unknown": Case(_qa(layout="tiled"), ValueError, (QA, "layout", "must be")),

  # -- quantize / quantize_parts -------------------------------------------------------------
  "quantize-x-int": Case(lambda: jax_gmma.quantize(np.ones((4, 32), np.int32)), TypeError,
                         (Q, "x", "floating")),
  "quantize-x-bool": Case(lambda: jax_gmma.quantize(np.ones((4, 32), bool)), TypeError,
                          (Q, "x", "floating")),
  "quantize-x-complex": Case(lambda: jax_gmma.quantize(np.ones((4, 32), np.complex64)),
                             TypeError, (Q, "x", "floating")),
  "quantize-x-quantized": Case(lambda: jax_gmma.quantize(_q()), TypeError,
                               (Q, "x", "already a QuantizedArray")),
  "quantize-x-empty": Case(lambda: jax_gmma.quantize(np.ones((0, 32), np.float32)), ValueError,
                           (Q, "x", "non-empty")),
  "quantize-k-empty": Case(lambda: jax_gmma.quantize(np.ones((4, 0), np.float32)), ValueError,
                           (Q, "K", "x.shape[1]", ">= 1")),
  "quantize-x-rank": Case(lambda: jax_gmma.quantize(_x((32,)), "mxfp8"), ValueError,
                          (Q, "x", "at least 2 dimensions")),
  "quantize-axis-range": Case(lambda: jax_gmma.quantize(_x(), "fp8_channel", axis=2), ValueError,
                              (Q, "axis", "out of range")),
  "quantize-axis-type": Case(lambda: jax_gmma.quantize(_x(), "fp8_channel", axis=None), TypeError,
                             (Q, "axis", "must be an int")),
  "quantize-format-unknown": Case(lambda: jax_gmma.quantize(_x(), "fp9"), ValueError,
                                  (Q, "format", "unknown format")),
  "quantize-format-type": Case(lambda: jax_gmma.quantize(_x(), 8), TypeError,
                               (Q, "format", "format name")),
  "quantize-dtype-format": Case(lambda: jax_gmma.quantize(_x(), "nvfp4",
                                                          dtype=jnp.float8_e4m3fn),
                                ValueError, (Q, "dtype", "must be one of")),
  "quantize-layout-format": Case(lambda: jax_gmma.quantize(_x(), "fp8_channel", layout=SW),
                                 ValueError, (Q, "layout", "only for block-scaled")),
  "quantize-layout-unknown": Case(lambda: jax_gmma.quantize(_x(), "mxfp8", layout="tiled"),
                                  ValueError, (Q, "layout", "must be")),
  "quantize-parts-x-int": Case(lambda: quantize_parts(np.ones((4, 32), np.int32)), TypeError,
                               ("jax_gmma.ops.quantize.quantize_parts", "x", "floating")),

  # -- dequantize / to_layout ----------------------------------------------------------------
  "dequantize-q-type": Case(lambda: jax_gmma.dequantize(_x()), TypeError,
                            ("jax_gmma.dequantize", "q", "QuantizedArray")),
  "dequantize-dtype": Case(lambda: jax_gmma.dequantize(_q(), jnp.int32), TypeError,
                           ("jax_gmma.dequantize", "dtype", "floating")),
  "dequantize-stacked": Case(lambda: jax_gmma.dequantize(_stacked()), ValueError,
                             ("jax_gmma.dequantize", "data", "extra leading", "jax.vmap")),
  "to-layout-q-type": Case(lambda: to_layout(_x(), SW), TypeError,
                           ("jax_gmma.arrays.to_layout", "q", "QuantizedArray")),
  "to-layout-format": Case(lambda: to_layout(_q(), SW), ValueError,
                           ("jax_gmma.arrays.to_layout", "layout", "only for block-scaled")),
  "to-layout-unknown": Case(lambda: to_layout(_q("mxfp8"), "tiled"), ValueError,
                            ("jax_gmma.arrays.to_layout", "layout", "unknown")),
  "to-layout-stacked": Case(lambda: to_layout(_stacked(), SW), ValueError,
                            ("jax_gmma.arrays.to_layout", "data", "jax.vmap")),
}
