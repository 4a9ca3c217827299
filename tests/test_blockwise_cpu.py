"""Block-scaled FP8 GEMM (1x128 x 128x128 / 1x128 x 1x128 scales) on the CPU: shape rules and
their messages, the reference (the primitive's default lowering) against float64 numpy of the
dequantized operands, scaled_matmul against jax.nn.scaled_matmul's documented maths, the
config heuristic, and dot on block-scaled weights."""
import math
import os
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from jax_gmma import _backend
from jax_gmma.ops.tensorwise_configs import extra_kernels_built
from jax_gmma.ops import blockwise, blockwise_configs as bc
from jax_gmma.numerics import shapes

E4 = ml_dtypes.float8_e4m3fn
E5 = ml_dtypes.float8_e5m2
F32 = np.float32
on_gpu = pytest.mark.skipif(bool(_backend.cuda_devices()),
                            reason="CPU-path tests; the GPU has its own tests")


def cdiv(a, b):
  return -(-a // b)


def rand_fp8(rng, shape):
  return (rng.standard_normal(shape) * 2).astype(E4)


def rand_scales(rng, shape):
  return rng.uniform(0.25, 2.0, shape).astype(F32)


def deq64(x, s, row_block):
  """Dequantized operand in float64: x (R, K) * s broadcast over (row_block x 128) blocks."""
  r, k = x.shape
  s = np.asarray(s, np.float64)
  s = np.repeat(np.repeat(s, row_block, axis=0)[:r], 128, axis=1)[:, :k]
  return x.astype(np.float64) * s


def ref64(a, b, sa, sb, bias=None):
  row_block = 128 if sb.shape[0] != b.shape[0] else 1
  out = deq64(a, sa, 1) @ deq64(b, sb, row_block).T
  if bias is not None:
    out = out + np.asarray(bias, np.float64)
  return out


def relerr(x, ref):
  x = np.asarray(x, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def problem(m=4, n=256, k=384, *, a_shape=None, a_dtype=E4, b_dtype=E4, sa_shape=None, sa_dtype=F32,
            sb_shape=None, sb_dtype=F32, **kw):
  a_shape = (m, k) if a_shape is None else a_shape
  kk = a_shape[-1]
  sa_shape = a_shape[:-1] + (cdiv(kk, 128),) if sa_shape is None else sa_shape
  sb_shape = (cdiv(n, 128), cdiv(kk, 128)) if sb_shape is None else sb_shape
  return shapes.fp8_blockwise_problem(a_shape, a_dtype, (n, kk) if "b_shape" not in kw else kw.pop("b_shape"),
                                      b_dtype, sa_shape, sa_dtype, sb_shape, sb_dtype, **kw)


# -- shape rules -------------------------------------------------------------------------------

def test_problem_variants_and_printing():
  p = problem(m=7, n=2112, k=7168)
  assert (p.m, p.n, p.k, p.variant, p.k_blocks, p.b_scale_rows) == (7, 2112, 7168, "1d2d", 56, 17)
  q = problem(m=7, n=2112, k=7168, sb_shape=(2112, 56))
  assert q.variant == "1d1d" and q.b_scale_rows == 2112
  assert "128x128" in str(p) and "1x128 x 1x128" in str(q)
  # batch dims fold into M; the scales may carry them or be pre-folded
  b = problem(a_shape=(2, 3, 256), n=64)
  assert b.m == 6 and b.batch_shape == (2,) and shapes.output_shape(b) == (2, 3, 64)
  assert problem(a_shape=(2, 3, 256), n=64, sa_shape=(6, 2)).m == 6
  # a partial last K block and M = 1 are fine
  assert problem(m=1, n=8, k=144).k_blocks == 2


@pytest.mark.parametrize("kw, exc, msg", [
    (dict(a_shape=(256,)), ValueError, r"a must have rank >= 2"),
    (dict(b_shape=(1, 256, 256)), ValueError, r"b must have rank 2 \(N, K\)"),
    (dict(a_dtype=E5), TypeError, r"a must be float8_e4m3fn .*e4m3 x e4m3 only.*float8_e5m2"),
    (dict(a_dtype=np.float32), TypeError, r"a must be float8_e4m3fn"),
    (dict(b_dtype=E5), TypeError, r"b must be float8_e4m3fn"),
    (dict(out_dtype=np.int8), TypeError, r"out_dtype must be one of bfloat16, float16, float32"),
    (dict(a_shape=(0, 256)), ValueError, r"zero-size dimensions"),
    (dict(b_shape=(256, 128)), ValueError, r"contraction mismatch.*K=384.*\(128\)"),
    (dict(a_shape=(4, 200), b_shape=(256, 200)), ValueError, r"K \(a.shape\[-1\]\) must be a multiple of 16.*200"),
    (dict(n=100, sb_shape=(1, 3)), ValueError, r"N \(b.shape\[0\]\) must be a multiple of 8.*100"),
    (dict(sa_shape=(4, 2)), ValueError, r"a_scales must have shape \(4, 3\).*ceil\(K/128\)"),
    (dict(sa_shape=None, a_shape=(4, 384), sa_dtype=np.float16), TypeError, r"a_scales must be float32"),
    (dict(sb_shape=(2, 2)), ValueError, r"b_scales must have shape \(2, 3\) \(128x128 blocks.*or \(256, 3\) \(1x128"),
    (dict(sb_dtype=ml_dtypes.bfloat16), TypeError, r"b_scales must be float32"),
    (dict(bias_shape=(255,)), ValueError, r"bias must have shape \(N,\) = \(256,\)"),
    (dict(bias_shape=(256,), bias_dtype=np.int32), TypeError, r"bias must be floating-point"),
])
def test_problem_errors(kw, exc, msg):
  with pytest.raises(exc, match=msg):
    problem(**kw)


def test_missing_scales():
  with pytest.raises(ValueError, match="a_scales is required"):
    shapes.fp8_blockwise_problem((4, 128), E4, (8, 128), E4, None, None, (1, 1), F32)
  with pytest.raises(ValueError, match="b_scales is required"):
    shapes.fp8_blockwise_problem((4, 128), E4, (8, 128), E4, (4, 1), F32, None, None)


def test_kernel_scale_layout():
  s = np.arange(15, dtype=F32).reshape(5, 3)  # 5 rows, 3 K blocks
  t = np.asarray(blockwise.kernel_scale_layout(jnp.asarray(s)))
  assert t.shape == (3, 8)  # (kb, round_up(rows, 4))
  np.testing.assert_array_equal(t[:, :5], s.T)
  np.testing.assert_array_equal(t[:, 5:], 0)
  assert blockwise.kernel_scale_layout(jnp.ones((1, 7))).shape == (7, 4)
  assert blockwise.kernel_scale_layout(jnp.ones((8, 2))).shape == (2, 8)
  assert [blockwise.scale_ld(r) for r in (1, 4, 5, 17)] == [4, 4, 8, 20]


# -- the reference / default lowering ------------------------------------------------------------

@on_gpu
@pytest.mark.parametrize("variant", ["1d2d", "1d1d"])
@pytest.mark.parametrize("m,n,k", [(1, 136, 384), (7, 264, 336), (130, 128, 128)])
def test_reference_matches_float64(variant, m, n, k):
  rng = np.random.default_rng(m * 1000 + n + k)
  a, b = rand_fp8(rng, (m, k)), rand_fp8(rng, (n, k))
  sa = rand_scales(rng, (m, cdiv(k, 128)))
  sb = rand_scales(rng, ((cdiv(n, 128) if variant == "1d2d" else n), cdiv(k, 128)))
  out = jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x, out_dtype=jnp.float32))(a, b, sa, sb)
  assert out.dtype == jnp.float32 and out.shape == (m, n)
  assert relerr(out, ref64(a, b, sa, sb)) < 1e-6
  # the pure function in the user layout agrees with the primitive
  direct = jax_gmma.blockwise_gemm_reference(jnp.asarray(a), jnp.asarray(b), sa, sb, out_dtype=jnp.float32)
  assert relerr(direct, ref64(a, b, sa, sb)) < 1e-6


