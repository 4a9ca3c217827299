"""jax_gmma.ragged_dot: the grouped GEMM of mixture-of-experts layers on quantized expert weights
(CPU: the pure-JAX reference), against a float64 NumPy product of the dequantized operands;
jit with traced group sizes, vmap, grad, bias, out dtypes, the errors, and the CUDA lowering
(Hopper faked on CPU): the grouped kernel's call, or the refusal where none exists."""
import os
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jax_gmma
from jax_gmma.ops import grouped
from jax_gmma.ops import grouped_configs as gc

G, N, K, M = 5, 48, 160, 40
#: group sizes with empty experts (1 and 3) and 8 unassigned rows at the end
SIZES = (9, 0, 17, 0, 6)
FP8 = ("fp8_tensor", "fp8_channel", "fp8_128x128", "fp8_1x128", "mxfp8")
PACKED = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
FORMATS = FP8 + PACKED
#: relative Frobenius error against the float product of the unquantized operands
TRUTH_TOL = {"nvfp4": 0.15, "mxfp4": 0.18, "mxfp6_e2m3": 0.05, "mxfp6_e3m2": 0.09}
#: relative Frobenius error against the float64 product of the dequantized operands
DEQ_TOL = 1e-5


#: fresh inputs per test and format; JAX_GMMA_TEST_SEED varies them all
_SEED = int(os.environ.get("JAX_GMMA_TEST_SEED", "0"))


def _rng(fmt, salt=0):
  return np.random.default_rng([zlib.crc32(f"{fmt}/{salt}".encode()), _SEED])


def _weights(fmt, w):
  """Stacked expert weights of the (G, N, K) float array w in format fmt."""
  if fmt == "fp8_tensor":  # one scale per expert
    return jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)
  if fmt in PACKED:
    return jax.vmap(lambda e: jax_gmma.weightonly.prepare(e, fmt))(w)
  return jax_gmma.quantize(w, fmt)


def _inputs(fmt, salt=0, m=M):
  rng = _rng(fmt, salt)
  w = (rng.standard_normal((G, N, K)) * (1 + np.arange(G)).reshape(G, 1, 1)).astype(np.float32)
  x = rng.standard_normal((m, K)).astype(np.float32)
  bias = rng.standard_normal((G, N)).astype(np.float32)
  return x, w, _weights(fmt, jnp.asarray(w)), bias


def _dequantized_w(wq):
  return np.asarray(grouped.dequantized_w(wq), np.float64)


def _x_as_multiplied(fmt, x, x_format=None):
  """x as the op multiplies it (quantized on the fly as jax_gmma.dot does), float64."""
  if fmt in PACKED:
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64)
  xf = x_format or grouped.X_FORMATS[fmt][0]
  return np.asarray(jax_gmma.quantize(x, xf).dequantize(), np.float64)


def _masks(sizes, m):
  end = np.cumsum(sizes)
  start = end - np.asarray(sizes)
  rows = np.arange(m)
  return (start[:, None] <= rows) & (rows < end[:, None])


def _ref64(x, w, sizes, bias=None):
  """float64: row i gets x[i] @ w[g].T (+ bias[g]) for every group g holding it."""
  out = np.zeros((x.shape[0], w.shape[1]))
  for g, mg in enumerate(_masks(sizes, x.shape[0])):
    out += np.where(mg[:, None], x @ w[g].T + (0 if bias is None else bias[g]), 0)
  return out


