"""GPU tests of jax-gmma's Hopper MXFP8 x MXFP8 kernel (cpp/sm90_mxf8_gemm_blockscaled.cu) through
jax_gmma.mx_gemm and jax_gmma.scaled_matmul (skipped without a Hopper GPU and built kernels).

Oracle: the dequantized operands (e4m3 element x its E8M0 block scale) multiplied in float64 on
the host (a row subset for the largest M). Operands are random float32 values quantized with
jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4"), scaled so the blocks' E8M0 scales spread
over ~16 binades; fresh inputs per check, never all-zeros. Tolerance: relative Frobenius error
1e-3 for float32 output (the FP8 tensor core sums each 32-K block to ~2^-13 relative; measured
~1e-4), 1e-2 for bfloat16 / float16 (one output rounding).
"""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import check_bit_identical_and_captured  # noqa: E402 (tests/ helper)
from jax_gmma import _backend
from jax_gmma.ops import mx

pytestmark = pytest.mark.gpu

TOL = {jnp.float32: 1e-3, jnp.bfloat16: 1e-2, jnp.float16: 1e-2}
CONFIGS = mx.KERNELS["sm_90a"][("mxfp8", "mxfp8")]
_seed = [0]


def _key():
  _seed[0] += 1
  return jax.random.PRNGKey(9000 + _seed[0])


