"""FP4 / FP6 weight-only GEMM (jax_gmma.weightonly): the prepared layout, the reference, shape rules
(CPU), and the sm_90a kernel against a float64 oracle of the dequantized weights (GPU)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import child_script, command_buffer_runs, run_child  # noqa: E402 (tests/ helper)
from jax_gmma.ops import weightonly as wo

FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
FP6 = ("mxfp6_e2m3", "mxfp6_e3m2")


def _rng(seed):
  return np.random.default_rng(1000 + seed)


# -- CPU: layout, reference, rules ------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(16, 64), (32, 128), (48, 200), (64, 320)])
def test_prepare_round_trip(fmt, n, k):
  w = _rng(n + k).standard_normal((n, k)).astype(np.float32) * 3
  q = jax_gmma.quantize(w, fmt)
  wp = wo.prepare(q)
  kp = -(-k // 64) * 64
  tile = 768 if fmt in FP6 else 512
  assert wp.packed.shape == (n // 16, kp // 64, tile) and wp.packed.dtype == np.uint8
  assert wp.scales.shape == (n // 16, kp // 64, 64 if fmt == "nvfp4" else 32)
  ref = np.asarray(jax_gmma.dequantize(q))
  got = np.asarray(wo.dequantize_packed(wp))
  np.testing.assert_allclose(got, ref, rtol=2 ** -22, atol=0)
  assert wp.nbytes == n * kp * tile // 1024 + n * kp // (16 if fmt == "nvfp4" else 32)
  # prepare() of a float weight quantizes first: the same result.
  wp2 = wo.prepare(w, fmt)
  assert np.array_equal(np.asarray(wp2.packed), np.asarray(wp.packed))


def test_layout_bit_positions():
  """Independent check of the documented nibble positions for one tile."""
  n, k = 16, 64
  vals = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
  rng = _rng(7)
  codes = rng.integers(0, 16, (n, k))
  w = np.where(codes >= 8, -1, 1) * vals[codes % 8]
  q = jax_gmma.quantize(w.astype(np.float32), "mxfp4")
  data_codes = np.asarray(q.data).view(np.uint8) & 0xF
  wp = wo.prepare(q)
  words = np.ascontiguousarray(np.asarray(wp.packed)).reshape(8, 4, 4, 4).view(np.uint32)[..., 0]
  for g in range(8):
    for t in range(4):
      for qq in range(4):
        for h in range(2):
          for kk in range(4):
            pair, half = h + 2 * (kk // 2), kk % 2
            pos = {0: ((15, 8, 7, 6), (31, 24, 23, 22)), 1: ((11, 4, 3, 2), (27, 20, 19, 18)),
                   2: ((5, 30, 29, 28), (21, 14, 13, 12)), 3: ((9, 10, 1, 0), (25, 26, 17, 16))}[pair][half]
            got = sum(((int(words[g, t, qq]) >> b) & 1) << (3 - i) for i, b in enumerate(pos))
            want = data_codes[g + 8 * h, 16 * t + 4 * qq + kk]
            assert got == want, (g, t, qq, h, kk)


def _bf16_bits_value(bits):
  import ml_dtypes
  return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("fmt", FP6)
def test_fp6_exhaustive_code_table(fmt):
  """All 64 codes x every E8M0 scale code: the kernel's conversion (code at its bf16 bits, one
  bf16 multiply by F, rounded to bf16 like mul.rn.bf16x2) is exactly value * scale * 2^-10 for
  the documented scale range, and a poisoned-block code gives a non-finite product."""
  import ml_dtypes
  dt = {"mxfp6_e2m3": ml_dtypes.float6_e2m3fn, "mxfp6_e3m2": ml_dtypes.float6_e3m2fn}[fmt]
  base = wo._FP6_BASE[fmt]
  codes = np.arange(64, dtype=np.uint8)
  vals = codes.view(dt).astype(np.float64)
  bits = ((codes.astype(np.uint32) >> 5) << 15) | ((codes.astype(np.uint32) & 31) << base)
  placed = _bf16_bits_value(bits)
  np.testing.assert_array_equal(placed, vals * 2.0 ** (-126 if base == 4 else -124))
  bias, lim = wo._MX_BIAS[fmt], wo._MX_MAX_CODE[fmt]
  lo = {"mxfp6_e2m3": -120, "mxfp6_e3m2": -119}[fmt]
  assert lim - 127 == {"mxfp6_e2m3": 11, "mxfp6_e3m2": 13}[fmt]
  for c in range(0, lim + 2):
    f = _bf16_bits_value(np.uint16((c + bias) * 128))
    with np.errstate(invalid="ignore"):  # Inf * 0 in the poisoned block
      prod = (placed * f).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    if c == lim + 1:
      assert np.isinf(f) and not np.isfinite(prod[codes % 32 != 0]).any()
      continue
    scale = 2.0 ** (c - 127)
    assert f == scale * 2.0 ** bias
    if c - 127 >= lo:
      np.testing.assert_array_equal(prod, vals * scale * 2.0 ** -10, err_msg=f"scale code {c}")
  # The reference decodes the same scale codes (from 1: quantize clamps E8M0 to 2^-126, and XLA
  # on CPU flushes float32 subnormals).
  sv = np.asarray(wo._scale_values(jnp.arange(1, lim + 1, dtype=jnp.uint8), fmt), np.float64)
  np.testing.assert_array_equal(sv, 2.0 ** (np.arange(1, lim + 1) - 127.0))


@pytest.mark.parametrize("fmt", FP6)
def test_fp6_layout_independent(fmt):
  """The FP6 pieces applied to the packed words (a NumPy model of the kernel's conversion)
  rebuild every code at its bf16 position; the pieces match the CUDA source's table."""
  import re
  n, k = 32, 128
  rng = _rng(9)
  w = rng.standard_normal((n, k)).astype(np.float32) * 2
  q = jax_gmma.quantize(w, fmt)
  wp = wo.prepare(q)
  dt = np.dtype(q.dtype)
  data = np.asarray(q.data, np.float32).astype(dt).view(np.uint8) & 63        # (N, K) codes
  base = wo._FP6_BASE[fmt]
  pk = np.ascontiguousarray(np.asarray(wp.packed))
  u64 = lambda x: np.uint64(x)
  for s in range(n // 16):
    for j in range(k // 64):
      tile = pk[s, j]
      for lane in range(32):
        g, t = divmod(lane, 4)
        w6 = np.concatenate([tile[16 * lane:16 * lane + 16], tile[512 + 8 * lane:520 + 8 * lane]])
        w6 = w6.view(np.uint32).astype(np.uint64)
        for grp in range(2):
          ww = w6[3 * grp:3 * grp + 3]
          for v, pieces in enumerate(wo.FP6_PIECES[fmt]):
            out = 0
            for lo, hi, r, shl, mask in pieces:
              win = int(ww[lo]) | (int(ww[hi]) << 32 if hi >= 0 else 0)
              out |= (((win >> r) << shl) & mask)
            i = v % 4
            q_ = 2 * grp + v // 4
            for half in range(2):
              h16 = (out >> (16 * half)) & 0xFFFF
              code = ((h16 >> 15) << 5) | ((h16 >> base) & 31)
              assert h16 & ~(0x8000 | (31 << base)) == 0
              row = 16 * s + g + 8 * (i % 2)
              kk = 64 * j + 16 * t + 4 * q_ + 2 * (i // 2) + half
              assert code == data[row, kk], (fmt, s, j, lane, grp, v, half)
  # The CUDA table (cpp/sm90_fp6_gemm_weightonly.cu) is the same.
  import os
  src = open(os.path.join(os.path.dirname(__file__), "..", "cpp",
                          "sm90_fp6_gemm_weightonly.cu")).read()
  tag = {"mxfp6_e2m3": "kMx6E2M3", "mxfp6_e3m2": "kMx6E3M2"}[fmt]
  body = src[src.index(f"struct Fp6Pieces<WoScale::{tag}>"):]
  body = body[:body.index("return p[v][i];")]
  rows = re.findall(r"\{(\{[^\n]*\})\},?\n", body)
  assert len(rows) == 8
  for v, row in enumerate(rows):
    pcs = [tuple(int(x, 0) for x in re.sub("u", "", m).split(","))
           for m in re.findall(r"\{([^{}]*)\}", row)]
    assert tuple(pc for pc in pcs if pc[4]) == wo.FP6_PIECES[fmt][v], (fmt, v)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["auto", "dequant"])
def test_reference_matches_float64(fmt, path):
  rng = _rng(3)
  n, k, m = 32, 192, 5
  w = rng.standard_normal((n, k)).astype(np.float32)
  wp = wo.prepare(w, fmt)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  bias = rng.standard_normal(n).astype(np.float32)
  out = jax.jit(lambda x, wp, b: jax_gmma.weightonly_gemm(x, wp, bias=b, out_dtype=jnp.float32,
                                                         path=path))(x, wp, bias)
  ref = np.asarray(x, np.float64) @ np.asarray(wo.dequantize_packed(wp), np.float64).T + bias
  err = np.linalg.norm(np.asarray(out) - ref) / np.linalg.norm(ref)
  assert err < 1e-6, err


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp6_e2m3", "mxfp6_e3m2"])
def test_dot_on_packed_weight_cpu(fmt):
  rng = _rng(4)
  w = rng.standard_normal((32, 128)).astype(np.float32)
  wp = wo.prepare(w, fmt)
  x = rng.standard_normal((2, 3, 128)).astype(np.float32)
  y = jax_gmma.dot(x, wp)
  assert y.shape == (2, 3, 32) and y.dtype == jnp.float32
  xq = jax_gmma.quantize(jnp.asarray(x).reshape(6, 128), "fp8_channel")
  y2 = jax_gmma.dot(xq, wp)
  ref = np.asarray(jax_gmma.dequantize(xq), np.float64) @ np.asarray(wp.dequantize(), np.float64).T
  assert np.linalg.norm(np.asarray(y2, np.float64) - ref) / np.linalg.norm(ref) < 1e-2


def test_errors():
  w = np.ones((32, 128), np.float32)
  wp = wo.prepare(w, "nvfp4")
  with pytest.raises(ValueError, match="multiple of 16"):
    wo.prepare(np.ones((24, 128), np.float32), "nvfp4")
  with pytest.raises(ValueError, match="format must be one of"):
    wo.prepare(w, "fp8_channel")
  with pytest.raises(ValueError, match="takes"):
    wo.prepare(jax_gmma.quantize(w, "mxfp8"))
  with pytest.raises(TypeError, match="x must be bfloat16"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.float32), wp)
  with pytest.raises(ValueError, match="K = 128"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 64), jnp.bfloat16), wp)
  with pytest.raises(ValueError, match="rows must be one of"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp, rows=48)
  with pytest.raises(ValueError, match="bias must have shape"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp, bias=jnp.ones(16))
  with pytest.raises(ValueError, match="x_scale"):
    jax_gmma.weightonly_gemm(jnp.ones((3, 128), jnp.float8_e4m3fn), wp, x_scale=jnp.ones(2))
  with pytest.raises(TypeError, match="out_dtype"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp, out_dtype=jnp.float16)
  with pytest.raises(TypeError, match="PackedWeight"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), jax_gmma.quantize(w, "nvfp4"))
  with pytest.raises(ValueError, match="path must be one of"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp, path="fast")
  with pytest.raises(ValueError, match="do not apply to path='dequant'"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp, rows=16, path="dequant")


