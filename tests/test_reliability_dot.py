"""The public GEMMs on QuantizedArrays (dot, scaled_matmul, fp8_gemm, blockwise_gemm, mx_gemm,
fp8_linear) never give a silently wrong answer: documented ranks (1, 2, 3 and zero-size leading
dims) against a float64 product of the dequantized operands, gradients without NaN, one traced
GEMM for a batched scaled_matmul, every refusal naming the function the user called (the bad-input
cases of ``_bad_inputs_dot.py``), and the Hopper MX decision with a faked device. CPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from jax_gmma import _backend, ops, primitive
from jax_gmma.ops import mx

import _bad_inputs_dot

pytestmark = pytest.mark.skipif(bool(_backend.cuda_devices()),
                                reason="CPU-path tests; the GPU has its own tests")

SW = "sm100_128x4"
K, N = 256, 128
#: (weight format, scale layout, the activation format dot quantizes x to)
WEIGHTS = [("fp8_tensor", "rowmajor", "fp8_channel"), ("fp8_channel", "rowmajor", "fp8_channel"),
           ("fp8_128x128", "rowmajor", "fp8_1x128"), ("fp8_1x128", "rowmajor", "fp8_1x128")]
WEIGHTS += [(f, lay, f) for f in ops.mx.WEIGHT_FORMATS for lay in ("rowmajor", SW)]
SHAPES = [(K,), (5, K), (2, 3, K), (0, K), (2, 0, K)]
#: The CPU reference against float64 (float32 output): docs/formats.md, "about 1e-6".
TOL = 1e-5


def relerr(x, ref):
  x = np.asarray(x, np.float64)
  return np.linalg.norm(x - ref) / np.linalg.norm(ref)


def test_every_served_format_is_covered():
  served = set(ops.QUANTIZED_WEIGHT_FORMATS)
  assert served == {w[0] for w in WEIGHTS}


@pytest.mark.parametrize("wfmt,layout,xfmt", WEIGHTS, ids=[f"{w}-{lay}" for w, lay, _ in WEIGHTS])
def test_dot_ranks_against_float64(wfmt, layout, xfmt):
  rng = np.random.default_rng(abs(hash((wfmt, layout))) % 2**32)
  w = rng.standard_normal((N, K)).astype(np.float32)
  wq = jax_gmma.quantize(w, wfmt, layout=layout)
  wd = np.asarray(jax_gmma.dequantize(wq), np.float64)
  bias = rng.standard_normal(N).astype(np.float32)
  f = jax.jit(lambda x, wq, b: jax_gmma.dot(x, wq, bias=b))
  for shape in SHAPES:
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    y = f(x, wq, bias)
    assert y.shape == shape[:-1] + (N,) and y.dtype == jnp.float32, (shape, y.shape)
    if x.size == 0:
      continue
    x2 = x.reshape(-1, K)
    lay = SW if xfmt in ops.mx.WEIGHT_FORMATS else "rowmajor"
    xd = np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x2, xfmt, layout=lay)), np.float64)
    ref = xd @ wd.T + bias.astype(np.float64)
    assert relerr(np.asarray(y).reshape(-1, N), ref) < TOL, shape


@pytest.mark.parametrize("wfmt", ["fp8_channel", "fp8_128x128", "mxfp8"])
def test_dot_quantized_x_ranks(wfmt):
  rng = np.random.default_rng(5)
  xfmt = {"fp8_channel": "fp8_channel", "fp8_128x128": "fp8_1x128", "mxfp8": "mxfp8"}[wfmt]
  lay = SW if wfmt == "mxfp8" else "rowmajor"
  wq = jax_gmma.quantize(rng.standard_normal((N, K)).astype(np.float32), wfmt, layout=lay)
  xq = jax_gmma.quantize(rng.standard_normal((7, K)).astype(np.float32), xfmt, layout=lay)
  y = jax_gmma.dot(xq, wq, out_dtype=jnp.float32)
  ref = np.asarray(jax_gmma.dequantize(xq), np.float64) @ np.asarray(jax_gmma.dequantize(wq), np.float64).T
  assert y.shape == (7, N) and relerr(y, ref) < TOL


def test_dot_one_dim_fp8_tensor_x():
  rng = np.random.default_rng(6)
  wq = jax_gmma.quantize(rng.standard_normal((N, K)).astype(np.float32), "fp8_tensor")
  xq = jax_gmma.quantize(rng.standard_normal((K,)).astype(np.float32), "fp8_tensor")
  y = jax_gmma.dot(xq, wq, out_dtype=jnp.float32)
  ref = np.asarray(jax_gmma.dequantize(xq), np.float64) @ np.asarray(jax_gmma.dequantize(wq), np.float64).T
  assert y.shape == (N,) and relerr(y, ref) < TOL


def test_dot_nan_scale_propagates():
  """A NaN scale (what an FP4/FP6 block with NaN/Inf holds) reaches the output as NaN in the
  rows / columns it scales; it is never replaced."""
  rng = np.random.default_rng(7)
  wq = jax_gmma.quantize(rng.standard_normal((N, K)).astype(np.float32), "fp8_channel")
  leaves, tree = jax.tree_util.tree_flatten(wq)
  wq = jax.tree_util.tree_unflatten(tree, [leaves[0], leaves[1].at[3, 0].set(jnp.nan)])
  y = np.asarray(jax_gmma.dot(rng.standard_normal((4, K)).astype(np.float32), wq))
  assert np.isnan(y[:, 3]).all() and np.isfinite(np.delete(y, 3, axis=1)).all()


def test_dot_rowmajor_mx_weight_equals_swizzled():
  rng = np.random.default_rng(8)
  w = rng.standard_normal((N, K)).astype(np.float32)
  x = rng.standard_normal((3, K)).astype(np.float32)
  for fmt in ops.mx.WEIGHT_FORMATS:
    a = jax.jit(jax_gmma.dot)(x, jax_gmma.quantize(w, fmt))
    b = jax.jit(jax_gmma.dot)(x, jax_gmma.quantize(w, fmt, layout=SW))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("wfmt,layout,xfmt", WEIGHTS, ids=[f"{w}-{lay}" for w, lay, _ in WEIGHTS])
def test_grad_wrt_quantized_weight_has_no_nan(wfmt, layout, xfmt):
  rng = np.random.default_rng(9)
  wq = jax_gmma.quantize(rng.standard_normal((N, K)).astype(np.float32), wfmt, layout=layout)
  x = rng.standard_normal((3, K)).astype(np.float32)
  gx, gw = jax.grad(lambda x, w: jax_gmma.dot(x, w).sum(), argnums=(0, 1), allow_int=True)(x, wq)
  assert np.isfinite(np.asarray(gx)).all()
  for leaf in jax.tree_util.tree_leaves(gw):
    if leaf.dtype == jax.dtypes.float0:
      continue
    v = np.asarray(leaf.astype(jnp.float32))
    assert not np.isnan(v).any(), (leaf.dtype, leaf.shape)
    if leaf.dtype == jnp.float8_e8m0fnu:  # no zero in E8M0: its smallest value, byte 0x00
      assert (np.asarray(jax.lax.bitcast_convert_type(leaf, jnp.uint8)) == 0).all()
    else:
      assert (v == 0).all()
  # dx is g @ dequantize(w) (one bf16 GEMM; the weight exact in bf16 for most formats)
  ref = np.ones((3, N)) @ np.asarray(jax_gmma.dequantize(wq), np.float64)
  assert relerr(gx, ref) < 1e-2


def test_grad_of_empty_x():
  wq = jax_gmma.quantize(np.random.default_rng(10).standard_normal((N, K)).astype(np.float32), "mxfp8")
  g = jax.grad(lambda x: jax_gmma.dot(x, wq).sum())(jnp.ones((0, K)))
  assert g.shape == (0, K)


# -- scaled_matmul ---------------------------------------------------------------------------------

def _gemm_eqns(jaxpr):
  """Equations of jax_gmma GEMM primitives in a jaxpr, sub-jaxprs (scan, pjit, custom_vjp, ...)
  included."""
  names = {op.p.name for op in primitive.OPS.values() if "gemm" in op.p.name}
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in names:
      out.append(eqn)
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          out += _gemm_eqns(inner)
  return out


def _count_gemms(jaxpr):
  return len(_gemm_eqns(jaxpr))


def _sm_operands(fmt, b, m=16, n=32, k=K, seed=0):
  rng = np.random.default_rng(seed)
  a = jax_gmma.quantize(rng.standard_normal((b, m, k)).astype(np.float32), fmt)
  w = jax_gmma.quantize(rng.standard_normal((b, n, k)).astype(np.float32), fmt)
  return a.data, w.data, a.scales, w.scales


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8_1x128"])
def test_scaled_matmul_one_traced_gemm_for_a_batch(fmt):
  ops_ = _sm_operands(fmt, 64, m=4, n=8, k=128)
  jaxpr = jax.make_jaxpr(jax_gmma.scaled_matmul)(*ops_)
  assert _count_gemms(jaxpr.jaxpr) == 1


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8_1x128"])
@pytest.mark.parametrize("b", [1, 3])
def test_scaled_matmul_against_float64(fmt, b):
  lhs, rhs, ls, rs = _sm_operands(fmt, b, seed=b)
  y = jax.jit(jax_gmma.scaled_matmul)(lhs, rhs, ls, rs)
  bs = K // ls.shape[-1]
  deq = lambda x, s: np.asarray(x, np.float64) * np.repeat(np.asarray(s.astype(jnp.float32), np.float64), bs, -1)
  ref = np.einsum("bmk,bnk->bmn", deq(lhs, ls), deq(rhs, rs))
  assert y.shape == (b, 16, 32) and y.dtype == jnp.float32 and relerr(y, ref) < TOL


@pytest.mark.parametrize("cut", [0, 1, 2])
def test_scaled_matmul_zero_size(cut):
  lhs, rhs, ls, rs = _sm_operands("mxfp8", 2)
  if cut == 0:
    lhs, rhs, ls, rs = lhs[:0], rhs[:0], ls[:0], rs[:0]
  elif cut == 1:
    lhs, ls = lhs[:, :0], ls[:, :0]
  else:
    rhs, rs = rhs[:, :0], rs[:, :0]
  y = jax.jit(lambda *a: jax_gmma.scaled_matmul(*a, preferred_element_type=jnp.bfloat16))(lhs, rhs, ls, rs)
  assert y.shape == (lhs.shape[0], lhs.shape[1], rhs.shape[1]) and y.dtype == jnp.bfloat16


def test_scaled_matmul_int_preferred_type_refused_even_with_reference():
  with jax_gmma.allow_reference():
    with pytest.raises(TypeError, match="preferred_element_type must be a floating dtype"):
      jax_gmma.scaled_matmul(*_sm_operands("fp8_1x128", 1), preferred_element_type=jnp.int32)


# -- fp8_linear ----------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe", ["tensor", "blockwise"])
def test_fp8_linear_ranks(recipe):
  rng = np.random.default_rng(11)
  w = rng.standard_normal((N, K)).astype(np.float32)
  for shape in SHAPES:
    x = rng.standard_normal(shape).astype(np.float32)
    y = jax_gmma.fp8_linear(x, w, recipe=recipe)
    assert y.shape == shape[:-1] + (N,)
    dx, dw = jax.grad(lambda x, w: jax_gmma.fp8_linear(x, w, recipe=recipe).sum(), argnums=(0, 1))(x, w)
    assert dx.shape == x.shape and dw.shape == w.shape and np.isfinite(np.asarray(dw)).all()
    if x.size:
      assert relerr(np.asarray(y).reshape(-1, N), x.reshape(-1, K).astype(np.float64) @ w.T.astype(np.float64)
                    ) < 0.1  # two e4m3 roundings
    else:
      assert not np.asarray(dw).any()


# -- errors at lowering time name the caller (Hopper faked on CPU) ------------------------------

def _gemm_eqn(fn, *args):
  eqns = _gemm_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
  assert len(eqns) == 1
  return eqns[0]


@pytest.mark.parametrize("fn,who", [(lambda x, w: jax_gmma.dot(x, w), "jax_gmma.dot"),
                                    (lambda x, w: jax_gmma.mx_gemm(
                                        jax_gmma.quantize(x, "nvfp4", layout=SW), w), "jax_gmma.mx_gemm")])
def test_kernel_unavailable_names_the_caller(fake_hopper, fn, who):
  wq = jax_gmma.quantize(np.random.default_rng(12).standard_normal((N, K)).astype(np.float32), "nvfp4",
                         layout=SW)
  eqn = _gemm_eqn(fn, jnp.ones((4, K), jnp.float32), wq)
  with pytest.raises(jax_gmma.KernelUnavailable, match=rf"^{who}: format nvfp4 x nvfp4 on sm_90a"):
    mx.MX_GEMM.cuda_lowering(None, **eqn.params)
  if who == "jax_gmma.dot":
    with pytest.raises(jax_gmma.KernelUnavailable, match=r"x in nvfp4, weight w in nvfp4"):
      mx.MX_GEMM.cuda_lowering(None, **eqn.params)


def test_hopper_mxfp8_dot_takes_a_rowmajor_weight(fake_hopper):
  """On Hopper (faked) dot on a row-major MXFP8 weight has a kernel: dot converts the layout."""
  wq = jax_gmma.quantize(np.random.default_rng(13).standard_normal((N, K)).astype(np.float32), "mxfp8")
  eqn = _gemm_eqn(lambda x, w: jax_gmma.dot(x, w), jnp.ones((4, K), jnp.float32), wq)
  assert mx._kernel_missing(None, eqn.params) is None
  assert eqn.params[primitive.CALLER] == ("dot", "x", "w")


def test_tensorwise_kernel_unavailable_names_dot(monkeypatch):
  class Dev:
    compute_capability = "10.0"
    device_kind = "NVIDIA B200"
  monkeypatch.setattr(_backend, "kernels_built", lambda: True)
  monkeypatch.setattr(_backend, "built_archs", lambda: ["sm_90a"])
  monkeypatch.setattr(_backend, "cuda_devices", lambda: [Dev()])
  wq = jax_gmma.quantize(np.random.default_rng(14).standard_normal((N, K)).astype(np.float32), "fp8_channel")
  eqn = _gemm_eqn(lambda x, w: jax_gmma.dot(x, w), jnp.ones((4, K), jnp.float32), wq)
  with pytest.raises(jax_gmma.KernelUnavailable, match=r"^jax_gmma.dot: no fp8_gemm kernel"):
    primitive.OPS["jax_gmma_fp8_gemm"].cuda_lowering(None, **eqn.params)


# -- the bad-input cases of this area ------------------------------------------------------------

@pytest.mark.parametrize("case_id", sorted(_bad_inputs_dot.CASES))
def test_bad_input_is_refused(case_id):
  case = _bad_inputs_dot.CASES[case_id]
  with pytest.raises(case.error) as info:
    case.call()
  msg = str(info.value)
  assert msg.startswith("jax_gmma."), msg
  for name in case.names:
    assert name in msg, f"{case_id}: message does not name {name!r}: {msg}"
