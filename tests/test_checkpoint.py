"""jax_gmma.checkpoint: safetensors files in the conventions of published checkpoints (DeepSeek-V3
FP8 blocks, FP8 per channel / per tensor, gpt-oss MXFP4, ModelOpt NVFP4) imported into
QuantizedArray and exported back, bit for bit. CPU only (the reference backend)."""
import collections
import json
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from jax_gmma import checkpoint

safetensors_numpy = pytest.importorskip("safetensors.numpy")

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
F32_TINY = np.finfo(np.float32).tiny
#: e2m1 code -> value (sign bit 3, as gpt-oss' FP4_VALUES table).
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


# ----------------------------------------------------------------------------
# synthetic checkpoints (every element code, scales with few significant bits so that every
# product is exact in float32)
# ----------------------------------------------------------------------------
def _bytes(rng, shape, exclude=()):
  """Random bytes of ``shape``, the first ones every byte value (but ``exclude``) in order."""
  b = rng.integers(0, 256, size=shape, dtype=np.uint8)
  every = np.array([v for v in range(256) if v not in exclude], np.uint8)
  flat = b.reshape(-1)
  assert flat.size >= every.size
  flat[:every.size] = every
  if exclude:
    bad = np.isin(flat, np.array(exclude, np.uint8))
    flat[bad] = 0x38  # 1.0 in e4m3
  return b


def _f32_scales(rng, shape, lo=-12, hi=8):
  """float32 scales ``m * 2^e`` with an odd m < 2^12 (few significant bits), sign +."""
  m = rng.integers(0, 2 ** 11, size=shape) * 2 + 1
  e = rng.integers(lo, hi, size=shape)
  return np.asarray(np.ldexp(m.astype(np.float64), e - 11), np.float32)


