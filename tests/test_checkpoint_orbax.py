"""jax_gmma.checkpoint_orbax (and the storable trees of jax_gmma.checkpoint it writes): orbax
checkpoints of pytrees holding QuantizedArray and PackedWeight leaves, restored bit for bit with
no hand-written target, for every format, scale layout and PackedWeight format. CPU only (the
reference backend)."""
import functools
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_gmma
from jax_gmma import checkpoint, checkpoint_orbax, weightonly
from jax_gmma.numerics import formats as fmts

FORMATS = ("fp8_tensor", "fp8_channel", "fp8_1x128", "fp8_128x128", "mxfp8", "mxfp4",
           "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4")
SWIZZLED = ("mxfp8", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4")
#: A 2-D weight shape every dot takes (K a multiple of 128).
W2D = (48, 256)
U8 = np.dtype(np.uint8)
F4 = np.dtype(ml_dtypes.float4_e2m1fn)
F6 = np.dtype(ml_dtypes.float6_e2m3fn)


@pytest.fixture
def ocp():
  return pytest.importorskip("orbax.checkpoint")


def _is_obj(x):
  return isinstance(x, (jax_gmma.QuantizedArray, jax_gmma.PackedWeight))


def _bits(a) -> np.ndarray:
  """The bytes of array ``a`` (1-byte dtypes as uint8, wider ones as uint8 per byte)."""
  h = np.ascontiguousarray(np.asarray(jax.device_get(a)))
  return h.reshape(-1).view(U8) if h.dtype.itemsize > 1 else h.view(U8)


def _same_array(a, b) -> bool:
  return (np.dtype(a.dtype) == np.dtype(b.dtype) and tuple(a.shape) == tuple(b.shape)
          and np.array_equal(_bits(a), _bits(b)))


def _same(a, b) -> bool:
  """Same object type, same static fields, bit-identical array fields (None where None)."""
  if type(a) is not type(b):
    return False
  if not _is_obj(a):
    if hasattr(a, "dtype"):
      return _same_array(a, b)
    return a == b
  (ca, sa), (cb, sb) = a.tree_flatten(), b.tree_flatten()
  if sa != sb:
    return False
  return all((x is None and y is None) or (x is not None and y is not None and _same_array(x, y))
             for x, y in zip(ca, cb))


def _same_tree(a, b) -> bool:
  la, ta = jax.tree_util.tree_flatten(a, is_leaf=_is_obj)
  lb, tb = jax.tree_util.tree_flatten(b, is_leaf=_is_obj)
  return ta == tb and all(_same(x, y) for x, y in zip(la, lb))


def _float_bits(a) -> np.ndarray:
  return np.asarray(jax.device_get(a), np.float32).view(np.uint32)


# ----------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _x(shape=(2, 48, 100)) -> jax.Array:
  """A float32 weight with a wide spread of magnitudes (and K not a multiple of the blocks)."""
  x = jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32)
  return x * jnp.exp2(jnp.round(jax.random.uniform(jax.random.PRNGKey(1), shape) * 12 - 6))


@functools.lru_cache(maxsize=None)
def _q(fmt, layout="rowmajor", shape=(2, 48, 100), **kw):
  return jax_gmma.quantize(_x(shape), fmt, layout=layout, **kw)


@functools.lru_cache(maxsize=None)
def _pw(fmt):
  return weightonly.prepare(_x(W2D), fmt)