@on_gpu
@pytest.mark.parametrize("out_dtype, tol", [(jnp.bfloat16, 1e-2), (jnp.float16, 2e-3), (jnp.float32, 1e-6)])
def test_out_dtypes_bias_batch(out_dtype, tol):
  rng = np.random.default_rng(5)
  a = rand_fp8(rng, (2, 3, 256))
  b = rand_fp8(rng, (64, 256))
  sa = rand_scales(rng, (2, 3, 2))
  sb = rand_scales(rng, (1, 2))
  bias = rng.standard_normal(64).astype(F32)
  out = jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x[:4], bias=x[4], out_dtype=out_dtype))(a, b, sa, sb, bias)
  assert out.dtype == out_dtype and out.shape == (2, 3, 64)
  bias_r = np.asarray(jnp.asarray(bias).astype(out_dtype), np.float64)
  ref = ref64(a.reshape(6, 256), b, sa.reshape(6, 2), sb, bias_r).reshape(2, 3, 64)
  assert relerr(out, ref) < tol


@on_gpu
def test_nan_propagates_and_scales_matter():
  rng = np.random.default_rng(6)
  a, b = rand_fp8(rng, (8, 256)), rand_fp8(rng, (16, 256))
  sa, sb = rand_scales(rng, (8, 2)), rand_scales(rng, (1, 2))
  a[3, 5] = np.nan
  out = np.asarray(jax_gmma.blockwise_gemm(a, b, sa, sb, out_dtype=jnp.float32))
  assert np.isnan(out[3]).all() and np.isfinite(np.delete(out, 3, axis=0)).all()
  # scaling one K block of one row changes exactly that row
  a[3, 5] = 1
  sa2 = sa.copy()
  sa2[2, 1] *= 4
  o1 = np.asarray(jax_gmma.blockwise_gemm(a, b, sa, sb, out_dtype=jnp.float32))
  o2 = np.asarray(jax_gmma.blockwise_gemm(a, b, sa2, sb, out_dtype=jnp.float32))
  changed = np.any(o1 != o2, axis=1)
  assert changed.tolist() == [i == 2 for i in range(8)]


