"""The array types of jax_gmma: :class:`QuantizedArray` (elements + scales + NVFP4 global scale,
a pytree; see :mod:`jax_gmma.ops.quantize` for what it stores) and its scale-layout helpers.
(:class:`~jax_gmma.ops.weightonly.PackedWeight`, the prepared weight-only layout, lives with the
weight-only family: its fields are that kernel's layout.)

Every field of a :class:`QuantizedArray` built by its constructor is checked against the format
(``jax_gmma.numerics.shapes.quantized_shapes``, the same rule :func:`jax_gmma.quantize` stores
by). Arrays, tracers and ``jax.ShapeDtypeStruct`` values are checked alike; the objects JAX
rebuilds from leaves (``tree_unflatten``: tracers, placeholders) are not, and
:func:`check_fields` checks those where they are used.

Differentiation. ``float8_e8m0fnu`` has no zero (0 rounds to NaN) and no negative values, so it
is no vector space: a JAX cotangent of that dtype would be NaN. The E8M0 scales of the MX
formats are therefore held in the pytree as their raw bytes (``uint8``; ``QuantizedArray.scales``
gives the ``float8_e8m0fnu`` view), so that their cotangent is ``float0``, as for integers
(``jax.grad(..., allow_int=True)``). :func:`dequantize` treats the elements and the low-precision
scales as constants (a zero cotangent) and differentiates the float32 scales and global scale.
"""
from __future__ import annotations

import json
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ._compat import register_pytree_node_serialization
from .numerics import formats, layouts, shapes
from .numerics.codec import storage_dtype
from .numerics.formats import FORMATS, Format, as_dtype, get_format
from .numerics.scaling import dequantize_blocks

__all__ = ["QuantizedArray", "dequantize", "to_layout", "layout_or_error", "check_layout_format",
           "check_fields", "check_leaves", "rowmajor_scales", "LAYOUT_ROWMAJOR"]

_E4M3 = formats.E4M3
_E8M0 = formats.E8M0
_F32 = formats.F32
_U8 = np.dtype(np.uint8)
LAYOUT_ROWMAJOR = "rowmajor"
_WHO = "jax_gmma.QuantizedArray"
#: Version of the serialized static fields (``jax.export``).
_SERIAL_VERSION = 1


# ----------------------------------------------------------------------------
# leaves
# ----------------------------------------------------------------------------
def _is_array(a) -> bool:
  """An array, a tracer or a ``jax.ShapeDtypeStruct`` (anything with a shape and a dtype)."""
  return hasattr(a, "shape") and hasattr(a, "dtype")


def _dtype(a):
  try:
    return np.dtype(a.dtype)
  except Exception:  # noqa: BLE001 - not a NumPy dtype (e.g. an extended dtype)
    return None


def _bits_leaf(fmt: Format) -> bool:
  """Whether ``fmt``'s scales are held in the pytree as raw uint8 bytes (E8M0)."""
  return fmt.scale_dtype == _E8M0


