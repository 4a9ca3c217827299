"""GPU tests of the sm90 FP8 GEMM kernels (skipped without a Hopper GPU and built kernels).

Oracle: the pure-JAX reference (float32 dot at HIGHEST precision of the same fp8 operands),
compared by relative Frobenius error and an elementwise bound, on fresh random inputs per
case. XLA allocates the outputs, so instead of poisoning them every element is checked
against the oracle (an unwritten element fails the elementwise bound).
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import check_bit_identical_and_captured  # noqa: E402 (tests/ helper)
from jax_gmma import _backend
from jax_gmma.ops import tensorwise_configs as configs
from jax_gmma.numerics import shapes

pytestmark = pytest.mark.gpu

E4, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2
TOL = {jnp.bfloat16: 1e-2, jnp.float16: 2e-3, jnp.float32: 1e-3}
_seed = [0]


def _key():
  _seed[0] += 1
  return jax.random.PRNGKey(1000 + _seed[0])


def rand_fp8(key, shape, dtype):
  x = jax.random.normal(key, shape, jnp.float32) * 2.0
  return x.astype(dtype)


def _compare(out, ref):
  out = out.astype(jnp.float32)
  ref = ref.astype(jnp.float32)
  err = jnp.linalg.norm(out - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
  scale = jnp.sqrt(jnp.mean(ref * ref))
  worst = jnp.max(jnp.abs(out - ref)) / jnp.maximum(scale, 1e-30)
  finite = jnp.all(jnp.isfinite(out))
  return err, worst, finite


def run_case(m, n, k, a_dt=E4, b_dt=E4, per_row=False, bias=False, out_dtype=jnp.bfloat16,
             fast_accum=False, config=None, splits=None):
  ka, kb, ks, kt, kbias = jax.random.split(_key(), 5)
  a = rand_fp8(ka, (m, k), a_dt)
  b = rand_fp8(kb, (n, k), b_dt)
  sa = jax.random.uniform(ks, (m,) if per_row else (), jnp.float32, 0.5, 2.0) / np.sqrt(k)
  sb = jax.random.uniform(kt, (n,) if per_row else (), jnp.float32, 0.5, 2.0)
  bias_v = jax.random.normal(kbias, (n,), jnp.float32).astype(out_dtype) if bias else None

  # One program per case (one compile): the kernel, the reference, and the comparison.
  @jax.jit
  def check(a, b, sa, sb, bias_v):
    out = jax_gmma.fp8_gemm(a, b, sa, sb, bias=bias_v, out_dtype=out_dtype, fast_accum=fast_accum,
                            config=config, splits=splits)
    ref = jax_gmma.fp8_gemm_reference(a, b, sa.reshape(-1), sb.reshape(-1), bias_v,
                                      out_dtype=jnp.float32, has_bias=bias_v is not None)
    return _compare(out, ref)

  err, worst, finite = (float(x) for x in check(a, b, sa, sb, bias_v))
  tol = TOL[out_dtype] * (4 if fast_accum else 1)
  label = f"M={m} N={n} K={k} {jnp.dtype(a_dt).name}x{jnp.dtype(b_dt).name}->{jnp.dtype(out_dtype).name} " \
          f"row={per_row} bias={bias} cfg={config} splits={splits}"
  assert finite, label
  assert err < tol, f"{label}: rel Frobenius error {err:.3g} >= {tol}"
  assert worst < 50 * tol, f"{label}: worst element error {worst:.3g} (x rms) — unwritten/wrong elements?"
  return err


SHAPES = list(itertools.product([1, 7, 64, 129, 4096], [16, 1000, 4096, 28672], [128, 7168, 16384]))
VARIANTS = list(itertools.product([(E4, E4), (E5, E4)], [False, True], [False, True],
                                  [jnp.bfloat16, jnp.float16, jnp.float32]))


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_shapes_grid(m, n, k):
  # Each shape takes a different (dtype pair, scales, bias, output) variant, cycling through all.
  i = SHAPES.index((m, n, k))
  (a_dt, b_dt), per_row, bias, out = VARIANTS[(i * 7) % len(VARIANTS)]
  run_case(m, n, k, a_dt, b_dt, per_row, bias, out)


@pytest.mark.parametrize("pair,per_row,bias,out", VARIANTS)
def test_all_variants(pair, per_row, bias, out):
  run_case(129, 1000, 7168, pair[0], pair[1], per_row, bias, out)
  run_case(3, 4096, 1024, pair[0], pair[1], per_row, bias, out)


@pytest.mark.parametrize("name", list(configs.CONFIGS))
def test_every_config(name):
  cfg = configs.CONFIGS[name]
  if cfg.sweep and not configs.sweep_kernels_built():
    pytest.skip("sweep-only kernel: this jax_gmma was built without JAX_GMMA_SWEEP_KERNELS=1")
  if cfg.extra and not configs.extra_kernels_built():
    pytest.skip("built on request: this jax_gmma was built without JAX_GMMA_EXTRA_KERNELS=1")
  for m in (1, 100, 300):
    splits = 3 if cfg.stream_k else None
    run_case(m, 2048, 4096, per_row=True, bias=True, config=name, splits=splits,
             fast_accum=cfg.accum == "fast")


@pytest.mark.parametrize("m,n,k,name", [(32, 24576, 1536, "swap_64x32x128_ws_s4_2lvl"),
                                         (17, 8512, 2048, "swap_64x32x128_ws_s4_2lvl"),
                                         (64, 24576, 1536, "swap_64x64x128_c2x1_ws_s4_2lvl"),
                                         (48, 19136, 640, "swap_64x64x128_c2x1_ws_s4_2lvl"),
                                         (64, 16384, 1536, "swap_64x64x128_ws_s6_2lvl")])
def test_decode_short_k_picks(m, n, k, name):
  # The short-K decode tiles of 17..64 tokens on shapes the heuristic gives them at
  # 132 SMs; 19136 = 299 64-row tiles: an odd tile count in the 2x1-cluster tile.
  problem = shapes.fp8_gemm_problem((m, k), E4, (n, k), E4)
  assert configs.select_config(problem, 132)[0].name == name
  run_case(m, n, k, per_row=True, bias=True, config=name)


@pytest.mark.parametrize("config,splits", [("128x256x128_c2x1_coop_fast", 1), ("128x192x128_c2x1_coop_2lvl", 1),
                                           ("128x128x128_c1x1_coop_streamk_2lvl", 0),
                                           ("swap_128x16x128_coop_streamk_2lvl", 0)])
def test_tile_order_same_bits(config, splits):
  # The scheduler's swizzle / raster only reorder the tiles: bit-identical outputs for
  # data-parallel grids; stream-K may cut a tile's K range elsewhere (a different rounding).
  m, n, k = (16, 4096, 1024) if config.startswith("swap") else (1000, 1544, 1024)
  a = rand_fp8(_key(), (m, k), E4)
  b = rand_fp8(_key(), (n, k), E4)
  f = lambda sw, ro: jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, config=config, splits=splits, swizzle=sw,
                                                            raster=ro))(a, b)
  base = np.asarray(f(None, None).astype(jnp.float32))
  ref = jax_gmma.fp8_gemm_reference(a, b, jnp.ones(1), jnp.ones(1), None, out_dtype=jnp.float32,
                                    has_bias=False)
  assert float(_compare(jnp.asarray(base), ref)[0]) < 4 * TOL[jnp.bfloat16]
  for sw, ro in ((2, "m"), (4, "n"), (8, "auto"), (8, "m")):
    out = np.asarray(f(sw, ro).astype(jnp.float32))
    if splits == 1:
      np.testing.assert_array_equal(out, base, err_msg=f"{sw} {ro}")
    else:
      assert float(_compare(jnp.asarray(out), ref)[0]) < 4 * TOL[jnp.bfloat16], (sw, ro)


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float32])
def test_two_level_route_to_blockwise(out_dtype):
  """Two-level GEMMs whose tensorwise tiles fill the waves badly run the block-scaled kernel with
  broadcast scales (blockwise_configs.two_level_route): 2048 x 4096 takes 4 waves of 128x128
  tiles (97% useful) instead of 3 of 128x192 (86%). Same arithmetic as the tensorwise kernel:
  the outputs agree to float32 rounding; K = 1040 ends in a partial 128-block."""
  from jax_gmma.ops import blockwise
  k = 1040
  a = rand_fp8(_key(), (2, 1024, k), E4)
  b = rand_fp8(_key(), (4096, k), E4)
  sa_row = jax.random.uniform(_key(), (2, 1024), jnp.float32, 0.5, 2.0) / np.sqrt(k)
  sb = jnp.float32(0.75)
  bias = jax.random.normal(_key(), (4096,), jnp.float32).astype(out_dtype)
  for sa in (jnp.float32(0.02), sa_row):
    f = jax.jit(lambda a, b, sa, sb, bias: jax_gmma.fp8_gemm(a, b, sa, sb, bias=bias, out_dtype=out_dtype))
    hlo = f.lower(a, b, sa, sb, bias).as_text()
    assert blockwise.BLOCKWISE_GEMM_TARGET in hlo and f'"{_backend.FP8_GEMM_TARGET}"' not in hlo
    out = f(a, b, sa, sb, bias)
    tw = jax.jit(lambda a, b, sa, sb, bias: jax_gmma.fp8_gemm(
        a, b, sa, sb, bias=bias, out_dtype=out_dtype, config="128x192x128_c2x1_coop_2lvl"))(a, b, sa, sb, bias)
    ref = jax_gmma.fp8_gemm_reference(a.reshape(2048, k), b, jnp.reshape(sa, (-1,)), jnp.reshape(sb, (1,)),
                                      bias, out_dtype=jnp.float32, has_bias=True).reshape(2, 1024, 4096)
    err, worst, finite = (float(x) for x in _compare(out, ref))
    assert out.shape == (2, 1024, 4096) and out.dtype == out_dtype and finite
    assert err < TOL[out_dtype] and worst < 50 * TOL[out_dtype], (err, worst)
    diff = float(_compare(out, tw)[0])
    assert diff < (1e-5 if out_dtype == jnp.float32 else 4e-3), diff  # bf16: one rounding apart at most
  # Not routed: a per-channel B scale, fast accumulation, a forced config.
  for kw in (dict(sb=jnp.full((4096,), 0.75, jnp.float32)), dict(fast_accum=True), dict(config="128x128x128_c2x1_coop_2lvl")):
    sbv = kw.pop("sb", sb)
    hlo = jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, 0.02, sbv, out_dtype=out_dtype, **kw)).lower(a, b).as_text()
    assert blockwise.BLOCKWISE_GEMM_TARGET not in hlo, kw


def test_batch_dims():
  a = rand_fp8(_key(), (2, 3, 256), E4)
  b = rand_fp8(_key(), (64, 256), E4)
  out = jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, out_dtype=jnp.float32))(a, b)
  ref = jax_gmma.fp8_gemm_reference(a.reshape(6, 256), b, jnp.ones(1), jnp.ones(1), None,
                                    out_dtype=jnp.float32, has_bias=False).reshape(2, 3, 64)
  err, worst, finite = (float(x) for x in _compare(out, ref))
  assert finite and err < TOL[jnp.float32], err  # fp8 wgmma accumulates below fp32 precision


def test_nan_inf_propagate():
  k = 256
  a = np.asarray(rand_fp8(_key(), (32, k), E5)).copy()
  b = np.asarray(rand_fp8(_key(), (64, k), E4)).copy()
  a[3, 7] = np.nan
  a[5, 9] = np.inf
  a[5] = np.where(np.isfinite(a[5].astype(np.float32)), np.abs(a[5].astype(np.float32)), a[5]).astype(E5)
  b[:, 9] = np.abs(b[:, 9].astype(np.float32) + 0.5).astype(E4)  # nonzero, positive
  for out_dtype in (jnp.bfloat16, jnp.float32):
    out = np.asarray(jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, out_dtype=out_dtype))(a, b)).astype(np.float32)
    ref = np.asarray(jax_gmma.fp8_gemm_reference(jnp.asarray(a), jnp.asarray(b), jnp.ones(1), jnp.ones(1), None,
                                                 out_dtype=jnp.float32, has_bias=False))
    assert np.isnan(out[3]).all()
    assert (~np.isfinite(out[5])).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))


def test_dot_on_gpu():
  x = jax.random.normal(_key(), (4, 1024), jnp.bfloat16)
  w = jax.random.normal(_key(), (512, 1024), jnp.float32) * 0.03
  wq = jax_gmma.quantize(w, "fp8_channel")
  out = jax.jit(jax_gmma.dot)(x, wq)
  ref = x.astype(jnp.float32) @ w.T
  err = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))
  assert out.dtype == jnp.bfloat16 and err < 0.08


def test_no_silent_fallback_when_kernel_missing(monkeypatch):
  monkeypatch.setattr(_backend, "ARCH_FOR_CC", {})
  a = jnp.zeros((16, 64), E4)
  b = jnp.zeros((32, 64), E4)
  with pytest.raises(_backend.KernelUnavailable, match="Refusing to fall back"):
    jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b))(a, b)
  with jax_gmma.allow_reference():
    out = jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b) + 0)(a, b)
  assert out.shape == (16, 32)


# -- CUDA graphs (XLA command buffers) ------------------------------------------------------




def test_command_buffers_bit_identical_and_captured():
  check_bit_identical_and_captured("cmdbuf_child.py", names=("chain", "small", "sliced"))


def test_sweep_config_without_sweep_kernels_is_a_clear_error():
  """A sweep-only config on a library built without them (the default) is refused at trace time,
  naming the build switch."""
  if configs.sweep_kernels_built():
    pytest.skip("this jax_gmma was built with the sweep-only kernels")
  name = next(n for n, c in configs.CONFIGS.items() if c.sweep and not c.swap_ab)
  a = rand_fp8(_key(), (256, 512), E4)
  b = rand_fp8(_key(), (256, 512), E4)
  with pytest.raises(ValueError, match="JAX_GMMA_SWEEP_KERNELS=1"):
    jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, out_dtype=jnp.bfloat16, config=name))(a, b)


def test_extra_config_without_extra_kernels_is_a_clear_error():
  """A config built only on request, forced on a library built without it (the default), is
  refused at trace time, naming the build switch."""
  if configs.extra_kernels_built():
    pytest.skip("this jax_gmma was built with JAX_GMMA_EXTRA_KERNELS=1")
  name = next(n for n, c in configs.CONFIGS.items() if c.extra)
  a = rand_fp8(_key(), (16, 512), E4)
  b = rand_fp8(_key(), (256, 512), E4)
  with pytest.raises(ValueError, match="JAX_GMMA_EXTRA_KERNELS=1"):
    jax.jit(lambda a, b: jax_gmma.fp8_gemm(a, b, out_dtype=jnp.bfloat16, config=name))(a, b)