def _every_code(q, seed=0):
  """A QuantizedArray of q's format, shape and layout whose 1-byte element and scale arrays hold
  every code of their dtype (E8M0 and E4M3 NaNs, -0, FP4 / FP6 codes in their containers)."""
  rng = np.random.default_rng(seed)
  fmt = q.format

  def codes(shape, dt, bits):
    c = rng.integers(0, 2 ** bits, size=shape, dtype=np.uint8)
    flat = c.reshape(-1)
    n = min(flat.size, 2 ** bits)
    flat[:n] = np.arange(n, dtype=np.uint8)
    return c.view(dt)

  dt = np.dtype(q.dtype)
  if dt.itemsize == 1 and dt.name.startswith("float6"):
    data = codes(q.data.shape, dt, 6).astype(fmts.E4M3)  # exact in the e4m3 container
  elif dt == F4:
    data = codes(q.data.shape, F4, 4)
  else:
    data = codes(q.data.shape, dt, 8)
  scales = q.scales
  if np.dtype(scales.dtype).itemsize == 1:
    scales = codes(scales.shape, np.dtype(scales.dtype), 8)
  return jax_gmma.QuantizedArray(jnp.asarray(data), jnp.asarray(scales), q.global_scale,
                                 format=fmt, shape=q.shape, axis=q.axis, dtype=q.dtype,
                                 layout=q.layout)


def _round_trip(tmp_path, tree, name="ck", **kw):
  d = tmp_path / name
  checkpoint_orbax.save_orbax(d, tree)
  return d, checkpoint_orbax.restore_orbax(d, **kw)


# ----------------------------------------------------------------------------
# every format, layout and PackedWeight format
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_bit_exact(ocp, tmp_path, fmt):
  q = _q(fmt)
  codes = _every_code(q)
  tree = {"q": q, "codes": codes, "bias": jnp.arange(5, dtype=jnp.bfloat16)}
  d, r = _round_trip(tmp_path, tree)
  assert _same_tree(r, tree)
  for name in ("q", "codes"):
    got, want = r[name], tree[name]
    assert (got.format, got.shape, got.axis, got.dtype, got.layout) == (
        want.format, want.shape, want.axis, want.dtype, want.layout)
    assert np.dtype(got.scales.dtype) == np.dtype(want.scales.dtype)
    assert isinstance(got.data, jax.Array) and got.data.devices() == {jax.devices()[0]}
    # the restored object passes the constructor's checks again
    jax_gmma.QuantizedArray(got.data, got.scales, got.global_scale, format=got.format,
                            shape=got.shape, axis=got.axis, dtype=got.dtype, layout=got.layout)
    np.testing.assert_array_equal(_float_bits(jax_gmma.dequantize(got)),
                                  _float_bits(jax_gmma.dequantize(want)))
  meta = json.loads((d / checkpoint_orbax.METADATA_ITEM / "metadata").read_text())
  assert meta["version"] == checkpoint.STORABLE_VERSION and meta["raw"] == []
  assert {tuple(e["path"]) for e in meta["objects"]} == {("q",), ("codes",)}


@pytest.mark.parametrize("fmt", SWIZZLED)
def test_swizzled_scales_round_trip(ocp, tmp_path, fmt):
  q = _q(fmt, "sm100_128x4")
  tree = [q, _every_code(q, seed=1)]
  _, r = _round_trip(tmp_path, tree)
  assert _same_tree(r, tree) and r[0].layout == "sm100_128x4"
  np.testing.assert_array_equal(_float_bits(jax_gmma.dequantize(r[1])),
                                _float_bits(jax_gmma.dequantize(tree[1])))


def test_other_dtypes_and_axes_round_trip(ocp, tmp_path):
  tree = {"e5m2": _q("fp8_tensor", dtype=jnp.float8_e5m2),
          "axis0": _q("fp8_channel", shape=(48, 100), axis=0),
          "nv2d": _q("nvfp4", shape=(48, 100))}
  _, r = _round_trip(tmp_path, tree)
  assert _same_tree(r, tree)
  assert r["e5m2"].dtype == np.dtype(jnp.float8_e5m2) and r["axis0"].axis == 0


