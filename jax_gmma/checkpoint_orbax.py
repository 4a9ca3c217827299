"""Orbax checkpoints of pytrees holding :class:`~jax_gmma.QuantizedArray` and
:class:`~jax_gmma.PackedWeight` leaves (a dict of weights, a list of layers, a Flax NNX state),
saved and restored bit for bit, with no hand-written target.

A checkpoint is an orbax composite of two items (the step layout of ``ocp.CheckpointManager``
too):

``"state"`` (:data:`STATE_ITEM`)
  the tree, written by orbax's ``PyTreeCheckpointHandler``, with each QuantizedArray stored as
  the dict ``{"data", "scales"[, "global_scale"]}`` of its arrays and each PackedWeight as
  ``{"packed", "scales", "global_scale"}`` (:func:`jax_gmma.checkpoint.tree_to_storable`).
  Element and scale arrays keep their dtypes (float8_e4m3fn / float8_e5m2 elements and FP6
  elements in their float8_e4m3fn container, float4_e2m1fn, float8_e4m3fn NVFP4 scales,
  float32 scales and global scales, E8M0 scales as their uint8 bytes, PackedWeight bytes).
  A 1-byte dtype that tensorstore cannot store (``float6_e2m3fn`` / ``float6_e3m2fn`` NumPy
  arrays) is stored as its uint8 bytes and listed in the metadata.
``"jax_gmma"`` (:data:`METADATA_ITEM`)
  a JSON document: the static fields of every object (format, logical shape, axis, element
  dtype, scale layout; PackedWeight format, N, K, ``fp8_exact``, layout version), by path, and
  the dtypes of the raw arrays.

:func:`restore_orbax` reads both: the tree comes back with every object rebuilt through its
checking constructor, the arrays as ``jax.Array`` on the default device (or the shardings
asked for), Python scalars and strings as they were saved. Containers come back as orbax
restores them, dicts and lists (tuples become lists, int dict keys str); pass ``target=`` (the
original tree, ``nnx.state(model)``, or :func:`abstract_target` with shardings set) to get the
target's own containers. Metadata of a newer version, an unknown format or scale layout, and a
PackedWeight layout version this jax_gmma does not read are refused, naming the function.

This module needs the orbax-checkpoint package and is not imported by ``import jax_gmma``.
Raw-byte arrays are copied through the host, which needs them fully addressable (one process).
"""
from __future__ import annotations

import os
from typing import Any, Dict

import jax
import numpy as np

from . import checkpoint
from .arrays import QuantizedArray

try:
  import orbax.checkpoint as ocp
except ImportError:  # optional dependency
  ocp = None
try:
  import tensorstore
except ImportError:  # comes with orbax-checkpoint
  tensorstore = None

__all__ = ["STATE_ITEM", "METADATA_ITEM", "save_args", "save_orbax", "restore_orbax",
           "abstract_target"]

#: Name of the composite item holding the tree.
STATE_ITEM = "state"
#: Name of the composite item holding the JSON metadata.
METADATA_ITEM = "jax_gmma"
_WHO_ARGS = "jax_gmma.checkpoint_orbax.save_args"
_WHO_SAVE = "jax_gmma.checkpoint_orbax.save_orbax"
_WHO_RESTORE = "jax_gmma.checkpoint_orbax.restore_orbax"
_WHO_ABSTRACT = "jax_gmma.checkpoint_orbax.abstract_target"


def _need_orbax(who: str) -> None:
  if ocp is None:
    raise ImportError(f"{who} needs the orbax-checkpoint package: pip install orbax-checkpoint")


def _path(directory) -> str:
  """``directory`` as orbax needs it: a local path made absolute (URLs kept)."""
  d = os.fspath(directory)
  return d if "://" in d else os.path.abspath(d)


def _storable(dt: np.dtype) -> bool:
  """Whether tensorstore stores arrays of ``dt`` as they are."""
  if tensorstore is None:
    return dt.kind in "biuf" and not dt.name.startswith(("float4", "float6", "float8"))
  try:
    tensorstore.dtype(dt.name)
  except (TypeError, ValueError):
    return False
  return True


