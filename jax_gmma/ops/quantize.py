"""Quantization: :func:`quantize` / :func:`dequantize` and the activation quantize kernel.

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


The CUDA kernel
---------------
Activation quantization as one CUDA kernel: the ``fp8_1x128`` (and ``mxfp8``) formats of
:func:`jax_gmma.quantize` for an ``(M, K)`` array, K last.

The primitive :data:`fp8_quantize_p` lowers to

* the pure-JAX path of :func:`jax_gmma.quantize` (``numerics.scaling.quantize_blocks``) on every
  platform (the default lowering), and
* on a Hopper GPU with the kernels built, the XLA FFI custom call ``jax_gmma_fp8_quantize``
  (``cpp/sm90_fp8_quantize.cu``, ``ffi/quantize_ffi.cc``): one bandwidth-bound pass that reads
  x once and writes the fp8 data and the scales. Its results are bit-identical to the pure-JAX
  path run by XLA on the same GPU (same scale arithmetic, same division instruction, same
  e4m3 conversion; see ``cpp/include/jax_gmma/quantize_api.h``).

Unlike the GEMMs, quantization never refuses to run: on a CUDA GPU without the kernel (another
architecture, an older library, a build without CUDA) it silently runs the pure-JAX path, which
is what :func:`jax_gmma.quantize` always did there.

:func:`jax_gmma.quantize` dispatches here for ``fp8_1x128`` / ``mxfp8`` with ``float8_e4m3fn``
elements, ``axis=-1`` and a bfloat16 / float16 / float32 input (leading dims are flattened into
M); ``quantize(..., use_kernel=False)`` forces the pure-JAX path.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad

from .. import _backend, _vma, primitive, sharding
from ..arrays import (LAYOUT_ROWMAJOR, QuantizedArray, check_layout_format, dequantize,
                      layout_or_error, rowmajor_scales)
from ..numerics import codec, formats, layouts, shapes
from ..numerics.codec import jax_supports_dtype, round_to_dtype, storage_dtype, unpack_fp4, unpack_fp6
from ..numerics.formats import Format, get_format
from ..numerics.scaling import quantize_blocks, scaled_matmul_inputs

_FP6 = (formats.E2M3, formats.E3M2)
_E2M1 = formats.E2M1

__all__ = ["quantize", "quantize_parts", "dequantize", "to_jax_scaled_matmul_inputs", "pack_fp4",
           "unpack_fp4", "pack_fp6", "unpack_fp6", "jax_supports_dtype", "storage_dtype",
           "round_to_dtype", "fp8_quantize_p", "quantize_rows", "applies", "kernel_available",
           "FP8_QUANTIZE_TARGET", "KERNEL_FORMATS", "DIV_MODES", "DIV_MODE"]

FP8_QUANTIZE_TARGET = _backend.FP8_QUANTIZE_TARGET
#: Formats the kernel computes: scale block along K (the rows of a block are always 1).
KERNEL_FORMATS = {"fp8_1x128": 128, "mxfp8": 32}
#: Input dtypes the kernel reads (anything else takes the pure-JAX path).
INPUT_DTYPES = tuple(np.dtype(d) for d in (jnp.bfloat16, jnp.float16, jnp.float32))
#: How the kernel divides x / scale (fp8_1x128), the ``JAX_GMMA_QUANT_DIV_*`` of quantize_api.h:
#: "xla_gpu" is how XLA compiles the reference's f32 division on NVIDIA GPUs (div.full.f32);
#: "ieee" is the correctly rounded quotient. The kernel is bit-identical to the reference only
#: with XLA's choice, so DIV_MODE must follow it (tests/test_quantize_kernel.py checks it).
DIV_MODES = {"xla_gpu": 0, "ieee": 1}
DIV_MODE = "xla_gpu"
#: Scale layouts the kernel writes (``JAX_GMMA_QUANT_SCALES_*``): row-major, and for ``mxfp8``
#: the swizzled 128 x 4 atoms the MXFP8 GEMMs read (jax_gmma.layouts "sm100_128x4", padding
#: included), so that no XLA transpose runs between the quantization and the GEMM.
SCALE_LAYOUTS = {"rowmajor": 0, "sm100_128x4": 1}

_E4M3 = np.dtype(jnp.float8_e4m3fn)


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def output_shapes(m: int, k: int, fmt: str, layout: str = "rowmajor") -> Tuple[tuple, tuple]:
  """(data shape, scales shape) of an (m, k) input: K padded up to whole blocks; swizzled
  scales (``layout="sm100_128x4"``) as (ceil(m / 128), ceil(nb / 4), 32, 4, 4)."""
  block = KERNEL_FORMATS[fmt]
  nb = _cdiv(k, block)
  if layout == "rowmajor":
    return (m, nb * block), (m, nb)
  return (m, nb * block), (_cdiv(m, 128), _cdiv(nb, 4), 32, 4, 4)


# -- the primitive ----------------------------------------------------------------------------

def _abstract_eval(x, *, fmt, div_mode, layout):
  del div_mode
  data_shape, scales_shape = output_shapes(*x.shape, fmt, layout)
  scale_dtype = formats.get_format(fmt).scale_dtype
  return [_vma.out_aval(data_shape, _E4M3, x), _vma.out_aval(scales_shape, scale_dtype, x)]


def _reference(x, *, fmt, div_mode, layout):
  """The pure-JAX path of jax_gmma.quantize for an (M, K) array: (data, scales)."""
  del div_mode
  data, scales, _ = quantize_blocks(x, fmt, _E4M3.name, 1)
  if layout != "rowmajor":
    scales = layouts.swizzle_scales(scales, layout)
  return data, scales


@functools.lru_cache(maxsize=None)
def _target_in_library() -> bool:
  """Whether the built library has the quantization handler (an older one does not)."""
  e = _backend.ext()
  return bool(e is not None and e.cuda_built() and FP8_QUANTIZE_TARGET in e.registrations())


def kernel_available() -> bool:
  """True when quantization runs the CUDA kernel here: a Hopper GPU (the device
  :func:`jax_gmma._backend.check_cuda_kernels` plans for) and a library with the handler. Never
  raises: without the kernel the pure-JAX path runs, as it always did."""
  try:
    dev = _backend.check_cuda_kernels("quantize")
  except _backend.KernelUnavailable:
    return False
  return dev is not None and _target_in_library()


def _kernel_missing(ctx, params):
  return None if kernel_available() else "no quantize kernel here"


def _kernel(ctx, x, *, fmt, div_mode, layout):
  rule = jax.ffi.ffi_lowering(FP8_QUANTIZE_TARGET)
  return rule(ctx, x, block=np.int32(KERNEL_FORMATS[fmt]), div_mode=np.int32(DIV_MODES[div_mode]),
              scale_layout=np.int32(SCALE_LAYOUTS[layout]))


def _batch_rule(prim):
  def rule(args, dims, *, fmt, div_mode, layout):
    """vmap: fold the batch dim into M (rows are independent); swizzled scales are padded per
    batch element, so those are swizzled from the row-major ones by XLA."""
    (x,), (d,) = args, dims
    return _bind_rows(jnp.moveaxis(x, d, 0), fmt, div_mode, layout), (0, 0)
  return rule


def _jvp_rule(primals, tangents, *, fmt, div_mode, layout):
  """Differentiation goes through the pure-JAX path (as quantize always did)."""
  tangents = [ad.instantiate_zeros(t) for t in tangents]
  out, out_dot = jax.jvp(functools.partial(_reference, fmt=fmt, div_mode=div_mode, layout=layout),
                         tuple(primals), tuple(tangents))
  return list(out), list(out_dot)


def _partition_rule(avals, params):
  (x,) = avals
  m = x.shape[0]
  if params["layout"] == "rowmajor":
    return sharding.Rule(operands=(("m", "k"),), results=(("m", "kp"), ("m", "nb")), shardable=("m",),
                         check=lambda f, d: sharding.divides(m, d, "M"))
  # swizzled scales (ceil(m / 128), ceil(nb / 4), 32, 4, 4): whole 128-row atoms per shard
  whole = m % 128 == 0
  return sharding.Rule(operands=(("m", "k"),),
                       results=(("m", "kp"), ("mt" if whole else "ma",) + sharding.fresh("s", 4)),
                       shardable=("m",), compound={"m": ("mt", "mr", 128)} if whole else {},
                       check=lambda f, d: sharding.aligned(m, d, 128, "M"))



# Unlike the GEMMs, quantization never refuses: without the kernel it runs the pure-JAX path.
FP8_QUANTIZE = primitive.define(
    "jax_gmma_fp8_quantize", abstract_eval=_abstract_eval, reference=_reference,
    user_fn="jax_gmma.quantize", kernel=_kernel, kernel_missing=_kernel_missing, op="quantize",
    quiet_fallback=True, multiple_results=True, partition_rule=_partition_rule, vmap=_batch_rule,
    jvp=_jvp_rule)
fp8_quantize_p = FP8_QUANTIZE.p


# -- entry points -----------------------------------------------------------------------------

def applies(fmt: str, dtype, x_dtype, axis: int, ndim: int, shape=None) -> bool:
  """Whether quantize(x, fmt, dtype=dtype, axis=axis) can go through this primitive: a kernel
  format with float8_e4m3fn elements, K the last axis, a bfloat16/float16/float32 input, and
  (given ``shape``) constant dimensions within the kernel's 32-bit segment count
  (:func:`jax_gmma.numerics.shapes.quantize_kernel_fits`)."""
  if not (fmt in KERNEL_FORMATS and np.dtype(dtype) == _E4M3 and ndim >= 2
          and axis % ndim == ndim - 1 and np.dtype(x_dtype) in INPUT_DTYPES):
    return False
  if shape is None:
    return True
  return shapes.quantize_kernel_fits(shapes.size(tuple(shape)[:-1]), tuple(shape)[-1],
                                     KERNEL_FORMATS[fmt])


def quantize_rows(x, fmt: str = "fp8_1x128", *, div_mode: str = None, layout: str = "rowmajor"):
  """``(data, scales)`` of ``x`` (..., K) quantized along its last axis, exactly as
  ``jax_gmma.quantize(x, fmt, layout=layout)`` stores them: data (..., Kp) float8_e4m3fn, scales
  (..., Kp / block) (float32 for fp8_1x128, float8_e8m0fnu for mxfp8), Kp = K rounded up to the
  block; ``layout="sm100_128x4"`` (mxfp8): the swizzled scales of jax_gmma.layouts, written by
  the kernel itself for a 2-D x (leading dims: the row-major scales swizzled by XLA). Leading
  dims are flattened into the kernel's M. ``div_mode`` overrides :data:`DIV_MODE`."""
  if fmt not in KERNEL_FORMATS:
    raise ValueError(f"quantize_rows: format must be one of {sorted(KERNEL_FORMATS)}, got {fmt!r}")
  div_mode = DIV_MODE if div_mode is None else div_mode
  if div_mode not in DIV_MODES:
    raise ValueError(f"quantize_rows: div_mode must be one of {sorted(DIV_MODES)}, "
                     f"got {div_mode!r}")
  if layout not in SCALE_LAYOUTS or (layout != "rowmajor" and fmt != "mxfp8"):
    raise ValueError(f"quantize_rows: layout must be 'rowmajor' (or 'sm100_128x4' for mxfp8), "
                     f"got {layout!r} for {fmt!r}")
  x = jnp.asarray(x)
  if x.ndim < 2 or x.size == 0:
    raise ValueError(f"quantize_rows: x must be a non-empty (..., rows, K) array, got shape "
                     f"{tuple(x.shape)}")
  if np.dtype(x.dtype) not in INPUT_DTYPES:
    raise TypeError(f"quantize_rows: x must be bfloat16, float16 or float32, got "
                    f"{np.dtype(x.dtype).name}")
  return _bind_rows(x, fmt, div_mode, layout)


