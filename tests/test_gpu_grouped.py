"""GPU tests of the grouped (mixture-of-experts) FP8 kernels behind jax_gmma.ragged_dot
(cpp/sm90_fp8_gemm_grouped_stream.cu; skipped without a Hopper GPU and built kernels).

Oracle: the float64 product of the dequantized operands on the host, per expert over its rows
(relative Frobenius error over the rows the experts hold), the rows past the groups' total
exactly zero, a negative group size NaN everywhere. Fresh random inputs per case, never zeros.
Every config of every scale kind runs (the config rule is overridden), with N, K and the
experts' row counts off the kernels' 16-row / 128-K / 8-token tiles."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import check_bit_identical_and_captured  # noqa: E402 (tests/ helper)
from jax_gmma.ops import grouped
from jax_gmma.ops import grouped_configs as gc

pytestmark = pytest.mark.gpu

TOL = {jnp.bfloat16: 1e-2, jnp.float16: 2e-3, jnp.float32: 1e-5}
_seed = [0]


def _rng():
  _seed[0] += 1
  return np.random.default_rng(7000 + _seed[0])


def _weights(fmt, w):
  if fmt == "fp8_tensor":  # one scale per expert
    return jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)
  return jax_gmma.quantize(w, fmt)


def _ref64(xq, wq, sizes, bias):
  x = np.asarray(grouped.dequantized_x(xq), np.float64)
  w = np.asarray(grouped.dequantized_w(wq), np.float64)
  out = np.zeros((x.shape[0], w.shape[1]))
  end = np.cumsum(sizes)
  for e in range(w.shape[0]):
    lo, hi = max(end[e] - sizes[e], 0), min(end[e], x.shape[0])
    out[lo:hi] = x[lo:hi] @ w[e].T + (0 if bias is None else bias[e])
  return out


def run_case(fmt, m, n, k, sizes, *, out_dtype=jnp.bfloat16, bias=False, config=None,
             x_format=None, monkeypatch=None):
  rng = _rng()
  g = len(sizes)
  w = (rng.standard_normal((g, n, k)) * rng.uniform(0.5, 4, (g, 1, 1))).astype(np.float32)
  x = rng.standard_normal((m, k)).astype(np.float32)
  b = rng.standard_normal((g, n)).astype(np.float32) if bias else None
  wq = _weights(fmt, jnp.asarray(w))
  xq = jax_gmma.quantize(jnp.asarray(x), x_format or grouped.X_FORMATS[fmt][0])
  if config is not None:
    monkeypatch.setattr(gc, "select_config", lambda problem, sm_count: config)
  f = jax.jit(lambda xq, wq, s, b: jax_gmma.ragged_dot(xq, wq, s, bias=b, out_dtype=out_dtype))
  s = jnp.asarray(sizes, jnp.int32)
  assert "jax_gmma_fp8_grouped_gemm" in f.lower(xq, wq, s, b).as_text()
  y = np.asarray(f(xq, wq, s, b).astype(jnp.float32), np.float64)
  if b is not None:  # the bias is rounded to the output dtype first
    b = np.asarray(jnp.asarray(b).astype(out_dtype).astype(jnp.float32), np.float64)
  ref = _ref64(xq, wq, np.asarray(sizes), b)
  used = min(int(np.sum(sizes)), m)
  label = f"{fmt} M={m} N={n} K={k} sizes={sizes} {jnp.dtype(out_dtype).name} bias={bias} cfg={config}"
  assert np.isfinite(y).all(), label
  err = np.linalg.norm(y[:used] - ref[:used]) / np.linalg.norm(ref[:used])
  assert err < TOL[out_dtype], f"{label}: rel err {err:.3g}"
  assert not y[used:].any(), f"{label}: rows past the total are not zero"
  return y


FORMATS = ("fp8_128x128", "fp8_1x128", "mxfp8", "fp8_channel", "fp8_tensor")


@pytest.mark.parametrize("config", sorted(gc.CONFIGS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_config(fmt, config, monkeypatch):
  # N off the 16-row strips; K with a partial last 128-K step (stored K: a multiple of 128 for
  # the block-scaled formats); an empty expert, an expert over two 16-token tiles, rows unused
  k = 416 if fmt in ("mxfp8", "fp8_channel", "fp8_tensor") else 288
  run_case(fmt, 61, 200, k, (5, 0, 33, 1, 9), config=f"{config}", monkeypatch=monkeypatch)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out_dtype", (jnp.bfloat16, jnp.float16, jnp.float32))
def test_out_dtypes_and_bias(fmt, out_dtype):
  run_case(fmt, 24, 136, 512, (3, 8, 0, 13), out_dtype=out_dtype, bias=True)


@pytest.mark.parametrize("sizes", ((0, 0, 0, 0), (40, 0, 0, 0), (0, 0, 0, 40), (30, 30, 0, 0),
                                   (1, 1, 1, 1), (10, 10, 10, 10)))
def test_group_size_edges(sizes):
  # nothing assigned, one expert with every row, a total past M (the last expert cut short)
  run_case("fp8_128x128", 40, 256, 384, sizes)


def test_decode_shapes_many_experts():
  # 8 tokens x top-8 over 64 experts (most empty), DeepSeek-V3-like widths
  sizes = np.zeros(64, np.int64)
  sizes[np.random.default_rng(3).choice(64, 16, replace=False)] = 4
  run_case("fp8_128x128", 64, 1024, 1024, tuple(int(s) for s in sizes))
  run_case("mxfp8", 64, 1024, 1024, tuple(int(s) for s in sizes))


def test_prefill_sized_expert():
  run_case("fp8_128x128", 1100, 256, 512, (700, 0, 400))


def test_negative_group_size_gives_nan():
  rng = _rng()
  w = jnp.asarray(rng.standard_normal((3, 64, 256)), jnp.float32)
  xq = jax_gmma.quantize(jnp.asarray(rng.standard_normal((16, 256)), jnp.float32), "fp8_1x128")
  y = jax_gmma.ragged_dot(xq, jax_gmma.quantize(w, "fp8_128x128"), jnp.asarray([8, -2, 6], jnp.int32))
  assert np.isnan(np.asarray(y.astype(jnp.float32))).all()


def test_traced_group_sizes_one_compile():
  rng = _rng()
  w = jnp.asarray(rng.standard_normal((4, 96, 256)), jnp.float32)
  wq = jax_gmma.quantize(w, "fp8_1x128")
  x = jnp.asarray(rng.standard_normal((20, 256)), jnp.float32)
  traces = []

  @jax.jit
  def f(x, s):
    traces.append(1)
    return jax_gmma.ragged_dot(x, wq, s, out_dtype=jnp.float32)

  xq = jax_gmma.quantize(x, "fp8_1x128")
  for sizes in ((5, 5, 5, 5), (0, 20, 0, 0), (1, 2, 3, 4), (0, 0, 0, 0)):
    y = np.asarray(f(x, jnp.asarray(sizes, jnp.int32)), np.float64)
    ref = _ref64(xq, wq, np.asarray(sizes), None)
    used = sum(sizes)
    if used:
      assert np.linalg.norm(y[:used] - ref[:used]) / np.linalg.norm(ref[:used]) < 1e-5
    assert not y[used:].any()
  assert len(traces) == 1


def test_deterministic():
  rng = _rng()
  wq = jax_gmma.quantize(jnp.asarray(rng.standard_normal((8, 512, 1024)), jnp.float32), "fp8_128x128")
  x = jnp.asarray(rng.standard_normal((32, 1024)), jnp.bfloat16)
  s = jnp.asarray([4, 4, 0, 8, 4, 4, 4, 4], jnp.int32)
  f = jax.jit(lambda x: jax_gmma.ragged_dot(x, wq, s))
  a, b = np.asarray(f(x)), np.asarray(f(x))
  assert a.tobytes() == b.tobytes()


def test_command_buffers():
  check_bit_identical_and_captured("cmdbuf_grouped_child.py", names=("chain",), min_calls=16)
