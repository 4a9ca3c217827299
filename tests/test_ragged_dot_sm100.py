"""jax_gmma.ragged_dot on Blackwell (sm_100a): the grouped block-scaled kernels of
cpp/sm100_mx_gemm_grouped_blockscaled.cu for MXFP8, NVFP4 and MXFP4 experts (QuantizedArrays, x in
the same format). No Blackwell GPU exists here: these CPU tests check the reference on those
experts, a NumPy model of the kernels' operand contract (ffi/grouped_ffi.cc,
jax_gmma_mx_grouped_gemm) and of their scale re-layout, the workspace rule, the CUDA lowering
under a faked B200 (the FFI call, its attributes and operands, the refusals and their messages),
and -- where the extension was built with sm_100a -- the host checks of the compiled kernels."""
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import export

import jax_gmma
from jax_gmma import _backend, info
from jax_gmma.ops import grouped
from jax_gmma.ops import grouped_configs as gc

ROOT = pathlib.Path(__file__).resolve().parents[1]
G, N, K, M = 4, 64, 256, 40
SIZES = (9, 0, 17, 6)  # an empty expert, 8 rows past the total
FORMATS = ("mxfp8", "nvfp4", "mxfp4")
TARGET = "jax_gmma_mx_grouped_gemm"
NAMES = {gc.sm100_kernel_name(c) for f in FORMATS for c in gc.SM100_CONFIGS[f]}


def _name(fmt, two_sm=False):
  return gc.sm100_kernel_name(gc.SM100_CONFIGS[fmt][int(two_sm)])


def _inputs(fmt, seed=0, m=M, k=K, n=N, stacked=False):
  rng = np.random.default_rng(seed)
  w = (rng.standard_normal((G, n, k)) * (1 + np.arange(G)).reshape(G, 1, 1)).astype(np.float32)
  x = rng.standard_normal((m, k)).astype(np.float32)
  bias = rng.standard_normal((G, n)).astype(np.float32)
  wq = (jax.vmap(lambda e: jax_gmma.quantize(e, fmt, layout="sm100_128x4"))(jnp.asarray(w)) if stacked
        else jax_gmma.quantize(jnp.asarray(w), fmt))
  return x, w, wq, bias


def _ref64(x, w, sizes, bias=None, row0=0):
  """float64: row i (global row row0 + i) gets x[i] @ w[g].T (+ bias[g]) for its expert g."""
  out = np.zeros((x.shape[0], w.shape[1]))
  end = np.cumsum(sizes)
  for e in range(len(sizes)):
    lo, hi = max(end[e] - sizes[e] - row0, 0), min(end[e] - row0, x.shape[0])
    for i in range(lo, hi):
      out[i] = x[i] @ w[e].T + (0 if bias is None else bias[e])
  return out


# -- the reference on block-scaled experts (every platform without the kernel) -------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("stacked", (False, True))
def test_reference_on_block_scaled_experts(fmt, stacked):
  """x is quantized to w's format; the result is the float64 product of the dequantized
  operands, per expert, rows past the total zero (one (G, N, K) quantization, or vmapped experts
  with swizzled scales and, for NVFP4, one global scale each)."""
  x, _, wq, bias = _inputs(fmt, stacked=stacked)
  y = jax.jit(lambda x, w, s, b: jax_gmma.ragged_dot(x, w, s, bias=b, out_dtype=jnp.float32))(
      x, wq, jnp.asarray(SIZES, jnp.int32), bias)
  xd = np.asarray(jax_gmma.quantize(x, fmt).dequantize(), np.float64)
  ref = _ref64(xd, np.asarray(grouped.dequantized_w(wq), np.float64), SIZES, bias)
  np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
  assert not np.asarray(y[sum(SIZES):]).any()


