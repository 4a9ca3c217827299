"""FP4 / FP6 weight-only GEMMs on Hopper: NVFP4, MXFP4, MXFP6 (e2m3, e3m2) weights times bf16
(or FP8) activations.

Hopper has no FP4 / FP6 tensor-core instruction. The kernels (``cpp/sm90_fp4_gemm_weightonly.cu``,
``cpp/sm90_fp6_gemm_weightonly.cu``) widen the weights to bf16 in registers, apply each block
scale exactly, and run bf16 ``mma.sync`` or bf16 ``wgmma`` with the decoded weights as its
register operand (33 to 127 tokens where measured faster, :func:`pick_tc`;
``cpp/include/jax_gmma/weightonly_wgmma.cuh``;
the activations are written to shared memory in the prepared layout's K order), float32
accumulation. They are built for decode and batched decode, where the weight bytes are most of
the cost: FP4 moves half the bytes of FP8, FP6 three quarters.

Use::

    wp = jax_gmma.weightonly.prepare(w, "nvfp4")      # once: quantize + kernel layout
    y = jax.jit(jax_gmma.weightonly_gemm)(x, wp)       # x (..., K) bf16 -> y (..., N) bf16
    y = jax.jit(jax_gmma.dot)(x, wp)                   # the same through dot

**Prepared layout** (``PackedWeight``; written once, dequantizable on any backend with
:func:`dequantize_packed`). With ``S = N / 16`` row strips and ``KS = Kp / 64`` K steps
(``Kp`` = K rounded up to 64 with zero weights):

* ``packed`` uint8 ``(S, KS, 512)``: tile (s, j) covers rows ``16s .. 16s+15`` and K
  ``64j .. 64j+63``. Its 512 bytes are 32 lanes x 4 little-endian uint32 words, lane
  ``l = 4g + t`` (g in 0..7, t in 0..3), word q in 0..3. Word (g, t, q) holds the eight e2m1
  codes (sign s, magnitude bits c2 c1 c0) of rows ``r0 = 16s + g``, ``r1 = r0 + 8`` at
  ``k = 64j + 16t + 4q + kk`` (kk in 0..3) as four bf16x2 pairs ``i = h + 2 * (kk // 2)``
  (row ``r_h``), half ``kk % 2``, at these bit positions (s, c2, c1, c0)::

      pair 0: (15, 8, 7, 6)    | (31, 24, 23, 22)    extracted as w & 0x81C081C0
      pair 1: (11, 4, 3, 2)    | (27, 20, 19, 18)    (w << 4) & 0x81C081C0
      pair 2: ( 5, 30, 29, 28) | (21, 14, 13, 12)    rotl(w, 10) & 0x81C081C0
      pair 3: ( 9, 10, 1, 0)   | (25, 26, 17, 16)    ((w << 6) & 0x80C080C0) | ((w >> 2) & 0x01000100)

  (0x81C081C0 puts each code's sign at bf16 bit 15 and its magnitude at bits 8..6: the bf16
  number value * 2^-126.)
* ``scales`` uint8 ``(S, KS, 64)`` (NVFP4, a scale per 16 of K) or ``(S, KS, 32)`` (MXFP4, per
  32): byte ``2 * (8 * b + g) + h`` is the code of the scale of row ``r_h`` and K block ``b``
  of the tile (b < 4 for NVFP4, b < 2 for MXFP4). A code c is the kernel's bf16 multiplier
  ``F = scale * 2^116`` in compact form: NVFP4 ``bits(F) = 16 c + 0x7000`` (c = 255: NaN, a
  poisoned block), MXFP4 ``bits(F) = 128 (c + 116)`` i.e. c is the E8M0 byte (exact for
  scales 2^-115 .. 2^11; 139 = Inf marks a poisoned block).
  An all-zero MX block has code 0 whatever its E8M0 scale was (its row's largest code then
  comes from blocks that hold weights: :func:`row_exponents`).
* ``global_scale`` float32 ``(1,)``: NVFP4's per-tensor scale; for MX weights a power of two
  ``2^G`` (usually 1) that keeps every block scale code within the kernel's exact range (below).

Block scales are applied exactly: the e2m1 value times its scale has at most 6 significant
bits, so the bf16 product is exact; the dot product accumulates in float32 (mma.sync).

**MXFP6 layout** (``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``; E8M0 scale per 32 of K). Same tiles,
lanes and element order as FP4, but 768 bytes per 16 x 64 tile (0.75 byte per weight):

* ``packed`` uint8 ``(S, KS, 768)``: lane ``l = 4g + t`` owns six little-endian uint32 words,
  words 0..3 at bytes ``16 l .. 16 l + 15``, words 4, 5 at bytes ``512 + 8 l .. 512 + 8 l + 7``
  (one 16-byte and one 8-byte coalesced load). Words ``3G .. 3G + 2`` (G = 0, 1) form a 96-bit
  stream (bit ``32 w + b`` = bit b of word 3G + w) holding the 16 six-bit codes of MMAs
  ``q = 2G, 2G + 1``: bf16x2 pair ``v`` (0..7) is A register ``i = v % 4`` of MMA
  ``q = 2G + v // 4``, i.e. row ``r_h``, ``h = i % 2``, K ``64j + 16t + 4q + 2 (i // 2) + half``.
* The kernel builds pair v as ``OR over pieces of ((window << shl) & mask)`` with
  ``window = (word[hi]:word[lo]) >> r`` (a funnel shift; ``hi = -1``: ``word[lo] >> r``), the
  pieces listed in :data:`FP6_PIECES` (mirrored in ``cpp/sm90_fp6_gemm_weightonly.cu``; a test
  compares the two). The masks put each code at its exact bf16 position: e2m3 (s e1 e0 m2 m1 m0)
  at bits 15 | 8..4 (the bf16 number value * 2^-126), e3m2 (s e2 e1 e0 m1 m0) at 15 | 9..5
  (value * 2^-124); +16 for the second half. The pieces are chosen for the fewest logic
  instructions (e2m3: 16 LOP3 + 5 funnel shifts per 16 weights, stride-6 pieces; e3m2: 12 LOP3 +
  4 shifts; the other shifts are left shifts the compiler puts on the FMA pipe as IMAD.SHL);
  :func:`fp6_stream_bits` is the resulting bit map (code e = 2v + half, bit b (5 = sign) ->
  stream bit).
* ``scales`` uint8 ``(S, KS, 32)``, arranged as MXFP4's: code c is the E8M0 byte and the kernel's
  multiplier is ``bits(F) = 128 (c + 116)`` (e2m3, F = scale * 2^116, valid c <= 138, 139 = Inf
  marks a poisoned block) or ``128 (c + 114)`` (e3m2, F = scale * 2^114, valid c <= 140, 141 =
  Inf). Products value * scale * 2^-10 have at most 4 (3) significant bits: exact for scales
  2^-120 .. 2^11 (e2m3) and 2^-119 .. 2^13 (e3m2).
* ``global_scale`` float32 ``(1,)``: as for MXFP4.

**The exact range of MX block scales** (:data:`MX_CODE_RANGE`: E8M0 codes 12 .. 138 for MXFP4,
7 .. 138 for e2m3, 8 .. 140 for e3m2, the scales whose products are exact in the kernel). An MX
weight whose block scales (all-zero and poisoned blocks aside) fall outside it is stored with a
power-of-two ``global_scale = 2^G`` and codes ``E8M0 - G``, G chosen so that the codes fit; the
kernel multiplies its float32 sums by the global scale, so the products are unchanged. Only a
weight whose block scales span more binades than the range (126 for MXFP4, 131 / 132 for FP6)
cannot be stored: :func:`prepare` refuses it, and under ``jax.jit`` / ``jax.vmap`` (where the
scales are not known) the blocks that do not fit are poisoned (their rows compute NaN / Inf).
The same holds for elements that are not numbers of the format (a hand-built QuantizedArray):
refused eagerly, poisoned under a trace. A negative NVFP4 block scale is folded into the sign of
its block's codes (exact).

K is padded to a multiple of 64 (the tile) with zero weights, as for FP4: any K works.

**Prefill** (M >= :data:`PREFILL_MIN_M`, or :data:`PREFILL_FP8_MIN_M` for the "fp8" path;
:func:`weightonly_gemm`'s ``path``). One kernel,
:func:`unpack` (FFI target ``jax_gmma_weightonly_unpack``), turns the prepared bytes into a plain
(N, Kp) matrix in one memory-bound pass, then a tensor-core GEMM runs on it:

* ``"dequant"``: bf16 (code x block scale, exact) and XLA's bf16 GEMM, float32 accumulation;
* ``"fp8"`` (FP8 activations, MX weights): an MX weight is ``code x 2^(c - 127)`` per 32-block;
  with ``e`` its row's largest code (:func:`row_exponents`), ``code x 2^(c - e)`` is an e4m3
  number whenever ``e - c`` stays within :data:`FP8_SPREAD` (8 for e2m1, 6 for e2m3, 5 for
  e3m2), so the weight goes to e4m3 *exactly* with the power-of-two per-channel scale ``2^(e -
  127)``, and jax-gmma's FP8 GEMM (per-token x per-channel scales, float32 promotion every 128 of
  K) multiplies it at FP8 tensor-core speed. ``prepare`` checks the condition once
  (``PackedWeight.fp8_exact``); all-zero blocks do not count (their code is set to 0). NVFP4 has
  no such route: an e4m3 block scale times an e2m1 code needs up to 6 significant bits.
* ``"fp8_rounded"`` (FP8 activations, any format; asked for explicitly, never picked by
  ``"auto"``): the same unpack to e4m3 and FP8 GEMM, with each row scaled by a power of two so
  that its largest possible weight (the format's largest code times the row's largest block
  scale, :func:`rounded_row_exponents`) lands in e4m3's top binade (<= 448), and every weight
  rounded to nearest e4m3. Not exact: weights that need more than e4m3's 4 significant bits (NVFP4
  codes 1.5, 3, 6 times a block scale whose mantissa is not 1, or small blocks of a row whose
  block scales span more than e4m3's range) are rounded, at most 2^-4 relative for normal e4m3
  numbers -- the precision of the FP8 activations it multiplies. It runs at the speed of the
  ``"fp8"`` path. For MX weights with ``fp8_exact`` it gives the same products as ``"fp8"``.
"""
from __future__ import annotations

import functools
import json
from typing import Optional

import jax
import jax.export
import jax.numpy as jnp
import numpy as np

from .. import _backend, _vma, batching, primitive, sharding
from ..arrays import QuantizedArray
from ..numerics import shapes
from ..numerics.codec import decode, encode
from ..numerics.formats import E2M1, E2M3, E3M2, E4M3, E5M2, dtype_max
from .quantize import quantize
from .tensorwise import fp8_gemm

