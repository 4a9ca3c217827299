"""QuantizedArray, quantize and dequantize refuse what they cannot represent exactly (CPU).

- The constructor checks every field against the format and the scale layout, for every format
  of the registry and both layouts, with the same shape rule quantize stores by; abstract values
  (jax.ShapeDtypeStruct, tracers, JAX's placeholder leaves) keep working, and so does jax.vmap
  over a stacked QuantizedArray.
- quantize: dtypes, rank, axis, empty arrays; NaN / Inf never come back finite; the quantization
  kernel is used only within its 32-bit segment count (checked abstractly, nothing allocated).
- Differentiation: no cotangent is NaN; low-precision leaves get zeros (float0 for the E8M0
  bytes), for every format.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_gmma
from jax_gmma import QuantizedArray, dequantize, quantize
from jax_gmma.arrays import check_leaves, to_layout
from jax_gmma.numerics import shapes
from jax_gmma.ops import quantize as qmod

FORMATS = tuple(jax_gmma.FORMATS)
SWIZZLABLE = ("mxfp8", "nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
CASES = [(f, "rowmajor") for f in FORMATS] + [(f, "sm100_128x4") for f in SWIZZLABLE]
E8M0 = np.dtype(jnp.float8_e8m0fnu)
FLOAT0 = jax.dtypes.float0


def _x(shape=(130, 100), seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _q(fmt, layout="rowmajor", shape=(130, 100), axis=-1):
  return quantize(_x(shape), fmt, layout=layout, axis=axis)


def _fields(q):
  return dict(format=q.format.name, shape=q.shape, axis=q.axis, dtype=q.dtype, layout=q.layout)


# -- the constructor -------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,layout", CASES)
def test_constructor_accepts_what_quantize_stores(fmt, layout):
  for shape, axis in (((130, 100), -1), ((100, 130), 0), ((2, 3, 40), 1)):
    if fmt == "fp8_tensor" and shape == (2, 3, 40):
      shape = (40,)
      axis = 0
    q = _q(fmt, layout, shape, axis)
    q2 = QuantizedArray(q.data, q.scales, q.global_scale, **_fields(q))
    assert q2.shape == q.shape and q2.axis == q.axis and q2.layout == layout
    np.testing.assert_array_equal(np.asarray(dequantize(q2)), np.asarray(dequantize(q)))
    sh = shapes.quantized_shapes(fmt, shape, axis, layout)
    assert tuple(q.data.shape) == sh.data and tuple(q.scales.shape) == sh.scales


@pytest.mark.parametrize("fmt,layout", CASES)
def test_constructor_refuses_a_declared_shape_that_disagrees(fmt, layout):
  q = _q(fmt, layout)
  f = _fields(q)
  for bad in ((130, 228), (131, 100), (130,), (2, 130, 100)):
    if fmt == "fp8_tensor" and bad == (130,):
      continue
    f["shape"] = bad
    with pytest.raises(ValueError, match=r"jax_gmma\.QuantizedArray: (data|x|shape)"):
      QuantizedArray(q.data, q.scales, q.global_scale, **f)
  f = _fields(q)
  f["axis"] = 0  # (130, 100) read with K = 130
  with pytest.raises(ValueError, match=r"jax_gmma\.QuantizedArray: data must have shape"):
    QuantizedArray(q.data, q.scales, q.global_scale, **f)


@pytest.mark.parametrize("fmt,layout", CASES)
def test_constructor_refuses_foreign_dtypes(fmt, layout):
  q = _q(fmt, layout)
  f = _fields(q)
  data32 = q.data.astype(jnp.float32)
  with pytest.raises(TypeError, match=rf"jax_gmma\.QuantizedArray: data must be .* format '{fmt}'"):
    QuantizedArray(data32, q.scales, q.global_scale, **f)
  wrong = jnp.float32 if q.format.scale_dtype != np.float32 else jnp.bfloat16
  with pytest.raises(TypeError, match=rf"jax_gmma\.QuantizedArray: scales must be "
                     rf"{q.format.scale_dtype.name} for format '{fmt}'"):
    QuantizedArray(q.data, q.scales.astype(wrong), q.global_scale, **f)
  # the raw E8M0 bytes (the pytree leaf) are not scales for the constructor
  if q.format.scale_dtype == E8M0:
    raw = jax.lax.bitcast_convert_type(q.scales, jnp.uint8)
    with pytest.raises(TypeError, match="scales must be float8_e8m0fnu"):
      QuantizedArray(q.data, raw, None, **f)


@pytest.mark.parametrize("fmt,layout", CASES)
def test_constructor_refuses_scales_that_only_broadcast(fmt, layout):
  q = _q(fmt, layout)
  s = q.scales
  candidates = [s.reshape(1, *s.shape), s.reshape(-1)]
  if s.ndim:
    candidates.append(s[..., :1])            # one K block for all
    candidates.append(s[:1])                 # one row (block) for all
  for bad in candidates:
    if tuple(bad.shape) == tuple(s.shape):
      continue
    with pytest.raises(ValueError, match=rf"jax_gmma\.QuantizedArray: scales must have shape "
                       rf"{re_shape(s.shape)} for format '{fmt}'"):
      QuantizedArray(q.data, bad, q.global_scale, **_fields(q))


def re_shape(shape):
  return shapes.fmt_shape(shape).replace("(", r"\(").replace(")", r"\)")


def test_constructor_global_scale():
  q = _q("nvfp4")
  f = _fields(q)
  for bad, err in ((q.global_scale.astype(jnp.bfloat16), TypeError),
                   (jnp.ones((1,), jnp.float32), ValueError),
                   (jnp.ones((2,), jnp.float32), ValueError),
                   (jnp.int32(1), TypeError), ("1", TypeError)):
    with pytest.raises(err, match=r"jax_gmma\.QuantizedArray: global_scale must be a float32 "
                       r"scalar"):
      QuantizedArray(q.data, q.scales, bad, **f)
  with pytest.raises(ValueError, match="needs a global_scale"):
    QuantizedArray(q.data, q.scales, None, **f)
  # a Python float is a float32 scalar
  q2 = QuantizedArray(q.data, q.scales, float(q.global_scale), **f)
  np.testing.assert_array_equal(np.asarray(dequantize(q2)), np.asarray(dequantize(q)))
  qm = _q("mxfp8")
  with pytest.raises(ValueError, match="'mxfp8' has no global_scale"):
    QuantizedArray(qm.data, qm.scales, jnp.float32(1), **_fields(qm))


def test_constructor_other_fields():
  q = _q("fp8_channel")
  f = _fields(q)
  for key, bad, err, rx in (("format", "fp9", ValueError, "format: unknown format name 'fp9'"),
                            ("format", 3, TypeError, "format must be a format name"),
                            ("layout", "tiled", ValueError, "layout must be"),
                            ("axis", 1.0, TypeError, "axis must be an int"),
                            ("axis", 2, ValueError, "axis 2 is out of range"),
                            ("shape", (130, 0), ValueError, "every dimension of shape must be >= 1"),
                            ("shape", "ab", TypeError, "shape must be a tuple of ints"),
                            ("dtype", jnp.int8, ValueError, "dtype must be one of"),
                            ("dtype", jnp.float8_e5m2, TypeError, "data must be float8_e5m2")):
    g = dict(f, **{key: bad})
    with pytest.raises(err, match=r"jax_gmma\.QuantizedArray: .*" + rx):
      QuantizedArray(q.data, q.scales, None, **g)
  with pytest.raises(TypeError, match=r"jax_gmma\.QuantizedArray: data must be an array"):
    QuantizedArray(np.asarray(q.data).tolist(), q.scales, None, **f)
  # dtype=None takes data's dtype where the format allows it
  q5 = quantize(_x(), "fp8_channel", dtype=jnp.float8_e5m2)
  q6 = QuantizedArray(q5.data, q5.scales, format="fp8_channel", shape=q5.shape)
  assert q6.dtype == np.dtype(jnp.float8_e5m2)


# -- abstract values, tracers, pytree placeholders, vmap -----------------------------------------

@pytest.mark.parametrize("fmt,layout", CASES)
def test_abstract_values(fmt, layout):
  q = _q(fmt, layout)
  sds = lambda a: None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype)  # noqa: E731
  qa = QuantizedArray(sds(q.data), sds(q.scales), sds(q.global_scale), **_fields(q))
  assert qa.scales.dtype == q.format.scale_dtype
  out = jax.eval_shape(dequantize, qa)
  assert out.shape == q.shape and out.dtype == np.float32
  # a ShapeDtypeStruct of the wrong shape is refused like an array
  with pytest.raises(ValueError, match="data must have shape"):
    QuantizedArray(jax.ShapeDtypeStruct((3, 3), q.data.dtype), sds(q.scales), sds(q.global_scale),
                   **_fields(q))
  # tracers: built inside jit from traced leaves
  rebuilt = jax.jit(lambda d, s, g: dequantize(QuantizedArray(d, s, g, **_fields(q))))
  np.testing.assert_array_equal(np.asarray(rebuilt(q.data, q.scales, q.global_scale)),
                                np.asarray(dequantize(q)))
  # JAX's own placeholders are not validated
  leaves, tree = jax.tree_util.tree_flatten(q)
  for ph in (None, object()):
    p = jax.tree_util.tree_unflatten(tree, [ph] * len(leaves))
    assert p.shape == q.shape
    repr(p)
    check_leaves(p, "test")  # placeholders: nothing to check
  jax.tree_util.tree_map(lambda a: a, q)


@pytest.mark.parametrize("fmt,layout", [("fp8_channel", "rowmajor"), ("fp8_128x128", "rowmajor"),
                                        ("mxfp8", "sm100_128x4"), ("nvfp4", "sm100_128x4"),
                                        ("mxfp6_e3m2", "rowmajor")])
def test_vmap_over_stacked_quantized_arrays(fmt, layout):
  xs = [_x((130, 100), seed=i) for i in range(3)]
  qs = [quantize(x, fmt, layout=layout) for x in xs]
  stacked = jax.tree.map(lambda *l: jnp.stack(l), *qs)
  got = jax.vmap(dequantize)(stacked)
  want = jnp.stack([dequantize(q) for q in qs])
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # vmap of quantize returns batched leaves with the per-example static shape
  qv = jax.vmap(lambda x: quantize(x, fmt, layout=layout))(jnp.stack(xs))
  np.testing.assert_array_equal(np.asarray(jax.vmap(dequantize)(qv)), np.asarray(want))
  if layout == "rowmajor" and fmt in SWIZZLABLE:
    sw = jax.vmap(lambda q: to_layout(q, "sm100_128x4"))(qv)
    np.testing.assert_array_equal(np.asarray(jax.vmap(dequantize)(sw)), np.asarray(want))
  # outside vmap the stacked leaves disagree with the declared shape: refused with the remedy
  with pytest.raises(ValueError, match=r"jax_gmma\.dequantize: data must have shape .*extra "
                     r"leading dimension.*jax\.vmap"):
    dequantize(stacked)


def test_e8m0_scales_are_bytes_in_the_pytree():
  q = _q("mxfp8", "sm100_128x4")
  leaves = jax.tree.leaves(q)
  assert [np.dtype(l.dtype) for l in leaves] == [np.dtype(jnp.float8_e4m3fn), np.dtype(np.uint8)]
  assert np.dtype(q.scales.dtype) == E8M0
  np.testing.assert_array_equal(np.asarray(leaves[1]),
                                np.asarray(q.scales).view(np.uint8))
  qn = QuantizedArray(np.asarray(q.data), np.asarray(q.scales), **_fields(q))
  assert isinstance(jax.tree.leaves(qn)[1], np.ndarray)  # a NumPy view, no copy
  assert "scales=float8_e8m0fnu[2, 1, 32, 4, 4]" in repr(q)


# -- quantize ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, jnp.bool_, jnp.complex64])
def test_quantize_refuses_non_float(dtype):
  with pytest.raises(TypeError, match=r"jax_gmma\.quantize: x must be a floating array, got"):
    quantize(jnp.ones((4, 32), dtype), "fp8_channel")


def test_quantize_shape_rules():
  for shape in ((0, 32), (4, 0), (2, 0, 32)):
    with pytest.raises(ValueError, match=r"jax_gmma\.quantize: (x must be non-empty|K \(x\.shape"
                       r"\[1\]\) must be >= 1)"):
      quantize(jnp.ones(shape), "fp8_1x128")
  with pytest.raises(ValueError, match=r"jax_gmma\.quantize: x must have at least 2 dimensions"):
    quantize(jnp.ones((32,)), "mxfp8")
  with pytest.raises(ValueError, match=r"jax_gmma\.quantize: x must have at least 1 dimension"):
    quantize(jnp.float32(1), "fp8_tensor")
  with pytest.raises(ValueError, match=r"jax_gmma\.quantize: axis -3 is out of range"):
    quantize(jnp.ones((4, 32)), "fp8_channel", axis=-3)
  with pytest.raises(TypeError, match=r"jax_gmma\.quantize: axis must be an int"):
    quantize(jnp.ones((4, 32)), "fp8_channel", axis=None)
  with pytest.raises(TypeError, match=r"jax_gmma\.quantize: x is already a QuantizedArray"):
    quantize(_q("fp8_channel"), "fp8_channel")


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_pads_k_to_whole_blocks(fmt):
  """No format needs K a multiple of its block: K is zero-padded in data, and dequantize gives
  back exactly the logical shape."""
  x = _x((3, 37))
  q = quantize(x, fmt)
  assert tuple(q.data.shape) == shapes.quantized_shapes(fmt, (3, 37)).data
  d = np.asarray(q.data.astype(jnp.float32))
  assert np.all(d[:, 37:] == 0)
  assert dequantize(q).shape == (3, 37)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("jit", [False, True])
def test_nan_and_inf_never_come_back_finite(fmt, jit):
  x = _x((4, 64)).at[0, 3].set(jnp.nan).at[1, 5].set(jnp.inf).at[2, 7].set(-jnp.inf)
  f = (lambda x: dequantize(quantize(x, fmt)))
  d = np.asarray(jax.jit(f)(x) if jit else f(x))
  for r, c in ((0, 3), (1, 5), (2, 7)):
    assert not np.isfinite(d[r, c]), (fmt, r, c, d[r, c])
  # rows without a non-finite value are quantized as usual (finite); for per-block formats the
  # poisoned blocks are whole blocks of NaN (FP4 / FP6 elements cannot hold NaN)
  assert np.all(np.isfinite(d[3]))
  # NaN stays NaN
  assert np.isnan(d[0, 3])


def test_quantize_kernel_only_within_its_segment_count():
  """The kernel counts 128-element row segments in 32 bits: larger inputs (checked abstractly,
  nothing is allocated) take the pure-JAX path, which XLA indexes in 64 bits."""
  def uses_kernel(shape, fmt):
    jaxpr = jax.make_jaxpr(lambda x: quantize(x, fmt))(jax.ShapeDtypeStruct(shape, jnp.bfloat16))
    return any(e.primitive is qmod.fp8_quantize_p for e in jaxpr.jaxpr.eqns)
  assert uses_kernel((1024, 4096), "fp8_1x128")
  assert uses_kernel((2**17, 2**15), "mxfp8")             # 2**32 elements, 2**25 segments
  assert not uses_kernel((2**24, 2**14), "fp8_1x128")     # 2**31 segments
  assert not uses_kernel((2**23, 2**15 + 1), "mxfp8")     # K padded: 257 segments per row
  assert shapes.quantize_kernel_fits(2**24 - 1, 2**14, 128)
  assert not shapes.quantize_kernel_fits(2**24, 2**14, 128)
  out = jax.eval_shape(lambda x: quantize(x, "fp8_1x128"),
                       jax.ShapeDtypeStruct((2**24, 2**14), jnp.bfloat16))
  assert out.data.shape == (2**24, 2**14) and out.scales.shape == (2**24, 2**7)


# -- differentiation ---------------------------------------------------------------------------

def _check_cotangent(q, g, differentiable=("float32",)):
  """No leaf NaN; low-precision leaves zero (float0 for E8M0 bytes)."""
  for name, leaf, ct in zip(("data", "scales", "global_scale"),
                            (q.data, q._scales, q.global_scale),
                            (g.data, g._scales, g.global_scale)):
    if leaf is None:
      assert ct is None
      continue
    dt = np.dtype(ct.dtype)
    if np.dtype(leaf.dtype) == np.uint8:
      assert dt == FLOAT0, name
      continue
    v = np.asarray(ct).astype(np.float32)
    assert not np.any(np.isnan(v)), name
    if np.dtype(leaf.dtype).name not in differentiable:
      assert not np.any(v), name


@pytest.mark.parametrize("fmt,layout", CASES)
def test_grad_through_dequantize(fmt, layout):
  q = _q(fmt, layout)
  w = _x(q.shape, seed=3)
  loss = lambda q: jnp.sum(dequantize(q) * w)  # noqa: E731
  g = jax.grad(loss, allow_int=True)(q)
  _check_cotangent(q, g)
  gj = jax.jit(jax.grad(loss, allow_int=True))(q)
  _check_cotangent(q, gj)
  # the float32 scales get the true derivative: d/ds sum(data * s * w) for per-tensor scales
  if fmt == "fp8_tensor":
    want = np.sum(np.asarray(q.data.astype(jnp.float32)) * np.asarray(w))
    np.testing.assert_allclose(float(g.scales), want, rtol=1e-5)
  if fmt == "nvfp4":
    want = np.sum(np.asarray(dequantize(q)) * np.asarray(w)) / float(q.global_scale)
    np.testing.assert_allclose(float(g.global_scale), want, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8_tensor", "fp8_128x128", "fp8_1x128",
                                 "mxfp8", "nvfp4"])
def test_grad_through_dot(fmt):
  """dot treats the weight as a constant: every leaf's cotangent is zero / float0, never NaN,
  and the activation gradient is finite."""
  layout = "sm100_128x4" if fmt in ("mxfp8", "nvfp4") else "rowmajor"
  q = quantize(_x((128, 256)) * 0.1, fmt, layout=layout)
  x = _x((4, 256), seed=5)
  loss = lambda q, x: jnp.sum(jax_gmma.dot(x, q, out_dtype=jnp.float32))  # noqa: E731
  # NVFP4 x NVFP4 has no Hopper kernel: its reference, opted in (a no-op elsewhere).
  with jax_gmma.allow_reference():
    gq, gx = jax.grad(loss, argnums=(0, 1), allow_int=True)(q, x)
    gx_only = jax.grad(loss, argnums=1)(q, x)
  _check_cotangent(q, gq, differentiable=())
  assert np.all(np.isfinite(np.asarray(gx)))
  np.testing.assert_array_equal(np.asarray(gx_only), np.asarray(gx))


def test_grad_without_allow_int_names_the_rule():
  """E8M0 scales are integer bytes to JAX: jax.grad asks for allow_int (JAX's own error)."""
  q = _q("mxfp8")
  with pytest.raises(TypeError, match="allow_int"):
    jax.grad(lambda q: dequantize(q).sum())(q)
  # fp8 / nvfp4 QuantizedArrays have float leaves only
  g = jax.grad(lambda q: dequantize(q).sum())(_q("nvfp4"))
  _check_cotangent(_q("nvfp4"), g)


# -- shape rules: symbolic dimensions, complex dtypes -------------------------------------------

def test_shape_rules_take_symbolic_dims():
  e4 = np.dtype(jnp.float8_e4m3fn)
  m, = export.symbolic_shape("m")
  p = shapes.fp8_gemm_problem((m, 256), e4, (128, 256), e4, a_scale_shape=(m, 1),
                              b_scale_shape=(128,))
  assert p.a_scale == "row" and p.b_scale == "channel" and p.m == m
  assert shapes.output_shape(p) == (m, 128)
  pb = shapes.fp8_blockwise_problem((2, m, 256), e4, (128, 256), e4, (2, m, 2), np.float32,
                                    (1, 2), np.float32)
  assert pb.variant == "1d2d" and pb.m == 2 * m
  k, = export.symbolic_shape("k")
  with pytest.raises(ValueError, match=r"K \(a.shape\[-1\]\) must be a constant dimension"):
    shapes.fp8_gemm_problem((4, k), e4, (128, k), e4)
  # size rules on constant dims only; still enforced there
  with pytest.raises(ValueError, match="must be < 2"):
    shapes.fp8_gemm_problem((2**31, 256), e4, (128, 256), e4)
  sh = shapes.quantized_shapes("mxfp8", (m, 100), layout="sm100_128x4")
  assert sh.data == (m, 128) and sh.scales[1:] == (1, 32, 4, 4)
  assert not shapes.quantize_kernel_fits(m, 256, 128)


def test_shape_rules_refuse_complex():
  e4 = np.dtype(jnp.float8_e4m3fn)
  with pytest.raises(TypeError, match="b_scale must be a floating-point array"):
    shapes.fp8_gemm_problem((4, 256), e4, (128, 256), e4, b_scale_shape=(128,),
                            b_scale_dtype=np.complex64)
  with pytest.raises(TypeError, match="bias must be floating-point"):
    shapes.fp8_gemm_problem((4, 256), e4, (128, 256), e4, bias_shape=(128,),
                            bias_dtype=np.complex64)


def test_leaves_have_named_paths():
  """QuantizedArray and PackedWeight are pytrees with keys: tree paths name their leaves (what
  checkpointers and model-state tools show), and flattening with or without paths agrees."""
  q = quantize(_x((32, 64)), "nvfp4")
  wp = jax_gmma.weightonly.prepare(_x((32, 64)), "mxfp4")
  tree = {"q": q, "w": wp}
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  assert paths == ["['q'].data", "['q'].scales", "['q'].global_scale",
                   "['w'].packed", "['w'].scales", "['w'].global_scale"]
  with_paths = [v for _, v in jax.tree_util.tree_flatten_with_path(tree)[0]]
  for a, b in zip(with_paths, jax.tree_util.tree_leaves(tree)):
    assert a is b
  back = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree), jax.tree_util.tree_leaves(tree))
  np.testing.assert_array_equal(np.asarray(dequantize(back["q"])), np.asarray(dequantize(q)))