def test_fp6_errors():
  w = np.ones((32, 100), np.float32)
  with pytest.raises(ValueError, match="multiple of 16"):
    wo.prepare(np.ones((24, 128), np.float32), "mxfp6_e2m3")
  big = np.full((16, 64), 2.0 ** 15, np.float32)  # e2m3 scale 2^13 > 2^11: a global 2^2
  wp = wo.prepare(big, "mxfp6_e2m3")
  assert float(wp.global_scale[0]) == 4.0
  np.testing.assert_array_equal(np.asarray(wp.dequantize()), big)
  assert float(wo.prepare(big, "mxfp6_e3m2").global_scale[0]) == 1.0  # e3m2: within 2^13
  wide = big.copy()
  wide[0, :32] = 2.0 ** -124  # scales 2^-126 .. 2^13: more binades than the kernel's exact range
  with pytest.raises(ValueError, match="binades"):
    wo.prepare(wide, "mxfp6_e2m3")
  with pytest.raises(ValueError, match="is mxfp6_e3m2, not mxfp6_e2m3"):
    wo.prepare(jax_gmma.quantize(w, "mxfp6_e3m2"), "mxfp6_e2m3")
  wp = wo.prepare(w, "mxfp6_e2m3")  # K = 100: padded to 128 with zero weights
  assert wp.packed.shape == (2, 2, 768) and wp.k == 100
  with pytest.raises(ValueError, match="K = 100"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp)


