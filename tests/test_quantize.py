"""Tests for jax_gmma.quantize (pure-JAX scale management), CPU only."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_gmma.numerics.formats import FORMATS, get_format
from jax_gmma.arrays import QuantizedArray
from jax_gmma.ops.quantize import (
  dequantize,
  pack_fp4,
  pack_fp6,
  quantize,
  round_to_dtype,
  storage_dtype,
  to_jax_scaled_matmul_inputs,
  unpack_fp4,
  unpack_fp6,
)

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E2M3 = np.dtype(ml_dtypes.float6_e2m3fn)
E3M2 = np.dtype(ml_dtypes.float6_e3m2fn)
MX_FORMATS = ("mxfp8", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
FP8_F32_FORMATS = ("fp8_tensor", "fp8_channel", "fp8_1x128", "fp8_128x128")
NO_NAN_FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")


def f32(a):
  """Any array (jax or numpy, any float dtype incl. ml_dtypes) -> float32."""
  return np.asarray(a).astype(np.float32)


# XLA:CPU may evaluate float32 division as a reciprocal multiply (not
# correctly rounded), so scales computed as amax / max are compared with a
# tolerance of a couple of float32 ulps.
ULP_RTOL = 3e-7


def assert_rounded(actual, exact, dt, rel=1e-6):
  """``actual`` (values of low-precision ``dt``) is the round-to-nearest-even
  ``dt`` value of ``exact`` (float64), allowing ``exact`` to be perturbed by
  a relative ``rel`` (float32 division inexactness) -- i.e. it equals the
  rounding of ``exact*(1-rel)`` or of ``exact*(1+rel)``."""
  vmax = float(ml_dtypes.finfo(dt).max)
  exact = np.asarray(exact, np.float64)

  def rnd(v):
    return np.clip(v, -vmax, vmax).astype(np.float32).astype(dt) \
      .astype(np.float32)
  lo, hi = rnd(exact * (1 - rel)), rnd(exact * (1 + rel))
  actual = f32(actual)
  ok = (actual == lo) | (actual == hi)
  assert ok.all(), (actual[~ok][:5], exact[~ok][:5])


def rel_fro(approx, exact):
  approx = np.asarray(approx, np.float64)
  exact = np.asarray(exact, np.float64)
  return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


def normal(seed, shape, scale=1.0):
  return (np.random.default_rng(seed).standard_normal(shape) * scale
      ).astype(np.float32)


def heavy(seed, shape):
  """Student-t with 2 degrees of freedom: heavy tails / outliers."""
  return np.random.default_rng(seed).standard_t(2, shape).astype(np.float32)


def np_blocks(x, br, bk):
  """numpy twin of the blocking: zero-pad (R, K) and view (nR, br, nK, bk)."""
  r, k = x.shape
  nr, nk = -(-r // br), -(-k // bk)
  xp = np.zeros((nr * br, nk * bk), np.float32)
  xp[:r, :k] = x
  return xp.reshape(nr, br, nk, bk)


# ---------------------------------------------------------------------------
# round trips
# ---------------------------------------------------------------------------
# Bounds on the relative Frobenius error (measured ~0.6-0.8x of these).  For
# normal data the error is set by the element's mantissa: unit roundoff 2^-4
# (e4m3, e2m3), 2^-3 (e5m2, e3m2), 2^-2 (e2m1); MX floor rounding of the
# exponent adds saturation of block maxima.
BOUNDS = {  # (format, dtype): (normal, heavy-tailed)
  ("fp8_tensor", E4M3): (0.035, 0.04),
  ("fp8_channel", E4M3): (0.035, 0.035),
  ("fp8_1x128", E4M3): (0.035, 0.035),
  ("fp8_128x128", E4M3): (0.035, 0.04),
  ("mxfp8", E4M3): (0.04, 0.06),
  ("fp8_tensor", E5M2): (0.07, 0.075),
  ("fp8_channel", E5M2): (0.07, 0.06),
  ("fp8_1x128", E5M2): (0.07, 0.06),
  ("fp8_128x128", E5M2): (0.07, 0.07),
  ("mxfp8", E5M2): (0.07, 0.085),
  ("nvfp4", E2M1): (0.12, 0.12),
  ("mxfp4", E2M1): (0.14, 0.2),
  ("mxfp6_e2m3", E2M3): (0.04, 0.06),
  ("mxfp6_e3m2", E3M2): (0.07, 0.085),
}


@pytest.mark.parametrize("fmt,dtype", sorted(BOUNDS, key=str),
                         ids=lambda v: getattr(v, "name", v))
def test_round_trip_error(fmt, dtype):
  bound_n, bound_h = BOUNDS[(fmt, dtype)]
  for i, (x, bound) in enumerate(((normal(1, (96, 300), 3.0), bound_n),
                                  (heavy(2, (96, 300)), bound_h))):
    q = quantize(x, fmt, dtype=dtype)
    assert q.dtype == dtype
    d = dequantize(q)
    assert d.shape == x.shape and d.dtype == jnp.float32
    err = rel_fro(d, x)
    assert err < bound, (fmt, dtype, "normal" if i == 0 else "heavy", err)
    assert np.all(np.isfinite(np.asarray(d)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_quantize_dequantize_in_one_jit_equals_materialized(fmt):
  # On a GPU, XLA's excess-precision folding (on by default) once turned
  # convert(convert(v, fp8/fp4), f32) inside one program into v: the
  # dequantized values were not those of the stored operands.  Each program
  # (fused, and quantize / dequantize apart) must give the same bits.
  x = normal(11, (48, 160)) * 3.0
  fused = jax.jit(lambda a: dequantize(quantize(a, fmt)))(x)
  q = quantize(x, fmt)
  apart = dequantize(q)
  np.testing.assert_array_equal(np.asarray(fused), np.asarray(apart))
  assert rel_fro(apart, x) > 1e-3  # really quantized


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_batched_axis_and_dtypes(fmt):
  x = normal(3, (2, 40, 72))
  q = quantize(x, fmt)
  assert q.shape == x.shape and q.k == 72 and q.axis == 2
  assert q.data.shape == (2, 40, q.format.padded_k(72))
  assert q.scales.shape == q.format.scales_shape((2, 40, 72))
  d = np.asarray(dequantize(q))
  # K is axis 1: stored data is (2, 72, Kp(40)), dequantize restores layout.
  q1 = quantize(x, fmt, axis=1)
  assert q1.axis == 1 and q1.k == 40
  assert q1.data.shape == (2, 72, q1.format.padded_k(40))
  d1 = np.asarray(dequantize(q1))
  assert d1.shape == x.shape
  q1t = quantize(np.swapaxes(x, 1, 2), fmt)  # same thing, pre-transposed
  np.testing.assert_array_equal(f32(q1.data), f32(q1t.data))
  np.testing.assert_array_equal(d1, np.swapaxes(np.asarray(dequantize(q1t)),
                                                1, 2))
  # bf16 in, bf16 out
  qb = quantize(jnp.asarray(x, jnp.bfloat16), fmt)
  db = dequantize(qb, jnp.bfloat16)
  assert db.dtype == jnp.bfloat16
  assert rel_fro(f32(db), x) < 0.2
  assert rel_fro(d, x) < 0.2


def test_weight_k_first_axis0():
  w = normal(4, (256, 48))  # (K, N) weight, contraction over axis 0
  q = quantize(w, "fp8_channel", axis=0)
  assert q.data.shape == (48, 256) and q.scales.shape == (48, 1)
  np.testing.assert_allclose(np.asarray(q.scales)[:, 0],
                             np.abs(w).max(axis=0) / 448.0, rtol=ULP_RTOL)
  assert dequantize(q).shape == (256, 48)


# ---------------------------------------------------------------------------
# scale computation
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FP8_F32_FORMATS)
def test_fp8_amax_scales(fmt):
  x = normal(5, (200, 300))
  q = quantize(x, fmt)
  if fmt == "fp8_tensor":
    br, bk = 200, 300
  else:
    br, bk = get_format(fmt).block_dims(200, 300)
  amax = np.abs(np_blocks(x, br, bk)).max(axis=(1, 3))
  ref = (amax / 448.0).reshape(np.shape(q.scales))
  np.testing.assert_allclose(np.asarray(q.scales), ref, rtol=ULP_RTOL)
  # every block's amax element lands exactly on +-448
  db = np_blocks(f32(q.data)[:, :300], br, bk)
  np.testing.assert_array_equal(np.abs(db).max(axis=(1, 3)), 448.0)
  # elements are the e4m3 rounding of x / scale
  s = np.asarray(q.scales, np.float64)
  if fmt != "fp8_tensor":
    s = np.repeat(np.repeat(s, br, 0), bk, 1)[:200, :300]
  assert_rounded(f32(q.data)[:, :300], x / s, E4M3)


def np_mx_reference(x, dt, bk=32):
  """Independent OCP MX v1.0 reference: exponent from np.frexp, not log2."""
  emax = {E4M3: 8, E5M2: 15, E2M1: 2, E2M3: 2, E3M2: 4}[dt]
  vmax = float(ml_dtypes.finfo(dt).max)
  xb = np_blocks(x, 1, bk)[:, 0]                    # (R, nK, bk)
  amax = np.abs(xb).max(axis=-1)
  _, e = np.frexp(amax)                            # amax = m * 2^e, m in [.5,1)
  exp = np.where(amax > 0, e - 1 - emax, 0)
  exp = np.clip(exp, -126, 127)
  scale = np.ldexp(np.float32(1), exp).astype(np.float32)
  data = np.clip(xb / scale[..., None], -vmax, vmax).astype(dt)
  return exp, scale, data.astype(np.float32).reshape(x.shape[0], -1)


@pytest.mark.parametrize("fmt,dtype", [("mxfp8", E4M3), ("mxfp8", E5M2),
                                       ("mxfp4", E2M1), ("mxfp6_e2m3", E2M3),
                                       ("mxfp6_e3m2", E3M2)],
                         ids=lambda v: getattr(v, "name", v))
def test_e8m0_matches_numpy_reference(fmt, dtype):
  rng = np.random.default_rng(6)
  # Wide dynamic range across blocks: 2^-40 .. 2^40 block magnitudes, plus
  # block maxima placed exactly on powers of two (frexp boundary cases).
  x = (rng.standard_normal((64, 200)) *
       np.exp2(rng.integers(-40, 40, (64, 1)))).astype(np.float32)
  x[:8, :32] = 0.0                                  # zero blocks
  x[8:16, 0] = np.exp2(rng.integers(-20, 20, 8)).astype(np.float32)
  q = quantize(x, fmt, dtype=dtype)
  exp, scale, data = np_mx_reference(x, dtype)
  assert q.scales.dtype == jnp.float8_e8m0fnu and q.scales.shape == (64, 7)
  np.testing.assert_array_equal(f32(q.scales), scale)
  # raw E8M0 bits are the biased exponent
  np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8),
                                (exp + 127).astype(np.uint8))
  np.testing.assert_array_equal(f32(q.data), data)
  np.testing.assert_array_equal(f32(q.scales)[:8, 0], 1.0)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_scales_are_powers_of_two(fmt):
  x = heavy(7, (50, 256)) * np.float32(1e3)
  s = f32(quantize(x, fmt).scales)
  m, _ = np.frexp(s)
  assert np.all(m == 0.5), "E8M0 scales must be exact powers of two"


def test_mx_saturation_of_block_max():
  # floor(log2(500)) - 8 = 0 -> scale 1, and 500 > 448 must clamp to 448.
  x = np.ones((2, 32), np.float32)
  x[0, 3] = 500.0
  x[1, 3] = -500.0
  q = quantize(x, "mxfp8")
  np.testing.assert_array_equal(f32(q.scales), 1.0)
  np.testing.assert_array_equal(f32(q.data)[:, 3], [448.0, -448.0])
  # e5m2: floor(log2(60000)) - 15 = 0 -> 60000 clamps to 57344
  x[0, 3] = 60000.0
  q = quantize(x, "mxfp8", dtype=jnp.float8_e5m2)
  assert f32(q.data)[0, 3] == 57344.0


def test_nvfp4_two_level_scaling():
  x = normal(8, (40, 96), 5.0)
  q = quantize(x, "nvfp4")
  assert q.global_scale.dtype == jnp.float32 and q.global_scale.shape == ()
  g = np.asarray(q.global_scale)
  np.testing.assert_allclose(g, np.abs(x).max() / (448.0 * 6), rtol=ULP_RTOL)
  g = np.float64(g)
  amax = np.abs(x.reshape(40, 6, 16)).max(-1).astype(np.float64)
  assert q.scales.dtype == jnp.float8_e4m3fn and q.scales.shape == (40, 6)
  assert_rounded(q.scales, amax / 6 / g, E4M3)       # level 2: e4m3 blocks
  s = f32(q.scales).astype(np.float64)
  denom = np.repeat(s, 16, axis=1) * g
  assert_rounded(q.data, x / denom, E2M1)             # elements
  # dequantize is exactly data * (block_scale * global)
  np.testing.assert_array_equal(
    np.asarray(dequantize(q)),
    f32(q.data) * (np.repeat(f32(q.scales), 16, axis=1) *
                   np.float32(g)))


def test_nvfp4_exact_representable_round_trip():
  """x = fp4 * e4m3 * G with G a power of two and max 6*448*G round-trips
  bit-exactly through both scaling levels."""
  rng = np.random.default_rng(9)
  fp4_vals = np.arange(16, dtype=np.uint8).view(E2M1).astype(np.float32)
  d = rng.choice(fp4_vals, size=(24, 64)).astype(np.float32)
  d[:, ::16] = 6.0 * rng.choice([-1, 1], size=(24, 4))  # each block max 6
  e4m3_vals = np.arange(1, 0x7F, dtype=np.uint8).view(E4M3).astype(np.float32)
  s = rng.choice(e4m3_vals[e4m3_vals >= 2.0 ** -6], size=(24, 4))
  s[0, 0] = 448.0
  G = np.float32(2.0 ** -7)
  x = (d * np.repeat(s, 16, axis=1) * G).astype(np.float32)
  q = quantize(x, "nvfp4")
  assert np.asarray(q.global_scale) == G
  np.testing.assert_array_equal(f32(q.scales), s)
  np.testing.assert_array_equal(f32(q.data), d)
  np.testing.assert_array_equal(np.asarray(dequantize(q)), x)


# ---------------------------------------------------------------------------
# padding and shapes
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,k,nk", [("mxfp8", 200, 7), ("nvfp4", 33, 3),
                                      ("fp8_1x128", 129, 2),
                                      ("mxfp6_e2m3", 5, 1), ("mxfp4", 1, 1)])
def test_padding_k(fmt, k, nk):
  x = normal(10, (3, k)) + np.float32(1.0)
  q = quantize(x, fmt)
  bk = get_format(fmt).block_shape[1]
  assert q.data.shape == (3, nk * bk)
  assert q.scales.shape == (3, nk)
  assert q.k == k and q.padded_k == nk * bk
  np.testing.assert_array_equal(f32(q.data)[:, k:], 0.0)  # zero padding
  d = dequantize(q)
  assert d.shape == (3, k)
  # last block's scale only sees the real tail elements
  tail = np.abs(x[:, (nk - 1) * bk:]).max(axis=1)
  ref = quantize(np.pad(x, ((0, 0), (0, nk * bk - k))), fmt)
  np.testing.assert_array_equal(f32(q.scales), f32(ref.scales))
  if fmt == "fp8_1x128":
    np.testing.assert_allclose(np.asarray(q.scales)[:, -1], tail / 448.0,
                               rtol=ULP_RTOL)


def test_128x128_shapes():
  x = normal(11, (200, 300))
  q = quantize(x, "fp8_128x128")
  assert q.data.shape == (200, 384)       # K padded, rows not padded
  assert q.scales.shape == (2, 3)
  np.testing.assert_allclose(np.asarray(q.scales)[1, 2],
                             np.abs(x[128:, 256:]).max() / 448.0,
                             rtol=ULP_RTOL)
  assert dequantize(q).shape == (200, 300)
  qb = quantize(normal(12, (4, 130, 64)), "fp8_128x128")
  assert qb.scales.shape == (4, 2, 1)


def test_tensor_and_channel_shapes():
  x = normal(13, (2, 5, 7))
  qt = quantize(x, "fp8_tensor")
  assert qt.scales.shape == () and qt.data.shape == (2, 5, 7)
  np.testing.assert_allclose(np.asarray(qt.scales), np.abs(x).max() / 448.0,
                             rtol=ULP_RTOL)
  q1 = quantize(x[0, 0], "fp8_tensor")     # 1-D allowed per-tensor
  assert q1.shape == (7,) and dequantize(q1).shape == (7,)
  qc = quantize(x, "fp8_channel")
  assert qc.scales.shape == (2, 5, 1)
  np.testing.assert_allclose(np.asarray(qc.scales)[..., 0],
                             np.abs(x).max(-1) / 448.0, rtol=ULP_RTOL)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_zero_blocks(fmt):
  x = np.zeros((4, 64), np.float32)
  q = quantize(x, fmt)
  np.testing.assert_array_equal(f32(q.scales), 1.0)
  if q.global_scale is not None:
    assert np.asarray(q.global_scale) == 1.0
  np.testing.assert_array_equal(f32(q.data), 0.0)
  np.testing.assert_array_equal(np.asarray(dequantize(q)), 0.0)
  # a zero row/block next to data stays exactly zero
  x[1:] = normal(14, (3, 64))
  d = np.asarray(dequantize(quantize(x, fmt)))
  assert np.all(np.isfinite(d))
  np.testing.assert_array_equal(d[0], 0.0)


# ---------------------------------------------------------------------------
# saturation and special values
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_saturation_no_overflow(fmt):
  x = normal(15, (8, 64))
  x[0, :5] = [3.4028235e38, -3.4028235e38, 1e38, 3e38, -1e30]
  x[1, 7] = 1e-30  # huge dynamic range inside one tensor
  for dt in get_format(fmt).allowed_dtypes:
    q = quantize(x, fmt, dtype=dt)
    data = f32(q.data)
    assert np.all(np.isfinite(data)), "no NaN/Inf from finite input"
    assert np.abs(data).max() <= float(ml_dtypes.finfo(dt).max)
    assert np.all(np.isfinite(f32(q.scales)))
    d = np.asarray(dequantize(q))
    assert np.all(np.isfinite(d))
    assert np.all(np.sign(d[0, :4]) == np.sign(x[0, :4]))
    # the largest finite value comes back within the format's relative
    # precision (MX floor rounding can clamp up to ~12.5% for e4m3, 25%+
    # for fp4)
    assert d[0, 0] > 0.6 * x[0, 0]


@pytest.mark.parametrize("fmt", FP8_F32_FORMATS + ("mxfp8",))
def test_nan_inf_elementwise_fp8(fmt):
  x = normal(16, (4, 128))
  x[0, 5] = np.nan
  x[1, 7] = np.inf
  x[2, 9] = -np.inf
  finite = np.isfinite(x)
  ref = quantize(np.where(finite, x, 0), fmt)   # amax ignores non-finite
  for dt, inf_out in ((E4M3, np.nan), (E5M2, np.inf)):
    q = quantize(x, fmt, dtype=dt)
    d = np.asarray(dequantize(q))
    assert np.isnan(d[0, 5])
    if np.isnan(inf_out):          # e4m3fn has no Inf -> NaN
      assert np.isnan(d[1, 7]) and np.isnan(d[2, 9])
    else:
      assert d[1, 7] == np.inf and d[2, 9] == -np.inf
    assert np.all(np.isfinite(d[finite]))
    assert np.all(np.isfinite(f32(q.scales)))
    qr = quantize(np.where(finite, x, 0), fmt, dtype=dt)
    np.testing.assert_array_equal(f32(q.scales), f32(qr.scales))
    np.testing.assert_array_equal(d[finite],
                                  np.asarray(dequantize(qr))[finite])
  assert ref.scales.shape == q.scales.shape


@pytest.mark.parametrize("fmt", NO_NAN_FORMATS)
def test_nan_inf_poison_block_fp4_fp6(fmt):
  bk = get_format(fmt).block_shape[1]
  x = normal(17, (3, 4 * bk))
  x[0, 1] = np.nan
  x[1, 2 * bk + 3] = np.inf
  q = quantize(x, fmt)
  s = f32(q.scales)
  assert np.isnan(s[0, 0]) and np.isnan(s[1, 2])
  assert np.sum(np.isnan(s)) == 2
  if q.global_scale is not None:   # global scale from finite values only
    xf = np.where(np.isfinite(x), x, 0)
    np.testing.assert_allclose(np.asarray(q.global_scale),
                               np.abs(xf).max() / 2688.0, rtol=ULP_RTOL)
  d = np.asarray(dequantize(q))
  assert np.all(np.isnan(d[0, :bk]))
  assert np.all(np.isnan(d[1, 2 * bk:3 * bk]))
  poisoned = np.zeros_like(x, bool)
  poisoned[0, :bk] = True
  poisoned[1, 2 * bk:3 * bk] = True
  assert np.all(np.isfinite(d[~poisoned]))
  assert np.all(np.isfinite(f32(q.data)))


# ---------------------------------------------------------------------------
# FP6 rounding emulation / storage
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [E2M3, E3M2, E2M1, E4M3], ids=lambda d: d.name)
def test_round_to_dtype_matches_ml_dtypes(dt):
  rng = np.random.default_rng(18)
  grid = np.arange(2 ** 7 if dt == E4M3 else 2 ** 5 if dt != E2M1 else 8,
                   dtype=np.uint8).view(dt).astype(np.float32)
  grid = grid[np.isfinite(grid)]
  mids = (grid[1:] + grid[:-1]) / 2                      # exact ties
  vmax = float(ml_dtypes.finfo(dt).max)
  vals = np.concatenate([
    grid, mids, np.nextafter(mids, np.float32(np.inf)),
    np.nextafter(mids, np.float32(-np.inf)),
    rng.uniform(-1.2 * vmax, 1.2 * vmax, 5000).astype(np.float32),
    (rng.standard_normal(5000) * 0.1).astype(np.float32)])
  vals = np.concatenate([vals, -vals]).astype(np.float32)
  ours = np.asarray(round_to_dtype(jnp.asarray(vals), dt))
  ref = np.clip(vals, -vmax, vmax).astype(dt).astype(np.float32)
  np.testing.assert_array_equal(ours, ref)
  np.testing.assert_array_equal(np.signbit(ours), np.signbit(ref))


def test_fp6_storage():
  for dt in (E2M3, E3M2):
    st = storage_dtype(dt)
    assert st == E4M3   # exact container, same on every JAX version
    q = quantize(normal(19, (4, 64)), "mxfp6_e2m3" if dt == E2M3
                 else "mxfp6_e3m2")
    assert q.dtype == dt and np.dtype(q.data.dtype) == st
    # every stored value is exactly an FP6 value
    v = f32(q.data)
    np.testing.assert_array_equal(v.astype(dt).astype(np.float32), v)


# ---------------------------------------------------------------------------
# pytree / jit
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fp8_1x128", "mxfp8", "nvfp4", "mxfp6_e3m2"])
def test_pytree_flatten_unflatten_jit(fmt):
  x = normal(20, (2, 16, 80))
  q = quantize(x, fmt, axis=2)
  leaves, treedef = jax.tree_util.tree_flatten(q)
  assert len(leaves) == (3 if fmt == "nvfp4" else 2)
  q2 = jax.tree_util.tree_unflatten(treedef, leaves)
  assert isinstance(q2, QuantizedArray)
  assert (q2.format, q2.shape, q2.axis, q2.dtype, q2.layout) == \
    (q.format, q.shape, q.axis, q.dtype, "rowmajor")
  assert q2.global_scale is None if fmt != "nvfp4" else \
    q2.global_scale is not None

  # through jit: as input, as output and quantising inside
  q3 = jax.jit(lambda a: a)(q)
  assert isinstance(q3, QuantizedArray) and q3.format.name == fmt
  assert jax.tree_util.tree_structure(q3) == treedef
  np.testing.assert_array_equal(np.asarray(jax.jit(dequantize)(q)),
                                np.asarray(dequantize(q)))
  qj = jax.jit(lambda a: quantize(a, fmt))(x)
  np.testing.assert_array_equal(f32(qj.data), f32(q.data))
  np.testing.assert_array_equal(f32(qj.scales), f32(q.scales))
  qs = jax.jit(quantize, static_argnames=("format", "dtype", "axis"))(
    x, format=fmt)
  np.testing.assert_array_equal(f32(qs.data), f32(q.data))
  # tree_map keeps the static metadata
  qm = jax.tree_util.tree_map(lambda a: a, q)
  assert qm.shape == q.shape and qm.format is q.format
  assert "QuantizedArray(format=" in repr(q)


def test_quantized_array_constructor_checks():
  x = normal(21, (4, 32))
  q = quantize(x, "nvfp4")
  with pytest.raises(ValueError, match="'nvfp4' needs a global_scale"):
    QuantizedArray(q.data, q.scales, None, format="nvfp4", shape=(4, 32))
  with pytest.raises(ValueError, match="has no global_scale"):
    QuantizedArray(q.data, q.scales, 1.0, format="mxfp8", shape=(4, 32))
  with pytest.raises(ValueError, match="layout must be 'rowmajor'"):
    QuantizedArray(q.data, q.scales, q.global_scale, format="nvfp4",
                   shape=(4, 32), layout="swizzled")
  with pytest.raises(ValueError, match="unknown format name 'bogus'"):
    QuantizedArray(q.data, q.scales, None, format="bogus", shape=(4, 32))
  q2 = QuantizedArray(q.data, q.scales, q.global_scale, format="nvfp4",
                      shape=(4, 32))
  np.testing.assert_array_equal(np.asarray(dequantize(q2)),
                                np.asarray(dequantize(q)))


# ---------------------------------------------------------------------------
# packing
# ---------------------------------------------------------------------------
def ref_pack_bits(codes, bits):
  """Pure-python little-endian bit packer (element i at bit offset i*bits)."""
  out = []
  for row in np.asarray(codes, np.int64).reshape(-1, codes.shape[-1]):
    acc = 0
    for i, c in enumerate(row):
      acc |= int(c) << (i * bits)
    nbytes = len(row) * bits // 8
    out.append([(acc >> (8 * j)) & 0xFF for j in range(nbytes)])
  return np.array(out, np.uint8).reshape(*codes.shape[:-1], -1)


def test_pack_fp4_all_codes_and_bit_order():
  codes = np.arange(16, dtype=np.uint8)
  data = codes.view(E2M1)
  packed = np.asarray(pack_fp4(data))
  assert packed.dtype == np.uint8 and packed.shape == (8,)
  np.testing.assert_array_equal(packed, codes[0::2] | (codes[1::2] << 4))
  np.testing.assert_array_equal(packed, ref_pack_bits(codes, 4))
  # explicit: [0.5, 1.0] -> codes 1, 2 -> 0x21 (even element = low nibble)
  assert int(pack_fp4(np.array([0.5, 1.0], np.float32).astype(E2M1))[0]) \
    == 0x21
  back = np.asarray(unpack_fp4(packed))
  assert back.dtype == E2M1
  np.testing.assert_array_equal(back.view(np.uint8), codes)  # -0 kept


def test_pack_fp4_round_trip_quantized():
  q = quantize(normal(22, (3, 5, 48)), "nvfp4")
  p = pack_fp4(q.data)
  assert p.shape == (3, 5, 24) and p.dtype == jnp.uint8
  back = unpack_fp4(p)
  np.testing.assert_array_equal(np.asarray(back).view(np.uint8),
                                np.asarray(q.data).view(np.uint8))
  pj = jax.jit(pack_fp4)(q.data)
  np.testing.assert_array_equal(np.asarray(pj), np.asarray(p))


@pytest.mark.parametrize("dt", [E2M3, E3M2], ids=lambda d: d.name)
def test_pack_fp6_all_codes_and_bit_order(dt):
  codes = np.arange(64, dtype=np.uint8)
  data = codes.view(dt)                       # numpy ml_dtypes float6
  packed = np.asarray(pack_fp6(data))
  assert packed.shape == (48,) and packed.dtype == np.uint8
  np.testing.assert_array_equal(packed, ref_pack_bits(codes, 6))
  # explicit: codes 1,2,3,4 -> w = 1 | 2<<6 | 3<<12 | 4<<18
  w = 1 | 2 << 6 | 3 << 12 | 4 << 18
  got = np.asarray(pack_fp6(np.array([1, 2, 3, 4], np.uint8).view(dt)))
  np.testing.assert_array_equal(got, [w & 0xFF, (w >> 8) & 0xFF, w >> 16])
  back = np.asarray(unpack_fp6(packed, dt)).astype(np.float32)
  ref = data.astype(np.float32)
  np.testing.assert_array_equal(back, ref)
  np.testing.assert_array_equal(np.signbit(back), np.signbit(ref))


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2"])
def test_pack_fp6_round_trip_quantized(fmt):
  q = quantize(heavy(23, (6, 96)), fmt)
  p = pack_fp6(q)                             # dtype taken from q
  assert p.shape == (6, 72)
  np.testing.assert_array_equal(np.asarray(pack_fp6(q.data, q.dtype)),
                                np.asarray(p))
  back = unpack_fp6(p, q.dtype)
  assert np.dtype(back.dtype) == storage_dtype(q.dtype)
  np.testing.assert_array_equal(f32(back), f32(q.data))


def test_pack_errors():
  with pytest.raises(TypeError, match="pack_fp4: data must be a "
                     "float4_e2m1fn array, got float32"):
    pack_fp4(np.zeros(4, np.float32))
  with pytest.raises(ValueError, match="pack_fp4: last dimension of data "
                     "must be a positive multiple of 2"):
    pack_fp4(np.zeros(3, E2M1))
  with pytest.raises(TypeError, match="unpack_fp4: packed must be a uint8"):
    unpack_fp4(np.zeros(3, np.int32))
  with pytest.raises(ValueError, match="multiple of 4"):
    pack_fp6(np.zeros(6, E2M3))
  with pytest.raises(TypeError, match="pack_fp6: dtype is required"):
    pack_fp6(np.zeros(4, np.float32))
  with pytest.raises(ValueError, match="pack_fp6: dtype must be one of "
                     "float6_e2m3fn, float6_e3m2fn, got float8_e4m3fn"):
    pack_fp6(np.zeros(4, np.float32), E4M3)
  with pytest.raises(ValueError, match="unpack_fp6: last dimension of packed "
                     "must be a positive multiple of 3"):
    unpack_fp6(np.zeros(4, np.uint8), E2M3)
  with pytest.raises(TypeError, match="unpack_fp6: dtype"):
    unpack_fp6(np.zeros(3, np.uint8), None)


# ---------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------
def test_quantize_errors():
  x = normal(24, (4, 32))
  with pytest.raises(TypeError, match="quantize: x must be a floating array, "
                     "got int32"):
    quantize(np.ones((4, 32), np.int32))
  with pytest.raises(TypeError, match="x must be a floating array, got bool"):
    quantize(np.ones((4, 32), bool))
  with pytest.raises(TypeError, match="x must be a floating array, got "
                     "complex64"):
    quantize(np.ones((4, 32), np.complex64))
  with pytest.raises(TypeError, match="x must be a floating array"):
    quantize("abc")
  with pytest.raises(ValueError, match="quantize: format: unknown format "
                     "name 'fp3'.*valid names are"):
    quantize(x, "fp3")
  with pytest.raises(TypeError, match="quantize: format must be"):
    quantize(x, 8)
  with pytest.raises(ValueError, match=r"quantize: format 'mxfp8': dtype must "
                     r"be one of float8_e4m3fn, float8_e5m2, got float16"):
    quantize(x, "mxfp8", dtype=jnp.float16)
  with pytest.raises(ValueError, match="quantize: x must have at least 2 "
                     r"dimensions \(rows, K\) for format 'mxfp8', got shape "
                     r"\(32,\)"):
    quantize(x[0], "mxfp8")
  with pytest.raises(ValueError, match="quantize: x must have at least 1 "
                     "dimension"):
    quantize(np.float32(1.0), "fp8_tensor")
  with pytest.raises(ValueError, match="quantize: axis 2 is out of range"):
    quantize(x, "mxfp8", axis=2)
  with pytest.raises(TypeError, match="quantize: axis must be an int"):
    quantize(x, "mxfp8", axis=1.0)
  with pytest.raises(ValueError, match=r"quantize: K \(x.shape\[1\]\) must "
                     r"be >= 1, got shape \(4, 0\)"):
    quantize(np.zeros((4, 0), np.float32), "mxfp8")
  with pytest.raises(ValueError, match=r"quantize: x must be non-empty, got "
                     r"shape \(0, 32\)"):
    quantize(np.zeros((0, 32), np.float32), "mxfp8")
  with pytest.raises(TypeError, match="quantize: x is already a "
                     "QuantizedArray"):
    quantize(quantize(x, "mxfp8"), "mxfp8")


def test_dequantize_errors():
  q = quantize(normal(25, (4, 32)), "mxfp8")
  with pytest.raises(TypeError, match="dequantize: q must be a "
                     "QuantizedArray, got ndarray"):
    dequantize(np.zeros((4, 32)))
  with pytest.raises(TypeError, match="dequantize: dtype must be a floating "
                     "dtype, got int32"):
    dequantize(q, jnp.int32)
  assert q.dequantize(jnp.float16).dtype == jnp.float16


# ---------------------------------------------------------------------------
# agreement with jax.nn.scaled_matmul conventions
# ---------------------------------------------------------------------------
def _docs_scaled_matmul(a, b, sa, sb):
  """The maths documented for jax.nn.scaled_matmul, in float64 numpy."""
  a = f32(a).astype(np.float64)
  b = f32(b).astype(np.float64)
  sa = f32(sa).astype(np.float64)
  sb = f32(sb).astype(np.float64)
  a = a * np.repeat(sa, a.shape[-1] // sa.shape[-1], axis=-1)
  b = b * np.repeat(sb, b.shape[-1] // sb.shape[-1], axis=-1)
  return np.einsum("bmk,bnk->bmn", a, b)


# Dequantised operands are exact in float32 (MX: fp8 * 2^e), so the only
# difference is float32 summation order/rounding: |err| <~ K * 2^-24 * sum|ab|,
# i.e. ~1e-5 relative for K <= 256 and random data even in the worst case.
MATMUL_RTOL = 1e-5


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_scaled_matmul_inputs_match_dequantized_dot(fmt):
  k = 200  # not a multiple of any block: exercises the zero padding
  a = normal(26, (2, 24, k))
  b = heavy(27, (2, 40, k))
  qa, qb = quantize(a, fmt), quantize(b, fmt)
  la, sa, ga = to_jax_scaled_matmul_inputs(qa)
  lb, sb, gb = to_jax_scaled_matmul_inputs(qb)
  assert la.shape == (2, 24, qa.padded_k) and sa.shape[:2] == (2, 24)
  assert lb.shape == (2, 40, qb.padded_k) and sb.shape[:2] == (2, 40)
  assert la.shape[-1] % sa.shape[-1] == 0
  out = _docs_scaled_matmul(la, lb, sa, sb)
  if ga is not None:
    out = out * float(ga) * float(gb)
  ref = np.einsum("bmk,bnk->bmn", np.asarray(dequantize(qa), np.float64),
                  np.asarray(dequantize(qb), np.float64))
  assert rel_fro(out, ref) < MATMUL_RTOL
  # 2-D operands get B = 1
  l2, s2, _ = to_jax_scaled_matmul_inputs(quantize(a[0], fmt))
  assert l2.shape == (1, 24, qa.padded_k) and s2.shape[0] == 1


# What a backend without a scaled_matmul implementation raises (CPU: no
# lowering rule; GPUs without cuDNN block-scaled support: an XLA error).
_BACKEND_ERRORS = tuple(e for e in (
  NotImplementedError,
  getattr(jax.errors, "JaxRuntimeError", None),
  getattr(jax.errors, "XlaRuntimeError", None)) if e is not None)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_jax_nn_scaled_matmul_agrees(fmt):
  a = normal(28, (1, 32, 256))
  b = normal(29, (1, 48, 256))
  qa, qb = quantize(a, fmt), quantize(b, fmt)
  la, sa, ga = to_jax_scaled_matmul_inputs(qa)
  lb, sb, gb = to_jax_scaled_matmul_inputs(qb)
  try:
    out = np.asarray(jax.nn.scaled_matmul(la, lb, sa, sb,
                                          preferred_element_type=
                                          jnp.float32))
  except _BACKEND_ERRORS as e:
    pytest.skip(f"jax.nn.scaled_matmul not available for {fmt} on "
                f"{jax.default_backend()} (jax {jax.__version__}): "
                f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
  if ga is not None:
    out = out * np.float32(ga) * np.float32(gb)
  ref = np.asarray(jnp.einsum("bmk,bnk->bmn", dequantize(qa), dequantize(qb),
                              precision=jax.lax.Precision.HIGHEST))
  assert rel_fro(out, ref) < MATMUL_RTOL