@pytest.mark.parametrize("fmt", weightonly.WEIGHT_FORMATS)
def test_packed_weight_round_trips(ocp, tmp_path, fmt):
  wp = _pw(fmt)
  _, r = _round_trip(tmp_path, {"wp": wp})
  got = r["wp"]
  assert _same(got, wp)
  assert (got.format, got.n, got.k, got.fp8_exact, got.layout) == (
      wp.format, wp.n, wp.k, wp.fp8_exact, wp.layout)
  assert got.packed.devices() == {jax.devices()[0]}


def test_dot_is_bit_identical_after_restore(ocp, tmp_path):
  tree = {"fp8_channel": _q("fp8_channel", shape=W2D),
          "fp8_128x128": _q("fp8_128x128", shape=W2D),
          "mxfp4": _q("mxfp4", shape=W2D),
          "mxfp6_e3m2": _q("mxfp6_e3m2", "sm100_128x4", shape=W2D),
          "nvfp4": _q("nvfp4", "sm100_128x4", shape=W2D),
          "packed_nvfp4": _pw("nvfp4"), "packed_mxfp6": _pw("mxfp6_e3m2")}
  _, r = _round_trip(tmp_path, tree)
  a = jax.random.normal(jax.random.PRNGKey(2), (8, W2D[1]), jnp.float32)
  for name, w in tree.items():
    np.testing.assert_array_equal(_float_bits(jax_gmma.dot(a, r[name])),
                                  _float_bits(jax_gmma.dot(a, w)), err_msg=name)


# ----------------------------------------------------------------------------
# trees
# ----------------------------------------------------------------------------
def _model_state():
  """A nested model state: layers in a list, tuples, int keys, plain float / FP8 / FP4 / FP6
  arrays, Python scalars, None and empty containers next to the quantized weights."""
  emb = jax.random.normal(jax.random.PRNGKey(3), (16, 8), jnp.bfloat16)
  return {
      "embed": {"table": emb},
      "layers": [
          {"attn": {"qkv": _q("fp8_128x128", shape=(48, 100)), "o": _q("mxfp8", shape=(48, 100))},
           "mlp": (_q("nvfp4", "sm100_128x4", shape=(48, 100)), _pw("mxfp4")),
           "norm": jnp.ones((100,), jnp.float32)},
          {"attn": {"qkv": _q("mxfp6_e2m3", shape=(48, 100)),
                    "o": _q("fp8_channel", shape=(48, 100))},
           "mlp": (_q("mxfp4", shape=(48, 100)), _pw("mxfp6_e3m2")),
           "norm": np.full((100,), 0.5, np.float32)},
      ],
      "experts": {0: _q("mxfp4"), 1: _q("nvfp4")},
      "plain_fp8": jnp.asarray(np.arange(256, dtype=np.uint8).view(fmts.E4M3)),
      "plain_fp4": jnp.asarray(np.arange(16, dtype=np.uint8).view(F4)),
      "plain_fp6": np.arange(64, dtype=np.uint8).view(F6),
      "step": 7, "lr": 0.25, "name": "tiny", "none": None, "empty": {}, "nothing": [],
  }