# -- unpack and the FP8 prefill route (CPU: the JAX lowering) ----------------------------------

MX = ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")


def _check_unpack(wp):
  """unpack() (bf16 always, e4m3 for MX) equals the float32 dequantization exactly."""
  ref = np.asarray(wo.dequantize_packed(wp), np.float32) / np.float32(wp.global_scale[0])
  kp = wp.padded_k
  ref = np.pad(ref, ((0, 0), (0, kp - wp.k)))
  ub = np.asarray(jax.jit(wo.unpack)(wp))
  assert ub.dtype == jnp.bfloat16 and ub.shape == (wp.n, kp)
  fin = np.isfinite(ref)
  np.testing.assert_array_equal(ub.astype(np.float32)[fin], ref.astype(jnp.bfloat16).astype(np.float32)[fin])
  assert not np.isfinite(ub.astype(np.float32)[~fin]).any()
  if wp.format in MX:
    e = np.asarray(wo.row_exponents(wp))
    u8 = np.asarray(jax.jit(lambda w: wo.unpack(w, jnp.float8_e4m3fn))(wp))
    assert u8.dtype == jnp.float8_e4m3fn
    want = (ref * np.exp2(127.0 - e)[:, None])
    if wp.fp8_exact:
      np.testing.assert_array_equal(u8.astype(np.float32)[fin], want[fin])
    assert np.isnan(u8.astype(np.float32)[~fin]).all()
  # path="fp8_rounded"'s copy (every format): round to nearest e4m3 of the row-scaled weight
  # (_rounded_e4m3: from the exact code x block scale, not from ref, whose trip through the
  # global scale may have perturbed NVFP4's exact ties)
  want, e = _rounded_e4m3(wp, kp)
  u8 = np.asarray(jax.jit(lambda w, e: wo.unpack(w, jnp.float8_e4m3fn, row_exp=e))(wp, e))
  np.testing.assert_array_equal(u8.astype(np.float64)[fin], want[fin])
  assert np.isnan(u8.astype(np.float32)[~fin]).all()
  return ub


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_reference_exact(fmt):
  _, wp = _weights(fmt, 48, 200, seed=7)
  _check_unpack(wp)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unpack_vmap_is_one_launch(fmt):
  """jax.vmap of unpack over stacked weights (grouped experts): one unpack of the (B * N, Kp)
  weight, equal to unpacking each weight alone, for bfloat16 and float8 with each weight's
  row exponents."""
  wps = [_weights(fmt, 48, 200, seed=s)[1] for s in (1, 2, 3)]
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *wps)
  exps = jnp.stack([wo.rounded_row_exponents(w) for w in wps]).astype(jnp.int32)
  for dtype in (jnp.bfloat16, jnp.float8_e4m3fn):
    f = lambda w, e: wo.unpack(w, dtype, row_exp=None if dtype == jnp.bfloat16 else e)
    batched = jax.jit(jax.vmap(f))
    assert str(jax.make_jaxpr(jax.vmap(f))(stacked, exps)).count("weightonly_unpack") == 1
    got = np.asarray(batched(stacked, exps).astype(jnp.float32))
    want = np.stack([np.asarray(jax.jit(f)(w, e).astype(jnp.float32)) for w, e in zip(wps, exps)])
    assert got.shape == (3, 48, wps[0].padded_k)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", MX)
def test_fp8_exact_flag(fmt):
  L = wo.FP8_SPREAD[fmt]
  rng = _rng(8)
  base = rng.uniform(1, 2, (16, 128)).astype(np.float32) * np.where(rng.random((16, 128)) < .5, -1, 1)
  for gap, want in ((L, True), (L + 1, False)):
    w = base.copy()
    w[3, 32:64] *= np.float32(2.0 ** -gap)  # one block 2^gap below the rest of its row
    wp = wo.prepare(w, fmt)
    assert wp.fp8_exact is want, (gap, wp)
    assert int(wo.row_exponents(wp)[3]) == int(wo.row_exponents(wp)[2])
    _check_unpack(wp)
  w = base.copy()
  w[5, :32] = 0  # an all-zero block does not count
  w[5, 32:64] *= np.float32(2.0 ** -(L - 1))
  assert wo.prepare(w, fmt).fp8_exact is True
  assert jax.jit(lambda w: wo.prepare(w, fmt).packed)(base).shape[0] == 1  # traceable
  seen = []
  jax.jit(lambda w: seen.append(wo.prepare(w, fmt).fp8_exact) or 0)(base)
  assert seen == [None]
  assert wo.prepare(base, "nvfp4").fp8_exact is False
  # Stacking weights (lax.scan over layers) needs equal static flags: lower one to match.
  good, bad = wo.prepare(base, fmt), wo.prepare(w * 0 + base * np.where(np.arange(128) < 32, 2.0 ** -20, 1), fmt)
  assert good.fp8_exact is True and bad.fp8_exact is False
  with pytest.raises(ValueError):
    jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), good, bad)
  stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), good.with_fp8_exact(False), bad)
  assert stacked.fp8_exact is False and stacked.packed.shape[0] == 2
  with pytest.raises(ValueError, match="only prepare"):
    bad.with_fp8_exact(True)


@pytest.mark.parametrize("fmt", MX)
@pytest.mark.parametrize("xdt", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_fp8_route_matches_float64(fmt, xdt):
  rng = _rng(9)
  n, k, m = 48, 200, 260
  w = rng.standard_normal((n, k)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (n, 1)))
  wp = wo.prepare(w, fmt)
  assert wp.fp8_exact
  x = jnp.asarray(rng.standard_normal((m, k)), xdt)
  xs = jnp.asarray(rng.uniform(0.5, 2, m), jnp.float32)
  bias = jnp.asarray(rng.standard_normal(n), jnp.float32)
  ref = (np.asarray(x.astype(jnp.float32), np.float64) @ np.asarray(wo.dequantize_packed(wp), np.float64).T
         * np.asarray(xs, np.float64)[:, None] + np.asarray(bias, np.float64))
  # The JAX lowering sums in float32; Hopper's FP8 tensor cores keep fewer bits inside each
  # 128-K chunk before the kernel promotes the partial sum to float32 (measured ~1e-4).
  tol = 1e-6 if jax.default_backend() == "cpu" else 3e-4
  for path in ("fp8", "auto"):
    f = jax.jit(lambda x, wp, xs, b, path=path: jax_gmma.weightonly_gemm(
        x, wp, x_scale=xs, bias=b, out_dtype=jnp.float32, path=path))
    out = np.asarray(f(x, wp, xs, bias), np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < tol, path
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(x, wp))
  assert "jax_gmma_weightonly_unpack" in text and "fp8_gemm" in text
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(x.astype(jnp.bfloat16), wp))
  assert "jax_gmma_weightonly_unpack" in text and "fp8_gemm" not in text and "dot_general" in text
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(x[:wo.PREFILL_FP8_MIN_M - 1], wp))
  assert "jax_gmma_weightonly_gemm" in text and "unpack" not in text
  # FP8 x keeps the FP8 route from PREFILL_FP8_MIN_M; bf16 x stays on the kernels up to PREFILL_MIN_M - 1
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(x[:wo.PREFILL_FP8_MIN_M], wp))
  assert "jax_gmma_weightonly_unpack" in text and "fp8_gemm" in text
  xb = x.astype(jnp.bfloat16)[:wo.PREFILL_MIN_M - 1]
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(xb, wp))
  assert "jax_gmma_weightonly_gemm" in text and "unpack" not in text
  assert wo.PREFILL_FP8_MIN_M < wo.PREFILL_MIN_M <= m


