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

Pytrees for array checkpointers. :func:`tree_to_storable` turns any pytree holding
:class:`~jax_gmma.QuantizedArray` and :class:`~jax_gmma.PackedWeight` leaves into a pytree of
plain arrays (each object a dict of its array fields, E8M0 scales as their uint8 bytes) plus
JSON-serialisable metadata (the static fields: format, logical shape, axis, element dtype, scale
layout; PackedWeight format, N, K, ``fp8_exact`` and layout version); :func:`tree_from_storable`
is the inverse, bit-exact, rebuilding every object through its checking constructor. Any
checkpointer that stores a pytree of arrays and a JSON document can then hold quantized models
(:mod:`jax_gmma.checkpoint_orbax` does it with orbax-checkpoint).

Whole trees in one safetensors file: :func:`save_tree` writes a tree of nested dicts / lists
/ tuples holding arrays, QuantizedArray and PackedWeight objects (for a Flax NNX model:
``nnx.to_pure_dict(nnx.state(model))``) as one tensor per array, named by its path joined with
``/`` (``layers/0/mlp/kernel/value/packed``), with the storable metadata and the tree's key
types in the file header; :func:`load_tree` rebuilds it bit-exact. FP4 / FP6 element arrays,
which safetensors has no dtype for, are stored as their uint8 bytes (listed in the metadata).
"""
from __future__ import annotations

import json
import math
import warnings
from typing import Any, Dict, Iterable, Optional, Tuple

import jax
import ml_dtypes
import numpy as np

from ._version import __version__
from .arrays import QuantizedArray, check_leaves, rowmajor_scales
from .numerics import layouts, shapes
from .numerics.codec import jax_supports_dtype
from .numerics.formats import E2M1 as _E2M1, E4M3 as _E4M3, E5M2 as _E5M2, E8M0 as _E8M0, F32 as _F32
from .numerics.formats import FORMATS, as_dtype
from .ops.weightonly import LAYOUT_VERSION, READABLE_LAYOUTS, WEIGHT_FORMATS, PackedWeight

try:
  import safetensors
  import safetensors.numpy
except ImportError:  # optional dependency
  safetensors = None

__all__ = ["CONVENTIONS", "DEFAULT_CONVENTION", "from_tensors", "to_tensors", "find_weights",
           "load", "save", "STORABLE_VERSION", "is_quantized_leaf", "path_key",
           "check_storable_metadata", "tree_to_storable", "tree_from_storable", "save_tree",
           "load_tree"]

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


# ----------------------------------------------------------------------------
# pytrees for array checkpointers
# ----------------------------------------------------------------------------
#: Version of the metadata :func:`tree_to_storable` writes; :func:`tree_from_storable` reads it
#: and refuses a newer one.
STORABLE_VERSION = 1
_WHO_TO_STORABLE = "jax_gmma.checkpoint.tree_to_storable"
_WHO_FROM_STORABLE = "jax_gmma.checkpoint.tree_from_storable"
_QA, _PW = "QuantizedArray", "PackedWeight"
#: object type -> (its array fields, in pytree order; the keys of its stored dict).
_FIELDS = {_QA: ("data", "scales", "global_scale"), _PW: ("packed", "scales", "global_scale")}


def is_quantized_leaf(x) -> bool:
  """Whether ``x`` is a :class:`~jax_gmma.QuantizedArray` or a :class:`~jax_gmma.PackedWeight`
  (the ``is_leaf`` that stops ``jax.tree_util`` at these objects)."""
  return isinstance(x, (QuantizedArray, PackedWeight))


def path_key(path) -> Tuple[str, ...]:
  """A ``jax.tree_util`` key path as a tuple of str: a dict key as ``str(key)``, a sequence
  index as ``str(index)``, an attribute as its name. This is how orbax names a leaf, so a tree
  restored without a target (dicts and lists, int dict keys turned into str) has the paths of
  the tree that was saved."""
  out = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      out.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      out.append(str(k.idx))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      out.append(str(k.name))
    elif isinstance(k, jax.tree_util.FlattenedIndexKey):
      out.append(str(k.key))
    else:
      out.append(str(k))
  return tuple(out)


def _where(key) -> str:
  return "/".join(key) if key else "the root"


def _leaf_dtype(x) -> Optional[np.dtype]:
  """The NumPy dtype of an array-like leaf (None for other leaves)."""
  if not (hasattr(x, "shape") and hasattr(x, "dtype")):
    return None
  try:
    return np.dtype(x.dtype)
  except TypeError:
    return None


def _check_saveable(v, key, who: str) -> None:
  if isinstance(v, jax.core.Tracer):
    raise TypeError(f"{who}: the leaf at {_where(key)} is a tracer: save concrete arrays, outside "
                    "jax.jit / jax.vmap")
  if isinstance(v, jax.ShapeDtypeStruct):
    raise TypeError(f"{who}: the leaf at {_where(key)} is a jax.ShapeDtypeStruct (no values to "
                    "save)")


def tree_to_storable(tree, *, raw_dtypes: Iterable = ()) -> Tuple[Any, Dict[str, Any]]:
  """``(stored, metadata)``: ``tree`` with every QuantizedArray / PackedWeight replaced by a dict
  of its array fields, and the JSON-serialisable metadata :func:`tree_from_storable` rebuilds
  them from.

  A QuantizedArray becomes ``{"data", "scales"[, "global_scale"]}`` (the pytree leaves: E8M0
  scales as their uint8 bytes, no ``global_scale`` key where it is None), a PackedWeight
  ``{"packed", "scales", "global_scale"}``; other leaves and containers are kept as they are.
  Arrays of a dtype in ``raw_dtypes`` (1-byte dtypes a storage backend lacks, e.g. the FP6
  dtypes) are stored as their uint8 bytes (copied to the host) and listed in the metadata.

  ``metadata``: ``{"version": STORABLE_VERSION, "jax_gmma": version, "objects": [...],
  "raw": [...]}``; each object is ``{"path": [...], "type": "QuantizedArray", "format",
  "shape", "axis", "dtype", "layout"}`` or ``{"path", "type": "PackedWeight", "format", "n",
  "k", "fp8_exact", "layout"[, "stack"]}`` (``stack``: the leading expert axes of stacked
  experts), each raw array ``{"path", "dtype"}``; paths are
  :func:`path_key` lists. Leaves must be concrete (no tracers)."""
  who = _WHO_TO_STORABLE
  raw = set()
  for d in raw_dtypes:
    dt = np.dtype(d)
    if dt.itemsize != 1:
      raise ValueError(f"{who}: raw_dtypes must be 1-byte dtypes (stored as uint8 bytes), got "
                       f"{dt.name}")
    raw.add(dt)
  objects, raws = [], []

  def store(key, v):
    dt = _leaf_dtype(v)
    if dt is not None and dt in raw:
      _check_saveable(v, key, who)
      raws.append({"path": list(key), "dtype": dt.name})
      return _contig(np.asarray(jax.device_get(v))).view(_U8)
    return v

  def leaf(path, x):
    key = path_key(path)
    if not is_quantized_leaf(x):
      return store(key, x)
    children, _ = x.tree_flatten()
    for v in children:
      if v is not None:
        _check_saveable(v, key, who)
    if isinstance(x, QuantizedArray):
      check_leaves(x, f"{who}: {_where(key)}")
      if not all(shapes.is_constant_dim(d) for d in x.shape):
        raise ValueError(f"{who}: the QuantizedArray at {_where(key)} has a symbolic shape "
                         f"{x.shape}")
      entry = {"type": _QA, "format": x.format.name, "shape": [int(d) for d in x.shape],
               "axis": int(x.axis), "dtype": x.dtype.name, "layout": x.layout}
    else:
      lead = tuple(int(d) for d in x.packed.shape[:-3])  # stacked experts: (G, ...) in front
      one = x if not lead else jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape[len(lead):], a.dtype), x)
      for name in ("scales", "global_scale"):
        if lead and tuple(getattr(x, name).shape[:len(lead)]) != lead:
          raise ValueError(f"{who}: the stacked PackedWeight at {_where(key)}: {name} must have "
                           f"the leading axes {lead} of packed, got {tuple(getattr(x, name).shape)}")
      one.check_layout(f"{who}: {_where(key)}")
      entry = {"type": _PW, "format": x.format, "n": int(x.n), "k": int(x.k),
               "fp8_exact": x.fp8_exact, "layout": int(x.layout)}
      if lead:
        entry["stack"] = list(lead)
    objects.append({"path": list(key), **entry})
    fields = zip(_FIELDS[entry["type"]], children)
    return {name: store(key + (name,), v) for name, v in fields if v is not None}

  stored = jax.tree_util.tree_map_with_path(leaf, tree, is_leaf=is_quantized_leaf)
  meta = {"version": STORABLE_VERSION, "jax_gmma": __version__, "objects": objects, "raw": raws}
  return stored, meta


def check_storable_metadata(metadata, who: str = _WHO_FROM_STORABLE) -> Dict[str, Any]:
  """``metadata`` (from :func:`tree_to_storable`) checked: a dict of a version this jax_gmma
  reads, with lists of objects and raw arrays. ``ValueError`` naming ``who`` otherwise."""
  if not isinstance(metadata, dict) or not isinstance(metadata.get("version"), int):
    raise ValueError(f"{who}: not jax_gmma checkpoint metadata (a dict with an int 'version', "
                     f"as tree_to_storable writes), got {type(metadata).__name__}")
  version = metadata["version"]
  if version > STORABLE_VERSION or version < 1:
    raise ValueError(f"{who}: the checkpoint metadata has version {version}, this jax_gmma "
                     f"{__version__} reads version {STORABLE_VERSION} (written by jax_gmma "
                     f"{metadata.get('jax_gmma', 'unknown')}: read it with a jax_gmma that "
                     "knows that version)")
  for name in ("objects", "raw"):
    items = metadata.get(name, [])
    if not isinstance(items, list) or not all(
        isinstance(e, dict) and isinstance(e.get("path"), list) for e in items):
      raise ValueError(f"{who}: the checkpoint metadata's {name!r} must be a list of dicts with "
                       "a 'path' list")
  return metadata


def _unraw(v, dt: Optional[np.dtype], key, who: str):
  """Leaf ``v`` (a stored uint8 array) viewed as ``dt`` (``v`` itself when ``dt`` is None)."""
  if dt is None:
    return v
  got = _leaf_dtype(v)
  if got != _U8:
    raise TypeError(f"{who}: the leaf at {_where(key)} is stored as raw bytes of {dt.name} and "
                    f"must be uint8, got {got.name if got is not None else type(v).__name__}")
  if isinstance(v, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(v.shape, dt, sharding=v.sharding)
  host = _contig(np.asarray(jax.device_get(v))).view(dt)
  if isinstance(v, jax.Array) and jax_supports_dtype(dt):
    return jax.device_put(host, v.sharding)
  return host


def _as_e8m0(s):
  """uint8 scale bytes viewed as float8_e8m0fnu (arrays, NumPy arrays and ShapeDtypeStructs)."""
  if isinstance(s, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(s.shape, _E8M0, sharding=s.sharding)
  if isinstance(s, (np.ndarray, np.generic)):
    return np.asarray(s).view(_E8M0)
  return jax.lax.bitcast_convert_type(s, _E8M0)


def _newer(what: str, got, known) -> str:
  return (f"{what} {got!r} is not one this jax_gmma {__version__} knows ({known}); the "
          "checkpoint may come from a newer jax_gmma")


def _build_object(entry: Dict[str, Any], fields: Dict[str, Any], key, who: str):
  """The QuantizedArray / PackedWeight of metadata ``entry`` from its stored ``fields``."""
  where = f"{who}: the {entry.get('type')} at {_where(key)}"
  kind = entry.get("type")
  if kind not in _FIELDS:
    raise ValueError(f"{who}: the object at {_where(key)}: "
                     + _newer("type", kind, ", ".join(_FIELDS)))
  fmt = entry.get("format")
  if kind == _QA:
    if fmt not in FORMATS:
      raise ValueError(f"{where}: " + _newer("format", fmt, ", ".join(FORMATS)))
    layout = entry.get("layout")
    if layout not in layouts.LAYOUT_NAMES:
      raise ValueError(f"{where}: " + _newer("scale layout", layout,
                                            ", ".join(layouts.LAYOUT_NAMES)))
    want = _FIELDS[kind][:3 if FORMATS[fmt].has_global_scale else 2]
  else:
    if fmt not in WEIGHT_FORMATS:
      raise ValueError(f"{where}: " + _newer("format", fmt, ", ".join(WEIGHT_FORMATS)))
    layout = entry.get("layout")
    readable = READABLE_LAYOUTS[fmt]
    if layout not in readable:
      why = ("a newer jax_gmma wrote it: read it with that version" if isinstance(layout, int)
             and layout > LAYOUT_VERSION[fmt] else
             "run jax_gmma.weightonly.prepare on the original weight again")
      raise ValueError(f"{where} is in {fmt} layout version {layout!r}; this jax_gmma "
                       f"{__version__} reads version(s) {readable} ({why})")
    want = _FIELDS[kind]
  if not isinstance(fields, dict) or sorted(fields) != sorted(want):
    got = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
    raise ValueError(f"{where} must be stored as a dict of {list(want)}, got {got}")
  try:
    if kind == _QA:
      scales = fields["scales"]
      if FORMATS[fmt].scale_dtype == _E8M0 and _leaf_dtype(scales) == _U8:
        scales = _as_e8m0(scales)
      return QuantizedArray(fields["data"], scales, fields.get("global_scale"), format=fmt,
                            shape=tuple(entry["shape"]), axis=entry["axis"],
                            dtype=as_dtype(entry["dtype"]), layout=layout)
    stack = entry.get("stack")
    if not stack:
      return PackedWeight(fields["packed"], fields["scales"], fields["global_scale"], format=fmt,
                          n=entry["n"], k=entry["k"], fp8_exact=entry.get("fp8_exact"),
                          layout=layout)
    # stacked experts: the fields checked as one expert's (abstractly), then kept with their
    # leading axes (the form jax.vmap / weightonly.prepare on (G, N, K) experts gives)
    stack = tuple(int(d) for d in stack)
    arrays = [fields[f] for f in _FIELDS[kind]]
    for f, a in zip(_FIELDS[kind], arrays):
      if tuple(np.shape(a)[:len(stack)]) != stack:
        raise ValueError(f"{f} must have the leading expert axes {stack}, got shape {tuple(np.shape(a))}")
    PackedWeight(*(jax.ShapeDtypeStruct(np.shape(a)[len(stack):], _leaf_dtype(a)) for a in arrays),
                 format=fmt, n=entry["n"], k=entry["k"], layout=layout)
    return PackedWeight.tree_unflatten((fmt, int(entry["n"]), int(entry["k"]),
                                        entry.get("fp8_exact"), layout), arrays)
  except (KeyError, TypeError, ValueError) as e:
    raise type(e)(f"{where}: {e}") from None


def tree_from_storable(stored, metadata, *, who: str = _WHO_FROM_STORABLE):
  """The inverse of :func:`tree_to_storable`: ``stored`` (any pytree: the one written, or the
  dicts and lists a checkpointer restores it as) with the dict at each object path of
  ``metadata`` rebuilt into its QuantizedArray / PackedWeight, and the raw uint8 arrays viewed
  back as their dtype (copied through the host and put back on the uint8 array's sharding where
  JAX holds the dtype; NumPy arrays otherwise). Bit-exact.

  Every object goes through its constructor, which checks its fields against its format (the
  leaves may also be ``jax.ShapeDtypeStruct``: abstract objects). ``who`` names the function in
  errors: ``ValueError`` for metadata of a newer version, an unknown format, scale layout or
  PackedWeight layout version, or an object path the tree lacks."""
  meta = check_storable_metadata(metadata, who)
  objects = {tuple(str(p) for p in e["path"]): e for e in meta.get("objects", [])}
  raw = {}
  for e in meta.get("raw", []):
    try:
      raw[tuple(str(p) for p in e["path"])] = as_dtype(e.get("dtype"))
    except TypeError:
      raise ValueError(f"{who}: the raw array at {_where(tuple(e['path']))}: "
                       + _newer("dtype", e.get("dtype"), "ml_dtypes / NumPy dtypes")) from None
  found = set()

  def rebuild(path, x):
    key = path_key(path)
    entry = objects.get(key)
    if entry is None:
      return _unraw(x, raw.get(key), key, who)
    found.add(key)
    if isinstance(x, dict):
      x = {str(name): _unraw(v, raw.get(key + (str(name),)), key + (str(name),), who)
           for name, v in x.items()}
    return _build_object(entry, x, key, who)

  out = jax.tree_util.tree_map_with_path(rebuild, stored,
                                         is_leaf=lambda p, _: path_key(p) in objects,
                                         is_leaf_takes_path=True)
  missing = [k for k in objects if k not in found]
  if missing:
    shown = ", ".join(_where(k) for k in missing[:4]) + (", ..." if len(missing) > 4 else "")
    raise ValueError(f"{who}: the tree lacks {len(missing)} object(s) the metadata lists: {shown}")
  return out


# ----------------------------------------------------------------------------
# whole trees in one safetensors file
# ----------------------------------------------------------------------------
_WHO_SAVE_TREE = "jax_gmma.checkpoint.save_tree"
_WHO_LOAD_TREE = "jax_gmma.checkpoint.load_tree"
#: header keys save_tree writes (str -> str, as safetensors' metadata is)
_TREE_META, _TREE_PATHS = "jax_gmma.storable", "jax_gmma.paths"
#: 1-byte element dtypes safetensors has no name for: stored as uint8 bytes
_TREE_RAW = tuple(np.dtype(getattr(ml_dtypes, n)) for n in
                  ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "int4", "uint4")
                  if hasattr(ml_dtypes, n))


def _typed_keys(path, who: str) -> list:
  """A key path as a JSON list: a dict key (str or int) as it is, a sequence index i as [i]."""
  out = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, (str, int)) and not isinstance(k.key, bool):
      out.append(k.key)
    elif isinstance(k, jax.tree_util.SequenceKey):
      out.append([int(k.idx)])
    else:
      raise TypeError(f"{who}: the tree must be nested dicts (str or int keys), lists and tuples "
                      f"of arrays, QuantizedArray and PackedWeight objects (for a Flax NNX model: "
                      f"nnx.to_pure_dict(nnx.state(model))); got the key {k!r}")
  return out


def save_tree(path, tree, metadata: Optional[Dict[str, str]] = None) -> None:
  """Writes ``tree`` (nested dicts with str / int keys, lists and tuples of arrays and
  QuantizedArray / PackedWeight objects; e.g. ``nnx.to_pure_dict(nnx.state(model))``) to the
  safetensors file ``path``, bit-exact: one tensor per array named by its path joined with ``/``,
  the objects' static fields and the key types in the header, and ``metadata`` (str -> str)
  beside them. Leaves must be concrete arrays (no tracers); lists and tuples come back as
  lists."""
  _need_safetensors(_WHO_SAVE_TREE)
  if metadata is not None and (not isinstance(metadata, dict) or not all(
      isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
    raise TypeError(f"{_WHO_SAVE_TREE}: metadata must be a dict of str -> str, got {metadata!r}")
  if metadata and any(k in (_TREE_META, _TREE_PATHS) for k in metadata):
    raise ValueError(f"{_WHO_SAVE_TREE}: metadata keys {_TREE_META!r} and {_TREE_PATHS!r} are "
                     "jax_gmma's own")
  stored, meta = tree_to_storable(tree, raw_dtypes=_TREE_RAW)
  tensors, paths = {}, {}
  for p, v in jax.tree_util.tree_flatten_with_path(stored)[0]:
    keys = _typed_keys(p, _WHO_SAVE_TREE)
    name = "/".join(str(k[0] if isinstance(k, list) else k) for k in keys)
    if name in tensors:
      raise ValueError(f"{_WHO_SAVE_TREE}: two leaves have the path {name!r} (a str and an int "
                       "key with the same text)")
    _check_saveable(v, path_key(p), _WHO_SAVE_TREE)
    tensors[name] = _contig(np.asarray(jax.device_get(v)))
    paths[name] = keys
  header = {**(metadata or {}), _TREE_META: json.dumps(meta), _TREE_PATHS: json.dumps(paths)}
  safetensors.numpy.save_file(tensors, path, metadata=header)


def _tree_header(path) -> Dict[str, str]:
  with open(path, "rb") as f:
    n = int.from_bytes(f.read(8), "little")
    if n <= 0 or n > 100 * 2 ** 20:
      raise ValueError(f"{_WHO_LOAD_TREE}: {path} is no safetensors file (header size {n})")
    head = json.loads(f.read(n))
  return head.get("__metadata__") or {}


def load_tree(path):
  """The tree :func:`save_tree` wrote to the safetensors file ``path``: nested dicts (and lists
  where the tree had lists or tuples) with every QuantizedArray / PackedWeight rebuilt through
  its checking constructor, bit-exact; NumPy arrays (place them with ``jax.device_put``; for
  Flax NNX: ``nnx.replace_by_pure_dict(state, tree)``). A file without save_tree's header, or
  one whose tensors disagree with it, is refused by name."""
  _need_safetensors(_WHO_LOAD_TREE)
  header = _tree_header(path)
  if _TREE_META not in header or _TREE_PATHS not in header:
    raise ValueError(f"{_WHO_LOAD_TREE}: {path} has no jax_gmma tree header (it was not written by "
                     "jax_gmma.checkpoint.save_tree; for published quantized checkpoints use "
                     "jax_gmma.checkpoint.load)")
  meta = json.loads(header[_TREE_META])
  paths = json.loads(header[_TREE_PATHS])
  tensors = _read_file(path)
  missing = sorted(set(paths) - set(tensors))
  if missing:
    raise ValueError(f"{_WHO_LOAD_TREE}: {path} lacks the tensors {missing[:4]} its header lists "
                     "(a truncated or edited file)")
  # nodes keyed by (is a sequence index, key); sequences become lists in index order
  root: Dict[Any, Any] = {}
  for name, keys in paths.items():
    node = root
    typed = [(True, k[0]) if isinstance(k, list) else (False, k) for k in keys]
    for k in typed[:-1]:
      node = node.setdefault(k, {})
    node[typed[-1]] = tensors[name]

  def build(node):
    if not isinstance(node, dict):
      return node
    if node and all(seq for seq, _ in node):
      return [build(node[(True, i)]) for i in sorted(k for _, k in node)]
    return {k: build(v) for (_, k), v in node.items()}

  return tree_from_storable(build(root), meta, who=_WHO_LOAD_TREE)
