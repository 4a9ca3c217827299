"""Bad inputs of the grouped GEMM ``jax_gmma.ragged_dot`` (mixture-of-experts): the cases of the
"Grouped GEMM" table of docs/bad-inputs.md. Every case is refused at trace time, before anything
runs; the huge shape is given abstractly (``jax.ShapeDtypeStruct`` under ``jax.eval_shape``)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _bad_inputs import Case

G, N, K, M = 3, 32, 128, 8
RD = "jax_gmma.ragged_dot:"
SIZES = np.asarray([3, 0, 4], np.int32)


@functools.lru_cache(maxsize=None)
def _wf(g=G, n=N, k=K):
  return np.random.default_rng(21).standard_normal((g, n, k)).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _w(fmt="fp8_channel", n=N, k=K, dtype=None):
  """(G, N, K) expert weights quantized to ``fmt`` (one set of scales per expert)."""
  return jax_gmma.quantize(_wf(n=n, k=k), fmt, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _packed(fmt="nvfp4"):
  return jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(_wf())


def _x(shape=(M, K), dtype=np.float32):
  return (np.random.default_rng(22).standard_normal(shape) * 3).astype(dtype)


def _rd(x, w, sizes=SIZES, **kw):
  return lambda: jax_gmma.ragged_dot(x, w, sizes, **kw)


def _short_scales():
  """fp8_tensor experts stacked with jax.vmap, their scales cut to 2 experts (rebuilt from
  leaves, so QuantizedArray's own checks do not run)."""
  stacked = jax.vmap(lambda e: jax_gmma.quantize(e, "fp8_tensor"))(_wf())
  children, tree = jax.tree_util.tree_flatten(stacked, is_leaf=lambda v: v is None)
  return jax.tree_util.tree_unflatten(tree, [children[0], children[1][:2], children[2]])


def _short_packed():
  wp = _packed()
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(wp),
                                      [wp.packed, wp.scales[:2], wp.global_scale])


