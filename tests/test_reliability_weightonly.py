"""Weight-only family (PackedWeight, prepare, weightonly_gemm, dot): value rules that hold under
jax.jit / jax.vmap as eagerly, argument checks, ranks, gradients and jax.export (CPU; one GPU
test of the kernel on weights that need the MX global scale)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from jax_gmma.ops import weightonly as wo

FORMATS = wo.WEIGHT_FORMATS
MX = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
ELEM = {"mxfp4": ml_dtypes.float4_e2m1fn, "mxfp6_e2m3": ml_dtypes.float6_e2m3fn,
        "mxfp6_e3m2": ml_dtypes.float6_e3m2fn}


def _rng(seed):
  return np.random.default_rng(5000 + seed)


def _rel(got, ref):
  got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
  return np.linalg.norm(got - ref) / np.linalg.norm(ref)


def _mx_weight(fmt, codes, seed, n=32, k=128):
  """A QuantizedArray with random nonzero elements and the given E8M0 scale codes (N, K / 32),
  and its float64 dequantization."""
  rng = _rng(seed)
  q = jax_gmma.quantize(rng.standard_normal((n, k)).astype(np.float32), fmt)
  leaves, tree = jax.tree_util.tree_flatten(q)
  vals = np.asarray(q.data, np.float32)
  vals = np.where(vals == 0, 1.0, vals)  # no all-zero block
  data = jnp.asarray(vals, q.data.dtype)
  sc = np.asarray(codes, np.uint8).view(ml_dtypes.float8_e8m0fnu)
  q = jax.tree_util.tree_unflatten(tree, [data, jnp.asarray(sc)])
  ref = vals.astype(np.float64) * np.repeat(np.exp2(np.asarray(codes, np.float64) - 127), 32, axis=1)
  return q, ref


def _prepare_three_ways(q):
  eager = wo.prepare(q)
  jitted = jax.jit(wo.prepare)(q)
  stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), q)
  vm = jax.vmap(wo.prepare)(stacked)
  vm0 = jax.tree_util.tree_map(lambda a: a[0], vm)
  return eager, jitted, vm0


def _leaves_equal(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("where", ["top_edge", "above", "far_above", "bottom_edge", "below", "full_span"])
def test_mx_scales_exact_eager_jit_vmap(fmt, where):
  """MX block scales at the edges of and beyond the kernel's exact range: eager, jit and vmap
  write identical PackedWeights whose dequantization is exactly the QuantizedArray's."""
  lo, hi = wo.MX_CODE_RANGE[fmt]
  rng = _rng(["top_edge", "above", "far_above", "bottom_edge", "below", "full_span"].index(where))
  base = {"top_edge": hi - 5, "above": hi + 3, "far_above": 200, "bottom_edge": lo,
          "below": 1, "full_span": lo}[where]
  codes = base + rng.integers(0, 6, (32, 4))
  if where in ("top_edge", "full_span"):
    codes[0, 0] = hi if where == "top_edge" else lo + (hi - lo)
  if where == "far_above":
    codes[3, 1] = 230
  q, ref = _mx_weight(fmt, codes, seed=len(where))
  eager, jitted, vm = _prepare_three_ways(q)
  _leaves_equal(eager, jitted)
  _leaves_equal(eager, vm)
  normal = np.abs(ref) >= 2.0 ** -126  # float32 (the dequantization's dtype) holds these exactly
  for wp in (eager, jitted, vm):
    got = np.asarray(wp.dequantize(), np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[normal], ref[normal])
    assert (np.abs(got - ref)[~normal] <= 2.0 ** -126).all()  # float32 subnormals, maybe flushed
    c = np.asarray(wp.scales).astype(int)
    assert ((c >= lo) & (c <= hi)).all()  # every block within the exact range
  if fmt == "mxfp4" or where != "far_above":  # the dequantized QuantizedArray (float32)
    deq = np.asarray(jax_gmma.dequantize(q), np.float64)
    fin = np.isfinite(deq)
    assert _rel(np.asarray(eager.dequantize(), np.float64)[fin], deq[fin]) < 1e-7
  # the product the kernel computes (CPU: its reference) is the float64 one
  # (weights below 2^-126 -- "below", "bottom_edge" -- are float32 subnormals, which XLA on CPU
  # flushes: there the CPU reference is held to the float32 weights it multiplies, and x is
  # scaled up so that the products are normal numbers)
  tiny = where in ("below", "bottom_edge", "full_span")
  x = jnp.asarray(rng.standard_normal((3, 128)) * (2.0 ** 60 if tiny else 1), jnp.bfloat16)
  out = jax.jit(lambda x, w: jax_gmma.weightonly_gemm(x, w, out_dtype=jnp.float32))(x, jitted)
  wref = np.asarray(jitted.dequantize(), np.float64) if tiny else ref
  assert _rel(out, np.asarray(x, np.float64) @ wref.T) < 1e-5


