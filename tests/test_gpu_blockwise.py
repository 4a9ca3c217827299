"""GPU tests of the sm90 block-scaled FP8 GEMM kernels (skipped without a Hopper GPU and built
kernels).

Oracle: the dequantized operands (fp8 element * its block scale) multiplied in float64 on the
host (a row subset for the largest M), plus the float32 HIGHEST-precision reference of the same
dequantized operands on the device for every element (an unwritten element fails the
elementwise bound). Fresh random inputs per check, never all-zeros.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import check_bit_identical_and_captured  # noqa: E402 (tests/ helper)
from jax_gmma import _backend
from jax_gmma.ops import blockwise_configs as bc
from jax_gmma.ops.tensorwise_configs import extra_kernels_built

pytestmark = pytest.mark.gpu

E4 = jnp.float8_e4m3fn
TOL = {jnp.bfloat16: 1e-2, jnp.float16: 2e-3, jnp.float32: 1e-3}
_seed = [0]


def _key():
  _seed[0] += 1
  return jax.random.PRNGKey(5000 + _seed[0])


def cdiv(a, b):
  return -(-a // b)


def make_inputs(m, n, k, variant, bias=False, out_dtype=jnp.bfloat16):
  ka, kb_, ks, kt, kbias = jax.random.split(_key(), 5)
  a = (jax.random.normal(ka, (m, k), jnp.float32) * 2).astype(E4)
  b = (jax.random.normal(kb_, (n, k), jnp.float32) * 2).astype(E4)
  kb = cdiv(k, 128)
  sa = jax.random.uniform(ks, (m, kb), jnp.float32, 0.5, 2.0) / np.sqrt(k)
  rows_b = cdiv(n, 128) if variant == "1d2d" else n
  sb = jax.random.uniform(kt, (rows_b, kb), jnp.float32, 0.5, 2.0)
  bias_v = jax.random.normal(kbias, (n,), jnp.float32).astype(out_dtype) if bias else None
  return a, b, sa, sb, bias_v


def _compare(out, ref):
  out = out.astype(jnp.float32)
  ref = ref.astype(jnp.float32)
  err = jnp.linalg.norm(out - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
  scale = jnp.sqrt(jnp.mean(ref * ref))
  worst = jnp.max(jnp.abs(out - ref)) / jnp.maximum(scale, 1e-30)
  return err, worst, jnp.all(jnp.isfinite(out)), jnp.max(jnp.abs(out))


def deq64(x, s, row_block):
  r, k = x.shape
  s = np.asarray(s, np.float64)
  s = np.repeat(np.repeat(s, row_block, axis=0)[:r], 128, axis=1)[:, :k]
  return np.asarray(x).astype(np.float64) * s


def run_case(m, n, k, variant="1d2d", out_dtype=jnp.bfloat16, bias=False, config=None, splits=None):
  a, b, sa, sb, bias_v = make_inputs(m, n, k, variant, bias, out_dtype)

  # One program per case (one compile): the kernel, the float32 reference, the comparison.
  @jax.jit
  def check(a, b, sa, sb, bias_v):
    out = jax_gmma.blockwise_gemm(a, b, sa, sb, bias=bias_v, out_dtype=out_dtype, config=config,
                                  splits=splits)
    ref = jax_gmma.blockwise_gemm_reference(a, b, sa, sb, bias_v, out_dtype=jnp.float32)
    return out, _compare(out, ref)

  out, (err, worst, finite, amax) = check(a, b, sa, sb, bias_v)
  err, worst, finite, amax = float(err), float(worst), bool(finite), float(amax)
  tol = TOL[out_dtype]
  label = (f"M={m} N={n} K={k} {variant} -> {jnp.dtype(out_dtype).name} bias={bias} cfg={config} "
           f"splits={splits}")
  assert finite, label
  assert amax > 0, f"{label}: all-zero output"
  assert err < tol, f"{label}: rel Frobenius error vs float32 reference {err:.3g} >= {tol}"
  assert worst < 50 * tol, f"{label}: worst element error {worst:.3g} (x rms) -- unwritten/wrong elements?"
  # float64 of the dequantized operands on the host (a row subset when large)
  rows = np.arange(m) if m <= 256 else np.random.default_rng(m + n + k).choice(m, 256, replace=False)
  ref64 = deq64(np.asarray(a)[rows], np.asarray(sa)[rows], 1) @ \
      deq64(b, sb, 128 if variant == "1d2d" else 1).T
  if bias_v is not None:
    ref64 = ref64 + np.asarray(bias_v, np.float64)
  o = np.asarray(out, np.float64)[rows]
  err64 = np.linalg.norm(o - ref64) / np.linalg.norm(ref64)
  assert err64 < tol, f"{label}: rel Frobenius error vs float64 {err64:.3g} >= {tol}"
  return err64


SHAPES = list(itertools.product([1, 7, 64, 128, 129, 4096],
                                [(2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (4096, 4096)]))
VARIANTS = list(itertools.product(["1d2d", "1d1d"], [jnp.bfloat16, jnp.float32, jnp.float16]))


@pytest.mark.parametrize("m,nk", SHAPES)
def test_shapes_grid(m, nk):
  # Each shape takes a different (variant, output) pair, cycling through all.
  i = SHAPES.index((m, nk))
  variant, out = VARIANTS[(i * 5) % len(VARIANTS)]
  run_case(m, nk[0], nk[1], variant, out, bias=i % 3 == 0)


@pytest.mark.parametrize("variant,out", VARIANTS)
@pytest.mark.parametrize("bias", [False, True])
def test_all_variants(variant, out, bias):
  run_case(129, 2112, 7168, variant, out, bias)
  run_case(3, 4096, 1024, variant, out, bias)
  # K not a multiple of 128: the last K block is partial (TMA zero-fills it)
  run_case(7, 256, 1040, variant, out, bias)
  run_case(300, 512, 48, variant, out, bias)


@pytest.mark.parametrize("variant,name", [(v, c) for c in bc.CONFIGS for v in bc.config_variants(bc.CONFIGS[c])])
def test_every_config(variant, name):
  cfg = bc.CONFIGS[name]
  if cfg.extra and not extra_kernels_built():
    pytest.skip("built on request: this jax_gmma was built without JAX_GMMA_EXTRA_KERNELS=1")
  for m in (1, 100, 300):
    run_case(m, 2048, 4096, variant, jnp.bfloat16, bias=True, config=name,
             splits=3 if cfg.stream_k else None)


STREAM_CONFIGS = [c for c in bc.CONFIGS if bc.is_stream(bc.CONFIGS[c])]


@pytest.mark.parametrize("name", STREAM_CONFIGS)
@pytest.mark.parametrize("variant", bc.VARIANTS)
def test_stream_configs_edges(name, variant):
  # The weight-streaming kernel: rows past N (N % 16 != 0), tokens past its 8/16-token tile, a
  # partial last 128-K block (K % 128 = 32, 64, 96) with its own scale, M far above its tile.
  for m, n, k, out, bias in ((1, 40, 160, jnp.bfloat16, True), (3, 4104, 4160, jnp.float32, False),
                             (17, 264, 1120, jnp.float16, True), (300, 128, 512, jnp.bfloat16, False),
                             (9, 6144, 4096, jnp.bfloat16, True)):
    run_case(m, n, k, variant, out, bias=bias, config=name)


def test_stream_refuses_k_not_multiple_of_32():
  a, b, sa, sb, _ = make_inputs(4, 256, 1040, "1d2d")
  with pytest.raises(ValueError, match="multiple of 32"):
    jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x, config="stream_16x8_kw8"))(a, b, sa, sb)
  # the heuristic never picks it there (K = 1040 ran above on the wgmma tiles)
  out = jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x, out_dtype=jnp.float32))(a, b, sa, sb)
  ref = jax_gmma.blockwise_gemm_reference(a, b, sa, sb, None, out_dtype=jnp.float32)
  assert float(_compare(out, ref)[0]) < TOL[jnp.float32]


def test_stream_bit_identical_to_itself_and_close_to_wgmma():
  # Deterministic (fixed-order warp reduction), and the same promotion every 128 of K as the
  # wgmma kernel: both within float32 rounding of each other.
  a, b, sa, sb, _ = make_inputs(8, 4096, 7168, "1d2d")
  f = lambda cfg: np.asarray(jax.jit(lambda *x: jax_gmma.blockwise_gemm(
      *x, out_dtype=jnp.float32, config=cfg))(a, b, sa, sb))
  s = f("stream_16x8_kw8")
  np.testing.assert_array_equal(f("stream_16x8_kw8"), s)
  w = f("swap_128x16x128_coop_streamk")
  assert np.linalg.norm(s - w) / np.linalg.norm(w) < 2e-3


@pytest.mark.parametrize("config,splits", [("128x128x128_c1x1_coop", 1), ("swap_128x16x128_coop_streamk", 0)])
def test_tile_order_same_bits(config, splits):
  # swizzle / raster only reorder the persistent scheduler's tiles: bit-identical outputs for a
  # data-parallel grid; stream-K may cut a tile's K range elsewhere (checked against the oracle).
  m, n, k = (16, 4096, 1024) if config.startswith("swap") else (1000, 1544, 1024)
  a, b, sa, sb, _ = make_inputs(m, n, k, "1d2d")
  f = lambda sw, ro: np.asarray(jax.jit(lambda *x: jax_gmma.blockwise_gemm(
      *x, out_dtype=jnp.float32, config=config, splits=splits, swizzle=sw, raster=ro))(a, b, sa, sb))
  base = f(None, None)
  ref = jax_gmma.blockwise_gemm_reference(a, b, sa, sb, None, out_dtype=jnp.float32)
  assert float(_compare(jnp.asarray(base), ref)[0]) < TOL[jnp.float32]
  for sw, ro in ((1, "auto"), (2, "m"), (4, "n"), (8, "auto"), (8, "m")):
    out = f(sw, ro)
    if splits == 1:
      np.testing.assert_array_equal(out, base, err_msg=f"{sw} {ro}")
    else:
      assert float(_compare(jnp.asarray(out), ref)[0]) < TOL[jnp.float32], (sw, ro)


def test_split_k_deterministic():
  a, b, sa, sb, _ = make_inputs(16, 2112, 7168, "1d2d")
  f = jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x, out_dtype=jnp.float32,
                                                 config="swap_128x16x128_coop_streamk", splits=4))
  first = np.asarray(f(a, b, sa, sb))
  for _ in range(3):
    np.testing.assert_array_equal(np.asarray(f(a, b, sa, sb)), first)


def test_nan_propagates():
  for variant in ("1d2d", "1d1d"):
    for m in (1, 40, 200):  # the streaming kernel, the wgmma swap tiles, the 128x128 tiles
      a, b, sa, sb, _ = make_inputs(m, 256, 512, variant)
      a = np.asarray(a).copy()
      b = np.asarray(b).copy()
      a[m // 2, 7] = np.nan
      b[5, 300] = np.nan
      for out_dtype in (jnp.bfloat16, jnp.float32):
        out = np.asarray(jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x, out_dtype=out_dtype))(a, b, sa, sb),
                         np.float32)
        assert np.isnan(out[m // 2]).all() and np.isnan(out[:, 5]).all()
        mask = np.zeros_like(out, bool)
        mask[m // 2] = True
        mask[:, 5] = True
        np.testing.assert_array_equal(np.isnan(out), mask)


def test_scaled_matmul_and_dot_on_gpu():
  k1, k2, k3, k4 = jax.random.split(_key(), 4)
  lhs = (jax.random.normal(k1, (2, 5, 1024)) * 2).astype(E4)
  rhs = (jax.random.normal(k2, (2, 512, 1024)) * 2).astype(E4)
  ls = jax.random.uniform(k3, (2, 5, 8), jnp.float32, 0.5, 2) / 32
  rs = jax.random.uniform(k4, (2, 512, 8), jnp.float32, 0.5, 2)
  out = jax.jit(jax_gmma.scaled_matmul)(lhs, rhs, ls, rs)
  deq = lambda x, s: x.astype(jnp.float32) * jnp.repeat(s, 128, axis=-1)
  ref = jnp.einsum("bmk,bnk->bmn", deq(lhs, ls), deq(rhs, rs), precision="highest")
  err = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
  assert out.shape == (2, 5, 512) and err < 1e-3
  x = jax.random.normal(k1, (4, 1024), jnp.bfloat16)
  w = jax.random.normal(k2, (512, 1024), jnp.float32) * 0.03
  for fmt in ("fp8_128x128", "fp8_1x128"):
    y = jax.jit(jax_gmma.dot)(x, jax_gmma.quantize(w, fmt))
    r = x.astype(jnp.float32) @ w.T
    assert y.dtype == jnp.bfloat16 and float(jnp.linalg.norm(y.astype(jnp.float32) - r) / jnp.linalg.norm(r)) < 0.08


def test_no_silent_fallback_when_kernel_missing(monkeypatch):
  monkeypatch.setattr(_backend, "ARCH_FOR_CC", {})
  a, b = jnp.ones((16, 256), E4), jnp.ones((32, 256), E4)
  sa, sb = jnp.ones((16, 2), jnp.float32), jnp.ones((1, 2), jnp.float32)
  with pytest.raises(_backend.KernelUnavailable, match="Refusing to fall back"):
    jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x))(a, b, sa, sb)
  with jax_gmma.allow_reference():
    out = jax.jit(lambda *x: jax_gmma.blockwise_gemm(*x) + 0)(a, b, sa, sb)
  assert out.shape == (16, 32) and float(out[0, 0]) == 256.0


# -- CUDA graphs (XLA command buffers) ------------------------------------------------------




def test_command_buffers_bit_identical_and_captured():
  check_bit_identical_and_captured("cmdbuf_blockwise_child.py")
