"""Blackwell block-scaled MX / NVFP4 GEMMs (jax_gmma.mx): shape rules and their messages, the
reference path (from the kernels' packed / swizzled operand form) against float64 NumPy, the
arch dispatch with a faked compute capability, and -- when the extension was built with
100a/120a -- host-side can_implement / workspace. Runs on CPU."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_gmma
from jax_gmma import _backend
from jax_gmma.ops import mx


@pytest.fixture
def reference_path(cpu_device):
  """These tests check the reference maths (what every backend runs without a kernel), so they
  run on the CPU device (conftest's cpu_device): on an H200, mx_gemm would otherwise run the
  Hopper MXFP8 kernel (tests/test_gpu_mx_sm90.py). On a GPU without MX kernels the reference
  path also needs the documented opt-in, or mx_gemm refuses."""
  with jax_gmma.allow_reference():
    yield


PAIRS = [("mxfp8", "mxfp8", 64), ("mxfp6_e2m3", "mxfp6_e2m3", 128), ("mxfp6_e3m2", "mxfp6_e3m2", 256),
         ("mxfp8", "mxfp4", 128), ("mxfp4", "mxfp4", 96), ("nvfp4", "nvfp4", 64)]
SW = "sm100_128x4"


def _q(shape, fmt, seed=0, scale=1.0, **kw):
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
  return jax_gmma.quantize(x, fmt, layout=SW, **kw)


@pytest.mark.usefixtures("reference_path")
@pytest.mark.parametrize("fa,fb,k", PAIRS)
@pytest.mark.parametrize("out", [jnp.float32, jnp.bfloat16])
def test_reference_matches_float64(fa, fb, k, out):
  aq, bq = _q((5, k), fa, 1), _q((136, k), fb, 2, scale=3.0)
  bias = np.linspace(-1, 1, 136).astype(np.float32)
  got = jax.jit(lambda a, b, c: mx.mx_gemm(a, b, bias=c, out_dtype=out))(aq, bq, bias)
  assert got.shape == (5, 136) and got.dtype == jnp.dtype(out)
  want = mx.reference_float64(aq, bq, bias=np.asarray(jnp.asarray(bias).astype(out)).astype(np.float64))
  tol = 1e-5 if out == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.usefixtures("reference_path")
def test_rows_past_128_and_batched_activations():
  # > 128 rows (two scale atoms) and leading dims with 128-row batch entries.
  aq, bq = _q((2, 128, 64), "mxfp8", 3), _q((264, 64), "mxfp8", 4)
  got = mx.mx_gemm(aq, bq, out_dtype=jnp.float32)
  assert got.shape == (2, 128, 264)
  np.testing.assert_allclose(np.asarray(got).reshape(256, 264), mx.reference_float64(aq, bq), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.usefixtures("reference_path")
def test_float16_output_and_nvfp4_global_scale_used():
  aq, bq = _q((3, 32), "nvfp4", 5, scale=100.0), _q((8, 32), "nvfp4", 6, scale=0.01)
  assert float(aq.global_scale) != 1.0
  got = mx.mx_gemm(aq, bq, out_dtype=jnp.float16)
  assert got.dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(got, np.float64), mx.reference_float64(aq, bq), rtol=2e-3, atol=1e-3)


@pytest.mark.usefixtures("reference_path")
def test_dot_on_mx_weights():
  x = np.random.default_rng(7).standard_normal((2, 3, 128)).astype(np.float32)
  for wfmt, xfmt in (("mxfp8", "fp8_channel"), ("mxfp4", "mxfp8"), ("nvfp4", "fp8_channel")):
    wq = _q((16, 128), wfmt, 8)
    qfmt = wfmt if xfmt == "fp8_channel" else xfmt
    # The activation's quantization comes from the same jitted program as dot's. (On the H200
    # this once failed: XLA's excess-precision folding let dot see unrounded activations; quantize
    # now ends in an optimization barrier, see test_quantize.py.)
    y, xq = jax.jit(lambda a, w: (jax_gmma.dot(a, w, x_format=xfmt),
                                  jax_gmma.quantize(a.reshape(6, 128), qfmt, layout=SW)))(x, wq)
    assert y.shape == (2, 3, 16) and y.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(y).reshape(6, 16), mx.reference_float64(xq, wq), rtol=1e-5,
                               atol=1e-5)
  with pytest.raises(ValueError, match="x_format must be one of"):
    jax_gmma.dot(x, _q((16, 128), "mxfp8"), x_format="fp8_tensor")


# -- shape rules: every message ----------------------------------------------------------------

@pytest.mark.usefixtures("reference_path")
def test_shape_rule_messages():
  a, b = _q((4, 64), "mxfp8"), _q((16, 64), "mxfp8")
  with pytest.raises(TypeError, match="a_q must be a jax_gmma.QuantizedArray"):
    mx.mx_gemm(np.zeros((4, 64)), b)
  with pytest.raises(ValueError, match="b_q has format 'fp8_channel'"):
    mx.mx_gemm(a, jax_gmma.quantize(np.ones((16, 64), np.float32), "fp8_channel"))
  with pytest.raises(ValueError, match=r"a_q scales are in layout 'rowmajor'.*layout='sm100_128x4'"):
    mx.mx_gemm(jax_gmma.quantize(np.ones((4, 64), np.float32), "mxfp8"), b)
  with pytest.raises(ValueError, match="must share the scale block: nvfp4"):
    mx.mx_gemm(_q((4, 64), "nvfp4"), b)
  with pytest.raises(ValueError, match=r"b_q must be a 2-D \(N, K\) operand"):
    mx.mx_gemm(a, _q((2, 16, 64), "mxfp8"))
  with pytest.raises(ValueError, match="contraction mismatch: a_q has K=64, b_q has K=96"):
    mx.mx_gemm(a, _q((16, 96), "mxfp8"))
  with pytest.raises(ValueError, match="needs rows .* multiple of 128"):
    mx.mx_gemm(_q((2, 4, 64), "mxfp8"), b)
  with pytest.raises(ValueError, match="K=64 .* must be a multiple of 128 for mxfp6_e2m3 x mxfp6_e2m3"):
    mx.mx_gemm(_q((4, 64), "mxfp6_e2m3"), _q((16, 64), "mxfp6_e2m3"))
  with pytest.raises(ValueError, match="multiple of 128 for mxfp8 x mxfp4"):
    mx.mx_gemm(a, _q((16, 64), "mxfp4"))
  with pytest.raises(TypeError, match="out_dtype must be bfloat16, float16 or float32"):
    mx.mx_gemm(a, b, out_dtype=jnp.int32)
  with pytest.raises(ValueError, match="N=12 must be a multiple of 8 for bfloat16"):
    mx.mx_gemm(a, _q((12, 64), "mxfp8"))
  mx.mx_gemm(a, _q((12, 64), "mxfp8"), out_dtype=jnp.float32)  # 4 suffices for float32
  with pytest.raises(ValueError, match=r"bias must have shape \(N,\) = \(16,\)"):
    mx.mx_gemm(a, b, bias=np.zeros(8))
  with pytest.raises(TypeError, match="bias must be floating point"):
    mx.mx_gemm(a, b, bias=np.zeros(16, np.int32))


def test_k_alignment_table():
  assert mx.k_alignment("mxfp8", "mxfp8") == 32
  assert mx.k_alignment("mxfp4", "mxfp4") == 32
  assert mx.k_alignment("nvfp4", "nvfp4") == 32
  assert mx.k_alignment("mxfp8", "mxfp4") == 128
  assert mx.k_alignment("mxfp6_e3m2", "mxfp6_e3m2") == 128


def test_kernel_operand_form():
  # fp4 packs 2 per byte, fp6 4 per 3 bytes; scale bytes are the swizzled tensor, flat.
  for fmt, k, nbytes in (("mxfp4", 64, 32), ("mxfp6_e2m3", 128, 96), ("mxfp8", 64, 64)):
    q = _q((3, k), fmt)
    p = mx.pack_data(q, 3)
    assert p.shape == (3, nbytes)
    assert mx.sf_bytes(q).shape == (128 * 4,) and mx.sf_bytes(q).dtype == jnp.uint8


# -- dispatch with a faked GPU -----------------------------------------------------------------

def _problem(fa="mxfp8", fb="mxfp8", m=256, n=4096, a_dtype=None):
  aq, bq = _q((4, 128), fa, dtype=a_dtype), _q((16, 128), fb)
  p = mx.mx_problem(aq, bq)
  import dataclasses
  return dataclasses.replace(p, m=m, n=n)


@pytest.fixture
def fake_build(monkeypatch):
  def set_archs(archs):
    monkeypatch.setattr(_backend, "kernels_built", lambda: True)
    monkeypatch.setattr(_backend, "built_archs", lambda: list(archs))
  return set_archs


def test_dispatch_arch_map(fake_build):
  fake_build(["sm_90a", "sm_100a", "sm_120a"])
  p = _problem()
  assert mx.arch_for_cc("10.0") == "sm_100a" and mx.arch_for_cc("12.0") == "sm_120a"
  assert mx.unavailable_reason(p, "10.0") is None
  assert mx.unavailable_reason(p, "12.0") is None
  assert p.pair == ("mxfp8", "mxfp8")
  assert mx.unavailable_reason(p, "9.0", "NVIDIA H200") is None  # jax-gmma's own Hopper kernel
  p4 = dataclasses.replace(p, a_format="mxfp4", b_format="mxfp4")
  arch, why = mx.unavailable_reason(p4, "9.0", "NVIDIA H200")
  assert arch == "sm_90a" and "Hopper has no MX/NVFP4 block-scaled" in why and "mxfp4 x mxfp4" in why
  arch, why = mx.unavailable_reason(p, "10.3")
  assert arch is None and "sm_100a (compute capability 10.0) and sm_120a (12.0)" in why
  arch, why = mx.unavailable_reason(p, "8.9")
  assert "no mxfp8 x mxfp8 kernel for compute capability 8.9" in why


def test_dispatch_missing_arch_and_pair(fake_build):
  fake_build(["sm_90a"])
  arch, why = mx.unavailable_reason(_problem(), "10.0")
  assert arch == "sm_100a" and "no sm_100a kernels" in why and 'JAX_GMMA_CUDA_ARCHS="90a;100a;120a"' in why
  fake_build(["sm_90a", "sm_100a", "sm_120a"])
  arch, why = mx.unavailable_reason(_problem("mxfp6_e3m2", "mxfp6_e3m2"), "12.0")
  assert arch == "sm_120a" and "no sm_120a kernel for mxfp6_e3m2 x mxfp6_e3m2" in why
  arch, why = mx.unavailable_reason(_problem(a_dtype=jnp.float8_e5m2), "10.0")
  assert "float8_e5m2 x float8_e4m3fn" in why


def test_dispatch_no_extension(monkeypatch):
  monkeypatch.setattr(_backend, "kernels_built", lambda: False)
  arch, why = mx.unavailable_reason(_problem(), "10.0")
  assert "installed without CUDA kernels" in why


def test_refuse_message_and_opt_in(fake_build):
  fake_build(["sm_90a"])
  p = _problem("nvfp4", "nvfp4")
  with pytest.raises(jax_gmma.KernelUnavailable,
                     match=r"jax_gmma.mx_gemm: format nvfp4 x nvfp4 on sm_90a: .*JAX_GMMA_ALLOW_REFERENCE=1"):
    raise _backend.unavailable("mx_gemm", mx.refusal_reason(p, *mx.unavailable_reason(p, "9.0")))


def test_cuda_lowering_raises_on_hopper_and_opts_in(monkeypatch, fake_build):
  """The CUDA lowering's decision with a faked H200 (compute capability 9.0) for a pair
  without a Hopper kernel (MXFP4; MXFP8 x MXFP8 has one)."""
  fake_build(["sm_90a"])

  class Dev:
    compute_capability = "9.0"
    device_kind = "NVIDIA H200"
    core_count = 132
  monkeypatch.setattr(_backend, "cuda_devices", lambda: [Dev()])
  p = _problem("mxfp4", "mxfp4")
  with pytest.raises(jax_gmma.KernelUnavailable, match="format mxfp4 x mxfp4 on sm_90a"):
    mx.MX_GEMM.cuda_lowering(None, problem=p, config=None, path=None)
  called = {}
  monkeypatch.setattr(mx.mlir, "lower_fun", lambda f, multiple_results: (lambda ctx, *a, **k: called.setdefault("ref", f)))
  with jax_gmma.allow_reference():
    mx.MX_GEMM.cuda_lowering(None, problem=p, config=None, path=None)
  assert called["ref"] is mx.MX_GEMM.reference
  # MXFP8 from SM90_DEQUANT_MIN_M rows: the exact bf16 path; below: the kernel (not faked here).
  called.clear()
  big = _problem(m=mx.SM90_DEQUANT_MIN_M)
  mx.MX_GEMM.cuda_lowering(None, problem=big, config=None, path=None)
  assert called["ref"] is mx._dequant_lowering


def test_select_config():
  p = _problem(m=4096, n=4096)
  assert mx.select_config("sm_100a", p, 148).endswith("_2sm")
  assert mx.select_config("sm_100a", _problem(m=64, n=4096), 148).endswith("_1sm")
  assert mx.select_config("sm_100a", _problem(m=256, n=256), 148).endswith("_1sm")  # 2 tiles < 74 pairs
  assert mx.select_config("sm_120a", p, 84).startswith("sm120_")
  with pytest.raises(ValueError, match="is not a sm_120a kernel for mxfp8 x mxfp8"):
    mx.select_config("sm_120a", p, 84, config="sm100_mxfp8xmxfp8_128x128x128_1sm")
  # Hopper MXFP8: decode (swap) configs by token count, 64-row weight tiles up to N = 16384
  # (one CTA per SM, 16 stages, while they make at most one wave: N <= 64 x 132 = 8448, M <= 32),
  # the 128 x 128 tile from M = 65 (small N: from M = 129).
  pick = lambda m, n, sms=132: mx.select_config("sm_90a", _problem(m=m, n=n), sms)  # noqa: E731
  pre = "sm90_mxf8_blockscaled_"
  assert pick(1, 28672) == pick(16, 16400) == pre + "swap_128x16"
  assert pick(5, 8192) == pick(16, 8448) == pick(9, 4112) == pre + "swap_64x16_deep"
  # a few tokens at small N: the weight-streaming kernel, more warps along K for fewer strips
  st = "sm90_mxf8_stream_16x8_kw"
  assert pick(1, 8192) == pick(4, 7168) == pick(4, 4112) == st + "4"
  assert pick(1, 4096) == pick(8, 2128) == pick(5, 4096) == st + "8"
  assert pick(1, 2112) == pick(8, 16) == pick(3, 1000) == st + "16"
  # 16-token tiles: up to 16 tokens at N <= 4096, up to 32 at N <= 2304
  assert pick(9, 4096) == pick(16, 2112) == pick(16, 16) == "sm90_mxf8_stream_16x16_kw8"
  assert pick(17, 2112) == pick(32, 2304) == pick(32, 16) == "sm90_mxf8_stream_16x16_kw4"
  assert pick(1, 8200) == pick(5, 4112) == pick(16, 4112) == pre + "swap_64x16_deep"
  assert pick(1, 8512) == pick(16, 16384) == pick(16, 8192, 114) == pre + "swap_64x16"
  assert pick(17, 28672) == pick(32, 28672) == pre + "swap_128x32"
  assert pick(17, 8192) == pick(32, 2320) == pick(32, 4096) == pre + "swap_64x32_deep"
  assert pick(17, 8512) == pick(32, 16384) == pre + "swap_64x32"
  assert pick(33, 28672) == pick(64, 28672) == pre + "swap_128x64"
  assert pick(33, 8192) == pick(64, 8192) == pre + "swap_64x64"
  assert pick(65, 8192) == pick(128, 16384) == pre + "swap_128x64"
  assert pick(65, 28672) == pick(129, 8192) == pick(4096, 4096) == pre + "128x128"
  for m in (1, 16, 17, 32, 33, 64, 65, 128, 129, 4096):  # every pick is a registered config
    for n in (16, 2112, 2320, 4096, 8192, 8512, 16384, 16400, 28672):
      assert pick(m, n) in mx.KERNELS["sm_90a"][("mxfp8", "mxfp8")]
  assert mx.select_config("sm_90a", p, 132, config="sm90_mxf8_blockscaled_swap_128x64").endswith("x64")
  e5 = _problem(m=16, a_dtype=jnp.float8_e5m2)
  assert mx.kernel_configs("sm_90a", e5) == ()  # e4m3 elements only


def test_kernel_names_match_the_cuda_sources():
  import pathlib
  root = pathlib.Path(__file__).resolve().parents[1] / "cpp"
  src = {"sm_100a": (root / "sm100_mx_gemm_blockscaled.cuh").read_text(),
         "sm_120a": (root / "sm120_mx_gemm_blockscaled.cuh").read_text(),
         "sm_90a": (root / "sm90_mxf8_gemm_blockscaled.cu").read_text()
         + (root / "sm90_mxf8_gemm_blockscaled_stream.cu").read_text()}
  for arch, pairs in mx.KERNELS.items():
    pat = r'"(sm90_mxf8_[a-z0-9_]+)"' if arch == "sm_90a" else r'"(sm1[02]0_[a-z0-9_]+)"'
    names = set(re.findall(pat, src[arch]))
    listed = {n for ns in pairs.values() for n in ns}
    assert listed == names, (arch, listed ^ names)


def test_info_lists_mx_paths():
  from jax_gmma import info
  text = info.info_text()
  assert "mxfp8 x mxfp4 (mx_gemm)" in text and "nvfp4 x nvfp4 (mx_gemm)" in text


# -- host-side checks through the built extension ----------------------------------------------

def _ext_with(arch):
  e = _backend.ext()
  if e is None or not e.cuda_built():
    pytest.skip("jax_gmma extension not built with CUDA kernels (source tree / no nvcc)")
  if arch not in _backend.built_archs():
    pytest.skip(f"library built without {arch} (built: {_backend.built_archs()}); "
                "build with JAX_GMMA_CUDA_ARCHS=\"90a;100a;120a\"")
  return e


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_host_can_implement_and_workspace(arch):
  e = _ext_with(arch)
  names = {k["config"]: k for k in e.kernels() if k.get("arch") == int(arch[3:-1])}
  for pair, configs in mx.KERNELS[arch].items():
    for cfg in configs:
      assert cfg in names, cfg
      k = names[cfg]
      vec = 16 if pair[0] == "nvfp4" else 32
      err, ws = e.check_blockscaled(cfg, k["a"], k["b"], "bfloat16", 256, 512, 1024, vec, 148, True,
                                    vec == 16)
      assert err is None and ws >= 0, (cfg, err)
      err, _ = e.check_blockscaled(cfg, k["a"], k["b"], "bfloat16", 256, 512, 1000, vec, 148, False, False)
      assert err is not None, cfg  # K not a multiple of the alignment
  err, _ = e.check_blockscaled("blockwise_1d2d_128x128x128_c1x1_coop", "float8_e4m3fn", "float8_e4m3fn",
                               "bfloat16", 128, 128, 128, 32, 132, False, False)
  assert "not an MX / NVFP4 block-scaled kernel" in err


def test_path_rule_and_dequant_path():
  """mx_gemm's path: automatic "dequant" on Hopper from SM90_DEQUANT_MIN_M rows (MXFP8 only);
  path="dequant" (exact bf16 operands, float32 accumulation) anywhere, checked against float64."""
  big, small = _problem(m=mx.SM90_DEQUANT_MIN_M), _problem(m=mx.SM90_DEQUANT_MIN_M - 1)
  assert mx.resolve_path("sm_90a", big, None) == "dequant"
  assert mx.resolve_path("sm_90a", small, None) == "kernel"
  assert mx.resolve_path("sm_100a", big, None) == "kernel"
  assert mx.resolve_path("sm_90a", dataclasses.replace(big, a_format="mxfp4", b_format="mxfp4"), None) == "kernel"
  assert mx.resolve_path(None, big, "dequant") == "dequant"
  with pytest.raises(ValueError, match="path must be one of"):
    mx.resolve_path("sm_90a", big, "fast")
  rng = np.random.default_rng(3)
  for fmt in ("mxfp8", "nvfp4", "mxfp6_e2m3"):
    x = rng.normal(size=(5, 256)) * 2.0 ** rng.integers(-6, 6, (5, 8, 1)).repeat(32, 1).reshape(5, 256)
    w = rng.normal(size=(16, 256))
    a_q = jax_gmma.quantize(jnp.asarray(x, jnp.float32), fmt, layout="sm100_128x4")
    b_q = jax_gmma.quantize(jnp.asarray(w, jnp.float32), fmt, layout="sm100_128x4")
    bias = rng.normal(size=(16,)).astype(np.float32)
    out = jax.jit(lambda a, b, c: jax_gmma.mx_gemm(a, b, bias=c, out_dtype=jnp.float32, path="dequant"))(
        a_q, b_q, bias)
    ref = mx.reference_float64(a_q, b_q, bias)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 1e-5, fmt
  with pytest.raises(ValueError, match="path must be one of"):
    jax_gmma.mx_gemm(a_q, b_q, path="bf16")