def _fp8_block(rng, n=200, k=300, nan=True):
  w = _bytes(rng, (n, k), exclude=() if nan else (0x7F, 0xFF)).view(E4M3)
  s = _f32_scales(rng, (-(-n // 128), -(-k // 128)))
  return {"m.l0.down_proj.weight": w, "m.l0.down_proj.weight_scale_inv": s}, "m.l0.down_proj"


def _fp8_channel(rng, n=200, k=300, flat=False, nan=True):
  w = _bytes(rng, (n, k), exclude=() if nan else (0x7F, 0xFF)).view(E4M3)
  s = _f32_scales(rng, (n,) if flat else (n, 1))
  return {"m.up.weight": w, "m.up.weight_scale": s, "m.up.input_scale": np.array(0.5, np.float32)}, "m.up"


def _fp8_tensor(rng, n=40, k=96, shape=(), nan=True):
  w = _bytes(rng, (n, k), exclude=() if nan else (0x7F, 0xFF)).view(E4M3)
  s = _f32_scales(rng, shape)
  return {"q.weight": w, "q.weight_scale": s}, "q"


def _mxfp4(rng, lead=(3,), n=40, k=96, hf=False, edges=True):
  blocks = _bytes(rng, (*lead, n, k // 32, 16))
  s = rng.integers(110, 140, size=(*lead, n, k // 32)).astype(np.uint8)
  if edges:
    s.reshape(-1)[:6] = [0, 1, 126, 127, 254, 255]
  p = "model.layers.0.mlp.experts.gate_up_proj" if hf else "block.0.mlp.mlp1_weight"
  sep = "_" if hf else "."
  return {f"{p}{sep}blocks": blocks, f"{p}{sep}scales": s}, p


def _nvfp4(rng, n=64, k=72, nan=True):
  w = _bytes(rng, (n, k // 2))
  s = _bytes(rng, (n, -(-k // 16)), exclude=() if nan else (0x7F, 0xFF)).view(E4M3)
  g = _f32_scales(rng, (), lo=-3, hi=3)
  return {"x.o_proj.weight": w, "x.o_proj.weight_scale": s, "x.o_proj.weight_scale_2": g,
          "x.o_proj.input_scale": np.array(2.0, np.float32)}, "x.o_proj"


# ----------------------------------------------------------------------------
# float64 decode of the original tensors
# ----------------------------------------------------------------------------
def _e2m1(packed):
  codes = np.stack([packed & 0x0F, packed >> 4], axis=-1)
  return FP4_VALUES[codes].reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _decode(t, p, conv):
  """(value, scale) in float64 from the checkpoint tensors, broadcast to (..., N, K)."""
  if conv == "fp8_block":
    w = t[f"{p}.weight"].astype(np.float64)
    s = t[f"{p}.weight_scale_inv"].astype(np.float64)
    s = np.repeat(np.repeat(s, 128, -2), 128, -1)[:w.shape[-2], :w.shape[-1]]
    return w * s, s
  if conv in ("fp8_channel", "fp8_tensor"):
    w = t[f"{p}.weight"].astype(np.float64)
    s = t[f"{p}.weight_scale"].astype(np.float64)
    s = s.reshape(-1, 1) if s.size > 1 else s.reshape(())
    s = np.broadcast_to(s, w.shape)
    return w * s, s
  if conv in ("mxfp4", "mxfp4_hf"):
    sep = "_" if conv == "mxfp4_hf" else "."
    b, e = t[f"{p}{sep}blocks"], t[f"{p}{sep}scales"].astype(np.int64)
    v = _e2m1(b).reshape(*b.shape[:-2], -1)
    s = np.where(e == 255, np.nan, np.ldexp(1.0, e - 127))
    s = np.repeat(s, 32, -1)
    return v * s, s
  v = _e2m1(t[f"{p}.weight"])
  s = np.repeat(t[f"{p}.weight_scale"].astype(np.float64), 16, -1)[..., :v.shape[-1]]
  s = s * np.float64(t[f"{p}.weight_scale_2"])
  return v * s, s


def _assert_dequantize_exact(q, ref, scale):
  """``dequantize(q)`` (float32) equals the float64 decode ``ref``, rounded once to float32
  (exact here: every product has few significant bits). float32 cannot hold a subnormal
  scale or product as XLA on CPU computes (flushed to zero), so there 0 is accepted too."""
  out = np.asarray(jax_gmma.dequantize(q))
  with np.errstate(over="ignore"):
    ref32 = ref.astype(np.float32)
  finite = np.isfinite(ref) & (np.abs(ref) < np.finfo(np.float32).max)
  assert np.all(ref32[finite].astype(np.float64) == ref[finite])  # the premise: exact in f32
  sub = (np.abs(ref) < F32_TINY) | (np.abs(scale) < F32_TINY)
  ok = (out == ref32) | (np.isnan(out) & np.isnan(ref32)) | (sub & (out == 0))
  assert out.shape == ref.shape and out.dtype == np.float32
  assert ok.all(), (np.argwhere(~ok)[:5], out[~ok][:5], ref32[~ok][:5])


def _same(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


CASES = {
  "fp8_block": (_fp8_block, "fp8_128x128"),
  "fp8_channel": (_fp8_channel, "fp8_channel"),
  "fp8_tensor": (_fp8_tensor, "fp8_tensor"),
  "mxfp4": (_mxfp4, "mxfp4"),
  "mxfp4_hf": (lambda rng: _mxfp4(rng, hf=True), "mxfp4"),
  "nvfp4": (_nvfp4, "nvfp4"),
}


@pytest.mark.parametrize("conv", sorted(CASES))
def test_import_is_bit_exact_and_round_trips(conv, tmp_path):
  make, fmt = CASES[conv]
  t, p = make(np.random.default_rng(sorted(CASES).index(conv)))
  path = tmp_path / "in.safetensors"
  safetensors_numpy.save_file(t, str(path))
  assert checkpoint.find_weights(t) == {p: conv}
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    loaded = checkpoint.load(str(path))
  assert list(loaded) == [p]
  has_input_scale = f"{p}.input_scale" in t
  assert any("input_scale" in str(x.message) for x in w) == has_input_scale
  q = loaded[p]
  assert q.format.name == fmt and q.layout == "rowmajor" and q.axis == q.ndim - 1
  assert isinstance(q.data, np.ndarray)

  # fields: the checkpoint's bytes, unpacked / K-padded with zero codes
  k = q.shape[-1]
  data = np.asarray(q.data)
  assert np.all(data[..., k:].view(np.uint8) == 0)
  if conv in ("mxfp4", "mxfp4_hf", "nvfp4"):
    packed = t[f"{p}.weight"] if conv == "nvfp4" else t[f"{p}{'_' if conv == 'mxfp4_hf' else '.'}blocks"]
    codes = data[..., :k].view(np.uint8)
    assert codes.max() <= 15
    assert np.array_equal(codes[..., 0::2].reshape(-1), (packed & 0x0F).reshape(-1))
    assert np.array_equal(codes[..., 1::2].reshape(-1), (packed >> 4).reshape(-1))
  else:
    assert _same(data[..., :k], t[f"{p}.weight"])
  if conv == "nvfp4":
    assert _same(q.scales, t[f"{p}.weight_scale"])
    assert _same(q.global_scale, t[f"{p}.weight_scale_2"])
  elif conv.startswith("mxfp4"):
    sep = "_" if conv == "mxfp4_hf" else "."
    assert np.asarray(q.scales).dtype == E8M0
    assert np.asarray(q.scales).view(np.uint8).tobytes() == t[f"{p}{sep}scales"].tobytes()
    assert q.global_scale is None
  else:
    name = f"{p}.weight_scale_inv" if conv == "fp8_block" else f"{p}.weight_scale"
    assert np.asarray(q.scales).tobytes() == t[name].tobytes()

  # values: dequantize == float64 decode of the original tensors
  ref, scale = _decode(t, p, conv)
  _assert_dequantize_exact(q, ref, scale)

  # round trips: tensors -> QuantizedArray -> tensors, and file -> file byte for byte
  back = checkpoint.to_tensors(q, p, conv)
  want = {n: a for n, a in t.items() if not n.endswith(".input_scale")}
  assert sorted(back) == sorted(want)
  for n in want:
    assert _same(back[n], want[n]), n
  q2 = checkpoint.from_tensors(back, p)
  for a, b in ((q.data, q2.data), (q.scales, q2.scales), (q.global_scale, q2.global_scale)):
    assert (a is None and b is None) or _same(a, b)
  assert (q2.shape, q2.axis, q2.dtype, q2.format) == (q.shape, q.axis, q.dtype, q.format)
  path_in = tmp_path / "want.safetensors"
  safetensors_numpy.save_file(want, str(path_in))
  path_out = tmp_path / "out.safetensors"
  checkpoint.save(str(path_out), loaded, convention=conv)
  assert path_out.read_bytes() == path_in.read_bytes()


@pytest.mark.parametrize("fmt,shape", [("fp8_128x128", (200, 300)), ("fp8_channel", (130, 70)),
                                       ("fp8_tensor", (3, 5, 40)), ("mxfp4", (2, 40, 96)),
                                       ("nvfp4", (33, 50)), ("mxfp4", (64, 128))])
def test_quantize_export_import_keeps_every_byte(fmt, shape):
  w = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
  q = jax_gmma.quantize(w, fmt)
  t = checkpoint.to_tensors(q, "w")
  q2 = checkpoint.from_tensors(t, "w")
  assert (q2.format, q2.shape, q2.axis, q2.dtype) == (q.format, q.shape, q.axis, q.dtype)
  for a, b in ((q.data, q2.data), (q.scales, q2.scales), (q.global_scale, q2.global_scale)):
    assert (a is None and b is None) or _same(a, b)
  assert np.array_equal(np.asarray(jax_gmma.dequantize(q)), np.asarray(jax_gmma.dequantize(q2)))


def test_swizzled_and_transposed_weights_export_k_last():
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 96), jnp.float32)
  q = jax_gmma.quantize(w, "nvfp4", layout="sm100_128x4")
  t = checkpoint.to_tensors(q, "w")
  assert t["w.weight_scale"].shape == (64, 6)
  q2 = checkpoint.from_tensors(t, "w")
  assert np.array_equal(np.asarray(q2.dequantize()), np.asarray(q.dequantize()))
  qt = jax_gmma.quantize(w.T, "fp8_channel", axis=0)  # a (K, N) weight
  t = checkpoint.to_tensors(qt, "w")
  assert t["w.weight"].shape == (64, 96)
  assert np.array_equal(np.asarray(checkpoint.from_tensors(t, "w").dequantize()),
                        np.asarray(qt.dequantize()).T)


def test_scale_shapes_accepted_and_written():
  rng = np.random.default_rng(7)
  t, p = _fp8_channel(rng, flat=True)  # (N,) per-channel scale -> (N, 1)
  with pytest.warns(UserWarning, match="ignored 1 static activation scale"):
    q = checkpoint.from_tensors(t, p)
  assert q.scales.shape == (200, 1)
  back = checkpoint.to_tensors(q, p)
  assert back[f"{p}.weight_scale"].shape == (200, 1)
  assert back[f"{p}.weight_scale"].tobytes() == t[f"{p}.weight_scale"].tobytes()
  t, p = _fp8_tensor(rng, shape=(1,))  # (1,) per-tensor scale -> ()
  assert checkpoint.find_weights(t) == {p: "fp8_tensor"}
  q = checkpoint.from_tensors(t, p)
  assert q.format.name == "fp8_tensor" and q.scales.shape == ()
  t, p = _nvfp4(rng)
  t[f"{p}.weight_scale_2"] = t[f"{p}.weight_scale_2"].reshape(1)
  with pytest.warns(UserWarning, match="input_scale"):
    q = checkpoint.from_tensors(t, p)
  assert q.global_scale.shape == ()
  t, p = _mxfp4(rng, lead=())  # E8M0 scales given as float8_e8m0fnu
  t2 = dict(t, **{f"{p}.scales": t[f"{p}.scales"].view(E8M0)})
  assert _same(checkpoint.from_tensors(t2, p).scales, checkpoint.from_tensors(t, p).scales)


# ----------------------------------------------------------------------------
# dot on imported weights (reference backend)
# ----------------------------------------------------------------------------
DOT_CASES = {
  "fp8_block": (lambda rng: _fp8_block(rng, nan=False), "fp8_1x128"),
  "fp8_channel": (lambda rng: _fp8_channel(rng, k=304, nan=False), "fp8_channel"),
  "fp8_tensor": (lambda rng: _fp8_tensor(rng, nan=False), "fp8_channel"),
  "mxfp4": (lambda rng: _mxfp4(rng, lead=(), n=48, k=128, edges=False), "mxfp4"),
  "nvfp4": (lambda rng: _nvfp4(rng, n=48, k=128, nan=False), "nvfp4"),
}


@pytest.mark.parametrize("conv", sorted(DOT_CASES))
def test_dot_on_imported_weight(conv):
  make, x_format = DOT_CASES[conv]
  rng = np.random.default_rng(11)
  t, p = make(rng)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    w = checkpoint.from_tensors(t, p)
  x = jnp.asarray(rng.standard_normal((8, w.shape[-1])), jnp.float32)
  xq = jax_gmma.quantize(x, x_format)
  with jax_gmma.allow_reference():
    out = np.asarray(jax_gmma.dot(xq, w, out_dtype=jnp.float32), np.float64)
  ref = np.asarray(jax_gmma.dequantize(xq), np.float64) @ _decode(t, p, conv)[0].T
  err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
  assert err < 1e-5, err


# ----------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------
def test_missing_and_malformed_tensors():
  rng = np.random.default_rng(3)
  t, p = _fp8_block(rng)
  bad = dict(t)
  del bad[f"{p}.weight"]
  with pytest.raises(KeyError, match=r"from_tensors: missing tensor 'm.l0.down_proj.weight'"):
    checkpoint.from_tensors(bad, p)
  with pytest.raises(KeyError, match="no quantized weight 'nope'"):
    checkpoint.from_tensors(t, "nope")
  bad = dict(t, **{f"{p}.weight_scale_inv": t[f"{p}.weight_scale_inv"][:1]})
  with pytest.raises(ValueError, match=r"weight_scale_inv' must have shape \(2, 3\)"):
    checkpoint.from_tensors(bad, p)
  bad = dict(t, **{f"{p}.weight_scale_inv": t[f"{p}.weight_scale_inv"].astype(np.float16)})
  with pytest.raises(TypeError, match="weight_scale_inv' must be float32.*got float16"):
    checkpoint.from_tensors(bad, p)
  bad = dict(t, **{f"{p}.weight": t[f"{p}.weight"].astype(np.float32)})
  with pytest.raises(TypeError, match="weight' must be float8_e4m3fn or float8_e5m2"):
    checkpoint.from_tensors(bad, p)
  t, p = _mxfp4(rng)
  bad = dict(t, **{f"{p}.blocks": t[f"{p}.blocks"][..., :8]})
  with pytest.raises(ValueError, match="blocks' must have shape .* 16"):
    checkpoint.from_tensors(bad, p)
  bad = dict(t)
  del bad[f"{p}.scales"]
  with pytest.raises(KeyError, match="missing tensor 'block.0.mlp.mlp1_weight.scales'"):
    checkpoint.from_tensors(bad, p)
  t, p = _nvfp4(rng)
  bad = dict(t, **{f"{p}.weight_scale": t[f"{p}.weight_scale"][:, :-1]})
  with pytest.raises(ValueError, match=r"weight_scale' must have shape \(64, 5\)"):
    checkpoint.from_tensors(bad, p)
  bad = dict(t, **{f"{p}.weight_scale_2": np.ones(2, np.float32)})
  with pytest.raises(ValueError, match="weight_scale_2' must have shape \\(\\) or \\(1,\\)"):
    checkpoint.from_tensors(bad, p)
  t, p = _fp8_channel(rng)
  bad = dict(t, **{f"{p}.weight_scale": t[f"{p}.weight_scale"][:-1]})
  with pytest.raises(ValueError, match="one scale per row"):
    checkpoint.from_tensors(bad, p, "fp8_channel")
  with pytest.raises(ValueError, match="convention must be None or one of"):
    checkpoint.from_tensors(t, p, "gguf")


def test_export_refusals():
  w = jax.random.normal(jax.random.PRNGKey(2), (32, 48), jnp.float32)
  with pytest.raises(ValueError, match="format 'mxfp8' has no checkpoint convention"):
    checkpoint.to_tensors(jax_gmma.quantize(w, "mxfp8"), "w")
  with pytest.raises(ValueError, match="K a multiple of 32"):
    checkpoint.to_tensors(jax_gmma.quantize(w, "mxfp4"), "w")
  with pytest.raises(ValueError, match="convention 'fp8_block' stores format 'fp8_128x128'"):
    checkpoint.to_tensors(jax_gmma.quantize(w, "fp8_channel"), "w", "fp8_block")
  with pytest.raises(ValueError, match="even K"):
    checkpoint.to_tensors(jax_gmma.quantize(w[:, :47], "nvfp4"), "w")
  with pytest.raises(TypeError, match="must be a jax_gmma.QuantizedArray"):
    checkpoint.to_tensors(w, "w")


def test_files_need_safetensors(monkeypatch, tmp_path):
  monkeypatch.setattr(checkpoint, "safetensors", None)
  with pytest.raises(ImportError, match="pip install safetensors"):
    checkpoint.load(str(tmp_path / "x.safetensors"))
  with pytest.raises(ImportError, match="pip install safetensors"):
    checkpoint.save(str(tmp_path / "x.safetensors"), {})
  t, p = _nvfp4(np.random.default_rng(5))
  del t[f"{p}.input_scale"]
  assert sorted(checkpoint.to_tensors(checkpoint.from_tensors(t, p), p)) == sorted(t)


# -- whole trees in one safetensors file (save_tree / load_tree) ------------------------------

def _tree():
  rng = np.random.default_rng(7)
  w = jnp.asarray(rng.standard_normal((2, 32, 256)), jnp.float32)
  return {
      "embed": jnp.asarray(rng.standard_normal((8, 4)), jnp.bfloat16),
      "layers": [
          {"mlp": jax_gmma.weightonly.prepare(w, "mxfp4"), "bias": jnp.arange(32, dtype=jnp.float32)},
          {"mlp": jax_gmma.quantize(w[0], "mxfp6_e2m3"), "attn": jax_gmma.quantize(w[1], "fp8_128x128")},
      ],
      "head": {0: jax_gmma.quantize(w[0], "nvfp4"), 1: jax_gmma.weightonly.prepare(w[1], "nvfp4")},
  }


def _header(path):
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    return json.loads(f.read(n))


def _bytes_of(tree):
  return [np.asarray(v).tobytes() for v in jax.tree.leaves(tree)]


def test_save_tree_round_trip_bit_exact(tmp_path):
  tree = _tree()
  path = str(tmp_path / "m.safetensors")
  checkpoint.save_tree(path, tree, metadata={"model": "test"})
  back = checkpoint.load_tree(path)
  assert jax.tree.structure(back) == jax.tree.structure(jax.tree.map(np.asarray, tree))
  assert _bytes_of(back) == _bytes_of(tree)
  assert isinstance(back["layers"], list) and sorted(back["head"]) == [0, 1]
  assert back["layers"][0]["mlp"].packed.shape[0] == 2  # stacked experts stay stacked
  assert back["layers"][0]["mlp"].fp8_exact == tree["layers"][0]["mlp"].fp8_exact
  x = jnp.ones((3, 256), jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(jax_gmma.dot(x, back["head"][1])),
                                np.asarray(jax_gmma.dot(x, tree["head"][1])))
  header = _header(path)  # tensors named by path; FP4 elements (no safetensors dtype) as bytes
  assert header["__metadata__"]["model"] == "test"
  assert header["head/0/data"]["dtype"] == "U8" and header["layers/1/attn/data"]["dtype"] == "F8_E4M3"


def test_save_tree_names_and_nnx_state(tmp_path):
  nnx = pytest.importorskip("flax.nnx")
  gnn = pytest.importorskip("jax_gmma.nn")
  model = nnx.Sequential(nnx.Linear(64, 128, rngs=nnx.Rngs(0)), nnx.Linear(128, 32, rngs=nnx.Rngs(1)))
  gnn.quantize_model(model, [("layers/0", "wo:mxfp4"), (".*", "fp8_channel")])
  x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 64)), jnp.bfloat16)
  y = model(x)
  path = str(tmp_path / "model.safetensors")
  checkpoint.save_tree(path, nnx.to_pure_dict(nnx.state(model)))
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, checkpoint.load_tree(path))
  graphdef, _ = nnx.split(model)
  again = nnx.merge(graphdef, state)
  assert np.asarray(again(x)).tobytes() == np.asarray(y).tobytes()
  header = _header(path)
  assert header["layers/0/kernel/packed"]["dtype"] == "U8"
  assert header["layers/1/kernel/scales"]["dtype"] == "F32"


def test_load_tree_refuses_other_files(tmp_path):
  path = str(tmp_path / "plain.safetensors")
  safetensors_numpy.save_file({"x": np.ones(2, np.float32)}, path)
  with pytest.raises(ValueError, match=r"^jax_gmma.checkpoint.load_tree: .* no jax_gmma tree header"):
    checkpoint.load_tree(path)
  with pytest.raises(TypeError, match=r"^jax_gmma.checkpoint.save_tree: metadata must be a dict of str"):
    checkpoint.save_tree(path, {"x": np.ones(2)}, metadata={"a": 1})
  with pytest.raises(TypeError, match=r"^jax_gmma.checkpoint.save_tree: the tree must be nested dicts"):
    checkpoint.save_tree(path, {"x": _Point(np.ones(2), np.zeros(2))})
  checkpoint.save_tree(path, {"w": np.ones((2, 2), np.float32)})
  with open(path, "r+b") as f:  # truncated: the header lists a tensor the file no longer holds
    f.truncate(f.seek(0, 2) - 8)
  with pytest.raises(Exception, match=r"load_tree|safetensors|invalid|truncat|Error"):
    checkpoint.load_tree(path)


class _Point(collections.namedtuple("_Point", "x y")):
  """A pytree node with attribute keys (not a dict, list or tuple of the storable kind)."""