def operand(rows, k, spread=True):
  """rows x k float32 values whose 32-blocks span many binades, quantized to MXFP8."""
  k1, k2 = jax.random.split(_key())
  x = jax.random.normal(k1, (rows, k), jnp.float32)
  if spread:
    x = x * jnp.exp2(jax.random.randint(k2, (rows, k // 32, 1), -8, 8).astype(jnp.float32)).repeat(32, 1).reshape(rows, k)
  return jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4")


def ref64(a_q, b_q, bias=None):
  return mx.reference_float64(a_q, b_q, bias)


def relerr(out, ref):
  out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
  assert np.isfinite(out).all()
  return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300)


def lowered_to_kernel(fn, *args):
  return "jax_gmma_mx_gemm" in jax.jit(fn).lower(*args).as_text()


SHAPES = [  # (M, N, K): the spine's list and the DeepSeek-V3 shapes, plus ragged edges
    (1, 4096, 7168), (7, 4096, 128), (64, 2112, 7168), (128, 24576, 1536), (129, 1000, 7168),
    (1, 28672, 8192), (16, 28672, 8192), (64, 7168, 16384), (4096, 2112, 7168), (200, 300, 160),
]


@pytest.mark.parametrize("path", ["kernel", None])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_shapes_vs_float64(m, n, k, path):
  """The kernel at every M (path="kernel"), and the automatic path: the kernel below
  SM90_DEQUANT_MIN_M rows, the exact bf16 route from there (no custom call)."""
  if path is None and m < mx.SM90_DEQUANT_MIN_M and m != 1:
    pytest.skip("same as path='kernel' below SM90_DEQUANT_MIN_M")
  a_q, b_q = operand(m, k), operand(n, k)
  fn = jax.jit(lambda a, b: jax_gmma.mx_gemm(a, b, out_dtype=jnp.float32, path=path))
  assert lowered_to_kernel(fn, a_q, b_q) == (path == "kernel" or m < mx.SM90_DEQUANT_MIN_M)
  out = fn(a_q, b_q)
  if m > 512:  # host oracle on a row subset
    rows = np.r_[0:64, m - 64:m]
    deq_a = np.asarray(jax_gmma.dequantize(a_q), np.float64)[rows]
    deq_b = np.asarray(jax_gmma.dequantize(b_q), np.float64)
    err = relerr(np.asarray(out)[rows], deq_a @ deq_b.T)
  else:
    err = relerr(out, ref64(a_q, b_q))
  assert err < TOL[jnp.float32], (m, n, k, err)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("m", [1, 9, 33, 70, 130])
def test_every_config(config, m):
  a_q, b_q, = operand(m, 1056), operand(392, 1056)  # K: 8 full K steps + a 32-wide tail
  bias = jax.random.normal(_key(), (392,), jnp.float32)
  out = jax.jit(lambda a, b, c: jax_gmma.mx_gemm(a, b, bias=c, out_dtype=jnp.float32, config=config))(
      a_q, b_q, bias)
  assert relerr(out, ref64(a_q, b_q, np.asarray(bias, np.float64))) < TOL[jnp.float32]


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("m", [4, 256])
def test_output_dtypes_and_bias(out_dtype, m):
  a_q, b_q = operand(m, 512, spread=False), operand(256, 512, spread=False)
  bias = jax.random.normal(_key(), (256,), jnp.float32).astype(out_dtype)
  out = jax.jit(lambda a, b, c: jax_gmma.mx_gemm(a, b, bias=c, out_dtype=out_dtype))(a_q, b_q, bias)
  assert out.dtype == out_dtype and out.shape == (m, 256)
  ref = ref64(a_q, b_q, np.asarray(bias.astype(jnp.float32), np.float64))
  assert relerr(out, ref) < TOL[out_dtype]


def test_batched_a():
  a_q, b_q = operand(256, 256), operand(128, 256)
  a3 = jax_gmma.quantize(jax_gmma.dequantize(a_q).reshape(2, 128, 256), "mxfp8", layout="sm100_128x4")
  out = jax.jit(lambda a, b: jax_gmma.mx_gemm(a, b, out_dtype=jnp.float32))(a3, b_q)
  assert out.shape == (2, 128, 128)
  assert relerr(out.reshape(256, 128), ref64(a_q, b_q)) < TOL[jnp.float32]


def test_tiny_scale_and_nan_scale():
  """E8M0 code 0 (2^-127, a float32 subnormal) is applied, a NaN scale (0xFF) poisons exactly
  the outputs its block feeds (here: one column), the rest stays accurate."""
  m, n, k = 8, 128, 256
  a_q, b_q = operand(m, k, spread=False), operand(n, k, spread=False)
  sa = np.array(jax_gmma.layouts.unswizzle_scales(a_q.scales, m, k // 32)).view(np.uint8).copy()
  sb = np.array(jax_gmma.layouts.unswizzle_scales(b_q.scales, n, k // 32)).view(np.uint8).copy()
  sa[2, 3] = 0    # 2^-127
  sb[5, 2] = 255  # NaN scale: column 5
  E8 = ml_dtypes.float8_e8m0fnu
  a2 = mx.mxfp8_operand(a_q.data, jnp.asarray(sa.view(E8)))
  b2 = mx.mxfp8_operand(b_q.data, jnp.asarray(sb.view(E8)))
  out = np.asarray(jax.jit(lambda a, b: jax_gmma.mx_gemm(a, b, out_dtype=jnp.float32))(a2, b2), np.float64)
  with np.errstate(all="ignore"):
    ref = ref64(a2, b2)
  assert np.isnan(out[:, 5]).all() and np.isnan(ref[:, 5]).all()
  keep = np.ones(n, bool)
  keep[5] = False
  assert np.isfinite(out[:, keep]).all()
  assert np.linalg.norm(out[:, keep] - ref[:, keep]) / np.linalg.norm(ref[:, keep]) < TOL[jnp.float32]


def test_scaled_matmul_mxfp8_runs_the_kernel():
  """jax_gmma.scaled_matmul with jax.nn.scaled_matmul's MXFP8 operands (block 32, E8M0)."""
  a_q, b_q = operand(64, 1024), operand(512, 1024)
  from jax_gmma.ops.quantize import to_jax_scaled_matmul_inputs
  la, ls, _ = to_jax_scaled_matmul_inputs(a_q)
  rb, rs, _ = to_jax_scaled_matmul_inputs(b_q)
  assert lowered_to_kernel(lambda *x: jax_gmma.scaled_matmul(*x), la, rb, ls, rs)
  out = jax.jit(jax_gmma.scaled_matmul)(la, rb, ls, rs)
  assert out.shape == (1, 64, 512) and out.dtype == jnp.float32
  assert relerr(out[0], ref64(a_q, b_q)) < TOL[jnp.float32]


def test_other_mx_pairs_refuse_on_hopper():
  x = jax.random.normal(_key(), (16, 256))
  a4 = jax_gmma.quantize(x, "mxfp4", layout="sm100_128x4")
  with pytest.raises(_backend.KernelUnavailable, match="mxfp4 x mxfp4 on sm_90a.*Refusing to fall back"):
    jax.jit(jax_gmma.mx_gemm)(a4, a4)
  e5 = jax_gmma.quantize(x, "mxfp8", dtype=jnp.float8_e5m2, layout="sm100_128x4")
  with pytest.raises(_backend.KernelUnavailable, match="float8_e5m2"):
    jax.jit(jax_gmma.mx_gemm)(e5, operand(16, 256))


def test_command_buffers_bit_identical_and_captured():
  check_bit_identical_and_captured("cmdbuf_mx_sm90_child.py")
