"""The activation-quantization kernel (jax_gmma.ops.quantize, cpp/sm90_fp8_quantize.cu).

CPU: the primitive's pure-JAX lowering is the old quantize path bit for bit (every special
value, shape, dtype, jit / eager / vmap / jvp), shapes and padding, dispatch, errors.
GPU (Hopper with kernels; skipped elsewhere by conftest.py): the kernel against the pure-JAX
path run by XLA on the same GPU, bit for bit, on fresh random inputs with zero blocks, NaN,
Inf, huge and subnormal values, rounding ties, K not a multiple of 128 (or of 16: the
element-wise load path), M = 1 and leading dims; and inside jax.jit with CUDA graphs (XLA
command buffers), checking with the library's capture counters that the handler really ran
under stream capture.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from _cmdbuf import command_buffer_runs  # noqa: E402 (tests/ helper)
from jax_gmma.ops import quantize as qk

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)
FORMATS = ("fp8_1x128", "mxfp8")
_seed = [0]


def _rng():
  _seed[0] += 1
  return np.random.default_rng(7000 + _seed[0])


def bits(a):
  """The raw bytes of an array (fp8 data, f32 or e8m0 scales) as unsigned integers."""
  a = np.asarray(a)
  return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def special_input(m, k, dtype, rng):
  """(m, k) values of `dtype`: per-row random magnitudes (2^-30 .. 2^30), and in the first rows
  an all-zero block, all -0.0, NaN, +-Inf, a block without any finite value, the dtype's
  largest value, subnormals, e4m3 rounding ties (a block with amax 448 holding midpoints
  between e4m3 values) and integers up to 448. Fresh values on every call."""
  finfo = jnp.finfo(dtype)
  big, tiny = float(finfo.max), float(finfo.smallest_normal)
  x = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-30, 30, (m, 1)))
  x = np.clip(x, -big, big)
  kb = min(k, 128)
  ties = np.array([448.0, 1.0625, -1.1875, 3.25, 2.0 ** -9 * 1.5, -2.0 ** -10, 240.0, -208.0])
  special_rows = [
      lambda r: r[:kb].fill(0.0),                                   # zero block: scale 1
      lambda r: r.fill(-0.0),
      lambda r: r.__setitem__(slice(0, None, 37), np.nan),           # NaN inside a block
      lambda r: r.__setitem__([0, -1], [np.inf, -np.inf]),
      lambda r: r.__setitem__(slice(0, kb), np.where(np.arange(kb) % 2, np.nan, np.inf)),
      lambda r: r.__setitem__(slice(0, None, 5), big),               # the largest value
      lambda r: r.__setitem__(slice(None), rng.standard_normal(k) * tiny / 4),  # subnormals
      lambda r: r.__setitem__(slice(0, kb), np.resize(ties, kb)),    # rounding ties
      lambda r: r.__setitem__(slice(None), np.round(r / np.abs(r).max() * 448)),
  ]
  for i, fill in enumerate(special_rows[:m]):
    fill(x[i])
  return jnp.asarray(x.astype(np.float32)).astype(dtype)


def _parts(x, fmt, use_kernel):
  q = jax_gmma.quantize(x, fmt, use_kernel=use_kernel)
  return q.data, q.scales


def assert_same(kernel, ref, label):
  """data and scales bit-identical; a NaN must be NaN in both (its sign bit is compared only
  where the input NaNs are positive, see the GPU test)."""
  (dk, sk), (dr, sr) = kernel, ref
  assert dk.shape == dr.shape and dk.dtype == dr.dtype, (label, dk.shape, dr.shape)
  assert sk.shape == sr.shape and sk.dtype == sr.dtype, (label, sk.shape, sr.shape)
  np.testing.assert_array_equal(bits(sk), bits(sr), err_msg=f"{label}: scales differ")
  np.testing.assert_array_equal(bits(dk), bits(dr), err_msg=f"{label}: data differ")


# -- CPU: the primitive's reference lowering is the old path ------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(9, 300), (1, 128), (12, 256), (3, 7), (2, 3, 160)])
def test_primitive_matches_pure_jax_path(fmt, dtype, shape):
  rng = _rng()
  x = special_input(int(np.prod(shape[:-1])), shape[-1], dtype, rng).reshape(shape)
  ref = _parts(x, fmt, False)
  assert_same(_parts(x, fmt, True), ref, f"eager {fmt} {shape}")
  jitted = jax.jit(lambda x: _parts(x, fmt, True))
  assert_same(jitted(x), ref, f"jit {fmt} {shape}")
  assert "jax_gmma_fp8_quantize" in str(jax.make_jaxpr(lambda x: _parts(x, fmt, True))(x))


def test_primitive_quantize_rows_matches_quantize_impl():
  from jax_gmma.numerics.scaling import quantize_blocks as _quantize_impl
  x = special_input(16, 1000, jnp.bfloat16, _rng())
  for fmt in FORMATS:
    d, s, _ = _quantize_impl(x, fmt, "float8_e4m3fn", 1)
    assert_same(qk.quantize_rows(x, fmt), (d, s), fmt)


@pytest.mark.parametrize("fmt,block", [("fp8_1x128", 128), ("mxfp8", 32)])
@pytest.mark.parametrize("m,k", [(1, 1), (1, 128), (5, 129), (4, 7168), (3, 100)])
def test_shapes_and_padding(fmt, block, m, k):
  x = jnp.asarray(np.abs(_rng().standard_normal((m, k))) + 1.0, jnp.bfloat16)  # no zero code
  data, scales = jax.jit(lambda x: qk.quantize_rows(x, fmt))(x)
  kp = -(-k // block) * block
  assert data.shape == (m, kp) and data.dtype == E4M3
  assert scales.shape == (m, kp // block)
  assert scales.dtype == jax_gmma.get_format(fmt).scale_dtype
  assert (bits(data)[:, k:] == 0).all()           # K padding: +0.0
  assert (bits(data)[:, :k] != 0).all()
  assert qk.output_shapes(m, k, fmt) == ((m, kp), (m, kp // block))


def test_reference_scale_is_amax_times_rounded_reciprocal():
  """The kernel's scale arithmetic: XLA rewrites the reference's `amax / 448` into
  `amax * f32(1/448)` (algebraic simplifier, every backend), then max(., 2^-126), 1 for 0.
  (Also holds on a GPU, with its pure-JAX path.)"""
  x = special_input(64, 1024, jnp.float32, _rng())
  _, scales = _parts(x, "fp8_1x128", False)
  xb = np.asarray(x).reshape(64, 8, 128)
  amax = np.where(np.isfinite(xb), np.abs(xb), 0).max(-1).astype(np.float32)
  if jax.default_backend() == "cpu":  # XLA:CPU flushes float32 subnormals to zero; GPUs do not
    amax = np.where(amax < np.float32(2.0 ** -126), np.float32(0), amax)
  want = np.maximum(amax * (np.float32(1) / np.float32(448)), np.float32(2.0 ** -126))
  want = np.where(amax > 0, want, np.float32(1)).astype(np.float32)
  np.testing.assert_array_equal(bits(scales), bits(want))


def test_dispatch_rules():
  x = jnp.ones((4, 256), jnp.bfloat16)
  uses = lambda f: "jax_gmma_fp8_quantize" in str(jax.make_jaxpr(f)(x))
  assert uses(lambda x: jax_gmma.quantize(x, "fp8_1x128").data)
  assert uses(lambda x: jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4").data)
  assert uses(lambda x: jax_gmma.quantize(x, "fp8_1x128", axis=1).data)
  assert not uses(lambda x: jax_gmma.quantize(x, "fp8_1x128", use_kernel=False).data)
  assert not uses(lambda x: jax_gmma.quantize(x, "fp8_1x128", dtype=jnp.float8_e5m2).data)
  assert not uses(lambda x: jax_gmma.quantize(x, "fp8_1x128", axis=0).data)
  for fmt in ("fp8_tensor", "fp8_channel", "fp8_128x128", "mxfp4", "nvfp4"):
    assert not uses(lambda x: jax_gmma.quantize(x, fmt).data), fmt
  assert not qk.applies("fp8_1x128", E4M3, jnp.float8_e4m3fn, -1, 2)  # fp8 input
  assert qk.applies("fp8_1x128", E4M3, jnp.float32, 2, 3)
  assert not qk.applies("fp8_1x128", E4M3, jnp.float32, 1, 3)


def test_swizzled_mx_layout_and_dequantize_unchanged():
  x = special_input(130, 96, jnp.float32, _rng())
  for kw in (dict(layout="sm100_128x4"), dict()):
    a = jax_gmma.quantize(x, "mxfp8", **kw)
    b = jax_gmma.quantize(x, "mxfp8", use_kernel=False, **kw)
    assert a.layout == b.layout
    assert_same((a.data, a.scales), (b.data, b.scales), str(kw))
    np.testing.assert_array_equal(np.asarray(jax_gmma.dequantize(a)),
                                  np.asarray(jax_gmma.dequantize(b)))


@pytest.mark.parametrize("shape", [(1, 32), (130, 96), (5, 4000), (128, 128), (2, 3, 160)])
def test_swizzled_scales_from_the_primitive(shape):
  """layout="sm100_128x4": the kernel writes the swizzled MXFP8 scales itself (2-D x; leading
  dims: row-major scales swizzled by XLA); its reference lowering is swizzle_scales of the
  row-major scales, padding (zero bytes) included."""
  from jax_gmma.numerics.layouts import swizzle_scales
  x = special_input(int(np.prod(shape[:-1])), shape[-1], jnp.bfloat16, _rng()).reshape(shape)
  d, s = qk.quantize_rows(x, "mxfp8")
  ds, ss = jax.jit(lambda x: qk.quantize_rows(x, "mxfp8", layout="sm100_128x4"))(x)
  assert_same((ds, ss), (d, swizzle_scales(s, "sm100_128x4")), str(shape))
  if len(shape) == 2:
    m, k = shape
    assert qk.output_shapes(m, k, "mxfp8", "sm100_128x4")[1] == ss.shape
    jaxpr = str(jax.make_jaxpr(lambda x: jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4"))(x))
    assert "layout=sm100_128x4" in jaxpr  # no separate swizzle after the primitive
  with pytest.raises(ValueError, match="layout must be"):
    qk.quantize_rows(x, "fp8_1x128", layout="sm100_128x4")
  xb = x.reshape(1, -1, shape[-1])
  v = jax.vmap(lambda x: jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4").scales)(xb)
  v_ref = jax_gmma.quantize(xb, "mxfp8", layout="sm100_128x4", use_kernel=False).scales
  np.testing.assert_array_equal(bits(v), bits(v_ref))


def test_vmap_and_jvp_keep_working():
  x = jnp.asarray(_rng().standard_normal((3, 4, 256)), jnp.float32)
  s = jax.vmap(lambda x: jax_gmma.quantize(x, "fp8_1x128").scales)(x)
  s_ref = jax.vmap(lambda x: jax_gmma.quantize(x, "fp8_1x128", use_kernel=False).scales)(x)
  np.testing.assert_array_equal(np.asarray(s), np.asarray(s_ref))
  f = lambda use: (lambda x: jax_gmma.quantize(x, "fp8_1x128", use_kernel=use).scales)
  out, tan = jax.jvp(f(True), (x[0],), (jnp.ones_like(x[0]),))
  out_r, tan_r = jax.jvp(f(False), (x[0],), (jnp.ones_like(x[0]),))
  np.testing.assert_array_equal(np.asarray(out), np.asarray(out_r))
  np.testing.assert_array_equal(np.asarray(tan), np.asarray(tan_r))


def test_kernel_not_available_without_gpu_and_never_raises():
  if qk.kernel_available():
    pytest.skip("the kernel is available here")
  # No KernelUnavailable, unlike the GEMMs: quantize always ran everywhere.
  q = jax.jit(lambda x: jax_gmma.quantize(x, "fp8_1x128"))(jnp.ones((2, 128), jnp.bfloat16))
  assert float(q.scales[0, 0]) == np.float32(1) * (np.float32(1) / np.float32(448))


def test_errors():
  x = jnp.ones((4, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="format"):
    qk.quantize_rows(x, "fp8_128x128")
  with pytest.raises(ValueError, match="div_mode"):
    qk.quantize_rows(x, "fp8_1x128", div_mode="approx")
  with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
    qk.quantize_rows(x.astype(jnp.float8_e4m3fn))
  with pytest.raises(ValueError, match="non-empty"):
    qk.quantize_rows(jnp.ones((128,), jnp.float32))
  with pytest.raises(ValueError, match="non-empty"):
    qk.quantize_rows(jnp.ones((0, 128), jnp.float32))
  # quantize's own checks still come first.
  with pytest.raises(ValueError, match="K"):
    jax_gmma.quantize(jnp.ones((4, 0), jnp.float32), "fp8_1x128")
  with pytest.raises(ValueError, match="2 dimensions"):
    jax_gmma.quantize(jnp.ones((128,), jnp.float32), "fp8_1x128")
  with pytest.raises(TypeError, match="floating"):
    jax_gmma.quantize(jnp.ones((4, 128), jnp.int32), "fp8_1x128")


# -- GPU: the kernel against XLA's pure-JAX path, bit for bit ----------------------------------

def _diagnose(x, fmt, kernel, ref):
  """Human-readable account of the first mismatches (and which division would explain them)."""
  (dk, sk), (dr, sr) = kernel, ref
  xs = np.asarray(x.astype(jnp.float32)).reshape(-1, x.shape[-1])
  dk, dr = bits(dk).reshape(xs.shape[0], -1), bits(dr).reshape(xs.shape[0], -1)
  sk, sr = np.asarray(sk).reshape(xs.shape[0], -1), np.asarray(sr).reshape(xs.shape[0], -1)
  block = qk.KERNEL_FORMATS[fmt]
  lines = [f"scales differ at {int((bits(sk) != bits(sr)).sum())} of {sk.size} blocks, data at "
           f"{int((dk != dr).sum())} of {dk.size} elements (DIV_MODE={qk.DIV_MODE!r})"]
  for r, c in list(zip(*np.nonzero(dk != dr)))[:8]:
    if c >= xs.shape[1]:
      lines.append(f"  [{r},{c}] padding: kernel {dk[r, c]:#04x} ref {dr[r, c]:#04x}")
      continue
    s = np.float32(sr[r, c // block]) if fmt == "fp8_1x128" else None
    ieee = "-"
    if s is not None:
      q = np.clip(np.array([xs[r, c]], np.float32) / s, -448, 448)
      ieee = f"{int(q.astype(E4M3).view(np.uint8)[0]):#04x}"
    lines.append(f"  [{r},{c}] x={xs[r, c]!r} scale={s!r} kernel {dk[r, c]:#04x} ref "
                 f"{dr[r, c]:#04x} (ieee quotient -> {ieee})")
  if fmt == "fp8_1x128":  # would the other division mode match?
    for mode in qk.DIV_MODES:
      if mode != qk.DIV_MODE:
        d2, s2 = jax.jit(lambda x: qk.quantize_rows(x, fmt, div_mode=mode))(x)
        n = int((bits(d2).reshape(dk.shape) != dr).sum())
        lines.append(f"  div_mode={mode!r} would differ at {n} elements")
  return "\n".join(lines)


def check_kernel(x, fmt, label):
  f_kernel = jax.jit(lambda x: _parts(x, fmt, True))
  f_ref = jax.jit(lambda x: _parts(x, fmt, False))
  assert qk.FP8_QUANTIZE_TARGET in f_kernel.lower(x).as_text(), f"{label}: the kernel did not run"
  kernel, ref = f_kernel(x), f_ref(x)
  (dk, sk), (dr, sr) = kernel, ref
  same = (dk.shape == dr.shape and sk.shape == sr.shape
          and np.array_equal(bits(sk), bits(sr)) and np.array_equal(bits(dk), bits(dr)))
  assert same, f"{label}:\n" + _diagnose(x, fmt, kernel, ref)


GPU_SHAPES = [(1, 128), (1, 7168), (9, 300), (64, 4096), (33, 200), (17, 7), (2, 3, 1024),
              (513, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_kernel_bit_identical(dtype, shape):
  x = special_input(int(np.prod(shape[:-1])), shape[-1], dtype, _rng()).reshape(shape)
  check_kernel(x, "fp8_1x128", f"fp8_1x128 {jnp.dtype(dtype).name} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 32), (9, 300), (33, 200), (64, 4096)])
def test_kernel_bit_identical_mxfp8(dtype, shape):
  x = special_input(int(np.prod(shape[:-1])), shape[-1], dtype, _rng()).reshape(shape)
  check_kernel(x, "mxfp8", f"mxfp8 {jnp.dtype(dtype).name} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 32), (1, 8192), (127, 96), (128, 4000), (130, 7168),
                                   (2, 3, 1024)])
def test_kernel_bit_identical_mxfp8_swizzled(shape):
  """The kernel's swizzled MXFP8 scales (what mx_gemm reads) against swizzle_scales of the
  pure-JAX path, padding included (rows to 128, blocks to 4: zero bytes). The quantization
  follows a large temporary in the same jitted call, so that XLA may hand the kernel a reused,
  non-zero buffer (likely, not guaranteed)."""
  x = special_input(int(np.prod(shape[:-1])), shape[-1], jnp.bfloat16, _rng()).reshape(shape)

  def parts(x, use_kernel):
    junk = jnp.full((1 << 20,), -1.0, jnp.float32) * x.astype(jnp.float32).sum()
    q = jax_gmma.quantize(x, "mxfp8", layout="sm100_128x4", use_kernel=use_kernel)
    return q.data, q.scales, junk.sum()

  f_kernel = jax.jit(lambda x: parts(x, True))
  hlo = f_kernel.lower(x).compile().as_text()
  assert qk.FP8_QUANTIZE_TARGET in hlo
  if len(shape) == 2:
    assert "transpose" not in hlo, "the scales were swizzled by XLA, not by the kernel"
  dk, sk, _ = f_kernel(x)
  dr, sr, _ = jax.jit(lambda x: parts(x, False))(x)
  assert_same((dk, sk), (dr, sr), f"mxfp8 swizzled {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_bit_identical_benchmark_shape(dtype):
  """The target shape, 4096 x 7168, plain random activations (no special rows)."""
  rng = _rng()
  x = jnp.asarray(rng.standard_normal((4096, 7168)).astype(np.float32)).astype(dtype)
  check_kernel(x, "fp8_1x128", f"4096x7168 {jnp.dtype(dtype).name}")


@pytest.mark.gpu
def test_kernel_nan_signs():
  """NaN stays NaN (both signs); -NaN is compared by NaN-ness (its sign bit may be kept or
  canonicalized by the widening conversion), +NaN bit for bit by the tests above."""
  x = special_input(8, 256, jnp.float32, _rng())
  x = x.at[1, 3].set(-jnp.nan).at[2, 200].set(-jnp.nan).at[3, 5].set(jnp.nan)
  for dtype in DTYPES:
    xd = x.astype(dtype)
    (dk, sk), (dr, sr) = (jax.jit(lambda x: _parts(x, "fp8_1x128", u))(xd) for u in (True, False))
    np.testing.assert_array_equal(bits(sk), bits(sr))
    fk, fr = np.asarray(dk).astype(np.float32), np.asarray(dr).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(fk), np.isnan(fr))
    ok = ~np.isnan(fr)
    np.testing.assert_array_equal(bits(dk)[ok], bits(dr)[ok])
    assert np.isnan(fk[1, 3]) and np.isnan(fk[2, 200]) and np.isnan(fk[3, 5])


@pytest.mark.gpu
def test_kernel_dot_with_blockwise_weights():
  """jax_gmma.dot quantizes x to fp8_1x128 with the kernel before the block-scaled GEMM."""
  rng = _rng()
  x = jnp.asarray(rng.standard_normal((64, 1024)), jnp.bfloat16)
  w = jnp.asarray(rng.standard_normal((512, 1024)) * 0.03, jnp.float32)
  wq = jax_gmma.quantize(w, "fp8_128x128")
  f = jax.jit(jax_gmma.dot)
  assert qk.FP8_QUANTIZE_TARGET in f.lower(x, wq).as_text()
  y = f(x, wq).astype(jnp.float32)
  r = x.astype(jnp.float32) @ w.T
  assert float(jnp.linalg.norm(y - r) / jnp.linalg.norm(r)) < 0.08


# -- GPU: CUDA graphs (XLA command buffers) ------------------------------------------------------

# Child process: a jitted chain of 24 dependent quantizations (both formats, several shapes and
# input dtypes; each output dequantized and fed to the next) and a one-call graph, under the
# XLA_FLAGS it was started with. Prints one JSON line: result hashes, the same chain through
# the pure-JAX path, and the library's capture counters.
CHILD = r'''
import hashlib, json
import jax, jax.numpy as jnp, numpy as np
import jax_gmma
from jax_gmma import _backend

def chain(x, use_kernel):
  for i in range(24):
    fmt = ("fp8_1x128", "mxfp8")[i % 2]
    dt = (jnp.bfloat16, jnp.float32, jnp.float16)[i % 3]
    lay = "sm100_128x4" if i % 4 == 1 else "rowmajor"  # mxfp8: swizzled scales every other time
    q = jax_gmma.quantize(x.astype(dt), fmt, use_kernel=use_kernel, layout=lay)
    x = jax_gmma.dequantize(q)[:, :x.shape[1]] * 1.1 + (i % 5)
  return x

x0 = jax.random.normal(jax.random.PRNGKey(0), (64, 1000), jnp.float32) * 3
x0 = x0.at[5, 7].set(jnp.nan).at[9, 999].set(jnp.inf)
f_kernel = jax.jit(lambda x: chain(x, True))
f_ref = jax.jit(lambda x: chain(x, False))
small = jax.jit(lambda x: jax_gmma.quantize(x, "fp8_1x128").data)
outs = {}
for _ in range(3):  # the first run may trace / instantiate; later runs replay
  outs["chain"] = np.asarray(f_kernel(x0))
  outs["small"] = np.asarray(small(x0.astype(jnp.bfloat16))).view(np.uint8)
ref = np.asarray(f_ref(x0))
assert np.abs(np.nan_to_num(outs["chain"])).max() > 0  # never all-zeros
res = {name: hashlib.sha256(v.tobytes()).hexdigest() for name, v in outs.items()}
res["chain_equals_reference"] = bool(np.array_equal(outs["chain"], ref, equal_nan=True))
res["captured"], res["eager"] = _backend.ext().capture_stats()
print(json.dumps(res))
'''



@pytest.mark.gpu
def test_command_buffers_bit_identical_and_captured(tmp_path):
  # -P and a neutral working directory: the child imports the installed jax_gmma.
  runs = command_buffer_runs(["-P", "-c", CHILD], cwd=tmp_path)
  off, default, forced = runs["off"], runs["default"], runs["forced"]
  for name in ("chain", "small"):
    assert default[name] == off[name], f"{name}: default command buffers differ from off"
    assert forced[name] == off[name], f"{name}: forced command buffers differ from off"
  for run in (off, default, forced):
    assert run["chain_equals_reference"], run
  # Check capture, don't assume it: with command buffers the handler ran under stream capture.
  assert off["captured"] == 0 and off["eager"] > 0, off
  assert default["captured"] >= 24, default
  assert forced["captured"] >= 25, forced