def _same(a, b):
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _relerr(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_matches_float64_of_dequantized_operands(fmt):
  x, w, wq, bias = _inputs(fmt)
  y = jax_gmma.ragged_dot(x, wq, jnp.asarray(SIZES, jnp.int32), bias=bias, out_dtype=jnp.float32)
  assert y.shape == (M, N) and y.dtype == jnp.float32
  used = sum(SIZES)
  ref = _ref64(_x_as_multiplied(fmt, x), _dequantized_w(wq), SIZES, bias)
  assert _relerr(y[:used], ref[:used]) < DEQ_TOL
  truth = _ref64(x.astype(np.float64), w.astype(np.float64), SIZES, bias)
  assert _relerr(y[:used], truth[:used]) < TRUTH_TOL.get(fmt, 0.06)
  assert not np.asarray(y[used:]).any()  # rows past sum(group_sizes): exactly zero


def test_list_of_experts_equals_stacked():
  x, w, wq, _ = _inputs("fp8_channel", 1)
  experts = [jax_gmma.quantize(w[g], "fp8_channel") for g in range(G)]
  _same(jax_gmma.ragged_dot(x, experts, SIZES), jax_gmma.ragged_dot(x, wq, SIZES))
  packed = [jax_gmma.weightonly.prepare(w[g], "mxfp4") for g in range(G)]
  _same(jax_gmma.ragged_dot(x, packed, SIZES), jax_gmma.ragged_dot(x, _weights("mxfp4", jnp.asarray(w)), SIZES))


@pytest.mark.parametrize("fmt", PACKED)
def test_prepare_takes_stacked_experts(fmt):
  """weightonly.prepare on (G, N, K) experts (float, or a QuantizedArray quantized along K such as
  an imported gpt-oss MXFP4 tensor) = the G experts prepared one by one, stacked: bit for bit,
  and the same ragged_dot."""
  x, w, _, bias = _inputs(fmt, 13)
  stacked = jax_gmma.weightonly.prepare(jnp.asarray(w), fmt)
  one = [jax_gmma.weightonly.prepare(jnp.asarray(w[g]), fmt) for g in range(G)]
  for name in ("packed", "scales", "global_scale"):
    want = np.stack([np.asarray(getattr(e, name)) for e in one])
    assert np.asarray(getattr(stacked, name)).tobytes() == want.tobytes(), name
  assert stacked.fp8_exact == all(e.fp8_exact for e in one)
  _same(jax_gmma.ragged_dot(x, stacked, SIZES, bias=bias), jax_gmma.ragged_dot(x, one, SIZES, bias=bias))
  if fmt != "nvfp4":  # one (G, N, K) QuantizedArray: the same blocks as per-expert quantization
    qa = jax_gmma.quantize(jnp.asarray(w), fmt)
    assert np.asarray(jax_gmma.weightonly.prepare(qa).packed).tobytes() == np.asarray(stacked.packed).tobytes()
  traced = jax.jit(lambda w: jax_gmma.weightonly.prepare(w, fmt))(jnp.asarray(w))
  assert np.asarray(traced.packed).tobytes() == np.asarray(stacked.packed).tobytes()
  assert traced.fp8_exact is None  # exactness is only established outside a trace


def test_prepare_stacked_refuses_an_expert_out_of_range():
  """The value rule of prepare holds per expert: eagerly an error naming the expert, under
  jax.jit that expert's rows poisoned (NaN), the others exact."""
  w = np.random.default_rng(3).standard_normal((3, 32, 256)).astype(np.float32)
  w[1, 0, :32] *= 2.0 ** 100  # blocks 2^200 apart in expert 1: past the exact range
  w[1, 1, :32] *= 2.0 ** -100
  qa = jax_gmma.quantize(jnp.asarray(w), "mxfp4")
  with pytest.raises(ValueError, match=r"^jax_gmma.weightonly.prepare: expert 1's mxfp4 block scales"):
    jax_gmma.weightonly.prepare(qa)
  wp = jax.jit(jax_gmma.weightonly.prepare)(qa)
  y = np.asarray(jax_gmma.ragged_dot(jnp.ones((6, 256), jnp.bfloat16), wp, jnp.array([2, 2, 2], jnp.int32),
                                     out_dtype=jnp.float32))
  assert np.isfinite(y[:2]).all() and np.isfinite(y[4:]).all() and not np.isfinite(y[2:4]).all()


def test_quantized_x_and_x_format():
  x, _, wq, _ = _inputs("fp8_channel", 2)
  for xf in ("fp8_channel", "fp8_tensor"):
    y = jax_gmma.ragged_dot(x, wq, SIZES, x_format=xf, out_dtype=jnp.float32)
    yq = jax_gmma.ragged_dot(jax_gmma.quantize(x, xf), wq, SIZES, out_dtype=jnp.float32)
    _same(y, yq)
    ref = _ref64(_x_as_multiplied("fp8_channel", x, xf), _dequantized_w(wq), SIZES)
    assert _relerr(y, ref) < DEQ_TOL
  assert jax_gmma.ragged_dot(jax_gmma.quantize(x, "fp8_channel"), wq, SIZES).dtype == jnp.bfloat16


@pytest.mark.parametrize("fmt", ("fp8_1x128", "mxfp6_e2m3"))
def test_jit_traced_group_sizes_one_compile(fmt):
  x, _, wq, bias = _inputs(fmt, 3)
  traces = []

  @jax.jit
  def f(x, wq, sizes, bias):
    traces.append(1)
    return jax_gmma.ragged_dot(x, wq, sizes, bias=bias, out_dtype=jnp.float32)

  wd, xd = _dequantized_w(wq), _x_as_multiplied(fmt, x)
  for sizes in ((9, 0, 17, 0, 6), (0, 40, 0, 0, 0), (1, 2, 3, 4, 5), (0, 0, 0, 0, 0)):
    y = f(x, wq, jnp.asarray(sizes, jnp.int32), bias)
    ref = _ref64(xd, wd, sizes, bias)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-4 * np.abs(ref).max(initial=1.0))
    assert not np.asarray(y[sum(sizes):]).any()
  assert len(traces) == 1


