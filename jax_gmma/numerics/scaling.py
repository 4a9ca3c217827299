"""Block quantize / dequantize maths on plain arrays (amax "current scaling"): the jitted cores
of :func:`jax_gmma.quantize` and :func:`jax_gmma.dequantize`. The rules (scale computation,
non-finite inputs, storage) are documented in :mod:`jax_gmma.ops.quantize`.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from .codec import (F32_TINY, cast_elements, e8m0_exponent, e8m0_from_exponent, has_nan,
                    storage_dtype)
from .formats import FORMATS, as_dtype, dtype_emax, dtype_max

_NVFP4_E4M3_MIN = 2.0 ** -9  # smallest positive (subnormal) float8_e4m3fn


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def to_blocks(x: jax.Array, br: int, bk: int) -> jax.Array:
  """Zero-pad ``(..., R, K)`` to whole blocks and view it as
  ``(..., nR, br, nK, bk)``."""
  *lead, r, k = x.shape
  nr, nk = cdiv(r, br), cdiv(k, bk)
  pad = [(0, 0)] * len(lead) + [(0, nr * br - r), (0, nk * bk - k)]
  if any(p[1] for p in pad):
    x = jnp.pad(x, pad)
  return x.reshape(*lead, nr, br, nk, bk)


def from_blocks(xb: jax.Array, rows: int) -> jax.Array:
  """Inverse of :func:`to_blocks` keeping the K padding, dropping row
  padding: ``(..., nR, br, nK, bk) -> (..., rows, nK*bk)``."""
  *lead, nr, br, nk, bk = xb.shape
  return xb.reshape(*lead, nr * br, nk * bk)[..., :rows, :]


def expand_scales(s: jax.Array) -> jax.Array:
  """Scales ``(..., nR, nK)`` -> broadcastable ``(..., nR, 1, nK, 1)``."""
  return s[..., :, None, :, None]


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

  xb = to_blocks(xm, br, bk)                        # (..., nR, br, nK, bk)
  finite = jnp.isfinite(xb)
  xf = jnp.where(finite, xb, 0.0)
  amax = jnp.max(jnp.abs(xf), axis=(-3, -1))          # (..., nR, nK)
  elem_max = np.float32(dtype_max(dt))
  global_scale = None
  poison = None
  if not has_nan(dt):                                # FP4/FP6: poison scale
    poison = jnp.any(~finite, axis=(-3, -1))

  if fmt.is_mx:
    exp = e8m0_exponent(amax, dtype_emax(dt))
    scales = e8m0_from_exponent(exp, poison)
    # multiply by the exact reciprocal 2^-exp (exp <= 125 for float32
    # input, so 2^-exp is a normal float32): bit-exact on every backend.
    inv_scale = jnp.ldexp(jnp.ones_like(amax), -exp)
  elif fmt.has_global_scale:                          # NVFP4
    s_max = np.float32(dtype_max(fmt.scale_dtype))
    tmax = jnp.max(amax)
    g = jnp.where(tmax > 0, tmax / (s_max * elem_max), 1.0)
    g = jnp.maximum(g, F32_TINY).astype(jnp.float32)
    bs = jnp.clip(amax / elem_max / g, _NVFP4_E4M3_MIN, s_max)
    bs = jnp.where(amax > 0, bs, 1.0)
    # The barrier keeps XLA (xla_allow_excess_precision, on by default on
    # GPU) from folding the f32 -> e4m3 -> f32 round trip away: elements
    # must be divided by the *stored* (rounded) block scale.
    s8 = jax.lax.optimization_barrier(bs.astype(fmt.scale_dtype))
    scale_f = jnp.maximum(s8.astype(jnp.float32) * g, F32_TINY)
    if poison is not None:
      s8 = jnp.where(poison, jnp.nan, s8.astype(jnp.float32)
             ).astype(fmt.scale_dtype)
    scales = s8
    global_scale = g
  else:                                               # float32 amax scaling
    s = jnp.maximum(amax / elem_max, F32_TINY)
    scale_f = jnp.where(amax > 0, s, 1.0).astype(jnp.float32)
    scales = scale_f

  if fmt.is_mx:
    v = xf * expand_scales(inv_scale)
  else:
    v = xf / expand_scales(scale_f)
  v = jnp.clip(v, -elem_max, elem_max)
  if has_nan(dt):
    v = jnp.where(finite, v, xb)   # keep NaN / Inf elementwise
  data = from_blocks(cast_elements(v, dt, store), rows)

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


# (jitted under the name above, which the lowered programs show)
quantize_blocks = jax.jit(_quantize_impl, static_argnums=(1, 2, 3))


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
    out = from_blocks(to_blocks(data, br, bk) * expand_scales(scales), rows)
  out = jnp.moveaxis(out[..., :k], -1, axis)
  return out.astype(as_dtype(out_dt_name))


# (jitted under the name above, which the lowered programs show)
dequantize_blocks = jax.jit(_dequantize_impl, static_argnums=(3, 4, 5, 6))


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


# (jitted under the name above, which the lowered programs show)
scaled_matmul_inputs = jax.jit(_scaled_matmul_inputs_impl, static_argnums=2)
