"""Shape rules for jax-gmma's GEMMs and quantized operands: pure Python, no JAX tracing, no
device.

Every rule raises ``ValueError`` (or ``TypeError`` for dtypes) naming the argument and the rule,
so bad input fails at trace time, before anything runs. The result is a printable
:class:`GemmProblem`: the problem description, kept apart from the tuned kernel config
(:mod:`jax_gmma.configs`).

Dimensions may be symbolic (``jax.export.symbolic_shape``): the rules compute with them as they
do with ints, check equalities structurally, and check alignment and size limits on constant
dimensions only (a symbolic dimension is a positive integer of unknown value).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import ml_dtypes
import numpy as np

from .._compat import is_symbolic_dim
from .formats import E4M3 as F8E4M3, E5M2 as F8E5M2, F32, get_format
from .layouts import ROWMAJOR, get_layout

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)

FP8_DTYPES = (F8E4M3, F8E5M2)
#: (A dtype, B dtype) pairs with kernels. B is the weight operand.
SUPPORTED_PAIRS = ((F8E4M3, F8E4M3), (F8E5M2, F8E4M3))
OUT_DTYPES = (BF16, F16, F32)

#: K must be a multiple of this (TMA: 16-byte aligned rows of fp8).
K_ALIGN = 16
#: N must be a multiple of this (16-byte aligned output rows for 16-bit outputs).
N_ALIGN = 8


def is_constant_dim(d) -> bool:
  """True for an integer dimension (Python or NumPy int, not bool); False for a symbolic one."""
  return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def dims(shape, who: str, name: str, *, min_size: int = 1) -> tuple:
  """``shape`` as a tuple of dimensions: ints (each >= ``min_size``, normalised to Python int)
  or symbolic dimensions. ``TypeError`` / ``ValueError`` naming ``who`` and ``name``."""
  if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
    raise TypeError(f"{who}: {name} must be a tuple of ints, got {shape!r}")
  shape = tuple(shape)
  out = []
  for d in shape:
    if is_constant_dim(d):
      if d < min_size:
        raise ValueError(f"{who}: every dimension of {name} must be >= {min_size}, got "
                         f"{name}={shape}")
      out.append(int(d))
    elif is_symbolic_dim(d):
      out.append(d)
    else:
      raise TypeError(f"{who}: {name} must be a tuple of ints, got {shape!r}")
  return tuple(out)


def same_shape(a, b) -> bool:
  """Whether two shapes are equal (symbolic dimensions: provably equal)."""
  a, b = tuple(a), tuple(b)
  return len(a) == len(b) and all(x == y for x, y in zip(a, b))


def fmt_shape(shape) -> str:
  """A shape as the user writes it: ``(4, 64)``, ``(m, 64)``."""
  shape = tuple(shape)
  return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def size(shape):
  """Number of elements (an int, or a symbolic expression)."""
  return math.prod(tuple(shape))


def _name(dt) -> str:
  return np.dtype(dt).name


def _is_float(dt) -> bool:
  """True for numpy and ml_dtypes real floating types (bfloat16 and fp8 included; not complex,
  which ``ml_dtypes.finfo`` also describes)."""
  try:
    if np.issubdtype(np.dtype(dt), np.complexfloating):
      return False
  except TypeError:
    return False
  try:
    ml_dtypes.finfo(np.dtype(dt))
    return True
  except (TypeError, ValueError):
    return False


@dataclasses.dataclass(frozen=True)
class GemmProblem:
  """out[..., m, n] = a_scale * b_scale * sum_k a[..., m, k] * b[n, k] (+ bias[n])."""
  m: int                      # rows of A after folding leading batch dims
  n: int
  k: int
  batch_shape: tuple          # leading dims of A (folded into m)
  a_dtype: np.dtype
  b_dtype: np.dtype
  out_dtype: np.dtype
  a_scale: str                # "tensor" | "row"
  b_scale: str                # "tensor" | "channel"
  has_bias: bool

  def __str__(self) -> str:
    m = f"M={self.m}" + (f" (batch {self.batch_shape})" if self.batch_shape else "")
    return (f"GemmProblem({m} N={self.n} K={self.k} {_name(self.a_dtype)} x {_name(self.b_dtype)} -> "
            f"{_name(self.out_dtype)}, a_scale={self.a_scale}, b_scale={self.b_scale}, "
            f"bias={'yes' if self.has_bias else 'no'})")

  @property
  def flops(self) -> int:
    return 2 * self.m * self.n * self.k


def _scale_mode(arg: str, shape: Optional[Sequence[int]], dtype, rows: int, batch: tuple,
                vec_name: str) -> str:
  if shape is None:
    return "tensor"
  shape = tuple(shape)
  if dtype is not None and not _is_float(dtype):
    raise TypeError(f"{arg} must be a floating-point array (float32 preferred), got {_name(dtype)}")
  if shape in ((), (1,)) or (len(shape) >= 1 and all(is_constant_dim(d) for d in shape)
                             and size(shape) == 1 and len(shape) <= len(batch) + 2):
    return "tensor"
  if arg == "a_scale":
    full = batch + (rows // size(batch) if batch else rows,)
    if any(same_shape(shape, s) for s in (full, full + (1,), (rows,), (rows, 1))):
      return "row"
    raise ValueError(f"a_scale must be a scalar (per-tensor) or have shape {full} or {full + (1,)} "
                     f"(one scale per row of a), got {shape}")
  if any(same_shape(shape, s) for s in ((rows,), (rows, 1))):
    return vec_name
  raise ValueError(f"b_scale must be a scalar (per-tensor) or have shape ({rows},) or ({rows}, 1) "
                   f"(one scale per row of b, i.e. per output channel), got {shape}")


def _gemm_dims(a_shape, b_shape) -> tuple:
  """(batch, M, K, N) of a (..., M, K) x (N, K) GEMM, with the rules every kernel family shares:
  no zero-size dims, matching K, K and N aligned for TMA, every dim < 2**31."""
  batch = a_shape[:-2]
  m = size(a_shape[:-1])
  k = a_shape[-1]
  n = b_shape[0]
  if any(is_constant_dim(d) and d == 0 for d in a_shape + b_shape):
    raise ValueError(f"zero-size dimensions are not supported: a {a_shape}, b {b_shape}")
  if not b_shape[1] == k:
    raise ValueError(f"contraction mismatch: a.shape[-1] (K={k}) != b.shape[1] ({b_shape[1]}); "
                     "b must be (N, K), K-major")
  for name, d, what in (("K", k, "a.shape[-1]"), ("N", n, "b.shape[0]")):
    if not is_constant_dim(d):
      raise ValueError(f"{name} ({what}) must be a constant dimension (it picks the kernel and "
                       f"its alignment), got the symbolic {d}")
  if k % K_ALIGN:
    raise ValueError(f"K (a.shape[-1]) must be a multiple of {K_ALIGN} (TMA: 16-byte aligned fp8 rows), "
                     f"got {k}")
  if n % N_ALIGN:
    raise ValueError(f"N (b.shape[0]) must be a multiple of {N_ALIGN} (TMA: 16-byte aligned output rows), "
                     f"got {n}")
  if max(d for d in (m, n, k) if is_constant_dim(d)) >= 2**31:
    raise ValueError(f"dimensions must be < 2**31, got M={m} N={n} K={k}")
  return batch, m, k, n


def _normalize_operands(a_shape, a_dtype, b_shape, b_dtype, out_dtype, outs: str):
  """Shapes as tuples, dtypes as numpy dtypes, and the rank rules every GEMM shares: a
  (..., M, K), b (N, K). `outs` lists the valid output dtypes for the error message."""
  a_shape, b_shape = tuple(a_shape), tuple(b_shape)
  a_dtype, b_dtype = np.dtype(a_dtype), np.dtype(b_dtype)
  try:
    out_dtype = np.dtype(out_dtype)
  except TypeError as e:
    raise TypeError(f"out_dtype must be one of {outs}, got {out_dtype!r}") from e
  if len(a_shape) < 2:
    raise ValueError(f"a must have rank >= 2 (..., M, K), got shape {a_shape}")
  if len(b_shape) != 2:
    raise ValueError(f"b must have rank 2 (N, K), got shape {b_shape}")
  return a_shape, a_dtype, b_shape, b_dtype, out_dtype


def _check_bias(bias_shape, bias_dtype, n: int) -> bool:
  """Whether there is a bias; when there is, it must be a floating (N,) vector."""
  if bias_shape is None:
    return False
  if tuple(bias_shape) != (n,):
    raise ValueError(f"bias must have shape (N,) = ({n},), got {tuple(bias_shape)}")
  if bias_dtype is not None and not _is_float(bias_dtype):
    raise TypeError(f"bias must be floating-point, got {_name(bias_dtype)}")
  return True


def fp8_gemm_problem(a_shape, a_dtype, b_shape, b_dtype, *, a_scale_shape=None, a_scale_dtype=None,
                     b_scale_shape=None, b_scale_dtype=None, bias_shape=None, bias_dtype=None,
                     out_dtype=BF16) -> GemmProblem:
  """Validates an FP8 GEMM and returns its :class:`GemmProblem`.

  a: (..., M, K) fp8, K contiguous; b: (N, K) fp8, K contiguous (the layout of cuBLASLt's and
  DeepGEMM's "TN" GEMM: both operands K-major).
  """
  a_shape, a_dtype, b_shape, b_dtype, out_dtype = _normalize_operands(
      a_shape, a_dtype, b_shape, b_dtype, out_dtype, "bfloat16, float16, float32")
  if a_dtype not in FP8_DTYPES:
    raise TypeError(f"a must be float8_e4m3fn or float8_e5m2, got {_name(a_dtype)} "
                    "(quantize it first, e.g. jax_gmma.quantize)")
  if b_dtype not in FP8_DTYPES:
    raise TypeError(f"b must be float8_e4m3fn or float8_e5m2, got {_name(b_dtype)}")
  if (a_dtype, b_dtype) not in SUPPORTED_PAIRS:
    pairs = ", ".join(f"{_name(x)} x {_name(y)}" for x, y in SUPPORTED_PAIRS)
    raise TypeError(f"dtype pair a={_name(a_dtype)}, b={_name(b_dtype)} is not supported; "
                    f"supported (a x b): {pairs}")
  if out_dtype not in OUT_DTYPES:
    raise TypeError(f"out_dtype must be one of bfloat16, float16, float32, got {_name(out_dtype)}")
  batch, m, k, n = _gemm_dims(a_shape, b_shape)
  a_mode = _scale_mode("a_scale", a_scale_shape, a_scale_dtype, m, batch, "row")
  b_mode = _scale_mode("b_scale", b_scale_shape, b_scale_dtype, n, (), "channel")
  has_bias = _check_bias(bias_shape, bias_dtype, n)
  return GemmProblem(m=m, n=n, k=k, batch_shape=batch, a_dtype=a_dtype, b_dtype=b_dtype,
                     out_dtype=out_dtype, a_scale=a_mode, b_scale=b_mode, has_bias=has_bias)


def output_shape(problem: GemmProblem) -> tuple:
  if problem.batch_shape:
    return problem.batch_shape + (problem.m // size(problem.batch_shape), problem.n)
  return (problem.m, problem.n)


# -- block-scaled FP8 GEMM (DeepSeek-style 1x128 / 128x128 scales) ------------------------------

#: K block of every block scale (1x128 activations; 128x128 or 1x128 weights).
BLOCK_K = 128
#: Rows of a 128x128 weight scale block.
BLOCK_N = 128
#: (A dtype, B dtype) pairs with block-scaled kernels.
BLOCKWISE_PAIRS = ((F8E4M3, F8E4M3),)
#: Output dtypes of the block-scaled GEMM (float16: the float32 kernel, then one rounding).
BLOCKWISE_OUT_DTYPES = (BF16, F16, F32)


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


@dataclasses.dataclass(frozen=True)
class BlockwiseProblem:
  """out[..., m, n] = sum_kb a_scales[..., m, kb] * b_scales[n // G, kb] *
  sum_{k in block kb} a[..., m, k] * b[n, k]  (+ bias[n]); G = 128 ("1d2d") or 1 ("1d1d")."""
  m: int                      # rows of A after folding leading batch dims
  n: int
  k: int
  batch_shape: tuple
  a_dtype: np.dtype
  b_dtype: np.dtype
  out_dtype: np.dtype
  variant: str                # "1d2d": b_scales (ceil(N/128), kb) | "1d1d": b_scales (N, kb)
  has_bias: bool

  @property
  def k_blocks(self) -> int:
    return _cdiv(self.k, BLOCK_K)

  @property
  def b_scale_rows(self) -> int:
    return _cdiv(self.n, BLOCK_N) if self.variant == "1d2d" else self.n

  @property
  def flops(self) -> int:
    return 2 * self.m * self.n * self.k

  def __str__(self) -> str:
    m = f"M={self.m}" + (f" (batch {self.batch_shape})" if self.batch_shape else "")
    return (f"BlockwiseProblem({m} N={self.n} K={self.k} {_name(self.a_dtype)} x {_name(self.b_dtype)} -> "
            f"{_name(self.out_dtype)}, scales 1x128 x {'128x128' if self.variant == '1d2d' else '1x128'}, "
            f"bias={'yes' if self.has_bias else 'no'})")


def fp8_blockwise_problem(a_shape, a_dtype, b_shape, b_dtype, a_scales_shape, a_scales_dtype,
                          b_scales_shape, b_scales_dtype, *, bias_shape=None, bias_dtype=None,
                          out_dtype=BF16) -> BlockwiseProblem:
  """Validates a block-scaled FP8 GEMM and returns its :class:`BlockwiseProblem`.

  a: (..., M, K) float8_e4m3fn, K contiguous; b: (N, K) float8_e4m3fn, K contiguous.
  a_scales: (..., M, ceil(K/128)) float32 (one per row and 128 of K).
  b_scales: (ceil(N/128), ceil(K/128)) float32 (128x128 blocks, "1d2d") or (N, ceil(K/128))
  float32 (1x128 blocks, "1d1d"). A partial last K block (K % 128 != 0) is allowed.
  """
  outs = ", ".join(_name(d) for d in BLOCKWISE_OUT_DTYPES)
  a_shape, a_dtype, b_shape, b_dtype, out_dtype = _normalize_operands(
      a_shape, a_dtype, b_shape, b_dtype, out_dtype, outs)
  if a_dtype != F8E4M3:
    raise TypeError(f"a must be float8_e4m3fn (block-scaled kernels are built for e4m3 x e4m3 only), "
                    f"got {_name(a_dtype)} (quantize it first, e.g. jax_gmma.quantize(x, 'fp8_1x128'))")
  if b_dtype != F8E4M3:
    raise TypeError(f"b must be float8_e4m3fn (block-scaled kernels are built for e4m3 x e4m3 only), "
                    f"got {_name(b_dtype)}")
  if out_dtype not in BLOCKWISE_OUT_DTYPES:
    raise TypeError(f"out_dtype must be one of {outs}, got {_name(out_dtype)}")
  batch, m, k, n = _gemm_dims(a_shape, b_shape)
  kb = _cdiv(k, BLOCK_K)
  if a_scales_shape is None:
    raise ValueError("a_scales is required: float32 of shape (..., M, ceil(K/128))")
  a_scales_shape = tuple(a_scales_shape)
  inner_m = a_shape[-2]
  if a_scales_shape not in (batch + (inner_m, kb), (m, kb)):
    raise ValueError(f"a_scales must have shape {batch + (inner_m, kb)} (one scale per row of a and "
                     f"per 128 of K: (..., M, ceil(K/128))), got {a_scales_shape}")
  if a_scales_dtype is not None and np.dtype(a_scales_dtype) != F32:
    raise TypeError(f"a_scales must be float32, got {_name(a_scales_dtype)}")
  if b_scales_shape is None:
    raise ValueError("b_scales is required: float32 of shape (ceil(N/128), ceil(K/128)) or (N, ceil(K/128))")
  b_scales_shape = tuple(b_scales_shape)
  if b_scales_shape == (_cdiv(n, BLOCK_N), kb):
    variant = "1d2d"
  elif b_scales_shape == (n, kb):
    variant = "1d1d"
  else:
    raise ValueError(f"b_scales must have shape ({_cdiv(n, BLOCK_N)}, {kb}) (128x128 blocks: "
                     f"(ceil(N/128), ceil(K/128))) or ({n}, {kb}) (1x128 blocks: (N, ceil(K/128))), "
                     f"got {b_scales_shape}")
  if b_scales_dtype is not None and np.dtype(b_scales_dtype) != F32:
    raise TypeError(f"b_scales must be float32, got {_name(b_scales_dtype)}")
  has_bias = _check_bias(bias_shape, bias_dtype, n)
  return BlockwiseProblem(m=m, n=n, k=k, batch_shape=batch, a_dtype=a_dtype, b_dtype=b_dtype,
                          out_dtype=out_dtype, variant=variant, has_bias=has_bias)


# -- quantized operands (QuantizedArray, quantize) -----------------------------------------------

#: The quantization kernel (cpp/sm90_fp8_quantize.cu) walks an (M, K) input in 128-element row
#: segments counted in 32 bits: it runs only when M * ceil(Kp / 128) is at most this (Kp: K padded
#: to the scale block); larger inputs take the pure-JAX path.
QUANTIZE_KERNEL_MAX_SEGMENTS = 2**31 - 1
#: Elements per row segment of the quantization kernel.
QUANTIZE_KERNEL_SEGMENT = 128


@dataclasses.dataclass(frozen=True)
class QuantizedShapes:
  """The array shapes of one quantized operand (a :class:`~jax_gmma.QuantizedArray`).

  canonical: the logical shape with the contraction (K) axis moved last, unpadded.
  data: the stored elements, ``(..., rows, Kp)`` (K zero-padded to whole blocks; per-tensor:
    the canonical shape).
  rowmajor_scales: the plain scale matrix (``()`` for per-tensor scales).
  scales: the scales as stored under the layout (the swizzled atoms for ``"sm100_128x4"``).
  global_scale: ``()`` for formats with a per-tensor global scale (NVFP4), else None.
  """
  canonical: tuple
  data: tuple
  rowmajor_scales: tuple
  scales: tuple
  global_scale: Optional[tuple]


def quantized_shapes(fmt, shape, axis: int = -1, layout=ROWMAJOR, *,
                     who: str = "jax_gmma.quantize", name: str = "x",
                     min_size: int = 1) -> QuantizedShapes:
  """The shapes :func:`jax_gmma.quantize` stores for an array of logical ``shape`` quantized
  along ``axis`` to format ``fmt`` with scale ``layout``; what :class:`~jax_gmma.QuantizedArray`
  checks its fields against. Dimensions may be symbolic.

  Raises ``ValueError`` naming ``who`` and ``name`` when the rank does not fit the format
  (per-tensor formats: at least 1 dimension; the others: at least 2, ``(..., rows, K)``) or
  ``axis`` is out of range; and, with ``min_size`` (default 1), when a dimension is smaller."""
  fmt = get_format(fmt)
  lay = get_layout(layout)
  shape = dims(shape, who, f"{name}.shape" if name == "x" else name, min_size=min_size)
  min_ndim = 1 if fmt.kind == "tensor" else 2
  if len(shape) < min_ndim:
    what = "1 dimension" if min_ndim == 1 else "2 dimensions (rows, K)"
    raise ValueError(f"{who}: {name} must have at least {what} for format {fmt.name!r}, got "
                     f"shape {fmt_shape(shape)}")
  if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
    raise TypeError(f"{who}: axis must be an int, got {axis!r}")
  if not -len(shape) <= axis < len(shape):
    what = f"{name} with shape" if name == "x" else name
    raise ValueError(f"{who}: axis {axis} is out of range for {what} {fmt_shape(shape)}")
  axis = int(axis) % len(shape)
  canon = shape[:axis] + shape[axis + 1:] + (shape[axis],)
  if fmt.kind == "tensor":
    data, plain = canon, ()
  else:
    data = canon[:-1] + (fmt.padded_k(canon[-1]),)
    plain = fmt.scales_shape(canon)
  stored = plain if lay.name == ROWMAJOR else lay.stored_shape(plain)
  return QuantizedShapes(canonical=canon, data=data, rowmajor_scales=plain, scales=stored,
                         global_scale=() if fmt.has_global_scale else None)


def quantize_kernel_fits(m, k, block: int) -> bool:
  """Whether the quantization kernel can take an (m, k) input with scale block ``block``:
  constant dimensions and at most :data:`QUANTIZE_KERNEL_MAX_SEGMENTS` row segments (a symbolic
  dimension cannot be bounded at trace time, so it takes the pure-JAX path)."""
  if not (is_constant_dim(m) and is_constant_dim(k)):
    return False
  kp = _cdiv(int(k), block) * block
  return int(m) * _cdiv(kp, QUANTIZE_KERNEL_SEGMENT) <= QUANTIZE_KERNEL_MAX_SEGMENTS
