"""Bad inputs of the weight-only family (PackedWeight, prepare, weightonly_gemm, unpack, dot with a
PackedWeight): the cases of the "Weight-only" table of docs/bad-inputs.md."""
import jax
import jax.export
import jax.numpy as jnp
import numpy as np

import jax_gmma
from _bad_inputs import Case
from jax_gmma.ops import weightonly as wo

_W = np.linspace(-3, 3, 32 * 128, dtype=np.float32).reshape(32, 128)
_W64 = np.linspace(-3, 3, 64 * 128, dtype=np.float32).reshape(64, 128)  # N = 64: a tensor-core row block


def _wp(fmt="nvfp4"):
  return wo.prepare(_W, fmt)


def _x(shape=(2, 128), dtype=jnp.bfloat16):
  return jnp.ones(shape, dtype)


def _pw(**change):
  wp = _wp("mxfp4")
  args = dict(packed=wp.packed, scales=wp.scales, global_scale=wp.global_scale, format="mxfp4",
              n=32, k=128)
  args.update(change)
  return wo.PackedWeight(args.pop("packed"), args.pop("scales"), args.pop("global_scale"), **args)


def _wide_mx():
  w = np.full((16, 64), 2.0 ** 15, np.float32)
  w[0, :32] = 2.0 ** -124
  return wo.prepare(w, "mxfp6_e2m3")


def _off_grid():
  q = jax_gmma.quantize(_W[:16, :64], "mxfp6_e2m3")
  leaves, tree = jax.tree_util.tree_flatten(q)
  data = np.asarray(q.data, np.float32)
  data[0, 0] = 0.3
  return wo.prepare(jax.tree_util.tree_unflatten(tree, [jnp.asarray(data, q.data.dtype), q.scales]))


P, G, D, PW = ("jax_gmma.weightonly.prepare", "jax_gmma.weightonly_gemm", "jax_gmma.dot",
               "jax_gmma.PackedWeight")