def test_vmap_over_x_and_group_sizes():
  x, _, wq, bias = _inputs("fp8_channel", 4)
  xs = np.stack([x, x[::-1], 2 * x])
  sizes = jnp.asarray([SIZES, (40, 0, 0, 0, 0), (3, 3, 3, 3, 3)], jnp.int32)
  ys = jax.jit(jax.vmap(lambda x, s: jax_gmma.ragged_dot(x, wq, s, bias=bias)))(xs, sizes)
  assert ys.shape == (3, M, N)
  for i in range(3):
    _same(ys[i], jax_gmma.ragged_dot(xs[i], wq, sizes[i], bias=bias))


@pytest.mark.parametrize("fmt", ("fp8_channel", "fp8_128x128", "mxfp8", "nvfp4"))
def test_grad_x_and_bias(fmt):
  x, _, wq, bias = _inputs(fmt, 5)
  c = _rng(fmt, 6).standard_normal((M, N)).astype(np.float32)
  sizes = jnp.asarray(SIZES, jnp.int32)

  def loss(x, b):
    return jnp.sum(jax_gmma.ragged_dot(x, wq, sizes, bias=b, out_dtype=jnp.float32) * c)

  dx, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, bias)
  assert dx.dtype == jnp.float32 and db.dtype == jnp.float32
  wd = _dequantized_w(wq)
  masks = _masks(SIZES, M)
  dx64 = sum(np.where(mg[:, None], c @ wd[g], 0) for g, mg in enumerate(masks))
  db64 = np.stack([np.where(mg[:, None], c, 0).sum(0) for mg in masks])
  assert _relerr(dx, dx64) < 1e-5 and _relerr(db, db64) < 1e-6
  assert not np.asarray(dx[sum(SIZES):]).any()

  # jax.grad of the same computation in float (lax.ragged_dot on the dequantized weights)
  wt = jnp.swapaxes(jnp.asarray(wd, jnp.float32), 1, 2)

  def float_loss(x, b):
    y = jax.lax.ragged_dot(x, wt, sizes, precision="highest") + jnp.matmul(
        jnp.asarray(masks.T, jnp.float32), b, precision="highest")  # not TF32 on a GPU
    return jnp.sum(y * c)

  fdx, fdb = jax.grad(float_loss, argnums=(0, 1))(x, bias)
  assert _relerr(dx, fdx) < 1e-5 and _relerr(db, fdb) < 1e-6


def test_bias_and_out_dtypes():
  x, _, wq, bias = _inputs("fp8_1x128", 7)
  ref = _ref64(_x_as_multiplied("fp8_1x128", x), _dequantized_w(wq), SIZES, bias)
  for dt, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 1e-2), (jnp.float16, 2e-3)):
    y = jax_gmma.ragged_dot(x, wq, SIZES, bias=jnp.asarray(bias).astype(dt), out_dtype=dt)
    assert y.dtype == dt and _relerr(y, ref) < tol
    assert jax_gmma.ragged_dot(x.astype(dt), wq, SIZES).dtype == dt  # default: x's dtype
  no_bias = jax_gmma.ragged_dot(x, wq, SIZES, out_dtype=jnp.float32)
  assert _relerr(no_bias, _ref64(_x_as_multiplied("fp8_1x128", x), _dequantized_w(wq), SIZES)) < 1e-5


