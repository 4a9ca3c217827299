"""Element codecs of the small float formats: which dtypes JAX can hold, rounding to a dtype's
grid (FP6 emulation), sign-magnitude codes of FP4 / FP6 elements and their bit packing, and the
E8M0 (power-of-two) scale encoding. Pure maths on plain arrays.

Packing: :func:`pack_fp4_codes`: two E2M1 codes per byte, element ``2i`` in the low nibble,
``2i+1`` in the high nibble. :func:`pack_fp6_codes`: four 6-bit codes ``c0..c3`` form the
little-endian 24-bit word ``w = c0 | c1 << 6 | c2 << 12 | c3 << 18`` stored as bytes
``[w & 0xFF, (w >> 8) & 0xFF, w >> 16]``.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import formats
from .formats import as_dtype, dtype_max

F32_TINY = float(np.finfo(np.float32).tiny)  # 2^-126, smallest normal
_E4M3 = formats.E4M3
_E2M1 = formats.E2M1
_FP6 = (formats.E2M3, formats.E3M2)
_FP6_CONTAINER = _E4M3
_E8M0_MIN_EXP = -126
_E8M0_MAX_EXP = 127


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


def cast_elements(v: jax.Array, dt: np.dtype, store: np.dtype) -> jax.Array:
  """Cast clipped float32 values to element dtype ``dt`` held as ``store``."""
  if store == dt:
    return v.astype(dt)
  return round_to_dtype(v, dt).astype(store)  # exact in the container


def has_nan(dt: np.dtype) -> bool:
  return dt in (formats.E4M3, formats.E5M2)


def e8m0_exponent(amax: jax.Array, emax: int) -> jax.Array:
  """Unbiased E8M0 exponent ``floor(log2(amax)) - emax`` (via frexp), 0 for
  zero (or subnormal) amax, clamped to ``[-126, 127]``."""
  _, e = jnp.frexp(amax)
  exp = jnp.clip(e - 1 - emax, _E8M0_MIN_EXP, _E8M0_MAX_EXP)
  return jnp.where(amax >= F32_TINY, exp, 0).astype(jnp.int32)


def e8m0_from_exponent(exp: jax.Array, poison: Optional[jax.Array]):
  """Encode unbiased exponents as float8_e8m0fnu (0xFF = NaN if poisoned)."""
  code = (exp + 127).astype(jnp.uint8)
  if poison is not None:
    code = jnp.where(poison, jnp.uint8(0xFF), code)
  return jax.lax.bitcast_convert_type(code, jnp.float8_e8m0fnu)


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


def encode(values: jax.Array, dtype, bits: int) -> jax.Array:
  """float32 values on the ``dtype`` grid -> uint32 codes (sign | magnitude)."""
  table = jnp.asarray(_magnitude_table(dtype))
  idx = jnp.searchsorted(table, jnp.abs(values)).astype(jnp.uint32)
  idx = jnp.minimum(idx, np.uint32(table.size - 1))
  sign = jnp.signbit(values).astype(jnp.uint32) << (bits - 1)
  return sign | idx


def decode(codes: jax.Array, dtype, bits: int) -> jax.Array:
  """uint32 codes -> float32 values."""
  table = jnp.asarray(_magnitude_table(dtype))
  mag = table[codes & np.uint32(2 ** (bits - 1) - 1)]
  neg = (codes >> (bits - 1)) & 1
  return jnp.where(neg == 1, -mag, mag)


def check_last_dim(x, multiple: int, who: str, name: str):
  if x.ndim < 1:
    raise ValueError(f"{who}: {name} must have at least 1 dimension, got "
                     f"shape {tuple(x.shape)}")
  if x.shape[-1] < 1 or x.shape[-1] % multiple:
    raise ValueError(f"{who}: last dimension of {name} must be a positive "
                     f"multiple of {multiple}, got shape {tuple(x.shape)}")


def _pack_fp4_impl(data):
  codes = encode(data.astype(jnp.float32), _E2M1, 4)
  lo, hi = codes[..., 0::2], codes[..., 1::2]
  return (lo | (hi << 4)).astype(jnp.uint8)


# (jitted under the name above, which the lowered programs show)
pack_fp4_codes = jax.jit(_pack_fp4_impl)


def unpack_fp4(packed) -> jax.Array:
  """Inverse of :func:`pack_fp4`: uint8 ``(..., K/2)`` -> float4_e2m1fn
  ``(..., K)``."""
  who = "unpack_fp4"
  if not hasattr(packed, "dtype") or np.dtype(packed.dtype) != np.uint8:
    raise TypeError(f"{who}: packed must be a uint8 array, got "
                    f"{getattr(packed, 'dtype', type(packed).__name__)}")
  packed = jnp.asarray(packed)
  check_last_dim(packed, 1, who, "packed")
  return _unpack_fp4_impl(packed)


@jax.jit
def _unpack_fp4_impl(packed):
  return decode(fp4_codes(packed), _E2M1, 4).astype(jnp.float4_e2m1fn)


def fp4_codes(packed) -> jax.Array:
  """uint8 ``(..., K/2)`` packed E2M1 -> uint32 codes ``(..., K)`` (low nibble first)."""
  p = packed.astype(jnp.uint32)
  codes = jnp.stack([p & 0xF, p >> 4], axis=-1)
  return codes.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def fp6_dtype(data, dtype, who) -> np.dtype:
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


def _pack_fp6_impl(data, dt_name):
  dt = as_dtype(dt_name)
  codes = encode(round_to_dtype(data, dt), dt, 6)
  c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 4, 4)
  w = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)
  b = jnp.stack([w & 0xFF, (w >> 8) & 0xFF, (w >> 16) & 0xFF], axis=-1)
  return b.reshape(*codes.shape[:-1], 3 * (codes.shape[-1] // 4)
          ).astype(jnp.uint8)


# (jitted under the name above, which the lowered programs show)
pack_fp6_codes = jax.jit(_pack_fp6_impl, static_argnums=1)


def unpack_fp6(packed, dtype) -> jax.Array:
  """Inverse of :func:`pack_fp6`: uint8 ``(..., 3K/4)`` -> ``(..., K)``
  elements of FP6 ``dtype``, held in the float8_e4m3fn container
  (:func:`storage_dtype`)."""
  who = "unpack_fp6"
  if dtype is None:
    raise TypeError(f"{who}: dtype (float6_e2m3fn or float6_e3m2fn) is "
                    "required")
  dt = fp6_dtype(None, dtype, who)
  if not hasattr(packed, "dtype") or np.dtype(packed.dtype) != np.uint8:
    raise TypeError(f"{who}: packed must be a uint8 array, got "
                    f"{getattr(packed, 'dtype', type(packed).__name__)}")
  packed = jnp.asarray(packed)
  check_last_dim(packed, 3, who, "packed")
  return _unpack_fp6_impl(packed, dt.name, storage_dtype(dt).name)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unpack_fp6_impl(packed, dt_name, store_name):
  return decode(fp6_codes(packed), as_dtype(dt_name), 6).astype(as_dtype(store_name))


def fp6_codes(packed) -> jax.Array:
  """uint8 ``(..., 3K/4)`` packed FP6 -> uint32 codes ``(..., K)`` (the word order of
  :func:`pack_fp6_codes`)."""
  p = packed.astype(jnp.uint32).reshape(*packed.shape[:-1], packed.shape[-1] // 3, 3)
  w = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
  codes = jnp.stack([(w >> s) & 0x3F for s in (0, 6, 12, 18)], axis=-1)
  return codes.reshape(*packed.shape[:-1], 4 * (packed.shape[-1] // 3))