def _view(a, dtype):
  """``a`` reinterpreted bit for bit as the 1-byte ``dtype`` (same shape)."""
  if isinstance(a, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(a.shape, dtype, sharding=a.sharding)
  if isinstance(a, (np.ndarray, np.generic)):
    return np.asarray(a).view(dtype)
  return jax.lax.bitcast_convert_type(a, dtype)


# ----------------------------------------------------------------------------
# QuantizedArray pytree
# ----------------------------------------------------------------------------
class QuantizedArray:
  """A quantised operand: elements + scales (+ NVFP4 global scale).

  Pytree children: ``(data, scales, global_scale)`` (``global_scale`` may be
  None; E8M0 scales as their raw ``uint8`` bytes, see the module docstring).
  Static aux data: ``(format name, layout, logical shape, axis, element
  dtype name)``.

  The constructor checks every field against the format and the layout
  (``jax_gmma.numerics.shapes.quantized_shapes``): the element container
  dtype and the shape ``(..., rows, Kp)`` of ``data``, the dtype and the
  (row-major or swizzled) shape of ``scales``, a float32 scalar
  ``global_scale`` exactly for NVFP4. ``dtype=None`` takes ``data``'s dtype
  when the format allows it, else the format's default.

  Attributes:
    data: elements, canonical ``(..., rows, Kp)`` (see module docstring).
    scales: dequantisation scales (plain row-major, or swizzled per layout).
    global_scale: float32 scalar (NVFP4) or None.
    format: the :class:`~jax_gmma.formats.Format` row.
    shape: logical (original, unpadded, un-transposed) shape.
    axis: contraction axis of the original array (non-negative).
    dtype: logical element dtype (e.g. float6_e2m3fn even if stored in a
      float8_e4m3fn container).
    layout: scale layout name, ``"rowmajor"`` (plain scales) or
      ``"sm100_128x4"`` (swizzled; see :mod:`jax_gmma.layouts`).
  """

  __slots__ = ("data", "_scales", "global_scale", "_format", "_layout",
               "_shape", "_axis", "_dtype_name")

  def __init__(self, data, scales, global_scale=None, *, format,
               shape, axis: int = -1, dtype=None,
               layout: str = LAYOUT_ROWMAJOR):
    who = _WHO
    if not isinstance(format, (str, Format)):
      raise TypeError(f"{who}: format must be a format name (str) or Format, got "
                      f"{type(format).__name__}")
    try:
      fmt = get_format(format)
    except ValueError as e:
      raise ValueError(f"{who}: format: {str(e).replace('get_format: ', '')}") from None
    lay = layout_or_error(layout, who)
    check_layout_format(fmt, lay, who)
    if fmt.has_global_scale and global_scale is None:
      raise ValueError(f"{who}: format {fmt.name!r} needs a global_scale "
                       "(a float32 scalar)")
    if not fmt.has_global_scale and global_scale is not None:
      raise ValueError(f"{who}: format {fmt.name!r} has no global_scale, got one "
                       "(global_scale must be None)")
    if dtype is None and _is_array(data) and _dtype(data) in fmt.allowed_dtypes:
      dtype = _dtype(data)
    dt = fmt.check_dtype(dtype, who)
    if isinstance(global_scale, float):
      global_scale = np.asarray(global_scale, np.float32)
    sh = shapes.quantized_shapes(fmt, shape, axis, lay, who=who, name="shape")
    check_fields(fmt, lay, sh, dt, data, scales, global_scale, who)
    self.data = data
    self._scales = _view(scales, _U8) if _bits_leaf(fmt) else scales
    self.global_scale = global_scale
    self._format = fmt.name
    self._layout = lay.name
    self._shape = _declared(shape)
    self._axis = int(axis) % len(self._shape)
    self._dtype_name = dt.name

  # -- pytree protocol -------------------------------------------------------
  def tree_flatten(self):
    children = (self.data, self._scales, self.global_scale)
    aux = (self._format, self._layout, self._shape, self._axis,
           self._dtype_name)
    return children, aux

  def tree_flatten_with_keys(self):
    """Named leaves (``.data``, ``.scales``, ``.global_scale``): the paths that ``jax.tree_util``,
    checkpointers and model-state tools show."""
    children, aux = self.tree_flatten()
    return tuple(zip(_LEAF_KEYS, children)), aux

  @classmethod
  def tree_unflatten(cls, aux, children):
    # No validation: children may be tracers, None, object() placeholders or cotangents
    # (float0) here; check_fields checks them where they are used.
    obj = object.__new__(cls)
    obj.data, obj._scales, obj.global_scale = children
    (obj._format, obj._layout, obj._shape, obj._axis,
     obj._dtype_name) = aux
    return obj

  # -- properties ------------------------------------------------------------
  @property
  def scales(self):
    """The scales in the format's scale dtype (E8M0 scales: the float8_e8m0fnu view of the
    stored bytes)."""
    s = self._scales
    if _bits_leaf(self.format) and _is_array(s) and _dtype(s) == _U8:
      return _view(s, _E8M0)
    return s

  @property
  def format(self) -> Format:
    return FORMATS[self._format]

  @property
  def layout(self) -> str:
    return self._layout

  @property
  def shape(self) -> Tuple[int, ...]:
    return self._shape

  @property
  def ndim(self) -> int:
    return len(self._shape)

  @property
  def axis(self) -> int:
    return self._axis

  @property
  def k(self) -> int:
    """Original (unpadded) contraction length."""
    return self._shape[self._axis]

  @property
  def padded_k(self) -> int:
    """Stored contraction length (K rounded up to whole blocks)."""
    return self.format.padded_k(self.k)

  @property
  def dtype(self) -> np.dtype:
    """Logical element dtype."""
    return as_dtype(self._dtype_name)

  @property
  def canonical_shape(self) -> Tuple[int, ...]:
    """Logical shape with the K axis moved last (unpadded)."""
    s = list(self._shape)
    k = s.pop(self._axis)
    return (*s, k)

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    return dequantize(self, dtype)

  def __repr__(self) -> str:
    def desc(a, logical=None):
      if a is None:
        return "None"
      try:
        dt = logical if logical is not None and _dtype(a) == _U8 else np.dtype(a.dtype)
        return f"{dt.name}{list(a.shape)}"
      except Exception:  # noqa: BLE001 - e.g. sentinel leaves
        return repr(a)
    logical = self.format.scale_dtype if _bits_leaf(self.format) else None
    return (f"QuantizedArray(format={self._format!r}, shape={self._shape}, "
            f"axis={self._axis}, dtype={self._dtype_name}, "
            f"data={desc(self.data)}, scales={desc(self._scales, logical)}, "
            f"global_scale={desc(self.global_scale)}, "
            f"layout={self._layout!r})")


def _declared(shape) -> tuple:
  """The declared logical shape as stored in the static fields (ints as Python ints)."""
  return tuple(int(d) if shapes.is_constant_dim(d) else d for d in shape)


_LEAF_KEYS = tuple(jax.tree_util.GetAttrKey(n) for n in ("data", "scales", "global_scale"))
jax.tree_util.register_pytree_with_keys_class(QuantizedArray)


def _serialize_aux(aux) -> bytes:
  fmt, lay, shape, axis, dt = aux
  if not all(shapes.is_constant_dim(d) for d in shape):
    raise ValueError(
      f"{_WHO}: cannot serialize a QuantizedArray whose shape {shapes.fmt_shape(shape)} has "
      "symbolic dimensions: its shape is static metadata, fixed at export. Export a function "
      "that takes and returns plain arrays there (e.g. the float input, or data and scales)")
  return json.dumps({"version": _SERIAL_VERSION, "format": fmt, "layout": lay,
                     "shape": [int(d) for d in shape], "axis": int(axis), "dtype": dt},
                    sort_keys=True).encode("utf-8")


def _deserialize_aux(blob: bytes):
  d = json.loads(bytes(blob).decode("utf-8"))
  if d.get("version") != _SERIAL_VERSION or d.get("format") not in FORMATS:
    raise ValueError(f"{_WHO}: cannot deserialize static fields {d!r}: version "
                     f"{d.get('version')!r} (this jax_gmma reads {_SERIAL_VERSION}) or unknown "
                     "format")
  return (d["format"], d["layout"], tuple(int(s) for s in d["shape"]), int(d["axis"]),
          d["dtype"])


register_pytree_node_serialization(QuantizedArray, serialized_name=_WHO,
                                   serialize_auxdata=_serialize_aux,
                                   deserialize_auxdata=_deserialize_aux)


def check_fields(fmt: Format, lay, sh: "shapes.QuantizedShapes", dt, data, scales, global_scale,
                 who: str, *, stored: bool = False) -> None:
  """Checks the leaves of a quantized operand against the format ``fmt``, scale layout ``lay``,
  the expected shapes ``sh`` (:func:`jax_gmma.numerics.shapes.quantized_shapes`) and the element
  dtype ``dt``: ``TypeError`` (dtype) / ``ValueError`` (shape) naming ``who``, the field, the
  format and the expected value. ``stored``: E8M0 scales may be their raw uint8 bytes (the
  pytree leaf)."""
  spec = f"format {fmt.name!r}"
  for name, leaf in (("data", data), ("scales", scales)):
    if not _is_array(leaf):
      raise TypeError(f"{who}: {name} must be an array (or a jax.ShapeDtypeStruct), got "
                      f"{type(leaf).__name__}")
  try:
    store = storage_dtype(dt)
  except TypeError as e:
    raise TypeError(f"{who}: {spec}: {e}") from None
  got = _dtype(data)
  if got != store:
    held = "" if store == dt else f" (the exact container of {dt.name})"
    raise TypeError(f"{who}: data must be {store.name}{held} for {spec} with dtype "
                    f"{dt.name}, got {got.name if got is not None else data.dtype}")
  if not shapes.same_shape(data.shape, sh.data):
    hint = ""
    n = len(data.shape) - len(sh.data)
    if n > 0 and shapes.same_shape(data.shape[n:], sh.data):
      hint = (f"; data has {n} extra leading dimension(s): a QuantizedArray stacked with "
              "jax.tree.map must be used under jax.vmap (or quantize the stacked array)")
    k = sh.canonical[-1]
    pad = "" if fmt.kind != "block" else (f", Kp = K = {k} rounded up to whole blocks of "
                                           f"{fmt.block_shape[1]}")
    raise ValueError(f"{who}: data must have shape {shapes.fmt_shape(sh.data)} for {spec} and "
                     f"the declared shape (canonical, K last: {shapes.fmt_shape(sh.canonical)}"
                     f"{pad}), got {shapes.fmt_shape(data.shape)}{hint}")
  got = _dtype(scales)
  ok = got == fmt.scale_dtype or (stored and _bits_leaf(fmt) and got == _U8)
  if not ok:
    raise TypeError(f"{who}: scales must be {fmt.scale_dtype.name} for {spec}, got "
                    f"{got.name if got is not None else scales.dtype}")
  if not shapes.same_shape(scales.shape, sh.scales):
    where = ("row-major" if lay.name == LAYOUT_ROWMAJOR else
             f"layout {lay.name!r} (row-major {shapes.fmt_shape(sh.rowmajor_scales)} swizzled)")
    raise ValueError(f"{who}: scales must have shape {shapes.fmt_shape(sh.scales)} for {spec} "
                     f"({fmt._block_str()} blocks, {where}) and data "
                     f"{shapes.fmt_shape(sh.data)}, got {shapes.fmt_shape(scales.shape)}")
  if sh.global_scale is not None:
    if not _is_array(global_scale):
      raise TypeError(f"{who}: global_scale must be a float32 scalar for {spec}, got "
                      f"{type(global_scale).__name__}")
    got = _dtype(global_scale)
    if got != _F32:
      raise TypeError(f"{who}: global_scale must be a float32 scalar for {spec}, got "
                      f"{got.name if got is not None else global_scale.dtype}")
    if tuple(global_scale.shape) != ():
      raise ValueError(f"{who}: global_scale must be a float32 scalar (shape ()) for {spec}, "
                       f"got shape {shapes.fmt_shape(global_scale.shape)}")


def check_leaves(q: QuantizedArray, who: str) -> None:
  """Checks the leaves of an existing QuantizedArray (one JAX rebuilt from leaves, or stacked
  with ``jax.tree.map``) against its static fields; placeholder leaves are not checked."""
  if not (_is_array(q.data) and _is_array(q._scales)):
    return
  fmt = q.format
  lay = layouts.get_layout(q.layout)
  sh = shapes.quantized_shapes(fmt, q.shape, q.axis, lay, who=who, name="q.shape")
  check_fields(fmt, lay, sh, q.dtype, q.data, q._scales, q.global_scale, who, stored=True)


def layout_or_error(layout, who: str) -> "layouts.ScaleLayout":
  """Registered scale layout named ``layout`` (alias ok), or an error that
  lists the valid names."""
  names = " or ".join(repr(n) for n in layouts.LAYOUT_NAMES)
  if not isinstance(layout, (str, layouts.ScaleLayout)):
    raise TypeError(f"{who}: layout must be {names}, got {layout!r}")
  try:
    return layouts.get_layout(layout)
  except ValueError:
    raise ValueError(f"{who}: layout must be {names} (see "
                     f"jax_gmma.layouts.LAYOUTS), got {layout!r}") from None


def check_layout_format(fmt: Format, lay, who: str) -> None:
  """A non-row-major (swizzled) scale layout needs E8M0/E4M3 block scales
  with one scale row per data row (MX formats, NVFP4)."""
  if lay.name == LAYOUT_ROWMAJOR:
    return
  if not (fmt.kind == "block" and fmt.block_shape[0] == 1
          and fmt.scale_dtype in (formats.E8M0, _E4M3)):
    ok = ", ".join(f.name for f in FORMATS.values()
                   if f.kind == "block" and f.block_shape[0] == 1
                   and f.scale_dtype in (formats.E8M0, _E4M3))
    raise ValueError(
      f"{who}: layout {lay.name!r} is only for block-scaled formats "
      f"with E8M0/E4M3 scales ({ok}); format {fmt.name!r} has "
      f"{fmt.scale_dtype.name} {fmt._block_str()} scales")


def rowmajor_scales(q: "QuantizedArray"):
  """``q.scales`` as the plain row-major array (unswizzled if needed)."""
  if q.layout == LAYOUT_ROWMAJOR:
    return q.scales
  rows, kb = q.format.scales_shape(q.canonical_shape)[-2:]
  return layouts.unswizzle_scales(q.scales, rows, kb, q.layout)


def dequantize(q: QuantizedArray, dtype=jnp.float32) -> jax.Array:
  """Reconstruct ``data * scales (* global_scale)`` in the original shape and
  axis order (K padding removed), computed in float32 and cast to ``dtype``.

  NaN scales (blocks that held NaN/Inf in FP4/FP6 formats) give NaN; NaN
  elements stay NaN. Swizzled scales (``q.layout != "rowmajor"``) are
  unswizzled first.

  Differentiable with respect to the float32 scales and the global scale;
  the elements and the low-precision (E4M3 / E8M0) scales are constants:
  their cotangent is zero (``float0`` for the E8M0 bytes), never NaN."""
  who = "jax_gmma.dequantize"
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"{who}: q must be a QuantizedArray, got "
                    f"{type(q).__name__}")
  try:
    out_dt = as_dtype(dtype, f"{who}: dtype")
  except TypeError:
    raise TypeError(f"{who}: dtype must be a floating dtype, got {dtype!r}") from None
  if not jnp.issubdtype(out_dt, jnp.floating):
    raise TypeError(f"{who}: dtype must be a floating dtype, got "
                    f"{out_dt.name}")
  check_leaves(q, who)
  # Low-precision leaves are constants: a cotangent in their own dtype would be rounded to it
  # (float8: overflow to NaN) or, for E8M0, cannot be zero at all.
  data = jax.lax.stop_gradient(q.data)
  scales = rowmajor_scales(q)
  if _dtype(scales) != _F32:
    scales = jax.lax.stop_gradient(scales)
  return dequantize_blocks(data, scales, q.global_scale, q.format.name,
                           q.canonical_shape[-1], q.axis, out_dt.name)


def to_layout(q, layout):
  """A copy of QuantizedArray ``q`` whose scales are stored in ``layout``
  (same data, global scale, format, shape, axis, dtype).  Returns ``q``
  itself if it already uses ``layout``.  Non-row-major layouts need a
  block-scaled format with E8M0/E4M3 scales (MX formats, NVFP4)."""
  who = "jax_gmma.arrays.to_layout"
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"{who}: q must be a QuantizedArray, got "
                    f"{type(q).__name__}")
  lay = layouts.resolve_layout(layout, who)
  if lay.name == q.layout:
    return q
  check_layout_format(q.format, lay, who)
  check_leaves(q, who)
  plain = rowmajor_scales(q)
  scales = layouts.swizzle_scales(plain, lay)
  return QuantizedArray(q.data, scales, q.global_scale, format=q.format,
                        shape=q.shape, axis=q.axis, dtype=q.dtype,
                        layout=lay.name)