def test_group_size_values_follow_lax_ragged_dot():
  """Negative sizes and totals above M: jax.lax.ragged_dot's rule, under jit (the reference); a
  grouped kernel (a Hopper GPU) gives NaN everywhere for a negative size (the module's rule)."""
  x, _, wq, _ = _inputs("mxfp8", 8)
  xd = jnp.asarray(_x_as_multiplied("mxfp8", x), jnp.float32)
  wt = jnp.swapaxes(jnp.asarray(_dequantized_w(wq), jnp.float32), 1, 2)
  f = jax.jit(lambda s: jax_gmma.ragged_dot(x, wq, s, out_dtype=jnp.float32))
  kernel = "jax_gmma_fp8_grouped_gemm" in f.lower(jnp.zeros(G, jnp.int32)).as_text()
  for sizes in ((30, -5, 10, 0, 3), (20, 20, 20, 0, 0), (50, 0, 0, 0, 0), (-3, 10, 0, 0, 0)):
    s = jnp.asarray(sizes, jnp.int32)
    if kernel and min(sizes) < 0:
      assert np.isnan(np.asarray(f(s))).all(), sizes
      continue
    lax_y = jax.lax.ragged_dot(xd, wt, s, precision="highest")
    np.testing.assert_allclose(np.asarray(f(s)), np.asarray(lax_y), rtol=1e-5, atol=1e-4 * float(jnp.abs(lax_y).max()))


def test_inside_shard_map():
  """Under jax.shard_map (typed manual axes: the reference's scan carries vary like its
  operands), forward and gradient: the per-device body of expert parallelism."""
  from jax.sharding import AxisType, PartitionSpec as P
  x, _, wq, bias = _inputs("fp8_channel", 13)
  mesh = jax.make_mesh((1,), ("ep",), axis_types=(AxisType.Auto,), devices=jax.devices()[:1])
  sizes = jnp.asarray(SIZES, jnp.int32)

  def body(x, s, b, w):
    return jax_gmma.ragged_dot(x, w, s, bias=b, out_dtype=jnp.float32)

  f = jax.shard_map(body, mesh=mesh, in_specs=(P("ep"), P(), P(), P()), out_specs=P("ep"))
  _same(jax.jit(f)(x, sizes, bias, wq), jax_gmma.ragged_dot(x, wq, sizes, bias=bias, out_dtype=jnp.float32))
  loss = lambda x, b: jnp.sum(f(x, sizes, b, wq) ** 2)  # noqa: E731
  dx, db = jax.jit(jax.grad(loss, (0, 1)))(x, bias)
  want = jax.grad(lambda x, b: jnp.sum(body(x, sizes, b, wq) ** 2), (0, 1))(x, bias)
  np.testing.assert_allclose(np.asarray(dx), np.asarray(want[0]), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(db), np.asarray(want[1]), rtol=1e-6, atol=1e-6)


def test_nonfinite_expert_stays_in_its_rows():
  x, w, _, bias = _inputs("fp8_channel", 9)
  w[1, 0, 0] = np.nan
  bias[3, 0] = np.inf
  y = np.asarray(jax_gmma.ragged_dot(x, jax_gmma.quantize(w, "fp8_channel"), (9, 4, 17, 0, 6), bias=bias))
  assert np.isnan(y[9:13, 0]).all() and np.isfinite(np.delete(y, np.s_[9:13], axis=0)).all()


def test_no_rows():
  _, _, wq, bias = _inputs("fp8_channel", 10)
  y = jax_gmma.ragged_dot(np.zeros((0, K), np.float32), wq, SIZES, bias=bias)
  assert y.shape == (0, N) and y.dtype == jnp.float32


# -- errors: before anything runs, naming jax_gmma.ragged_dot, the argument and the rule ----------
# The refused inputs are the "Grouped GEMM" table of docs/bad-inputs.md (tests/_bad_inputs_ragged.py,
# run by tests/test_bad_inputs.py); here: every message starts with the function's name.

def test_bad_input_messages_start_with_the_function():
  import _bad_inputs_ragged
  for case_id, case in _bad_inputs_ragged.CASES.items():
    with pytest.raises(case.error) as info:
      case.call()
    assert str(info.value).startswith("jax_gmma.ragged_dot: "), (case_id, str(info.value))


def test_errors_hold_under_jit():
  _, w, wq, _ = _inputs("fp8_channel", 11)
  f = jax.jit(lambda x, s: jax_gmma.ragged_dot(x, wq, s))
  with pytest.raises(TypeError, match="^jax_gmma.ragged_dot: group_sizes"):
    f(np.zeros((M, K), np.float32), jnp.zeros((G,), jnp.float32))