@pytest.mark.parametrize("fmt", MX)
def test_mx_scales_too_wide_refused_or_poisoned(fmt):
  """Block scales spanning more binades than the kernel applies exactly: eager prepare refuses;
  jit and vmap poison the blocks that do not fit (their rows are not finite), the other rows
  stay exact."""
  lo, hi = wo.MX_CODE_RANGE[fmt]
  codes = 200 + _rng(3).integers(0, 8, (32, 4))
  codes[5, 2] = 250        # the top sets the global scale
  codes[9, 1] = 250 - (hi - lo) - 1  # one binade too low
  q, ref = _mx_weight(fmt, codes, seed=4)
  with pytest.raises(ValueError, match="jax_gmma.weightonly.prepare: w's .* block scales span"):
    wo.prepare(q)
  jitted = jax.jit(wo.prepare)(q)
  vm = jax.tree_util.tree_map(lambda a: a[0], jax.vmap(wo.prepare)(
      jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), q)))
  _leaves_equal(jitted, vm)
  got = np.asarray(jitted.dequantize(), np.float64)
  bad_rows = ~np.isfinite(got).all(axis=1)
  assert bad_rows.tolist() == [r == 9 for r in range(32)]
  ok = ~bad_rows
  assert _rel(got[ok], ref[ok]) == 0.0
  x = jnp.ones((2, 128), jnp.bfloat16)
  out = np.asarray(jax_gmma.weightonly_gemm(x, jitted, out_dtype=jnp.float32))
  assert not np.isfinite(out[:, 9]).any() and np.isfinite(out[:, ok]).all()


@pytest.mark.parametrize("fmt", MX + ("nvfp4",))
def test_float_weights_unchanged(fmt):
  """Ordinary weights keep global scale 1 (MX) and are bit-identical eager / jit / vmap."""
  w = _rng(7).standard_normal((48, 200)).astype(np.float32) * 3
  eager = wo.prepare(w, fmt)
  jitted = jax.jit(lambda w: wo.prepare(w, fmt))(w)
  _leaves_equal(eager, jitted)
  if fmt in MX:
    assert float(eager.global_scale[0]) == 1.0


def test_nvfp4_negative_block_scales_exact():
  w = _rng(8).standard_normal((32, 128)).astype(np.float32)
  q = jax_gmma.quantize(w, "nvfp4")
  leaves, tree = jax.tree_util.tree_flatten(q)
  sign = np.where(_rng(9).random(np.shape(q.scales)) < 0.5, -1, 1).astype(np.float32)
  sc = jnp.asarray(np.asarray(q.scales, np.float32) * sign, q.scales.dtype)
  q2 = jax.tree_util.tree_unflatten(tree, [q.data, sc, q.global_scale])
  ref = (np.asarray(q.data, np.float64) * np.repeat(np.asarray(sc, np.float64), 16, axis=1)
         * float(q.global_scale))
  for wp in (wo.prepare(q2), jax.jit(wo.prepare)(q2)):
    assert _rel(wp.dequantize(), ref) < 1e-7


def test_off_grid_elements_refused_or_poisoned():
  q = jax_gmma.quantize(_rng(10).standard_normal((16, 64)).astype(np.float32), "mxfp6_e2m3")
  leaves, tree = jax.tree_util.tree_flatten(q)
  data = np.asarray(q.data, np.float32)
  data[3, 40] = 0.3   # not an e2m3 number (stored in its float8 container)
  q2 = jax.tree_util.tree_unflatten(tree, [jnp.asarray(data, q.data.dtype), q.scales])
  with pytest.raises(ValueError, match="prepare: 1 elements of w.data are not float6_e2m3fn"):
    wo.prepare(q2)
  got = np.asarray(jax.jit(wo.prepare)(q2).dequantize())
  assert not np.isfinite(got[3, 32:64]).all() and np.isfinite(np.delete(got, 3, 0)).all()


# -- argument checks -----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [np.ones((32, 64), np.int8), np.ones((32, 64), bool),
                                 np.ones((32, 64), np.complex64), "w", np.ones(64, np.float32),
                                 np.ones((0, 64), np.float32), np.ones((32, 0), np.float32)])