CASES = {
    # -- x ----------------------------------------------------------------------------------------
    "rd-x-rank": Case(_rd(_x((1, M, K)), _w()), ValueError, (RD, "x must be (M, K)", "rank 2")),
    "rd-x-int": Case(_rd(_x(dtype=np.int32), _w()), TypeError, (RD, "x must be a floating array", "int32")),
    "rd-x-complex": Case(_rd(_x(dtype=np.complex64), _w()), TypeError,
                         (RD, "x must be a floating array", "complex64")),
    "rd-x-k": Case(_rd(_x((M, K - 16)), _w()), ValueError, (RD, "contraction mismatch", "x.shape[1] = 112")),
    "rd-x-huge-m": Case(lambda: jax.eval_shape(lambda x: jax_gmma.ragged_dot(x, _w(), SIZES),
                                               jax.ShapeDtypeStruct((2**31, K), jnp.bfloat16)),
                        ValueError, (RD, "x's rows M", "2**31")),
    "rd-x-format": Case(_rd(_x(), _w(), x_format="mxfp8"), ValueError, (RD, "x_format", "fp8_channel")),
    "rd-x-format-type": Case(_rd(_x(), _w(), x_format=3), TypeError, (RD, "x_format", "str")),
    "rd-x-format-packed": Case(_rd(_x(), _packed(), x_format="fp8_channel"), ValueError,
                               (RD, "x_format", "('bf16',)")),
    "rd-x-quantized-format": Case(_rd(jax_gmma.quantize(_x(), "fp8_1x128"), _w()), ValueError,
                                  (RD, "x has format 'fp8_1x128'", "fp8_channel")),
    "rd-x-quantized-x-format": Case(_rd(jax_gmma.quantize(_x(), "fp8_channel"), _w(), x_format="fp8_tensor"),
                                    ValueError, (RD, "x_format applies to a float x")),
    "rd-x-quantized-e5m2": Case(_rd(jax_gmma.quantize(_x(), "fp8_1x128", dtype=jnp.float8_e5m2),
                                    _w("fp8_128x128")), TypeError,
                                (RD, "x must have float8_e4m3fn elements", "float8_e5m2")),
    "rd-x-quantized-rank": Case(_rd(jax_gmma.quantize(_x((2, M, K)), "fp8_channel"), _w()), ValueError,
                                (RD, "x must be an (M, K) operand", "rank 2")),
    "rd-x-quantized-k": Case(_rd(jax_gmma.quantize(_x((M, 2 * K)), "fp8_channel"), _w()), ValueError,
                             (RD, "contraction mismatch", "x has K=256")),
    # -- w ----------------------------------------------------------------------------------------
    "rd-w-float": Case(_rd(_x(), _wf()), TypeError, (RD, "w must be the stacked expert weights", "ndarray")),
    "rd-w-2d": Case(_rd(_x(), jax_gmma.quantize(_wf()[0], "fp8_channel")), ValueError,
                    (RD, "w must be the stacked expert weights (G, N, K)")),
    "rd-w-tensor-3d": Case(_rd(_x(), _w("fp8_tensor")), ValueError,
                           (RD, "fp8_tensor", "one scale for all experts", "jax.vmap")),
    "rd-w-fp4-x-format": Case(_rd(jax_gmma.quantize(_x(), "mxfp8"), _w("nvfp4")), ValueError,
                              (RD, "x has format 'mxfp8'", "nvfp4 expert weights", "use nvfp4")),
    "rd-w-fp6-quantized": Case(_rd(_x(), _w("mxfp6_e2m3")), ValueError,
                               (RD, "w has format 'mxfp6_e2m3'", "PackedWeight")),
    "rd-w-leading-axis": Case(_rd(_x(), _short_scales()), ValueError, (RD, "w.scales", "leading expert axis (3,)")),
    "rd-w-packed-one": Case(_rd(_x(), jax_gmma.weightonly.prepare(_wf()[0], "nvfp4")), ValueError,
                            (RD, "PackedWeight of G experts", "(G, N, K) experts")),
    "rd-w-packed-leading-axis": Case(_rd(_x(), _short_packed()), ValueError,
                                     (RD, "w.scales", "leading expert axis (3,)")),
    "rd-w-e5m2": Case(_rd(_x(), _w(dtype=jnp.float8_e5m2)), TypeError, (RD, "w must have float8_e4m3fn")),
    "rd-w-n-align": Case(_rd(_x(), _w(n=20)), ValueError, (RD, "N (w's rows)", "multiple of 8", "got 20")),
    "rd-w-k-align": Case(_rd(_x((M, 40)), _w("fp8_1x128", k=40)), ValueError, (RD, "K", "multiple of 16", "got 40")),
    "rd-w-empty-list": Case(_rd(_x(), []), ValueError, (RD, "at least one expert")),
    "rd-w-list-kinds": Case(_rd(_x(), [jax_gmma.quantize(_wf()[0], "fp8_channel"),
                                       jax_gmma.weightonly.prepare(_wf()[1], "nvfp4")], SIZES[:2]),
                            TypeError, (RD, "only QuantizedArrays or only PackedWeights")),
    "rd-w-list-mixed": Case(_rd(_x(), [jax_gmma.quantize(_wf()[0], "fp8_channel"),
                                       jax_gmma.quantize(_wf()[1], "fp8_1x128")], SIZES[:2]),
                            ValueError, (RD, "experts in w must share format")),
    "rd-w-list-3d": Case(_rd(_x(), [_w()]), ValueError, (RD, "w[0] must be an (N, K) expert weight")),
    # -- group_sizes ------------------------------------------------------------------------------
    "rd-sizes-float": Case(_rd(_x(), _w(), SIZES.astype(np.float32)), TypeError,
                           (RD, "group_sizes must be an integer", "float32")),
    "rd-sizes-bool": Case(_rd(_x(), _w(), SIZES > 0), TypeError, (RD, "group_sizes must be an integer", "bool")),
    "rd-sizes-none": Case(_rd(_x(), _w(), None), TypeError, (RD, "group_sizes must be an integer", "NoneType")),
    "rd-sizes-g": Case(_rd(_x(), _w(), SIZES[:2]), ValueError,
                       (RD, "group_sizes must have shape (G,) = (3,)", "got shape (2,)")),
    "rd-sizes-rank": Case(_rd(_x(), _w(), SIZES[None]), ValueError,
                          (RD, "group_sizes must have shape (G,)", "got shape (1, 3)")),
    # -- bias, out_dtype, group_offset ------------------------------------------------------------
    "rd-bias-shape": Case(_rd(_x(), _w(), bias=np.zeros(N, np.float32)), ValueError,
                          (RD, "bias must have shape (G, N) = (3, 32)")),
    "rd-bias-int": Case(_rd(_x(), _w(), bias=np.zeros((G, N), np.int32)), TypeError,
                        (RD, "bias must be floating point", "int32")),
    "rd-bias-complex": Case(_rd(_x(), _w(), bias=np.zeros((G, N), np.complex64)), TypeError,
                            (RD, "bias must be floating point", "complex64")),
    "rd-out-dtype-int": Case(_rd(_x(), _w(), out_dtype=jnp.int32), TypeError, (RD, "out_dtype", "int32")),
    "rd-out-dtype-unknown": Case(_rd(_x(), _w(), out_dtype="float7"), TypeError, (RD, "out_dtype", "'float7'")),
    "rd-group-offset": Case(_rd(_x(), _w(), group_offset=jnp.zeros((1,), jnp.int32)), NotImplementedError,
                            (RD, "group_offset must be None")),
}