def test_fp8_route_errors():
  w = np.random.default_rng(1).standard_normal((32, 128)).astype(np.float32)
  x8 = jnp.ones((300, 128), jnp.float8_e4m3fn)
  with pytest.raises(ValueError, match="path='fp8' takes MX weights"):
    jax_gmma.weightonly_gemm(x8, wo.prepare(w, "nvfp4"), path="fp8")
  wp = wo.prepare(w, "mxfp4")
  with pytest.raises(ValueError, match="x is bfloat16"):
    jax_gmma.weightonly_gemm(x8.astype(jnp.bfloat16), wp, path="fp8")
  with pytest.raises(ValueError, match="do not apply to path='fp8'"):
    jax_gmma.weightonly_gemm(x8, wp, path="fp8", rows=16)
  w2 = w.copy()
  w2[0, :32] *= 2.0 ** -12
  bad = wo.prepare(w2, "mxfp4")
  with pytest.raises(ValueError, match="fp8_exact.*False"):
    jax_gmma.weightonly_gemm(x8, bad, path="fp8")
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp))(x8, bad))
  assert "fp8_gemm" not in text  # auto: the bf16 prefill path for a weight that is not exact
  with pytest.raises(TypeError, match="bfloat16 or float8_e4m3fn"):
    wo.unpack(wp, jnp.float32)
  with pytest.raises(ValueError, match="needs row_exp"):
    wo.unpack(wo.prepare(w, "nvfp4"), jnp.float8_e4m3fn)
  with pytest.raises(ValueError, match="x is bfloat16"):
    jax_gmma.weightonly_gemm(x8.astype(jnp.bfloat16), wp, path="fp8_rounded")
  with pytest.raises(ValueError, match="do not apply to path='fp8_rounded'"):
    jax_gmma.weightonly_gemm(x8, wp, path="fp8_rounded", tokens=8)
  with pytest.raises(ValueError, match="path must be one of"):
    jax_gmma.weightonly_gemm(x8, wp, path="fp8_round")


def _rounded_e4m3(wp, cols):
  """path='fp8_rounded''s e4m3 copy of the weight's first `cols` columns (float64) and its row
  exponents, from an independent emulation: ml_dtypes rounding of code x block scale x
  2^(127 - e). The product is taken exactly (NVFP4's global scale left out: many products are
  exact ties between two e4m3 numbers, so the rounding must see them unperturbed)."""
  e = np.asarray(wo.rounded_row_exponents(wp))
  w = np.asarray(wo._dequant_impl(wp.packed, wp.scales, jnp.ones((1,), jnp.float32), wp.format,
                                  wp.n, cols), np.float64) * np.exp2(127.0 - e)[:, None]
  assert np.nanmax(np.abs(np.where(np.isfinite(w), w, np.nan)), initial=0) <= 448  # nothing saturates
  return w.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64), e


def _rounded_weights(wp):
  """float64 (N, K): the weight path='fp8_rounded' multiplies (_rounded_e4m3 scaled back)."""
  w8, e = _rounded_e4m3(wp, wp.k)
  return w8 * np.exp2(e - 127.0)[:, None] * float(np.asarray(wp.global_scale)[0])