CASES = {
    "wo-prepare-int8": Case(lambda: wo.prepare(np.ones((32, 128), np.int8), "nvfp4"), TypeError,
                            (P, "w must be a float", "int8")),
    "wo-prepare-complex": Case(lambda: wo.prepare(np.ones((32, 128), np.complex64), "nvfp4"),
                               TypeError, (P, "w must be a float", "complex64")),
    "wo-prepare-rank": Case(lambda: wo.prepare(np.ones(128, np.float32), "nvfp4"), ValueError,
                            (P, "w must be a 2-D")),
    "wo-prepare-format": Case(lambda: wo.prepare(_W, "fp8_channel"), ValueError,
                              (P, "format must be one of")),
    "wo-prepare-n-multiple": Case(lambda: wo.prepare(np.ones((24, 128), np.float32), "nvfp4"),
                                  ValueError, (P, "w must have N", "multiple of 16")),
    "wo-prepare-zero-n": Case(lambda: wo.prepare(np.ones((0, 128), np.float32), "nvfp4"),
                              ValueError, (P, "w must have N", "positive")),
    "wo-prepare-zero-k": Case(lambda: wo.prepare(np.ones((32, 0), np.float32), "nvfp4"), ValueError,
                              (P, "w must have K", ">= 1")),
    "wo-prepare-huge": Case(lambda: jax.eval_shape(lambda w: wo.prepare(w, "nvfp4"),
                                                   jax.ShapeDtypeStruct((16, 2 ** 31), jnp.float32)),
                            ValueError, (P, "w must have K", "below 2^31")),
    "wo-prepare-mx-span": Case(_wide_mx, ValueError, (P, "block scales span", "binades")),
    "wo-prepare-off-grid": Case(_off_grid, ValueError, (P, "w.data", "not float6_e2m3fn numbers")),
    "wo-prepare-format-mismatch": Case(lambda: wo.prepare(jax_gmma.quantize(_W, "mxfp4"), "nvfp4"),
                                       ValueError, (P, "w is mxfp4, not nvfp4")),
    "wo-prepare-not-weightonly": Case(lambda: wo.prepare(jax_gmma.quantize(_W, "mxfp8")),
                                      ValueError, (P, "w has format", "takes")),
    "wo-packed-shape": Case(lambda: _pw(packed=_wp("mxfp4").packed[:1]), ValueError,
                            (PW, "packed must have shape", "mxfp4")),
    "wo-packed-dtype": Case(lambda: _pw(packed=_wp("mxfp4").packed.astype(jnp.int8)), TypeError,
                            (PW, "packed must be uint8")),
    "wo-packed-scales-broadcast": Case(lambda: _pw(scales=_wp("mxfp4").scales[:, :1]), ValueError,
                                       (PW, "scales must have shape", "nothing is broadcast")),
    "wo-packed-global-dtype": Case(lambda: _pw(global_scale=jnp.ones((1,), jnp.bfloat16)),
                                   TypeError, (PW, "global_scale must be float32")),
    "wo-packed-n": Case(lambda: _pw(n=0), ValueError, (PW, "n must be a positive multiple of 16")),
    "wo-packed-k": Case(lambda: _pw(k=-1), ValueError, (PW, "k must be >= 1")),
    "wo-packed-format": Case(lambda: _pw(format="mxfp8"), ValueError, (PW, "format must be one of")),
    "wo-packed-layout": Case(lambda: _pw(layout=7), ValueError, (PW, "layout must be one of")),
    "wo-packed-fp8-exact": Case(lambda: _pw(fp8_exact=1), TypeError,
                                (PW, "fp8_exact must be None, True or False")),
    "wo-gemm-x-int8": Case(lambda: jax_gmma.weightonly_gemm(_x(dtype=jnp.int8), _wp()), TypeError,
                           (G, "x must be bfloat16", "int8")),
    "wo-gemm-x-float32": Case(lambda: jax_gmma.weightonly_gemm(_x(dtype=jnp.float32), _wp()),
                              TypeError, (G, "x must be bfloat16", "float32")),
    "wo-gemm-k": Case(lambda: jax_gmma.weightonly_gemm(_x((2, 64)), _wp()), ValueError,
                      (G, "x must be (..., K)", "K = 128")),
    "wo-gemm-x-rank0": Case(lambda: jax_gmma.weightonly_gemm(jnp.ones((), jnp.bfloat16), _wp()),
                            ValueError, (G, "x must be (..., K)")),
    "wo-gemm-m-huge": Case(lambda: jax.eval_shape(lambda x: jax_gmma.weightonly_gemm(x, _wp()),
                                                  jax.ShapeDtypeStruct((2 ** 31, 128), jnp.bfloat16)),
                           ValueError, (G, "x must have fewer than 2^31 rows")),
    "wo-gemm-kernel-grid": Case(lambda: jax.eval_shape(
        lambda x: jax_gmma.weightonly_gemm(x, _wp(), path="kernel"),
        jax.ShapeDtypeStruct((2 ** 21, 128), jnp.bfloat16)), ValueError,
        (G, "path='kernel' takes at most")),
    "wo-gemm-tc-symbolic-m": Case(lambda: jax.eval_shape(
        lambda x: jax_gmma.weightonly_gemm(x, wo.prepare(_W64, "nvfp4"), rows=64, tokens=64, k_warps=8),
        jax.ShapeDtypeStruct((jax.export.symbolic_shape("m")[0], 128), jnp.bfloat16)), ValueError,
        (G, "tokens = 64 (the tensor-core kernel) needs a concrete M")),
    "wo-gemm-x-scale-complex": Case(lambda: jax_gmma.weightonly_gemm(
        _x(), _wp(), x_scale=jnp.ones(2, jnp.complex64)), TypeError, (G, "x_scale must be a float")),
    "wo-gemm-x-scale-shape": Case(lambda: jax_gmma.weightonly_gemm(
        _x((2, 3, 128)), _wp(), x_scale=jnp.ones((3, 2))), ValueError,
        (G, "x_scale must be a scalar or one scale per token")),
    "wo-gemm-bias-int": Case(lambda: jax_gmma.weightonly_gemm(_x(), _wp(), bias=jnp.ones(32, jnp.int32)),
                             TypeError, (G, "bias must be a float")),
    "wo-gemm-bias-shape": Case(lambda: jax_gmma.weightonly_gemm(_x(), _wp(), bias=jnp.ones(16)),
                               ValueError, (G, "bias must have shape (32,)")),
    "wo-gemm-out-dtype": Case(lambda: jax_gmma.weightonly_gemm(_x(), _wp(), out_dtype=jnp.int8),
                              TypeError, (G, "out_dtype must be one of")),
    "wo-gemm-w-type": Case(lambda: jax_gmma.weightonly_gemm(_x(), jax_gmma.quantize(_W, "nvfp4")),
                           TypeError, (G, "w must be a PackedWeight")),
    "wo-gemm-w-fields": Case(lambda: jax_gmma.weightonly_gemm(_x(), jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(_wp()), [_wp().packed[:1], _wp().scales, _wp().global_scale])),
        ValueError, (G, "w.packed must have shape")),
    "wo-gemm-layout": Case(lambda: jax_gmma.weightonly_gemm(_x(), wo.PackedWeight.tree_unflatten(
        ("nvfp4", 32, 128, False), (_wp().packed, _wp().scales, _wp().global_scale))), ValueError,
        (G, "layout version 1")),
    "wo-gemm-path": Case(lambda: jax_gmma.weightonly_gemm(_x(), _wp(), path="fast"), ValueError,
                         (G, "path must be one of")),
    "wo-gemm-fp8-nvfp4": Case(lambda: jax_gmma.weightonly_gemm(_x((300, 128), jnp.float8_e4m3fn),
                                                               _wp(), path="fp8"), ValueError,
                              (G, "path='fp8' takes MX weights")),
    "wo-gemm-rows": Case(lambda: jax_gmma.weightonly_gemm(_x(), _wp(), rows=48), ValueError,
                         (G, "rows must be one of")),
    "wo-dot-x-int8": Case(lambda: jax_gmma.dot(_x(dtype=jnp.int8), _wp()), TypeError,
                          (D, "x must be a float array", "int8")),
    "wo-dot-x-bool": Case(lambda: jax_gmma.dot(_x(dtype=jnp.bool_), _wp()), TypeError,
                          (D, "x must be a float array", "bool")),
    "wo-dot-x-complex": Case(lambda: jax_gmma.dot(_x(dtype=jnp.complex64), _wp()), TypeError,
                             (D, "x must be a float array", "complex64")),
    "wo-dot-bias-int": Case(lambda: jax_gmma.dot(_x(), _wp(), bias=jnp.ones(32, jnp.int32)),
                            TypeError, (D, "bias must be a float")),
    "wo-dot-bias-complex": Case(lambda: jax_gmma.dot(_x(), _wp(), bias=jnp.ones(32, jnp.complex64)),
                                TypeError, (D, "bias must be a float")),
    "wo-dot-k": Case(lambda: jax_gmma.dot(_x((2, 0)), _wp()), ValueError,
                     (D, "x must be (..., K)", "K = 128")),
    "wo-dot-x-format": Case(lambda: jax_gmma.dot(jax_gmma.quantize(_x(dtype=jnp.float32), "mxfp8"),
                                                 _wp()), ValueError, (D, "x has format", "mxfp8")),
    "wo-dot-not-differentiable": Case(lambda: jax.grad(
        lambda x: jax_gmma.weightonly_gemm(x, _wp(), out_dtype=jnp.float32).sum())(_x()),
        jax_gmma.NotDifferentiable, (G, "not differentiable")),
    "wo-unpack-dtype": Case(lambda: wo.unpack(_wp("mxfp4"), jnp.float32), TypeError,
                            ("jax_gmma.weightonly.unpack", "dtype must be bfloat16 or float8_e4m3fn")),
    "wo-unpack-row-exp": Case(lambda: wo.unpack(_wp("nvfp4"), jnp.float8_e4m3fn), ValueError,
                              ("jax_gmma.weightonly.unpack", "needs row_exp")),
}
