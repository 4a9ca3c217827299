"""Pure-JAX quantisation with scale-factor management for jax-gmma.

Canonical operand layout
------------------------
Every operand is viewed as ``(..., rows, K)`` where ``K`` is the contraction
axis (``axis`` argument of :func:`quantize`; it is moved to the end) and
``rows`` is the axis just before it (``M`` of an activation, ``N`` of an
``(N, K)`` weight).  Leading dims are batch (activations) or experts/groups.
A ``(K, N)`` weight is quantised with ``axis=0``; its data is then stored as
``(N, K)``.

What a :class:`QuantizedArray` stores
-------------------------------------
``data``
    Elements in the canonical K-last layout, shape ``(..., rows, Kp)``, where
    ``Kp`` is ``K`` rounded up to a whole number of K-blocks; the tail
    ``Kp - K`` is zero padding (so a kernel can contract over ``Kp`` with no
    effect on the result).  Rows are never padded.  One element per array
    element (FP4/FP6 are *unpacked*; see :func:`pack_fp4` / :func:`pack_fp6`).
    XLA has no usable FP6 types, so FP6 elements are stored exactly in a
    ``float8_e4m3fn`` *container* (every E2M3 and E3M2 value is exactly
    representable in E4M3), rounded to the FP6 grid by a pure-jnp emulation
    (:func:`round_to_dtype`, bit-identical to ml_dtypes' casts);
    ``QuantizedArray.dtype`` still reports the logical FP6 dtype.
``scales``
    By default (``layout == "rowmajor"``) the plain row-major scale array:

    ===============  =======================================  ==============
    format           scales shape                             dtype
    ===============  =======================================  ==============
    fp8_tensor       ``()``                                   float32
    fp8_channel      ``(..., rows, 1)``                       float32
    fp8_1x128        ``(..., rows, ceil(K/128))``             float32
    fp8_128x128      ``(..., ceil(rows/128), ceil(K/128))``   float32
    mx*              ``(..., rows, ceil(K/32))``              float8_e8m0fnu
    nvfp4            ``(..., rows, ceil(K/16))``              float8_e4m3fn
    ===============  =======================================  ==============

    Scales are *dequantisation* scales: ``x ~= data * scale`` (blockwise).

    ``quantize(..., layout="sm100_128x4")`` (MX and NVFP4 formats only) stores
    the same scales in the swizzled 128x4-atom layout of Blackwell
    block-scaled GEMMs instead, shape
    ``(..., ceil(rows/128), ceil(K_blocks/4), 32, 4, 4)``, zero-bit padded
    (see :mod:`jax_gmma.layouts`); ``QuantizedArray.layout`` records it and
    :func:`dequantize` undoes it.
``global_scale``
    NVFP4 only: float32 scalar, ``x ~= data * block_scale * global_scale``.
    ``None`` otherwise.

Scale computation ("current scaling", amax of each block)
--------------------------------------------------------
* FP8 float32 formats: ``scale = amax / max(dtype)``; a block whose amax is 0
  gets scale 1; scales are clamped below to the smallest normal float32
  (XLA on CPU flushes float32 subnormals to zero).
* MX formats (OCP MX spec v1.0): ``scale = 2^(floor(log2(amax)) - emax_elem)``
  with ``emax_elem`` the exponent of the element type's largest normal (e4m3:
  8, e5m2: 15, e2m1: 2, e2m3: 2, e3m2: 4).  The exponent comes from
  ``frexp`` (no ``log2`` rounding issues); zero blocks get scale ``2^0``; the
  exponent is clamped to ``[-126, 127]`` (-126 instead of the spec's -127 so
  the scale stays a normal float32).  Elements are ``x / scale`` saturated
  to the element max, so the block max may clamp (as the spec specifies).
* NVFP4: ``global = amax_tensor / (448 * 6)``; per-16 block scale
  ``e4m3(amax_block / 6 / global)`` (clamped to ``[2^-9, 448]``, zero block
  -> 1); elements ``x / (block_scale * global)``.

All element conversions are ``astype`` to the ml_dtypes dtype after clipping
to ``+-max(dtype)`` -- finite inputs never overflow to NaN/Inf.

Non-finite inputs
-----------------
amax is taken over the finite values only.  Element types that have NaN
(``float8_e4m3fn``, ``float8_e5m2``) keep NaN elementwise; +-Inf stays Inf in
``float8_e5m2`` and becomes NaN in ``float8_e4m3fn`` (it has no Inf).  Element
types without NaN/Inf (FP4, FP6) cannot carry them, so a block containing a
NaN or Inf gets a NaN *scale* (E8M0 ``0xFF`` / E4M3 NaN) and dequantises to
all-NaN.  So NaN (and Inf where it cannot be kept) always comes back as NaN.

Packing for kernels
-------------------
:func:`pack_fp4`: two E2M1 codes per byte, element ``2i`` in the low nibble,
``2i+1`` in the high nibble.  :func:`pack_fp6`: four 6-bit codes
``c0..c3`` form the little-endian 24-bit word
``w = c0 | c1 << 6 | c2 << 12 | c3 << 18`` stored as bytes
``[w & 0xFF, (w >> 8) & 0xFF, w >> 16]``.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import formats as _formats
from .formats import FORMATS, Format, as_dtype, dtype_emax, dtype_max, get_format
from . import layouts as _layouts
from . import quantize_kernel as _qk  # the CUDA kernel path (fp8_1x128, mxfp8)

__all__ = [
    "QuantizedArray",
    "quantize",
    "dequantize",
    "to_jax_scaled_matmul_inputs",
    "pack_fp4",
    "unpack_fp4",
    "pack_fp6",
    "unpack_fp6",
    "jax_supports_dtype",
    "storage_dtype",
    "round_to_dtype",
]

_F32_TINY = float(np.finfo(np.float32).tiny)  # 2^-126, smallest normal
_E4M3 = _formats.E4M3
_E2M1 = _formats.E2M1
_FP6 = (_formats.E2M3, _formats.E3M2)
_FP6_CONTAINER = _E4M3
_NVFP4_E4M3_MIN = 2.0 ** -9  # smallest positive (subnormal) float8_e4m3fn
_E8M0_MIN_EXP = -126
_E8M0_MAX_EXP = 127
LAYOUT_ROWMAJOR = "rowmajor"


# ----------------------------------------------------------------------------
# dtype support
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def jax_supports_dtype(dtype) -> bool:
    """True if the installed JAX/XLA default backend can convert float32 arrays
    to ``dtype`` and back (probed once per dtype, eagerly, even under jit)."""
    dt = as_dtype(dtype)
    try:
        with jax.ensure_compile_time_eval():
            ref = np.array([0.5, 1.0, 2.0], np.float32)  # exact in every
            y = np.asarray(jnp.asarray(ref).astype(dt).astype(jnp.float32))
        return bool(np.all(y == ref))
    except Exception:  # noqa: BLE001 - any failure means "unsupported"
        return False


def storage_dtype(dtype) -> np.dtype:
    """dtype used to hold elements of logical ``dtype`` in a JAX array.

    FP6 dtypes always use the ``float8_e4m3fn`` container (exact for every
    E2M3/E3M2 value): XLA has no usable F6 types (jax 0.10 rejects them,
    jax 0.11 fails in CPU code generation), and a fixed choice keeps
    ``QuantizedArray.data.dtype`` independent of the JAX version.  Other
    dtypes are used as-is if JAX supports them; otherwise ``TypeError``."""
    dt = as_dtype(dtype)
    if dt in _FP6:
        return _FP6_CONTAINER
    if jax_supports_dtype(dt):
        return dt
    raise TypeError(
        f"dtype {dt.name} is not supported by the installed jax "
        f"{jax.__version__} (XLA cannot convert to it) and has no exact "
        "container")


def _grid_params(dtype) -> Tuple[int, int]:
    """(mantissa bits, minimum normal exponent) of a small float dtype."""
    fi = ml_dtypes.finfo(dtype)
    return int(fi.nmant), int(fi.minexp)


def round_to_dtype(x: jax.Array, dtype) -> jax.Array:
    """Round float32 ``x`` to the value grid of ``dtype`` (round half to even,
    saturating at ``+-max(dtype)``), returning float32.

    Pure-jnp emulation used for dtypes XLA cannot convert to (FP6).  NaN/Inf
    are not representable in FP6 and must be handled by the caller."""
    return _round_to_dtype_impl(jnp.asarray(x, jnp.float32), as_dtype(dtype).name)


@functools.partial(jax.jit, static_argnums=1)
def _round_to_dtype_impl(x: jax.Array, dt_name: str) -> jax.Array:
    dt = as_dtype(dt_name)
    mbits, emin = _grid_params(dt)
    a = jnp.minimum(jnp.abs(x), np.float32(dtype_max(dt)))
    _, e = jnp.frexp(a)  # a = m * 2^e, m in [0.5, 1)  ->  floor(log2 a) = e - 1
    e = jnp.maximum(e - 1, emin)  # subnormals share the minimum exponent
    quantum_exp = e - mbits
    r = jnp.ldexp(jnp.round(jnp.ldexp(a, -quantum_exp)), quantum_exp)
    r = jnp.minimum(r, np.float32(dtype_max(dt)))
    return jnp.copysign(r, x).astype(jnp.float32)


def _cast_elements(v: jax.Array, dt: np.dtype, store: np.dtype) -> jax.Array:
    """Cast clipped float32 values to element dtype ``dt`` held as ``store``."""
    if store == dt:
        return v.astype(dt)
    return round_to_dtype(v, dt).astype(store)  # exact in the container


def _has_nan(dt: np.dtype) -> bool:
    return dt in (_formats.E4M3, _formats.E5M2)


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
        lay = _layout_or_error(layout, "QuantizedArray")
        if fmt.has_global_scale and global_scale is None:
            raise ValueError(f"QuantizedArray: format {fmt.name!r} needs a "
                             "global_scale")
        if not fmt.has_global_scale and global_scale is not None:
            raise ValueError(f"QuantizedArray: format {fmt.name!r} has no "
                             "global_scale, got one")
        dt = fmt.check_dtype(dtype, "QuantizedArray")
        _check_layout_format(fmt, lay, "QuantizedArray")
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


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _layout_or_error(layout, who: str) -> "_layouts.ScaleLayout":
    """Registered scale layout named ``layout`` (alias ok), or an error that
    lists the valid names."""
    names = " or ".join(repr(n) for n in _layouts.LAYOUT_NAMES)
    if not isinstance(layout, (str, _layouts.ScaleLayout)):
        raise TypeError(f"{who}: layout must be {names}, got {layout!r}")
    try:
        return _layouts.get_layout(layout)
    except ValueError:
        raise ValueError(f"{who}: layout must be {names} (see "
                         f"jax_gmma.layouts.LAYOUTS), got {layout!r}") from None


def _check_layout_format(fmt: Format, lay, who: str) -> None:
    """A non-row-major (swizzled) scale layout needs E8M0/E4M3 block scales
    with one scale row per data row (MX formats, NVFP4)."""
    if lay.name == LAYOUT_ROWMAJOR:
        return
    if not (fmt.kind == "block" and fmt.block_shape[0] == 1
            and fmt.scale_dtype in (_formats.E8M0, _E4M3)):
        ok = ", ".join(f.name for f in FORMATS.values()
                       if f.kind == "block" and f.block_shape[0] == 1
                       and f.scale_dtype in (_formats.E8M0, _E4M3))
        raise ValueError(
            f"{who}: layout {lay.name!r} is only for block-scaled formats "
            f"with E8M0/E4M3 scales ({ok}); format {fmt.name!r} has "
            f"{fmt.scale_dtype.name} {fmt._block_str()} scales")


def _rowmajor_scales(q: "QuantizedArray"):
    """``q.scales`` as the plain row-major array (unswizzled if needed)."""
    if q.layout == LAYOUT_ROWMAJOR:
        return q.scales
    rows, kb = q.format.scales_shape(q.canonical_shape)[-2:]
    return _layouts.unswizzle_scales(q.scales, rows, kb, q.layout)


def _resolve_format(format, who: str) -> Format:
    if not isinstance(format, (str, Format)):
        raise TypeError(f"{who}: format must be a format name (str) or Format, "
                        f"got {type(format).__name__}")
    try:
        return get_format(format)
    except ValueError as e:
        raise ValueError(f"{who}: {e}") from None


def _check_float_array(x, who: str, name: str = "x") -> jax.Array:
    if isinstance(x, QuantizedArray):
        raise TypeError(f"{who}: {name} is already a QuantizedArray")
    if not hasattr(x, "dtype"):
        try:
            x = np.asarray(x)
        except Exception as e:  # noqa: BLE001
            raise TypeError(f"{who}: {name} must be a floating array, got "
                            f"{type(x).__name__}") from e
    try:
        dt = np.dtype(x.dtype)
    except TypeError:
        raise TypeError(f"{who}: {name} must be a floating array, got "
                        f"{x.dtype!r}") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(f"{who}: {name} must be a floating array, got {dt.name}")
    if isinstance(x, np.ndarray) and (dt in _FP6 or
                                      not jax_supports_dtype(dt)):
        x = x.astype(np.float32)  # e.g. numpy float6 arrays
    return jnp.asarray(x)


def _to_blocks(x: jax.Array, br: int, bk: int) -> jax.Array:
    """Zero-pad ``(..., R, K)`` to whole blocks and view it as
    ``(..., nR, br, nK, bk)``."""
    *lead, r, k = x.shape
    nr, nk = _cdiv(r, br), _cdiv(k, bk)
    pad = [(0, 0)] * len(lead) + [(0, nr * br - r), (0, nk * bk - k)]
    if any(p[1] for p in pad):
        x = jnp.pad(x, pad)
    return x.reshape(*lead, nr, br, nk, bk)


def _from_blocks(xb: jax.Array, rows: int) -> jax.Array:
    """Inverse of :func:`_to_blocks` keeping the K padding, dropping row
    padding: ``(..., nR, br, nK, bk) -> (..., rows, nK*bk)``."""
    *lead, nr, br, nk, bk = xb.shape
    return xb.reshape(*lead, nr * br, nk * bk)[..., :rows, :]


def _expand(s: jax.Array) -> jax.Array:
    """Scales ``(..., nR, nK)`` -> broadcastable ``(..., nR, 1, nK, 1)``."""
    return s[..., :, None, :, None]


def _e8m0_exponent(amax: jax.Array, emax: int) -> jax.Array:
    """Unbiased E8M0 exponent ``floor(log2(amax)) - emax`` (via frexp), 0 for
    zero (or subnormal) amax, clamped to ``[-126, 127]``."""
    _, e = jnp.frexp(amax)
    exp = jnp.clip(e - 1 - emax, _E8M0_MIN_EXP, _E8M0_MAX_EXP)
    return jnp.where(amax >= _F32_TINY, exp, 0).astype(jnp.int32)


def _e8m0_from_exponent(exp: jax.Array, poison: Optional[jax.Array]):
    """Encode unbiased exponents as float8_e8m0fnu (0xFF = NaN if poisoned)."""
    code = (exp + 127).astype(jnp.uint8)
    if poison is not None:
        code = jnp.where(poison, jnp.uint8(0xFF), code)
    return jax.lax.bitcast_convert_type(code, jnp.float8_e8m0fnu)


# ----------------------------------------------------------------------------
# quantize / dequantize
# ----------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _quantize_impl(x, fmt_name: str, dt_name: str, axis: int):
    """Jitted core of :func:`quantize` (one compilation per signature)."""
    fmt = FORMATS[fmt_name]
    dt = as_dtype(dt_name)
    store = storage_dtype(dt)
    xm = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
    canon = xm.shape
    if fmt.kind == "tensor":
        xm = xm.reshape(-1, canon[-1])  # a single (rows_total, K) block
    rows, k = xm.shape[-2:]
    br, bk = fmt.block_dims(rows, k)

    xb = _to_blocks(xm, br, bk)                        # (..., nR, br, nK, bk)
    finite = jnp.isfinite(xb)
    xf = jnp.where(finite, xb, 0.0)
    amax = jnp.max(jnp.abs(xf), axis=(-3, -1))          # (..., nR, nK)
    elem_max = np.float32(dtype_max(dt))
    global_scale = None
    poison = None
    if not _has_nan(dt):                                # FP4/FP6: poison scale
        poison = jnp.any(~finite, axis=(-3, -1))

    if fmt.is_mx:
        exp = _e8m0_exponent(amax, dtype_emax(dt))
        scales = _e8m0_from_exponent(exp, poison)
        # multiply by the exact reciprocal 2^-exp (exp <= 125 for float32
        # input, so 2^-exp is a normal float32): bit-exact on every backend.
        inv_scale = jnp.ldexp(jnp.ones_like(amax), -exp)
    elif fmt.has_global_scale:                          # NVFP4
        s_max = np.float32(dtype_max(fmt.scale_dtype))
        tmax = jnp.max(amax)
        g = jnp.where(tmax > 0, tmax / (s_max * elem_max), 1.0)
        g = jnp.maximum(g, _F32_TINY).astype(jnp.float32)
        bs = jnp.clip(amax / elem_max / g, _NVFP4_E4M3_MIN, s_max)
        bs = jnp.where(amax > 0, bs, 1.0)
        # The barrier keeps XLA (xla_allow_excess_precision, on by default on
        # GPU) from folding the f32 -> e4m3 -> f32 round trip away: elements
        # must be divided by the *stored* (rounded) block scale.
        s8 = jax.lax.optimization_barrier(bs.astype(fmt.scale_dtype))
        scale_f = jnp.maximum(s8.astype(jnp.float32) * g, _F32_TINY)
        if poison is not None:
            s8 = jnp.where(poison, jnp.nan, s8.astype(jnp.float32)
                           ).astype(fmt.scale_dtype)
        scales = s8
        global_scale = g
    else:                                               # float32 amax scaling
        s = jnp.maximum(amax / elem_max, _F32_TINY)
        scale_f = jnp.where(amax > 0, s, 1.0).astype(jnp.float32)
        scales = scale_f

    if fmt.is_mx:
        v = xf * _expand(inv_scale)
    else:
        v = xf / _expand(scale_f)
    v = jnp.clip(v, -elem_max, elem_max)
    if _has_nan(dt):
        v = jnp.where(finite, v, xb)   # keep NaN / Inf elementwise
    data = _from_blocks(_cast_elements(v, dt, store), rows)

    if fmt.kind == "tensor":
        data = data.reshape(canon)
        scales = scales.reshape(())
    # XLA on GPU (xla_allow_excess_precision, on by default) folds a
    # convert(convert(v, narrow), float32) pair into v.  Without this barrier a
    # dequantize (or any widening use of data / scales) in the same jitted
    # program as this quantize would see the unrounded values -- inconsistent
    # with the stored operands (measured on the H200: fp8_tensor/fp8_channel
    # came back unquantized, NVFP4 dot off by 26%).  The barrier makes the
    # stored, rounded values the only ones downstream code can see.
    data, scales = jax.lax.optimization_barrier((data, scales))
    return data, scales, global_scale


def quantize(x, format="fp8_tensor", *, dtype=None, axis: int = -1,
             layout: str = LAYOUT_ROWMAJOR,
             use_kernel: bool = True) -> QuantizedArray:
    """Quantise a floating array to ``format`` with amax "current scaling".

    Args:
      x: floating array, ``(rows, K)`` or ``(..., rows, K)`` (``fp8_tensor``
        also accepts 1-D); computed in float32.
      format: format name (see :data:`jax_gmma.formats.FORMATS`) or Format.
      dtype: element dtype, one of ``format.allowed_dtypes`` (default:
        ``format.dtype``), e.g. ``jnp.float8_e5m2`` for the FP8 formats.
      axis: the contraction (K) axis; blocks run along it.  It is moved last
        in the stored data.
      layout: scale layout, ``"rowmajor"`` (default: plain scales) or
        ``"sm100_128x4"`` (MX / NVFP4 only: scales swizzled once, here, into
        the 128x4-atom layout Blackwell block-scaled GEMMs read; see
        :mod:`jax_gmma.layouts`).
      use_kernel: ``fp8_1x128`` / ``mxfp8`` with ``float8_e4m3fn`` elements,
        K last and a bfloat16/float16/float32 ``x`` run as one CUDA kernel on
        Hopper GPUs (bit-identical results; :mod:`jax_gmma.quantize_kernel`).
        False forces the pure-JAX path everywhere.

    Returns:
      A :class:`QuantizedArray`; K is zero-padded to whole blocks in ``data``
      and the original shape is recorded so :func:`dequantize` returns it.

    Works under ``jax.jit`` (``format``, ``dtype``, ``axis``, ``layout``,
    ``use_kernel`` are static).
    """
    who = "quantize"
    fmt = _resolve_format(format, who)
    dt = fmt.check_dtype(dtype, who)
    lay = _layout_or_error(layout, who)
    _check_layout_format(fmt, lay, who)
    try:
        storage_dtype(dt)  # fail early, outside jit, if JAX cannot hold dt
    except TypeError as e:
        raise TypeError(f"{who}: format {fmt.name!r}: {e}") from None
    x = _check_float_array(x, who)

    min_ndim = 1 if fmt.kind == "tensor" else 2
    if x.ndim < min_ndim:
        what = "1 dimension" if min_ndim == 1 else "2 dimensions (rows, K)"
        raise ValueError(f"{who}: x must have at least {what} for format "
                         f"{fmt.name!r}, got shape {tuple(x.shape)}")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{who}: axis must be an int, got {axis!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{who}: axis {axis} is out of range for x with "
                         f"shape {tuple(x.shape)}")
    axis = int(axis) % x.ndim
    if x.shape[axis] < 1:
        raise ValueError(f"{who}: K (x.shape[{axis}]) must be >= 1, got shape "
                         f"{tuple(x.shape)}")
    if x.size == 0:
        raise ValueError(f"{who}: x must be non-empty, got shape "
                         f"{tuple(x.shape)}")

    kernel_layout = LAYOUT_ROWMAJOR
    if use_kernel and _qk.applies(fmt.name, dt, x.dtype, axis, x.ndim):
        # The kernel's primitive (pure-JAX lowering off Hopper): same data/scales. MXFP8's
        # swizzled scales come out of the kernel directly (no XLA transpose after it).
        if lay.name in _qk.SCALE_LAYOUTS and fmt.name == "mxfp8":
            kernel_layout = lay.name
        data, scales = _qk.quantize_rows(x, fmt.name, layout=kernel_layout)
        global_scale = None
    else:
        data, scales, global_scale = _quantize_impl(x, fmt.name, dt.name, axis)
    if lay.name != kernel_layout:
        scales = _layouts.swizzle_scales(scales, lay)
    return QuantizedArray(data, scales, global_scale, format=fmt,
                          shape=tuple(x.shape), axis=axis, dtype=dt,
                          layout=lay.name)


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
    return _dequantize_impl(q.data, _rowmajor_scales(q), q.global_scale,
                            q.format.name,
                            q.canonical_shape[-1], q.axis, out_dt.name)


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def _dequantize_impl(data, scales, global_scale, fmt_name: str, k: int,
                     axis: int, out_dt_name: str):
    """Jitted core of :func:`dequantize`."""
    fmt = FORMATS[fmt_name]
    data = data.astype(jnp.float32)
    scales = jnp.asarray(scales).astype(jnp.float32)
    if fmt.has_global_scale:
        scales = scales * jnp.asarray(global_scale, jnp.float32)

    if fmt.kind == "tensor":
        out = data * scales
    else:
        rows, kp = data.shape[-2:]
        br, bk = fmt.block_dims(rows, kp)
        out = _from_blocks(_to_blocks(data, br, bk) * _expand(scales), rows)
    out = jnp.moveaxis(out[..., :k], -1, axis)
    return out.astype(as_dtype(out_dt_name))


def to_jax_scaled_matmul_inputs(q: QuantizedArray
                                ) -> Tuple[jax.Array, jax.Array,
                                           Optional[jax.Array]]:
    """Operands for :func:`jax.nn.scaled_matmul` from a quantised operand.

    Returns ``(data, scales, global_scale)`` with ``data`` of shape
    ``(B, rows, Kp)`` and ``scales`` of shape ``(B, rows, Kp // block_k)``
    (the leading dims are flattened into ``B``; a 2-D operand gets ``B = 1``).
    Swizzled scales (``q.layout != "rowmajor"``) are unswizzled first.
    Per-tensor and 128x128 scales are broadcast to one scale per row and
    K-block.  ``global_scale`` (NVFP4) is not understood by scaled_matmul: the
    caller multiplies the product by ``lhs_global * rhs_global``.

    ``scaled_matmul(lhs_data, rhs_data, lhs_scales, rhs_scales)`` then equals
    ``dequantize(lhs) @ dequantize(rhs).T`` per batch (up to float32 summation
    order) when both operands share the same K padding.
    """
    who = "to_jax_scaled_matmul_inputs"
    if not isinstance(q, QuantizedArray):
        raise TypeError(f"{who}: q must be a QuantizedArray, got "
                        f"{type(q).__name__}")
    data, scales = _scaled_matmul_inputs_impl(q.data, _rowmajor_scales(q),
                                              q.format.name)
    return data, scales, q.global_scale


@functools.partial(jax.jit, static_argnums=2)
def _scaled_matmul_inputs_impl(data, scales, fmt_name: str):
    fmt = FORMATS[fmt_name]
    *lead, rows, kp = data.shape
    scales = jnp.asarray(scales)
    if fmt.kind == "tensor":
        scales = jnp.broadcast_to(scales, (*lead, rows, 1))
    else:
        br, _ = fmt.block_dims(rows, kp)
        if br > 1:
            scales = jnp.repeat(scales, br, axis=-2)[..., :rows, :]
    b = int(np.prod(lead)) if lead else 1
    data = data.reshape(b, rows, kp)
    scales = scales.reshape(b, rows, scales.shape[-1])
    return data, scales


# ----------------------------------------------------------------------------
# packing helpers (what kernels consume)
# ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _magnitude_table(dtype) -> np.ndarray:
    """Float32 magnitudes of codes ``0 .. 2^(bits-1)-1`` (sign bit clear),
    increasing -- read off ml_dtypes itself."""
    dt = as_dtype(dtype)
    bits = {_E2M1: 4, _FP6[0]: 6, _FP6[1]: 6}[dt]
    codes = np.arange(2 ** (bits - 1), dtype=np.uint8)
    table = codes.view(dt).astype(np.float32)
    assert np.all(np.diff(table) > 0)
    return table


def _encode(values: jax.Array, dtype, bits: int) -> jax.Array:
    """float32 values on the ``dtype`` grid -> uint32 codes (sign | magnitude)."""
    table = jnp.asarray(_magnitude_table(dtype))
    idx = jnp.searchsorted(table, jnp.abs(values)).astype(jnp.uint32)
    idx = jnp.minimum(idx, np.uint32(table.size - 1))
    sign = jnp.signbit(values).astype(jnp.uint32) << (bits - 1)
    return sign | idx


def _decode(codes: jax.Array, dtype, bits: int) -> jax.Array:
    """uint32 codes -> float32 values."""
    table = jnp.asarray(_magnitude_table(dtype))
    mag = table[codes & np.uint32(2 ** (bits - 1) - 1)]
    neg = (codes >> (bits - 1)) & 1
    return jnp.where(neg == 1, -mag, mag)


def _check_last_dim(x, multiple: int, who: str, name: str):
    if x.ndim < 1:
        raise ValueError(f"{who}: {name} must have at least 1 dimension, got "
                         f"shape {tuple(x.shape)}")
    if x.shape[-1] < 1 or x.shape[-1] % multiple:
        raise ValueError(f"{who}: last dimension of {name} must be a positive "
                         f"multiple of {multiple}, got shape {tuple(x.shape)}")


def pack_fp4(data) -> jax.Array:
    """Pack ``float4_e2m1fn`` elements ``(..., K)`` into uint8 ``(..., K/2)``.

    Byte ``i`` holds element ``2i`` in its low nibble and ``2i+1`` in its high
    nibble; each nibble is the E2M1 code ``s eem`` (sign in bit 3).
    """
    who = "pack_fp4"
    if isinstance(data, QuantizedArray):
        data = data.data
    if not hasattr(data, "dtype") or np.dtype(data.dtype) != _E2M1:
        got = np.dtype(data.dtype).name if hasattr(data, "dtype") else \
            type(data).__name__
        raise TypeError(f"{who}: data must be a float4_e2m1fn array, got {got}")
    data = jnp.asarray(data)
    _check_last_dim(data, 2, who, "data")
    return _pack_fp4_impl(data)


@jax.jit
def _pack_fp4_impl(data):
    codes = _encode(data.astype(jnp.float32), _E2M1, 4)
    lo, hi = codes[..., 0::2], codes[..., 1::2]
    return (lo | (hi << 4)).astype(jnp.uint8)


def unpack_fp4(packed) -> jax.Array:
    """Inverse of :func:`pack_fp4`: uint8 ``(..., K/2)`` -> float4_e2m1fn
    ``(..., K)``."""
    who = "unpack_fp4"
    if not hasattr(packed, "dtype") or np.dtype(packed.dtype) != np.uint8:
        raise TypeError(f"{who}: packed must be a uint8 array, got "
                        f"{getattr(packed, 'dtype', type(packed).__name__)}")
    packed = jnp.asarray(packed)
    _check_last_dim(packed, 1, who, "packed")
    return _unpack_fp4_impl(packed)


@jax.jit
def _unpack_fp4_impl(packed):
    p = packed.astype(jnp.uint32)
    codes = jnp.stack([p & 0xF, p >> 4], axis=-1)
    codes = codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])
    return _decode(codes, _E2M1, 4).astype(jnp.float4_e2m1fn)


def _fp6_dtype(data, dtype, who) -> np.dtype:
    if dtype is None:
        dt = np.dtype(data.dtype)
        if dt not in _FP6:
            raise TypeError(
                f"{who}: dtype is required unless data is a float6_e2m3fn / "
                f"float6_e3m2fn array, got data of dtype {dt.name}")
        return dt
    dt = as_dtype(dtype, f"{who}: dtype")
    if dt not in _FP6:
        raise ValueError(f"{who}: dtype must be one of float6_e2m3fn, "
                         f"float6_e3m2fn, got {dt.name}")
    return dt


def pack_fp6(data, dtype=None) -> jax.Array:
    """Pack FP6 elements ``(..., K)`` (K % 4 == 0) into uint8 ``(..., 3K/4)``.

    ``data`` is a NumPy ``ml_dtypes`` float6 array, or any floating array
    (e.g. the float8_e4m3fn container of a :class:`QuantizedArray`, or the
    QuantizedArray itself) together with ``dtype`` = ``float6_e2m3fn`` /
    ``float6_e3m2fn``; values are rounded to the FP6 grid (a no-op for values
    already on it).

    Bit order: codes ``c0..c3`` of four consecutive elements form the 24-bit
    little-endian word ``w = c0 | c1<<6 | c2<<12 | c3<<18``, stored as the
    bytes ``w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF``.  Each code is
    ``s eee mm`` (e3m2) / ``s ee mmm`` (e2m3), sign in bit 5.
    """
    who = "pack_fp6"
    if isinstance(data, QuantizedArray):
        if dtype is None:
            dtype = data.dtype
        data = data.data
    if not hasattr(data, "dtype"):
        raise TypeError(f"{who}: data must be an array, got "
                        f"{type(data).__name__}")
    dt = _fp6_dtype(data, dtype, who)
    if not jnp.issubdtype(np.dtype(data.dtype), jnp.floating):
        raise TypeError(f"{who}: data must be a floating array, got "
                        f"{np.dtype(data.dtype).name}")
    if isinstance(data, np.ndarray):
        data = data.astype(np.float32)
    data = jnp.asarray(data).astype(jnp.float32)
    _check_last_dim(data, 4, who, "data")
    return _pack_fp6_impl(data, dt.name)


@functools.partial(jax.jit, static_argnums=1)
def _pack_fp6_impl(data, dt_name):
    dt = as_dtype(dt_name)
    codes = _encode(round_to_dtype(data, dt), dt, 6)
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 4, 4)
    w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
    b = jnp.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=-1)
    return b.reshape(*codes.shape[:-1], 3 * (codes.shape[-1] // 4)
                     ).astype(jnp.uint8)


def unpack_fp6(packed, dtype) -> jax.Array:
    """Inverse of :func:`pack_fp6`: uint8 ``(..., 3K/4)`` -> ``(..., K)``
    elements of FP6 ``dtype``, held in the float8_e4m3fn container
    (:func:`storage_dtype`)."""
    who = "unpack_fp6"
    if dtype is None:
        raise TypeError(f"{who}: dtype (float6_e2m3fn or float6_e3m2fn) is "
                        "required")
    dt = _fp6_dtype(None, dtype, who)
    if not hasattr(packed, "dtype") or np.dtype(packed.dtype) != np.uint8:
        raise TypeError(f"{who}: packed must be a uint8 array, got "
                        f"{getattr(packed, 'dtype', type(packed).__name__)}")
    packed = jnp.asarray(packed)
    _check_last_dim(packed, 3, who, "packed")
    return _unpack_fp6_impl(packed, dt.name, storage_dtype(dt).name)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unpack_fp6_impl(packed, dt_name, store_name):
    dt = as_dtype(dt_name)
    p = packed.astype(jnp.uint32).reshape(*packed.shape[:-1],
                                          packed.shape[-1] // 3, 3)
    w = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    codes = jnp.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], axis=-1)
    codes = codes.reshape(*packed.shape[:-1], 4 * (packed.shape[-1] // 3))
    return _decode(codes, dt, 6).astype(as_dtype(store_name))