def _bind_rows(x, fmt, div_mode, layout):
  """quantize_rows without its checks (also the vmap rule): a 2-D x binds the primitive as is;
  leading dims are flattened into M, and swizzled scales are then swizzled per leading index
  by XLA (their padding is per (rows, K) matrix)."""
  if x.ndim == 2:
    return tuple(fp8_quantize_p.bind(x, fmt=fmt, div_mode=div_mode, layout=layout))
  *lead, k = x.shape
  m = shapes.size(lead)
  data, scales = fp8_quantize_p.bind(x.reshape(m, k), fmt=fmt, div_mode=div_mode,
                                     layout="rowmajor")
  scales = scales.reshape(*lead, scales.shape[-1])
  if layout != "rowmajor":
    scales = layouts.swizzle_scales(scales, layout)
  return data.reshape(*lead, data.shape[-1]), scales


# -- quantize / dequantize -----------------------------------------------------------------

def _resolve_format(format, who: str) -> Format:
  if not isinstance(format, (str, Format)):
    raise TypeError(f"{who}: format must be a format name (str) or Format, "
                    f"got {type(format).__name__}")
  try:
    return get_format(format)
  except ValueError as e:
    raise ValueError(f"{who}: format: {str(e).replace('get_format: ', '')}") from None


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
      Hopper GPUs (bit-identical results; :func:`quantize_rows`).
      False forces the pure-JAX path everywhere.

  Returns:
    A :class:`QuantizedArray`; K is zero-padded to whole blocks in ``data``
    and the original shape is recorded so :func:`dequantize` returns it.

  Works under ``jax.jit`` (``format``, ``dtype``, ``axis``, ``layout``,
  ``use_kernel`` are static).
  """
  x, fmt, dt, axis, lay, data, scales, global_scale = _quantize(x, format, dtype, axis, layout,
                                                                use_kernel, "jax_gmma.quantize")
  return QuantizedArray(data, scales, global_scale, format=fmt, shape=tuple(x.shape), axis=axis,
                        dtype=dt, layout=lay.name)


def quantize_parts(x, format="fp8_tensor", *, dtype=None, axis: int = -1,
                   layout: str = LAYOUT_ROWMAJOR, use_kernel: bool = True):
  """``(data, scales, global_scale)`` of :func:`quantize` (same checks, same values) without
  the QuantizedArray around them: what a GEMM consumes."""
  return _quantize(x, format, dtype, axis, layout, use_kernel,
                   "jax_gmma.ops.quantize.quantize_parts")[5:]


def _quantize(x, format, dtype, axis, layout, use_kernel, who):
  fmt = _resolve_format(format, who)
  dt = fmt.check_dtype(dtype, who)
  lay = layout_or_error(layout, who)
  check_layout_format(fmt, lay, who)
  try:
    storage_dtype(dt)  # fail early, outside jit, if JAX cannot hold dt
  except TypeError as e:
    raise TypeError(f"{who}: format {fmt.name!r}: {e}") from None
  x = _check_float_array(x, who)
  # The one rule for the stored shapes (QuantizedArray checks its fields against it too):
  # rank, axis, data (..., rows, Kp) and scales.
  sh = shapes.quantized_shapes(fmt, x.shape, axis, lay, who=who, name="x", min_size=0)
  axis = int(axis) % x.ndim
  if shapes.is_constant_dim(x.shape[axis]) and x.shape[axis] < 1:
    raise ValueError(f"{who}: K (x.shape[{axis}]) must be >= 1, got shape "
                     f"{shapes.fmt_shape(x.shape)}")
  if any(shapes.is_constant_dim(d) and d == 0 for d in x.shape):
    raise ValueError(f"{who}: x must be non-empty, got shape {shapes.fmt_shape(x.shape)}")

  kernel_layout = LAYOUT_ROWMAJOR
  if use_kernel and applies(fmt.name, dt, x.dtype, axis, x.ndim, x.shape):
    # The kernel's primitive (pure-JAX lowering off Hopper): same data/scales. MXFP8's
    # swizzled scales come out of the kernel directly (no XLA transpose after it).
    if lay.name in SCALE_LAYOUTS and fmt.name == "mxfp8":
      kernel_layout = lay.name
    data, scales = quantize_rows(x, fmt.name, layout=kernel_layout)
    global_scale = None
  else:
    data, scales, global_scale = quantize_blocks(x, fmt.name, dt.name, axis)
  if lay.name != kernel_layout:
    scales = layouts.swizzle_scales(scales, lay)
  assert shapes.same_shape(data.shape, sh.data) and shapes.same_shape(scales.shape, sh.scales), \
    (fmt.name, lay.name, data.shape, scales.shape, sh)
  return x, fmt, dt, axis, lay, data, scales, global_scale


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
  data, scales = scaled_matmul_inputs(q.data, rowmajor_scales(q),
                                      q.format.name)
  return data, scales, q.global_scale


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
  codec.check_last_dim(data, 2, who, "data")
  return codec.pack_fp4_codes(data)


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
  dt = codec.fp6_dtype(data, dtype, who)
  if not jnp.issubdtype(np.dtype(data.dtype), jnp.floating):
    raise TypeError(f"{who}: data must be a floating array, got "
                    f"{np.dtype(data.dtype).name}")
  if isinstance(data, np.ndarray):
    data = data.astype(np.float32)
  data = jnp.asarray(data).astype(jnp.float32)
  codec.check_last_dim(data, 4, who, "data")
  return codec.pack_fp6_codes(data, dt.name)


