"""Activation quantization as one CUDA kernel: the ``fp8_1x128`` (and ``mxfp8``) formats of
:func:`jax_gmma.quantize` for an ``(M, K)`` array, K last.

The primitive :data:`fp8_quantize_p` lowers to

* the pure-JAX path of :func:`jax_gmma.quantize` (``quantize._quantize_impl``) on every
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
from typing import Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

try:  # jax >= 0.4.36
  from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
  from jax.core import Primitive
from jax._src import dispatch  # apply_primitive: eager execution of a primitive via jit

from . import _backend, _vma
from . import sharding as _sharding
from . import formats as _formats

__all__ = ["fp8_quantize_p", "quantize_rows", "applies", "kernel_available", "FP8_QUANTIZE_TARGET",
           "KERNEL_FORMATS", "DIV_MODES", "DIV_MODE"]

FP8_QUANTIZE_TARGET = "jax_gmma_fp8_quantize"
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

fp8_quantize_p = Primitive("jax_gmma_fp8_quantize")
fp8_quantize_p.multiple_results = True
fp8_quantize_p.def_impl(functools.partial(dispatch.apply_primitive, fp8_quantize_p))


def _abstract_eval(x, *, fmt, div_mode, layout):
  del div_mode
  data_shape, scales_shape = output_shapes(*x.shape, fmt, layout)
  scale_dtype = _formats.get_format(fmt).scale_dtype
  return [_vma.out_aval(data_shape, _E4M3, x), _vma.out_aval(scales_shape, scale_dtype, x)]


fp8_quantize_p.def_abstract_eval(_abstract_eval)


def _reference(x, *, fmt, div_mode, layout):
  """The pure-JAX path of jax_gmma.quantize for an (M, K) array: (data, scales)."""
  del div_mode
  # Imported here: jax_gmma.quantize imports this module. (Not `from . import quantize`: the
  # package attribute of that name is the function.)
  from .quantize import _quantize_impl
  from .layouts import swizzle_scales
  data, scales, _ = _quantize_impl(x, fmt, _E4M3.name, 1)
  if layout != "rowmajor":
    scales = swizzle_scales(scales, layout)
  return data, scales


# Default lowering (every platform, and CUDA GPUs without the kernel): the pure-JAX path.
_reference_lowering = mlir.lower_fun(_reference, multiple_results=True)
mlir.register_lowering(fp8_quantize_p, _sharding.lowering(fp8_quantize_p, _reference_lowering))


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


def _cuda_lowering(ctx, x, *, fmt, div_mode, layout):
  if not kernel_available():
    return _reference_lowering(ctx, x, fmt=fmt, div_mode=div_mode, layout=layout)
  _backend.register_targets()
  rule = jax.ffi.ffi_lowering(FP8_QUANTIZE_TARGET)
  return rule(ctx, x, block=np.int32(KERNEL_FORMATS[fmt]), div_mode=np.int32(DIV_MODES[div_mode]),
              scale_layout=np.int32(SCALE_LAYOUTS[layout]))


mlir.register_lowering(fp8_quantize_p,
                       _sharding.lowering(fp8_quantize_p, _cuda_lowering), platform="cuda")


def _batch_rule(args, dims, *, fmt, div_mode, layout):
  """vmap: fold the batch dim into M (rows are independent); swizzled scales are padded per
  batch element, so those are swizzled from the row-major ones by XLA."""
  (x,), (d,) = args, dims
  return _bind_rows(jnp.moveaxis(x, d, 0), fmt, div_mode, layout), (0, 0)


batching.primitive_batchers[fp8_quantize_p] = _batch_rule


def _jvp_rule(primals, tangents, *, fmt, div_mode, layout):
  """Differentiation goes through the pure-JAX path (as quantize always did)."""
  tangents = [ad.instantiate_zeros(t) for t in tangents]
  out, out_dot = jax.jvp(functools.partial(_reference, fmt=fmt, div_mode=div_mode, layout=layout),
                         tuple(primals), tuple(tangents))
  return list(out), list(out_dot)


ad.primitive_jvps[fp8_quantize_p] = _jvp_rule


# -- entry points -----------------------------------------------------------------------------

def applies(fmt: str, dtype, x_dtype, axis: int, ndim: int) -> bool:
  """Whether quantize(x, fmt, dtype=dtype, axis=axis) can go through this primitive: a kernel
  format with float8_e4m3fn elements, K the last axis, a bfloat16/float16/float32 input."""
  return (fmt in KERNEL_FORMATS and np.dtype(dtype) == _E4M3 and ndim >= 2
          and axis % ndim == ndim - 1 and np.dtype(x_dtype) in INPUT_DTYPES)


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
  m = int(np.prod(lead))
  data, scales = fp8_quantize_p.bind(x.reshape(m, k), fmt=fmt, div_mode=div_mode,
                                     layout="rowmajor")
  scales = scales.reshape(*lead, scales.shape[-1])
  if layout != "rowmajor":
    from .layouts import swizzle_scales
    scales = swizzle_scales(scales, layout)
  return data.reshape(*lead, data.shape[-1]), scales