def test_prepare_errors_name_prepare(bad):
  with pytest.raises((TypeError, ValueError), match="^jax_gmma.weightonly.prepare: w "):
    wo.prepare(bad, "nvfp4")


def test_packed_weight_constructor_checks():
  wp = wo.prepare(_rng(11).standard_normal((32, 128)).astype(np.float32), "mxfp4")
  ok = dict(format="mxfp4", n=32, k=128)
  good = wo.PackedWeight(wp.packed, wp.scales, wp.global_scale, **ok)
  assert good.layout == wo.LAYOUT_VERSION["mxfp4"]
  bad = [
      (dict(packed=wp.packed[:1]), ValueError, "packed must have shape (2, 2, 512)"),
      (dict(packed=wp.packed.astype(jnp.int8)), TypeError, "packed must be uint8"),
      (dict(scales=wp.scales.astype(jnp.float32)), TypeError, "scales must be uint8"),
      (dict(scales=wp.scales[:, :, :1]), ValueError, "scales must have shape (2, 2, 32)"),
      (dict(global_scale=jnp.ones((), jnp.float32)), ValueError, "global_scale must have shape (1,)"),
      (dict(global_scale=jnp.ones((1,), jnp.bfloat16)), TypeError, "global_scale must be float32"),
      (dict(n=48), ValueError, "packed must have shape (3, 2, 512)"),
      (dict(n=0), ValueError, "n must be a positive multiple of 16"),
      (dict(n=-16), ValueError, "n must be a positive multiple of 16"),
      (dict(k=0), ValueError, "k must be >= 1"),
      (dict(k=True), TypeError, "k must be an int"),
      (dict(format="fp8_channel"), ValueError, "format must be one of"),
      (dict(format="nvfp4"), ValueError, "scales must have shape (2, 2, 64)"),
      (dict(layout=1), ValueError, "layout must be one of (2, 3) for mxfp4"),
      (dict(packed=None), TypeError, "packed must be a uint8 array"),
  ]
  for change, err, text in bad:
    args = dict(packed=wp.packed, scales=wp.scales, global_scale=wp.global_scale, **ok)
    args.update(change)
    with pytest.raises(err) as info:
      wo.PackedWeight(args.pop("packed"), args.pop("scales"), args.pop("global_scale"), **args)
    assert str(info.value).startswith("jax_gmma.PackedWeight: ") and text in str(info.value), (
        change, str(info.value))
  # fp8_exact=True is verified on concrete scales
  w2 = np.asarray(_rng(12).standard_normal((32, 128)), np.float32)
  w2[0, :32] *= 2.0 ** -12
  notexact = wo.prepare(w2, "mxfp4")
  assert notexact.fp8_exact is False
  with pytest.raises(ValueError, match="fp8_exact is True but"):
    wo.PackedWeight(notexact.packed, notexact.scales, notexact.global_scale, fp8_exact=True, **ok)
  # abstract values: jax.ShapeDtypeStruct, tracers, eval_shape, placeholder leaves
  sds = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), wp)
  wo.PackedWeight(sds.packed, sds.scales, sds.global_scale, **ok)
  with pytest.raises(ValueError, match="packed must have shape"):
    wo.PackedWeight(jax.ShapeDtypeStruct((1, 2, 512), jnp.uint8), sds.scales, sds.global_scale, **ok)
  out = jax.eval_shape(lambda w: wo.PackedWeight(w.packed, w.scales, w.global_scale, **ok), wp)
  assert out.packed.shape == wp.packed.shape
  jax.jit(lambda w: wo.PackedWeight(w.packed, w.scales, w.global_scale, **ok).packed)(wp)
  leaves, tree = jax.tree_util.tree_flatten(wp)
  assert jax.tree_util.tree_unflatten(tree, [object()] * 3).n == 32
  assert jax.tree_util.tree_unflatten(tree, [None] * 3).k == 128
  # consumers re-check what pytree rebuilding let through
  broken = jax.tree_util.tree_unflatten(tree, [wp.packed[:1], wp.scales, wp.global_scale])
  with pytest.raises(ValueError, match="jax_gmma.weightonly_gemm: w.packed must have shape"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), broken)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int32, jnp.bool_, jnp.complex64, jnp.uint8])