def _as_restored(tree):
  """``tree`` as orbax restores it without a target: tuples as lists, dict keys as str, NumPy
  arrays (but FP6) as jax.Arrays."""
  if isinstance(tree, dict):
    return {str(k): _as_restored(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_as_restored(v) for v in tree]
  if isinstance(tree, np.ndarray) and np.dtype(tree.dtype) != F6:
    return jnp.asarray(tree)
  return tree


def test_model_state_round_trips_without_and_with_target(ocp, tmp_path):
  tree = _model_state()
  d, r = _round_trip(tmp_path, tree)
  assert _same_tree(r, _as_restored(tree))
  assert isinstance(r["plain_fp6"], np.ndarray) and r["plain_fp6"].dtype == F6
  assert isinstance(r["layers"][1]["norm"], jax.Array)
  meta = json.loads((d / checkpoint_orbax.METADATA_ITEM / "metadata").read_text())
  assert meta["raw"] == [{"path": ["plain_fp6"], "dtype": "float6_e2m3fn"}]
  assert len(meta["objects"]) == 10
  # with the original tree as target: its containers (tuples, int keys) come back
  r2 = checkpoint_orbax.restore_orbax(d, target=tree)
  want = jax.tree_util.tree_map(lambda v: jnp.asarray(v) if isinstance(v, np.ndarray)
                                and v.dtype != F6 else v, tree)
  assert _same_tree(r2, want)


def test_abstract_target_describes_the_restored_tree(ocp, tmp_path):
  tree = _model_state()
  d, r = _round_trip(tmp_path, tree)
  a = checkpoint_orbax.abstract_target(d)
  la, ta = jax.tree_util.tree_flatten(a, is_leaf=_is_obj)
  lr, tr = jax.tree_util.tree_flatten(r, is_leaf=_is_obj)
  assert ta == tr
  for x, y in zip(la, lr):
    if _is_obj(x):
      assert type(x) is type(y) and x.tree_flatten()[1][:3] == y.tree_flatten()[1][:3]
      for fx, fy in zip(x.tree_flatten()[0], y.tree_flatten()[0]):
        assert (fx is None) == (fy is None)
        if fx is not None:
          assert isinstance(fx, jax.ShapeDtypeStruct)
          assert (fx.shape, np.dtype(fx.dtype)) == (fy.shape, np.dtype(fy.dtype))
    elif isinstance(x, jax.ShapeDtypeStruct):
      assert (x.shape, np.dtype(x.dtype)) == (tuple(y.shape), np.dtype(y.dtype))
  # shardings set on the abstract tree's leaves are the restored arrays' shardings
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  a = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=cpu)
                             if isinstance(s, jax.ShapeDtypeStruct) else s, a)
  r2 = checkpoint_orbax.restore_orbax(d, target=a)
  assert _same_tree(r2, r)
  assert r2["layers"][0]["mlp"][0].data.sharding == cpu


def test_single_object_and_sharding_argument(ocp, tmp_path):
  q = _q("nvfp4")
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  _, r = _round_trip(tmp_path, q, sharding=cpu)
  assert _same(r, q) and r.scales.sharding == cpu
  with pytest.raises(TypeError, match="restore_orbax: sharding must be"):
    checkpoint_orbax.restore_orbax(tmp_path / "ck", sharding="cpu")


def _value(v):
  """A Flax NNX Variable's value."""
  return v.get_value() if hasattr(v, "get_value") else v.value


def test_flax_nnx_state(ocp, tmp_path):
  nnx = pytest.importorskip("flax.nnx")

  class Model(nnx.Module):
    def __init__(self, seed):
      x = _x(W2D) * (seed + 1)
      self.w = nnx.Param(jax_gmma.quantize(x, "mxfp4"))
      self.packed = nnx.Param(weightonly.prepare(x, "nvfp4"))
      self.b = nnx.Param(jnp.full((48,), seed, jnp.float32))

  model = Model(0)
  d, r = _round_trip(tmp_path, nnx.state(model))
  assert _same(r["w"]["value"], _value(model.w))
  assert _same(r["packed"]["value"], _value(model.packed))
  fresh = Model(1)
  nnx.update(fresh, checkpoint_orbax.restore_orbax(d, target=nnx.state(fresh)))
  assert _same_tree(nnx.state(fresh), nnx.state(model))
  a = jax.random.normal(jax.random.PRNGKey(4), (8, W2D[1]), jnp.float32)
  np.testing.assert_array_equal(_float_bits(jax_gmma.dot(a, _value(fresh.w))),
                                _float_bits(jax_gmma.dot(a, _value(model.w))))


def test_checkpoint_manager_step(ocp, tmp_path):
  tree = {"w": _q("mxfp8"), "b": jnp.ones(3)}
  with ocp.CheckpointManager(tmp_path / "run") as mngr:
    mngr.save(5, args=checkpoint_orbax.save_args(tree))
    mngr.wait_until_finished()
  assert _same_tree(checkpoint_orbax.restore_orbax(tmp_path / "run" / "5"), tree)