def _raw_dtypes(tree, who: str) -> set:
  """The dtypes of ``tree``'s array leaves that tensorstore cannot store (stored as bytes)."""
  out = set()
  for leaf in jax.tree_util.tree_leaves(tree):
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
      continue
    try:
      dt = np.dtype(leaf.dtype)
    except TypeError:  # an extended dtype (e.g. PRNG keys): orbax's own business
      continue
    if not _storable(dt):
      if dt.itemsize != 1:
        raise TypeError(f"{who}: tensorstore cannot store arrays of dtype {dt.name}")
      out.add(dt)
  return out


def save_args(tree) -> "ocp.args.Composite":
  """The ``ocp.args.Composite`` that saves ``tree`` (:data:`STATE_ITEM` and
  :data:`METADATA_ITEM`), for an ``ocp.Checkpointer(ocp.CompositeCheckpointHandler())`` or an
  ``ocp.CheckpointManager`` (``manager.save(step, args=save_args(tree))``; read a step with
  ``restore_orbax(manager.directory / str(step))``)."""
  _need_orbax(_WHO_ARGS)
  stored, meta = checkpoint.tree_to_storable(tree, raw_dtypes=_raw_dtypes(tree, _WHO_ARGS))
  return ocp.args.Composite(**{STATE_ITEM: ocp.args.PyTreeSave(stored),
                               METADATA_ITEM: ocp.args.JsonSave(meta)})


def save_orbax(directory, tree, *, force: bool = False) -> None:
  """Writes ``tree`` (any pytree of arrays, scalars, QuantizedArray and PackedWeight objects) to
  the new orbax checkpoint ``directory`` (``force=True`` replaces an existing one), bit-exact.
  Leaves must be concrete arrays (no tracers)."""
  _need_orbax(_WHO_SAVE)
  args = save_args(tree)
  ck = _checkpointer()
  try:
    ck.save(_path(directory), args, force=force)
  finally:
    ck.close()


def _default_sharding(sharding, who: str):
  if sharding is None:
    dev = jax.config.jax_default_device
    if isinstance(dev, str):
      dev = jax.devices(dev)[0]
    return jax.sharding.SingleDeviceSharding(dev if dev is not None else jax.devices()[0])
  if not isinstance(sharding, jax.sharding.Sharding):
    raise TypeError(f"{who}: sharding must be None or a jax.sharding.Sharding (for every array; "
                    "per-leaf shardings go on the target's leaves), got "
                    f"{type(sharding).__name__}")
  return sharding


def _read(ck, path: str, who: str):
  """(checked JSON metadata, orbax metadata tree of the state item) of checkpoint ``path``."""
  try:
    meta = ck.restore(path, ocp.args.Composite(**{METADATA_ITEM: ocp.args.JsonRestore()}))
  except FileNotFoundError:
    raise FileNotFoundError(f"{who}: no checkpoint at {path}") from None
  except (KeyError, ValueError) as e:
    raise ValueError(f"{who}: {path} holds no jax_gmma metadata item {METADATA_ITEM!r} (a "
                     "checkpoint written by jax_gmma.checkpoint_orbax.save_orbax or with its "
                     f"save_args has one): {e}") from None
  meta = checkpoint.check_storable_metadata(meta[METADATA_ITEM], who)
  try:
    items = ck.metadata(path).item_metadata
    tree = items[STATE_ITEM]
  except (KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{who}: {path} holds no {STATE_ITEM!r} item: {e}") from None
  if tree is None:
    raise ValueError(f"{who}: {path} holds no {STATE_ITEM!r} item")
  return meta, getattr(tree, "tree", tree)


def _is_array_metadata(m) -> bool:
  return (isinstance(m, ocp.metadata.ArrayMetadata)
          and not isinstance(m, ocp.metadata.ScalarMetadata))


def _abstract_leaf(m, sharding):
  if _is_array_metadata(m):
    return jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=sharding)
  if isinstance(m, ocp.metadata.ScalarMetadata):
    return np.zeros((), m.dtype)[()]
  return m


def _checkpointer():
  """A checkpointer of the two items (their handlers named: a fresh one then knows how to read
  each item's metadata)."""
  return ocp.Checkpointer(ocp.CompositeCheckpointHandler(
      **{STATE_ITEM: ocp.PyTreeCheckpointHandler(), METADATA_ITEM: ocp.JsonCheckpointHandler()}))


