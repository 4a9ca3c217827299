"""fp8_gemm / dot through the primitive's default (reference) lowering, on any backend."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from jax_gmma import _backend

pytestmark = pytest.mark.skipif(bool(_backend.cuda_devices()),
                                reason="CPU-path tests; the GPU has its own tests")


def rand_fp8(rng, shape, dtype=ml_dtypes.float8_e4m3fn):
  return (rng.standard_normal(shape) * 2).astype(dtype)


def ref64(a, b, sa, sb, bias=None):
  out = a.astype(np.float64) @ b.astype(np.float64).T
  out = out * np.asarray(sa, np.float64).reshape(-1, 1) * np.asarray(sb, np.float64).reshape(1, -1)
  if bias is not None:
    out = out + np.asarray(bias, np.float64)
  return out


def relerr(x, ref):
  x = np.asarray(x, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("out_dtype, tol", [(jnp.bfloat16, 1e-2), (jnp.float16, 2e-3), (jnp.float32, 1e-6)])
@pytest.mark.parametrize("per_row", [False, True])
def test_fp8_gemm_matches_float64(out_dtype, tol, per_row):
  rng = np.random.default_rng(0)
  m, n, k = 33, 48, 256
  a, b = rand_fp8(rng, (m, k)), rand_fp8(rng, (n, k))
  sa = rng.uniform(0.5, 2, m if per_row else 1).astype(np.float32)
  sb = rng.uniform(0.5, 2, n if per_row else 1).astype(np.float32)
  bias = rng.standard_normal(n).astype(np.float32)
  out = jax.jit(lambda *x: jax_gmma.fp8_gemm(*x[:4], bias=x[4], out_dtype=out_dtype))(a, b, sa, sb, bias)
  assert out.dtype == out_dtype and out.shape == (m, n)
  assert relerr(out, ref64(a, b, sa, sb, bias)) < tol


def test_batch_dims_and_e5m2():
  rng = np.random.default_rng(1)
  a = rand_fp8(rng, (2, 5, 64), ml_dtypes.float8_e5m2)
  b = rand_fp8(rng, (16, 64))
  sa = rng.uniform(0.5, 2, (2, 5)).astype(np.float32)
  out = jax_gmma.fp8_gemm(a, b, sa, 0.5, out_dtype=jnp.float32)
  assert out.shape == (2, 5, 16)
  ref = ref64(a.reshape(10, 64), b, sa.reshape(-1), 0.5).reshape(2, 5, 16)
  assert relerr(out, ref) < 1e-6


def test_nan_propagates():
  rng = np.random.default_rng(2)
  a, b = rand_fp8(rng, (8, 32)), rand_fp8(rng, (16, 32))
  a[3, 5] = np.nan
  out = np.asarray(jax_gmma.fp8_gemm(a, b, out_dtype=jnp.float32))
  assert np.isnan(out[3]).all() and np.isfinite(np.delete(out, 3, axis=0)).all()


def test_errors_are_raised_at_trace_time():
  a = jnp.zeros((4, 32), jnp.float8_e4m3fn)
  with pytest.raises(TypeError, match="b must be float8"):
    jax.jit(jax_gmma.fp8_gemm)(a, jnp.zeros((16, 32), jnp.float16))
  with pytest.raises(ValueError, match="multiple of 16"):
    jax_gmma.fp8_gemm(jnp.zeros((4, 24), jnp.float8_e4m3fn), jnp.zeros((16, 24), jnp.float8_e4m3fn))


def test_tile_order_arguments():
  rng = np.random.default_rng(4)
  a, b = rand_fp8(rng, (8, 64)), rand_fp8(rng, (16, 64))
  with pytest.raises(ValueError, match="swizzle must be one of"):
    jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, swizzle=3))(a, b)
  with pytest.raises(ValueError, match="raster must be one of"):
    jax_gmma.fp8_gemm(a, b, raster="diagonal")
  # Same values whatever the tile order (here the reference path; the kernel on the GPU tests).
  ref = np.asarray(jax_gmma.fp8_gemm(a, b, out_dtype=jnp.float32))
  out = np.asarray(jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, out_dtype=jnp.float32, swizzle=8,
                                                          raster="m"))(a, b))
  np.testing.assert_array_equal(out, ref)


def test_dot_quantizes_activations():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((2, 7, 256)).astype(np.float32)
  w = rng.standard_normal((64, 256)).astype(np.float32) * 0.05
  wq = jax_gmma.quantize(w, "fp8_channel")
  out = jax.jit(lambda x, wq: jax_gmma.dot(x, wq))(x, wq)
  assert out.shape == (2, 7, 64) and out.dtype == jnp.float32
  ref = x.astype(np.float64) @ w.astype(np.float64).T
  assert relerr(out, ref) < 0.08  # two fp8 e4m3 roundings (3 mantissa bits each)


def test_dot_rejects_non_quantized_weight():
  with pytest.raises(TypeError, match="QuantizedArray"):
    jax_gmma.dot(jnp.ones((2, 32)), jnp.ones((16, 32)))
