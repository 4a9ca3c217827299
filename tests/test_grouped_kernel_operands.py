"""The grouped kernels' operands as ragged_dot's CUDA lowering builds them (CPU): a NumPy model of
the kernel contract (ffi/grouped_ffi.cc, cpp/include/jax_gmma/fp8_stream.cuh: MN-major block
scales per expert, swizzled E8M0 bytes, per-row / per-tensor scales, the expert slots and the
rows past the total) applied to ``grouped.kernel_operands`` must give the reference's result;
and the config rule (``grouped_configs``). The kernels themselves run in tests/test_gpu_grouped.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from jax_gmma.ops import grouped
from jax_gmma.ops import grouped_configs as gc

G, N, K, M = 4, 40, 288, 24
FORMATS = ("fp8_128x128", "fp8_1x128", "mxfp8", "fp8_channel", "fp8_tensor")


def _inputs(fmt, x_format=None, seed=0):
  rng = np.random.default_rng(seed)
  w = (rng.standard_normal((G, N, K)) * (1 + np.arange(G)).reshape(G, 1, 1)).astype(np.float32)
  x = rng.standard_normal((M, K)).astype(np.float32)
  wq = (jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(jnp.asarray(w)) if fmt == "fp8_tensor"
        else jax_gmma.quantize(jnp.asarray(w), fmt))
  xf = x_format or grouped.X_FORMATS[fmt][0]
  return jax_gmma.quantize(jnp.asarray(x), xf), wq


def _mx_word_offset(r, j, k_atoms):
  return ((r >> 7) * k_atoms + j) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4


def _mx_scale(sf, rows, kb, base=0):
  """(rows, kb) float64 from swizzled E8M0 bytes (gemm_api.h's mx_sf_word_offset)."""
  k_atoms = -(-kb // 4)
  out = np.empty((rows, kb))
  for r in range(rows):
    for b in range(kb):
      code = int(sf[base + _mx_word_offset(r, b // 4, k_atoms) + b % 4])
      out[r, b] = np.nan if code == 255 else 2.0 ** (code - 127)
  return out


def _model(kind, a, b, sa, sb, sizes, row0=0, bias=None):
  """What the kernel computes from its operands (float64), by its documented contract."""
  a = np.asarray(a.astype(jnp.float32), np.float64)
  b = np.asarray(b.astype(jnp.float32), np.float64)
  sa, sb = np.asarray(sa), np.asarray(sb)
  m, kp = a.shape
  g, n, _ = b.shape
  kb = -(-kp // 128)
  if kind.startswith("blockwise"):
    ld_a = -(-m // 4) * 4
    assert sa.shape == (kb, ld_a)
    row_block = 128 if kind == "blockwise_1d2d" else 1
    rows_b = -(-n // row_block)
    assert sb.shape == (g, kb, -(-rows_b // 4) * 4)
    xs = np.repeat(sa[:, :m].T, 128, axis=1)[:, :kp]
    ws = [np.repeat(np.repeat(sb[e][:, :rows_b].T, row_block, axis=0)[:n], 128, axis=1)[:, :kp]
          for e in range(g)]
  elif kind == "bf16":  # the operands are the exact bfloat16 products; one scale per expert
    assert sb.shape == (g,) and sb.dtype == np.float32
    xs, ws = np.ones((m, 1)), [np.full((n, 1), np.float64(sb[e])) for e in range(g)]
  elif kind == "mxf8":
    assert sa.dtype == np.uint8 and sb.dtype == np.uint8
    per = sb.size // g
    xs = np.repeat(_mx_scale(sa, m, kp // 32), 32, axis=1)
    ws = [np.repeat(_mx_scale(sb, n, kp // 32, e * per), 32, axis=1) for e in range(g)]
  else:
    assert sa.size in (m, 1) and sb.size in (g * n, g)
    xs = np.broadcast_to(sa.reshape(-1, 1).astype(np.float64), (m, 1))
    ws = [np.broadcast_to(sb.reshape(g, -1)[e].reshape(-1, 1).astype(np.float64), (n, 1))
          for e in range(g)]
  out = np.zeros((m, n))
  end = np.cumsum(sizes)
  for e in range(g):
    lo, hi = max(end[e] - sizes[e] - row0, 0), min(end[e] - row0, m)
    for i in range(lo, hi):
      out[i] = (ws[e] * b[e]) @ (xs[i] * a[i])
      if bias is not None:
        out[i] += bias[e]
  return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_kernel_operands_follow_the_contract(fmt):
  xq, wq = _inputs(fmt)
  kind = gc.KINDS[fmt]
  a, b, sa, sb = grouped.kernel_operands(xq, wq, kind)
  assert a.dtype == jnp.float8_e4m3fn and b.dtype == jnp.float8_e4m3fn
  assert a.shape[0] == M and b.shape[:2] == (G, N) and a.shape[1] == b.shape[2]
  assert a.shape[1] % gc.K_BLOCK == 0
  sizes = np.array([7, 0, 11, 3])  # an empty expert, 3 rows past the total
  bias = np.random.default_rng(1).standard_normal((G, N))
  got = _model(kind, a, b, sa, sb, sizes, bias=bias)
  ref = jax_gmma.ragged_dot(xq, wq, jnp.asarray(sizes, jnp.int32), bias=bias, out_dtype=jnp.float32)
  ref = np.asarray(ref, np.float64)
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6
  assert not got[sizes.sum():].any()


def test_mxfp8_prefill_operands_are_exact_bf16():
  """MXFP8 experts at prefill: x and the experts dequantized to bfloat16 exactly (each element
  equals its float32 dequantization), K padded with zeros to the stored length (a K that is
  not a multiple of 32 included), and the bf16 kernel's contract gives the reference's result."""
  for k in (256, 100):
    rng = np.random.default_rng(k)
    w = jnp.asarray(rng.standard_normal((G, N, k)) * (1 + np.arange(G)).reshape(G, 1, 1), jnp.float32)
    wq = jax_gmma.quantize(w, "mxfp8")
    xq = jax_gmma.quantize(jnp.asarray(rng.standard_normal((M, k)), jnp.float32), "mxfp8")
    a, b, sa, sb = grouped.kernel_operands(xq, wq, "bf16")
    assert a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(sb), np.ones(G, np.float32))  # no expert scales
    kp = wq.data.shape[-1]
    assert a.shape == (M, kp) and b.shape == (G, N, kp) and kp % gc.K_BLOCK == 0
    np.testing.assert_array_equal(np.asarray(a[:, :k], np.float32), np.asarray(xq.dequantize(), np.float32))
    np.testing.assert_array_equal(np.asarray(b[..., :k], np.float32), np.asarray(wq.dequantize(), np.float32))
    assert not np.asarray(a[:, k:], np.float32).any() and not np.asarray(b[..., k:], np.float32).any()
    sizes = np.array([7, 0, 11, 3])
    got = _model("bf16", a, b, sa, sb, sizes)
    ref = np.asarray(jax_gmma.ragged_dot(xq, wq, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32),
                     np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6
    assert not got[sizes.sum():].any()


@pytest.mark.parametrize("fmt,x_format", (("fp8_channel", "fp8_channel"), ("fp8_channel", "fp8_tensor"),
                                          ("fp8_tensor", "fp8_channel"), ("fp8_tensor", "fp8_tensor")))
def test_per_row_experts_as_block_scales(fmt, x_format):
  """Per-row / per-tensor experts at prefill: their scales written out as 1x128 block scales
  (one value repeated over K) and multiplied by the 1x128 prefill kernel's contract give the
  reference's result, for K a multiple of 128 and with a partial last 128-K block."""
  for k in (256, 288):
    rng = np.random.default_rng(k)
    w = jnp.asarray(rng.standard_normal((G, N, k)) * (1 + np.arange(G)).reshape(G, 1, 1), jnp.float32)
    wq = (jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w) if fmt == "fp8_tensor"
          else jax_gmma.quantize(w, fmt))
    xq = jax_gmma.quantize(jnp.asarray(rng.standard_normal((M, k)), jnp.float32), x_format)
    a, b, sa, sb = grouped.kernel_operands(xq, wq, "blockwise_1d1d")
    assert sa.dtype == jnp.float32 and sb.dtype == jnp.float32
    sizes = np.array([7, 0, 11, 3])
    got = _model("blockwise_1d1d", a, b, sa, sb, sizes)
    ref = np.asarray(jax_gmma.ragged_dot(xq, wq, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32),
                     np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6
    assert not got[sizes.sum():].any()


@pytest.mark.parametrize("fmt", ("mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4"))
def test_packed_prefill_operands(fmt):
  """PackedWeight experts at prefill: b holds element times block scale (exact in bfloat16,
  without the global scale: one unpack launch for every expert), x in bfloat16, both padded with
  zeros to the packed K, the global scales as the (G,) b_scales; the kernel's contract (float32
  sums times the expert's scale, plus its bias) gives the reference's result, also for a shard
  of the rows."""
  k = 200  # packed K: 256
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.standard_normal((G, 32, k)) * (1 + np.arange(G)).reshape(G, 1, 1), jnp.float32)
  if fmt == "mxfp4":  # block scales past the kernel's code range: a power-of-two global scale
    w = w * jnp.asarray([1.0, 2.0 ** 100, 1.0, 2.0 ** -100]).reshape(G, 1, 1)
  wp = jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  if fmt in ("mxfp4", "nvfp4"):  # global scales that are not all one
    assert len(set(np.asarray(wp.global_scale).ravel().tolist())) > 1
  x = jnp.asarray(rng.standard_normal((M, k)), jnp.bfloat16)
  bias = jnp.asarray(rng.standard_normal((G, 32)), jnp.float32)
  ops = jax.jit(grouped.packed_bf16_operands)
  assert str(jax.make_jaxpr(ops)(x, wp)).count("weightonly_unpack") == 1
  a, b, sa, sb = ops(x, wp)
  assert a.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16 and a.shape == (M, 256) and b.shape == (G, 32, 256)
  np.testing.assert_array_equal(np.asarray(sb), np.asarray(wp.global_scale).reshape(G))
  unit = jax.tree.unflatten(jax.tree.structure(wp), [wp.packed, wp.scales, jnp.ones_like(wp.global_scale)])
  np.testing.assert_array_equal(np.asarray(b[..., :k], np.float32), np.asarray(grouped.dequantized_w(unit)))
  assert not np.asarray(b[..., k:], np.float32).any() and not np.asarray(a[:, k:], np.float32).any()
  sizes = np.array([7, 0, 11, 3])
  gs = jnp.asarray(sizes, jnp.int32)
  ref = np.asarray(jax_gmma.ragged_dot(x, wp, gs, bias=bias, out_dtype=jnp.float32), np.float64)
  for row0, rows in ((0, M), (10, 8)):
    got = _model("bf16", a[row0:row0 + rows], b, sa, sb, sizes, row0=row0, bias=np.asarray(bias, np.float64))
    want = ref[row0:row0 + rows]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-6


def test_packed_bf16_rule():
  p = lambda m, fmt="mxfp4", g=8: gc.GroupedProblem(m=m, n=4096, k=2048, g=g, fmt=fmt)
  assert gc.packed_takes_bf16(p(1032), True)                 # 129 rows per expert
  assert not gc.packed_takes_bf16(p(1024), True)             # 128: the weight-only kernel's tile
  assert gc.packed_takes_bf16(p(4096, "nvfp4"), True)        # float32 global scale after the kernel
  assert not gc.packed_takes_bf16(p(4096), False)            # FP8 x: its scale stays in float32
  assert gc.packed_takes_bf16(p(4096, "mxfp6_e3m2"), True)


def test_rows_of_a_shard():
  """A shard of the rows (row_ids[0] = 10): the groups apply to the global row numbers."""
  xq, wq = _inputs("fp8_1x128")
  sizes = np.array([7, 0, 11, 3])
  a, b, sa, sb = grouped.kernel_operands(xq, wq, "blockwise_1d1d")
  whole = _model("blockwise_1d1d", a, b, sa, sb, sizes)
  part = jax.tree.map(lambda v: v[10:18], xq)
  a2, _, sa2, _ = grouped.kernel_operands(part, wq, "blockwise_1d1d")
  np.testing.assert_allclose(_model("blockwise_1d1d", a2, b, sa2, sb, sizes, row0=10), whole[10:18],
                             rtol=1e-12)


def test_swizzled_mx_operands_pass_through():
  """MX operands already in the kernels' swizzled layout reach the kernel as the same bytes."""
  xq, wq = _inputs("mxfp8")
  rows = grouped.kernel_operands(xq, wq, "mxf8")
  xs = jax_gmma.quantize(xq.dequantize(), "mxfp8", layout="sm100_128x4")
  ws = jax_gmma.quantize(wq.dequantize(), "mxfp8", layout="sm100_128x4")
  swz = grouped.kernel_operands(xs, ws, "mxf8")
  for r, s in zip(rows, swz):
    np.testing.assert_array_equal(np.asarray(r).view(np.uint8), np.asarray(s).view(np.uint8))


@pytest.mark.parametrize("fmt", ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2"))
def test_packed_experts_back_to_back(fmt):
  """The grouped weight-only kernel takes G experts' prepared layouts back to back, each that of
  one (N, K) weight (what jax_gmma.weightonly.prepare gives), and x in bfloat16 padded to Kp."""
  rng = np.random.default_rng(5)
  w = jnp.asarray(rng.standard_normal((G, 48, K)), jnp.float32)
  wp = jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  for e in range(G):
    one = jax_gmma.weightonly.prepare(w[e], fmt)
    for name in ("packed", "scales", "global_scale"):
      np.testing.assert_array_equal(np.asarray(getattr(wp, name)[e]), np.asarray(getattr(one, name)))
  x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
  x2, xs, has_xs, wg = grouped.packed_operands(x, wp)
  kp = wp.packed.shape[2] * 64
  assert x2.dtype == jnp.bfloat16 and x2.shape == (M, kp) and not has_xs and wg.shape == (G,)
  np.testing.assert_array_equal(np.asarray(x2[:, :K]), np.asarray(x.astype(jnp.bfloat16)))
  assert not np.asarray(x2[:, K:], np.float32).any()
  xq = jax_gmma.quantize(x, "fp8_channel")
  x2, xs, has_xs, _ = grouped.packed_operands(xq, wp)
  assert has_xs and xs.shape == (M,)
  np.testing.assert_array_equal(np.asarray(x2[:, :K].astype(jnp.float32)) * np.asarray(xs)[:, None],
                                np.asarray(xq.dequantize(), np.float32))


def test_config_rule():
  p = lambda m, n, g, fmt="fp8_128x128": gc.GroupedProblem(m=m, n=n, k=2048, g=g, fmt=fmt)
  assert gc.select_config(p(8, 4096, 256), 132) == "stream_16x8_kw4"      # 8 slots x 256 strips
  assert gc.select_config(p(1, 1536, 128), 132) == "stream_16x8_kw8"      # 1 slot x 96 strips
  assert gc.select_config(p(16, 4096, 32), 132) == "stream_bulk_16x8_kw4"  # ~1.3 rows per expert
  assert gc.select_config(p(15, 4096, 32), 132) == "stream_16x8_kw4"
  assert gc.select_config(p(64, 5760, 32, "fp8_channel"), 132) == "stream_bulk_16x8_kw4"
  assert gc.select_config(p(65, 5760, 32, "fp8_channel"), 132) == "stream_16x16_kw4"
  assert gc.select_config(p(4096, 4096, 8), 132) == "128x128x128_coop"    # 512 rows per expert
  assert gc.select_config(p(768, 4096, 8), 132) == "128x128x128_coop"     # 96 rows per expert
  assert gc.select_config(p(760, 4096, 8), 132) == "64x128x128_pingpong"  # 95 rows per expert
  assert gc.select_config(p(1024, 4100, 8), 132).startswith("stream_")    # N % 8: no TMA rows
  # mxfp8 experts at prefill: exact bfloat16 operands, the grouped bf16 kernel
  assert gc.select_config(p(4096, 4096, 8, "mxfp8"), 132) == "128x256x64_coop"
  assert gc.select_config(p(512, 4096, 8, "mxfp8"), 132) == "64x128x64_pingpong"
  assert gc.select_config(p(256, 4096, 8, "mxfp8"), 132) == "stream_16x16_kw4"
  assert gc.kernel_kind("mxfp8", "128x256x64_coop") == "bf16"
  assert gc.kernel_kind("mxfp8", "stream_16x16_kw4") == "mxf8"
  # per-row / per-tensor experts take the 1x128 prefill kernel, a partial last 128-K block
  # included (gpt-oss-20b's K = 2880)
  assert gc.select_config(p(4096, 4096, 8, "fp8_channel"), 132) == "128x128x128_coop"
  assert gc.select_config(p(512, 4096, 8, "fp8_tensor"), 132) == "64x128x128_pingpong"
  assert gc.select_config(gc.GroupedProblem(m=4096, n=4096, k=2880, g=8, fmt="fp8_channel"),
                          132) == "128x128x128_coop"
  assert gc.select_config(p(64, 4096, 8, "fp8_channel"), 132).startswith("stream_")
  for fmt, kind in (("fp8_channel", "blockwise_1d1d"), ("fp8_tensor", "blockwise_1d1d"),
                    ("fp8_128x128", "blockwise_1d2d"), ("fp8_1x128", "blockwise_1d1d")):
    assert gc.kernel_kind(fmt, "128x128x128_coop") == kind
    assert gc.kernel_kind(fmt, "stream_16x8_kw4") == gc.KINDS[fmt]
  for m, n, g in ((1, 16, 1), (64, 2048, 32), (16384, 28672, 8)):
    name = gc.select_config(p(m, n, g), 132)
    assert name in gc.CONFIGS or gc.is_prefill(name)
  assert gc.unsupported(gc.GroupedProblem(m=4, n=64, k=2048, g=8, fmt="nvfp4")) is None
  assert gc.unsupported(gc.GroupedProblem(m=4, n=64, k=2048, g=8, fmt="fp8_e5m2_x")).startswith(
      "no grouped kernel for fp8_e5m2_x")
  assert "multiple of 32" in gc.unsupported(gc.GroupedProblem(m=4, n=64, k=48, g=8, fmt="fp8_channel"))
  assert gc.unsupported(gc.GroupedProblem(m=4, n=64, k=2048, g=8, fmt="mxfp8")) is None