def test_quantized_x_must_match_the_weights_format():
  x, _, wq, _ = _inputs("nvfp4")
  y = jax_gmma.ragged_dot(jax_gmma.quantize(x, "nvfp4", layout="sm100_128x4"), wq, SIZES)
  assert y.dtype == jnp.bfloat16 and y.shape == (M, N)
  with pytest.raises(ValueError, match=r"^jax_gmma.ragged_dot: x has format 'mxfp8', which cannot "
                                       r"multiply nvfp4 expert weights; use nvfp4"):
    jax_gmma.ragged_dot(jax_gmma.quantize(x, "mxfp8"), wq, SIZES)
  with pytest.raises(ValueError, match=r"^jax_gmma.ragged_dot: x_format must be None or one of "
                                       r"\('nvfp4',\) for nvfp4 expert weights"):
    jax_gmma.ragged_dot(x, wq, SIZES, x_format="mxfp8")


# -- the kernels' operand contract, as a NumPy model ------------------------------------------------

def _word_offset(r, j, k_atoms):
  """gemm_api.h's mx_sf_word_offset: byte offset of row r's word of K blocks 4j .. 4j + 3."""
  return ((r >> 7) * k_atoms + j) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4


def _scales(sf, rows, kb, vec, base=0):
  """(rows, kb) float64 from swizzled scale-factor bytes: E4M3 (vec 16) or E8M0 (vec 32)."""
  k_atoms = -(-kb // 4)
  codes = np.array([[sf[base + _word_offset(r, b // 4, k_atoms) + b % 4] for b in range(kb)]
                    for r in range(rows)], np.uint8)
  if vec == 16:
    return codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
  return np.where(codes == 255, np.nan, 2.0 ** (codes.astype(np.float64) - 127))


def _elements(a, k):
  """(rows, K) float64 from the kernel's element operand: fp8, or FP4 packed 2 per byte (element
  2i in the low nibble of byte i)."""
  a = np.asarray(a)
  if a.dtype != np.uint8:
    return a.astype(np.float64)
  lo, hi = a & 0xF, a >> 4
  codes = np.stack([lo, hi], -1).reshape(a.shape[0], -1)[:, :k]
  return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def _model(fmt, a, b, sa, sb, ga, gb, sizes, k, bias=None, row0=0):
  """What the sm100 grouped kernel computes from its operands (float64), by its contract."""
  vec = 16 if fmt == "nvfp4" else 32
  kb = k // vec
  sa, sb = np.asarray(sa), np.asarray(sb)
  m, g, n = a.shape[0], b.shape[0], b.shape[1]
  per = sb.size // g
  assert sa.size == -(-m // 128) * 128 * -(-kb // 4) * 4 and per == -(-n // 128) * 128 * -(-kb // 4) * 4
  xs = _elements(a, k) * np.repeat(_scales(sa, m, kb, vec), vec, axis=1)
  ws = [_elements(b[e], k) * np.repeat(_scales(sb, n, kb, vec, e * per), vec, axis=1) for e in range(g)]
  alpha = np.asarray(ga, np.float64)[0] * np.asarray(gb, np.float64)
  out = np.zeros((m, n))
  end = np.cumsum(sizes)
  for e in range(g):
    lo, hi = max(end[e] - sizes[e] - row0, 0), min(end[e] - row0, m)
    for i in range(lo, hi):
      out[i] = alpha[e] * (ws[e] @ xs[i]) + (0 if bias is None else bias[e])
  return out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("stacked", (False, True))
def test_block_scaled_operands_follow_the_contract(fmt, stacked):
  x, _, wq, bias = _inputs(fmt, 1, stacked=stacked)
  xq = jax_gmma.quantize(x, fmt)
  a, b, sa, sb, ga, gb = grouped.block_scaled_operands(xq, wq)
  bits = 8 if fmt == "mxfp8" else 4
  assert a.shape == (M, K * bits // 8) and b.shape == (G, N, K * bits // 8)
  assert a.dtype == (jnp.float8_e4m3fn if fmt == "mxfp8" else jnp.uint8) and b.dtype == a.dtype
  assert sa.dtype == jnp.uint8 and sb.dtype == jnp.uint8 and ga.shape == (1,) and gb.shape == (G,)
  got = _model(fmt, a, b, sa, sb, ga, gb, np.asarray(SIZES), K, bias)
  ref = np.asarray(jax_gmma.ragged_dot(xq, wq, jnp.asarray(SIZES, jnp.int32), bias=bias,
                                       out_dtype=jnp.float32), np.float64)
  assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6
  assert not got[sum(SIZES):].any()


def test_rows_of_a_shard():
  """A shard of the rows (row_ids[0] = 10): the groups apply to the global row numbers."""
  x, _, wq, _ = _inputs("nvfp4", 2)
  xq = jax_gmma.quantize(x, "nvfp4")
  ops = grouped.block_scaled_operands(xq, wq)
  whole = _model("nvfp4", *ops, np.asarray(SIZES), K)
  part = jax_gmma.quantize(x[10:26], "nvfp4")
  # the shard quantized on its own (its own global scale): against its own dequantized rows
  got = _model("nvfp4", *grouped.block_scaled_operands(part, wq), np.asarray(SIZES), K, row0=10)
  want = _ref64(np.asarray(part.dequantize(), np.float64), np.asarray(grouped.dequantized_w(wq), np.float64),
                SIZES, row0=10)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())  # float32 dequantize
  assert got.shape == (16, N) and not got[26 - 10 + 6:].any()
  np.testing.assert_allclose(whole[10:26] != 0, got != 0)  # the same rows belong to experts


# -- the scale re-layout and the workspace rule -----------------------------------------------------

def _relayout_model(sa, sizes, row0, m, kb):
  """The setup and re-layout kernels' work on the activations' scale factors, as a model (the
  same index formulas): per expert, its first atom, M_e, and the regions' bytes."""
  k_atoms = -(-kb // 4)
  end = np.cumsum(sizes)
  regions, atom = [], 0
  for e, size in enumerate(sizes):
    lo = min(max(end[e] - size - row0, 0), m)
    hi = min(max(end[e] - row0, 0), m)
    me = 0 if min(sizes) < 0 else max(hi - lo, 0)
    regions.append((atom, me, lo))
    atom += -(-me // 128)
  out = np.full(atom * k_atoms * 512, 0xAB, np.uint8)  # the workspace: any prior bytes
  for first, me, lo in regions:
    for t in range(first, first + -(-me // 128)):
      row0_local = (t - first) * 128
      for i in range(128 * k_atoms):
        j, q = divmod(i, 128)
        r = (q % 4) * 32 + q // 4
        src = _word_offset(lo + row0_local + r, j, k_atoms)
        word = sa[src:src + 4] if row0_local + r < me else np.zeros(4, np.uint8)
        out[(t * k_atoms + j) * 512 + q * 4:][:4] = word
  return regions, out


@pytest.mark.parametrize("sizes,row0", [((9, 0, 17, 6), 0), ((130, 1, 0, 200), 0), ((300, 5, 7, 40), 100),
                                        ((3, -2, 50, 4), 0)])
def test_scale_relayout_puts_each_expert_at_an_atom(sizes, row0):
  """Expert e's region, read with the swizzled layout of an M_e-row operand (what the kernel's
  per-expert TMA descriptor reads), holds its rows' scale factors; its pad rows are zero."""
  m, kb = 300, 24
  rng = np.random.default_rng(3)
  sa = rng.integers(0, 255, -(-m // 128) * 128 * -(-kb // 4) * 4).astype(np.uint8)
  regions, out = _relayout_model(sa, sizes, row0, m, kb)
  k_atoms = -(-kb // 4)
  atoms = sum(-(-me // 128) for _, me, _ in regions)
  assert atoms <= -(-m // 128) + min(len(sizes), m)  # the workspace bound
  assert out.size <= gc.sm100_workspace_bound(m, len(sizes), kb * 32, 32)
  for first, me, lo in regions:
    region = out[first * k_atoms * 512:]
    for r in range(-(-me // 128) * 128):
      for b in range(kb):
        got = region[_word_offset(r, b // 4, k_atoms) + b % 4]
        want = sa[_word_offset(lo + r, b // 4, k_atoms) + b % 4] if r < me else 0
        assert got == want, (first, me, lo, r, b)


def test_workspace_bound_is_from_shapes_only():
  rng = np.random.default_rng(4)
  for m, g in ((1, 1), (40, 4), (1000, 64), (4096, 8), (7, 256)):
    bound = gc.sm100_workspace_bound(m, g, 7168, 16)
    for _ in range(20):
      sizes = rng.multinomial(m, rng.dirichlet(np.ones(g) * 0.3))
      atoms = sum(-(-int(s) // 128) for s in sizes)
      assert atoms * (-(-(7168 // 16) // 4)) * 512 <= bound
  assert gc.sm100_workspace_bound(256, 8, 2048, 32) == (2 + 8) * 16 * 512


# -- the CUDA lowering with a faked B200 ------------------------------------------------------------

class _FakeExt:
  """The extension as a build with the sm100 grouped kernels answers the lowering: the kernel
  table and check_grouped (recorded; an error for the configs in ``refuse``)."""

  def __init__(self, refuse=()):
    self.calls, self.refuse = [], dict(refuse)

  def cuda_built(self):
    return True

  def kernels(self):
    return [{"config": name, "arch": 100} for name in sorted(NAMES)]

  def registrations(self):
    return {}

  def check_grouped(self, *args):
    self.calls.append(args)
    name = args[0]
    return (self.refuse[name], 0) if name in self.refuse else (None, 123456)


@pytest.fixture
def blackwell(fake_blackwell, monkeypatch):
  ext = _FakeExt()
  monkeypatch.setattr(_backend, "ext", lambda: ext)
  monkeypatch.setattr(_backend, "prepare_devices", lambda: None)  # nothing to set up
  monkeypatch.setattr(_backend, "register_targets", lambda: True)  # (nothing is run)
  return ext


def _export(fn, *args):
  with jax_gmma.allow_reference(False):
    return export.export(jax.jit(fn), platforms=("cuda",),
                         disabled_checks=jax_gmma.export_disabled_checks())(*args)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out", (jnp.bfloat16, jnp.float32, jnp.float16))
def test_cuda_lowering_calls_the_sm100_grouped_kernel(blackwell, fmt, out):
  x, _, wq, bias = _inputs(fmt, 5)
  exported = _export(lambda x, w, s, b: jax_gmma.ragged_dot(x, w, s, bias=b, out_dtype=out), x, wq,
                     jnp.asarray(SIZES, jnp.int32), bias)
  text = exported.mlir_module()
  assert len(re.findall(rf"custom_call @{TARGET}\(", text)) == 1
  assert "jax_gmma_fp8_grouped_gemm" not in text and "jax_gmma_weightonly_grouped_gemm" not in text
  name = _name(fmt)  # 10 rows per expert: the 1-SM tiles
  assert name in text
  element = gc.SM100_ELEMENTS[fmt]
  kernel_out = "float32" if out in (jnp.float32, jnp.float16) else "bfloat16"
  assert blackwell.calls == [(name, element, element, kernel_out, M, N, K, G, 148, True)]
  call = text[text.index(f"custom_call @{TARGET}("):]
  call = call[:call.index("\n")]
  for attr in (f'a_dtype = "{element}"', f'b_dtype = "{element}"', f"k = {K} : i64",
               f"sf_vec = {16 if fmt == 'nvfp4' else 32} : i32", "sm_count = 148 : i32", "has_bias = true",
               f"has_global = {'true' if fmt == 'nvfp4' else 'false'}"):
    assert attr in call, (attr, call[:2000])
  bits = 8 if fmt == "mxfp8" else 4
  elem = "f8E4M3FN" if fmt == "mxfp8" else "ui8"
  for operand in (f"tensor<{M}x{K * bits // 8}x{elem}>", f"tensor<{G}x{N}x{K * bits // 8}x{elem}>",
                  f"tensor<{G}xf32>", f"tensor<{G}x{N}x{'bf16' if kernel_out == 'bfloat16' else 'f32'}>",
                  f"tensor<{G}xi32>", f"tensor<{M}xi32>", "tensor<123456xui8>"):
    assert operand in call, (operand, call[:2000])
  assert exported.out_avals[0].shape == (M, N) and exported.out_avals[0].dtype == out


def test_config_rule():
  p = lambda m, n, g: gc.GroupedProblem(m=m, n=n, k=4096, g=g, fmt="nvfp4")  # noqa: E731
  assert gc.select_sm100_config(p(40, 64, 4), 148) == gc.SM100_CONFIGS["nvfp4"][0]  # 10 rows per expert
  assert gc.select_sm100_config(p(8192, 4096, 16), 148) == gc.SM100_CONFIGS["nvfp4"][1]  # 512 rows each
  assert gc.select_sm100_config(p(2048, 4096, 16), 148) == gc.SM100_CONFIGS["nvfp4"][0]  # 128 rows each
  assert gc.select_sm100_config(p(1024, 256, 2), 148) == gc.SM100_CONFIGS["nvfp4"][0]  # 8 2-SM tiles
  for m, n, g in ((1, 8, 1), (4096, 7168, 8), (16384, 2048, 256)):
    assert gc.select_sm100_config(p(m, n, g), 148) in gc.SM100_CONFIGS["nvfp4"]


def test_cuda_lowering_picks_the_2sm_tiles_for_large_experts(blackwell):
  """4 experts of 512 rows, N = 2048 (128 2-SM tiles for 74 SM pairs): the 2-SM config; where
  the library refuses it, the 1-SM one."""
  m, n = 2048, 2048
  x, _, wq, _ = _inputs("mxfp8", 11, m=m, n=n, k=128)
  sizes = jnp.asarray((512, 512, 512, 512), jnp.int32)
  f = lambda x, w, s: jax_gmma.ragged_dot(x, w, s)  # noqa: E731
  assert _name("mxfp8", True) in _export(f, x, wq, sizes).mlir_module()
  blackwell.refuse[_name("mxfp8", True)] = "refused"
  g = lambda x, w, s: jax_gmma.ragged_dot(x, w, s)  # noqa: E731 (a new function: a new lowering)
  text = _export(g, x, wq, sizes).mlir_module()
  assert _name("mxfp8") in text and _name("mxfp8", True) not in text
  assert [c[0] for c in blackwell.calls] == [_name("mxfp8", True)] * 2 + [_name("mxfp8")]


def test_cuda_lowering_without_bias_and_with_vmapped_experts(blackwell):
  x, _, wq, _ = _inputs("nvfp4", 6, stacked=True)
  xq = jax_gmma.quantize(x, "nvfp4", layout="sm100_128x4")
  text = _export(lambda x, w, s: jax_gmma.ragged_dot(x, w, s), xq, wq,
                 jnp.asarray(SIZES, jnp.int32)).mlir_module()
  call = text[text.index(f"custom_call @{TARGET}("):]
  assert "has_bias = false" in call[:call.index("\n")]
  assert blackwell.calls[0][-1] is False


def test_cuda_lowering_refuses_what_the_kernel_cannot_take(blackwell):
  """NVFP4's K = 48 (three 16-blocks: a valid NVFP4 operand) is not a multiple of the kernels'
  32; the MX formats pad K to their 32-block themselves."""
  why = r"the sm_100a grouped kernels need K \(the stored contraction length\) a multiple of 32"
  x, _, wq, _ = _inputs("nvfp4", 7, k=48)
  args = (x, wq, jnp.asarray(SIZES, jnp.int32))
  f = lambda x, w, s: jax_gmma.ragged_dot(x, w, s)  # noqa: E731
  with pytest.raises(jax_gmma.KernelUnavailable, match=rf"^jax_gmma.ragged_dot: {why}.*JAX_GMMA_ALLOW_REFERENCE"):
    _export(f, *args)
  with jax_gmma.allow_reference(True):  # the reference, by opt-in
    text = export.export(jax.jit(f), platforms=("cuda",))(*args).mlir_module()
  assert TARGET not in text


def test_cuda_lowering_names_a_missing_build(blackwell, monkeypatch):
  x, _, wq, _ = _inputs("mxfp4", 8)
  args = (x, wq, jnp.asarray(SIZES, jnp.int32))
  monkeypatch.setattr(_backend, "built_archs", lambda: ["sm_90a"])
  with pytest.raises(jax_gmma.KernelUnavailable,
                     match=r'^jax_gmma.ragged_dot: this build of jax_gmma has no sm_100a kernels .*'
                           r'JAX_GMMA_CUDA_ARCHS="90a;100a"'):
    _export(lambda x, w, s: jax_gmma.ragged_dot(x, w, s), *args)
  monkeypatch.setattr(_backend, "built_archs", lambda: ["sm_90a", "sm_100a"])
  monkeypatch.setattr(blackwell, "kernels", lambda: [])
  with pytest.raises(jax_gmma.KernelUnavailable,
                     match=r"^jax_gmma.ragged_dot: this build of jax_gmma has no kernel "
                           r"sm100_grouped_mxfp4xmxfp4_128x128x256_1sm, "
                           r"sm100_grouped_mxfp4xmxfp4_256x128x256_2sm"):
    _export(lambda x, w, s: jax_gmma.ragged_dot(x, w, s), *args)


def test_cuda_lowering_reports_can_implement(blackwell):
  name = _name("mxfp8")
  blackwell.refuse[name] = "N must be a multiple of 8 for bfloat16 output (TMA: 16-byte rows of D)"
  x, _, wq, _ = _inputs("mxfp8", 9)
  with pytest.raises(ValueError, match=rf"^jax_gmma.ragged_dot: kernel {name} cannot run ragged_dot M={M} "
                                       r"\(G=4 experts of N=64 x K=256, mxfp8\): N must be"):
    _export(lambda x, w, s: jax_gmma.ragged_dot(x, w, s), x, wq, jnp.asarray(SIZES, jnp.int32))


def test_fp4_quantized_experts_elsewhere_are_refused(fake_hopper, monkeypatch):
  """NVFP4 / MXFP4 experts as a QuantizedArray have no grouped kernel on Hopper: a refusal that
  names the PackedWeight route (the grouped weight-only kernel), or the reference by opt-in.
  MXFP8 experts stream there as before."""
  monkeypatch.setattr(_backend, "prepare_devices", lambda: None)
  x, _, wq, _ = _inputs("nvfp4", 10)
  f = lambda x, w, s: jax_gmma.ragged_dot(x, w, s)  # noqa: E731
  with pytest.raises(jax_gmma.KernelUnavailable,
                     match=r"^jax_gmma.ragged_dot: no grouped kernel for nvfp4 x nvfp4 experts on compute "
                           r"capability 9.0: .*sm_100a.*jax_gmma.weightonly.prepare\(w\)"):
    _export(f, x, wq, jnp.asarray(SIZES, jnp.int32))
  with jax_gmma.allow_reference(True):
    text = export.export(jax.jit(f), platforms=("cuda",))(x, wq, jnp.asarray(SIZES, jnp.int32)).mlir_module()
  assert TARGET not in text


def test_info_names_the_sm100_grouped_path(blackwell, monkeypatch):
  monkeypatch.setattr(blackwell, "registrations", lambda: {TARGET: None})
  text = info.grouped_path(_backend.cuda_devices())
  assert text.startswith("CUDA kernels (sm_100a, NOT validated on hardware): mxfp8 / nvfp4 / mxfp4")
  assert all(name in text for name in NAMES) and TARGET in text


# -- sources, registration and the built extension --------------------------------------------------

def test_kernel_names_match_the_cuda_source():
  src = (ROOT / "cpp" / "sm100_mx_gemm_grouped_blockscaled.cu").read_text()
  assert set(re.findall(r'"(sm100_grouped_[a-z0-9_]+)"', src)) == NAMES
  assert set(gc.SM100_CONFIGS) == set(grouped.BLOCK_SCALED_FORMATS) == set(FORMATS)


def test_ffi_target_is_registered_and_graph_safe():
  ffi = (ROOT / "ffi" / "grouped_ffi.cc").read_text()
  handlers = re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\((\w+),.*?\);", ffi, re.S)
  assert "JaxGmmaMxGroupedGemm" in handlers
  for body in re.findall(r"XLA_FFI_DEFINE_HANDLER_SYMBOL\(.*?\);", ffi, re.S):
    assert body.rstrip(");").rstrip().endswith("JAX_GMMA_GRAPH_SAFE_TRAITS"), body[:80]
  ext = (ROOT / "ffi" / "ext.cc").read_text()
  assert f'd["{TARGET}"] = nb::capsule(jax_gmma_mx_grouped_gemm_handler());' in ext
  assert TARGET in _backend.TARGETS and _backend.MX_GROUPED_GEMM_TARGET == TARGET
  cmake = (ROOT / "CMakeLists.txt").read_text()
  assert "cpp/sm100_mx_gemm_grouped_blockscaled.cu" in cmake
  assert "sm100_mx_grouped_blockscaled_entries" in cmake


def _ext_with_sm100():
  e = _backend.ext()
  if e is None or not e.cuda_built():
    pytest.skip("jax_gmma extension not built with CUDA kernels (source tree / no nvcc)")
  if "sm_100a" not in _backend.built_archs():
    pytest.skip(f"library built without sm_100a (built: {_backend.built_archs()}); build with "
                "JAX_GMMA_CUDA_ARCHS=\"90a;100a\"")
  return e


@pytest.mark.parametrize("fmt", FORMATS)
def test_host_can_implement_and_workspace(fmt):
  """The compiled kernels' host checks (no GPU needed): can_implement and the workspace size,
  from M, G and K only, at least the re-laid scale factors' bound."""
  e = _ext_with_sm100()
  el = gc.SM100_ELEMENTS[fmt]
  vec = 16 if fmt == "nvfp4" else 32
  for name, d in ((n, d) for n in (_name(fmt), _name(fmt, True)) for d in ("bfloat16", "float32")):
    err, ws = e.check_grouped(name, el, el, d, 4096, 2048, 7168, 64, 148, True)
    assert err is None, err
    assert ws >= gc.sm100_workspace_bound(4096, 64, 7168, vec)
    err2, ws2 = e.check_grouped(name, el, el, d, 4096, 2048, 7168, 64, 148, False)
    assert err2 is None and ws2 == ws  # nothing depends on the bias either
  name = _name(fmt)
  err, _ = e.check_grouped(name, el, el, "bfloat16", 64, 256, 48, 4, 148, False)
  assert "K must be a multiple of 32" in err
  err, _ = e.check_grouped(name, el, el, "bfloat16", 64, 260, 256, 4, 148, False)
  assert "N must be a multiple of 8" in err
  err, _ = e.check_grouped(name, el, el, "float32", 64, 260, 256, 4, 148, False)
  assert err is None