def test_blockwise_gemm_errors():
  a, b = jnp.zeros((4, 256), E4), jnp.zeros((128, 256), E4)
  sa, sb = jnp.ones((4, 2), F32), jnp.ones((1, 2), F32)
  with pytest.raises(TypeError, match="a_scales must be float32"):
    jax_gmma.blockwise_gemm(a, b, sa.astype(jnp.bfloat16), sb)
  with pytest.raises(ValueError, match="config must be one of"):
    jax_gmma.blockwise_gemm(a, b, sa, sb, config="nope")
  with pytest.raises(ValueError, match="has no kernel for 1d2d scales"):
    jax_gmma.blockwise_gemm(a, b, sa, sb, config="swap_64x16x128_pingpong")


# -- scaled_matmul ---------------------------------------------------------------------------------

def docs_scaled_matmul64(a, b, sa, sb):
  """jax.nn.scaled_matmul's documented maths in float64 numpy."""
  a = np.asarray(a).astype(np.float64)
  b = np.asarray(b).astype(np.float64)
  sa = np.asarray(sa).astype(np.float64)
  sb = np.asarray(sb).astype(np.float64)
  a = a * np.repeat(sa, a.shape[-1] // sa.shape[-1], axis=-1)
  b = b * np.repeat(sb, b.shape[-1] // sb.shape[-1], axis=-1)
  return np.einsum("bmk,bnk->bmn", a, b)


@on_gpu
@pytest.mark.parametrize("scale_dtype", [np.float32, ml_dtypes.float8_e8m0fnu])
@pytest.mark.parametrize("bsz", [1, 2])
def test_scaled_matmul_block128(scale_dtype, bsz):
  rng = np.random.default_rng(7 + bsz)
  m, n, k = 5, 136, 384
  a, b = rand_fp8(rng, (bsz, m, k)), rand_fp8(rng, (bsz, n, k))
  sa = (2.0 ** rng.integers(-3, 3, (bsz, m, 3))).astype(scale_dtype)
  sb = (2.0 ** rng.integers(-3, 3, (bsz, n, 3))).astype(scale_dtype)
  out = jax.jit(jax_gmma.scaled_matmul)(a, b, sa, sb)
  assert out.shape == (bsz, m, n) and out.dtype == jnp.float32
  ref = docs_scaled_matmul64(a, b, sa, sb)
  assert relerr(out, ref) < 1e-6
  out16 = jax_gmma.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.bfloat16)
  assert out16.dtype == jnp.bfloat16 and relerr(out16, ref) < 1e-2
  # jax.nn.scaled_matmul itself, where this JAX can run it (0.10.2 has no CPU lowering for it)
  try:
    jref = jax.nn.scaled_matmul(jnp.asarray(a), jnp.asarray(b), jnp.asarray(sa), jnp.asarray(sb))
  except NotImplementedError:
    return
  assert relerr(out, np.asarray(jref, np.float64)) < 1e-5


@pytest.mark.usefixtures("cpu_device")
def test_scaled_matmul_mxfp8_goes_to_mx_gemm():
  """Block 32 + E8M0 scales (MXFP8) runs jax_gmma.mx_gemm (its reference lowering on CPU; the
  Hopper kernel on an H200: tests/test_gpu_mx_sm90.py), one GEMM per batch entry. On the CPU
  device (conftest's cpu_device), so that on a GPU machine too it checks the reference maths
  to 1e-6."""
  rng = np.random.default_rng(8)
  a, b = rand_fp8(rng, (2, 5, 96)), rand_fp8(rng, (2, 8, 96))
  sa = (2.0 ** rng.integers(-3, 4, (2, 5, 3))).astype(ml_dtypes.float8_e8m0fnu)
  sb = (2.0 ** rng.integers(-3, 4, (2, 8, 3))).astype(ml_dtypes.float8_e8m0fnu)
  out = jax.jit(jax_gmma.scaled_matmul)(a, b, sa, sb)
  assert out.shape == (2, 5, 8) and out.dtype == jnp.float32
  assert relerr(out, docs_scaled_matmul64(a, b, sa, sb)) < 1e-6
  text = jax.jit(jax_gmma.scaled_matmul).lower(a, b, sa, sb).as_text()
  assert text.count("jax_gmma_mx_gemm") == 0  # CPU: the reference lowering (no custom call)


def test_scaled_matmul_no_kernel_errors_and_opt_in():
  rng = np.random.default_rng(9)
  a, b = rand_fp8(rng, (1, 4, 64)), rand_fp8(rng, (1, 8, 64))
  sa = np.ones((1, 4, 4), ml_dtypes.float8_e8m0fnu)  # block 16
  sb = np.ones((1, 8, 4), ml_dtypes.float8_e8m0fnu)
  with pytest.raises(ValueError, match=r"block size 16 .*no kernel behind scaled_matmul.*Refusing to fall back"):
    jax_gmma.scaled_matmul(a, b, sa, sb)
  with jax_gmma.allow_reference():
    out = jax_gmma.scaled_matmul(a, b, sa, sb)
  assert relerr(out, docs_scaled_matmul64(a, b, sa, sb)) < 1e-6
  with pytest.raises(ValueError, match=r"block size 32 takes float8_e8m0fnu scales"):
    jax_gmma.scaled_matmul(a, b, np.ones((1, 4, 2), F32), np.ones((1, 8, 2), F32))
  a5 = rand_fp8(rng, (1, 4, 128)).astype(E5)
  with pytest.raises(ValueError, match=r"float8_e5m2 x float8_e4m3fn have no kernel"):
    jax_gmma.scaled_matmul(a5, rand_fp8(rng, (1, 8, 128)), np.ones((1, 4, 1), F32), np.ones((1, 8, 1), F32))
  with pytest.raises(TypeError, match=r"lhs_scales must be floating point .*got int32"):
    jax_gmma.scaled_matmul(rand_fp8(rng, (1, 4, 128)), rand_fp8(rng, (1, 8, 128)),
                           np.ones((1, 4, 1), np.int32), np.ones((1, 8, 1), np.int32))


@pytest.mark.parametrize("shapes_, msg", [
    (((4, 128), (1, 8, 128), (1, 4, 1), (1, 8, 1)), "all 3-dimensional"),
    (((1, 4, 128), (1, 8, 256), (1, 4, 1), (1, 8, 1)), "matching batch .* and contraction"),
    (((1, 4, 128), (1, 8, 128), (1, 4, 1), (1, 8, 2)), "scales must have matching batch"),
    (((1, 4, 128), (1, 8, 128), (1, 3, 1), (1, 8, 1)), "must match the non-contracting"),
    (((1, 4, 128), (1, 8, 128), (1, 4, 3), (1, 8, 3)), r"K \(128\) must be a multiple of the scales' last dimension \(3\)"),
])
def test_scaled_matmul_shape_errors(shapes_, msg):
  a, b, sa, sb = shapes_
  with pytest.raises(ValueError, match=msg):
    jax_gmma.scaled_matmul(jnp.zeros(a, E4), jnp.zeros(b, E4), jnp.ones(sa, F32), jnp.ones(sb, F32))


# -- configs ------------------------------------------------------------------------------------

def prob(m, n, k, variant="1d2d"):
  kb = cdiv(k, 128)
  return problem(m=m, n=n, k=k, sb_shape=(cdiv(n, 128) if variant == "1d2d" else n, kb))


@pytest.mark.parametrize("m, tn", [(17, 32), (33, 64), (64, 64)])
def test_heuristic_decode(m, tn):
  # 1d2d: 128-row swap tiles only (64-row tiles cannot carry 128x128 scales)
  cfg, s = bc.select_blockwise_config(prob(m, 7168, 2048), 132)
  assert cfg.name == f"swap_128x{tn}x128_coop_streamk" and cfg.swap_ab and s >= 1
  # 1d1d: 64-row ping-pong when N gives half the SMs a tile, else 128-row split-K
  cfg, s = bc.select_blockwise_config(prob(m, 24576, 1536, "1d1d"), 132)
  assert cfg.name == f"swap_64x{tn}x128_pingpong" and s == 1
  cfg, s = bc.select_blockwise_config(prob(m, 2112, 7168, "1d1d"), 132)
  assert cfg.name == f"swap_128x{tn}x128_coop_streamk" and s > 1  # 17 tiles: split K


@pytest.mark.parametrize("m, n, k, variant, want", [
    (1, 2048, 4096, "1d2d", "stream_16x8_kw16"),    # 128 strips of 16 rows: one per SM
    (1, 4096, 4096, "1d2d", "stream_16x8_kw8"),     # 256 strips
    (8, 28672, 4096, "1d1d", "stream_16x8_kw4"),
    (16, 6144, 4096, "1d2d", "stream_16x16_kw4"),   # 24 MiB of weight
    (16, 8192, 8192, "1d2d", "swap_128x16x128_coop_streamk"),  # 64 MiB: the wgmma tiles
    (1, 4096, 4112, "1d2d", "swap_128x16x128_coop_streamk"),   # K % 32 != 0
    (17, 4096, 4096, "1d2d", "swap_128x32x128_coop_streamk"),
])
def test_heuristic_stream(m, n, k, variant, want):
  cfg, s = bc.select_blockwise_config(prob(m, n, k, variant), 132)
  assert cfg.name == want and (s == 1 or not bc.is_stream(cfg))
  assert bc.is_stream(cfg) == want.startswith("stream")
  assert variant in bc.config_variants(cfg)


def test_heuristic_stream_not_with_forced_split():
  cfg, s = bc.select_blockwise_config(prob(1, 4096, 4096), 132, splits=2)
  assert cfg.name == "swap_128x16x128_coop_streamk" and s == 2


def test_heuristic_large_m():
  cfg, s = bc.select_blockwise_config(prob(4096, 4096, 7168), 132)
  assert cfg.name == "128x128x128_c1x1_coop" and s == 1  # 1024 tiles, 97% waves
  cfg, s = bc.select_blockwise_config(prob(129, 2112, 7168), 132)
  assert cfg.name == "128x128x128_c1x1_coop_streamk" and s == bc.STREAM_K_HEURISTIC
  # 544 tiles fill 0.82 of 5 waves: stream-K (measured faster)
  cfg, s = bc.select_blockwise_config(prob(4096, 2112, 7168), 132)
  assert cfg.name == "128x128x128_c1x1_coop_streamk" and s == bc.STREAM_K_HEURISTIC
  cfg, s = bc.select_blockwise_config(prob(8192, 8192, 8192), 132)
  assert cfg.name == "128x128x128_c1x1_coop" and s == 1  # 4096 tiles, 0.97 of 32 waves


def test_tile_order_rule():
  # Data-parallel large-M tiles along M, 8 N tiles per group when 8 divides the N tile count;
  # everything else (decode swap-AB, stream-K, other N) keeps CUTLASS's default order.
  coop = bc.CONFIGS["128x128x128_c1x1_coop"]
  assert bc.select_tile_order(prob(8192, 8192, 8192), coop) == (8, "m")
  assert bc.select_tile_order(prob(4096, 7168, 16384), coop) == (8, "m")  # 56 N tiles
  assert bc.select_tile_order(prob(4096, 2112, 7168), coop) == (1, "auto")  # 17 N tiles
  assert bc.select_tile_order(prob(4096, 2112, 7168), coop, swizzle=4, raster="n") == (4, "n")
  assert bc.select_tile_order(prob(16, 7168, 2048), bc.CONFIGS["swap_128x16x128_coop_streamk"]) == (1, "auto")
  assert bc.select_tile_order(prob(300, 2112, 7168), bc.CONFIGS["128x128x128_c1x1_coop_streamk"]) == (1, "auto")
  a, b = jnp.zeros((256, 512), E4), jnp.zeros((256, 512), E4)
  sa, sb = jnp.ones((256, 4), F32), jnp.ones((2, 4), F32)
  with pytest.raises(ValueError, match="swizzle must be one of"):
    jax_gmma.blockwise_gemm(a, b, sa, sb, swizzle=3)
  with pytest.raises(ValueError, match="raster must be one of"):
    jax_gmma.blockwise_gemm(a, b, sa, sb, raster="k")
  out = jax_gmma.blockwise_gemm(a, b, sa, sb, swizzle=2, raster="n")  # the reference ignores it
  assert out.shape == (256, 256)


def test_forced_configs_and_splits():
  p = prob(128, 4096, 4096)
  for name, cfg in bc.CONFIGS.items():
    if "1d2d" in bc.config_variants(cfg):
      got, s = bc.select_blockwise_config(p, 132, config=name, splits=3 if cfg.stream_k else None)
      assert got is cfg and s == (3 if cfg.stream_k else 1)
    else:
      with pytest.raises(ValueError, match="has no kernel for 1d2d"):
        bc.select_blockwise_config(p, 132, config=name)
  with pytest.raises(ValueError, match="splits must be 1 for config 128x128x128_c1x1_coop"):
    bc.select_blockwise_config(p, 132, config="128x128x128_c1x1_coop", splits=2)
  with pytest.raises(ValueError, match="splits must be >= 0"):
    bc.select_blockwise_config(p, 132, config="128x128x128_c1x1_coop_streamk", splits=-1)
  with pytest.raises(ValueError, match="sm_count must be positive"):
    bc.select_blockwise_config(p, 0)
  assert "swap-AB" in bc.configs_table()
  assert bc.kernel_name(bc.CONFIGS["128x128x128_c1x1_coop"], "1d1d") == "blockwise_1d1d_128x128x128_c1x1_coop"


def test_configs_match_cpp_table():
  inst = os.path.join(os.path.dirname(__file__), os.pardir, "cpp", "sm90_fp8_gemm_blockwise_inst.cuh")
  if not os.path.exists(inst):
    pytest.skip("C++ sources not available")
  src = open(inst).read()
  src = src[src.index("#else"):]  # the full (non-smoke) build
  both, only_1d1d = src.split("if constexpr (k1d1d)")
  names_both = re.findall(r'JAX_GMMA_BW\([^,]+(?:<\d+>)?, "([^"]+)"\)', both)
  names_1d1d = re.findall(r'JAX_GMMA_BW\([^,]+(?:<\d+>)?, "([^"]+)"\)', only_1d1d)
  # the weight-streaming kernel's table (cpp/sm90_fp8_gemm_blockwise_stream.cu), both variants
  stream_src = open(os.path.join(os.path.dirname(inst), "sm90_fp8_gemm_blockwise_stream.cu")).read()
  names_both += ["stream_" + n for n in re.findall(r'JG_ENTRY\("blockwise_" v "_stream_([^"]+)"', stream_src)]
  assert set(names_both) | set(names_1d1d) == set(bc.CONFIGS)
  for name in names_both:
    assert bc.config_variants(bc.CONFIGS[name]) == ("1d2d", "1d1d"), name
  for name in names_1d1d:
    assert bc.config_variants(bc.CONFIGS[name]) == ("1d1d",), name
  for cfg in bc.CONFIGS.values():  # tile names agree with the tile fields
    tile = cfg.tile[:2] if bc.is_stream(cfg) else cfg.tile
    assert "x".join(map(str, tile)) in cfg.name


# -- dot on block-scaled weights -----------------------------------------------------------------

@on_gpu
@pytest.mark.parametrize("fmt", ["fp8_128x128", "fp8_1x128"])
def test_dot_blockwise_weights(fmt):
  rng = np.random.default_rng(11)
  x = rng.standard_normal((3, 5, 300)).astype(F32)
  w = (rng.standard_normal((264, 300)) * 0.05).astype(F32)
  wq = jax_gmma.quantize(w, fmt)
  y = jax.jit(jax_gmma.dot)(x, wq)
  assert y.shape == (3, 5, 264) and y.dtype == jnp.float32
  # exactly the block-scaled GEMM of the fp8_1x128-quantized x
  xq = jax_gmma.quantize(x, "fp8_1x128", dtype=jnp.float8_e4m3fn)
  exact = np.asarray(jax_gmma.dequantize(xq), np.float64).reshape(15, 300) @ \
      np.asarray(jax_gmma.dequantize(wq), np.float64).T
  assert relerr(np.asarray(y).reshape(15, 264), exact) < 1e-6
  assert relerr(y, (x.astype(np.float64) @ w.T.astype(np.float64))) < 0.08
  # a pre-quantized x, bias, bf16 output
  y2 = jax_gmma.dot(xq, wq, bias=np.ones(264, F32), out_dtype=jnp.bfloat16)
  assert y2.dtype == jnp.bfloat16 and relerr(np.asarray(y2, F32).reshape(15, 264), exact + 1) < 1e-2


def test_dot_blockwise_errors():
  wq = jax_gmma.quantize(np.ones((64, 256), F32), "fp8_128x128")
  with pytest.raises(ValueError, match="cannot multiply a fp8_128x128 weight"):
    jax_gmma.dot(jax_gmma.quantize(np.ones((2, 256), F32), "fp8_channel"), wq)
  with pytest.raises(ValueError, match="contraction mismatch"):
    jax_gmma.dot(np.ones((2, 128), F32), wq)


def test_kernel_table_matches_blockwise_configs():
  """The C++ kernel table (when built) has exactly the Python block-scaled configs, for each
  scale variant they support, for e4m3 x e4m3 -> bf16 and -> f32."""
  if not _backend.kernels_built():
    pytest.skip("jax_gmma was built without CUDA kernels")
  table = [k for k in _backend.ext().kernels() if str(k["config"]).startswith("blockwise_")]
  # Configs built only on request (JAX_GMMA_EXTRA_KERNELS=1) are in the table only then.
  extra = extra_kernels_built()
  want = {bc.kernel_name(c, v) for c in bc.CONFIGS.values() for v in bc.config_variants(c)
          if extra or not c.extra}
  assert {k["config"] for k in table} == want
  for name in want:
    triples = {(k["a"], k["b"], k["d"]) for k in table if k["config"] == name}
    assert triples == {("float8_e4m3fn", "float8_e4m3fn", "bfloat16"),
                       ("float8_e4m3fn", "float8_e4m3fn", "float32")}, (name, triples)


# -- two-level per-tensor GEMMs routed to the block-scaled kernel ---------------------------------

def _gemm(m, n, k, *, a=E4, b_scale=(), a_scale=(), out=None):
  return shapes.fp8_gemm_problem((m, k), a, (n, k), E4, a_scale_shape=a_scale, a_scale_dtype=F32,
                                 b_scale_shape=b_scale, b_scale_dtype=F32,
                                 out_dtype=out if out is not None else shapes.BF16)


def test_two_level_route_rule():
  # The measured shapes: routed where the block-scaled tiles were faster.
  for mnk in [(4096, 4096, 4096), (2048, 8192, 8192), (4096, 4096, 7168), (2048, 4096, 1040),
              (1024, 8192, 8192)]:
    assert bc.two_level_route(_gemm(*mnk), 132), mnk
  for mnk in [(8192, 8192, 8192), (4096, 2112, 7168), (64, 4096, 4096), (256, 8192, 8192), (512, 4096, 1024),
              # useful fraction better by 0.017-0.066 only, tensorwise as fast or faster
              (4096, 24576, 1536), (4096, 7168, 16384), (4096, 11008, 4096), (4096, 8192, 8192),
              (4096, 14336, 4096), (2048, 28672, 8192)]:
    assert not bc.two_level_route(_gemm(*mnk), 132), mnk
  p = _gemm(4096, 4096, 4096)
  assert bc.two_level_route(_gemm(4096, 4096, 4096, a_scale=(4096,)), 132)  # per-row A: broadcast too
  assert bc.two_level_route(_gemm(4096, 4096, 4096, out=F32), 132)
  assert not bc.two_level_route(_gemm(4096, 4096, 4096, b_scale=(4096,)), 132)  # per-channel B
  assert not bc.two_level_route(_gemm(4096, 4096, 4096, a=ml_dtypes.float8_e5m2), 132)
  assert not bc.two_level_route(_gemm(4096, 4096, 4096, out=np.dtype(np.float16)), 132)
  for kw in (dict(fast_accum=True), dict(config="128x192x128_c2x1_coop_2lvl"), dict(splits=1),
             dict(swizzle=2), dict(raster="m")):
    assert not bc.two_level_route(p, 132, **kw), kw
  assert bc.ROUTE_CONFIG in bc.CONFIGS and "1d2d" in bc.config_variants(bc.CONFIGS[bc.ROUTE_CONFIG])


def test_heuristic_never_picks_an_extra_config():
  """Configs built only on request (JAX_GMMA_EXTRA_KERNELS=1) are never picked by the heuristic,
  for either scale variant, at decode and prefill shapes."""
  extra = {n for n, c in bc.CONFIGS.items() if c.extra}
  assert extra
  for m in (1, 4, 16, 17, 32, 48, 64, 65, 128, 256, 1024, 4096):
    for n in (256, 2112, 4096, 7168, 28672):
      for k in (512, 7168):
        for sb_shape in (None, (n, cdiv(k, 128))):  # 1d2d, 1d1d
          cfg, _ = bc.select_blockwise_config(problem(m, n, k, sb_shape=sb_shape), 132)
          assert cfg.name not in extra, (m, n, k, sb_shape, cfg.name)