WEIGHTONLY_TARGET = _backend.WEIGHTONLY_GEMM_TARGET
TILE_X_TARGET = _backend.WEIGHTONLY_TILE_X_TARGET
#: Weight formats with a Hopper weight-only kernel.
WEIGHT_FORMATS = ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
FP6_FORMATS = ("mxfp6_e2m3", "mxfp6_e3m2")
#: Weight format codes (match jax_gmma::WoScale).
SCALE_KIND = {"nvfp4": 0, "mxfp4": 1, "mxfp6_e2m3": 2, "mxfp6_e3m2": 3}
_BLOCK_K = {"nvfp4": 16, "mxfp4": 32, "mxfp6_e2m3": 32, "mxfp6_e3m2": 32}
_SCALE_BYTES = {"nvfp4": 64, "mxfp4": 32, "mxfp6_e2m3": 32, "mxfp6_e3m2": 32}
#: Bytes of one prepared 16-row x 64-K tile.
_TILE_BYTES = {"nvfp4": 512, "mxfp4": 512, "mxfp6_e2m3": 768, "mxfp6_e3m2": 768}
#: E8M0 scale code -> bf16 exponent of the kernel multiplier F (bits(F) = 128 (c + bias)), and
#: the largest exact code (c = max + 1 is Inf: a poisoned block).
_MX_BIAS = {"mxfp4": 116, "mxfp6_e2m3": 116, "mxfp6_e3m2": 114}
_MX_MAX_CODE = {"mxfp4": 138, "mxfp6_e2m3": 138, "mxfp6_e3m2": 140}
_ELEM = {"nvfp4": (E2M1, 4), "mxfp4": (E2M1, 4), "mxfp6_e2m3": (E2M3, 6), "mxfp6_e3m2": (E3M2, 6)}
#: bf16 bit of code bit 0 (the magnitude's lowest bit) of an FP6 element; the sign goes to 15.
_FP6_BASE = {"mxfp6_e2m3": 4, "mxfp6_e3m2": 5}
#: Activation dtypes: bf16, or FP8 (converted to bf16 exactly, with an optional per-token scale).
X_DTYPES = (shapes.BF16, E4M3, E5M2)
OUT_DTYPES = (shapes.BF16, shapes.F32)
TILE_ROWS = 16
TILE_K = 64
#: CTA shapes the kernel is built for: (rows per CTA, tokens per CTA, warps splitting K), the
#: mirror of kWoCtaShapes (cpp/include/jax_gmma/weightonly_common.cuh).
CTA_SHAPES = (
    (16, 8, 8), (16, 16, 8), (32, 8, 8), (32, 16, 8), (64, 8, 8), (64, 16, 8),
    (16, 8, 16), (16, 8, 4), (16, 16, 4), (32, 16, 4), (32, 16, 2), (64, 16, 2), (16, 8, 2),
)
#: The tensor-core kernel's CTA shapes (tokens 32 / 64 / 128: wgmma's N; rows 64 per row warp
#: group; 4 warps per warp group along K), the mirror of kWoTcShapes
#: (cpp/include/jax_gmma/weightonly_wgmma.cuh).
TC_SHAPES = (
    (64, 32, 16), (128, 32, 8), (64, 64, 8), (128, 64, 4), (256, 64, 4), (64, 128, 4), (128, 128, 4),
    (64, 128, 8), (64, 64, 16),
)
#: the tensor-core shapes' tokens (their x arrives tiled: :func:`tiled_x`)
TC_TOKENS = (32, 64, 128)
ROWS_CHOICES = (16, 32, 64, 128, 256)
TOKENS_CHOICES = (8, 16, 32, 64, 128)
K_WARPS_CHOICES = (16, 8, 4, 2)


