"""Lossless safetensors import and export of quantized weights, in the tensor-naming conventions
of published checkpoints, into and out of :class:`~jax_gmma.QuantizedArray`.

Conventions (``prefix`` is a weight's name without its suffix, e.g.
``"model.layers.0.mlp.down_proj"``; ``(..., N, K)`` is the weight, K the contraction axis, any
leading dimensions kept):

``"fp8_block"`` (DeepSeek-V3, Qwen3-FP8) -> format ``"fp8_128x128"``
  ``{prefix}.weight`` float8_e4m3fn ``(..., N, K)``; ``{prefix}.weight_scale_inv`` float32
  ``(..., ceil(N/128), ceil(K/128))``. ``value = weight * weight_scale_inv`` per 128 x 128
  block: despite its name the stored number multiplies (it is the dequantization scale).
``"fp8_channel"`` -> ``"fp8_channel"``; ``"fp8_tensor"`` -> ``"fp8_tensor"`` (ModelOpt FP8,
  FBGEMM / compressed-tensors FP8)
  ``{prefix}.weight`` float8_e4m3fn ``(..., N, K)``; ``{prefix}.weight_scale`` float32
  ``(..., N, 1)`` or ``(..., N)`` (per channel), or ``()`` / ``(1,)`` (per tensor).
  ``value = weight * weight_scale``.
``"mxfp4"`` (gpt-oss original checkpoint) and ``"mxfp4_hf"`` (its Hugging Face form)
  -> ``"mxfp4"``
  ``{prefix}.blocks`` / ``{prefix}_blocks`` uint8 ``(..., N, K/32, 16)``: two e2m1 codes per
  byte, element ``2i`` in the low nibble and ``2i + 1`` in the high nibble;
  ``{prefix}.scales`` / ``{prefix}_scales`` uint8 E8M0 bytes ``(..., N, K/32)`` (float8_e8m0fnu
  accepted too). ``value = e2m1 * 2^(scale - 127)``. This is the order of gpt-oss' own decoder
  (``FP4_VALUES[blk & 0x0F]`` for the even, ``FP4_VALUES[blk >> 4]`` for the odd elements,
  ``ldexp`` by ``scales - 127``); stacked experts ``(E, N, K/32, 16)`` become one
  QuantizedArray of shape ``(E, N, K)``.
``"nvfp4"`` (NVIDIA ModelOpt NVFP4) -> ``"nvfp4"``
  ``{prefix}.weight`` uint8 ``(..., N, K/2)`` packed e2m1 (low nibble first, as above);
  ``{prefix}.weight_scale`` float8_e4m3fn ``(..., N, ceil(K/16))``; ``{prefix}.weight_scale_2``
  float32 ``()`` or ``(1,)``, the per-tensor global scale.
  ``value = e2m1 * weight_scale * weight_scale_2``.

``{prefix}.input_scale`` (a static activation scale; jax-gmma quantizes activations by current
scaling) is not read: :func:`from_tensors` and :func:`load` warn that they ignored it.

Every import is bit-exact: element codes, scales and the global scale keep their bytes; where
the format stores K padded to whole blocks (``fp8_128x128``, ``nvfp4`` with K not a multiple of
16), the padding is zero codes. The result's leaves are NumPy arrays on the host (place them
with ``jax.device_put``). Export is the inverse and bit-exact too. Exports need row-major or
swizzled scales (swizzled ones are unswizzled), an MX weight K a multiple of 32 and an NVFP4
weight an even K (the conventions store no unpadded K); a scale stored as ``(N,)`` or ``(1,)``
comes back as ``(N, 1)`` or ``()`` (same bytes). A weight quantized along another axis is
exported K-last, as ``(..., N, K)``; importing it gives ``axis=-1``.

float8 tensors: ``safetensors.numpy.save_file`` writes ml_dtypes' float8 arrays as ``F8_E4M3``
/ ``F8_E5M2`` / ``F8_E8M0``, but its ``load_file`` (safetensors 0.8) cannot return them; then
:func:`load` reads the file through ``safetensors.deserialize`` and views the bytes as the
ml_dtypes type.
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, Iterable, Optional, Tuple

import jax
import ml_dtypes
import numpy as np

from .arrays import QuantizedArray, check_leaves, rowmajor_scales
from .numerics.formats import E2M1 as _E2M1, E4M3 as _E4M3, E5M2 as _E5M2, E8M0 as _E8M0, F32 as _F32

try:
  import safetensors
  import safetensors.numpy
except ImportError:  # optional dependency
  safetensors = None

__all__ = ["CONVENTIONS", "DEFAULT_CONVENTION", "from_tensors", "to_tensors", "find_weights",
           "load", "save"]

#: convention -> the jax-gmma format it imports to.
CONVENTIONS = {"fp8_block": "fp8_128x128", "fp8_channel": "fp8_channel",
               "fp8_tensor": "fp8_tensor", "mxfp4": "mxfp4", "mxfp4_hf": "mxfp4",
               "nvfp4": "nvfp4"}
#: format -> the convention :func:`to_tensors` writes by default.
DEFAULT_CONVENTION = {"fp8_128x128": "fp8_block", "fp8_channel": "fp8_channel",
                      "fp8_tensor": "fp8_tensor", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}

_WHO_FROM = "jax_gmma.checkpoint.from_tensors"
_WHO_TO = "jax_gmma.checkpoint.to_tensors"
_WHO_LOAD = "jax_gmma.checkpoint.load"
_WHO_SAVE = "jax_gmma.checkpoint.save"
_U8 = np.dtype(np.uint8)
_FP8 = (_E4M3, _E5M2)
_MX_BLOCK = 32
_NV_BLOCK = 16
_FP8_BLOCK = 128
#: Tensors of these suffixes belong to a weight but are not read (static activation scales).
_IGNORED = (".input_scale",)
#: safetensors dtype name -> NumPy dtype (little-endian, as the file stores it).
_FILE_DTYPES = {
  "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": ml_dtypes.bfloat16,
  "I64": "<i8", "U64": "<u8", "I32": "<i4", "U32": "<u4", "I16": "<i2", "U16": "<u2",
  "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
  "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
  "F8_E8M0": ml_dtypes.float8_e8m0fnu,
}


def _names(prefix: str, convention: str) -> Dict[str, str]:
  """role -> tensor name of ``convention`` for weight ``prefix``."""
  if convention == "fp8_block":
    return {"weight": f"{prefix}.weight", "scale": f"{prefix}.weight_scale_inv"}
  if convention in ("fp8_channel", "fp8_tensor"):
    return {"weight": f"{prefix}.weight", "scale": f"{prefix}.weight_scale"}
  if convention == "mxfp4":
    return {"blocks": f"{prefix}.blocks", "scale": f"{prefix}.scales"}
  if convention == "mxfp4_hf":
    return {"blocks": f"{prefix}_blocks", "scale": f"{prefix}_scales"}
  return {"weight": f"{prefix}.weight", "scale": f"{prefix}.weight_scale",
          "global": f"{prefix}.weight_scale_2"}


def _convention_or_error(convention, who: str) -> str:
  if convention not in CONVENTIONS:
    raise ValueError(f"{who}: convention must be None or one of "
                     f"{', '.join(repr(c) for c in CONVENTIONS)}, got {convention!r}")
  return convention


def _need_safetensors(who: str) -> None:
  if safetensors is None:
    raise ImportError(f"{who} needs the safetensors package: pip install safetensors")


# ----------------------------------------------------------------------------
# FP4 packing (two e2m1 codes per byte, element 2i in the low nibble)
# ----------------------------------------------------------------------------
def _unpack_fp4(packed: np.ndarray) -> np.ndarray:
  """uint8 ``(..., B)`` -> float4_e2m1fn ``(..., 2B)``."""
  lo = packed & np.uint8(0x0F)
  hi = packed >> np.uint8(4)
  codes = np.stack([lo, hi], axis=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
  return codes.view(_E2M1)


def _pack_fp4(data: np.ndarray) -> np.ndarray:
  """float4_e2m1fn ``(..., 2B)`` -> uint8 ``(..., B)``."""
  codes = _contig(data).view(_U8) & np.uint8(0x0F)
  return (codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))).astype(_U8)


def _contig(a) -> np.ndarray:
  """``a`` as a C-contiguous NumPy array, same shape (``np.ascontiguousarray`` makes 0-d arrays
  1-d)."""
  a = np.asarray(a)
  return a if a.flags.c_contiguous else a.copy(order="C")


def _pad_k(a: np.ndarray, kp: int) -> np.ndarray:
  """``a`` (1-byte dtype) zero-padded (all-zero bytes) along its last axis to ``kp``."""
  k = a.shape[-1]
  if k == kp:
    return _contig(a)
  bits = np.zeros((*a.shape[:-1], kp), _U8)
  bits[..., :k] = a.view(_U8)
  return bits.view(a.dtype)


# ----------------------------------------------------------------------------
# import
# ----------------------------------------------------------------------------
def _detect(tensors, prefix: str) -> Optional[str]:
  """The convention whose tensors for ``prefix`` are in ``tensors``, or None."""
  if f"{prefix}.weight_scale_inv" in tensors:
    return "fp8_block"
  if f"{prefix}.blocks" in tensors or f"{prefix}.scales" in tensors:
    return "mxfp4"
  if f"{prefix}_blocks" in tensors or f"{prefix}_scales" in tensors:
    return "mxfp4_hf"
  if f"{prefix}.weight_scale_2" in tensors:
    return "nvfp4"
  scale = tensors.get(f"{prefix}.weight_scale")
  if scale is None:
    return None
  weight = tensors.get(f"{prefix}.weight")
  if weight is not None and np.dtype(weight.dtype) == _U8:
    return "nvfp4"
  return "fp8_tensor" if np.ndim(scale) <= 1 and np.size(scale) == 1 else "fp8_channel"


def find_weights(tensors) -> Dict[str, str]:
  """Every quantized weight in ``tensors`` (name -> array): prefix -> convention, sorted by
  prefix. A weight is recognised by the name of its scale or blocks tensor
  (``.weight_scale_inv``, ``.weight_scale``, ``.blocks``, ``_blocks``)."""
  out = {}
  for name in tensors:
    for suffix in (".weight_scale_inv", ".weight_scale", ".blocks", "_blocks"):
      if name.endswith(suffix):
        conv = _detect(tensors, name[:-len(suffix)])
        if conv is not None:
          out[name[:-len(suffix)]] = conv
  return dict(sorted(out.items()))


def _get(tensors, names: Dict[str, str], role: str, convention: str, who: str) -> np.ndarray:
  name = names[role]
  if name not in tensors:
    raise KeyError(f"{who}: missing tensor {name!r} (convention {convention!r} needs "
                   f"{', '.join(repr(n) for n in names.values())})")
  a = tensors[name]
  if not (hasattr(a, "shape") and hasattr(a, "dtype")):
    raise TypeError(f"{who}: tensor {name!r} must be an array, got {type(a).__name__}")
  return np.asarray(a)


def _check_dtype(a: np.ndarray, name: str, allowed, convention: str, who: str) -> None:
  if np.dtype(a.dtype) not in allowed:
    want = " or ".join(np.dtype(d).name for d in allowed)
    raise TypeError(f"{who}: tensor {name!r} must be {want} (convention {convention!r}), got "
                    f"{np.dtype(a.dtype).name}")


def _check_shape(a: np.ndarray, name: str, want: Tuple[int, ...], rule: str, convention: str,
                 who: str) -> None:
  if tuple(a.shape) != tuple(want):
    raise ValueError(f"{who}: tensor {name!r} must have shape {tuple(want)} ({rule}; convention "
                     f"{convention!r}), got {tuple(a.shape)}")


def _weight_rank(a: np.ndarray, name: str, rank: int, what: str, convention: str,
                 who: str) -> None:
  if a.ndim < rank:
    raise ValueError(f"{who}: tensor {name!r} must have at least {rank} dimensions {what} "
                     f"(convention {convention!r}), got shape {tuple(a.shape)}")


def _build(tensors, prefix: str, convention: Optional[str], who: str):
  """(QuantizedArray, names of the ignored tensors of ``prefix``)."""
  if not isinstance(prefix, str):
    raise TypeError(f"{who}: prefix must be a str, got {type(prefix).__name__}")
  if not hasattr(tensors, "__contains__") or not hasattr(tensors, "__getitem__"):
    raise TypeError(f"{who}: tensors must be a dict of arrays (name -> array), got "
                    f"{type(tensors).__name__}")
  if convention is None:
    convention = _detect(tensors, prefix)
    if convention is None:
      found = sorted(n for n in tensors if n.startswith(prefix))[:8]
      raise KeyError(
        f"{who}: no quantized weight {prefix!r}: found none of {prefix!r} + "
        "'.weight_scale_inv' (fp8_block), '.weight_scale' (fp8_channel / fp8_tensor / nvfp4), "
        f"'.blocks' or '_blocks' (mxfp4); tensors with that prefix: {found}")
  convention = _convention_or_error(convention, who)
  names = _names(prefix, convention)
  ignored = [f"{prefix}{s}" for s in _IGNORED if f"{prefix}{s}" in tensors]
  if convention in ("fp8_block", "fp8_channel", "fp8_tensor"):
    wn, sn = names["weight"], names["scale"]
    w = _get(tensors, names, "weight", convention, who)
    s = _get(tensors, names, "scale", convention, who)
    _check_dtype(w, wn, _FP8, convention, who)
    _weight_rank(w, wn, 2, "(..., N, K)", convention, who)
    _check_dtype(s, sn, (_F32,), convention, who)
    *lead, n, k = w.shape
    if convention == "fp8_block":
      want = (*lead, math.ceil(n / _FP8_BLOCK), math.ceil(k / _FP8_BLOCK))
      _check_shape(s, sn, want, "(..., ceil(N/128), ceil(K/128)) for weight "
                   f"{tuple(w.shape)}", convention, who)
      fmt = "fp8_128x128"
    elif convention == "fp8_channel":
      if tuple(s.shape) == (*lead, n):
        s = s.reshape(*lead, n, 1)
      _check_shape(s, sn, (*lead, n, 1), f"one scale per row: (..., N, 1) or (..., N) for "
                   f"weight {tuple(w.shape)}", convention, who)
      fmt = "fp8_channel"
    else:
      if s.size != 1 or s.ndim > 1:
        raise ValueError(f"{who}: tensor {sn!r} must have shape () or (1,) (one scale per "
                         f"tensor; convention {convention!r}), got {tuple(s.shape)}")
      s = s.reshape(())
      fmt = "fp8_tensor"
    data = _pad_k(w, 128 * math.ceil(k / 128)) if fmt == "fp8_128x128" else w
    q = QuantizedArray(_contig(data), _contig(s), format=fmt,
                       shape=tuple(w.shape), axis=-1, dtype=w.dtype)
    return q, ignored
  if convention in ("mxfp4", "mxfp4_hf"):
    bn, sn = names["blocks"], names["scale"]
    b = _get(tensors, names, "blocks", convention, who)
    s = _get(tensors, names, "scale", convention, who)
    _check_dtype(b, bn, (_U8,), convention, who)
    _check_dtype(s, sn, (_U8, _E8M0), convention, who)
    _weight_rank(b, bn, 3, "(..., N, K/32, 16)", convention, who)
    if b.shape[-1] != _MX_BLOCK // 2:
      raise ValueError(f"{who}: tensor {bn!r} must have shape (..., N, K/32, 16) (16 bytes: "
                       f"32 e2m1 codes per block; convention {convention!r}), got "
                       f"{tuple(b.shape)}")
    _check_shape(s, sn, b.shape[:-1], f"(..., N, K/32): one E8M0 scale per block of {bn!r} "
                 f"{tuple(b.shape)}", convention, who)
    *lead, n, g, _ = b.shape
    data = _unpack_fp4(_contig(b).reshape(*lead, n, g * _MX_BLOCK // 2))
    scales = _contig(s).view(_E8M0)
    q = QuantizedArray(data, scales, format="mxfp4", shape=(*lead, n, g * _MX_BLOCK), axis=-1)
    return q, ignored
  wn, sn, gn = names["weight"], names["scale"], names["global"]
  w = _get(tensors, names, "weight", convention, who)
  s = _get(tensors, names, "scale", convention, who)
  gs = _get(tensors, names, "global", convention, who)
  _check_dtype(w, wn, (_U8,), convention, who)
  _weight_rank(w, wn, 2, "(..., N, K/2)", convention, who)
  _check_dtype(s, sn, (_E4M3,), convention, who)
  _check_dtype(gs, gn, (_F32,), convention, who)
  *lead, n, k2 = w.shape
  k = 2 * k2
  _check_shape(s, sn, (*lead, n, math.ceil(k / _NV_BLOCK)), f"(..., N, ceil(K/16)) for packed "
               f"weight {tuple(w.shape)}, K = {k}", convention, who)
  if gs.size != 1 or gs.ndim > 1:
    raise ValueError(f"{who}: tensor {gn!r} must have shape () or (1,) (the per-tensor global "
                     f"scale; convention {convention!r}), got {tuple(gs.shape)}")
  data = _pad_k(_unpack_fp4(_contig(w)), _NV_BLOCK * math.ceil(k / _NV_BLOCK))
  q = QuantizedArray(data, _contig(s), _contig(gs).reshape(()),
                     format="nvfp4", shape=(*lead, n, k), axis=-1)
  return q, ignored


def _warn_ignored(names, who: str) -> None:
  if names:
    shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
    warnings.warn(f"{who}: ignored {len(names)} static activation scale tensor(s) ({shown}): "
                  "jax_gmma quantizes activations by current scaling", stacklevel=3)


def from_tensors(tensors, prefix: str, convention: Optional[str] = None) -> QuantizedArray:
  """The quantized weight ``prefix`` of ``tensors`` (name -> array, as
  ``safetensors.numpy.load_file`` returns) as a :class:`~jax_gmma.QuantizedArray`, bit-exact.

  ``convention``: one of :data:`CONVENTIONS` (see the module docstring), or None to detect it
  from the tensor names (``weight_scale_inv``: fp8_block; ``blocks`` / ``_blocks``: mxfp4 /
  mxfp4_hf; ``weight_scale_2`` or a uint8 ``weight``: nvfp4; else ``weight_scale`` of one
  element: fp8_tensor, per row: fp8_channel). ``KeyError`` for a missing tensor, ``TypeError``
  / ``ValueError`` for a wrong dtype / shape, each naming the tensor and the rule. An
  ``input_scale`` tensor is ignored, with a warning."""
  q, ignored = _build(tensors, prefix, convention, _WHO_FROM)
  _warn_ignored(ignored, _WHO_FROM)
  return q


# ----------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------
def _host(a) -> np.ndarray:
  return _contig(np.asarray(jax.device_get(a)))


def to_tensors(q: QuantizedArray, prefix: str,
               convention: Optional[str] = None) -> Dict[str, np.ndarray]:
  """The tensors of weight ``prefix`` that store ``q`` in ``convention`` (default: by q's format,
  :data:`DEFAULT_CONVENTION`), the inverse of :func:`from_tensors`, bit-exact.

  Formats: ``fp8_128x128`` (fp8_block), ``fp8_channel``, ``fp8_tensor``, ``mxfp4`` (mxfp4 or
  mxfp4_hf; K a multiple of 32) and ``nvfp4`` (K even). K padding is dropped, scales are
  written row-major, the weight K-last ``(..., N, K)``."""
  who = _WHO_TO
  if not isinstance(q, QuantizedArray):
    raise TypeError(f"{who}: q must be a jax_gmma.QuantizedArray, got {type(q).__name__}")
  if not isinstance(prefix, str):
    raise TypeError(f"{who}: prefix must be a str, got {type(prefix).__name__}")
  fmt = q.format.name
  if convention is None:
    if fmt not in DEFAULT_CONVENTION:
      raise ValueError(f"{who}: format {fmt!r} has no checkpoint convention; formats: "
                       f"{', '.join(repr(f) for f in DEFAULT_CONVENTION)}")
    convention = DEFAULT_CONVENTION[fmt]
  convention = _convention_or_error(convention, who)
  if CONVENTIONS[convention] != fmt:
    raise ValueError(f"{who}: convention {convention!r} stores format "
                     f"{CONVENTIONS[convention]!r}, q has format {fmt!r}")
  check_leaves(q, who)
  names = _names(prefix, convention)
  k = q.canonical_shape[-1]
  data = _host(q.data)
  if data.ndim != len(q.canonical_shape):
    raise ValueError(f"{who}: q is a stacked QuantizedArray (data {data.shape}, declared shape "
                     f"{q.shape}); quantize the stacked array instead")
  scales = _host(rowmajor_scales(q))
  if convention == "fp8_block":
    return {names["weight"]: _contig(data[..., :k]),
            names["scale"]: scales.astype(_F32, copy=False)}
  if convention in ("fp8_channel", "fp8_tensor"):
    return {names["weight"]: data, names["scale"]: scales.astype(_F32, copy=False)}
  if convention in ("mxfp4", "mxfp4_hf"):
    if k % _MX_BLOCK:
      raise ValueError(f"{who}: convention {convention!r} needs K a multiple of {_MX_BLOCK} "
                       f"(it stores whole blocks and no K), got K = {k}")
    *lead, n, _ = data.shape
    blocks = _pack_fp4(data).reshape(*lead, n, k // _MX_BLOCK, _MX_BLOCK // 2)
    return {names["blocks"]: blocks, names["scale"]: _contig(scales.view(_U8))}
  if k % 2:
    raise ValueError(f"{who}: convention {convention!r} packs two codes per byte and needs an "
                     f"even K, got K = {k}")
  return {names["weight"]: _pack_fp4(data[..., :k]), names["scale"]: scales,
          names["global"]: _host(q.global_scale).astype(_F32, copy=False).reshape(())}


# ----------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------
def _read_file(path) -> Dict[str, np.ndarray]:
  """All tensors of the safetensors file ``path`` as NumPy arrays (float8 as ml_dtypes)."""
  try:
    return dict(safetensors.numpy.load_file(path))
  except (AttributeError, KeyError, TypeError):
    pass  # a dtype safetensors' numpy API does not return (float8): read the bytes
  with open(path, "rb") as f:
    raw = f.read()
  out = {}
  for name, view in safetensors.deserialize(raw):
    dt = _FILE_DTYPES.get(view["dtype"])
    if dt is None:
      continue  # no NumPy dtype (e.g. packed F4): never one of the conventions' tensors
    out[name] = np.frombuffer(bytes(view["data"]), dtype=dt).reshape(view["shape"])
  return out


def load(path, prefixes: Optional[Iterable[str]] = None) -> Dict[str, QuantizedArray]:
  """The quantized weights of the safetensors file ``path``: prefix -> QuantizedArray, for
  ``prefixes`` (default: every weight :func:`find_weights` recognises), each by
  :func:`from_tensors` with the convention detected. Tensors that are no quantized weight
  (norms, embeddings, biases) are not returned. One warning lists the ignored
  ``input_scale`` tensors."""
  _need_safetensors(_WHO_LOAD)
  tensors = _read_file(path)
  if prefixes is None:
    prefixes = list(find_weights(tensors))
  elif isinstance(prefixes, str):
    raise TypeError(f"{_WHO_LOAD}: prefixes must be a list of str (or None), got a str")
  out, ignored = {}, []
  for p in prefixes:
    out[p], ign = _build(tensors, p, None, _WHO_FROM)
    ignored += ign
  _warn_ignored(ignored, _WHO_LOAD)
  return out


def save(path, weights: Dict[str, QuantizedArray], metadata: Optional[Dict[str, str]] = None, *,
         convention=None) -> None:
  """Writes ``weights`` (prefix -> QuantizedArray) to the safetensors file ``path`` with
  :func:`to_tensors` (``convention``: None for each format's default, one convention name for
  all, or a dict prefix -> convention), and ``metadata`` (str -> str) in the header."""
  _need_safetensors(_WHO_SAVE)
  if not isinstance(weights, dict):
    raise TypeError(f"{_WHO_SAVE}: weights must be a dict (prefix -> QuantizedArray), got "
                    f"{type(weights).__name__}")
  tensors = {}
  for p, q in weights.items():
    conv = convention.get(p) if isinstance(convention, dict) else convention
    for name, a in to_tensors(q, p, conv).items():
      if name in tensors:
        raise ValueError(f"{_WHO_SAVE}: two weights write tensor {name!r}")
      tensors[name] = a
  safetensors.numpy.save_file(tensors, path, metadata=metadata)