# -- the CUDA lowering: the grouped kernel where one exists, else a refusal unless allowed -------

def _grouped_kernels_built():
  e = jax_gmma._backend.ext()
  return bool(e is not None and any(str(r["config"]).startswith("grouped_") for r in e.kernels()))


def test_cuda_lowering_calls_the_grouped_kernel(fake_hopper, monkeypatch):
  monkeypatch.setattr(jax_gmma._backend, "prepare_devices", lambda: None)  # nothing to set up
  x, _, wq, bias = _inputs("fp8_1x128", 12)
  f = jax.jit(lambda x, w, s, b: jax_gmma.ragged_dot(x, w, s, bias=b))
  args = (x, wq, jnp.asarray(SIZES, jnp.int32), bias)
  with jax_gmma.allow_reference(False):
    if not _grouped_kernels_built():
      with pytest.raises(jax_gmma.KernelUnavailable,
                         match=r"^jax_gmma.ragged_dot: this build of jax_gmma has no grouped kernels"):
        export.export(f, platforms=("cuda",))(*args)
      return
    exported = export.export(f, platforms=("cuda",),
                             disabled_checks=jax_gmma.export_disabled_checks())(*args)
  text = exported.mlir_module()
  assert len(re.findall(r"custom_call @jax_gmma_fp8_grouped_gemm", text)) == 1
  assert "grouped_blockwise_1d1d_stream_16x" in text
  assert exported.out_avals[0].shape == (M, N)


def test_cuda_lowering_calls_the_grouped_weightonly_kernel(fake_hopper, monkeypatch):
  monkeypatch.setattr(jax_gmma._backend, "prepare_devices", lambda: None)  # nothing to set up
  x, _, wq, bias = _inputs("mxfp4", 12)
  f = jax.jit(lambda x, w, s, b: jax_gmma.ragged_dot(x, w, s, bias=b))
  args = (x, wq, jnp.asarray(SIZES, jnp.int32), bias)
  e = jax_gmma._backend.ext()
  built = e is not None and "jax_gmma_weightonly_grouped_gemm" in dict(e.registrations())
  with jax_gmma.allow_reference(False):
    if not built:
      with pytest.raises(jax_gmma.KernelUnavailable,
                         match=r"^jax_gmma.ragged_dot: this build of jax_gmma has no grouped weight-only"):
        export.export(f, platforms=("cuda",))(*args)
      return
    exported = export.export(f, platforms=("cuda",),
                             disabled_checks=jax_gmma.export_disabled_checks())(*args)
  text = exported.mlir_module()
  assert len(re.findall(r"custom_call @jax_gmma_weightonly_grouped_gemm", text)) == 1
  assert exported.out_avals[0].shape == (M, N)


def test_hopper_prefill_kernels_host_checks():
  """The compiled Hopper prefill kernels' host checks (no GPU needed): every grouped config of
  the bf16 and block-scaled kinds can run a gpt-oss-20b-sized problem (4096 rows, 32 experts of
  2880 x 2880) in both output dtypes, with or without bias, from a workspace sized by M, G and
  the SM count only."""
  e = jax_gmma._backend.ext()
  if e is None or not e.cuda_built():
    pytest.skip("jax_gmma extension not built with CUDA kernels (source tree / no nvcc)")
  if "sm_90a" not in jax_gmma._backend.built_archs():
    pytest.skip(f"library built without sm_90a (built: {jax_gmma._backend.built_archs()})")
  kinds = sorted(set(gc.PREFILL_KIND.values()))
  assert "bf16" in kinds
  for kind in kinds:
    configs = gc.BF16_PREFILL_CONFIGS if kind == "bf16" else gc.PREFILL_CONFIGS
    el = "bfloat16" if kind == "bf16" else "float8_e4m3fn"
    for name, d in ((gc.kernel_name(kind, c), d) for c in configs for d in ("bfloat16", "float32")):
      err, ws = e.check_grouped(name, el, el, d, 4096, 2880, 2880, 32, 132, True)
      assert err is None, (name, d, err)
      err2, ws2 = e.check_grouped(name, el, el, d, 4096, 2880, 2880, 32, 132, False)
      assert err2 is None and ws2 == ws > 0, (name, d, err2)
