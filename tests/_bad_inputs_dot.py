"""Bad inputs of the GEMMs on QuantizedArrays: ``jax_gmma.dot`` (QuantizedArray weights),
``scaled_matmul``, ``fp8_gemm``, ``blockwise_gemm``, ``mx_gemm`` and ``fp8_linear``. Every case
is refused at trace time, before anything runs; huge shapes are given abstractly
(``jax.ShapeDtypeStruct`` under ``jax.eval_shape``), so nothing is allocated."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _bad_inputs import Case

K, N = 256, 128
SW = "sm100_128x4"


@functools.lru_cache(maxsize=None)
def _w(fmt="fp8_channel", layout="rowmajor", n=N, k=K, dtype=None):
  x = np.random.default_rng(11).standard_normal((n, k)).astype(np.float32)
  return jax_gmma.quantize(x, fmt, layout=layout, dtype=dtype)


def _x(shape=(4, K), dtype=np.float32):
  return (np.random.default_rng(12).standard_normal(shape) * 3).astype(dtype)


def _f8(shape, dtype=jnp.float8_e4m3fn):
  return jnp.asarray(np.random.default_rng(13).standard_normal(shape), jnp.float32).astype(dtype)


def _abstract(fn, *shapes_dtypes):
  """fn on abstract arguments: shape rules only, nothing allocated."""
  return lambda: jax.eval_shape(fn, *[jax.ShapeDtypeStruct(s, d) for s, d in shapes_dtypes])


def _rebuilt(q, **leaves):
  """q with some leaves replaced (a pytree rebuilt without QuantizedArray's checks)."""
  children, tree = jax.tree_util.tree_flatten(q, is_leaf=lambda v: v is None)
  names = ("data", "scales", "global_scale")
  children = [leaves.get(nm, c) for nm, c in zip(names, children)]
  return jax.tree_util.tree_unflatten(tree, children)


def _dot(x, w, **kw):
  return lambda: jax_gmma.dot(x, w, **kw)


def _sm(lhs, rhs, ls, rs, **kw):
  return lambda: jax_gmma.scaled_matmul(lhs, rhs, ls, rs, **kw)


_MX_A = lambda: _w("mxfp8", SW, n=16)  # noqa: E731
_MX_B = lambda: _w("mxfp8", SW)  # noqa: E731
_FP8_SM = lambda: (_f8((2, 16, K)), _f8((2, 32, K)), jnp.ones((2, 16, 2)), jnp.ones((2, 32, 2)))  # noqa: E731

CASES = {
    # -- jax_gmma.dot on QuantizedArray weights -------------------------------------------------
    "dot-int-x": Case(_dot(_x(dtype=np.int32), _w()), TypeError, ("jax_gmma.dot", "x", "floating")),
    "dot-bool-x": Case(_dot(_x(dtype=np.bool_), _w()), TypeError, ("jax_gmma.dot", "x", "floating")),
    "dot-complex-x": Case(_dot(_x(dtype=np.complex64), _w()), TypeError, ("jax_gmma.dot", "x", "floating")),
    "dot-fp8-x-array": Case(_dot(_f8((4, K)), _w()), TypeError, ("jax_gmma.dot", "x", "QuantizedArray")),
    "dot-scalar-x": Case(_dot(np.float32(1.0), _w()), ValueError, ("jax_gmma.dot", "x", "rank")),
    "dot-k-mismatch": Case(_dot(_x((4, K - 16)), _w()), ValueError, ("jax_gmma.dot", "x", "contraction")),
    "dot-int-bias": Case(_dot(_x(), _w(), bias=np.ones(N, np.int32)), TypeError,
                         ("jax_gmma.dot", "bias", "floating")),
    "dot-complex-bias": Case(_dot(_x(), _w(), bias=np.ones(N, np.complex64)), TypeError,
                             ("jax_gmma.dot", "bias", "floating")),
    "dot-bias-shape": Case(_dot(_x(), _w(), bias=np.ones(N + 8, np.float32)), ValueError,
                           ("jax_gmma.dot", "bias", "shape")),
    "dot-int-out-dtype": Case(_dot(_x(), _w(), out_dtype=jnp.int32), TypeError,
                              ("jax_gmma.dot", "out_dtype", "floating")),
    "dot-unknown-out-dtype": Case(_dot(_x(), _w(), out_dtype="float7"), TypeError,
                                  ("jax_gmma.dot", "out_dtype", "one of")),
    "dot-complex-scales": Case(_dot(_x(), _rebuilt(_w(), scales=jnp.ones((N, 1), jnp.complex64))), TypeError,
                               ("jax_gmma.dot", "w: scales", "float32")),
    "dot-scales-shape": Case(_dot(_x(), _rebuilt(_w(), scales=jnp.ones((N // 2, 1), jnp.float32))), ValueError,
                             ("jax_gmma.dot", "w: scales", "shape")),
    "dot-data-dtype": Case(_dot(_x(), _rebuilt(_w(), data=jnp.ones((N, K), jnp.int8))), TypeError,
                           ("jax_gmma.dot", "w: data", "float8_e4m3fn")),
    "dot-not-quantized-w": Case(_dot(_x(), np.ones((N, K), np.float32)), TypeError,
                                ("jax_gmma.dot", "w", "QuantizedArray")),
    "dot-w-3d": Case(lambda: jax_gmma.dot(_x((2, K)), jax_gmma.quantize(_x((2, N, K)), "fp8_tensor")),
                     ValueError, ("jax_gmma.dot", "w", "2-D")),
    "dot-e5m2-w": Case(_dot(_x(), _w(dtype=jnp.float8_e5m2)), TypeError, ("jax_gmma.dot", "w", "float8_e4m3fn")),
    "dot-k-align": Case(_dot(_x((4, 40)), _w(k=40)), ValueError, ("jax_gmma.dot", "K", "multiple of 16")),
    "dot-n-align": Case(_dot(_x(), _w(n=12)), ValueError, ("jax_gmma.dot", "N", "multiple of 8")),
    "dot-blockwise-n-align": Case(_dot(_x(), _w("fp8_128x128", n=12)), ValueError,
                                  ("jax_gmma.dot", "N", "multiple of 8")),
    "dot-mx-n-align": Case(_dot(_x(), _w("mxfp8", SW, n=12), out_dtype=jnp.bfloat16), ValueError, ("jax_gmma.dot", "N", "multiple of 8")),
    "dot-mx-k-align": Case(_dot(_x((4, 64)), _w("mxfp6_e2m3", SW, k=64)), ValueError,
                           ("jax_gmma.dot", "K", "multiple of 128")),
    "dot-x-format": Case(_dot(_x(), _w(), x_format="fp8_1x64"), ValueError, ("jax_gmma.dot", "x_format", "one of")),
    "dot-mx-x-format": Case(_dot(_x(), _w("mxfp8", SW), x_format="fp8_tensor"), ValueError,
                            ("jax_gmma.dot", "x_format", "one of")),
    "dot-x-format-type": Case(_dot(_x(), _w(), x_format=3), TypeError, ("jax_gmma.dot", "x_format", "str")),
    "dot-x-quantized-format": Case(_dot(jax_gmma.quantize(_x(), "fp8_1x128"), _w()), ValueError,
                                   ("jax_gmma.dot", "x", "format")),
    "dot-nvfp4-x-mx-w": Case(_dot(jax_gmma.quantize(_x(), "nvfp4", layout=SW), _w("mxfp8", SW)), ValueError,
                             ("jax_gmma.dot", "x", "nvfp4")),
    "dot-unknown-config": Case(_dot(_x(), _w(), config="no_such_tile"), ValueError,
                               ("jax_gmma.dot", "config", "one of")),
    "dot-mx-unknown-config": Case(_dot(_x(), _w("mxfp8", SW), config="no_such_tile"), ValueError,
                                  ("jax_gmma.dot", "config", "MX kernel config")),
    "dot-negative-splits": Case(_dot(_x(), _w(), splits=-1), ValueError, ("jax_gmma.dot", "splits", ">= 0")),
    "dot-float-splits": Case(_dot(_x(), _w(), splits=2.0), TypeError, ("jax_gmma.dot", "splits", "int")),
    "dot-splits-no-streamk": Case(_dot(_x(), _w(), config="128x192x128_c2x1_coop_2lvl", splits=2), ValueError,
                                  ("jax_gmma.dot", "splits", "stream-K")),
    "dot-mx-splits": Case(_dot(_x(), _w("mxfp8", SW), splits=2), ValueError, ("jax_gmma.dot", "splits", "no K split")),
    "dot-huge-m": Case(_abstract(lambda x: jax_gmma.dot(x, _w()), ((2**31, K), jnp.bfloat16)), ValueError,
                       ("jax_gmma.dot", "M", "2**31")),
    "dot-huge-m-batched": Case(_abstract(lambda x: jax_gmma.dot(x, _w("fp8_128x128")),
                                         ((2**16, 2**15, K), jnp.bfloat16)), ValueError,
                               ("jax_gmma.dot", "M", "2**31")),
    # -- scaled_matmul ----------------------------------------------------------------------------
    "scaled-matmul-int-lhs": Case(lambda: jax_gmma.scaled_matmul(jnp.ones((1, 16, K), jnp.int8), *_FP8_SM()[1:]),
                                  TypeError, ("jax_gmma.scaled_matmul", "lhs", "floating")),
    "scaled-matmul-complex-scales": Case(lambda: jax_gmma.scaled_matmul(*_FP8_SM()[:3],
                                                                        jnp.ones((2, 32, 2), jnp.complex64)),
                                         TypeError, ("jax_gmma.scaled_matmul", "rhs_scales", "floating")),
    "scaled-matmul-int-out": Case(lambda: jax_gmma.scaled_matmul(*_FP8_SM(), preferred_element_type=jnp.int32),
                                  TypeError, ("jax_gmma.scaled_matmul", "preferred_element_type", "floating")),
    "scaled-matmul-rank": Case(lambda: jax_gmma.scaled_matmul(*(a[0] for a in _FP8_SM())), ValueError,
                               ("jax_gmma.scaled_matmul", "lhs", "3-dimensional")),
    "scaled-matmul-k-mismatch": Case(lambda: jax_gmma.scaled_matmul(_f8((2, 16, K)), _f8((2, 32, K + 128)),
                                                                    *_FP8_SM()[2:]),
                                     ValueError, ("jax_gmma.scaled_matmul", "rhs", "contraction")),
    "scaled-matmul-zero-k": Case(lambda: jax_gmma.scaled_matmul(_f8((2, 16, 0)), _f8((2, 32, 0)),
                                                                jnp.ones((2, 16, 0)), jnp.ones((2, 32, 0))),
                                 ValueError, ("jax_gmma.scaled_matmul", "K", ">= 1")),
    "scaled-matmul-block": Case(lambda: jax_gmma.scaled_matmul(*_FP8_SM()[:2], jnp.ones((2, 16, 4)),
                                                               jnp.ones((2, 32, 4))),
                                ValueError, ("jax_gmma.scaled_matmul", "block size 64", "allow_reference")),
    "scaled-matmul-huge": Case(_abstract(lambda a, b, sa, sb: jax_gmma.scaled_matmul(a, b, sa, sb),
                                         ((2**16, 2**15, K), jnp.float8_e4m3fn), ((2**16, 32, K), jnp.float8_e4m3fn),
                                         ((2**16, 2**15, 2), jnp.float32), ((2**16, 32, 2), jnp.float32)),
                               ValueError, ("jax_gmma.scaled_matmul", "B*M", "2**31")),
    # -- fp8_gemm -----------------------------------------------------------------------------------
    "fp8-gemm-int-a": Case(lambda: jax_gmma.fp8_gemm(jnp.ones((4, K), jnp.int8), _f8((N, K))), TypeError,
                           ("jax_gmma.fp8_gemm", "a", "float8")),
    "fp8-gemm-complex-scale": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((), jnp.complex64)),
                                   TypeError, ("jax_gmma.fp8_gemm", "a_scale", "floating")),
    "fp8-gemm-int-bias": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K)), bias=jnp.ones(N, jnp.int32)),
                              TypeError, ("jax_gmma.fp8_gemm", "bias", "floating")),
    "fp8-gemm-int-out": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K)), out_dtype=jnp.int8), TypeError,
                             ("jax_gmma.fp8_gemm", "out_dtype", "floating")),
    "fp8-gemm-k-mismatch": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K + 16))), ValueError,
                                ("jax_gmma.fp8_gemm", "b.shape[1]", "contraction")),
    "fp8-gemm-zero-m": Case(lambda: jax_gmma.fp8_gemm(_f8((0, K)), _f8((N, K))), ValueError,
                            ("jax_gmma.fp8_gemm", "a", "zero-size")),
    "fp8-gemm-rank": Case(lambda: jax_gmma.fp8_gemm(_f8((K,)), _f8((N, K))), ValueError,
                          ("jax_gmma.fp8_gemm", "a", "rank")),
    "fp8-gemm-unknown-config": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K)), config="nope"),
                                    ValueError, ("jax_gmma.fp8_gemm", "config", "one of")),
    "fp8-gemm-splits": Case(lambda: jax_gmma.fp8_gemm(_f8((4, K)), _f8((N, K)), splits=-2), ValueError,
                            ("jax_gmma.fp8_gemm", "splits", ">= 0")),
    "fp8-gemm-huge": Case(_abstract(lambda a, b: jax_gmma.fp8_gemm(a, b), ((2**31, K), jnp.float8_e4m3fn),
                                    ((N, K), jnp.float8_e4m3fn)), ValueError, ("jax_gmma.fp8_gemm", "M=", "2**31")),
    # -- blockwise_gemm -----------------------------------------------------------------------------
    "blockwise-gemm-complex-bias": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((4, 2)),
                                                                        jnp.ones((1, 2)), bias=jnp.ones(N, jnp.complex64)),
                                        TypeError, ("jax_gmma.blockwise_gemm", "bias", "floating")),
    "blockwise-gemm-int-out": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((4, 2)),
                                                                   jnp.ones((1, 2)), out_dtype=jnp.int32),
                                   TypeError, ("jax_gmma.blockwise_gemm", "out_dtype", "floating")),
    "blockwise-gemm-bf16-scales": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)),
                                                                       jnp.ones((4, 2), jnp.bfloat16), jnp.ones((1, 2))),
                                       TypeError, ("jax_gmma.blockwise_gemm", "a_scales", "float32")),
    "blockwise-gemm-scales-shape": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((4, 3)),
                                                                        jnp.ones((1, 2))),
                                        ValueError, ("jax_gmma.blockwise_gemm", "a_scales", "shape")),
    "blockwise-gemm-e5m2": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K), jnp.float8_e5m2), _f8((N, K)),
                                                                jnp.ones((4, 2)), jnp.ones((1, 2))),
                                TypeError, ("jax_gmma.blockwise_gemm", "a", "float8_e4m3fn")),
    "blockwise-gemm-unknown-config": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((4, 2)),
                                                                          jnp.ones((1, 2)), config="nope"),
                                          ValueError, ("jax_gmma.blockwise_gemm", "config", "one of")),
    "blockwise-gemm-splits": Case(lambda: jax_gmma.blockwise_gemm(_f8((4, K)), _f8((N, K)), jnp.ones((4, 2)),
                                                                  jnp.ones((1, 2)), splits="2"),
                                  TypeError, ("jax_gmma.blockwise_gemm", "splits", "int")),
    # -- mx_gemm ----------------------------------------------------------------------------------
    "mx-gemm-not-quantized": Case(lambda: jax_gmma.mx_gemm(np.zeros((16, K), np.float32), _MX_B()), TypeError,
                                  ("jax_gmma.mx_gemm", "a_q", "QuantizedArray")),
    "mx-gemm-rowmajor": Case(lambda: jax_gmma.mx_gemm(_w("mxfp8", n=16), _MX_B()), ValueError,
                             ("jax_gmma.mx_gemm", "a_q", "layout")),
    "mx-gemm-int-bias": Case(lambda: jax_gmma.mx_gemm(_MX_A(), _MX_B(), bias=jnp.ones(N, jnp.int32)), TypeError,
                             ("jax_gmma.mx_gemm", "bias", "floating")),
    "mx-gemm-int-out": Case(lambda: jax_gmma.mx_gemm(_MX_A(), _MX_B(), out_dtype=jnp.int32), TypeError,
                            ("jax_gmma.mx_gemm", "out_dtype", "floating")),
    "mx-gemm-k-mismatch": Case(lambda: jax_gmma.mx_gemm(_w("mxfp8", SW, n=16, k=128), _MX_B()), ValueError,
                               ("jax_gmma.mx_gemm", "a_q", "contraction")),
    "mx-gemm-nvfp4-with-mx": Case(lambda: jax_gmma.mx_gemm(_w("nvfp4", SW, n=16), _MX_B()), ValueError,
                                  ("jax_gmma.mx_gemm", "b_q", "nvfp4")),
    "mx-gemm-unknown-config": Case(lambda: jax_gmma.mx_gemm(_MX_A(), _MX_B(), config="nope"), ValueError,
                                   ("jax_gmma.mx_gemm", "config", "MX kernel config")),
    "mx-gemm-path": Case(lambda: jax_gmma.mx_gemm(_MX_A(), _MX_B(), path="fast"), ValueError,
                         ("jax_gmma.mx_gemm", "path", "one of")),
    # -- fp8_linear -------------------------------------------------------------------------------
    "fp8-linear-int-x": Case(lambda: jax_gmma.fp8_linear(jnp.ones((4, K), jnp.int32), _x((N, K))), TypeError,
                             ("jax_gmma.fp8_linear", "x", "float")),
    "fp8-linear-complex-bias": Case(lambda: jax_gmma.fp8_linear(_x((4, K)), _x((N, K)),
                                                                jnp.ones(N, jnp.complex64)),
                                    TypeError, ("jax_gmma.fp8_linear", "bias", "floating")),
    "fp8-linear-int-out": Case(lambda: jax_gmma.fp8_linear(_x((4, K)), _x((N, K)), out_dtype=jnp.int8), TypeError,
                               ("jax_gmma.fp8_linear", "out_dtype", "floating")),
    "fp8-linear-k-mismatch": Case(lambda: jax_gmma.fp8_linear(_x((4, K + 16)), _x((N, K))), ValueError,
                                  ("jax_gmma.fp8_linear", "x", "K")),
    "fp8-linear-recipe": Case(lambda: jax_gmma.fp8_linear(_x((4, K)), _x((N, K)), recipe="mx"), ValueError,
                              ("jax_gmma.fp8_linear", "recipe", "one of")),
    "fp8-linear-blockwise-align": Case(lambda: jax_gmma.fp8_linear(_x((4, 64)), _x((N, 64)), recipe="blockwise"),
                                       ValueError, ("jax_gmma.fp8_linear", "recipe='blockwise'", "multiples of 128")),
    "fp8-linear-huge": Case(_abstract(lambda x, w: jax_gmma.fp8_linear(x, w), ((2**31, K), jnp.bfloat16),
                                      ((N, K), jnp.bfloat16)), ValueError, ("jax_gmma.fp8_linear", "x", "2**31")),
}
