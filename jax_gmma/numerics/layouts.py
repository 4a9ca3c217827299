"""Scale-factor layouts: the plain row-major scale matrix and the swizzled
128x4-atom layout read by Blackwell block-scaled (tcgen05) GEMMs.

A block-scaled operand ``(..., rows, K)`` has a scale matrix
``(..., rows, k_blocks)`` (``k_blocks = ceil(K / block_k)``; see
:mod:`jax_gmma.ops.quantize`).  A *layout* says how that matrix is stored.

``"rowmajor"``
    The plain ``(..., rows, k_blocks)`` array (what :func:`quantize` returns
    by default).  No padding.

``"sm100_128x4"`` (aliases ``"cublas_128x4"``, ``"cutlass_sm1xx"``)
    The blocked ("interleaved", "swizzled") layout of NVIDIA's sm_100/sm_120
    block-scaled GEMMs: cuBLASLt's ``VEC16_UE4M3`` / ``VEC32_UE8M0`` scale
    modes, cuDNN, and CUTLASS's ``Sm1xxBlockScaledConfig``.

    1. Pad the scale matrix to ``R = 128 * ceil(rows / 128)`` rows and
      ``KB = 4 * ceil(k_blocks / 4)`` columns (padding value: below).
    2. Cut it into 128x4 *atoms*; atom ``(rt, kt)`` covers rows
      ``128*rt .. 128*rt+127`` and K-blocks ``4*kt .. 4*kt+3``.  Atoms are
      stored K-tile fastest: ``atom = rt * (KB // 4) + kt``.
    3. Each atom is 512 contiguous elements.  Row ``r`` of the atom
      (``0 <= r < 128``) is split as ``r = 32 * r4 + r32``; the scale of
      (atom row ``r``, atom column ``k4``) sits at
      ``r32 * 16 + r4 * 4 + k4``.  Rows 0, 32, 64, 96 are therefore adjacent
      (one 32-bit word per row holds its 4 K-blocks, as TMEM wants).

    Flat offset of the scale of (``row``, ``kb``) inside one matrix::

        (row // 128 * (KB // 4) + kb // 4) * 512
            + (row % 32) * 16 + (row % 128) // 32 * 4 + kb % 4

    Leading (batch / expert) dims are outermost: each matrix's ``R * KB``
    elements are contiguous, matrices in row-major order of the leading dims
    (CUTLASS's ``L`` mode, stride ``R * KB``).

    **Array shape.** :func:`swizzle_scales` returns the *atom view*
    ``(..., R // 128, KB // 4, 32, 4, 4)`` indexed
    ``[rt, kt, r32, r4, k4]``, whose row-major (C-order) flattening is exactly
    the byte order above; ``.reshape(*lead, -1)`` gives the flat buffer a
    kernel reads (``R * KB`` elements per matrix; any other reshape, e.g. to
    ``(R, KB)``, is the same buffer but *not* a row-major matrix view).

    **Padding value.** Padded positions hold the *all-zero bit pattern* of
    the scale dtype: ``float8_e8m0fnu`` ``0x00`` (= 2^-127, finite; E8M0 has
    no zero), ``float8_e4m3fn`` ``+0.0``, ``float32`` ``+0.0``, ``uint8`` 0.
    Kernels multiply padded scales only with zero (K-padded) elements or into
    discarded (row-padded) outputs, so any finite value is correct; a NaN
    pattern is not (``0 * NaN = NaN``), and note that ``jnp.zeros`` /
    ``jnp.pad`` on ``float8_e8m0fnu`` produce ``0xFF`` = **NaN** (0 rounds to
    NaN in E8M0) -- this module therefore pads through an unsigned-integer
    bit view.  Zero bytes are also what torchao's ``to_blocked`` and
    TransformerEngine's padded ``scale_inv`` buffers contain.

Sources checked (layout facts only; no code copied):

* CUTLASS ``include/cutlass/detail/sm100_blockscaled_layout.hpp``:
  ``Sm1xxBlockScaledBasicChunk`` (``Blk_MN = 128``, ``Blk_SF = 4``) with the
  K-major atom ``Shape<Shape<_32,_4>, Shape<SFVecSize,_4>>`` /
  ``Stride<Stride<_16,_4>, Stride<_0,_1>>`` -- row ``(r32, r4)`` strides 16
  and 4, K-block stride 1, the ``SFVecSize`` elements of one block share a
  scale (stride 0) -- and ``tile_atom_to_shape_SFA/SFB`` =
  ``tile_to_shape(SfAtom, (M|N, K, L), Step<_2,_1,_3>)``: atoms K-fastest,
  then M/N, then L, each atom 512 elements (cosize of the atom).  M, N and
  K are rounded up to whole atoms by ``tile_to_shape``.
* nvmath-python ``nvmath.linalg.advanced.helpers.matmul`` (implements the
  cuBLAS docs section "1D Block Scaling Factors Layout",
  docs.nvidia.com/cuda/cublas/#d-block-scaling-factors-layout): tile offset
  ``(sf_inner + sf_outer * sf_inner_dim) * 128`` with
  ``sf_inner = kb // 4 * 4``, ``sf_outer = row // 128`` and intra-tile
  offset ``(row % 128 % 32) * 16 + (row % 128 // 32) * 4 + kb % 4``; its
  documented example (NVFP4, M = K = 128) gives offset 82 for (row 5,
  block 2) and 593 for (row 5, block 5) -- both checked in the tests.
* torchao ``prototype/mx_formats/utils.py`` ``to_blocked`` (cites the same
  cuBLAS section): zero-pads to (128, 4) multiples, views
  ``(nR, 128, nK, 4)``, permutes to ``(nR, nK, 128, 4)``, splits the 128 as
  ``(4, 32)`` and swaps them to ``(32, 4)`` -- the same order as here.
* jax 0.10.2 has no swizzle helper to cross-check against:
  ``jax.nn.scaled_matmul`` takes plain ``(B, M, K // block)`` scales and the
  cuDNN lowering (``jax._src.cudnn.scaled_matmul_stablehlo``) does no
  relayout in Python.

All functions are pure ``jax.numpy`` (they work under ``jax.jit``; shapes,
``rows``, ``k_blocks`` and the layout name are static) and bit-preserving:
the output has the input's dtype and every stored scale keeps its exact bit
pattern (NaN payloads included).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .._compat import is_symbolic_dim

__all__ = [
  "ScaleLayout",
  "LAYOUTS",
  "LAYOUT_NAMES",
  "ROWMAJOR",
  "SM100_128X4",
  "SCALE_DTYPES",
  "get_layout",
  "layouts_table",
  "swizzle_scales",
  "unswizzle_scales",
  "swizzled_shape",
  "padding_value",
  "resolve_layout",
]

ROWMAJOR = "rowmajor"
SM100_128X4 = "sm100_128x4"

#: Scale dtypes :func:`swizzle_scales` accepts (uint8 = raw E8M0/E4M3 bytes).
SCALE_DTYPES = (
  np.dtype(ml_dtypes.float8_e8m0fnu),
  np.dtype(ml_dtypes.float8_e4m3fn),
  np.dtype(np.float32),
  np.dtype(np.uint8),
)
# Same-width unsigned integer used to move / pad scales bit-exactly.
_UINT_OF_SIZE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16),
                 4: np.dtype(np.uint32)}

# sm100 atom geometry.
_ATOM_ROWS = 128       # rows per atom (Blk_MN)
_ATOM_KB = 4           # K-blocks per atom (Blk_SF)
_ROW_INNER = 32        # rows are split as (row % 32, row // 32 % 4)
_ROW_OUTER = _ATOM_ROWS // _ROW_INNER   # 4


def _dim(d):
  """An int dimension as a Python int; a symbolic one (``jax.export``) unchanged; anything else
  through ``int`` (TypeError / ValueError)."""
  if isinstance(d, (bool, np.bool_)):
    raise TypeError(f"a dimension must be an int, got {d!r}")
  if is_symbolic_dim(d):
    return d
  if isinstance(d, (int, np.integer)):
    return int(d)
  return int(d)


@dataclasses.dataclass(frozen=True)
class ScaleLayout:
  """One registered scale layout (immutable).

  Attributes:
    name: canonical registry key.
    aliases: other accepted names.
    row_tile: rows are padded to a multiple of this (1: no padding).
    k_tile: K-blocks are padded to a multiple of this (1: no padding).
    padding: description of the padding value.
    description: human description (multi-line ok).
  """

  name: str
  aliases: Tuple[str, ...]
  row_tile: int
  k_tile: int
  padding: str
  description: str

  @property
  def is_rowmajor(self) -> bool:
    return self.name == ROWMAJOR

  def padded_dims(self, rows: int, k_blocks: int) -> Tuple[int, int]:
    """``(rows, k_blocks)`` rounded up to whole tiles (dimensions may be symbolic)."""
    rows, k_blocks = _dim(rows), _dim(k_blocks)
    if self.row_tile > 1:
      rows = -(-rows // self.row_tile) * self.row_tile
    if self.k_tile > 1:
      k_blocks = -(-k_blocks // self.k_tile) * self.k_tile
    return rows, k_blocks

  def stored_shape(self, shape) -> Tuple[int, ...]:
    """Shape of the stored scales for a row-major scale matrix of shape
    ``(..., rows, k_blocks)`` (dimensions may be symbolic)."""
    shape = tuple(_dim(s) for s in shape)
    *lead, rows, kb = shape
    if self.is_rowmajor:
      return shape
    r, k = self.padded_dims(rows, kb)
    return (*lead, r // _ATOM_ROWS, k // _ATOM_KB, _ROW_INNER,
            _ROW_OUTER, _ATOM_KB)

  def describe(self) -> str:
    alias = f" (aliases: {', '.join(self.aliases)})" if self.aliases else ""
    lines = [f"{self.name}{alias}", *("  " + ln for ln in
                                      self.description.splitlines()),
             f"  padding: {self.padding}"]
    return "\n".join(lines)

  def __str__(self) -> str:
    return self.describe()


_ROWS = (
  ScaleLayout(
    name=ROWMAJOR,
    aliases=(),
    row_tile=1,
    k_tile=1,
    padding="none",
    description=(
      "plain row-major scale matrix (..., rows, k_blocks); what "
      "quantize() returns by default"),
  ),
  ScaleLayout(
    name=SM100_128X4,
    aliases=("cublas_128x4", "cutlass_sm1xx"),
    row_tile=_ATOM_ROWS,
    k_tile=_ATOM_KB,
    padding=("all-zero bits (E8M0 0x00 = 2^-127, E4M3 +0, float32 +0): "
             "finite, never read into a result"),
    description=(
      "Blackwell block-scaled GEMM layout (cuBLASLt VEC16_UE4M3 / "
      "VEC32_UE8M0, cuDNN, CUTLASS Sm1xxBlockScaledConfig):\n"
      "rows padded to 128, k_blocks to 4; 128x4 atoms of 512 "
      "elements, K-tile fastest;\n"
      "in an atom, (row, kb) -> (row%32)*16 + (row%128//32)*4 + kb%4;\n"
      "stored as (..., R/128, KB/4, 32, 4, 4) [rt, kt, r32, r4, k4]"),
  ),
)

#: All registered layouts by canonical name.
LAYOUTS: Dict[str, ScaleLayout] = {row.name: row for row in _ROWS}
#: Canonical layout names.
LAYOUT_NAMES = tuple(LAYOUTS)
_ALIASES = {alias: row.name for row in _ROWS for alias in row.aliases}


def get_layout(layout) -> ScaleLayout:
  """The :class:`ScaleLayout` for a name or alias (a ScaleLayout is returned
  unchanged).  ``TypeError`` for a non-string, ``ValueError`` listing the
  valid names for an unknown one."""
  if isinstance(layout, ScaleLayout):
    return layout
  if not isinstance(layout, str):
    raise TypeError(f"get_layout: layout must be a layout name (str), got "
                    f"{type(layout).__name__}")
  name = _ALIASES.get(layout, layout)
  try:
    return LAYOUTS[name]
  except KeyError:
    valid = ", ".join(list(LAYOUT_NAMES) + sorted(_ALIASES))
    raise ValueError(f"get_layout: unknown scale layout {layout!r}; valid "
                     f"names are: {valid}") from None


def layouts_table() -> str:
  """Human-readable description of every registered layout."""
  return "\n\n".join(row.describe() for row in _ROWS)


def padding_value(dtype) -> np.ndarray:
  """The padding scale (a 0-d NumPy array of ``dtype``): all-zero bits."""
  dt = _check_dtype(dtype, "padding_value", "dtype")
  return np.zeros((), _UINT_OF_SIZE[dt.itemsize]).view(dt)


def swizzled_shape(shape, layout=SM100_128X4) -> Tuple[int, ...]:
  """Stored shape, under ``layout``, of a row-major scale matrix of shape
  ``(..., rows, k_blocks)``."""
  who = "swizzled_shape"
  lay = resolve_layout(layout, who)
  try:
    shape = tuple(_dim(s) for s in shape)
  except (TypeError, ValueError):
    raise TypeError(f"{who}: shape must be a tuple of ints, got "
                    f"{shape!r}") from None
  _check_rows_kb(shape, who, "shape")
  return lay.stored_shape(shape)


# ----------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------
def resolve_layout(layout, who: str) -> ScaleLayout:
  try:
    return get_layout(layout)
  except (TypeError, ValueError) as e:
    msg = str(e).replace("get_layout: ", "")
    raise type(e)(f"{who}: {msg}") from None


def _check_dtype(dtype, who: str, name: str) -> np.dtype:
  try:
    dt = np.dtype(dtype)
  except TypeError:
    raise TypeError(f"{who}: {name} must be a dtype, got {dtype!r}") \
      from None
  if dt not in SCALE_DTYPES:
    allowed = ", ".join(d.name for d in SCALE_DTYPES)
    raise TypeError(f"{who}: {name} must be one of {allowed}, got "
                    f"{dt.name}")
  return dt


def _check_rows_kb(shape, who: str, name: str):
  if len(shape) < 2:
    raise ValueError(f"{who}: {name} must have at least 2 dimensions "
                     f"(..., rows, k_blocks), got shape {tuple(shape)}")
  if any(isinstance(d, (int, np.integer)) and d < 1 for d in shape):
    raise ValueError(f"{who}: every dimension of {name} must be >= 1 "
                     f"(rows, k_blocks and batch dims), got shape "
                     f"{tuple(shape)}")


def _as_scale_array(a, who: str, name: str):
  if not hasattr(a, "shape") or not hasattr(a, "dtype"):
    raise TypeError(f"{who}: {name} must be an array, got "
                    f"{type(a).__name__}")
  _check_dtype(a.dtype, who, f"{name}.dtype")
  return a if isinstance(a, jax.Array) else jnp.asarray(a)


def _static_positive_int(v, who: str, name: str) -> int:
  if is_symbolic_dim(v):
    return v  # a symbolic dimension (jax.export) is >= 1
  if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
    raise TypeError(f"{who}: {name} must be a (static) int, got {v!r}")
  if v < 1:
    raise ValueError(f"{who}: {name} must be >= 1, got {v}")
  return int(v)


# ----------------------------------------------------------------------------
# swizzle / unswizzle
# ----------------------------------------------------------------------------
def swizzle_scales(scales, layout=SM100_128X4) -> jax.Array:
  """Row-major scales ``(..., rows, k_blocks)`` -> ``layout``.

  For ``"sm100_128x4"`` the result has shape
  ``(..., ceil(rows/128), ceil(k_blocks/4), 32, 4, 4)`` (see the module
  docstring for the order and the padding); for ``"rowmajor"`` ``scales`` is
  returned unchanged.  Same dtype (``float8_e8m0fnu``, ``float8_e4m3fn``,
  ``float32`` or ``uint8``), bit-exact.  Works under ``jax.jit``.
  """
  who = "swizzle_scales"
  lay = resolve_layout(layout, who)
  scales = _as_scale_array(scales, who, "scales")
  _check_rows_kb(scales.shape, who, "scales")
  if lay.is_rowmajor:
    return scales
  return _swizzle_impl(scales)


def unswizzle_scales(swizzled, rows: int, k_blocks: int,
                     layout=SM100_128X4) -> jax.Array:
  """Inverse of :func:`swizzle_scales`: ``layout`` -> row-major
  ``(..., rows, k_blocks)`` (padding dropped).

  ``rows`` and ``k_blocks`` are the unpadded sizes (static ints); the
  trailing dims of ``swizzled`` must be exactly
  ``(ceil(rows/128), ceil(k_blocks/4), 32, 4, 4)`` for ``"sm100_128x4"``,
  ``(rows, k_blocks)`` for ``"rowmajor"``.
  """
  who = "unswizzle_scales"
  lay = resolve_layout(layout, who)
  rows = _static_positive_int(rows, who, "rows")
  k_blocks = _static_positive_int(k_blocks, who, "k_blocks")
  swizzled = _as_scale_array(swizzled, who, "swizzled")
  tail = lay.stored_shape((rows, k_blocks))
  nt = len(tail)
  if swizzled.ndim < nt or tuple(swizzled.shape[-nt:]) != tail:
    raise ValueError(
      f"{who}: for layout {lay.name!r} with rows={rows}, "
      f"k_blocks={k_blocks}, swizzled must have shape (..., "
      f"{', '.join(map(str, tail))}), got {tuple(swizzled.shape)}")
  if any(isinstance(d, (int, np.integer)) and d < 1 for d in swizzled.shape):
    raise ValueError(f"{who}: every dimension of swizzled must be >= 1, "
                     f"got shape {tuple(swizzled.shape)}")
  if lay.is_rowmajor:
    return swizzled
  return _unswizzle_impl(swizzled, rows, k_blocks)


def _bits(a: jax.Array) -> jax.Array:
  u = _UINT_OF_SIZE[np.dtype(a.dtype).itemsize]
  if np.dtype(a.dtype) == u:
    return a
  return jax.lax.bitcast_convert_type(a, u)


def _from_bits(u: jax.Array, dt) -> jax.Array:
  dt = np.dtype(dt)
  if np.dtype(u.dtype) == dt:
    return u
  return jax.lax.bitcast_convert_type(u, dt)


# Atom-view axis order: the padded (R, KB) matrix reshaped as
# (rt, r4, r32, kt, k4) is transposed to (rt, kt, r32, r4, k4).  The
# permutation swaps positions 1 and 3, so it is its own inverse.
_ATOM_PERM = (0, 3, 2, 1, 4)


@jax.jit
def _swizzle_impl(scales: jax.Array) -> jax.Array:
  *lead, rows, kb = scales.shape
  n = len(lead)
  r_pad, kb_pad = LAYOUTS[SM100_128X4].padded_dims(rows, kb)
  u = _bits(scales)
  # Zero bits, on the integer view (never a float zero: E8M0 has none).
  u = jnp.pad(u, [(0, 0)] * n + [(0, r_pad - rows), (0, kb_pad - kb)])
  u = u.reshape(*lead, r_pad // _ATOM_ROWS, _ROW_OUTER, _ROW_INNER,
                kb_pad // _ATOM_KB, _ATOM_KB)
  u = jnp.transpose(u, tuple(range(n)) + tuple(n + p for p in _ATOM_PERM))
  return _from_bits(u, scales.dtype)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unswizzle_impl(swizzled: jax.Array, rows: int, kb: int) -> jax.Array:
  lead = swizzled.shape[:-5]
  n = len(lead)
  r_pad, kb_pad = LAYOUTS[SM100_128X4].padded_dims(rows, kb)
  u = _bits(swizzled)
  u = jnp.transpose(u, tuple(range(n)) + tuple(n + p for p in _ATOM_PERM))
  u = u.reshape(*lead, r_pad, kb_pad)[..., :rows, :kb]
  return _from_bits(u, swizzled.dtype)
