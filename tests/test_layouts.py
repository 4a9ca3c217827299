"""Tests for jax_gmma.layouts (swizzled 128x4-atom scale layout), CPU only.

The layout is checked bit-exactly against two oracles written independently of
the implementation (which pads, reshapes and transposes):

* ``ref_swizzle``: a plain Python loop over every (batch, row, k-block) of the
  padded matrix, placing each scale at the offset given by the cuBLAS
  "1D Block Scaling Factors Layout" formula (as implemented by nvmath-python);
* ``cute_offset``: a tiny evaluator of CuTe layouts, fed the shape/stride
  numbers of CUTLASS's ``Sm1xxBlockScaledBasicChunk::SfKMajorAtom`` tiled by
  ``tile_to_shape(..., Step<_2,_1,_3>)``;

plus the two worked examples of nvmath-python's ``get_block_scale_offset``.
"""

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_gmma.numerics import layouts
from jax_gmma.numerics.layouts import (
  LAYOUTS,
  get_layout,
  padding_value,
  swizzle_scales,
  swizzled_shape,
  unswizzle_scales,
)
from jax_gmma.arrays import QuantizedArray, to_layout
from jax_gmma.ops.quantize import (
  dequantize,
  quantize,
  to_jax_scaled_matmul_inputs,
)

E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32 = np.dtype(np.float32)
SCALE_DTYPES = (E8M0, E4M3, F32)
UINT = {1: np.uint8, 4: np.uint32}
ROWS = (1, 127, 128, 129, 300)
KBS = (1, 3, 4, 5, 9)


def bits(a):
  """Any array -> NumPy array of its raw bits (same-width unsigned ints)."""
  a = np.asarray(a)
  return a.view(UINT[a.dtype.itemsize])


def random_scales(rng, shape, dt):
  """Random bit patterns of dtype ``dt`` (NaN / Inf / subnormals included)."""
  u = UINT[np.dtype(dt).itemsize]
  raw = rng.integers(0, np.iinfo(u).max, size=shape, dtype=u, endpoint=True)
  return raw.view(dt)