# ----------------------------------------------------------------------------
# refusals
# ----------------------------------------------------------------------------
def _edit_metadata(d, edit, path=None):
  """Rewrites the JSON metadata of checkpoint ``d``: ``edit(meta)``, or ``edit(entry)`` of the
  object at ``path``."""
  p = d / checkpoint_orbax.METADATA_ITEM / "metadata"
  meta = json.loads(p.read_text())
  if path is None:
    edit(meta)
  else:
    edit(next(e for e in meta["objects"] if e["path"] == path))
  p.write_text(json.dumps(meta))


def test_missing_or_newer_metadata_is_refused(ocp, tmp_path):
  with pytest.raises(FileNotFoundError, match="restore_orbax: no checkpoint at"):
    checkpoint_orbax.restore_orbax(tmp_path / "nowhere")
  plain = tmp_path / "plain"
  with ocp.StandardCheckpointer() as ck:
    ck.save(plain, {"a": jnp.ones(2)})
  for fn in (checkpoint_orbax.restore_orbax, checkpoint_orbax.abstract_target):
    with pytest.raises(ValueError, match=rf"{fn.__name__}: .* holds no jax_gmma metadata"):
      fn(plain)

  d = tmp_path / "ck"
  checkpoint_orbax.save_orbax(d, {"w": _q("mxfp4"), "p": _pw("mxfp4")})
  with pytest.raises(ValueError, match="Destination .* already exists"):
    checkpoint_orbax.save_orbax(d, {"w": _q("mxfp4")})
  _edit_metadata(d, lambda m: m.update(version=checkpoint.STORABLE_VERSION + 1))
  for fn in (checkpoint_orbax.restore_orbax, checkpoint_orbax.abstract_target):
    with pytest.raises(ValueError, match=rf"{fn.__name__}: the checkpoint metadata has version "
                       rf"{checkpoint.STORABLE_VERSION + 1}"):
      fn(d)
  _edit_metadata(d, lambda m: m.update(version=checkpoint.STORABLE_VERSION))
  _edit_metadata(d, lambda e: e.update(layout=99), ["p"])
  with pytest.raises(ValueError, match="restore_orbax: the PackedWeight at p is in mxfp4 layout "
                     r"version 99; .* reads version\(s\) \(2, 3\) \(a newer jax_gmma wrote it"):
    checkpoint_orbax.restore_orbax(d)
  _edit_metadata(d, lambda e: e.update(layout=2), ["p"])  # older, still readable
  assert checkpoint_orbax.restore_orbax(d)["p"].layout == 2
  _edit_metadata(d, lambda e: e.update(format="mxfp3"), ["w"])
  with pytest.raises(ValueError, match="restore_orbax: the QuantizedArray at w: format 'mxfp3' "
                     "is not one this jax_gmma"):
    checkpoint_orbax.restore_orbax(d)
  _edit_metadata(d, lambda e: e.update(format="mxfp4", layout="sm200_256x8"), ["w"])
  with pytest.raises(ValueError, match="abstract_target: the QuantizedArray at w: scale layout"):
    checkpoint_orbax.abstract_target(d)
  _edit_metadata(d, lambda e: e.update(layout="rowmajor", shape=[2, 48, 64]), ["w"])
  with pytest.raises(ValueError, match="restore_orbax: the QuantizedArray at w: .*data must have "
                     "shape"):
    checkpoint_orbax.restore_orbax(d)


def test_target_mismatch_is_refused(ocp, tmp_path):
  d = tmp_path / "ck"
  checkpoint_orbax.save_orbax(d, {"w": _q("mxfp4")})
  with pytest.raises(ValueError, match="restore_orbax: the target has a leaf at v"):
    checkpoint_orbax.restore_orbax(d, target={"v": jnp.ones(2)})
  with pytest.raises(ValueError,
                     match=r"restore_orbax: the target has QuantizedArray\(format='nvfp4'"):
    checkpoint_orbax.restore_orbax(d, target={"w": _q("nvfp4")})