def abstract_target(directory, *, sharding=None):
  """The tree ``restore_orbax(directory)`` returns, abstract: dicts and lists, with
  ``jax.ShapeDtypeStruct`` leaves (``sharding``, default: the default device) and
  QuantizedArray / PackedWeight objects of ShapeDtypeStructs (their formats, shapes and layouts
  from the checkpoint); Python scalars as zeros of their type. Set shardings on its leaves (e.g.
  ``jax.tree.map``) and pass it as ``restore_orbax``'s ``target``."""
  who = _WHO_ABSTRACT
  _need_orbax(who)
  sh = _default_sharding(sharding, who)
  ck = _checkpointer()
  try:
    meta, md = _read(ck, _path(directory), who)
  finally:
    ck.close()
  abstract = jax.tree_util.tree_map(lambda m: _abstract_leaf(m, sh), md)
  return checkpoint.tree_from_storable(abstract, meta, who=who)


def _target_shardings(target) -> Dict[tuple, Any]:
  """path -> sharding of each leaf of ``target`` that has one (arrays, ShapeDtypeStructs with a
  sharding); object fields by their field paths (``.../data``)."""
  out = {}
  for p, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
    s = getattr(leaf, "sharding", None)
    if isinstance(s, jax.sharding.Sharding):
      out[checkpoint.path_key(p)] = s
  return out


def _same_object(t, v) -> bool:
  """Whether restored object ``v`` is the kind of object target leaf ``t`` describes."""
  if type(t) is not type(v):
    return False
  if isinstance(t, QuantizedArray):
    return t.tree_flatten()[1] == v.tree_flatten()[1]
  return (t.format, t.n, t.k) == (v.format, v.n, v.k)


def _onto(target, tree, who: str):
  """``target`` with each leaf (and object) replaced by the leaf of restored ``tree`` at its
  path."""
  flat = {checkpoint.path_key(p): v for p, v in jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=checkpoint.is_quantized_leaf)[0]}

  def pick(path, t):
    key = checkpoint.path_key(path)
    where = "/".join(key) or "the root"
    if key not in flat:
      raise ValueError(f"{who}: the target has a leaf at {where} that the checkpoint lacks")
    v = flat[key]
    objects = checkpoint.is_quantized_leaf(t) or checkpoint.is_quantized_leaf(v)
    if objects and not _same_object(t, v):
      raise ValueError(f"{who}: the target has {t!r} at {where}, the checkpoint {v!r}")
    return v

  return jax.tree_util.tree_map_with_path(pick, target, is_leaf=checkpoint.is_quantized_leaf)


def restore_orbax(directory, target=None, *, sharding=None):
  """The tree saved in the orbax checkpoint ``directory`` by :func:`save_orbax` (or
  :func:`save_args`), bit-exact, every QuantizedArray / PackedWeight rebuilt from the saved
  metadata (no target needed).

  Arrays come back as ``jax.Array``: with the sharding of the target's leaf at the same path
  where ``target`` gives one (a ``jax.Array``, or a ``jax.ShapeDtypeStruct`` with a sharding;
  an object's fields by field), else ``sharding`` (a ``jax.sharding.Sharding``), else on the
  default device. Without ``target`` the containers are dicts and lists (see the module
  docstring); with one, the result has ``target``'s structure and containers (leaves of the
  checkpoint that ``target`` lacks are dropped; a target leaf the checkpoint lacks, or an
  object of another format or shape, is an error)."""
  who = _WHO_RESTORE
  _need_orbax(who)
  default = _default_sharding(sharding, who)
  wanted = {} if target is None else _target_shardings(target)
  path = _path(directory)
  ck = _checkpointer()
  try:
    meta, md = _read(ck, path, who)

    def arg(p, m):
      if _is_array_metadata(m):
        return ocp.ArrayRestoreArgs(restore_type=jax.Array,
                                    sharding=wanted.get(checkpoint.path_key(p), default))
      return ocp.RestoreArgs()

    restore_args = jax.tree_util.tree_map_with_path(arg, md)
    restored = ck.restore(path, ocp.args.Composite(
        **{STATE_ITEM: ocp.args.PyTreeRestore(restore_args=restore_args)}))[STATE_ITEM]
  finally:
    ck.close()
  tree = checkpoint.tree_from_storable(restored, meta, who=who)
  return tree if target is None else _onto(target, tree, who)