def test_dot_and_gemm_refuse_non_float(dtype):
  wp = wo.prepare(_rng(13).standard_normal((32, 128)).astype(np.float32), "nvfp4")
  x = jnp.ones((2, 128), dtype)
  with pytest.raises(TypeError, match="^jax_gmma.dot: x must be a float array"):
    jax_gmma.dot(x, wp)
  with pytest.raises(TypeError, match="^jax_gmma.weightonly_gemm: x must be bfloat16"):
    jax_gmma.weightonly_gemm(x, wp)
  xb = jnp.ones((2, 128), jnp.bfloat16)
  with pytest.raises(TypeError, match="^jax_gmma.dot: bias must be a float"):
    jax_gmma.dot(xb, wp, bias=jnp.ones(32, dtype))
  with pytest.raises(TypeError, match="^jax_gmma.weightonly_gemm: bias must be a float"):
    jax_gmma.weightonly_gemm(xb, wp, bias=jnp.ones(32, dtype))
  with pytest.raises(TypeError, match="^jax_gmma.weightonly_gemm: x_scale must be a float"):
    jax_gmma.weightonly_gemm(xb, wp, x_scale=jnp.ones(2, dtype))


def test_out_dtype_and_x_scale_shape():
  wp = wo.prepare(_rng(14).standard_normal((32, 128)).astype(np.float32), "mxfp4")
  x = jnp.ones((2, 3, 128), jnp.bfloat16)
  for bad in (jnp.int8, jnp.float16, "nope", jnp.complex64):
    with pytest.raises(TypeError, match="^jax_gmma.weightonly_gemm: out_dtype must be one of"):
      jax_gmma.weightonly_gemm(x, wp, out_dtype=bad)
  with pytest.raises(ValueError, match="x_scale must be a scalar or one scale per token"):
    jax_gmma.weightonly_gemm(x, wp, x_scale=jnp.ones((3, 2)))
  ok = jax_gmma.weightonly_gemm(x, wp, x_scale=jnp.full((2, 3), 2.0), out_dtype=jnp.float32)
  ref = jax_gmma.weightonly_gemm(x, wp, out_dtype=jnp.float32) * 2
  np.testing.assert_array_equal(np.asarray(ok), np.asarray(ref))
  # dot: float16 x gives float16 (the float32 result rounded once)
  y = jax_gmma.dot(x.astype(jnp.float16), wp)
  assert y.dtype == jnp.float16
  np.testing.assert_array_equal(np.asarray(y), np.asarray(ref / 2).astype(np.float16))


# -- ranks and empty inputs ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_ranks_and_zero_size(fmt):
  rng = _rng(15)
  wp = wo.prepare(rng.standard_normal((32, 100)).astype(np.float32), fmt)
  w64 = np.asarray(wp.dequantize(), np.float64)
  for shape in [(100,), (1, 100), (5, 100), (2, 3, 100), (0, 100), (2, 0, 100)]:
    x = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    for f in (lambda x: jax_gmma.dot(x, wp),
              lambda x: jax_gmma.weightonly_gemm(x, wp, out_dtype=jnp.float32)):
      y = jax.jit(f)(x)
      assert y.shape == shape[:-1] + (32,), (shape, y.shape)
      if y.size:
        want = np.asarray(x, np.float64) @ w64.T
        assert _rel(np.asarray(y, np.float64), want) < (8e-3 if y.dtype == jnp.bfloat16 else 1e-6)
  with pytest.raises(ValueError, match="^jax_gmma.dot: x must be \\(..., K\\)"):
    jax_gmma.dot(jnp.ones((), jnp.bfloat16), wp)
  with pytest.raises(ValueError, match="K = 100"):
    jax_gmma.dot(jnp.ones((4, 0), jnp.bfloat16), wp)


