"""Shape rules for jax-gmma's GEMMs: pure Python, no JAX tracing, no device.

Every rule raises ``ValueError`` (or ``TypeError`` for dtypes) naming the argument and the rule,
so bad input fails at trace time, before anything runs. The result is a printable
:class:`GemmProblem`: the problem description, kept apart from the tuned kernel config
(:mod:`jax_gmma.configs`).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import ml_dtypes
import numpy as np

from .formats import E4M3 as F8E4M3, E5M2 as F8E5M2, F32

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


def _name(dt) -> str:
  return np.dtype(dt).name


def _is_float(dt) -> bool:
  """True for numpy and ml_dtypes floating types (bfloat16 and fp8 included)."""
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
  if shape in ((), (1,)) or (len(shape) >= 1 and int(np.prod(shape)) == 1 and len(shape) <= len(batch) + 2):
    return "tensor"
  if arg == "a_scale":
    full = batch + (rows // max(1, int(np.prod(batch))) if batch else rows,)
    if shape in (full, full + (1,), (rows,), (rows, 1)):
      return "row"
    raise ValueError(f"a_scale must be a scalar (per-tensor) or have shape {full} or {full + (1,)} "
                     f"(one scale per row of a), got {shape}")
  if shape in ((rows,), (rows, 1)):
    return vec_name
  raise ValueError(f"b_scale must be a scalar (per-tensor) or have shape ({rows},) or ({rows}, 1) "
                   f"(one scale per row of b, i.e. per output channel), got {shape}")


def _gemm_dims(a_shape, b_shape) -> tuple:
  """(batch, M, K, N) of a (..., M, K) x (N, K) GEMM, with the rules every kernel family shares:
  no zero-size dims, matching K, K and N aligned for TMA, every dim < 2**31."""
  batch = a_shape[:-2]
  m = int(np.prod(a_shape[:-1]))
  k = a_shape[-1]
  n = b_shape[0]
  if any(d == 0 for d in a_shape) or any(d == 0 for d in b_shape):
    raise ValueError(f"zero-size dimensions are not supported: a {a_shape}, b {b_shape}")
  if b_shape[1] != k:
    raise ValueError(f"contraction mismatch: a.shape[-1] (K={k}) != b.shape[1] ({b_shape[1]}); "
                     "b must be (N, K), K-major")
  if k % K_ALIGN:
    raise ValueError(f"K (a.shape[-1]) must be a multiple of {K_ALIGN} (TMA: 16-byte aligned fp8 rows), "
                     f"got {k}")
  if n % N_ALIGN:
    raise ValueError(f"N (b.shape[0]) must be a multiple of {N_ALIGN} (TMA: 16-byte aligned output rows), "
                     f"got {n}")
  if max(m, n, k) >= 2**31:
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
    return problem.batch_shape + (problem.m // int(np.prod(problem.batch_shape)), problem.n)
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
