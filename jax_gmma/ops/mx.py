"""Block-scaled GEMMs on MX / NVFP4 operands: ``mx_gemm(a_q, b_q)`` (Blackwell; MXFP8 on Hopper).

    out[m, n] = alpha * sum_kb sa[m, kb] * sb[n, kb] * sum_{k in block kb} a[m, k] * b[n, k]  (+ bias[n])

with ``a_q`` (M, K) and ``b_q`` (N, K) :class:`~jax_gmma.QuantizedArray` s in the MX formats
(mxfp8, mxfp6_e2m3, mxfp6_e3m2, mxfp4: E8M0 scale per 32 of K) or NVFP4 (E4M3 scale per 16
of K and ``alpha = a_global * b_global``, the float32 per-tensor scales, applied in the
epilogue). Both operands carry their scales in the swizzled 128x4-atom layout
(``quantize(x, fmt, layout="sm100_128x4")``, done once; see :mod:`jax_gmma.layouts`).

Paths (chosen at trace time, per the first CUDA device):

* compute capability 9.0 (H100 / H200) -> for MXFP8 x MXFP8 (float8_e4m3fn elements) jax-gmma's
  own sm_90a kernel (``cpp/sm90_mxf8_gemm_blockscaled.cu``). Hopper has no block-scaled MMA
  instruction: each 32-K block is one e4m3 wgmma into a fresh float32 tile, then promoted,
  ``acc += (sa * sb) * tile`` in float32, so every E8M0 scale is applied exactly (one rounding
  per block; inside a block the FP8 tensor core's own accumulation, ~2^-13 relative). Configs
  (:func:`select_sm90_config`): ``..._128x128`` for large M (128 x 128 tiles, two consumer warp
  groups), and for decode the "swap" configs ``..._swap_{128,64}x{16,32,64}`` (the weights
  stream through the wgmma M side in 128- or 64-row tiles -- 64 doubles the CTAs where N is
  small -- and the M tokens are its N side; ``..._swap_64x{16,32}_deep``: one CTA per SM with
  16 pipeline stages, where the 64-row tiles make at most one wave); and for a few tokens at
  small N the weight-streaming kernel ``cpp/sm90_mxf8_gemm_blockscaled_stream.cu``
  (``sm90_mxf8_stream_16x8_kw{2,4,8,16}``: 16 weight rows x 8 tokens per warp on mma.sync, K
  split over 2-16 warps; ``sm90_mxf8_stream_16x16_kw{4,8}``: 16 tokens per warp; the same
  per-block float32 promotion; its FP8 MMA runs as f16 MMAs on sm_90, so its block sums are
  exact). The promotion costs two float32
  operations per accumulator element per 32 of K, so at large M the kernel is bound by the CUDA
  cores (~370 TFLOP/s on an H200) and the exact bf16 route below is faster: from
  ``M >= SM90_DEQUANT_MIN_M`` (512) ``mx_gemm`` takes path ``"dequant"`` on Hopper. Other
  format pairs raise on Hopper;
* compute capability 10.0 (B200 / GB200) -> the sm_100a CUTLASS kernels (tcgen05, 1-SM or 2-SM);
* compute capability 12.0 (RTX 50 / RTX PRO) -> the sm_120a CUTLASS kernels;
* any other GPU, a build without that arch, or a format pair without a kernel:
  :class:`KernelUnavailable` naming the formats and the arch, unless the reference path is
  allowed (:func:`jax_gmma.allow_reference`);
* CPU / TPU: the pure-JAX reference (unpack, unswizzle, dequantize, float32 dot, scale, cast).

Path ``"dequant"`` (``mx_gemm(..., path="dequant")``, any platform; Hopper's pick from M = 512):
both operands dequantized to bfloat16 -- exactly: an element times its power-of-two (E8M0) or
E4M3 scale has at most 5 significant bits, exact in bfloat16 unless it falls below bfloat16's
normal range (2^-126, i.e. only for scales under ~2^-117) -- then XLA's bfloat16 GEMM with
float32 accumulation, the NVFP4 global scales and the bias in float32. This is what
``jax.nn.scaled_matmul`` does on Hopper (the same speed), and it is more precise than the FP8
kernel (no FP8 tensor-core accumulation inside a block).

NOT RUN ON HARDWARE (Blackwell): this project has no Blackwell GPU. The sm_100a / sm_120a
kernels are compiled, registered and checked on the host and in their SASS; the reference path
is what the tests run. The Hopper MXFP8 kernel is tested on an H200 (tests/test_gpu_mx_sm90.py).

The primitive ``mx_gemm_p`` takes the kernel's operand form: fp8 elements as-is, FP6 / FP4
elements packed into bytes (:func:`jax_gmma.ops.quantize.pack_fp6` / :func:`pack_fp4`), scale
factors as their raw bytes in the swizzled layout. Its default lowering (every platform) is
the reference computed from that form, so the CPU tests check the packing and the layout too.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.interpreters import mlir

from .. import _backend, _vma, batching, primitive, sharding
from ..arrays import QuantizedArray, dequantize, to_layout
from ..numerics import codec, formats as _formats, layouts as _layouts, shapes
from . import quantize

MX_GEMM_TARGET = _backend.MX_GEMM_TARGET

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
E4M3 = _formats.E4M3
#: Output dtypes: bfloat16 and float32 kernels; float16 = the float32 kernel + one rounding.
OUT_DTYPES = (BF16, F16, F32)
#: Operand formats of the Blackwell block-scaled GEMMs.
MX_FORMATS = ("mxfp8", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4")
#: Weight formats this family multiplies (``jax_gmma.dot``): ``dot`` quantizes the activation to
#: the matching format (or to x_format="mxfp8" for MX weights, e.g. MXFP8 activations x MXFP4
#: weights) with the swizzled scale layout and runs :func:`mx_gemm` (Blackwell kernels; MXFP8 x
#: MXFP8 also on Hopper; reference elsewhere).
WEIGHT_FORMATS = MX_FORMATS
#: Scale layout both operands must use (the layout the kernels read, produced once by quantize).
SCALE_LAYOUT = _layouts.SM100_128X4

# Compute capability -> the arch whose kernels run there. Arch-specific ("a") cubins run only on
# exactly that compute capability: sm_100a on 10.0, sm_120a on 12.0 (10.3 / B300 would need
# sm_103a, 12.1 / GB10 sm_121a: not built).
ARCH_FOR_CC = {"9.0": "sm_90a", "10.0": "sm_100a", "12.0": "sm_120a"}

# Kernels per arch and (A format, B format): config names (cpp/sm100_mx_gemm_blockscaled.cuh,
# cpp/sm120_mx_gemm_blockscaled.cuh). mxfp8 kernels take float8_e4m3fn elements only.
KERNELS = {
    "sm_90a": {
        ("mxfp8", "mxfp8"): ("sm90_mxf8_blockscaled_128x128", "sm90_mxf8_blockscaled_swap_128x16",
                             "sm90_mxf8_blockscaled_swap_128x32", "sm90_mxf8_blockscaled_swap_128x64",
                             "sm90_mxf8_blockscaled_swap_64x16", "sm90_mxf8_blockscaled_swap_64x32",
                             "sm90_mxf8_blockscaled_swap_64x64", "sm90_mxf8_blockscaled_swap_64x16_deep",
                             "sm90_mxf8_blockscaled_swap_64x32_deep", "sm90_mxf8_stream_16x8_kw2",
                             "sm90_mxf8_stream_16x8_kw4", "sm90_mxf8_stream_16x8_kw8",
                             "sm90_mxf8_stream_16x8_kw16", "sm90_mxf8_stream_16x16_kw4",
                             "sm90_mxf8_stream_16x16_kw8"),
    },
    "sm_100a": {
        ("mxfp8", "mxfp8"): ("sm100_mxfp8xmxfp8_128x128x128_1sm", "sm100_mxfp8xmxfp8_256x128x128_2sm"),
        ("mxfp6_e2m3", "mxfp6_e2m3"): ("sm100_mxfp6_e2m3xmxfp6_e2m3_128x128x128_1sm",
                                       "sm100_mxfp6_e2m3xmxfp6_e2m3_256x128x128_2sm"),
        ("mxfp6_e3m2", "mxfp6_e3m2"): ("sm100_mxfp6_e3m2xmxfp6_e3m2_128x128x128_1sm",),
        ("mxfp8", "mxfp4"): ("sm100_mxfp8xmxfp4_128x128x128_1sm", "sm100_mxfp8xmxfp4_256x128x128_2sm"),
        ("mxfp4", "mxfp4"): ("sm100_mxfp4xmxfp4_128x128x256_1sm", "sm100_mxfp4xmxfp4_256x128x256_2sm"),
        ("nvfp4", "nvfp4"): ("sm100_nvfp4xnvfp4_128x128x256_1sm", "sm100_nvfp4xnvfp4_256x128x256_2sm"),
    },
    "sm_120a": {
        ("mxfp8", "mxfp8"): ("sm120_mxfp8xmxfp8_128x128x128_coop",),
        ("mxfp6_e2m3", "mxfp6_e2m3"): ("sm120_mxfp6_e2m3xmxfp6_e2m3_128x128x128_coop",),
        ("mxfp8", "mxfp4"): ("sm120_mxfp8xmxfp4_128x128x128_coop",),
        ("mxfp4", "mxfp4"): ("sm120_mxfp4xmxfp4_128x128x128_coop",),
        ("nvfp4", "nvfp4"): ("sm120_nvfp4xnvfp4_128x128x128_coop",),
    },
}



# -- shape rules ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MxProblem:
  """out (M, N) = alpha * (a (M, K) x b (N, K)^T with block scales) (+ bias)."""
  m: int
  n: int
  k: int                 # stored (block-padded) K: the kernels contract over it
  batch_shape: tuple     # leading dims of a (folded into m)
  a_format: str
  b_format: str
  a_dtype: np.dtype      # logical element dtypes
  b_dtype: np.dtype
  out_dtype: np.dtype
  has_bias: bool

  @property
  def pair(self):
    return (self.a_format, self.b_format)

  @property
  def sf_vec(self) -> int:
    return 16 if self.a_format == "nvfp4" else 32

  @property
  def has_global(self) -> bool:
    return self.a_format == "nvfp4"

  def __str__(self) -> str:
    m = f"M={self.m}" + (f" (batch {self.batch_shape})" if self.batch_shape else "")
    return (f"MxProblem({m} N={self.n} K={self.k} {self.a_format}[{self.a_dtype.name}] x "
            f"{self.b_format}[{self.b_dtype.name}] -> {self.out_dtype.name}, "
            f"bias={'yes' if self.has_bias else 'no'})")


def k_alignment(a_format: str, b_format: str) -> int:
  """K (stored) must be a multiple of this for the pair: the scale block, 16 bytes of each
  operand, and, for FP4/FP6 elements inside the f8f6f4 MMA kind (MXFP6, or FP4 mixed with
  FP8), 128 elements (CUTLASS's TMA requirement for those unpacked-in-smem layouts)."""
  fmts = {a_format, b_format}
  if fmts & {"mxfp6_e2m3", "mxfp6_e3m2"} or fmts == {"mxfp8", "mxfp4"}:
    return 128
  return 32


def _out_align(out_dtype) -> int:
  # 16-byte output rows (float16 runs on the float32 kernel).
  return 8 if np.dtype(out_dtype) == BF16 else 4


def mx_problem(a_q, b_q, *, out_dtype=BF16, bias_shape=None, bias_dtype=None,
               caller=("mx_gemm", "a_q", "b_q")) -> MxProblem:
  """Checks two QuantizedArrays for mx_gemm; every violation raises TypeError/ValueError
  naming the function the user called and its argument (``caller`` = (function, a argument,
  b argument)), and the rule (device independent: the same on CPU and GPU)."""
  who, an, bn = f"jax_gmma.{caller[0]}", caller[1], caller[2]
  for name, q in ((an, a_q), (bn, b_q)):
    if not isinstance(q, QuantizedArray):
      raise TypeError(f"{who}: {name} must be a jax_gmma.QuantizedArray, got {type(q).__name__}")
    if q.format.name not in MX_FORMATS:
      raise ValueError(f"{who}: {name} has format {q.format.name!r}; block-scaled MX/NV GEMMs take "
                       f"{', '.join(MX_FORMATS)}")
    if q.layout != SCALE_LAYOUT:
      raise ValueError(f"{who}: {name} scales are in layout {q.layout!r}; the kernels read the "
                       f"swizzled {SCALE_LAYOUT!r} layout: quantize(x, {q.format.name!r}, "
                       f"layout={SCALE_LAYOUT!r}) once (or jax_gmma.arrays.to_layout(q, "
                       f"{SCALE_LAYOUT!r}); jax_gmma.dot converts a row-major weight itself)")
  fa, fb = a_q.format.name, b_q.format.name
  if (fa == "nvfp4") != (fb == "nvfp4"):
    raise ValueError(f"{who}: {an} ({fa}) and {bn} ({fb}) must share the scale block: nvfp4 (E4M3 "
                     "per 16) pairs only with nvfp4, the MX formats (E8M0 per 32) with each other")
  if len(b_q.canonical_shape) != 2:
    raise ValueError(f"{who}: {bn} must be a 2-D (N, K) operand, got shape {b_q.shape}")
  n, kb_logical = b_q.canonical_shape
  if len(a_q.canonical_shape) < 2:
    raise ValueError(f"{who}: {an} must be an (..., M, K) operand, got shape {a_q.shape}")
  *batch, m_rows, k_logical = a_q.canonical_shape
  batch = tuple(batch)
  if k_logical != kb_logical:
    raise ValueError(f"{who}: contraction mismatch: {an} has K={k_logical}, {bn} has K={kb_logical}")
  if batch and shapes.is_constant_dim(m_rows) and m_rows % 128:
    raise ValueError(f"{who}: {an} with leading dims {batch} needs rows (M per batch entry = {m_rows}) "
                     "to be a multiple of 128 (its swizzled scales are per batch entry); reshape x to "
                     "(M, K) before quantizing")
  k = a_q.padded_k
  align = k_alignment(fa, fb)
  if k % align:
    raise ValueError(f"{who}: K={k} (block-padded) must be a multiple of {align} for {fa} x {fb} "
                     "(16-byte rows; FP4/FP6 mixed with FP8 or MXFP6: 128 elements)")
  out_dtype = primitive.out_dtype_or_error(out_dtype, who, OUT_DTYPES)
  if n % _out_align(out_dtype):
    raise ValueError(f"{who}: N={n} must be a multiple of {_out_align(out_dtype)} for "
                     f"{out_dtype.name} output ({bn}'s rows; 16-byte output rows)")
  if bias_shape is not None:
    if bias_dtype is not None:
      primitive.check_float(bias_dtype, who, "bias", what="(N,) vector")
    if tuple(bias_shape) != (n,):
      raise ValueError(f"{who}: bias must have shape (N,) = ({n},), got {tuple(bias_shape)}")
  m = shapes.size(batch) * m_rows if batch else m_rows
  if max(d for d in (m, n, k) if shapes.is_constant_dim(d)) >= 2**31:
    raise ValueError(f"{who}: dimensions must be < 2**31, got M={m} N={n} K={k}")
  m = int(m) if shapes.is_constant_dim(m) else m  # symbolic under jax.export
  return MxProblem(m=m, n=int(n), k=int(k), batch_shape=batch, a_format=fa, b_format=fb,
                   a_dtype=a_q.dtype, b_dtype=b_q.dtype, out_dtype=out_dtype,
                   has_bias=bias_shape is not None)


# -- kernel operand form ---------------------------------------------------------------------------

def element_bits(dtype) -> int:
  return {np.dtype(ml_dtypes.float4_e2m1fn): 4, _formats.E2M3: 6, _formats.E3M2: 6}.get(np.dtype(dtype), 8)


def pack_data(q: QuantizedArray, rows: int) -> jax.Array:
  """The kernel's element operand (rows, K * bits / 8): fp8 as-is, FP6 / FP4 packed to uint8."""
  data = q.data.reshape(rows, q.data.shape[-1])
  bits = element_bits(q.dtype)
  if bits == 4:
    return quantize.pack_fp4(data)
  if bits == 6:
    return quantize.pack_fp6(data, q.dtype)
  return data


def sf_bytes(q: QuantizedArray) -> jax.Array:
  """The swizzled scale factors as flat raw bytes (uint8), what the kernels read."""
  s = q.scales
  return lax.bitcast_convert_type(s, jnp.uint8).reshape(-1)


def _unpack(x, dtype, k):
  """Kernel element operand -> float32 (rows, k)."""
  bits = element_bits(dtype)
  if bits == 8:
    return x.astype(jnp.float32)
  codes = codec.fp4_codes(x) if bits == 4 else codec.fp6_codes(x)
  return codec.decode(codes, np.dtype(dtype), bits)


def _sf_values(sf, rows, k, vec, scale_dtype):
  """Swizzled scale bytes -> float32 per element (rows, k)."""
  kb = k // vec
  shape = _layouts.swizzled_shape((rows, kb))
  raw = lax.bitcast_convert_type(sf.reshape(shape), scale_dtype)
  plain = _layouts.unswizzle_scales(raw, rows, kb)
  return jnp.repeat(plain.astype(jnp.float32), vec, axis=-1)


# -- reference ---------------------------------------------------------------------------------

def _dequantized_product(a, b, a_sf, b_sf, a_global, b_global, bias, *, m, n, k, a_dtype, b_dtype,
                         sf_vec, out_dtype, has_bias, has_global, operands, precision, **_):
  """Both operands dequantized (element x block scale) to ``operands`` dtype, multiplied with
  float32 accumulation, then the NVFP4 global scales and the bias in float32, one rounding."""
  scale_dtype = E4M3 if sf_vec == 16 else _formats.E8M0
  af = (_unpack(a, a_dtype, k) * _sf_values(a_sf, m, k, sf_vec, scale_dtype)).astype(operands)
  bf = (_unpack(b, b_dtype, k) * _sf_values(b_sf, n, k, sf_vec, scale_dtype)).astype(operands)
  out = lax.dot_general(af, bf, (((1,), (1,)), ((), ())), precision=precision,
                        preferred_element_type=jnp.float32)
  if has_global:
    out = (a_global.reshape(()) * b_global.reshape(())) * out
  if has_bias:
    out = out + bias.astype(jnp.float32).reshape(1, -1)
  return out.astype(out_dtype)


def _reference_lowering(*args, **params):
  """The reference: float32 operands, a HIGHEST-precision float32 dot."""
  return _dequantized_product(*args, **params, operands=jnp.float32, precision=lax.Precision.HIGHEST)


def _dequant_lowering(*args, **params):
  """Path "dequant": exact bfloat16 operands, XLA's bf16 GEMM with float32 accumulation."""
  return _dequantized_product(*args, **params, operands=BF16, precision=None)


def _default_lowering(*args, path, **params):
  fn = _dequant_lowering if path == "dequant" else _reference_lowering
  return fn(*args, **params)


def _abstract_eval(a, b, a_sf, b_sf, a_global, b_global, bias, *, m, n, out_dtype, **_):
  return _vma.out_aval((m, n), out_dtype, a, b, a_sf, b_sf, a_global, b_global, bias)




# -- dispatch ----------------------------------------------------------------------------------

def arch_for_cc(cc: str) -> Optional[str]:
  return ARCH_FOR_CC.get(str(cc))


def kernel_configs(arch: str, problem: MxProblem) -> tuple:
  """Kernel config names for the problem's format pair on ``arch`` (empty when none)."""
  names = KERNELS.get(arch, {}).get(problem.pair, ())
  # mxfp8 kernels are e4m3 x e4m3 (e5m2 elements: reference only).
  for fmt, dt in ((problem.a_format, problem.a_dtype), (problem.b_format, problem.b_dtype)):
    if fmt == "mxfp8" and np.dtype(dt) != E4M3:
      return ()
  return names


def select_config(arch: str, problem: MxProblem, sm_count: int, config: Optional[str] = None) -> str:
  """sm100: the 2-SM (256-row MMA over an SM pair) config when M > 128 and its tiles fill the
  SM pairs at least once, else 1-SM; sm120: its only config. ``config`` forces one."""
  names = kernel_configs(arch, problem)
  if config is not None:
    if config not in names:
      raise ValueError(f"mx_gemm: config {config!r} is not a {arch} kernel for {problem.a_format} x "
                       f"{problem.b_format}; choices: {', '.join(names) or 'none'}")
    return config
  if len(names) == 1:
    return names[0]
  if arch == "sm_90a":
    return select_sm90_config(problem.m, problem.n, sm_count)
  one, two = names[0], names[1]
  tiles_2sm = -(-problem.m // 256) * -(-problem.n // 128)
  return two if problem.m > 128 and tiles_2sm >= max(1, sm_count // 2) else one


#: Hopper MXFP8: from this M on, mx_gemm's automatic path is "dequant" (measured on the H200:
#: the kernel runs ~370 TFLOP/s at large M, the exact bf16 route ~520-600 TFLOP/s from 8192^3 /
#: 4096x7168x16384 down to about this M, where its dequantization pass stops paying off).
SM90_DEQUANT_MIN_M = 512
#: mx_gemm's ``path`` choices (None: automatic).
PATHS = ("kernel", "dequant")


def resolve_path(arch: Optional[str], problem: MxProblem, path: Optional[str]) -> str:
  """"kernel" or "dequant" for ``problem`` on ``arch`` ("sm_90a", "sm_100a", ...; None: no
  CUDA device). ``path`` None is automatic: "dequant" on Hopper from SM90_DEQUANT_MIN_M rows
  for the pairs that have a Hopper kernel (MXFP8 x MXFP8, e4m3), else "kernel" (which is the
  reference off the GPU, and an error on a GPU without a kernel for the pair)."""
  if path is not None:
    if path not in PATHS:
      raise ValueError(f"mx_gemm: path must be one of {PATHS} or None (automatic), got {path!r}")
    return path
  # (a symbolic M -- jax.export -- takes the kernel path, whose lowering refuses it by name)
  if (arch == "sm_90a" and shapes.is_constant_dim(problem.m) and problem.m >= SM90_DEQUANT_MIN_M
      and kernel_configs(arch, problem)):
    return "dequant"
  return "kernel"


#: Hopper MXFP8: up to this N the decode configs use 64-row weight tiles (N / 128 tiles would
#: leave SMs of the H200's 132 idle).
SM90_SMALL_N = 16384


def select_sm90_stream_config(m: int, n: int) -> Optional[str]:
  """The weight-streaming MXFP8 config for M tokens and N output columns where it beats the
  wgmma configs on the H200 (kernel alone; measured 2026-11-30),
  else None. 8-token tiles for M <= 4 with N <= 8192 and M <= 8
  with N <= 4096: 16 warps along K up to 132 strips of 16 rows (N <= 2112), 8 up to 256
  (N <= 4096), else 4. 16-token tiles (one weight fragment, two MMAs) for M <= 16 with
  N <= 4096 (8 warps along K; 16 x 2112 x 7168 13.6 vs 22.1 us, 16 x 4096 x 7168 19.0 vs 22.5)
  and M <= 32 with N <= 2304 (4 warps; 32 x 2112 x 7168 19.6 vs 22.2); at N = 8192 the wgmma
  configs stay faster from 5 tokens on (16 x 8192 x 8192: 31.0 vs 25.8)."""
  strips = -(-n // 16)
  if m <= 4 and n <= 8192 or m <= 8 and n <= 4096:
    kw = 16 if strips <= 132 else (8 if strips <= 256 else 4)
    return f"sm90_mxf8_stream_16x8_kw{kw}"
  if m <= 16 and n <= 4096:
    return "sm90_mxf8_stream_16x16_kw8"
  if m <= 32 and n <= 2304:
    return "sm90_mxf8_stream_16x16_kw4"
  return None


def select_sm90_config(m: int, n: int, sm_count: int = 132) -> str:
  """The Hopper MXFP8 config for M tokens and N output columns, measured on the H200 (kernel
  alone, K = 8192, N = 8192 and 28672; measured 2026-11-30): the token tile is the smallest that holds M (the promotion work grows with it);
  64-row weight tiles while N <= SM90_SMALL_N (twice the CTAs), as the one-CTA-per-SM 16-stage
  ``_deep`` configs for M <= 32 when the 64-row tiles make at most one wave (N <= 64 x SMs:
  N = 8192, M = 1 / 16 / 32: 25.9 / 25.9 / 30.1 us vs 26.5 / 26.3 / 32.2); from M = 65 the
  128 x 128 tile, except for small N, where the swap 128 x 64 tile over two token tiles is
  faster up to M = 128. For M <= 4 and N <= 8192, and M <= 8 and N <= 4096, the weight-streaming
  configs (1 x 2112 x 7168 9.9 vs 21.8 us, 1 x 4096 x 7168 13.8 vs 22.3,
  1 x 7168 x 16384 40.8 vs 46.4, 1 x 8192 x 8192 25.3 vs 25.9, 8 x 4096 x 7168 15.4 vs 22.3),
  with more warps along K the fewer 16-row strips N has, and their 16-token tiles for M <= 16 at
  N <= 4096 and M <= 32 at N <= 2304 (select_sm90_stream_config)."""
  stream = select_sm90_stream_config(m, n)
  if stream:
    return stream
  small = n <= SM90_SMALL_N
  deep = "_deep" if -(-n // 64) <= sm_count else ""
  if m <= 16:
    return f"sm90_mxf8_blockscaled_swap_64x16{deep}" if small else "sm90_mxf8_blockscaled_swap_128x16"
  if m <= 32:
    return f"sm90_mxf8_blockscaled_swap_64x32{deep}" if small else "sm90_mxf8_blockscaled_swap_128x32"
  if m <= 64:
    return "sm90_mxf8_blockscaled_swap_64x64" if small else "sm90_mxf8_blockscaled_swap_128x64"
  if m <= 128 and small:
    return "sm90_mxf8_blockscaled_swap_128x64"
  return "sm90_mxf8_blockscaled_128x128"


def unavailable_reason(problem: MxProblem, cc: Optional[str], device_kind: str = "") -> Optional[tuple]:
  """(arch or None, reason) when no kernel can run ``problem`` on a GPU of compute capability
  ``cc``; None when one can. Pure (monkeypatch _backend to fake the build)."""
  pair = f"{problem.a_format} x {problem.b_format}"
  dev = f"compute capability {cc}" + (f" ({device_kind})" if device_kind else "")
  if not _backend.kernels_built():
    err = _backend.ext_import_error()
    return None, ("jax_gmma was installed without CUDA kernels" + (f" ({err})" if err else "") +
                  "; reinstall with nvcc on PATH")
  arch = arch_for_cc(cc)
  if arch is None:
    return None, (f"no {pair} kernel for {dev}: block-scaled MX/NVFP4 kernels exist for sm_100a "
                  "(compute capability 10.0) and sm_120a (12.0), and MXFP8 x MXFP8 for sm_90a (9.0)")
  if arch == "sm_90a" and not KERNELS["sm_90a"].get(problem.pair):
    return arch, (f"no {pair} kernel for sm_90a ({dev}): Hopper has no MX/NVFP4 block-scaled "
                  "tensor-core instructions; its MX kernel is jax-gmma's own MXFP8 x MXFP8 "
                  "(float8_e4m3fn elements), the other block-scaled ones the FP8 1x128/128x128 "
                  "family (jax_gmma.blockwise_gemm); NVFP4/MXFP4/MXFP6 *weights* with bf16 "
                  "activations run on Hopper through jax_gmma.weightonly.prepare(w, fmt) and dot")
  if arch not in _backend.built_archs():
    return arch, (f"this build of jax_gmma has no {arch} kernels (built archs: "
                  f"{', '.join(_backend.built_archs()) or 'none'}); rebuild with "
                  f"JAX_GMMA_CUDA_ARCHS=\"90a;100a;120a\"")
  if not kernel_configs(arch, problem):
    have = ", ".join(f"{a} x {b}" for a, b in KERNELS[arch])
    return arch, (f"no {arch} kernel for {pair} with elements {problem.a_dtype.name} x "
                  f"{problem.b_dtype.name} (kernels: {have}; mxfp8 kernels take float8_e4m3fn)")
  return None


def refusal_reason(problem: MxProblem, arch, why: str, caller=("mx_gemm", "a_q", "b_q")) -> str:
  """What the KernelUnavailable error of ``problem`` says is missing (after "jax_gmma.<the
  function called>: "), naming the operands as that function calls them."""
  fn, an, bn = caller
  where = f"format {problem.a_format} x {problem.b_format} on {arch or 'this GPU'}"
  if fn != "mx_gemm":
    where += f" ({an} in {problem.a_format}, weight {bn} in {problem.b_format}; {fn} runs mx_gemm)"
  return f"{where}: {why}"


def plan(problem: MxProblem, arch: str, sm_count: int, config: Optional[str] = None):
  """(config name, workspace bytes); ValueError when CUTLASS's can_implement rejects the
  problem. Host only: needs the built extension, not a GPU."""
  name = select_config(arch, problem, sm_count, config)
  kernel_out = F32 if problem.out_dtype == F16 else problem.out_dtype
  err, ws = _backend.ext().check_blockscaled(name, problem.a_dtype.name, problem.b_dtype.name,
                                             kernel_out.name, problem.m, problem.n, problem.k,
                                             problem.sf_vec, sm_count, problem.has_bias,
                                             problem.has_global)
  if err:
    raise ValueError(f"jax_gmma: kernel {name} cannot run {problem}: {err}")
  return name, ws


def _device_arch():
  dev = _backend.first_cuda_device()
  return dev, (_backend.device_cc(dev) if dev is not None else None)


def _kernel_missing(ctx, params):
  dev, cc = _device_arch()
  problem = params["problem"]
  if resolve_path(arch_for_cc(cc), problem, params["path"]) == "dequant":
    return None  # the exact bf16 path runs everywhere
  why = unavailable_reason(problem, cc, getattr(dev, "device_kind", "")) if dev is not None \
      else (None, "no CUDA device")
  caller = primitive.caller_of(params, ("mx_gemm", "a_q", "b_q"))
  return None if why is None else refusal_reason(problem, *why, caller=caller)


def _kernel(ctx, *args, problem, config, path, **params):
  dev, cc = _device_arch()
  if resolve_path(arch_for_cc(cc), problem, path) == "dequant":
    return mlir.lower_fun(_dequant_lowering, multiple_results=False)(ctx, *args, **params)
  arch = arch_for_cc(cc)
  _backend.prepare_devices()
  sm_count = int(dev.core_count)
  name, ws = plan(problem, arch, sm_count, config)
  return primitive.ffi_with_workspace(
      MX_GEMM_TARGET, ctx, args, ws, config=name, a_dtype=np.dtype(params["a_dtype"]).name,
      b_dtype=np.dtype(params["b_dtype"]).name, k=np.int64(params["k"]),
      sf_vec=np.int32(params["sf_vec"]), sm_count=np.int32(sm_count),
      has_bias=bool(params["has_bias"]), has_global=bool(params["has_global"]))


def _partition_rule(avals, params):
  """mx_gemm: rows of either operand split in whole 128-row atoms of its swizzled scales (the
  scale operands are the atoms' raw bytes, flattened: an atom's bytes are contiguous)."""
  a, b, a_sf, b_sf, ga, gb, bias = avals
  m, n = params["m"], params["n"]
  ties, compound = {}, {}
  rows_a = "m"
  if m % 128 == 0 and a.shape[0] == m:
    ties.update(sfa="m")
    compound.update(m=("mt", "mr", 128, m // 128), sfa=("mt", "ra", a_sf.shape[0] // (m // 128), m // 128))
  else:
    rows_a = "ma"  # (M stays whole: a fresh factor for a's rows)
  if n % 128 == 0 and b.shape[0] == n:
    ties.update(sfb="n")
    compound.update(n=("nt", "nr", 128, n // 128), sfb=("nt", "rb", b_sf.shape[0] // (n // 128), n // 128))
  out_align = 8 if np.dtype(params["out_dtype"]) == np.dtype(jnp.bfloat16) else 4

  def check(f, d):
    if f == "m":
      return sharding.aligned(m, d, 128, "M (whole 128-row scale atoms)")
    return (sharding.aligned(n, d, 128, "N (whole 128-row scale atoms)")
            or sharding.aligned(n, d, out_align, "N"))

  def local(p, shapes_):
    m_l, n_l = shapes_[0][0], shapes_[1][0]
    problem = dataclasses.replace(p["problem"], m=m_l, n=n_l, batch_shape=())
    return {**p, "m": m_l, "n": n_l, "problem": problem}

  return sharding.Rule(operands=((rows_a, "ka"), ("n", "kb"), ("sfa" if "sfa" in ties else "sa",),
                                 ("sfb" if "sfb" in ties else "sb",), ("ga",), ("gb",),
                                 sharding.vector("n", "c", bias.shape[0], n)),
                       results=((rows_a, "n"),), shardable=("m", "n"), ties=ties, compound=compound,
                       check=check, local_params=local)



MX_GEMM = primitive.define(
    "jax_gmma_mx_gemm", abstract_eval=_abstract_eval, reference=_default_lowering,
    user_fn="jax_gmma.mx_gemm / scaled_matmul", kernel=_kernel, kernel_missing=_kernel_missing,
    op="mx_gemm", partition_rule=_partition_rule, vmap=batching.map_rule)
mx_gemm_p = MX_GEMM.p


# -- public API --------------------------------------------------------------------------------

def mx_gemm(a_q: QuantizedArray, b_q: QuantizedArray, *, bias=None, out_dtype=jnp.bfloat16,
            config: Optional[str] = None, path: Optional[str] = None):
  """Block-scaled GEMM of two quantized operands: ``dequantize(a_q) @ dequantize(b_q).T``
  (+ bias), computed from the quantized elements and scales (float32 accumulation).

  Args:
    a_q: (..., M, K) QuantizedArray (activations) in an MX format or nvfp4, scales in the
      ``"sm100_128x4"`` layout. Leading dims fold into M (then M per batch entry must be a
      multiple of 128).
    b_q: (N, K) QuantizedArray (weights), same scale block as a_q (nvfp4 with nvfp4, MX with MX).
    bias: optional (N,), added in float32 before the output rounding (cast to out_dtype first).
    out_dtype: bfloat16, float32, or float16 (the float32 kernel, then one rounding).
    config: force a kernel config (see ``KERNELS``).
    path: ``"kernel"``, ``"dequant"`` (exact bf16 operands + XLA's bf16 GEMM, see the module
      docstring) or None: automatic (Hopper: "dequant" from ``SM90_DEQUANT_MIN_M`` rows).

  Kernels: sm_100a (compute capability 10.0) and sm_120a (12.0), for the pairs in ``KERNELS``;
  elsewhere the pure-JAX reference (on a CUDA GPU only when allowed, see
  ``jax_gmma.allow_reference``). The Blackwell kernels have not been run on hardware; on Hopper
  (sm_90a) MXFP8 x MXFP8 with float8_e4m3fn elements runs jax-gmma's own kernel (see the module
  docstring for how the scales are applied).
  """
  return gemm(a_q, b_q, bias=bias, out_dtype=out_dtype, config=config, path=path,
              caller=("mx_gemm", "a_q", "b_q"))


def gemm(a_q, b_q, *, bias, out_dtype, config, path=None, caller):
  """:func:`mx_gemm` for the public function ``caller`` = (name, a argument, b argument): its
  errors (here and at lowering time) name that function and its arguments."""
  who = f"jax_gmma.{caller[0]}"
  if path is not None and path not in PATHS:
    raise ValueError(f"{who}: path must be one of {PATHS} or None (automatic), got {path!r}")
  if config is not None and (not isinstance(config, str) or
                             not any(config in names for arch in KERNELS.values()
                                     for names in arch.values())):
    known = sorted({c for arch in KERNELS.values() for names in arch.values() for c in names})
    raise ValueError(f"{who}: config must be None or an MX kernel config name ({', '.join(known)}), "
                     f"got {config!r}")
  bias_arr = None if bias is None else jnp.asarray(bias)
  problem = mx_problem(a_q, b_q, out_dtype=out_dtype,
                       bias_shape=None if bias_arr is None else bias_arr.shape,
                       bias_dtype=None if bias_arr is None else bias_arr.dtype, caller=caller)
  out_dtype = problem.out_dtype
  kernel_out = F32 if out_dtype == F16 else out_dtype
  a = pack_data(a_q, problem.m)
  b = pack_data(b_q, problem.n)
  if problem.has_global:
    ga = jnp.asarray(a_q.global_scale, jnp.float32).reshape(1)
    gb = jnp.asarray(b_q.global_scale, jnp.float32).reshape(1)
  else:
    ga = gb = jnp.ones((1,), jnp.float32)  # placeholders, ignored (has_global=False)
  if bias_arr is not None:
    bias_in = bias_arr.astype(out_dtype).astype(kernel_out)
  else:
    bias_in = jnp.zeros((1,), kernel_out)  # placeholder, ignored (has_bias=False)
  out = mx_gemm_p.bind(a, b, sf_bytes(a_q), sf_bytes(b_q), ga, gb, bias_in, m=problem.m, n=problem.n,
                       k=problem.k, a_dtype=problem.a_dtype, b_dtype=problem.b_dtype,
                       sf_vec=problem.sf_vec, out_dtype=kernel_out, has_bias=problem.has_bias,
                       has_global=problem.has_global, problem=problem, config=config,
                       path=path, **{primitive.CALLER: tuple(caller)})
  if kernel_out != out_dtype:
    out = out.astype(out_dtype)
  return out.reshape(*problem.batch_shape, -1, problem.n) if problem.batch_shape else out


def mxfp8_operand(data, scales) -> QuantizedArray:
  """A (rows, K) MXFP8 operand for :func:`mx_gemm` from ``jax.nn.scaled_matmul``'s form of one
  batch entry: float8_e4m3fn elements (rows, K) and float8_e8m0fnu scales (rows, K / 32),
  unchanged; the scales swizzled to the kernels' ``sm100_128x4`` layout (traceable)."""
  return QuantizedArray(data, _layouts.swizzle_scales(scales), format="mxfp8", shape=data.shape,
                        dtype=data.dtype, layout=SCALE_LAYOUT)


def reference_float64(a_q: QuantizedArray, b_q: QuantizedArray, bias=None) -> np.ndarray:
  """float64 NumPy product of the dequantized operands (for tests)."""
  a = np.asarray(dequantize(a_q), np.float64)
  b = np.asarray(dequantize(b_q), np.float64)
  a = a.reshape(-1, a.shape[-1])
  out = a @ b.T
  if bias is not None:
    out = out + np.asarray(bias, np.float64)
  return out


def paths_for_device(cc: Optional[str]) -> dict:
  """{(A format, B format): path description} on a device of compute capability ``cc``
  (None: no CUDA device), for `python -m jax_gmma info`."""
  out = {}
  pairs = sorted({p for arch in KERNELS.values() for p in arch})
  for fa, fb in pairs:
    dt = lambda f: np.dtype(_formats.get_format(f).dtype)  # noqa: E731
    prob = MxProblem(m=1, n=8, k=128, batch_shape=(), a_format=fa, b_format=fb, a_dtype=dt(fa),
                     b_dtype=dt(fb), out_dtype=BF16, has_bias=False)
    archs = [a for a in KERNELS if (fa, fb) in KERNELS[a]]
    built = _backend.built_archs()
    kinds = "kernels for " + ", ".join(f"{a} ({'built' if a in built else 'not built'})" for a in archs)
    if cc is None:
      out[(fa, fb)] = f"pure-JAX reference (no CUDA GPU); {kinds}"
      continue
    why = unavailable_reason(prob, cc)
    if why is None:
      checked = "tested on an H200" if arch_for_cc(cc) == "sm_90a" else "NOT validated on hardware"
      out[(fa, fb)] = f"CUDA kernel ({arch_for_cc(cc)}, {checked}); {kinds}"
    elif _backend.reference_allowed():
      out[(fa, fb)] = f"pure-JAX reference (opted in; {why[1]})"
    else:
      out[(fa, fb)] = f"ERROR at trace time unless the reference is allowed: {why[1]}"
  return out


# -- jax_gmma.dot on this family's weights ---------------------------------------------------

def serves(w) -> bool:
  """Whether :func:`dot` multiplies weight ``w`` (an MX / NVFP4 QuantizedArray)."""
  return isinstance(w, QuantizedArray) and w.format.name in WEIGHT_FORMATS


def dot(x, w: QuantizedArray, *, bias, out_dtype, x_format, config, splits=None,
        who: str = "jax_gmma.dot", **_):
  """``jax_gmma.dot`` for MX / NVFP4 weights: a float x (M, K) is quantized to w's format
  (``x_format="fp8_channel"``, the default, means "match w"; "mxfp8" gives MXFP8 activations
  for any MX weight) with scales in the swizzled layout, then :func:`mx_gemm`'s GEMM. A weight
  (or a QuantizedArray x) with row-major scales is converted to the kernels' layout here
  (``to_layout``: a small XLA op on the scales, 1/32 of the weight's bytes, in every call;
  ``quantize(w, fmt, layout="sm100_128x4")`` stores it once). ``jax_gmma.dot`` has checked w's
  fields, x's dtype and K, bias and out_dtype."""
  if splits is not None:
    raise ValueError(f"{who}: splits applies to FP8 / block-scaled FP8 weights; {w.format.name} "
                     f"weights run mx_gemm, which has no K split (pass splits=None), got {splits!r}")
  caller = (who[len("jax_gmma."):], "x", "w")
  w = to_layout(w, SCALE_LAYOUT)
  if isinstance(x, QuantizedArray):
    x = to_layout(x, SCALE_LAYOUT) if x.format.name in MX_FORMATS else x
    return gemm(x, w, bias=bias, out_dtype=BF16 if out_dtype is None else out_dtype, config=config,
                caller=caller)
  fmt = w.format.name if x_format == "fp8_channel" else x_format
  if fmt not in WEIGHT_FORMATS:
    raise ValueError(f"{who}: x_format must be one of {WEIGHT_FORMATS} for a {w.format.name} weight, "
                     f"got {x_format!r}")
  if x.ndim < 1 or x.shape[-1] != w.k:
    raise ValueError(f"{who}: contraction mismatch: x has shape {x.shape}, w has K={w.k}")
  default_out = np.dtype(x.dtype) if np.dtype(x.dtype) in OUT_DTYPES else BF16
  lead = x.shape[:-1]
  xq = quantize.quantize(x.reshape(-1, x.shape[-1]), fmt, layout=SCALE_LAYOUT)
  out = gemm(xq, w, bias=bias, out_dtype=default_out if out_dtype is None else out_dtype,
             config=config, caller=caller)
  return out.reshape(*lead, out.shape[-1])