#: Bit positions (sign, c2, c1, c0) of value (h, kk) of a word, indexed [h * 4 + kk].
#: FP4_PAIR_BITS[pair][half]: the layout table above (mirrored by benchmarks/kernels/bench_weightonly_kernel.cu).
FP4_PAIR_BITS = (
    ((15, 8, 7, 6), (31, 24, 23, 22)),
    ((11, 4, 3, 2), (27, 20, 19, 18)),
    ((5, 30, 29, 28), (21, 14, 13, 12)),
    ((9, 10, 1, 0), (25, 26, 17, 16)),
)
_BITS = {}
for _h in range(2):
  for _kk in range(4):
    _BITS[_h * 4 + _kk] = FP4_PAIR_BITS[_h + 2 * (_kk // 2)][_kk % 2]
assert sorted(b for v in _BITS.values() for b in v) == list(range(32))

#: FP6 extraction pieces: FP6_PIECES[fmt][v] lists (lo, hi, r, shl, mask) for bf16x2 pair v of a
#: 3-word group: pair = OR of ((funnel(word[lo], word[hi]) >> r) << shl) & mask (hi = -1: plain
#: word[lo] >> r). Mirrored by kFp6Pieces in cpp/sm90_fp6_gemm_weightonly.cu.
FP6_PIECES = {
    "mxfp6_e2m3": (  # stride-6 pieces: a 5-bit run then the sign 11 bits up the stream
        ((0, -1, 0, 4, 0x000081F0), (0, -1, 0, 14, 0x81F00000)),
        ((0, 1, 8, 0, 0x000081F0), (0, -1, 0, 2, 0x81F00000)),
        ((0, 1, 20, 0, 0x000081F0), (0, 1, 20, 10, 0x81F00000)),
        ((1, -1, 0, 0, 0x000081F0), (1, -1, 0, 4, 0x81F00000)),
        ((1, 2, 6, 0, 0x000081F0), (2, -1, 0, 12, 0x81F00000)),
        ((1, 2, 18, 0, 0x000081F0), (1, 2, 18, 10, 0x81F00000)),
        ((2, -1, 0, 2, 0x000081F0), (2, -1, 0, 6, 0x81F00000)),
        ((2, 0, 22, 0, 0x000081F0), (2, -1, 0, 0, 0x81F00000)),
    ),
    "mxfp6_e3m2": (  # two whole pairs per word (in place and << 5), two pairs from the rest
        ((0, -1, 0, 0, 0x83E083E0),),
        ((0, -1, 0, 5, 0x83E083E0),),
        ((1, -1, 0, 0, 0x83E083E0),),
        ((1, -1, 0, 5, 0x83E083E0),),
        ((2, -1, 0, 0, 0x83E083E0),),
        ((2, -1, 0, 5, 0x83E083E0),),
        ((0, -1, 6, 0, 0x01E001E0), (2, -1, 2, 0, 0x02000200), (2, -1, 0, 2, 0x80008000)),
        ((1, -1, 6, 0, 0x01E001E0), (2, -1, 3, 0, 0x02000200), (2, -1, 0, 1, 0x80008000)),
    ),
}


def fp6_stream_bits(fmt: str) -> np.ndarray:
  """(16, 6) int: stream bit (0..95 of a 3-word group) of bit b of code e = 2 v + half
  (b = 5: sign, 4..0: magnitude), derived from FP6_PIECES (and checked to be a bijection)."""
  base = _FP6_BASE[fmt]
  out = np.full((16, 6), -1, np.int64)
  for v, pieces in enumerate(FP6_PIECES[fmt]):
    for half in range(2):
      for b in range(6):
        p = 16 * half + (15 if b == 5 else base + b)
        hits = [pc for pc in pieces if (pc[4] >> p) & 1]
        assert len(hits) == 1, (fmt, v, p)
        lo, hi, r, shl, _ = hits[0]
        j = p - shl + r
        assert p >= shl and (hi >= 0 or j < 32), (fmt, v, p)
        out[2 * v + half, b] = 32 * lo + j if j < 32 else 32 * hi + j - 32
  assert sorted(out.ravel().tolist()) == list(range(96)), fmt
  return out


_FP6_SRC = {f: fp6_stream_bits(f) for f in FP6_FORMATS}


#: Version of each format's prepared layout (PackedWeight.layout). FP4 2: the second bit
#: positions (FP4_PAIR_BITS); MXFP4 3 and MXFP6 2: the global scale may be a power of two other
#: than 1 (the exact range of MX block scales: :data:`MX_CODE_RANGE`), which a kernel that
#: ignores an MX weight's global scale would drop. A PackedWeight of a version this jax-gmma
#: does not read (pickled or rebuilt from an older jax-gmma's pytree) is refused by every
#: consumer instead of being decoded wrongly. Arrays saved without their PackedWeight carry no
#: version: re-run :func:`prepare` on the original weights.
LAYOUT_VERSION = {"nvfp4": 2, "mxfp4": 3, "mxfp6_e2m3": 2, "mxfp6_e3m2": 2}
#: The versions this jax-gmma reads: the current one and, for MX formats, the one before (its
#: global scale is always 1, which the current kernels apply the same way).
READABLE_LAYOUTS = {"nvfp4": (2,), "mxfp4": (2, 3), "mxfp6_e2m3": (1, 2), "mxfp6_e3m2": (1, 2)}
#: E8M0 codes (lo, hi) of the MX block scales the kernel applies exactly (products code x scale
#: x 2^-10 exact in bf16): 2^-115 .. 2^11 (MXFP4), 2^-120 .. 2^11 (e2m3), 2^-119 .. 2^13 (e3m2).
MX_CODE_RANGE = {"mxfp4": (12, 138), "mxfp6_e2m3": (7, 138), "mxfp6_e3m2": (8, 140)}
#: Largest N, K and token count M the weight-only ops take (every dimension below 2^31).
MAX_DIM = 2 ** 31 - 1
#: The decode kernel's grid has at most this many token tiles (CUDA's grid y limit).
MAX_TOKEN_TILES = 65535
#: The tensor-core kernel's grid holds at most this many row blocks (N / rows per CTA).
MAX_ROW_BLOCKS = 65535
#: Float weights prepare() quantizes.
W_DTYPES = (shapes.BF16, shapes.F16, shapes.F32, np.dtype(np.float64))


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_concrete(v) -> bool:
  """An array with values (not a tracer, not a jax.ShapeDtypeStruct)."""
  return isinstance(v, (np.ndarray, jax.Array)) and not isinstance(v, jax.core.Tracer)


def leaf_specs(fmt: str, n: int, k: int) -> dict:
  """The (shape, dtype) of each array field of a PackedWeight of format ``fmt`` and (N, K)."""
  s_, ks = n // TILE_ROWS, -(-k // TILE_K)
  return {"packed": ((s_, ks, _TILE_BYTES[fmt]), np.dtype(np.uint8)),
          "scales": ((s_, ks, _SCALE_BYTES[fmt]), np.dtype(np.uint8)),
          "global_scale": ((1,), shapes.F32)}


def _field_error(obj, who: str):
  """The first inconsistency of a PackedWeight's array fields with its static fields (an
  exception to raise), or None. Abstract values (tracers, jax.ShapeDtypeStruct) are checked by
  shape and dtype."""
  for name, (shape, dt) in leaf_specs(obj.format, obj.n, obj.k).items():
    v = getattr(obj, name)
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
      return TypeError(f"{who}: {name} must be a {dt.name} array of shape {shape} for a {obj.format} "
                       f"(N, K) = ({obj.n}, {obj.k}) weight, got {type(v).__name__}")
    if np.dtype(v.dtype) != dt:
      return TypeError(f"{who}: {name} must be {dt.name} for a {obj.format} weight, got "
                       f"{np.dtype(v.dtype).name}")
    if tuple(v.shape) != shape:
      return ValueError(f"{who}: {name} must have shape {shape} for a {obj.format} (N, K) = "
                        f"({obj.n}, {obj.k}) weight (exactly; nothing is broadcast), got "
                        f"{tuple(v.shape)}")
  return None


_LEAF_KEYS = tuple(jax.tree_util.GetAttrKey(n) for n in ("packed", "scales", "global_scale"))


@jax.tree_util.register_pytree_with_keys_class
class PackedWeight:
  """An (N, K) weight in the Hopper weight-only kernel layout (see the module docstring).

  Pytree children: (packed, scales, global_scale); static: (format name, n, k, fp8_exact,
  layout). ``layout`` is the :data:`LAYOUT_VERSION` the bytes were written in (objects from
  before versions existed count as 1).

  The constructor checks every field against the others (abstract values included: shapes and
  dtypes of tracers and ``jax.ShapeDtypeStruct``): ``format`` one of :data:`WEIGHT_FORMATS`,
  ``n`` a positive multiple of 16 and ``k`` >= 1 (both below 2^31), ``packed`` / ``scales``
  uint8 of exactly the shapes :func:`leaf_specs` gives, ``global_scale`` float32 ``(1,)``,
  ``layout`` one of :data:`READABLE_LAYOUTS`. Pytree rebuilding (``tree_unflatten``, which JAX
  also calls with placeholder leaves) checks nothing; every consumer checks again.

  ``fp8_exact`` (MX formats): True when every weight is exactly an FP8 e4m3 number times a
  power-of-two scale per row (:data:`FP8_SPREAD`), so the prefill path may multiply it on FP8
  tensor cores without rounding anything (``path="fp8"``); False when not (and for NVFP4, whose
  e4m3 block scales times e2m1 codes need up to 5 significant bits); None when unknown (the
  weight was prepared under a trace). It is static (it picks the path at trace time), so weights
  stacked for ``lax.scan`` need equal flags: :meth:`with_fp8_exact` lowers one to False or None.
  Given as True to the constructor with concrete scales, it is verified."""

  __slots__ = ("packed", "scales", "global_scale", "format", "n", "k", "fp8_exact", "layout")

  def __init__(self, packed, scales, global_scale, *, format: str, n: int, k: int,
               fp8_exact: Optional[bool] = None, layout: Optional[int] = None):
    who = "jax_gmma.PackedWeight"
    if not isinstance(format, str) or format not in WEIGHT_FORMATS:
      raise ValueError(f"{who}: format must be one of {WEIGHT_FORMATS}, got {format!r}")
    for name, v in (("n", n), ("k", k)):
      if not _is_int(v):
        raise TypeError(f"{who}: {name} must be an int ({format}), got {v!r}")
    if not TILE_ROWS <= n <= MAX_DIM or n % TILE_ROWS:
      raise ValueError(f"{who}: n must be a positive multiple of {TILE_ROWS} below 2^31 ({format}), "
                       f"got {n}")
    if not 1 <= k <= MAX_DIM:
      raise ValueError(f"{who}: k must be >= 1 and below 2^31 ({format}), got {k}")
    if fp8_exact is not None and not isinstance(fp8_exact, (bool, np.bool_)):
      raise TypeError(f"{who}: fp8_exact must be None, True or False ({format}), got {fp8_exact!r}")
    if fp8_exact and format not in FP8_SPREAD:
      raise ValueError(f"{who}: fp8_exact must be False or None for {format} (no exact FP8 view; "
                       "MX formats only), got True")
    if layout is None:
      layout = LAYOUT_VERSION[format]
    if not _is_int(layout) or int(layout) not in READABLE_LAYOUTS[format]:
      raise ValueError(f"{who}: layout must be one of {READABLE_LAYOUTS[format]} for {format} (the "
                       f"versions this jax-gmma reads; {LAYOUT_VERSION[format]} is current), got "
                       f"{layout!r}")
    self.packed, self.scales, self.global_scale = packed, scales, global_scale
    self.format, self.n, self.k = format, int(n), int(k)
    self.fp8_exact = None if fp8_exact is None else bool(fp8_exact)
    self.layout = int(layout)
    err = _field_error(self, who)
    if err is not None:
      raise err
    if self.fp8_exact and _is_concrete(scales) and not bool(
        _codes_fp8_exact(scales, format, self.n, self.k)):
      raise ValueError(f"{who}: fp8_exact is True but some row's {format} block scale codes span "
                       f"more than 2^{FP8_SPREAD[format]} (FP8_SPREAD); only prepare() sets it")

  def tree_flatten(self):
    return ((self.packed, self.scales, self.global_scale),
            (self.format, self.n, self.k, self.fp8_exact, self.layout))

  def tree_flatten_with_keys(self):
    """Named leaves (``.packed``, ``.scales``, ``.global_scale``) for tree paths."""
    children, aux = self.tree_flatten()
    return tuple(zip(_LEAF_KEYS, children)), aux

  @classmethod
  def tree_unflatten(cls, aux, children):
    obj = object.__new__(cls)
    obj.packed, obj.scales, obj.global_scale = children
    obj.format, obj.n, obj.k, obj.fp8_exact = aux[:4]
    obj.layout = aux[4] if len(aux) > 4 else 1
    return obj

  def __setstate__(self, state):  # pickles of objects from before `layout` existed
    slots = state[1] if isinstance(state, tuple) else state
    for name in self.__slots__:
      object.__setattr__(self, name, slots.get(name, 1 if name == "layout" else None))

  def check_layout(self, who: str) -> None:
    """Raise unless the bytes are in a layout this jax-gmma reads for the format and the array
    fields agree with the static ones (``who``: the function the user called)."""
    if self.format not in WEIGHT_FORMATS:
      raise ValueError(f"{who}: w.format must be one of {WEIGHT_FORMATS}, got {self.format!r}")
    if self.layout not in READABLE_LAYOUTS[self.format]:
      raise ValueError(f"{who}: this {self.format} PackedWeight was prepared in layout version "
                       f"{self.layout}, this jax-gmma reads version(s) {READABLE_LAYOUTS[self.format]} "
                       "(the FP4 bit positions changed); run jax_gmma.weightonly.prepare on the "
                       "original weight again")
    err = _field_error(self, who)
    if err is not None:
      raise type(err)(str(err).replace(f"{who}: ", f"{who}: w.", 1))

  def with_fp8_exact(self, flag: Optional[bool]) -> "PackedWeight":
    """A copy with ``fp8_exact`` lowered to False or None (e.g. to stack weights whose flags
    differ); raising it is refused: only :func:`prepare` can establish exactness."""
    if flag is True and self.fp8_exact is not True:
      raise ValueError("PackedWeight.with_fp8_exact: only prepare() can set fp8_exact=True")
    obj = PackedWeight.tree_unflatten(self.tree_flatten()[1], self.tree_flatten()[0])
    obj.fp8_exact = None if flag is None else bool(flag)
    return obj

  @property
  def padded_k(self) -> int:
    return -(-self.k // TILE_K) * TILE_K

  @property
  def nbytes(self) -> int:
    """Bytes the kernel streams per GEMM (packed codes + scale codes)."""
    elts = self.n * self.padded_k
    return elts * _TILE_BYTES[self.format] // 1024 + elts // _BLOCK_K[self.format]

  def dequantize(self, dtype=jnp.float32) -> jax.Array:
    return dequantize_packed(self, dtype)

  def __repr__(self) -> str:
    return (f"PackedWeight(format={self.format!r}, n={self.n}, k={self.k}, "
            f"fp8_exact={self.fp8_exact}, layout={self.layout})")


def _aux_to_bytes(aux) -> bytes:
  fmt, n, k, fp8_exact = aux[:4]
  layout = aux[4] if len(aux) > 4 else 1
  return json.dumps([fmt, int(n), int(k), fp8_exact, int(layout)]).encode("utf-8")


def _aux_from_bytes(data: bytes):
  fmt, n, k, fp8_exact, layout = json.loads(bytes(data).decode("utf-8"))
  return (str(fmt), int(n), int(k), None if fp8_exact is None else bool(fp8_exact), int(layout))


# jax.export: a PackedWeight argument (or result) of an exported function; the serialized
# calling convention holds the static fields only (the arrays are the function's arguments).
jax.export.register_pytree_node_serialization(
    PackedWeight, serialized_name="jax_gmma.PackedWeight", serialize_auxdata=_aux_to_bytes,
    deserialize_auxdata=_aux_from_bytes)


def _packed_weight(packed, scales, global_scale, fmt, n, k, fp8_exact) -> PackedWeight:
  """A PackedWeight from prepare()'s own computation (its fp8_exact needs no second check)."""
  wp = PackedWeight(packed, scales, global_scale, format=fmt, n=n, k=k)
  wp.fp8_exact = fp8_exact
  return wp


# -- preparation ------------------------------------------------------------------------------

def _check_nk(who: str, n, k) -> None:
  if not TILE_ROWS <= n <= MAX_DIM or n % TILE_ROWS:
    raise ValueError(f"{who}: w must have N (rows) a positive multiple of {TILE_ROWS} (rows of the "
                     f"kernel's tile) below 2^31, got N = {n}")
  if not 1 <= k <= MAX_DIM:
    raise ValueError(f"{who}: w must have K (columns) >= 1 and below 2^31, got K = {k}")


def prepare(w, format: Optional[str] = None) -> PackedWeight:
  """Quantize (if needed) and lay out an (N, K) weight for the Hopper weight-only kernel.

  ``w``: a float (N, K) array (bfloat16, float16, float32; quantized here with ``format``) or a
  QuantizedArray of format "nvfp4" / "mxfp4" / "mxfp6_e2m3" / "mxfp6_e3m2" with axis -1 and
  row-major scales. N must be a multiple of 16; K is padded to a multiple of 64 with zero
  weights (any K >= 1). Runs in JAX (jit-able, vmap-able, any backend).

  Stacked experts: a float (G, N, K) array (each expert quantized on its own) or a (G, N, K)
  QuantizedArray quantized along K (for example an imported gpt-oss MXFP4 expert tensor) give
  one PackedWeight whose arrays carry a leading expert axis, each expert laid out as an (N, K)
  weight: the expert weights ``jax_gmma.ragged_dot`` takes.

  Value rules (see the module docstring, "The exact range of MX block scales"): an MX weight
  whose block scales span more binades than the kernel applies exactly, or a QuantizedArray
  whose elements are not numbers of its format, is refused here; under ``jax.jit`` /
  ``jax.vmap`` the blocks concerned are poisoned instead (the rows they belong to compute NaN /
  Inf), never rounded or clamped."""
  who = "jax_gmma.weightonly.prepare"
  if format is not None and (not isinstance(format, str) or format not in WEIGHT_FORMATS):
    raise ValueError(f"{who}: format must be one of {WEIGHT_FORMATS}, got {format!r}")
  if isinstance(w, PackedWeight):
    raise TypeError(f"{who}: w is already a PackedWeight; pass the float (N, K) weight or its "
                    "QuantizedArray")
  if not isinstance(w, QuantizedArray):
    if format is None:
      raise ValueError(f"{who}: format must be one of {WEIGHT_FORMATS} for a float weight, got None")
    w = _array_of(w, "w", who, W_DTYPES,
                  f"a float (N, K) array or a QuantizedArray of a weight-only format {WEIGHT_FORMATS}",
                  "a float (bfloat16, float16, float32) (N, K) array or a QuantizedArray of a "
                  "weight-only format")
    if w.ndim == 3:  # G experts, each quantized on its own (its own NVFP4 global scale)
      _check_nk(who, *w.shape[1:])
      return _prepare_stacked(jax.vmap(lambda e: quantize(e, format))(w), who)
    if w.ndim != 2:
      raise ValueError(f"{who}: w must be a 2-D (N, K) weight or (G, N, K) stacked experts, got "
                       f"shape {w.shape}")
    _check_nk(who, *w.shape)
    w = quantize(w, format)
  fmt = w.format.name
  if format is not None and format != fmt:
    raise ValueError(f"{who}: w is {fmt}, not {format}")
  if fmt not in WEIGHT_FORMATS:
    raise ValueError(f"{who}: w has format {fmt!r}; the Hopper weight-only kernel takes {WEIGHT_FORMATS}")
  if w.ndim == 3 and w.axis == 2:
    return _prepare_stacked(w, who)
  if w.ndim != 2 or w.axis != 1:
    raise ValueError(f"{who}: w must be an (N, K) weight quantized along its last axis, got shape "
                     f"{w.shape}, axis {w.axis}")
  if w.layout != "rowmajor":
    raise ValueError(f"{who}: w's scales must be row-major (quantize without layout=), got {w.layout!r}")
  n, k = w.shape
  _check_nk(who, n, k)
  bk = _BLOCK_K[fmt]
  data, scales = w.data, w.scales
  for name, v in (("w.data", data), ("w.scales", scales)):
    if not hasattr(v, "shape") or not hasattr(v, "dtype") or len(v.shape) != 2:
      raise ValueError(f"{who}: {name} must be a 2-D array ({fmt}), got "
                       f"{getattr(v, 'shape', type(v).__name__)}")
  if data.shape[0] != n or data.shape[1] < k or not jnp.issubdtype(data.dtype, jnp.floating):
    raise ValueError(f"{who}: w.data must be a float ({n}, >= {k}) array ({fmt}), got "
                     f"{np.dtype(data.dtype).name}{tuple(data.shape)}")
  sdt = np.dtype(w.format.scale_dtype)
  if np.dtype(scales.dtype) != sdt:
    raise TypeError(f"{who}: w.scales must be {sdt.name} for {fmt}, got {np.dtype(scales.dtype).name}")
  if scales.shape[0] != n or scales.shape[1] < -(-k // bk):
    raise ValueError(f"{who}: w.scales must have shape ({n}, >= {-(-k // bk)}) for {fmt} (one scale "
                     f"per {bk} of K), got {tuple(scales.shape)}")
  g = w.global_scale
  if g is None:
    g = jnp.ones((1,), jnp.float32)
  elif (not hasattr(g, "dtype") or int(np.prod(np.shape(g))) != 1
        or not jnp.issubdtype(g.dtype, jnp.floating)):
    raise ValueError(f"{who}: w.global_scale must be a float scalar ({fmt}), got "
                     f"{getattr(g, 'dtype', type(g).__name__)}{np.shape(g)}")
  packed, codes, gs, exact, stats = _prepare_impl(data, scales, jnp.reshape(g, (1,)).astype(jnp.float32),
                                                  fmt, n, k)
  if isinstance(stats, jax.core.Tracer):
    exact = None
  else:
    nout, noff, cmin, cmax = (int(v) for v in np.asarray(jax.device_get(stats)))
    if noff:
      raise ValueError(f"{who}: {noff} elements of w.data are not {np.dtype(_ELEM[fmt][0]).name} numbers "
                       f"(NaN, or off the {fmt} grid); they cannot be stored")
    if nout:
      lo, hi = MX_CODE_RANGE[fmt]
      raise ValueError(
          f"{who}: w's {fmt} block scales span 2^{cmin - 127} .. 2^{cmax - 127} ({cmax - cmin} "
          f"binades, all-zero and NaN blocks aside): more than the {hi - lo} binades the kernel "
          f"applies exactly (one power-of-two global scale times E8M0 codes {lo} .. {hi}); "
          f"{nout} blocks would not fit (under jax.jit they are poisoned: NaN)")
    exact = fmt in FP8_SPREAD and bool(jax.device_get(exact))
  return _packed_weight(packed, codes, gs, fmt, n, k, exact)


def _prepare_stacked(w: QuantizedArray, who: str) -> PackedWeight:
  """G experts (a QuantizedArray of shape (G, N, K), quantized along K, row-major scales) as one
  PackedWeight whose arrays carry a leading expert axis: each expert laid out as
  :func:`prepare` lays out one (N, K) weight (what ``jax_gmma.ragged_dot`` takes). The global
  scale: one per expert ((G,) or (G, 1), as ``jax.vmap`` of ``quantize`` gives), or one shared
  by all (a scalar). The value rules are prepare's, over every expert."""
  fmt = w.format.name
  if w.layout != "rowmajor":
    raise ValueError(f"{who}: w's scales must be row-major (quantize without layout=), got {w.layout!r}")
  data, scales = w.data, w.scales
  # (G, N, K), or one (N, K) expert whose arrays carry the leading expert axis (jax.vmap of quantize)
  g, n, k = w.shape if len(w.shape) == 3 else (data.shape[0], *w.shape)
  _check_nk(who, n, k)
  bk = _BLOCK_K[fmt]
  if (len(data.shape) != 3 or data.shape[:2] != (g, n) or data.shape[2] < k
      or not jnp.issubdtype(data.dtype, jnp.floating)):
    raise ValueError(f"{who}: w.data must be a float ({g}, {n}, >= {k}) array ({fmt}), got "
                     f"{np.dtype(data.dtype).name}{tuple(data.shape)}")
  sdt = np.dtype(w.format.scale_dtype)
  if np.dtype(scales.dtype) != sdt:
    raise TypeError(f"{who}: w.scales must be {sdt.name} for {fmt}, got {np.dtype(scales.dtype).name}")
  if len(scales.shape) != 3 or scales.shape[:2] != (g, n) or scales.shape[2] < -(-k // bk):
    raise ValueError(f"{who}: w.scales must have shape ({g}, {n}, >= {-(-k // bk)}) for {fmt} (one "
                     f"scale per {bk} of K), got {tuple(scales.shape)}")
  gs = w.global_scale
  if gs is None:
    gs = jnp.ones((g, 1), jnp.float32)
  elif (hasattr(gs, "dtype") and jnp.issubdtype(gs.dtype, jnp.floating)
        and int(np.prod(np.shape(gs))) in (1, g)):
    gs = jnp.broadcast_to(jnp.reshape(gs, (-1, 1)), (g, 1)).astype(jnp.float32)
  else:
    raise ValueError(f"{who}: w.global_scale must be a float scalar or one per expert ({g},) "
                     f"({fmt}), got {getattr(gs, 'dtype', type(gs).__name__)}{np.shape(gs)}")
  packed, codes, gsc, exact, stats = jax.vmap(
      lambda d, s_, g_: _prepare_impl(d, s_, g_, fmt, n, k))(data, scales, gs)
  if isinstance(stats, jax.core.Tracer):
    flag = None
  else:
    st = np.asarray(jax.device_get(stats))
    nout, noff = int(st[:, 0].sum()), int(st[:, 1].sum())
    if noff:
      e = int(np.flatnonzero(st[:, 1])[0])
      raise ValueError(f"{who}: {noff} elements of w.data are not {np.dtype(_ELEM[fmt][0]).name} "
                       f"numbers (NaN, or off the {fmt} grid; the first in expert {e}); they "
                       "cannot be stored")
    if nout:
      e = int(np.flatnonzero(st[:, 0])[0])
      lo, hi = MX_CODE_RANGE[fmt]
      cmin, cmax = int(st[e, 2]), int(st[e, 3])
      raise ValueError(
          f"{who}: expert {e}'s {fmt} block scales span 2^{cmin - 127} .. 2^{cmax - 127} "
          f"({cmax - cmin} binades, all-zero and NaN blocks aside): more than the {hi - lo} "
          f"binades the kernel applies exactly (one power-of-two global scale times E8M0 codes "
          f"{lo} .. {hi}); {nout} blocks of the experts would not fit (under jax.jit they are "
          "poisoned: NaN)")
    flag = fmt in FP8_SPREAD and bool(np.all(jax.device_get(exact)))
  wp = jax.vmap(lambda p_, c_, g_: _packed_weight(p_, c_, g_, fmt, n, k, None))(packed, codes, gsc)
  wp.fp8_exact = flag
  return wp


# -- the FP8 view of an MX weight (the prefill path's FP8 route) -------------------------------

#: Largest exponent gap (row maximum minus block scale exponent) at which every code of an MX
#: block, times 2^-gap, is still an FP8 e4m3 number: e2m1 codes (0.5 .. 6, 2 significant bits)
#: reach e4m3's smallest subnormal 2^-9 at 0.5 * 2^-8; e2m3 (0.125 .. 7.5, 4 bits: normal e4m3
#: from 2^-6) at 2^-6; e3m2 (0.0625 .. 28, 3 bits) at 2^-5.
FP8_SPREAD = {"mxfp4": 8, "mxfp6_e2m3": 6, "mxfp6_e3m2": 5}


def _block_codes(codes, fmt: str, n: int, k: int):
  """Kernel scale codes (S, KS, nb * 16) -> (N, ceil(K / block)) (padding blocks dropped)."""
  s_, ks = codes.shape[:2]
  bk = _BLOCK_K[fmt]
  nb = TILE_K // bk
  c = codes.reshape(s_, ks, nb, 8, 2).transpose(0, 4, 3, 1, 2).reshape(n, ks * nb)
  return c[:, :-(-k // bk)].astype(jnp.int32)


def row_exponents(w: PackedWeight):
  """(N,) int32: per row, the largest E8M0 block-scale code of an MX weight (poisoned blocks
  ignored). The FP8 route stores ``w * 2^(127 - e)`` in e4m3 and scales the GEMM's output
  channel by ``2^(e - 127)``."""
  if w.format not in FP8_SPREAD:
    raise ValueError(f"row_exponents: {w.format} has no FP8 view (MX formats only: {tuple(FP8_SPREAD)})")
  w.check_layout("jax_gmma.weightonly.row_exponents")
  return _row_exp_impl(w.scales, w.format, w.n, w.k)


def _row_max(c, fmt: str, keepdims: bool = False):
  """Per row, the largest of (N, blocks) MX scale codes, poisoned blocks (code > max) ignored."""
  return jnp.max(jnp.where(c > _MX_MAX_CODE[fmt], 0, c), axis=1, keepdims=keepdims)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _row_exp_impl(codes, fmt: str, n: int, k: int):
  return _row_max(_block_codes(codes, fmt, n, k), fmt)


#: e4m3's largest finite number (448): path="fp8_rounded" scales each row's largest possible
#: weight to at most this.
E4M3_MAX = dtype_max(E4M3)


def _rounded_headroom(fmt: str) -> int:
  """log2 of the power of two that takes an MX block of scale 1 to e4m3's top binade:
  the largest d with (the format's largest code) * 2^d <= 448 (e2m1 6 -> 6, e2m3 7.5 -> 5,
  e3m2 28 -> 4)."""
  return int(np.floor(np.log2(E4M3_MAX / dtype_max(_ELEM[fmt][0]))))


def rounded_row_exponents(w: PackedWeight):
  """(N,) int32 row exponents ``e`` for ``path="fp8_rounded"``: the FP8 copy of row r is
  ``rn_e4m3(w[r] * 2^(127 - e[r]))``, its GEMM scale ``2^(e[r] - 127)`` (times NVFP4's global
  scale). ``e`` is the smallest with (the format's largest code) * (the row's largest finite
  block scale) * 2^(127 - e) <= 448: nothing saturates, and the row's largest weights keep
  e4m3's full precision. MX formats: :func:`row_exponents` minus the format's headroom
  (6 / 5 / 4 for e2m1 / e2m3 / e3m2); rows without a nonzero block scale get 127 (NVFP4).
  Poisoned blocks are ignored (they unpack to NaN)."""
  w.check_layout("jax_gmma.weightonly.rounded_row_exponents")
  if w.format in FP8_SPREAD:
    return row_exponents(w) - _rounded_headroom(w.format)
  return _rounded_row_exp_impl(w.scales, w.format, w.n, w.k)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _rounded_row_exp_impl(codes, fmt: str, n: int, k: int):
  sv = _scale_values(_block_codes(codes, fmt, n, k), fmt)  # (N, blocks) float32, NaN if poisoned
  sv = jnp.where(jnp.isfinite(sv), jnp.abs(sv), 0.0)
  v = jnp.max(sv, axis=1) * np.float32(dtype_max(_ELEM[fmt][0]))  # exact (e4m3 x 6)
  safe = jnp.where(v > 0, v, 1.0)
  d = jnp.floor(jnp.log2(np.float32(E4M3_MAX) / safe)).astype(jnp.int32)
  # log2 may land one off at a power of two: settle d exactly (ldexp is exact here)
  d = jnp.where(jnp.ldexp(safe, d) > E4M3_MAX, d - 1, d)
  d = jnp.where(jnp.ldexp(safe, d + 1) <= E4M3_MAX, d + 1, d)
  return jnp.where(v > 0, 127 - d, 127).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _codes_fp8_exact(codes, fmt: str, n: int, k: int):
  """Whether prepared MX scale codes satisfy :data:`FP8_SPREAD` (code 0: an all-zero block, and
  poisoned blocks do not count) -- the rule prepare() applies to set ``fp8_exact``."""
  c = _block_codes(codes, fmt, n, k)
  return jnp.all((c >= _row_max(c, fmt, keepdims=True) - FP8_SPREAD[fmt]) | (c == 0)
                 | (c > _MX_MAX_CODE[fmt]))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _prepare_impl(data, scales, gscale, fmt: str, n: int, k: int):
  """(packed, scale codes, global scale (1,), fp8_exact, stats): stats int32 (4,) = (MX blocks
  outside the exact range (poisoned), elements off the format's grid (their blocks poisoned),
  smallest and largest E8M0 code of the blocks that hold weights)."""
  kp = -(-k // TILE_K) * TILE_K
  bk = _BLOCK_K[fmt]
  s_, ks = n // TILE_ROWS, kp // TILE_K
  edt, ebits = _ELEM[fmt]
  d32 = data.astype(jnp.float32)[:, :k]
  codes = encode(d32, edt, ebits)  # (N, K) uint32
  # Elements that are not numbers of the format (NaN, off the grid: a hand-built QuantizedArray)
  # poison their block: encode() would round or clamp them.
  off = decode(codes, edt, ebits) != d32
  dpad = jnp.pad(d32, ((0, 0), (0, kp - k)))
  off_blk = jnp.any(jnp.pad(off, ((0, 0), (0, kp - k))).reshape(n, kp // bk, bk), axis=-1)
  zero = ~jnp.any(dpad.reshape(n, kp // bk, bk) != 0, axis=-1)
  sc = scales
  if sc.shape[1] * bk < kp:  # pad the scale blocks to Kp (zero weights there)
    pad_val = jnp.asarray(1.0, jnp.float32).astype(sc.dtype)
    sc = jnp.concatenate([sc, jnp.full((n, kp // bk - sc.shape[1]), pad_val, sc.dtype)], axis=1)
  sc = sc[:, :kp // bk]
  exact = jnp.asarray(False)  # NVFP4: no FP8 view
  nout = jnp.zeros((), jnp.int32)
  cmin = cmax = jnp.zeros((), jnp.int32)
  gs = gscale
  if fmt == "nvfp4":
    s32 = sc.astype(jnp.float32)
    # A negative block scale goes into the sign of its block's codes (exact).
    neg = s32 < 0
    f = (jnp.abs(s32) * np.float32(2.0 ** 116)).astype(jnp.bfloat16)
    bits = jax.lax.bitcast_convert_type(f, jnp.uint16).astype(jnp.int32)
    c = (bits >> 4) - 0x700
    zero = s32 == 0
    c = jnp.where(zero, 0, jnp.where(jnp.isnan(s32) | off_blk, 255, c))
    # A zero scale means a zero block: zero its codes so the (nonzero) multiplier is harmless.
    codes = jnp.where(jnp.repeat(zero, bk, axis=1)[:, :k], 0, codes)
    codes = jnp.where(jnp.repeat(neg, bk, axis=1)[:, :k], codes ^ np.uint32(8), codes)
  else:
    u = jax.lax.bitcast_convert_type(sc, jnp.uint8).astype(jnp.int32)
    lo, lim = MX_CODE_RANGE[fmt]
    poison = (u == 255) | off_blk
    live = ~poison & ~zero
    cmax = jnp.max(jnp.where(live, u, -1))
    cmin = jnp.min(jnp.where(live, u, 256))
    # The global power of two 2^G: the codes u - G of the blocks that hold weights fit in
    # [lo, lim] whenever their span allows (G = 0 when they already do); else the largest fit
    # and the blocks below the range are poisoned.
    g = jnp.maximum(cmax - lim, jnp.minimum(0, cmin - lo))
    c = u - g
    out = live & (c < lo)
    nout = jnp.sum(out).astype(jnp.int32)
    # An all-zero block takes the smallest code (any scale multiplies zeros), so that it never
    # sets its row's largest exponent (row_exponents, the FP8 route).
    c = jnp.where(poison | out, lim + 1, jnp.where(live, c, 0))
    gs = jnp.ldexp(jnp.ones((1,), jnp.float32), g)
    cmin, cmax = jnp.where(cmax < 0, 0, cmin), jnp.maximum(cmax, 0)
    # fp8_exact: every block that holds weights (not all zero, not poisoned) within FP8_SPREAD
    # of its row's largest code -- the row_exponents the FP8 route will read from these codes.
    nblk = -(-k // bk)
    cv = c[:, :nblk]
    exact = jnp.all((cv >= _row_max(cv, fmt, keepdims=True) - FP8_SPREAD[fmt]) | ~live[:, :nblk]
                    | (cv > lim))
  stats = jnp.stack([nout, jnp.sum(off).astype(jnp.int32), cmin.astype(jnp.int32),
                     cmax.astype(jnp.int32)])
  codes = jnp.pad(codes, ((0, 0), (0, kp - k)))
  nb = TILE_K // bk  # scale blocks per tile
  cc = c.astype(jnp.uint8).reshape(s_, 2, 8, ks, nb).transpose(0, 3, 4, 2, 1).reshape(s_, ks, nb * 16)
  if fmt in FP6_FORMATS:
    return _pack_fp6(codes, fmt, s_, ks), cc, gs, exact, stats
  # (s, h, g, j, t, q, kk) -> (s, j, g, t, q, h*4+kk), then each code's 4 bits to _BITS.
  c7 = codes.reshape(s_, 2, 8, ks, 4, 4, 4).transpose(0, 3, 2, 4, 5, 1, 6).reshape(s_, ks, 8, 4, 4, 8)
  words = jnp.zeros(c7.shape[:-1], jnp.uint32)
  for v, pos in _BITS.items():
    code = c7[..., v].astype(jnp.uint32)
    for src, dst in zip((3, 2, 1, 0), pos):
      words = words | (((code >> src) & 1) << dst)
  packed = jax.lax.bitcast_convert_type(words, jnp.uint8).reshape(s_, ks, 512)
  return packed, cc, gs, exact, stats


def _fp6_slot(grp: int, e: int) -> tuple:
  """(h, q, kk) of element e = 2 v + half of 3-word group G: A register i = v % 4 of MMA
  q = 2 G + v // 4, row h = i % 2, kk = 2 (i // 2) + half."""
  v, half = divmod(e, 2)
  i = v % 4
  return i % 2, 2 * grp + v // 4, 2 * (i // 2) + half


def _fp6_elements(c7):
  """(..., h, q, kk) -> (..., G, e) codes (:func:`_fp6_slot`)."""
  return jnp.stack([jnp.stack([c7[(...,) + _fp6_slot(grp, e)] for e in range(16)], axis=-1)
                    for grp in range(2)], axis=-2)


def _pack_fp6(codes, fmt: str, s_: int, ks: int):
  """(N, Kp) 6-bit codes -> uint8 (S, KS, 768) (the MXFP6 layout of the module docstring)."""
  c7 = codes.reshape(s_, 2, 8, ks, 4, 4, 4).transpose(0, 3, 2, 4, 1, 5, 6)  # (s, j, g, t, h, q, kk)
  el = _fp6_elements(c7).astype(jnp.uint32)                                  # (s, j, g, t, G, 16)
  src = _FP6_SRC[fmt]
  words = [jnp.zeros(el.shape[:-1], jnp.uint32) for _ in range(3)]
  for e in range(16):
    for b in range(6):
      st = int(src[e, b])
      words[st // 32] = words[st // 32] | (((el[..., e] >> b) & 1) << (st % 32))
  w6 = jnp.stack(words, axis=-1).reshape(s_, ks, 32, 6)                      # lane = 4 g + t
  w = jnp.concatenate([w6[..., :4].reshape(s_, ks, 128), w6[..., 4:].reshape(s_, ks, 64)], axis=-1)
  return jax.lax.bitcast_convert_type(w, jnp.uint8).reshape(s_, ks, 768)


def _unpack_fp6(packed, fmt: str, n: int):
  """Inverse of _pack_fp6: uint8 (S, KS, 768) -> (N, Kp) uint32 codes."""
  s_, ks = packed.shape[:2]
  w = jax.lax.bitcast_convert_type(packed.reshape(s_, ks, 192, 4), jnp.uint32)
  w6 = jnp.concatenate([w[:, :, :128].reshape(s_, ks, 32, 4), w[:, :, 128:].reshape(s_, ks, 32, 2)],
                       axis=-1).reshape(s_, ks, 8, 4, 2, 3)                   # (s, j, g, t, G, word)
  src = _FP6_SRC[fmt]
  el = []
  for e in range(16):
    code = jnp.zeros(w6.shape[:-1], jnp.uint32)
    for b in range(6):
      st = int(src[e, b])
      code = code | (((w6[..., st // 32] >> (st % 32)) & 1) << b)
    el.append(code)
  el = jnp.stack(el, axis=-1)                                                  # (s, j, g, t, G, 16)
  c7 = jnp.zeros(el.shape[:4] + (2, 4, 4), jnp.uint32)                         # (s, j, g, t, h, q, kk)
  for grp in range(2):
    for e in range(16):
      c7 = c7.at[(...,) + _fp6_slot(grp, e)].set(el[..., grp, e])
  return c7.transpose(0, 4, 2, 1, 3, 5, 6).reshape(n, ks * TILE_K)           # (s, h, g, j, t, q, kk)


# -- dequantization (the reference) -----------------------------------------------------------

def dequantize_packed(wp: PackedWeight, dtype=jnp.float32) -> jax.Array:
  """The (N, K) weight a PackedWeight holds, in float32 (then ``dtype``); any backend."""
  wp.check_layout("jax_gmma.weightonly.dequantize_packed")
  return _dequant_impl(wp.packed, wp.scales, wp.global_scale, wp.format, wp.n, wp.k).astype(dtype)


def _scale_values(codes, fmt: str):
  """float32 block scales from the kernel's scale codes (F = scale * 2^116, e3m2: 2^114)."""
  c = codes.astype(jnp.uint32)
  if fmt == "nvfp4":
    bits, bias = c * 16 + 0x7000, 116
  else:
    bias = _MX_BIAS[fmt]
    bits = (c + bias) * 128
  f = jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16).astype(jnp.float32)
  return f * np.float32(2.0 ** -bias)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _dequant_impl(packed, codes, global_scale, fmt: str, n: int, k: int):
  s_, ks = packed.shape[:2]
  kp = ks * TILE_K
  bk = _BLOCK_K[fmt]
  if fmt in FP6_FORMATS:
    vals = _unpack_fp6(packed, fmt, n)
  else:
    words = jax.lax.bitcast_convert_type(packed.reshape(s_, ks, 8, 4, 4, 4), jnp.uint32)
    elems = []
    for v in range(8):
      code = jnp.zeros(words.shape, jnp.uint32)
      for src, dst in zip((3, 2, 1, 0), _BITS[v]):
        code = code | (((words >> dst) & 1) << src)
      elems.append(code)
    vals = jnp.stack(elems, axis=-1).reshape(s_, ks, 8, 4, 4, 2, 4)        # (s, j, g, t, q, h, kk)
    vals = vals.transpose(0, 5, 2, 1, 3, 4, 6).reshape(n, kp)               # (s, h, g, j, t, q, kk)
  edt, ebits = _ELEM[fmt]
  w = decode(vals, edt, ebits)
  nb = TILE_K // bk
  sc = codes.reshape(s_, ks, nb, 8, 2).transpose(0, 4, 3, 1, 2).reshape(n, kp // bk)
  sv = _scale_values(sc, fmt)
  w = w * jnp.repeat(sv, bk, axis=1)
  return (w * global_scale.reshape(()))[:, :k]


def weightonly_reference(x, x_scale, packed, scales, global_scale, bias, *, fmt, n, k, out_dtype,
                         has_x_scale, has_bias, **_unused):
  """float32 reference of the kernel: x (M, Kp) bf16 times the dequantized weight."""
  w = _dequant_impl(packed, scales, global_scale, fmt, n, k)
  kp = x.shape[1]
  w = jnp.pad(w, ((0, 0), (0, kp - k)))
  acc = jax.lax.dot_general(x.astype(jnp.float32), w, (((1,), (1,)), ((), ())),
                            precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  return _epilogue(acc, x_scale, bias, out_dtype=out_dtype, has_x_scale=has_x_scale,
                   has_bias=has_bias)


def _epilogue(acc, x_scale, bias, *, out_dtype, has_x_scale: bool, has_bias: bool):
  """float32 (M, N) accumulator -> out: per-token scales, bias (both in float32), cast."""
  if has_x_scale:
    acc = acc * x_scale.astype(jnp.float32).reshape(-1, 1)
  if has_bias:
    acc = acc + bias.astype(jnp.float32).reshape(1, -1)
  return acc.astype(out_dtype)


# -- the primitive ----------------------------------------------------------------------------

def tc_rows(m: int, tokens: int) -> int:
  """The tensor-core kernel's padded token count: M rounded up to the CTA's tokens (C++:
  weightonly_x_rows)."""
  return -(-m // tokens) * tokens


def tiled_x(x, rows: int):
  """x (M, K) bfloat16 -> the tensor-core kernel's tiled activations (K / 64, rows / 8, 512): per
  64-K step j and 8 tokens g, the 1 KiB block the kernel copies into shared memory as is, element
  64 c + 8 r + 2 t + e of block (j, g) = x[8 g + r, 64 j + 16 t + 2 c + e] (the K order of the
  prepared weight's lanes: lane t of a k16 slice owns K 16 t ..), rows M .. rows - 1 zero
  (kWoTcShapes' kernel, cpp/include/jax_gmma/weightonly_wgmma.cuh). The kernel's lowering
  builds it with a CUDA kernel of its own (FFI target ``jax_gmma_weightonly_tile_x``, one
  memory-bound launch; with XLA's transpose instead, a chain of 28672 x 8192 GEMMs at 96 tokens
  took 144.2 µs per GEMM on an H100, 132.6 with it); this is its JAX spelling and the reference
  the tests hold that kernel to."""
  m, k = x.shape
  xp = jnp.pad(x, ((0, rows - m), (0, 0)))
  return xp.reshape(rows // 8, 8, k // 64, 4, 8, 2).transpose(2, 0, 4, 1, 3, 5).reshape(k // 64, rows // 8, 512)


def _gemm_kernel(ctx, x, x_scale, packed, scales, global_scale, bias, *, fmt, n, k, out_dtype,
                 has_x_scale, has_bias, rows, tokens, k_warps):
  x_rows = 0
  if tokens in TC_TOKENS:  # the tensor-core shapes take x tiled, M padded to the CTA's tokens
    x_aval = ctx.avals_in[0]
    m, kp = x_aval.shape
    x_rows = tc_rows(int(m), tokens)
    t_aval = x_aval.update(shape=(kp // 64, x_rows // 8, 512))
    (x,) = jax.ffi.ffi_lowering(TILE_X_TARGET)(ctx.replace(avals_in=[x_aval], avals_out=[t_aval]), x)
    ctx = ctx.replace(avals_in=[t_aval, *ctx.avals_in[1:]])
  rule = jax.ffi.ffi_lowering(WEIGHTONLY_TARGET)
  return rule(ctx, x, x_scale, packed, scales, global_scale, bias,
              scale_kind=np.int32(SCALE_KIND[fmt]), rows=np.int32(rows), tokens=np.int32(tokens),
              k_warps=np.int32(k_warps), x_rows=np.int32(x_rows),
              # every format: MX weights carry a power-of-two global scale (the exact range)
              has_x_scale=bool(has_x_scale), has_global=True, has_bias=bool(has_bias))


def _gemm_partition_rule(avals, params):
  x, xs, packed, scales, g, bias = avals
  m = x.shape[0]
  n = params["n"]
  strips = packed.shape[0]

  def check(f, d):
    if f == "m":
      return sharding.divides(m, d, "M")
    return sharding.divides(strips, d, "the weight's 16-row strips")

  def local(p, shapes_):
    m_l, n_l = shapes_[0][0], shapes_[2][0] * TILE_ROWS
    picked = pick_cta(m, n, x.shape[1], p["fmt"])
    if (p["rows"], p["tokens"], p["k_warps"]) == picked:  # not forced: pick for the shard
      rows, tokens, kw = pick_cta(m_l, n_l, x.shape[1], p["fmt"])
    else:
      rows, tokens, kw = p["rows"], p["tokens"], p["k_warps"]
      if n_l % rows:
        rows, kw = TILE_ROWS, 8
    return {**p, "n": n_l, "rows": rows, "tokens": tokens, "k_warps": kw}

  return sharding.Rule(operands=(("m", "kp"), sharding.vector("m", "xs", xs.shape[0], m),
                                 ("ns",) + sharding.fresh("p", packed.ndim - 1),
                                 ("ns",) + sharding.fresh("s", scales.ndim - 1),
                                 ("g",), sharding.bias_factors(bias, n)),
                       results=(("m", "n"),), shardable=("m", "n"), check=check,
                       compound={"n": ("ns", "nr", TILE_ROWS)}, local_params=local)



def _fold_rest(args, dims, size, m, kp, params):
  # (x, x_scale, packed, scales, global_scale, bias): x_scale (M,) or an ignored (1,)
  if params["has_x_scale"]:
    args[1] = batching.rows_scale(args[1], dims[1], size, m)
  elif dims[1] is not batching.NOT_MAPPED:  # placeholder operand, ignored
    args[1] = jnp.moveaxis(args[1], dims[1], 0)[0]
  # The CTA shape was picked for M rows: re-picked for size * M unless it was forced.
  fmt, n = params["fmt"], params["n"]
  if (params["rows"], params["tokens"], params["k_warps"]) == pick_cta(m, n, kp, fmt):
    params["rows"], params["tokens"], params["k_warps"] = pick_cta(size * m, n, kp, fmt)
  return args, params


WEIGHTONLY_GEMM = primitive.define(
    "jax_gmma_weightonly_gemm",
    abstract_eval=lambda x, *rest, n, out_dtype, **__: _vma.out_aval(
        (x.shape[0], n), out_dtype, x, *rest),
    reference=weightonly_reference, user_fn="jax_gmma.weightonly_gemm", kernel=_gemm_kernel,
    kernel_missing=lambda ctx, params: _backend.missing_reason("weightonly_gemm"),
    op="weightonly_gemm", partition_rule=_gemm_partition_rule,
    vmap=batching.fold((2, 3, 4, 5), _fold_rest), symbolic_ok=True)
weightonly_gemm_p = WEIGHTONLY_GEMM.p


# -- unpack: the prepared layout -> a plain (N, Kp) bf16 or FP8 matrix (the prefill path) ------

UNPACK_TARGET = _backend.WEIGHTONLY_UNPACK_TARGET


def unpack_reference(packed, scales, row_exp, *, fmt, n, kp, out_dtype):
  """The weight as a row-major (N, Kp) matrix without NVFP4's global scale: bfloat16 (exact:
  code times block scale), or float8_e4m3fn ``w * 2^(127 - row_exp[r])`` (exact where
  :data:`FP8_SPREAD` allows; non-finite -> NaN)."""
  w = _dequant_impl(packed, scales, jnp.ones((1,), jnp.float32), fmt, n, kp)
  if np.dtype(out_dtype) == shapes.BF16:
    return w.astype(jnp.bfloat16)
  w = jnp.ldexp(w, (127 - row_exp).reshape(n, 1))
  return jnp.where(jnp.isfinite(w), w, jnp.nan).astype(out_dtype)


def _unpack_kernel(ctx, packed, scales, row_exp, *, fmt, n, kp, out_dtype):
  return jax.ffi.ffi_lowering(UNPACK_TARGET)(ctx, packed, scales, row_exp,
                                             scale_kind=np.int32(SCALE_KIND[fmt]))


def _unpack_partition_rule(avals, params):
  packed, scales, row_exp = avals
  n = params["n"]
  strips = packed.shape[0]
  return sharding.Rule(operands=(("ns",) + sharding.fresh("p", packed.ndim - 1),
                                 ("ns",) + sharding.fresh("s", scales.ndim - 1),
                                 sharding.vector("n", "e", row_exp.shape[0], n)),
                       results=(("n", "kp"),), shardable=("n",),
                       compound={"n": ("ns", "nr", TILE_ROWS)},
                       check=lambda f, d: sharding.divides(strips, d, "the weight's 16-row strips"),
                       local_params=lambda p, s: {**p, "n": s[0][0] * TILE_ROWS})



def _unpack_batched(prim, args, dims, *, fmt, n, kp, out_dtype):
  """``jax.vmap`` of the unpack: the prepared layouts are strip-major, so a stack of B weights
  (N, Kp) is one (B * N, Kp) weight: one launch unpacks them all (grouped experts at prefill).
  A float8 output's row exponents stack the same way; bfloat16's (1,) placeholder stays."""
  size = batching.batch_size(args, dims)
  packed, scales = (batching.front(a, d, size) for a, d in zip(args[:2], dims[:2]))
  packed = packed.reshape((size * packed.shape[1],) + packed.shape[2:])
  scales = scales.reshape((size * scales.shape[1],) + scales.shape[2:])
  row_exp = args[2]
  if dims[2] is not batching.NOT_MAPPED:
    row_exp = batching.front(row_exp, dims[2], size).reshape(size * n)
  elif row_exp.shape[0] == n:
    row_exp = jnp.tile(row_exp, size)
  out = prim.bind(packed, scales, row_exp, fmt=fmt, n=size * n, kp=kp, out_dtype=out_dtype)
  return out.reshape(size, n, kp), 0


WEIGHTONLY_UNPACK = primitive.define(
    "jax_gmma_weightonly_unpack",
    abstract_eval=lambda packed, *rest, n, kp, out_dtype, **__: _vma.out_aval(
        (n, kp), out_dtype, packed, *rest),
    reference=unpack_reference, user_fn="jax_gmma.weightonly.unpack", kernel=_unpack_kernel,
    kernel_missing=lambda ctx, params: _backend.missing_reason("weightonly_unpack"),
    op="weightonly_unpack", partition_rule=_unpack_partition_rule,
    vmap=lambda prim: functools.partial(_unpack_batched, prim))
weightonly_unpack_p = WEIGHTONLY_UNPACK.p


def unpack(w: PackedWeight, dtype=jnp.bfloat16, row_exp=None) -> jax.Array:
  """The (N, Kp) weight of ``w`` (Kp = K rounded up to 64; zero columns past K), without NVFP4's
  global scale, in one pass over the prepared bytes (a CUDA kernel on Hopper, else JAX).

  dtype: bfloat16 (exact for every format), or float8_e4m3fn: row r holds
  ``rn_e4m3(w[r] * 2^(127 - row_exp[r]))`` (saturating; poisoned blocks NaN). ``row_exp``
  defaults to :func:`row_exponents` (MX formats; exact when ``w.fp8_exact``); NVFP4 needs it
  given (e.g. :func:`rounded_row_exponents`)."""
  w.check_layout("jax_gmma.weightonly.unpack")
  dt = np.dtype(jnp.dtype(dtype))
  if dt == shapes.BF16:
    re = jnp.zeros((1,), jnp.int32)
  elif dt == E4M3:
    if row_exp is None and w.format not in FP8_SPREAD:
      raise ValueError(f"jax_gmma.weightonly.unpack: {w.format} to float8_e4m3fn needs row_exp "
                       "(e.g. rounded_row_exponents(w)); row_exponents covers MX formats only")
    re = row_exponents(w) if row_exp is None else jnp.asarray(row_exp, jnp.int32).reshape(w.n)
  else:
    raise TypeError(f"jax_gmma.weightonly.unpack: dtype must be bfloat16 or float8_e4m3fn, got {dt.name}")
  return weightonly_unpack_p.bind(w.packed, w.scales, re, fmt=w.format, n=w.n, kp=w.padded_k,
                                  out_dtype=dt)


def pick_cta(m: int, n: int, k: int, fmt: str) -> tuple:
  """(rows per CTA, tokens per CTA, warps splitting K) the kernel picks for (M, N, K) and the
  weight format (mirrors weightonly_pick in cpp/sm90_fp4_gemm_weightonly.cu; measured on the
  H200, measured 2026-11-30, the CTA-shape and layout sweeps)."""
  if m > 16:
    tc = pick_tc(m, n)
    if tc is not None:
      return tc
  strips = n // 16
  tokens = 8 if m <= 8 else 16
  if fmt in ("nvfp4", "mxfp4"):
    if m <= 8:
      rows, kw = 16, (16 if strips <= 256 else 8 if strips <= 1024 else 4 if strips < 1536 else 2)
    elif m <= 16:
      rows = 32 if strips >= 1024 else 16
      kw = 2 if strips >= 1024 else 4 if strips >= 512 else 8
    else:
      rows, kw = 32, (4 if strips <= 256 else 2)
  else:  # FP6
    if m <= 8:
      rows, kw = (32 if 384 <= strips < 1024 else 16), 8
    elif m <= 16:
      rows, kw = 16, (4 if strips >= 512 and k < 16384 else 8)
    else:
      rows, kw = (32 if strips >= 1024 else 64), 2
  if n % rows:
    rows, kw = 16, 8
  return rows, tokens, kw


def pick_tc(m: int, n: int) -> Optional[tuple]:
  """The tensor-core kernel's CTA shape, or None where the mma.sync decode shapes are as fast
  (mirrors weightonly_tc_pick; measured on an H100, NVFP4, kernel alone, weights rotated past
  L2, every shape against the mma.sync ones at N = 4096 .. 28672). What matters is how the CTAs
  fill 132 SMs: where N gives few 64-row blocks, CTAs with more warp groups along K.

  * 17-32 tokens, N >= 8192: 64 x 32 tiles, 4 K phases (8192 x 8192: 26.4 us against 32.5 for
    mma.sync; MXFP6 28672 x 8192: 104 against 147), 256 x 64 tiles where N gives at least 96 of
    them (28672 x 8192 at 32 tokens: 88.1 against 94.7).
  * 33-64 tokens: 256 x 64 tiles where N gives at least 96 of them (28672 x 8192: 88.8 us),
    64 x 64 tiles with 2 K phases from N = 12288 (14336 x 4096: 28.7 against 40-45; 16384 x
    8192: 52.0 against 68.3 for 128 x 64), with 4 K phases where N gives 96-132 of them (8192 x
    8192: 36.1-36.4 against 37.3-44.9), with 2 above 132 from 49 tokens (10240 x 8192: 51.3
    against 72.3 at 56 tokens; mma.sync 44.8 at 40); mma.sync below N = 6144 (4096 x 14336:
    41.8 against 58.3).
  * 65-128 tokens: 128 x 128 tiles where N gives at least 132 of them (28672 x 8192: 124.8 us
    against 200 for 64 x 128 with 2 K phases); else 64 x 128 with 1 K phase above 132 blocks
    (14336 x 4096: 36.5 against 55.0), 2 K phases where the 64 x 64 tiles' two token tiles would
    pass one wave (8192 x 8192: 53.2 against 57.1; 5120 x 27648 at 128 tokens: 166.3 against
    209.0), and else 64 x 64 tiles with 4 K phases (4096 x 14336: 58.0 against 94.2, 87.8 for 64
    x 128); mma.sync below 32 blocks (N < 2048), here and above 128 tokens.
  * 129-256 tokens: 128 x 128 tiles where N gives fewer than 132 (8192 x 8192, 256 tokens:
    64.3 us against 69.3), else 64 x 128 (28672 x 8192: 222 against 246)."""
  if m <= 16 or n % 64 or n // 64 > MAX_ROW_BLOCKS:
    return None
  blocks = n // 64
  wide = n % 128 == 0 and n // 128 >= 132
  fits_256 = n % 256 == 0 and n // 256 >= 96
  if m <= 32:
    return (256, 64, 4) if fits_256 else (64, 32, 16) if blocks >= 128 else None
  if m <= 64:
    if blocks >= 192:
      return (256, 64, 4) if fits_256 else (64, 64, 8)
    if 96 <= blocks <= 132:
      return (64, 64, 16)
    return (64, 64, 8) if blocks > 132 and m > 48 else None
  if blocks < 32:
    return None
  if m <= 128:
    if wide:
      return (128, 128, 4)
    return (64, 128, 4) if blocks > 132 else (64, 128, 8) if 2 * blocks > 132 else (64, 64, 16)
  return (128, 128, 4) if n % 128 == 0 and not wide else (64, 128, 4)


def resolve_cta(m: int, n: int, k: int, fmt: str, rows=None, tokens=None, k_warps=None) -> tuple:
  """The CTA shape the kernel runs: the forced fields, the pick for the others (k_warps 8 when
  only rows / tokens are forced, the original shapes). Mirrors weightonly_resolve."""
  pr, pt, pk = pick_cta(m, n, k, fmt)
  if rows is None and tokens is None and k_warps is None:
    return pr, pt, pk
  return (pr if rows is None else rows, pt if tokens is None else tokens,
          8 if k_warps is None else k_warps)


#: ``path="auto"`` takes a prefill path (:func:`unpack` + a tensor-core GEMM) from this many
#: tokens (M) on: the kernels re-read the weights per token tile, so their time grows with M,
#: while the prefill paths pay one pass over the weights (the unpack kernel, ~3.5 TB/s) and
#: then run at tensor-core speed. Measured on an H100 (decode chains, NVFP4, µs per GEMM,
#: 28672 x 8192 / 8192 x 8192): M = 128: tensor-core kernel 135.9 / 58.4, bf16 prefill path
#: 218.3 / 96.6; M = 256: kernel 267.6 / 74.8 (the prefill path was not timed there; its
#: 128-token time is a lower bound: a wash at 28672 x 8192 at most, the kernel ahead at 8192).
PREFILL_MIN_M = 257
#: The same switch for the "fp8" prefill path (FP8 x, MX weights with ``fp8_exact``): it runs on
#: FP8 tensor cores, twice the bf16 rate the kernels have, and stays at 128 tokens, where it was
#: set (not re-measured against the tensor-core kernels).
PREFILL_FP8_MIN_M = 128
PATHS = ("auto", "kernel", "dequant", "fp8", "fp8_rounded")


def _pad_k(x2, w: PackedWeight):
  """x (M, K) -> (M, Kp) with zero columns (the prepared weight's padding is zero)."""
  return x2 if w.padded_k == w.k else jnp.pad(x2, ((0, 0), (0, w.padded_k - w.k)))


def _dequant_gemm(x2, xs, w: PackedWeight, b, *, out_dtype, has_x_scale: bool, has_bias: bool):
  """The bf16 prefill path: the weight unpacked once to bfloat16 *without* its NVFP4 global
  scale (each element is a code times its block scale: at most 5 significant bits, exact in
  bf16), one bf16 x bf16 -> float32 GEMM (XLA: cuBLAS / Triton tensor cores), then global scale,
  token scales and bias in float32. Same exact operands as the kernel; only the float32
  summation order differs."""
  wb = unpack(w, jnp.bfloat16)
  acc = jax.lax.dot_general(_pad_k(x2, w), wb, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
  return _epilogue(acc * w.global_scale.reshape(()), xs, b, out_dtype=out_dtype,
                   has_x_scale=has_x_scale, has_bias=has_bias)


def _fp8_gemm_route(x8, xs, w: PackedWeight, bias, *, out_dtype, has_x_scale: bool,
                    rounded: bool = False):
  """The FP8 prefill paths (FP8 activations): the weight unpacked to e4m3 with one power-of-two
  scale per row, then jax-gmma's FP8 GEMM with per-token and per-channel scales (two-level
  accumulation: float32 every 128 of K). ``rounded=False`` ("fp8", MX weights with
  ``fp8_exact``): :func:`row_exponents`, exact. ``rounded=True`` ("fp8_rounded", any format):
  :func:`rounded_row_exponents`, weights rounded to nearest e4m3."""
  e = rounded_row_exponents(w) if rounded else row_exponents(w)
  w8 = unpack(w, E4M3, row_exp=e)
  ws = jnp.ldexp(jnp.broadcast_to(w.global_scale.reshape(()), (w.n,)), e - 127)
  return fp8_gemm(_pad_k(x8, w), w8, xs if has_x_scale else None, ws, bias=bias, out_dtype=out_dtype)


def weightonly_gemm(x, w: PackedWeight, *, x_scale=None, bias=None, out_dtype=None,
                    rows: Optional[int] = None, tokens: Optional[int] = None,
                    k_warps: Optional[int] = None, path: str = "auto"):
  """``out = x_scale * (x @ dequantize(w).T) + bias`` with FP4 / FP6 weights (Hopper kernel).

  Args:
    x: (..., K) bfloat16 activations, or float8_e4m3fn / float8_e5m2 (widened to bf16 exactly;
      pass their dequantization scale as ``x_scale``).
    w: a :class:`PackedWeight` from :func:`prepare` (NVFP4, MXFP4, MXFP6 e2m3 / e3m2; N x K).
    x_scale: None, a scalar or (..., M) per-token float32 scales.
    bias: optional (N,), added in float32.
    out_dtype: bfloat16 (default) or float32.
    rows, tokens, k_warps: force the kernel's CTA shape (one of :data:`CTA_SHAPES`, the
      mma.sync decode kernel: 8 / 16 tokens per CTA, or of :data:`TC_SHAPES`, the tensor-core
      kernel: 32 / 64 / 128 tokens; unset fields take the pick's value, k_warps 8 when rows or
      tokens are given); implies ``path="kernel"``.
    path: "kernel" (the weight-only decode kernel), "dequant" (a prefill path: unpack the
      weight to bf16 once per call, then a bf16 tensor-core GEMM with float32 accumulation),
      "fp8" (the other prefill path, for FP8 x and MX weights whose ``fp8_exact`` is True: unpack
      the weight to FP8 e4m3 with a power-of-two scale per row -- exact -- then jax-gmma's FP8
      GEMM with per-token x per-channel scales), "fp8_rounded" (the same for FP8 x and any
      format, every weight rounded to nearest e4m3 after a power-of-two row scale that keeps
      its row's largest possible weight <= 448: not exact, at most 2^-4 relative per normal
      weight; only when asked for), or "auto" (default): "fp8" where it applies from
      :data:`PREFILL_FP8_MIN_M` tokens, "dequant" from :data:`PREFILL_MIN_M`, else "kernel"
      ("auto" never rounds the weights).

  The kernel path is two kernels on the same prepared weight: the mma.sync decode kernel (it
  streams the weights at HBM speed at a few tokens) and, from 17, 33 or 65 tokens by N, the
  tensor-core kernel (the decoded weights are wgmma's register operand, 32 / 64 / 128 tokens per
  CTA tile; :func:`pick_tc`). Both are correct for any M. All paths multiply the same exact operands; the bf16 ones accumulate in float32, the
  FP8 GEMM in the tensor cores' narrower accumulator within each 128 of K and in float32 across
  them (float32 outputs agree with a float64 reference to ~1e-4 instead of ~1e-6).
  """
  return _gemm(x, w, x_scale=x_scale, bias=bias, out_dtype=out_dtype, rows=rows, tokens=tokens,
               k_warps=k_warps, path=path, who="jax_gmma.weightonly_gemm")


#: Real float dtypes accepted for x_scale (converted to float32) and bias.
SCALE_DTYPES = (shapes.BF16, shapes.F16, shapes.F32)
#: The token count (M) the CTA shape is picked for when M is symbolic (jax.export): the mma.sync
#: decode kernel's 16-token shapes, right and streaming the weights at any M (the tensor-core
#: shapes, from 17 tokens, are picked where M is known).
SYMBOLIC_M_PICK = 16


def _out_dtype(out_dtype, allowed, who: str):
  if out_dtype is None:
    return None
  try:
    dt = np.dtype(jnp.dtype(out_dtype))
  except TypeError:
    dt = None
  if dt not in allowed:
    raise TypeError(f"{who}: out_dtype must be one of {tuple(d.name for d in allowed)}, got "
                    f"{getattr(dt, 'name', repr(out_dtype))}")
  return dt


def _array_of(v, name: str, who: str, allowed, kind: str, dtypes: str, hint: str = ""):
  """``v`` (argument ``name``) as an array of one of the ``allowed`` dtypes, else a TypeError
  naming ``who``'s ``name``: ``kind`` says what it must be when it is no array, ``dtypes`` when
  its dtype is not allowed (nothing is cast)."""
  try:
    a = jnp.asarray(v)
  except TypeError:
    raise TypeError(f"{who}: {name} must be {kind}, got {type(v).__name__}") from None
  if np.dtype(a.dtype) not in allowed:
    raise TypeError(f"{who}: {name} must be {dtypes}, got {np.dtype(a.dtype).name}{hint}")
  return a


def _float_operand(v, name: str, who: str, what: str):
  """jnp array of ``v``, refused unless a real bfloat16 / float16 / float32 array."""
  kind = f"a float (bfloat16, float16, float32) {what}"
  return _array_of(v, name, who, SCALE_DTYPES, kind, kind,
                   " (nothing is cast: integer, bool and complex values are refused)")


def _gemm(x, w, *, x_scale, bias, out_dtype, rows, tokens, k_warps, path, who):
  if not isinstance(w, PackedWeight):
    raise TypeError(f"{who}: w must be a PackedWeight (jax_gmma.weightonly.prepare(w, 'nvfp4')), "
                    f"got {type(w).__name__}")
  w.check_layout(who)
  if isinstance(x, (QuantizedArray, PackedWeight)):
    raise TypeError(f"{who}: x must be an array (a QuantizedArray x goes through jax_gmma.dot), got "
                    f"{type(x).__name__}")
  x = _array_of(x, "x", who, X_DTYPES, "a bfloat16, float8_e4m3fn or float8_e5m2 array",
                "bfloat16, float8_e4m3fn or float8_e5m2",
                " (cast float32/float16 activations to bfloat16 explicitly)")
  xdt = np.dtype(x.dtype)
  if x.ndim < 1 or not _same_dim(x.shape[-1], w.k):
    raise ValueError(f"{who}: x must be (..., K) with K = {w.k} (w's K), got shape {x.shape}")
  lead = tuple(x.shape[:-1])
  m = functools.reduce(lambda a, b: a * b, lead, 1)
  concrete = _is_int(m)
  if concrete and m > MAX_DIM:
    raise ValueError(f"{who}: x must have fewer than 2^31 rows (M, the product of its leading "
                     f"dimensions), got shape {x.shape}")
  out_dtype = _out_dtype(out_dtype, OUT_DTYPES, who) or shapes.BF16
  if not isinstance(path, str) or path not in PATHS:
    raise ValueError(f"{who}: path must be one of {PATHS}, got {path!r}")
  forced = rows is not None or tokens is not None or k_warps is not None
  if path == "dequant" and forced:
    raise ValueError(f"{who}: rows / tokens / k_warps choose the kernel's CTA shape; they do not "
                     "apply to path='dequant'")
  fp8_ok = xdt != shapes.BF16 and w.fp8_exact is True
  if path in ("fp8", "fp8_rounded"):
    if forced:
      raise ValueError(f"{who}: rows / tokens / k_warps choose the kernel's CTA shape; they do not "
                       f"apply to path={path!r}")
    if xdt == shapes.BF16:
      raise ValueError(f"{who}: path={path!r} multiplies FP8 activations (x float8_e4m3fn / "
                       "float8_e5m2); x is bfloat16 (use path='dequant', or quantize x)")
  if path == "fp8":
    if w.format not in FP8_SPREAD:
      raise ValueError(f"{who}: path='fp8' takes MX weights {tuple(FP8_SPREAD)}; {w.format}'s e4m3 "
                       "block scales times e2m1 codes are not FP8 numbers (use path='dequant', or "
                       "path='fp8_rounded' to round them to e4m3)")
    if w.fp8_exact is not True:
      why = ("unknown: w was prepared under a trace (prepare it outside jax.jit)"
             if w.fp8_exact is None else
             f"False: some row's block scales span more than 2^{FP8_SPREAD[w.format]}")
      raise ValueError(f"{who}: path='fp8' needs w.fp8_exact (the weight exactly FP8 with a "
                       f"power-of-two scale per row); it is {why}. Use path='dequant' (exact) or "
                       "path='fp8_rounded'")
  if path == "auto":
    # A symbolic M (jax.export) takes the kernel: it is right for every M.
    if not concrete or m < (PREFILL_FP8_MIN_M if fp8_ok else PREFILL_MIN_M) or forced:
      path = "kernel"
    else:
      path = "fp8" if fp8_ok else "dequant"
  if rows is not None and rows not in ROWS_CHOICES:
    raise ValueError(f"{who}: rows must be one of {ROWS_CHOICES}, got {rows}")
  if tokens is not None and tokens not in TOKENS_CHOICES:
    raise ValueError(f"{who}: tokens must be one of {TOKENS_CHOICES}, got {tokens}")
  if k_warps is not None and k_warps not in K_WARPS_CHOICES:
    raise ValueError(f"{who}: k_warps must be one of {K_WARPS_CHOICES}, got {k_warps}")
  # the kernel sees the padded K (what weightonly_pick gets)
  m_pick = m if concrete else SYMBOLIC_M_PICK
  rows, tokens, k_warps = resolve_cta(max(m_pick, 1), w.n, w.padded_k, w.format, rows, tokens,
                                      k_warps)
  if (rows, tokens, k_warps) not in CTA_SHAPES + TC_SHAPES:
    raise ValueError(f"{who}: no kernel for the CTA shape (rows, tokens, k_warps) = "
                     f"{(rows, tokens, k_warps)}; built shapes: {CTA_SHAPES + TC_SHAPES}")
  if w.n % rows:
    raise ValueError(f"{who}: rows = {rows} must divide N = {w.n}")
  if tokens >= 32 and w.n // rows > MAX_ROW_BLOCKS:
    raise ValueError(f"{who}: the tensor-core kernel takes at most {MAX_ROW_BLOCKS} blocks of "
                     f"{rows} rows; N = {w.n} (use fewer tokens per CTA or more rows)")
  if path == "kernel" and tokens in TC_TOKENS and not concrete:
    raise ValueError(f"{who}: tokens = {tokens} (the tensor-core kernel) needs a concrete M, got "
                     f"x of shape {x.shape} (leave tokens unset under symbolic shapes)")
  if path == "kernel" and concrete and -(-m // tokens) > MAX_TOKEN_TILES:
    raise ValueError(f"{who}: x has M = {m} tokens; path='kernel' takes at most "
                     f"{MAX_TOKEN_TILES * tokens} with {tokens} tokens per CTA (use path='dequant')")
  if x_scale is not None:
    xs = _float_operand(x_scale, "x_scale", who, "scalar or one scale per token")
    if xs.size == 1 and xs.ndim <= 1:
      xs = jnp.broadcast_to(xs.reshape(()), (m,))
    elif tuple(xs.shape) in (lead, (m,), lead + (1,)):
      xs = xs.reshape(-1)
    else:
      raise ValueError(f"{who}: x_scale must be a scalar or one scale per token: shape {lead}, "
                       f"{(m,)} or {lead + (1,)}, got shape {tuple(xs.shape)}")
    xs = xs.astype(jnp.float32)
  else:
    xs = jnp.ones((1,), jnp.float32)
  if bias is not None:
    b = _float_operand(bias, "bias", who, f"({w.n},) array")
    if tuple(b.shape) != (w.n,):
      raise ValueError(f"{who}: bias must have shape ({w.n},), got {b.shape}")
    b = b.astype(out_dtype)
  else:
    b = jnp.zeros((1,), out_dtype)
  if concrete and m == 0:  # nothing to multiply: the empty result
    return jnp.zeros((*lead, w.n), out_dtype)
  x2 = x.reshape(-1, w.k)
  x8 = x2
  if xdt != shapes.BF16:
    x2 = x2.astype(jnp.bfloat16)  # exact for e4m3 / e5m2
  if path in ("fp8", "fp8_rounded"):
    out = _fp8_gemm_route(x8, xs, w, None if bias is None else b, out_dtype=out_dtype,
                          has_x_scale=x_scale is not None, rounded=path == "fp8_rounded")
    return out.reshape(*lead, w.n)
  if path == "dequant":
    out = _dequant_gemm(x2, xs, w, b, out_dtype=out_dtype, has_x_scale=x_scale is not None,
                        has_bias=bias is not None)
    return out.reshape(*lead, w.n)
  out = weightonly_gemm_p.bind(_pad_k(x2, w), xs, w.packed, w.scales, w.global_scale, b, fmt=w.format, n=w.n,
                               k=w.k, out_dtype=out_dtype, has_x_scale=x_scale is not None,
                               has_bias=bias is not None, rows=int(rows), tokens=int(tokens),
                               k_warps=int(k_warps))
  return out.reshape(*lead, w.n)


def _same_dim(d, k: int) -> bool:
  """Whether dimension ``d`` (an int or a symbolic dimension) is exactly ``k``."""
  return _is_int(d) and int(d) == k


# -- jax_gmma.dot on this family's weights ---------------------------------------------------

#: Activation formats of a QuantizedArray x that ``dot`` widens to bf16 for these weights.
ACTIVATION_FORMATS = ("fp8_tensor", "fp8_channel")


def serves(w) -> bool:
  """Whether :func:`dot` multiplies weight ``w`` (a :class:`PackedWeight`)."""
  return isinstance(w, PackedWeight)


#: Float arrays x that ``dot`` multiplies with a PackedWeight: bfloat16 as is, float16 / float32
#: rounded to bfloat16, float8 e4m3 / e5m2 widened exactly (no scale).
DOT_X_DTYPES = (shapes.BF16, shapes.F16, shapes.F32, E4M3, E5M2)
#: dot's output dtypes (float16: the float32 result rounded once).
DOT_OUT_DTYPES = (shapes.BF16, shapes.F16, shapes.F32)


def dot(x, w, *, bias, out_dtype, **_):
  """``jax_gmma.dot`` for FP4 / FP6 weights prepared for Hopper (:func:`prepare`): a float x
  (bfloat16; float32 / float16 are rounded to bf16 first; float8_e4m3fn / float8_e5m2 are
  widened exactly) is multiplied in bfloat16; an FP8 QuantizedArray x (fp8_tensor /
  fp8_channel) is widened to bf16 exactly with its scales. Integer, bool and complex x are
  refused. ``out_dtype`` defaults to x's dtype for float16 / float32 x, else bfloat16 (float16:
  the float32 result rounded once)."""
  who = "jax_gmma.dot"
  out_dt = _out_dtype(out_dtype, DOT_OUT_DTYPES, who)
  if isinstance(x, QuantizedArray):
    if x.format.name not in ACTIVATION_FORMATS:
      raise ValueError(f"{who}: x has format {x.format.name!r}, which cannot multiply FP4/FP6 "
                       "weights; use fp8_tensor, fp8_channel or a float x")
    default_out = shapes.BF16
    x_arr, xs = x.data, x.scales
  else:
    x_arr = _array_of(x, "x", who, DOT_X_DTYPES, "a float array or a QuantizedArray",
                      "a float array (bfloat16, float16, float32, float8_e4m3fn, float8_e5m2) to "
                      "multiply a PackedWeight", " (nothing is cast: integer, bool and complex x "
                      "are refused)")
    dt = np.dtype(x_arr.dtype)
    default_out = dt if dt in (shapes.F16, shapes.F32) else shapes.BF16
    if dt in (shapes.F16, shapes.F32):
      x_arr = x_arr.astype(jnp.bfloat16)
    xs = None
  out_dt = default_out if out_dt is None else out_dt
  run_dt = shapes.F32 if out_dt == shapes.F16 else out_dt
  out = _gemm(x_arr, w, x_scale=xs, bias=bias, out_dtype=run_dt, rows=None, tokens=None,
              k_warps=None, path="auto", who=who)
  return out.astype(out_dt)