@pytest.mark.parametrize("fmt", FORMATS)
def test_rounded_row_exponents(fmt):
  """The row's largest possible weight (largest code x largest finite block scale) lands in
  e4m3's top binade (224, 448] after the row scale; zero rows and poisoned blocks are handled."""
  rng = _rng(31)
  n, k = 64, 256
  w = rng.standard_normal((n, k)).astype(np.float32) * np.exp2(rng.integers(-30, -6, (n, 1)))
  w[:, 100:140] *= 2.0 ** 9   # a wide block-scale spread inside each row
  w[5] = 0                    # an all-zero row
  w[7, 3] = np.inf            # a poisoned block
  wp = wo.prepare(w, fmt)
  e = np.asarray(wo.rounded_row_exponents(wp))
  assert e.dtype == np.int32 and e.shape == (n,)
  vmax = float(ml_dtypes.finfo(wo._ELEM[fmt][0]).max)
  codes = wo._block_codes(wp.scales, fmt, n, k)
  sv = np.asarray(wo._scale_values(codes, fmt), np.float64)
  sv = np.where(np.isfinite(sv), sv, 0).max(axis=1)
  bound = vmax * sv * np.exp2(127.0 - e)
  live = sv > 0
  assert (bound[live] <= 448).all() and (bound[live] > 224).all(), bound
  if fmt in MX:  # an all-zero MX row has code 0 (NVFP4 keeps its zero blocks' scale codes)
    assert e[5] == -wo._rounded_headroom(fmt)
  if fmt in MX:  # MX: the exact route's exponent minus the format's headroom
    np.testing.assert_array_equal(e, np.asarray(wo.row_exponents(wp)) - wo._rounded_headroom(fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_fp8_rounded_matches_emulation(fmt):
  """path='fp8_rounded' multiplies exactly the e4m3-rounded weights of the emulation; their
  error against the exact weights is small (e4m3 rounding), and for fp8_exact MX weights the
  path equals path='fp8'."""
  rng = _rng(33)
  n, k, m = 48, 200, 260
  w = rng.standard_normal((n, k)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (n, 1)))
  wp = wo.prepare(w, fmt)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.float8_e4m3fn)
  xs = jnp.asarray(rng.uniform(0.5, 2, m), jnp.float32)
  x64 = np.asarray(x.astype(jnp.float32), np.float64) * np.asarray(xs, np.float64)[:, None]
  wr = _rounded_weights(wp)
  f = jax.jit(lambda x, wp, xs: jax_gmma.weightonly_gemm(x, wp, x_scale=xs, out_dtype=jnp.float32,
                                                         path="fp8_rounded"))
  out = np.asarray(f(x, wp, xs), np.float64)
  ref = x64 @ wr.T
  tol = 1e-6 if jax.default_backend() == "cpu" else 3e-4
  assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < tol
  wdq = np.asarray(wo.dequantize_packed(wp), np.float64)
  werr = np.linalg.norm(wr - wdq) / np.linalg.norm(wdq)
  exact = x64 @ wdq.T
  oerr = np.linalg.norm(out - exact) / np.linalg.norm(exact)
  if fmt == "nvfp4":
    assert 1e-3 < werr < 4e-2 and oerr < 4e-2, (werr, oerr)  # e4m3 rounding: ~2.4% here
  else:  # these MX weights are fp8_exact: nothing to round
    assert wp.fp8_exact and werr == 0
    out8 = np.asarray(jax.jit(lambda x, wp, xs: jax_gmma.weightonly_gemm(
        x, wp, x_scale=xs, out_dtype=jnp.float32, path="fp8"))(x, wp, xs), np.float64)
    assert np.linalg.norm(out - out8) / np.linalg.norm(out8) < tol
  # MX weights that are not fp8_exact: refused by "fp8", rounded by "fp8_rounded"
  if fmt in MX:
    w2 = w.copy()
    w2[0, :32] *= 2.0 ** -12
    bad = wo.prepare(w2, fmt)
    assert bad.fp8_exact is False
    out = np.asarray(f(x, bad, xs), np.float64)
    ref = x64 @ _rounded_weights(bad).T
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < tol
  text = str(jax.make_jaxpr(lambda x, wp: jax_gmma.weightonly_gemm(x, wp, path="fp8_rounded"))(x, wp))
  assert "jax_gmma_weightonly_unpack" in text and "fp8_gemm" in text
  with pytest.raises(ValueError, match="MX formats only"):
    wo.row_exponents(wo.prepare(w, "nvfp4"))


def test_pick_cta():
  # FP4: the K split follows N (more warps per strip at small N), 32-row CTAs at 16 tokens
  # for large N, 32 rows x 2 warps along K beyond 16 tokens.
  assert wo.pick_cta(1, 28672, 8192, "nvfp4") == (16, 8, 2)
  assert wo.pick_cta(1, 16 * 1200, 8192, "mxfp4") == (16, 8, 4)
  assert wo.pick_cta(4, 8192, 8192, "mxfp4") == (16, 8, 8)
  assert wo.pick_cta(1, 4096, 14336, "nvfp4") == (16, 8, 16)
  assert wo.pick_cta(16, 28672, 8192, "nvfp4") == (32, 16, 2)
  assert wo.pick_cta(16, 8192, 8192, "nvfp4") == (16, 16, 4)
  assert wo.pick_cta(16, 4096, 14336, "mxfp4") == (16, 16, 8)
  # the tensor-core kernel from 17 tokens where N gives at least 128 blocks of 64 rows; the
  # shape follows how its CTAs fill the SMs (pick_tc)
  assert wo.pick_cta(17, 28672, 8192, "nvfp4") == (256, 64, 4)
  assert wo.pick_cta(17, 8192, 8192, "nvfp4") == (64, 32, 16)
  assert wo.pick_cta(24, 8192, 8192, "mxfp6_e2m3") == (64, 32, 16)
  assert wo.pick_cta(24, 4096, 14336, "nvfp4")[1] == 16
  assert wo.pick_cta(33, 28672, 8192, "nvfp4") == (256, 64, 4)
  assert wo.pick_cta(64, 16384, 8192, "nvfp4") == (64, 64, 8)
  assert wo.pick_cta(64, 8192, 8192, "nvfp4") == (64, 64, 16)
  assert wo.pick_cta(40, 10240, 8192, "nvfp4")[1] == 16
  assert wo.pick_cta(56, 10240, 8192, "nvfp4") == (64, 64, 8)
  assert wo.pick_cta(64, 4096, 14336, "nvfp4")[1] == 16
  assert wo.pick_cta(65, 8192, 8192, "mxfp4") == (64, 128, 8)
  assert wo.pick_cta(65, 28672, 8192, "mxfp4") == (128, 128, 4)
  assert wo.pick_cta(100, 14336, 4096, "nvfp4") == (64, 128, 4)
  assert wo.pick_cta(127, 4096, 14336, "mxfp6_e2m3") == (64, 64, 16)
  assert wo.pick_cta(128, 4224, 27648, "nvfp4") == (64, 64, 16)  # 2 x 66 CTAs: one wave
  assert wo.pick_cta(128, 5120, 27648, "nvfp4") == (64, 128, 8)  # 2 x 80 would not be
  assert wo.pick_cta(200, 8192, 8192, "nvfp4") == (128, 128, 4)
  assert wo.pick_cta(200, 28672, 8192, "nvfp4") == (64, 128, 4)
  assert wo.pick_cta(200, 1024, 8192, "nvfp4")[1] == 16  # fewer than 32 blocks of 64 rows
  # N not a multiple of 64, or more than 65535 row blocks of 64: the decode kernel's shapes
  assert wo.pick_cta(100, 16 * 1029, 8192, "nvfp4")[1] == 16
  assert wo.pick_cta(64, 16 * 3, 256, "nvfp4") == (16, 16, 8)
  assert wo.pick_cta(64, 128 * 65535, 256, "nvfp4")[1] == 16
  assert wo.pick_cta(64, 256 * 65536, 256, "nvfp4")[1] == 16
  # FP6
  assert wo.pick_cta(1, 28672, 8192, "mxfp6_e2m3") == (16, 8, 8)
  assert wo.pick_cta(1, 8192, 28672, "mxfp6_e3m2") == (32, 8, 8)
  assert wo.pick_cta(16, 28672, 8192, "mxfp6_e2m3") == (16, 16, 4)
  assert wo.pick_cta(16, 8192, 28672, "mxfp6_e2m3") == (16, 16, 8)
  # N not a multiple of the picked rows: the 16-row, 8-warp shape
  assert wo.pick_cta(16, 16 * 1025, 8192, "nvfp4") == (16, 16, 8)
  for fmt in FORMATS:
    for m in (1, 5, 9, 16, 17, 64, 127):
      for n in (16, 48, 4096, 8192, 6144, 28672, 16 * 1025):
        c = wo.pick_cta(m, n, 8192, fmt)
        table = wo.TC_SHAPES if c[1] >= 32 else wo.CTA_SHAPES
        assert c in table and n % c[0] == 0, (fmt, m, n, c)
        blocks = n // 64 if n % 64 == 0 else 0
        tc = m > 16 and (blocks >= 128 if m <= 32 else
                         (blocks >= 96 and (blocks <= 132 or blocks >= 192 or m > 48)) if m <= 64 else
                         blocks >= 32)
        assert (c[1] >= 32) == tc, (fmt, m, n, c)
  # forcing: unset fields from the pick, k_warps 8 when rows / tokens are forced
  assert wo.resolve_cta(1, 28672, 8192, "nvfp4") == (16, 8, 2)
  assert wo.resolve_cta(1, 28672, 8192, "nvfp4", rows=32) == (32, 8, 8)
  assert wo.resolve_cta(1, 28672, 8192, "nvfp4", k_warps=16) == (16, 8, 16)


