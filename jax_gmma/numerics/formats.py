"""Registry of low-precision matmul operand formats supported by jax-gmma.

Every format is one immutable :class:`Format` row describing

* the **element (data) dtype** -- a NumPy / ``ml_dtypes`` dtype -- and the
  alternatives a caller may pick instead (e.g. the FP8 rows accept both
  ``float8_e4m3fn`` and ``float8_e5m2``);
* the **scale dtype** and the **block shape** a scale covers.  Operands are
  viewed as ``(..., rows, K)`` with ``K`` the contraction axis.  The block shape
  is ``(rows per block, K per block)``:

  ===============  ===========================================================
  ``"tensor"``     one scale for the whole tensor (all leading dims included)
  ``"channel"``    one scale per row: per output channel of an ``(N, K)``
                   weight, per token of an ``(M, K)`` activation
  ``(1, 128)``     DeepSeek-style activation blocks, 1 x 128 along K
  ``(128, 128)``   DeepSeek-style weight blocks, 128 rows x 128 K
  ``(1, 32)``      OCP MX blocks (mxfp8 / mxfp6 / mxfp4)
  ``(1, 16)``      NVFP4 blocks
  ===============  ===========================================================

* the **scale layout** of the plain (non-swizzled) scale array produced by
  :func:`jax_gmma.ops.quantize.quantize` -- always row-major, see the per-row
  ``scale_layout`` strings.  Hardware-blocked (swizzled) layouts used by the
  kernels are a later transformation of this array;
* the **packing** used when the elements are handed to a kernel: FP8 is one
  element per byte (``None``), FP4 is two elements per byte (low nibble holds
  the even element), FP6 is four elements in three bytes (see
  :func:`jax_gmma.ops.quantize.pack_fp6` for the exact bit order);
* whether the scales are powers of two (the E8M0 scales of the MX formats);
* the largest finite value of the element dtype (saturation bound).

NVFP4 additionally carries one float32 per-tensor *global* scale
(``global_scale_dtype``), so ``x ~= data * block_scale * global_scale``.

Use :func:`get_format` to look a row up by name, :data:`FORMATS` for the whole
registry and :func:`formats_table` for a human-readable summary.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import ml_dtypes
import numpy as np

__all__ = [
  "Format",
  "FORMATS",
  "FORMAT_NAMES",
  "BlockShape",
  "get_format",
  "formats_table",
  "as_dtype",
  "dtype_max",
  "dtype_emax",
]

BlockShape = Union[str, Tuple[int, int]]

# Element / scale dtypes used below (NumPy dtype objects).
F32 = np.dtype(np.float32)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E2M3 = np.dtype(ml_dtypes.float6_e2m3fn)
E3M2 = np.dtype(ml_dtypes.float6_e3m2fn)

# Storage width in bits of each low-precision element dtype.
_ELEMENT_BITS = {E4M3: 8, E5M2: 8, E2M1: 4, E2M3: 6, E3M2: 6}


def as_dtype(dtype, who: str = "dtype") -> np.dtype:
  """Normalise ``dtype`` (NumPy / ml_dtypes / jnp scalar type, np.dtype or
  name such as ``"float8_e5m2"``) to a :class:`numpy.dtype`.

  Raises ``TypeError`` naming ``who`` if it is not a dtype.
  """
  if isinstance(dtype, str):
    if hasattr(ml_dtypes, dtype):
      return np.dtype(getattr(ml_dtypes, dtype))
  try:
    return np.dtype(dtype)
  except TypeError:
    raise TypeError(f"{who} must be a dtype, got {dtype!r}") from None


def dtype_max(dtype) -> float:
  """Largest finite value of a floating dtype (saturation bound)."""
  return float(ml_dtypes.finfo(as_dtype(dtype)).max)


def dtype_emax(dtype) -> int:
  """Exponent of the largest normal number of ``dtype`` (``emax_elem`` of the
  OCP MX spec v1.0: e4m3 -> 8, e5m2 -> 15, e2m1 -> 2, e2m3 -> 2, e3m2 -> 4)."""
  return int(ml_dtypes.finfo(as_dtype(dtype)).maxexp) - 1


@dataclasses.dataclass(frozen=True)
class Format:
  """One row of the format registry (immutable).

  Attributes:
    name: registry key, e.g. ``"mxfp8"``.
    dtype: default element (data) dtype.
    allowed_dtypes: element dtypes accepted for this format (``dtype`` first).
    scale_dtype: dtype of the block scales.
    block_shape: ``"tensor"``, ``"channel"`` or ``(rows, k)`` per scale.
    scale_layout: description of the plain scale array layout.
    packing: how elements are packed for kernels (``None`` = 1 per byte).
    pow2_scales: True when every scale is an exact power of two (E8M0).
    max_value: largest finite value of the default element ``dtype``.
    global_scale_dtype: dtype of the extra per-tensor scale (NVFP4) or None.
    scale_rule: how the scales are computed from the block amax.
    description: one-line human description.
  """

  name: str
  dtype: np.dtype
  allowed_dtypes: Tuple[np.dtype, ...]
  scale_dtype: np.dtype
  block_shape: BlockShape
  scale_layout: str
  packing: Optional[str]
  pow2_scales: bool
  max_value: float
  global_scale_dtype: Optional[np.dtype] = None
  scale_rule: str = ""
  description: str = ""

  # -- derived properties -------------------------------------------------
  @property
  def kind(self) -> str:
    """``"tensor"``, ``"channel"`` or ``"block"``."""
    return self.block_shape if isinstance(self.block_shape, str) else "block"

  @property
  def is_mx(self) -> bool:
    """True for the OCP MX formats (E8M0 power-of-two scales, block 32)."""
    return self.scale_dtype == E8M0

  @property
  def has_global_scale(self) -> bool:
    return self.global_scale_dtype is not None

  @property
  def element_bits(self) -> int:
    """Storage width in bits of one element of the default dtype."""
    return _ELEMENT_BITS[self.dtype]

  def block_dims(self, rows: int, k: int) -> Tuple[int, int]:
    """Concrete ``(rows per block, K per block)`` for a ``(rows, K)``
    operand (``"tensor"`` -> ``(rows, K)``, ``"channel"`` -> ``(1, K)``)."""
    if self.block_shape == "tensor":
      return rows, k
    if self.block_shape == "channel":
      return 1, k
    return self.block_shape  # type: ignore[return-value]

  def padded_k(self, k: int) -> int:
    """K rounded up to a whole number of blocks (the stored data width)."""
    if isinstance(self.block_shape, str):
      return k
    bk = self.block_shape[1]
    return -(-k // bk) * bk

  def scales_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """Shape of the plain scale array for a canonical ``(..., rows, K)``
    operand of shape ``shape`` (dimensions may be symbolic)."""
    shape = tuple(int(s) if isinstance(s, (int, np.integer)) else s for s in shape)
    if self.block_shape == "tensor":
      return ()
    *lead, rows, k = shape
    br, bk = self.block_dims(rows, k)
    return (*lead, -(-rows // br), -(-k // bk))

  def check_dtype(self, dtype, who: str = "quantize") -> np.dtype:
    """Validate an element dtype for this format; ``None`` -> default.

    Raises ``ValueError`` listing the allowed dtypes."""
    if dtype is None:
      return self.dtype
    dt = as_dtype(dtype, f"{who}: dtype")
    if dt not in self.allowed_dtypes:
      allowed = ", ".join(d.name for d in self.allowed_dtypes)
      raise ValueError(
        f"{who}: format {self.name!r}: dtype must be one of {allowed}, "
        f"got {dt.name}")
    return dt

  def max_for(self, dtype=None) -> float:
    """Saturation bound for element dtype ``dtype`` (default dtype if None)."""
    return dtype_max(self.check_dtype(dtype, "max_for"))

  def emax_elem(self, dtype=None) -> int:
    """``emax_elem`` of the OCP MX spec for element dtype ``dtype``."""
    return dtype_emax(self.check_dtype(dtype, "emax_elem"))

  # -- printing -------------------------------------------------------------
  def _block_str(self) -> str:
    if isinstance(self.block_shape, str):
      return "per-" + self.block_shape
    return "x".join(str(b) for b in self.block_shape)

  def describe(self) -> str:
    """Multi-line human-readable description of this format."""
    alts = ", ".join(d.name for d in self.allowed_dtypes)
    lines = [
      f"{self.name}: {self.description}",
      f"  data dtype     : {self.dtype.name} (allowed: {alts})",
      f"  max value      : {self.max_value:g}",
      f"  scale dtype    : {self.scale_dtype.name}"
      + (" (powers of two)" if self.pow2_scales else ""),
      f"  block (rows,K) : {self._block_str()}",
      f"  scale layout   : {self.scale_layout}",
      f"  scale rule     : {self.scale_rule}",
      f"  packing        : {self.packing or '1 element per byte'}",
    ]
    if self.global_scale_dtype is not None:
      lines.append(f"  global scale   : one {self.global_scale_dtype.name} "
                   "per tensor")
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.describe()


def _row(name, dtype, allowed, scale_dtype, block, layout, packing, pow2,
         rule, description, global_scale_dtype=None) -> Format:
  dtype = np.dtype(dtype)
  return Format(
    name=name,
    dtype=dtype,
    allowed_dtypes=tuple(np.dtype(d) for d in allowed),
    scale_dtype=np.dtype(scale_dtype),
    block_shape=block,
    scale_layout=layout,
    packing=packing,
    pow2_scales=pow2,
    max_value=dtype_max(dtype),
    global_scale_dtype=(None if global_scale_dtype is None
                        else np.dtype(global_scale_dtype)),
    scale_rule=rule,
    description=description,
  )


_FP8 = (E4M3, E5M2)
_AMAX_RULE = "scale = amax / max_value (zero block -> 1), float32"
_E8M0_RULE = ("scale = 2^(floor(log2(amax)) - emax_elem) "
              "(OCP MX v1.0; zero block -> 1)")
_FP4_PACK = "2 per byte (low nibble first)"
_FP6_PACK = "4 values in 3 bytes (little-endian 24-bit groups)"
_MX_LAYOUT = "row-major (..., rows, ceil(K/32))"

_ROWS = (
  _row("fp8_tensor", E4M3, _FP8, F32, "tensor",
       "scalar () float32, one scale for the whole tensor", None, False,
       _AMAX_RULE, "FP8 with one float32 per-tensor scale"),
  _row("fp8_channel", E4M3, _FP8, F32, "channel",
       "row-major (..., rows, 1)", None, False, _AMAX_RULE,
       "FP8 with one float32 scale per row (weight output channel / token)"),
  _row("fp8_1x128", E4M3, _FP8, F32, (1, 128),
       "row-major (..., rows, ceil(K/128))", None, False, _AMAX_RULE,
       "FP8 with a float32 scale per 1x128 block along K (activations)"),
  _row("fp8_128x128", E4M3, _FP8, F32, (128, 128),
       "row-major (..., ceil(rows/128), ceil(K/128))", None, False,
       _AMAX_RULE,
       "FP8 with a float32 scale per 128x128 block (weights)"),
  _row("mxfp8", E4M3, _FP8, E8M0, (1, 32), _MX_LAYOUT, None, True,
       _E8M0_RULE, "OCP MXFP8: FP8 elements, E8M0 scale per 32 along K"),
  _row("nvfp4", E2M1, (E2M1,), E4M3, (1, 16),
       "row-major (..., rows, ceil(K/16)) + float32 scalar global scale",
       _FP4_PACK, False,
       "global = amax_tensor / (448 * 6); block = e4m3(amax_block / 6 / "
       "global)",
       "NVIDIA NVFP4: E2M1 elements, E4M3 scale per 16 along K, "
       "float32 per-tensor global scale",
       global_scale_dtype=F32),
  _row("mxfp4", E2M1, (E2M1,), E8M0, (1, 32), _MX_LAYOUT, _FP4_PACK, True,
       _E8M0_RULE, "OCP MXFP4: E2M1 elements, E8M0 scale per 32 along K"),
  _row("mxfp6_e2m3", E2M3, (E2M3,), E8M0, (1, 32), _MX_LAYOUT, _FP6_PACK,
       True, _E8M0_RULE,
       "OCP MXFP6 (E2M3 elements), E8M0 scale per 32 along K"),
  _row("mxfp6_e3m2", E3M2, (E3M2,), E8M0, (1, 32), _MX_LAYOUT, _FP6_PACK,
       True, _E8M0_RULE,
       "OCP MXFP6 (E3M2 elements), E8M0 scale per 32 along K"),
)

#: All registered formats, keyed by name (insertion order = table order).
FORMATS = {row.name: row for row in _ROWS}
#: Tuple of the registered format names.
FORMAT_NAMES = tuple(FORMATS)


def get_format(name) -> Format:
  """Return the :class:`Format` row called ``name``.

  A :class:`Format` instance is returned unchanged.  Raises ``TypeError`` if
  ``name`` is neither a string nor a Format, ``ValueError`` (listing the valid
  names) if no such format is registered.
  """
  if isinstance(name, Format):
    return name
  if not isinstance(name, str):
    raise TypeError(
      f"get_format: name must be a format name (str) or Format, got "
      f"{type(name).__name__}")
  try:
    return FORMATS[name]
  except KeyError:
    raise ValueError(
      f"get_format: unknown format name {name!r}; valid names are: "
      f"{', '.join(FORMAT_NAMES)}") from None


def formats_table() -> str:
  """A fixed-width text table summarising every registered format."""
  header = ("name", "data dtype(s)", "scale", "block", "pow2", "max",
            "packing", "scale layout")
  rows = []
  for f in FORMATS.values():
    scale = f.scale_dtype.name
    if f.global_scale_dtype is not None:
      scale += f" + {f.global_scale_dtype.name} global"
    rows.append((
      f.name,
      "/".join(d.name for d in f.allowed_dtypes),
      scale,
      f._block_str(),
      "yes" if f.pow2_scales else "no",
      f"{f.max_value:g}",
      f.packing or "1/byte",
      f.scale_layout,
    ))
  widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

  def fmt(r):
    return "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()

  sep = "  ".join("-" * w for w in widths)
  return "\n".join([fmt(header), sep, *(fmt(r) for r in rows)])
