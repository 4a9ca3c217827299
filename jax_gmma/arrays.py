"""The array types of jax_gmma: :class:`QuantizedArray` (elements + scales + NVFP4 global scale,
a pytree; see :mod:`jax_gmma.ops.quantize` for what it stores) and its scale-layout helpers.
(:class:`~jax_gmma.ops.weightonly.PackedWeight`, the prepared weight-only layout, lives with the
weight-only family: its fields are that kernel's layout.)
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np

from .numerics import formats, layouts
from .numerics.formats import FORMATS, Format, as_dtype, get_format
from .numerics.scaling import dequantize_blocks

__all__ = ["QuantizedArray", "dequantize", "to_layout", "layout_or_error", "check_layout_format",
           "rowmajor_scales", "LAYOUT_ROWMAJOR"]

_E4M3 = formats.E4M3
LAYOUT_ROWMAJOR = "rowmajor"


# ----------------------------------------------------------------------------
# QuantizedArray pytree
# ----------------------------------------------------------------------------
@jax.tree_util.register_pytree_node_class
class QuantizedArray:
  """A quantised operand: elements + scales (+ NVFP4 global scale).

  Pytree children: ``(data, scales, global_scale)`` (``global_scale`` may be
  None).  Static aux data: ``(format name, layout, logical shape, axis,
  element dtype name)``.

  Attributes:
    data: elements, canonical ``(..., rows, Kp)`` (see module docstring).
    scales: plain row-major dequantisation scales.
    global_scale: float32 scalar (NVFP4) or None.
    format: the :class:`~jax_gmma.formats.Format` row.
    shape: logical (original, unpadded, un-transposed) shape.
    axis: contraction axis of the original array (non-negative).
    dtype: logical element dtype (e.g. float6_e2m3fn even if stored in a
      float8_e4m3fn container).
    layout: scale layout name, ``"rowmajor"`` (plain scales) or
      ``"sm100_128x4"`` (swizzled; see :mod:`jax_gmma.layouts`).
  """

  __slots__ = ("data", "scales", "global_scale", "_format", "_layout",
               "_shape", "_axis", "_dtype_name")

  def __init__(self, data, scales, global_scale=None, *, format,
               shape, axis: int = -1, dtype=None,
               layout: str = LAYOUT_ROWMAJOR):
    fmt = get_format(format)
    shape = tuple(int(s) for s in shape)
    if not shape:
      raise ValueError("QuantizedArray: shape must have at least 1 dim")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
      raise TypeError(f"QuantizedArray: axis must be an int, got {axis!r}")
    if not -len(shape) <= axis < len(shape):
      raise ValueError(f"QuantizedArray: axis {axis} out of range for "
                       f"shape {shape}")
    lay = layout_or_error(layout, "QuantizedArray")
    if fmt.has_global_scale and global_scale is None:
      raise ValueError(f"QuantizedArray: format {fmt.name!r} needs a "
                       "global_scale")
    if not fmt.has_global_scale and global_scale is not None:
      raise ValueError(f"QuantizedArray: format {fmt.name!r} has no "
                       "global_scale, got one")
    dt = fmt.check_dtype(dtype, "QuantizedArray")
    check_layout_format(fmt, lay, "QuantizedArray")
    self.data = data
    self.scales = scales
    self.global_scale = global_scale
    self._format = fmt.name
    self._layout = lay.name
    self._shape = shape
    self._axis = int(axis) % len(shape)
    self._dtype_name = dt.name

  # -- pytree protocol -------------------------------------------------------
  def tree_flatten(self):
    children = (self.data, self.scales, self.global_scale)
    aux = (self._format, self._layout, self._shape, self._axis,
           self._dtype_name)
    return children, aux

  @classmethod
  def tree_unflatten(cls, aux, children):
    # No validation: children may be tracers, None or sentinels here.
    obj = object.__new__(cls)
    obj.data, obj.scales, obj.global_scale = children
    (obj._format, obj._layout, obj._shape, obj._axis,
     obj._dtype_name) = aux
    return obj

  # -- properties ------------------------------------------------------------
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
    def desc(a):
      if a is None:
        return "None"
      try:
        return f"{np.dtype(a.dtype).name}{list(a.shape)}"
      except Exception:  # noqa: BLE001 - e.g. sentinel leaves
        return repr(a)
    return (f"QuantizedArray(format={self._format!r}, shape={self._shape}, "
            f"axis={self._axis}, dtype={self._dtype_name}, "
            f"data={desc(self.data)}, scales={desc(self.scales)}, "
            f"global_scale={desc(self.global_scale)}, "
            f"layout={self._layout!r})")


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

  NaN scales (blocks that held NaN/Inf in FP4/FP6 formats) give NaN.
  Swizzled scales (``q.layout != "rowmajor"``) are unswizzled first."""
  who = "dequantize"
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"{who}: q must be a QuantizedArray, got "
                    f"{type(q).__name__}")
  out_dt = as_dtype(dtype, f"{who}: dtype")
  if not jnp.issubdtype(out_dt, jnp.floating):
    raise TypeError(f"{who}: dtype must be a floating dtype, got "
                    f"{out_dt.name}")
  return dequantize_blocks(q.data, rowmajor_scales(q), q.global_scale,
                           q.format.name,
                           q.canonical_shape[-1], q.axis, out_dt.name)



def to_layout(q, layout):
  """A copy of QuantizedArray ``q`` whose scales are stored in ``layout``
  (same data, global scale, format, shape, axis, dtype).  Returns ``q``
  itself if it already uses ``layout``.  Non-row-major layouts need a
  block-scaled format with E8M0/E4M3 scales (MX formats, NVFP4)."""
  who = "to_layout"
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"{who}: q must be a QuantizedArray, got "
                    f"{type(q).__name__}")
  lay = layouts.resolve_layout(layout, who)
  if lay.name == q.layout:
    return q
  check_layout_format(q.format, lay, who)
  rows_kb = q.format.scales_shape(q.canonical_shape)[-2:]
  plain = layouts.unswizzle_scales(q.scales, *rows_kb, layout=q.layout)
  scales = layouts.swizzle_scales(plain, lay)
  return QuantizedArray(q.data, scales, q.global_scale, format=q.format,
                        shape=q.shape, axis=q.axis, dtype=q.dtype,
                        layout=lay.name)