def test_pick_cta_matches_the_cpp_rule():
  """weightonly.pick_cta (Python, used for trace-time checks and reports) against the kernel's
  own weightonly_pick (C++, what runs), through the built extension: every format, a grid of
  M, N and (padded) K around the rule's thresholds."""
  from jax_gmma import _backend
  e = _backend.ext()
  if e is None or not e.cuda_built() or not hasattr(e, "weightonly_pick"):
    pytest.skip("jax_gmma extension not built with CUDA kernels (source tree / no nvcc)")
  strips = (1, 3, 4, 127, 128, 255, 256, 257, 264, 268, 320, 383, 384, 511, 512, 513, 528, 532, 767,
            768, 1023, 1024, 1025, 1028, 1536, 1584, 1792)
  for fmt in wo.WEIGHT_FORMATS:
    for m in (1, 2, 8, 9, 15, 16, 17, 32, 33, 48, 49, 64, 65, 127, 128, 129, 200, 256):
      for n in [16 * s for s in strips]:
        for k in (64, 8192, 16320, 16384, 28672):
          assert wo.pick_cta(m, n, k, fmt) == tuple(e.weightonly_pick(m, n, k, wo.SCALE_KIND[fmt])), (
              fmt, m, n, k)


def test_cta_shapes_match_the_kernel_table():
  import os
  import re
  src = open(os.path.join(os.path.dirname(__file__), "..", "cpp", "include", "jax_gmma",
                          "weightonly_common.cuh")).read()
  body = src[src.index("kWoCtaShapes[] = {"):]
  body = body[:body.index("};")]
  shapes = [tuple(int(v) for v in t) for t in re.findall(r"\{(\d+), (\d+), (\d+), (\d+)\}", body)]
  assert tuple((16 * rs * wr, 8 * nt, wk) for rs, nt, wk, wr in shapes) == wo.CTA_SHAPES
  src = open(os.path.join(os.path.dirname(__file__), "..", "cpp", "include", "jax_gmma",
                          "weightonly_wgmma.cuh")).read()
  body = src[src.index("kWoTcShapes[] = {"):]
  body = body[:body.index("};")]
  shapes = [tuple(int(v) for v in t) for t in re.findall(r"\{(\d+), (\d+), (\d+)\}", body)]
  assert tuple((64 * wr, nt, 4 * wk) for nt, wr, wk in shapes) == wo.TC_SHAPES


