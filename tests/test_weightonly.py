"""FP4 weight-only GEMM (jax_gmma.weightonly): the prepared layout, the reference, shape rules
(CPU), and the sm_90a kernel against a float64 oracle of the dequantized weights (GPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import child_script, command_buffer_runs  # noqa: E402 (tests/ helper)
from jax_gmma import weightonly as wo

FORMATS = ("nvfp4", "mxfp4")


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
  assert wp.packed.shape == (n // 16, kp // 64, 512) and wp.packed.dtype == np.uint8
  assert wp.scales.shape == (n // 16, kp // 64, 64 if fmt == "nvfp4" else 32)
  ref = np.asarray(jax_gmma.dequantize(q))
  got = np.asarray(wo.dequantize_packed(wp))
  np.testing.assert_allclose(got, ref, rtol=2 ** -22, atol=0)
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


@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_matches_float64(fmt):
  rng = _rng(3)
  n, k, m = 32, 192, 5
  w = rng.standard_normal((n, k)).astype(np.float32)
  wp = wo.prepare(w, fmt)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  bias = rng.standard_normal(n).astype(np.float32)
  out = jax.jit(lambda x, wp, b: jax_gmma.weightonly_gemm(x, wp, bias=b, out_dtype=jnp.float32))(
      x, wp, bias)
  ref = np.asarray(x, np.float64) @ np.asarray(wo.dequantize_packed(wp), np.float64).T + bias
  err = np.linalg.norm(np.asarray(out) - ref) / np.linalg.norm(ref)
  assert err < 1e-6, err


def test_dot_on_packed_weight_cpu():
  rng = _rng(4)
  w = rng.standard_normal((32, 128)).astype(np.float32)
  wp = wo.prepare(w, "nvfp4")
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
           tokens=None):
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
                                                            tokens=tokens))
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
def test_kernel_prefill_m4096(fmt):
  _check(fmt, 4096, 4096, 4096, seed=11)


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
def test_kernel_nan_propagates():
  n, k = 64, 256
  w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
  wp = wo.prepare(jnp.asarray(w), "nvfp4")
  x = jnp.ones((2, k), jnp.bfloat16).at[0, 5].set(jnp.nan)
  out = np.asarray(jax.jit(jax_gmma.weightonly_gemm)(x, wp).astype(jnp.float32))
  assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
  w[3, 7] = np.inf  # a poisoned block: NaN scale -> NaN in that output column
  wp = wo.prepare(jnp.asarray(w), "nvfp4")
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