def test_needs_orbax(monkeypatch, tmp_path):
  monkeypatch.setattr(checkpoint_orbax, "ocp", None)
  for call in (lambda: checkpoint_orbax.save_orbax(tmp_path / "x", {}),
               lambda: checkpoint_orbax.restore_orbax(tmp_path / "x"),
               lambda: checkpoint_orbax.abstract_target(tmp_path / "x"),
               lambda: checkpoint_orbax.save_args({})):
    with pytest.raises(ImportError, match="checkpoint_orbax.* needs the orbax-checkpoint package"):
      call()


# ----------------------------------------------------------------------------
# storable trees (any checkpointer; no orbax needed)
# ----------------------------------------------------------------------------
def test_storable_tree_round_trip_in_memory():
  q, wp = _q("mxfp6_e3m2", "sm100_128x4"), _pw("mxfp6_e2m3")
  tree = {"a": [q, {"b": wp}], "c": np.arange(8, dtype=np.uint8).view(F6), "d": None}
  stored, meta = checkpoint.tree_to_storable(tree, raw_dtypes=[F6])
  json.dumps(meta)
  assert sorted(stored["a"][0]) == ["data", "scales"] and stored["a"][0]["scales"].dtype == U8
  assert sorted(stored["a"][1]["b"]) == ["global_scale", "packed", "scales"]
  assert stored["c"].dtype == U8 and meta["raw"] == [{"path": ["c"], "dtype": "float6_e2m3fn"}]
  assert [e["path"] for e in meta["objects"]] == [["a", "0"], ["a", "1", "b"]]
  assert _same_tree(checkpoint.tree_from_storable(stored, meta), tree)
  abstract = jax.tree_util.tree_map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), stored)
  a = checkpoint.tree_from_storable(abstract, meta)
  assert isinstance(a["a"][0].data, jax.ShapeDtypeStruct) and a["c"].dtype == F6
  with pytest.raises(TypeError, match="tree_to_storable: the leaf at w is a tracer"):
    jax.jit(lambda w: checkpoint.tree_to_storable({"w": w})[0])(q)
  with pytest.raises(ValueError, match="tree_from_storable: the tree lacks 1 object"):
    checkpoint.tree_from_storable({"a": [stored["a"][0]]}, meta)
  with pytest.raises(ValueError, match="not jax_gmma checkpoint metadata"):
    checkpoint.tree_from_storable(stored, {"objects": []})


def test_stacked_experts_round_trip(ocp, tmp_path):
  """FP4 experts of a MoE layer (one PackedWeight with a leading expert axis) and per-expert
  FP8 scales come back as they were, bit for bit, and multiply the same."""
  w = jnp.asarray(np.random.default_rng(11).standard_normal((4, 32, 128)), jnp.float32)
  tree = {"experts": weightonly.prepare(w, "mxfp4"), "dense": jax_gmma.quantize(w, "fp8_128x128")}
  checkpoint_orbax.save_orbax(tmp_path / "moe", tree)
  back = checkpoint_orbax.restore_orbax(tmp_path / "moe")
  assert isinstance(back["experts"], weightonly.PackedWeight) and back["experts"].packed.shape[0] == 4
  assert back["experts"].fp8_exact == tree["experts"].fp8_exact
  for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(back)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  x = jnp.ones((6, 128), jnp.bfloat16)
  s = jnp.asarray([1, 2, 0, 3], jnp.int32)
  np.testing.assert_array_equal(np.asarray(jax_gmma.ragged_dot(x, back["experts"], s)),
                                np.asarray(jax_gmma.ragged_dot(x, tree["experts"], s)))
