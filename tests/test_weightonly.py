"""FP4 / FP6 weight-only GEMM (jax_gmma.weightonly): the prepared layout, the reference, shape rules
(CPU), and the sm_90a kernel against a float64 oracle of the dequantized weights (GPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import child_script, command_buffer_runs  # noqa: E402 (tests/ helper)
from jax_gmma import weightonly as wo

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
            pos = {0: (15, 8, 7, 6), 1: (12, 5, 4, 3), 2: (9, 2, 1, 0), 3: (11, 14, 13, 10)}[pair]
            got = sum(((int(words[g, t, qq]) >> (b + 16 * half)) & 1) << (3 - i)
                      for i, b in enumerate(pos))
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
  big = np.full((16, 64), 2.0 ** 15, np.float32)  # e2m3 scale 2^13 > 2^11
  with pytest.raises(ValueError, match="exceed 2\\^11"):
    wo.prepare(big, "mxfp6_e2m3")
  wo.prepare(big, "mxfp6_e3m2")  # e3m2: scale 2^11, within 2^13
  with pytest.raises(ValueError, match="exceed 2\\^13"):
    wo.prepare(big * 2.0 ** 5, "mxfp6_e3m2")
  with pytest.raises(ValueError, match="is mxfp6_e3m2, not mxfp6_e2m3"):
    wo.prepare(jax_gmma.quantize(w, "mxfp6_e3m2"), "mxfp6_e2m3")
  wp = wo.prepare(w, "mxfp6_e2m3")  # K = 100: padded to 128 with zero weights
  assert wp.packed.shape == (2, 2, 768) and wp.k == 100
  with pytest.raises(ValueError, match="K = 100"):
    jax_gmma.weightonly_gemm(jnp.ones((1, 128), jnp.bfloat16), wp)


def test_pick_tile():
  assert wo.pick_tile(1, 8192) == (16, 8)
  assert wo.pick_tile(16, 8192) == (32, 16)
  assert wo.pick_tile(16, 16 * 3) == (16, 16)
  assert wo.pick_tile(16, 4096) == (16, 16)
  assert wo.pick_tile(4096, 28672) == (64, 16)


# -- GPU: the kernel ----------------------------------------------------------------------------

def _weights(fmt, n, k, seed):
  rng = _rng(seed)
  # Rows with different magnitudes so the scales vary; a few all-zero NVFP4/MX blocks.
  w = rng.standard_normal((n, k)).astype(np.float32) * np.exp(rng.uniform(-3, 3, (n, 1)))
  w[: min(n, 16), :16] = 0
  return w, wo.prepare(jnp.asarray(w), fmt)


def _check(fmt, m, n, k, seed, out_dtype=jnp.bfloat16, x_kind="bf16", bias=False, rows=None,
           tokens=None, path="auto"):
  rng = _rng(seed + 99)
  _, wp = _weights(fmt, n, k, seed)
  wdq = np.asarray(wo.dequantize_packed(wp), np.float64)
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
                                                            tokens=tokens, path=path))
  out = np.asarray(f(x, wp, xs, b).astype(jnp.float32), np.float64)
  rows_ = np.arange(m) if m <= 256 else rng.choice(m, 256, replace=False)
  ref = x64[rows_] @ wdq.T
  if bias:
    ref = ref + np.asarray(b.astype(jnp.float32), np.float64)
  got = out[rows_]
  assert np.isfinite(got).all()
  err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
  tol = 8e-3 if out_dtype == jnp.bfloat16 else 1e-5
  assert err < tol, (fmt, m, n, k, err)
  return err


SHAPES = [(8192, 8192), (28672, 8192), (8192, 28672), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16, 128])
def test_kernel_shapes(fmt, m, n, k):
  _check(fmt, m, n, k, seed=m + n + k, out_dtype=jnp.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["kernel", "dequant"])
def test_kernel_prefill_m4096(fmt, path):
  _check(fmt, 4096, 4096, 4096, seed=11, path=path)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", ["kernel", "dequant"])
def test_both_paths_at_the_switch(fmt, path):
  # M = 128 takes the dequant path by default (test_kernel_shapes); the kernel must stay right
  # there, and the dequant path must also be right with FP8 activations, token scales and bias.
  _check(fmt, 128, 8192, 8192, seed=21, out_dtype=jnp.float32, path=path)
  _check(fmt, wo.PREFILL_MIN_M, 1024, 2048, seed=22, x_kind="fp8", bias=True, path=path)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("k", [64, 192, 200, 1000])
def test_kernel_k_not_multiple_of_128(fmt, k):
  _check(fmt, 5, 256, k, seed=k, out_dtype=jnp.float32, bias=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,tokens", [(16, 8), (16, 16), (32, 8), (32, 16), (64, 8), (64, 16)])
@pytest.mark.parametrize("m", [1, 9, 33])
def test_kernel_every_tile(fmt, rows, tokens, m):
  _check(fmt, m, 1024, 1024, seed=rows + tokens + m, out_dtype=jnp.float32, rows=rows,
         tokens=tokens)


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
  assert default["chain"] == off["chain"] and forced["chain"] == off["chain"]
  assert off["captured"] == 0 and off["eager"] > 0
  assert default["captured"] >= 32, default
  assert forced["captured"] >= 32, forced