def cdiv(a, b):
  return -(-a // b)


# ----------------------------------------------------------------------------
# oracle 1: element-by-element loop, cuBLAS offset formula
# ----------------------------------------------------------------------------
def cublas_offset(row, kb, padded_kb):
  """Offset of scale (row, kb) in one matrix (cuBLAS doc / nvmath-python:
  tile ``(kb//4*4 + row//128 * padded_kb) * 128`` + intra-tile)."""
  tile = (kb // 4 * 4 + row // 128 * padded_kb) * 128
  r = row % 128
  return tile + (r % 32) * 16 + (r // 32) * 4 + kb % 4


def ref_swizzle(scale_bits):
  """(..., rows, kb) unsigned bits -> flat (..., R*KB) bits, zero padded."""
  *lead, rows, kb = scale_bits.shape
  big_r, big_kb = cdiv(rows, 128) * 128, cdiv(kb, 4) * 4
  src = scale_bits.reshape(-1, rows, kb)
  out = np.full((src.shape[0], big_r * big_kb), 0xAB, scale_bits.dtype)
  for b in range(src.shape[0]):
    for r in range(big_r):
      for c in range(big_kb):
        v = src[b, r, c] if (r < rows and c < kb) else 0
        out[b, cublas_offset(r, c, big_kb)] = v
  return out.reshape(*lead, big_r * big_kb)


# ----------------------------------------------------------------------------
# oracle 2: CuTe layout algebra with CUTLASS's atom numbers
# ----------------------------------------------------------------------------
def cute_offset(shape, stride, coord):
  """Evaluate a (nested) CuTe layout at a 1-D integer coordinate:
  colexicographic split of ``coord`` over ``shape``, dot with ``stride``."""
  if isinstance(shape, int):
    assert 0 <= coord < shape
    return coord * stride
  off = 0
  for s, d in zip(shape, stride):
    size = int(np.prod(flatten(s)))
    off += cute_offset(s, d, coord % size)
    coord //= size
  assert coord == 0
  return off


def flatten(t):
  return [t] if isinstance(t, int) else [x for s in t for x in flatten(s)]


def cutlass_sf_layout(m, k, sf_vec):
  """``tile_to_shape(SfKMajorAtom, (m, k, 1), Step<_2,_1,_3>)`` as nested
  (shape, stride) for coordinates (row, k *element*, batch).

  SfKMajorAtom = Shape<Shape<_32,_4>, Shape<SFVecSize,_4>>,
                Stride<Stride<_16,_4>, Stride<_0,_1>>  (cosize 512).
  Step<_2,_1,_3>: the K tile index varies fastest (stride = 1 atom), then
  the M tile index, then L."""
  n_mt, n_kt = cdiv(m, 128), cdiv(k, 4 * sf_vec)
  atom = 512
  shape = (((32, 4), n_mt), ((sf_vec, 4), n_kt), 1)
  stride = (((16, 4), atom * n_kt), ((0, 1), atom), atom * n_kt * n_mt)
  return shape, stride


# ----------------------------------------------------------------------------
# bit-exact layout tests
# ----------------------------------------------------------------------------
# Every (rows, kb) pair once; the dtype cycles so that each dtype meets every
# rows value and every kb value (one XLA compilation per case keeps it fast).
GRID = [(r, k, SCALE_DTYPES[(i + j) % 3])
        for (i, r), (j, k) in itertools.product(enumerate(ROWS), enumerate(KBS))]


@pytest.mark.parametrize("rows,kb,dt", GRID,
                         ids=[f"{r}x{k}-{d.name}" for r, k, d in GRID])
def test_swizzle_matches_element_loop(rows, kb, dt):
  rng = np.random.default_rng(rows * 100 + kb)
  s = random_scales(rng, (rows, kb), dt)
  out = swizzle_scales(jnp.asarray(s), "sm100_128x4")
  big_r, big_kb = cdiv(rows, 128) * 128, cdiv(kb, 4) * 4
  assert out.dtype == dt
  assert out.shape == (big_r // 128, big_kb // 4, 32, 4, 4)
  assert out.shape == swizzled_shape((rows, kb))
  flat = bits(out).reshape(-1)
  np.testing.assert_array_equal(flat, ref_swizzle(bits(s)))
  # every padding position holds all-zero bits
  pad = np.ones((big_r, big_kb), bool)
  pad[:rows, :kb] = False
  pad_offsets = [cublas_offset(r, c, big_kb)
                 for r, c in zip(*np.nonzero(pad))]
  assert np.all(flat[pad_offsets] == 0)
  assert len(pad_offsets) == big_r * big_kb - rows * kb
  # round trip
  back = unswizzle_scales(out, rows, kb, "sm100_128x4")
  assert back.dtype == dt and back.shape == (rows, kb)
  np.testing.assert_array_equal(bits(back), bits(s))


@pytest.mark.parametrize("lead,rows,kb", [
  ((2,), 129, 5), ((3, 2), 1, 3), ((2, 1, 2), 300, 9), ((1,), 128, 4)])
@pytest.mark.parametrize("dt", SCALE_DTYPES, ids=lambda d: d.name)
def test_swizzle_batch_dims(lead, rows, kb, dt):
  rng = np.random.default_rng(len(lead) * 1000 + rows + kb)
  s = random_scales(rng, (*lead, rows, kb), dt)
  out = swizzle_scales(s)   # NumPy input accepted, default layout
  big_r, big_kb = cdiv(rows, 128) * 128, cdiv(kb, 4) * 4
  assert out.shape == (*lead, big_r // 128, big_kb // 4, 32, 4, 4)
  assert out.dtype == dt
  # each matrix is contiguous, matrices in row-major order of ``lead``
  np.testing.assert_array_equal(bits(out).reshape(*lead, -1),
                                ref_swizzle(bits(s)))
  back = unswizzle_scales(out, rows, kb)
  np.testing.assert_array_equal(bits(back), bits(s))


@pytest.mark.parametrize("rows,kb,sf_vec", [
  (1, 1, 32), (129, 5, 16), (300, 9, 32), (128, 8, 16)])
def test_swizzle_matches_cutlass_cute_layout(rows, kb, sf_vec):
  """Every element's scale sits where CUTLASS's layout_SFA says (the SFVecSize
  elements of one block share it: stride-0 mode)."""
  s = np.arange(rows * kb, dtype=np.float32).reshape(rows, kb) + 1
  flat = np.asarray(swizzle_scales(s)).reshape(-1)
  shape, stride = cutlass_sf_layout(rows, kb * sf_vec, sf_vec)
  big_r, big_k = 128 * cdiv(rows, 128), 4 * sf_vec * cdiv(kb, 4)
  rng = np.random.default_rng(7)
  for r in range(big_r):
    for k_elem in {0, sf_vec - 1, int(rng.integers(big_k))} | \
        set(range(0, big_k, sf_vec)):
      # 1-D CuTe coordinate of (row r, K element k_elem, batch 0):
      # colexicographic over the modes (row, K, L)
      coord = r + big_r * k_elem
      off = cute_offset(shape, stride, coord)
      kb_i = k_elem // sf_vec
      want = s[r, kb_i] if (r < rows and kb_i < kb) else 0.0
      assert flat[off] == want, (r, k_elem, off)


def test_nvmath_documented_offsets():
  """nvmath-python get_block_scale_offset docs: NVFP4 operand (M=128,
  K=128) -> 8 K-blocks; scale (5, 2) at offset 82, (5, 5) at 593."""
  rows, kb = 128, 8
  s = (np.arange(rows)[:, None] * 1000 + np.arange(kb)[None, :]).astype(
    np.float32)
  flat = np.asarray(swizzle_scales(s, "cublas_128x4")).reshape(-1)
  assert flat[82] == 5002
  assert flat[593] == 5005
  assert flat[0] == 0 and flat[1] == 1 and flat[4] == 32000 and \
    flat[16] == 1000   # rows 0 and 32 are adjacent; row 1 one word later


def test_padding_value_and_e8m0_nan_trap():
  for dt in SCALE_DTYPES + (np.dtype(np.uint8),):
    p = padding_value(dt)
    assert p.dtype == dt and p.shape == ()
    assert int(bits(p)) == 0
    assert np.isfinite(p.astype(np.float32))
  assert float(padding_value(E8M0).astype(np.float32)) == 2.0 ** -127
  # Why the module pads through an integer view: a float zero becomes NaN.
  assert bits(jnp.zeros(1, jnp.float8_e8m0fnu))[0] == 0xFF
  out = swizzle_scales(jnp.ones((1, 1), jnp.float8_e8m0fnu))
  b = bits(out).reshape(-1)
  assert b[0] == 127 and np.all(b[1:] == 0)
  assert not np.isnan(np.asarray(out).astype(np.float32)).any()
  # raw uint8 scale bytes swizzle the same way
  raw = swizzle_scales(jnp.ones((1, 1), jnp.float8_e8m0fnu).view(jnp.uint8))
  assert raw.dtype == np.uint8
  np.testing.assert_array_equal(np.asarray(raw), bits(out))


def test_jit():
  rng = np.random.default_rng(3)
  s = random_scales(rng, (2, 129, 5), E8M0)
  eager = swizzle_scales(s)
  jitted = jax.jit(swizzle_scales, static_argnums=1)(s, "sm100_128x4")
  np.testing.assert_array_equal(bits(jitted), bits(eager))
  un = jax.jit(unswizzle_scales, static_argnums=(1, 2, 3))(
    jitted, 129, 5, "sm100_128x4")
  np.testing.assert_array_equal(bits(un), bits(s))

  # inside a larger jitted computation (tracer input)
  @jax.jit
  def f(x):
    return unswizzle_scales(swizzle_scales(x * 2), 129, 5)
  x = np.abs(rng.standard_normal((129, 5))).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(f(x)), x * 2)


def test_rowmajor_layout_is_identity():
  s = jnp.asarray(random_scales(np.random.default_rng(0), (3, 7), E4M3))
  assert swizzle_scales(s, "rowmajor") is s
  assert unswizzle_scales(s, 3, 7, "rowmajor") is s
  assert swizzled_shape((2, 3, 7), "rowmajor") == (2, 3, 7)
  with pytest.raises(ValueError, match=r"swizzled must have shape "
                     r"\(\.\.\., 3, 8\), got \(3, 7\)"):
    unswizzle_scales(s, 3, 8, "rowmajor")


# ----------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------
def test_registry():
  assert layouts.LAYOUT_NAMES == ("rowmajor", "sm100_128x4")
  lay = get_layout("sm100_128x4")
  assert get_layout("cublas_128x4") is lay
  assert get_layout("cutlass_sm1xx") is lay
  assert get_layout(lay) is lay
  assert LAYOUTS["rowmajor"].padded_dims(5, 3) == (5, 3)
  assert lay.padded_dims(129, 5) == (256, 8)
  assert lay.padded_dims(128, 4) == (128, 4)
  assert swizzled_shape((4, 300, 9)) == (4, 3, 3, 32, 4, 4)
  text = str(lay)
  for needle in ("sm100_128x4", "cublas_128x4", "128x4", "padding",
                 "(row%32)*16 + (row%128//32)*4 + kb%4", "VEC32_UE8M0"):
    assert needle in text, needle
  table = layouts.layouts_table()
  assert "rowmajor" in table and "sm100_128x4" in table


# ----------------------------------------------------------------------------
# quantize integration
# ----------------------------------------------------------------------------
QUANT_CASES = [
  ("mxfp8", (129, 100), -1), ("mxfp8", (2, 3, 40, 70), 2),
  ("mxfp8", (1, 300), -1), ("nvfp4", (129, 100), -1),
  ("nvfp4", (2, 3, 40, 70), 2), ("mxfp4", (300, 33), -1),
  ("mxfp6_e2m3", (64, 2, 96), 0), ("mxfp6_e3m2", (130, 128), -1)]


@pytest.mark.parametrize("fmt,shape,axis", QUANT_CASES)
def test_quantize_layout(fmt, shape, axis):
  x = jax.random.normal(jax.random.PRNGKey(len(shape)), shape) * 3
  q = quantize(x, fmt, axis=axis)
  qs = quantize(x, fmt, axis=axis, layout="sm100_128x4")
  assert q.layout == "rowmajor" and qs.layout == "sm100_128x4"
  rows, kb = q.scales.shape[-2:]
  lead = q.scales.shape[:-2]
  assert qs.scales.shape == (*lead, cdiv(rows, 128), cdiv(kb, 4), 32, 4, 4)
  assert qs.scales.dtype == q.scales.dtype
  np.testing.assert_array_equal(bits(qs.scales).reshape(*lead, -1),
                                ref_swizzle(bits(q.scales)))
  np.testing.assert_array_equal(bits(qs.data), bits(q.data))
  np.testing.assert_array_equal(np.asarray(dequantize(qs)),
                                np.asarray(dequantize(q)))
  for a, b in zip(to_jax_scaled_matmul_inputs(qs),
                  to_jax_scaled_matmul_inputs(q)):
    if a is None:
      assert b is None
    else:
      np.testing.assert_array_equal(bits(a), bits(b))
  # to_layout both ways
  back = to_layout(qs, "rowmajor")
  assert back.layout == "rowmajor"
  np.testing.assert_array_equal(bits(back.scales), bits(q.scales))
  fwd = to_layout(q, "cublas_128x4")
  assert fwd.layout == "sm100_128x4"
  np.testing.assert_array_equal(bits(fwd.scales), bits(qs.scales))
  assert to_layout(qs, "sm100_128x4") is qs


def test_quantize_layout_jit_and_pytree():
  x = jax.random.normal(jax.random.PRNGKey(1), (130, 64))
  f = jax.jit(lambda v: quantize(v, "nvfp4", layout="sm100_128x4"))
  qj = f(x)
  qe = quantize(x, "nvfp4", layout="sm100_128x4")
  assert qj.layout == "sm100_128x4"
  np.testing.assert_array_equal(bits(qj.scales), bits(qe.scales))
  leaves, tree = jax.tree_util.tree_flatten(qj)
  q2 = jax.tree_util.tree_unflatten(tree, leaves)
  assert q2.layout == "sm100_128x4"
  out = jax.jit(dequantize)(qj)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(dequantize(qe)))
  q3 = jax.jit(lambda q: to_layout(q, "rowmajor"))(qj)
  assert q3.layout == "rowmajor" and q3.scales.shape == (130, 4)


def test_quantize_layout_keeps_nan_scale():
  x = np.ones((3, 64), np.float32)
  x[1, 40] = np.nan
  qs = quantize(x, "mxfp4", layout="sm100_128x4")
  flat = bits(qs.scales).reshape(-1)
  assert flat[cublas_offset(1, 1, 4)] == 0xFF        # poisoned block
  assert flat[cublas_offset(1, 0, 4)] == 127 - 2     # 2^(0 - emax_elem 2)
  d = np.asarray(dequantize(qs))
  assert np.isnan(d[1, 32:]).all() and not np.isnan(d[1, :32]).any()


# ----------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------
def test_errors_swizzle():
  ok = np.ones((4, 3), np.float32)
  with pytest.raises(ValueError, match=r"swizzle_scales: scales must have "
                     r"at least 2 dimensions \(\.\.\., rows, k_blocks\), "
                     r"got shape \(4,\)"):
    swizzle_scales(np.ones(4, np.float32))
  with pytest.raises(ValueError, match=r"every dimension of scales must be "
                     r">= 1.*got shape \(0, 3\)"):
    swizzle_scales(np.ones((0, 3), np.float32))
  with pytest.raises(TypeError, match=r"swizzle_scales: scales.dtype must "
                     r"be one of float8_e8m0fnu, float8_e4m3fn, float32, "
                     r"uint8, got float16"):
    swizzle_scales(ok.astype(np.float16))
  with pytest.raises(TypeError, match=r"scales must be an array, got list"):
    swizzle_scales([[1.0]])
  with pytest.raises(ValueError, match=r"swizzle_scales: unknown scale "
                     r"layout 'tiled'; valid names are: rowmajor, "
                     r"sm100_128x4"):
    swizzle_scales(ok, "tiled")
  with pytest.raises(TypeError, match=r"layout must be a layout name"):
    swizzle_scales(ok, 128)


def test_errors_unswizzle():
  sw = swizzle_scales(np.ones((129, 5), np.float32))   # (2, 2, 32, 4, 4)
  with pytest.raises(ValueError, match=r"unswizzle_scales: for layout "
                     r"'sm100_128x4' with rows=300, k_blocks=5, swizzled "
                     r"must have shape \(\.\.\., 3, 2, 32, 4, 4\), got "
                     r"\(2, 2, 32, 4, 4\)"):
    unswizzle_scales(sw, 300, 5)
  with pytest.raises(ValueError, match=r"\(\.\.\., 2, 3, 32, 4, 4\)"):
    unswizzle_scales(sw, 129, 9)
  with pytest.raises(ValueError, match=r"unswizzle_scales: rows must be "
                     r">= 1, got 0"):
    unswizzle_scales(sw, 0, 5)
  with pytest.raises(TypeError, match=r"unswizzle_scales: k_blocks must be "
                     r"a \(static\) int, got 5.0"):
    unswizzle_scales(sw, 129, 5.0)
  with pytest.raises(TypeError, match=r"swizzled.dtype must be one of"):
    unswizzle_scales(np.ones((2, 2, 32, 4, 4), np.int32), 129, 5)
  # rows / k_blocks smaller than one atom row still need the padded shape
  with pytest.raises(ValueError, match=r"\(\.\.\., 1, 1, 32, 4, 4\)"):
    unswizzle_scales(np.ones((1, 3), np.float32), 1, 3)


def test_errors_quantize_and_quantized_array():
  x = np.ones((4, 256), np.float32)
  for fmt in ("fp8_tensor", "fp8_channel", "fp8_1x128", "fp8_128x128"):
    with pytest.raises(ValueError, match=r"quantize: layout 'sm100_128x4' "
                       r"is only for block-scaled formats with E8M0/E4M3 "
                       r"scales \(mxfp8, nvfp4, mxfp4, mxfp6_e2m3, "
                       rf"mxfp6_e3m2\); format '{fmt}' has float32"):
      quantize(x, fmt, layout="sm100_128x4")
  with pytest.raises(ValueError, match=r"quantize: layout must be 'rowmajor' "
                     r"or 'sm100_128x4'.*got 'tiled'"):
    quantize(x, "mxfp8", layout="tiled")
  with pytest.raises(TypeError, match=r"quantize: layout must be"):
    quantize(x, "mxfp8", layout=None)
  q = quantize(x, "fp8_channel")
  with pytest.raises(ValueError, match=r"QuantizedArray: layout "
                     r"'sm100_128x4' is only for block-scaled formats"):
    QuantizedArray(q.data, q.scales, format="fp8_channel", shape=(4, 256),
                   layout="sm100_128x4")
  with pytest.raises(ValueError, match=r"to_layout: layout 'sm100_128x4' "
                     r"is only for block-scaled formats"):
    to_layout(q, "sm100_128x4")
  with pytest.raises(TypeError, match=r"to_layout: q must be a "
                     r"QuantizedArray, got ndarray"):
    to_layout(x, "rowmajor")
  with pytest.raises(ValueError, match=r"to_layout: unknown scale layout"):
    to_layout(q, "nope")
  # constructor accepts aliases and stores the canonical name
  qm = quantize(x, "mxfp8")
  qa = QuantizedArray(qm.data, swizzle_scales(qm.scales), format="mxfp8",
                      shape=(4, 256), layout="cublas_128x4")
  assert qa.layout == "sm100_128x4"
  np.testing.assert_array_equal(np.asarray(dequantize(qa)),
                                np.asarray(dequantize(qm)))