def test_huge_shapes_refused_abstractly():
  wp = wo.prepare(_rng(16).standard_normal((32, 128)).astype(np.float32), "nvfp4")
  big = jax.ShapeDtypeStruct((2 ** 31, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="fewer than 2\\^31 rows"):
    jax.eval_shape(lambda x: jax_gmma.weightonly_gemm(x, wp), big)
  with pytest.raises(ValueError, match="path='kernel' takes at most"):
    jax.eval_shape(lambda x: jax_gmma.weightonly_gemm(x, wp, path="kernel"),
                   jax.ShapeDtypeStruct((2 ** 21, 128), jnp.bfloat16))
  with pytest.raises(ValueError, match="below 2\\^31"):
    jax.eval_shape(lambda w: wo.prepare(w, "nvfp4"), jax.ShapeDtypeStruct((16, 2 ** 31), jnp.float32))


# -- gradients -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_grad_through_packed_weight(fmt):
  rng = _rng(17)
  wp = wo.prepare(rng.standard_normal((32, 128)).astype(np.float32), fmt)
  x = jnp.asarray(rng.standard_normal((4, 128)), jnp.float32)
  gw = jax.grad(lambda w: jax_gmma.dot(x, w).astype(jnp.float32).sum(), allow_int=True)(wp)
  assert isinstance(gw, wo.PackedWeight)
  assert gw.packed.dtype == jax.dtypes.float0 and gw.scales.dtype == jax.dtypes.float0
  np.testing.assert_array_equal(np.asarray(gw.global_scale), 0.0)
  gx, gw2 = jax.jit(jax.grad(lambda x, w: jax_gmma.dot(x, w).sum(), argnums=(0, 1),
                             allow_int=True))(x, wp)
  assert np.isfinite(np.asarray(gx)).all() and not np.isnan(np.asarray(gw2.global_scale)).any()
  want = np.ones((4, 32)) @ np.asarray(wp.dequantize(), np.float64)
  assert _rel(gx, want) < 8e-3
  gx2 = jax.grad(lambda x, w: jax_gmma.dot(x, w).sum())(x, wp)
  np.testing.assert_array_equal(np.asarray(gx2), np.asarray(gx))
  with pytest.raises(jax_gmma.NotDifferentiable):
    jax.grad(lambda x: jax_gmma.weightonly_gemm(x, wp, out_dtype=jnp.float32).sum())(
        x.astype(jnp.bfloat16))


def test_grad_mx_global_scale():
  """The MX global scale (weights beyond the kernel's range) is part of dx."""
  lo, hi = wo.MX_CODE_RANGE["mxfp4"]
  q, ref = _mx_weight("mxfp4", np.full((32, 4), hi + 4), seed=18)
  wp = wo.prepare(q)
  assert float(wp.global_scale[0]) == 16.0
  x = jnp.ones((2, 128), jnp.float32)
  gx = jax.grad(lambda x: jax_gmma.dot(x, wp).sum())(x)
  assert _rel(gx, np.ones((2, 32)) @ ref) < 8e-3


# -- jax.export ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_export_symbolic_tokens_round_trip(fmt):
  rng = _rng(19)
  wp = wo.prepare(rng.standard_normal((32, 96)).astype(np.float32), fmt)
  f = jax.jit(lambda x, w: jax_gmma.dot(x, w, bias=jnp.ones(32, jnp.float32)))
  m, = jax.export.symbolic_shape("m")
  # the kernel's FFI target has no cross-version guarantee: jax-gmma names it for disabled_checks
  exp = jax.export.export(f, disabled_checks=jax_gmma.export_disabled_checks())(
      jax.ShapeDtypeStruct((m, 96), jnp.bfloat16), wp)
  back = jax.export.deserialize(exp.serialize())
  assert back.in_tree == exp.in_tree
  for rows in (1, 5, 200):
    x = jnp.asarray(rng.standard_normal((rows, 96)), jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(back.call(x, wp)), np.asarray(exp.call(x, wp)))
    if rows < wo.PREFILL_MIN_M:  # the path "auto" takes for concrete M is the kernel's too
      np.testing.assert_array_equal(np.asarray(back.call(x, wp)), np.asarray(f(x, wp)))
  # a PackedWeight result round-trips as well (its static fields only in the calling convention)
  ex2 = jax.export.export(jax.jit(lambda w: wo.prepare(w, fmt)),
                          disabled_checks=jax_gmma.export_disabled_checks())(
      jax.ShapeDtypeStruct((32, 96), jnp.float32))
  back2 = jax.export.deserialize(ex2.serialize())
  out = back2.call(jnp.asarray(rng.standard_normal((32, 96)), jnp.float32))
  assert isinstance(out, wo.PackedWeight) and out.format == fmt and out.k == 96


# -- GPU -----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("path", ["kernel", "dequant"])
def test_kernel_applies_mx_global_scale(fmt, path):
  """The kernel (has_global for every format) and the prefill path multiply MX weights whose
  block scales exceed the kernel's range (a global scale 2^G) exactly: float64 agreement."""
  lo, hi = wo.MX_CODE_RANGE[fmt]
  codes = hi + 1 + _rng(20).integers(0, 8, (256, 32))
  q, ref = _mx_weight(fmt, codes, seed=21, n=256, k=1024)
  wp = jax.jit(wo.prepare)(q)
  assert float(wp.global_scale[0]) > 1
  x = jnp.asarray(_rng(22).standard_normal((5, 1024)), jnp.bfloat16)
  out = jax.jit(lambda x, w: jax_gmma.weightonly_gemm(x, w, out_dtype=jnp.float32, path=path))(x, wp)
  assert _rel(out, np.asarray(x, np.float64) @ ref.T) < 1e-5