def test_tiled_x_layout():
  """The tensor-core kernel's tiled activations: element 64 c + 8 r + 2 t + e of block (j, g) is
  x[8 g + r, 64 j + 16 t + 2 c + e], rows past M zero (kernel side: wo_tc_tiled_x)."""
  m, k, rows = 21, 192, 32
  x = np.arange(m * k, dtype=np.float32).reshape(m, k) % 251 - 125
  got = np.asarray(wo.tiled_x(jnp.asarray(x, jnp.bfloat16), rows).astype(jnp.float32))
  assert got.shape == (k // 64, rows // 8, 512)
  want = np.zeros_like(got)
  xp = np.zeros((rows, k), np.float32)
  xp[:m] = x
  for j in range(k // 64):
    for g in range(rows // 8):
      for c in range(8):
        for r in range(8):
          for t in range(4):
            for e in range(2):
              want[j, g, 64 * c + 8 * r + 2 * t + e] = xp[8 * g + r, 64 * j + 16 * t + 2 * c + e]
  np.testing.assert_array_equal(got, want)
  assert wo.tc_rows(70, 64) == 128 and wo.tc_rows(128, 64) == 128 and wo.tc_rows(1, 32) == 32


@pytest.mark.parametrize("tokens", [None, 32, 64, 128])
def test_cuda_lowering_tiles_x_for_tensor_core_shapes(fake_hopper, monkeypatch, tokens):
  """The CUDA lowering hands the tensor-core shapes x tiled (x_rows: M padded to the CTA's tokens)
  and every other shape x row-major (x_rows = 0)."""
  import re
  from jax import export
  monkeypatch.setattr(jax_gmma._backend, "prepare_devices", lambda: None)  # nothing to set up
  wp = wo.prepare(jnp.asarray(np.random.default_rng(0).standard_normal((256, 200)), jnp.float32), "nvfp4")
  m = 40 if tokens is None else 70
  kw = {} if tokens is None else {"rows": 128, "tokens": tokens, "k_warps": 4 if tokens > 32 else 8}
  f = jax.jit(lambda x: jax_gmma.weightonly_gemm(x, wp, **kw))
  with jax_gmma.allow_reference(False):
    text = export.export(f, platforms=("cuda",), disabled_checks=jax_gmma.export_disabled_checks())(
        jnp.ones((m, 200), jnp.bfloat16)).mlir_module()
  call = text[text.index("custom_call @jax_gmma_weightonly_gemm"):]
  call = call[:call.index("\n")]
  x_rows = int(re.search(r"x_rows = (\d+)", call).group(1))
  tiles = re.findall(r"custom_call @jax_gmma_weightonly_tile_x\(.*", text)
  if tokens is None:  # M = 40, N = 256: the mma.sync shapes (too few 64-row blocks for pick_tc)
    assert x_rows == 0 and "tensor<40x256xbf16>" in call and not tiles
  else:
    assert x_rows == -(-m // tokens) * tokens
    assert f"tensor<4x{x_rows // 8}x512xbf16>" in call
    # one tiling kernel of its own, no XLA transpose: x (M, Kp) in, the tiled blocks out
    assert len(tiles) == 1 and f"(tensor<{m}x256xbf16>) -> tensor<4x{x_rows // 8}x512xbf16>" in tiles[0]


def test_cta_shape_errors():
  wp = wo.prepare(jnp.ones((64, 128), jnp.float32), "nvfp4")
  x = jnp.ones((1, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="k_warps must be one of"):
    jax_gmma.weightonly_gemm(x, wp, k_warps=3)
  with pytest.raises(ValueError, match="no kernel for the CTA shape"):
    jax_gmma.weightonly_gemm(x, wp, rows=64, tokens=8, k_warps=2)
  with pytest.raises(ValueError, match="must divide N"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16),
                             wo.prepare(jnp.ones((48, 128), jnp.float32), "nvfp4"), rows=32)
  with pytest.raises(ValueError, match="k_warps choose the kernel"):
    jax_gmma.weightonly_gemm(x, wp, k_warps=4, path="dequant")


# -- GPU: the kernel ----------------------------------------------------------------------------

def _weights(fmt, n, k, seed):
  rng = _rng(seed)
  # Rows with different magnitudes so the scales vary; a few all-zero NVFP4/MX blocks.
  w = rng.standard_normal((n, k)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (n, 1)))
  w[: min(n, 16), :16] = 0
  return w, wo.prepare(jnp.asarray(w), fmt)


def _check(fmt, m, n, k, seed, out_dtype=jnp.bfloat16, x_kind="bf16", bias=False, rows=None,
           tokens=None, path="auto", k_warps=None):
  rng = _rng(seed + 99)
  _, wp = _weights(fmt, n, k, seed)
  wdq = (_rounded_weights(wp) if path == "fp8_rounded" else
         np.asarray(wo.dequantize_packed(wp), np.float64))
  xf = rng.standard_normal((m, k)).astype(np.float32)
  xs = None
  if x_kind == "bf16":
    x = jnp.asarray(xf, jnp.bfloat16)
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
  else:
    xq = jax_gmma.quantize(jnp.asarray(xf), "fp8_channel")
    x, xs = xq.data, xq.scales.reshape(-1)
    x64 = np.asarray(jax_gmma.dequantize(xq), np.float64)
  b = jnp.asarray(rng.standard_normal(n), out_dtype) if bias else None
  f = jax.jit(lambda x, wp, xs, b: jax_gmma.weightonly_gemm(x, wp, x_scale=xs, bias=b,
                                                            out_dtype=out_dtype, rows=rows,
                                                            tokens=tokens, k_warps=k_warps,
                                                            path=path))
  out = np.asarray(f(x, wp, xs, b).astype(jnp.float32), np.float64)
  rows_ = np.arange(m) if m <= 256 else rng.choice(m, 256, replace=False)
  ref = x64[rows_] @ wdq.T
  if bias:
    ref = ref + np.asarray(b.astype(jnp.float32), np.float64)
  got = out[rows_]
  assert np.isfinite(got).all()
  err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
  # float32 output: 1e-5 for the bf16 mma / GEMM paths; the FP8 tensor cores of path="fp8"
  # accumulate each 128-K chunk in fewer bits before promoting it to float32 (~1e-4).
  tol = 8e-3 if out_dtype == jnp.bfloat16 else (3e-4 if path.startswith("fp8") else 1e-5)
  assert err < tol, (fmt, m, n, k, err)
  return err


SHAPES = [(8192, 8192), (28672, 8192), (8192, 28672), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16, 128])
def test_kernel_shapes(fmt, m, n, k):
  _check(fmt, m, n, k, seed=m + n + k, out_dtype=jnp.float32)


PATHS = [(f, p) for f in FORMATS for p in ("kernel", "dequant", "fp8", "fp8_rounded") if p != "fp8" or f in MX]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,path", PATHS)
def test_kernel_prefill_m4096(fmt, path):
  _check(fmt, 4096, 4096, 4096, seed=11, path=path, x_kind="fp8" if path.startswith("fp8") else "bf16")
  if path != "kernel":
    _check(fmt, 4096, 28672, 8192, seed=12, path=path, x_kind="fp8")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,path", PATHS)
def test_both_paths_at_the_switch(fmt, path):
  # M = 128 is the switch (test_kernel_shapes runs M = 128 on the default path); both must be
  # right there, and with FP8 activations, token scales, bias and K not a multiple of 64.
  if not path.startswith("fp8"):
    _check(fmt, 128, 8192, 8192, seed=21, out_dtype=jnp.float32, path=path)
  _check(fmt, wo.PREFILL_MIN_M, 1024, 2048, seed=22, x_kind="fp8", bias=True, path=path)
  _check(fmt, 300, 256, 200, seed=23, x_kind="fp8", bias=True, path=path, out_dtype=jnp.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", [(16, 64), (48, 200), (8192, 8192)])
def test_unpack_kernel_exact(fmt, n, k):
  """The CUDA unpack kernel (bf16; e4m3 for MX) equals the JAX dequantization bit for bit,
  poisoned blocks included (bf16: non-finite; e4m3: NaN)."""
  w, _ = _weights(fmt, n, k, seed=n + k)
  w[n // 2, 40] = np.inf  # a poisoned block
  wp = wo.prepare(jnp.asarray(w), fmt)
  _check_unpack(wp)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [64, 192, 200, 1000])
def test_kernel_k_not_multiple_of_128(fmt, k):
  _check(fmt, 5, 256, k, seed=k, out_dtype=jnp.float32, bias=True)


#: (CTA shape, M) cases: every mma.sync decode shape at 1 / 9 / 33 tokens, every tensor-core
#: shape at 17 / 70 / 128 (partial and whole token tiles).
TILE_CASES = ([(c, m) for c in wo.CTA_SHAPES for m in (1, 9, 33)] +
              [(c, m) for c in wo.TC_SHAPES for m in (17, 70, 128)])


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cta,m", TILE_CASES, ids=lambda v: "%dx%dk%d" % v if isinstance(v, tuple) else str(v))
def test_kernel_every_tile(fmt, cta, m):
  rows, tokens, k_warps = cta
  # K = 1088: 17 K steps, not a multiple of any K split (ragged last steps per warp / warp group,
  # and over the tensor-core kernel's 4-step weight ring)
  _check(fmt, m, 1024, 1088, seed=rows + tokens + k_warps + m, out_dtype=jnp.float32, rows=rows,
         tokens=tokens, k_warps=k_warps)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,rows", [(1, 64, 32), (21, 192, 32), (70, 8192, 128), (128, 1088, 128), (300, 4096, 320)])
def test_tile_x_kernel_matches_tiled_x(m, k, rows):
  """The CUDA tiling kernel (jax_gmma_weightonly_tile_x) writes exactly tiled_x: every element,
  zero rows past M."""
  x = jnp.asarray(_rng(m + k).standard_normal((m, k)), jnp.bfloat16)
  out = jax.ShapeDtypeStruct((k // 64, rows // 8, 512), jnp.bfloat16)
  got = jax.jit(jax.ffi.ffi_call(wo.TILE_X_TARGET, out))(x)
  want = wo.tiled_x(x, rows)
  np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [64, 192, 8192])
@pytest.mark.parametrize("m", [20, 64, 127])
def test_tensor_core_kernel_picked(fmt, k, m):
  # The picked shapes (bf16 out, per-token scale, bias); K = 64 / 192 leave some of the K warp
  # groups without a step (their partial sums are zero).
  _check(fmt, m, 2048, k, seed=k + m, out_dtype=jnp.bfloat16, x_kind="fp8", bias=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("k", [8192, 8256])
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_ring_depth_switch(fmt, k, out_dtype):
  # The FP4 16-row x 8-token tile with 8 warps along K runs a 2-step weight ring up to K = 8192
  # (16 K steps per warp) and the 4-step ring above (fp4_shallow_tile / fp4_shallow_k): the last K of one and
  # the first of the other (129 K steps: ragged over the 8 warps).
  _check(fmt, 5, 1024, k, seed=k, out_dtype=out_dtype, rows=16, tokens=8, k_warps=8)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_fp8_activations_bias(fmt, out_dtype):
  _check(fmt, 7, 2048, 4096, seed=5, out_dtype=out_dtype, x_kind="fp8", bias=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_nan_propagates(fmt):
  n, k = 64, 256
  w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
  wp = wo.prepare(jnp.asarray(w), fmt)
  x = jnp.ones((2, k), jnp.bfloat16).at[0, 5].set(jnp.nan)
  out = np.asarray(jax.jit(jax_gmma.weightonly_gemm)(x, wp).astype(jnp.float32))
  assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
  w[3, 7] = np.inf  # a poisoned block: NaN scale -> NaN in that output column
  wp = wo.prepare(jnp.asarray(w), fmt)
  out = np.asarray(jax.jit(jax_gmma.weightonly_gemm)(jnp.ones((1, k), jnp.bfloat16), wp))
  assert not np.isfinite(out[0, 3].astype(np.float32)) and np.isfinite(out[0, 4].astype(np.float32))





@pytest.mark.gpu
def test_command_buffers_bit_identical_and_captured():
  runs = command_buffer_runs([child_script("cmdbuf_weightonly_child.py")])
  off, default, forced = runs["off"], runs["default"], runs["forced"]
  # XLA's dynamic-slice fusion off: the N != K chains' slices become copy kernels instead.
  nodsf = run_child([child_script("cmdbuf_weightonly_child.py")],
                    "--xla_gpu_enable_dynamic_slice_fusion=false")
  for name in ("chain", "dequant", "fp8", "sliced1", "sliced4"):
    assert default[name] == off[name] and forced[name] == off[name], name
    assert nodsf[name] == off[name], name
  assert not nodsf["sliced1_dsfusion"] and not nodsf["sliced4_dsfusion"], nodsf
  print({k: v for k, v in default.items() if k.endswith("_dsfusion")})
  # The sliced chains are captured too (with or without the dynamic-slice fusion around them).
  for mode in (default, forced, nodsf):
    assert mode["sliced1_captured"] >= 32 and mode["sliced4_captured"] >= 32, mode
  assert off["captured"] == 0 and off["eager"] > 0
  # Every decode GEMM of the 32-call chain is captured, with the default flags and forced.
  assert default["chain_captured"] >= 32, default
  assert forced["chain_captured"] >= 32, forced
  # The prefill chains (8 unpacks + 8 bf16 GEMMs; 8 unpacks + 8 FP8 GEMMs): XLA decides which
  # thunks go into command buffers; the unpack handler must be among the captured ones.
  print({k: v for k, v in forced.items() if k.endswith(("_captured", "_eager"))})
  assert forced["dequant_captured"] >= 1 and forced["fp8_captured"] >= 1, forced


def test_layout_version_guard():
  """A PackedWeight records the layout version of its bytes; one from an older layout (a pickle,
  or a pytree rebuilt with the old 4-field aux data) is refused with a clear error by every
  consumer instead of being decoded with the new bit positions."""
  import pickle
  w = _rng(11).standard_normal((32, 128)).astype(np.float32)
  wp = wo.prepare(w, "nvfp4")
  assert wp.layout == wo.LAYOUT_VERSION["nvfp4"] == 2 and "layout=2" in repr(wp)
  assert wo.prepare(w, "mxfp6_e2m3").layout == 2 and wo.prepare(w, "mxfp4").layout == 3
  assert wp.with_fp8_exact(None).layout == 2
  leaves, treedef = jax.tree_util.tree_flatten(wp)
  assert jax.tree_util.tree_unflatten(treedef, leaves).layout == 2
  assert pickle.loads(pickle.dumps(wp)).layout == 2
  old = wo.PackedWeight.tree_unflatten(("nvfp4", wp.n, wp.k, False), (wp.packed, wp.scales, wp.global_scale))
  assert old.layout == 1
  state = (None, {n: getattr(wp, n) for n in wo.PackedWeight.__slots__ if n != "layout"})
  old_pickle = object.__new__(wo.PackedWeight)
  old_pickle.__setstate__(state)
  assert old_pickle.layout == 1 and old_pickle.format == "nvfp4"
  x = jnp.ones((2, 128), jnp.bfloat16)
  for bad in (old, old_pickle):
    with pytest.raises(ValueError, match="layout version 1"):
      jax_gmma.weightonly_gemm(x, bad)
    with pytest.raises(ValueError, match="layout version 1"):
      wo.dequantize_packed(bad)
    with pytest.raises(ValueError, match="layout version 1"):
      wo.unpack(bad)
