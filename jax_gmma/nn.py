"""Flax NNX layers on jax-gmma's GEMMs (needs ``flax``: ``pip install 'jax-gmma[nn]'``).

``import jax_gmma.nn`` (the package itself never imports flax) gives:

* :class:`QuantizedLinear`: ``y = x @ w.T + b`` with the weight held in a jax-gmma weight format
  (a :class:`~jax_gmma.QuantizedArray` or a :class:`~jax_gmma.PackedWeight`), computed by
  :func:`jax_gmma.dot`. For inference, and as the frozen base layer of QLoRA
  (``nnx.LoRA(..., base_module=QuantizedLinear(...))``).
* :class:`QuantizedEinsum`: the same for the einsum projections of transformer code
  (``"btd,dnh->btnh"``, ``"btnh,nhd->btd"``), built from an ``nnx.Einsum``.
* :class:`Fp8Linear`: a trainable layer (float master weight, ``nnx.Param``, laid out as
  ``nnx.Linear``'s) whose forward and backward GEMMs run in FP8 (:func:`jax_gmma.fp8_linear`).
* :func:`quantize_model`: converts the ``nnx.Linear`` / ``nnx.Einsum`` layers of a model in
  place, by rules on their paths, and returns a :class:`QuantizationSummary`.
* :func:`dot_general`: a ``dot_general`` for ``nnx.Linear(..., dot_general=...)`` that quantizes
  the float kernel on every call.

**Format specs** (the ``format`` argument everywhere here):

* ``FMT``: a :class:`~jax_gmma.QuantizedArray` weight format ``jax_gmma.dot`` multiplies
  (``jax_gmma.ops.QUANTIZED_WEIGHT_FORMATS``: ``fp8_tensor``, ``fp8_channel``, ``fp8_128x128``,
  ``fp8_1x128``, ``mxfp8``, ``nvfp4``, ``mxfp4``, ``mxfp6_e2m3``, ``mxfp6_e3m2``). The
  activation is quantized on every call as ``jax_gmma.dot`` does for that weight (FP8 per token
  for ``fp8_tensor`` / ``fp8_channel``, FP8 1x128 blocks for the block-scaled FP8 formats, the
  weight's own format for MX / NVFP4; ``x_format`` overrides where ``jax_gmma.dot`` allows).
* ``wo:FMT``, FMT in ``jax_gmma.weightonly.WEIGHT_FORMATS`` (``nvfp4``, ``mxfp4``,
  ``mxfp6_e2m3``, ``mxfp6_e3m2``): the FP4 / FP6 *weight-only* GEMM, a
  :class:`~jax_gmma.PackedWeight` (:func:`jax_gmma.weightonly.prepare`) times bf16 activations
  (float32 / float16 x is rounded to bf16; no activation quantization). N must be a multiple
  of 16.

Every layer keeps its weight in the kernels' (N, K) = (out, in) layout in a
:class:`QuantizedParam` variable; the weight's arrays are named pytree leaves, so
``nnx.state(layer)`` shows paths such as ``kernel/value/data``, ``kernel/value/scales``
(``packed`` / ``scales`` / ``global_scale`` for a PackedWeight). ``QuantizedParam`` is no
``nnx.Param``: optimizers and ``nnx.grad`` (which differentiate ``nnx.Param`` by default) leave
the quantized weight alone, while the biases (``nnx.Param``) stay trainable. The layers work
with ``nnx.split`` / ``nnx.merge``, ``nnx.state`` / ``nnx.update``, ``nnx.eval_shape`` and
``nnx.jit``.

The GEMMs run jax-gmma's CUTLASS kernels on a Hopper GPU with the kernels built, and the
pure-JAX reference elsewhere (CPU included).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import MutableMapping, MutableSequence
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

try:
  from flax import nnx
except ImportError as e:  # the optional dependency (pyproject extra "nn")
  raise ImportError("jax_gmma.nn needs flax (Flax NNX): pip install 'jax-gmma[nn]' (or flax)") from e

from . import ops, primitive
from .api import dot
from .arrays import QuantizedArray, check_leaves
from .ops import weightonly
from .ops.quantize import quantize
from .ops.weightonly import PackedWeight
from .train import RECIPES, fp8_linear

__all__ = [
  "QuantizedParam", "QuantizedLinear", "QuantizedEinsum", "Fp8Linear", "quantize_model",
  "QuantizationSummary", "LayerSummary", "dot_general", "DotGeneral", "quantize_weight",
  "parse_format", "format_label", "einsum_plan", "einsum_weight", "EinsumPlan", "WEIGHT_FORMATS",
  "WEIGHTONLY_PREFIX",
]

#: Prefix of the weight-only format specs (``"wo:nvfp4"``).
WEIGHTONLY_PREFIX = "wo:"
#: Every format spec the layers take: the QuantizedArray formats ``jax_gmma.dot`` multiplies,
#: then the weight-only ones (``"wo:FMT"``).
WEIGHT_FORMATS = tuple(ops.QUANTIZED_WEIGHT_FORMATS) + tuple(
  WEIGHTONLY_PREFIX + f for f in weightonly.WEIGHT_FORMATS)
#: Kinds :func:`parse_format` returns.
KIND_QUANTIZED = "quantized"
KIND_WEIGHTONLY = "weightonly"

Weight = Union[QuantizedArray, PackedWeight]


class QuantizedParam(nnx.Variable):
  """An NNX variable holding a quantized weight (:class:`~jax_gmma.QuantizedArray` or
  :class:`~jax_gmma.PackedWeight`; read it with ``.get_value()``). Its arrays are the pytree
  leaves of the weight (``data`` / ``scales`` / ``global_scale``, or ``packed`` / ``scales`` /
  ``global_scale``). Not an ``nnx.Param``: filters and optimizers that select ``nnx.Param``
  leave it out (the weight is frozen); select it with ``nnx.state(model, QuantizedParam)``."""


# ----------------------------------------------------------------------------------------------
# format specs and weights
# ----------------------------------------------------------------------------------------------

def parse_format(format, who: str = "jax_gmma.nn.parse_format") -> Tuple[str, str]:
  """``(kind, format name)`` of a format spec: ``("quantized", FMT)`` for a QuantizedArray format
  ``jax_gmma.dot`` multiplies, ``("weightonly", FMT)`` for ``"wo:FMT"``. Raises ``TypeError``
  (not a string) or ``ValueError`` (no such spec; the message lists them), naming ``who``."""
  if not isinstance(format, str):
    raise TypeError(f"{who}: format must be a format spec (str), one of {', '.join(WEIGHT_FORMATS)}, "
                    f"got {type(format).__name__}")
  spec = format.strip()
  if spec.startswith(WEIGHTONLY_PREFIX):
    fmt = spec[len(WEIGHTONLY_PREFIX):]
    if fmt not in weightonly.WEIGHT_FORMATS:
      raise ValueError(f"{who}: format {format!r}: the FP4/FP6 weight-only GEMM has no format "
                       f"{fmt!r}; weight-only specs: "
                       f"{', '.join(WEIGHTONLY_PREFIX + f for f in weightonly.WEIGHT_FORMATS)}")
    return KIND_WEIGHTONLY, fmt
  if spec in ops.QUANTIZED_WEIGHT_FORMATS:
    return KIND_QUANTIZED, spec
  hint = ""
  if spec.startswith("emu:"):
    hint = " (the layers run jax-gmma GEMMs; there is no emulated 'emu:' kind here)"
  raise ValueError(f"{who}: unknown format {format!r}{hint}; formats: {', '.join(WEIGHT_FORMATS)}")


def format_label(w: Weight) -> str:
  """The format spec of a quantized weight (``"fp8_channel"``, ``"wo:nvfp4"``)."""
  if isinstance(w, PackedWeight):
    return WEIGHTONLY_PREFIX + w.format
  return w.format.name


def quantize_weight(w, format, *, who: str = "jax_gmma.nn.quantize_weight") -> Weight:
  """An (N, K) = (out, in) float weight in format spec ``format`` (module docstring): a
  :class:`~jax_gmma.QuantizedArray` quantized along K (``jax_gmma.quantize(w, FMT)``) or, for
  ``"wo:FMT"``, a :class:`~jax_gmma.PackedWeight` (``jax_gmma.weightonly.prepare(w, FMT)``).
  Works under ``jax.jit`` and ``nnx.eval_shape``. (An ``nnx.Linear`` kernel is (K, N): pass its
  transpose.) Errors name ``who``."""
  kind, fmt = parse_format(format, who)
  if isinstance(w, (QuantizedArray, PackedWeight)):
    raise TypeError(f"{who}: w is already a {type(w).__name__}; pass the float (N, K) weight")
  try:
    w = jnp.asarray(w)
  except TypeError:
    raise TypeError(f"{who}: w must be a float (N, K) array, got {type(w).__name__}") from None
  if not jnp.issubdtype(w.dtype, jnp.floating):
    raise TypeError(f"{who}: w must be a float (N, K) array, got {np.dtype(w.dtype).name}")
  if w.ndim != 2:
    raise ValueError(f"{who}: w must be a 2-D (N, K) weight, got shape {tuple(w.shape)}")
  try:
    if kind == KIND_WEIGHTONLY:
      return weightonly.prepare(w, fmt)
    return quantize(w, fmt)
  except (TypeError, ValueError) as e:
    raise type(e)(f"{who}: format {format!r}, (N, K) = {tuple(w.shape)}: {e}") from None


def _check_weight(kernel, who: str) -> Tuple[int, int]:
  """(N, K) of a quantized weight a layer can hold, else the error naming ``who``."""
  if isinstance(kernel, PackedWeight):
    kernel.check_layout(who)
    return kernel.n, kernel.k
  if not isinstance(kernel, QuantizedArray):
    raise TypeError(f"{who}: kernel must be a jax_gmma.QuantizedArray or jax_gmma.PackedWeight of an "
                    "(N, K) = (out, in) weight (jax_gmma.nn.quantize_weight(w, format) makes one; "
                    f"from_linear / from_einsum convert a float layer), got {type(kernel).__name__}")
  if kernel.ndim != 2:
    raise ValueError(f"{who}: kernel must be a 2-D (N, K) = (out, in) weight, got a QuantizedArray "
                     f"of shape {kernel.shape}")
  if kernel.format.name not in ops.QUANTIZED_WEIGHT_FORMATS:
    raise ValueError(f"{who}: kernel has format {kernel.format.name!r}, which jax_gmma.dot does not "
                     f"multiply; formats: {', '.join(ops.QUANTIZED_WEIGHT_FORMATS)}")
  check_leaves(kernel, f"{who}: kernel")
  n, k = kernel.canonical_shape
  return int(n), int(k)


def _check_options(kernel: Weight, out_dtype, x_format, who: str):
  """(out_dtype as a numpy dtype or None, x_format) checked for ``kernel``."""
  if out_dtype is not None:
    out_dtype = primitive.out_dtype_or_error(out_dtype, who)
  if x_format is not None:
    if not isinstance(x_format, str):
      raise TypeError(f"{who}: x_format must be None or a format name (str), got {x_format!r}")
    if isinstance(kernel, PackedWeight):
      raise ValueError(f"{who}: x_format must be None for a weight-only ({format_label(kernel)}) "
                       f"kernel: its GEMM multiplies bf16 activations, got {x_format!r}")
  return out_dtype, x_format


def _dot_kwargs(out_dtype, x_format) -> dict:
  kw = {"out_dtype": out_dtype}
  if x_format is not None:
    kw["x_format"] = x_format
  return kw


def _probe(kernel: Weight, bias, k: int, out_dtype, x_format, who: str) -> None:
  """Traces one abstract ``jax_gmma.dot`` call of a (1, K) float32 x with the layer's weight, so
  that a shape or option the GEMM refuses fails when the layer is built (naming ``who``), not
  at its first call. Nothing runs."""
  kw = _dot_kwargs(out_dtype, x_format)
  try:
    jax.eval_shape(lambda x, w, b: dot(x, w, bias=b, **kw),
                   jax.ShapeDtypeStruct((1, k), jnp.float32), kernel, bias)
  except (TypeError, ValueError) as e:
    raise type(e)(f"{who}: jax_gmma.dot cannot multiply this {format_label(kernel)} weight "
                  f"(N, K) = ({_nk(kernel)[0]}, {k}): {e}") from None


def _renamed(cls, who: str, *args, **kwargs):
  """``cls(*args, **kwargs)``, its errors naming ``who`` (the constructor the user called, e.g.
  ``QuantizedLinear.from_linear``) instead of the class."""
  try:
    return cls(*args, **kwargs)
  except (TypeError, ValueError) as e:
    msg = str(e)
    prefix = f"{cls.__name__}:"
    raise type(e)(who + msg[len(cls.__name__):] if msg.startswith(prefix) else msg) from None


def _nk(w: Weight) -> Tuple[int, int]:
  if isinstance(w, PackedWeight):
    return w.n, w.k
  n, k = w.canonical_shape
  return int(n), int(k)


def _nbytes(tree) -> int:
  """Bytes of the arrays of a pytree as stored (size x itemsize; abstract arrays too)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      total += int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
  return total


def _value(var):
  """The value of an optional variable (None stays None)."""
  return None if var is None else var.get_value()


# ----------------------------------------------------------------------------------------------
# QuantizedLinear
# ----------------------------------------------------------------------------------------------

class QuantizedLinear(nnx.Module):
  """``y = x @ w.T + bias`` on a quantized (N, K) = (out_features, in_features) weight, computed
  by :func:`jax_gmma.dot`.

  Args:
    kernel: the weight: a :class:`~jax_gmma.QuantizedArray` of a 2-D weight in a format
      ``jax_gmma.dot`` multiplies (canonical shape (N, K), e.g. ``jax_gmma.quantize(w,
      "fp8_channel")``), or a :class:`~jax_gmma.PackedWeight` (``jax_gmma.weightonly.prepare``).
      :func:`quantize_weight` makes either from a float weight and a format spec.
    bias: optional float (N,) vector, kept as an ``nnx.Param`` (trainable).
    out_dtype: output dtype (bfloat16, float16 or float32); None: ``jax_gmma.dot``'s default
      (x's dtype for float16 / float32 x, bfloat16 x gives bfloat16).
    x_format: activation format passed to ``jax_gmma.dot`` (None: its default for the weight);
      must be None for a weight-only kernel.

  ``__call__(x)``: x (..., in_features) float -> (..., out_features); any number of leading
  dims. Differentiable with respect to x and the bias (the weight is a constant, see
  :func:`jax_gmma.dot`). Attributes: ``kernel`` (:class:`QuantizedParam`), ``bias``
  (``nnx.Param`` or None), ``in_features``, ``out_features``, ``format`` (the spec,
  e.g. ``"wo:nvfp4"``), ``out_dtype``, ``x_format``.

  The constructor traces one abstract ``jax_gmma.dot`` call, so a weight shape the format's
  GEMM cannot serve (e.g. K not a multiple of 16 for FP8 per-channel weights) is refused here.
  """

  def __init__(self, kernel: Weight, bias=None, *, out_dtype=None, x_format: Optional[str] = None):
    who = type(self).__name__
    n, k = _check_weight(kernel, who)
    bias = primitive.check_bias(bias, n, who)
    out_dtype, x_format = _check_options(kernel, out_dtype, x_format, who)
    _probe(kernel, bias, k, out_dtype, x_format, who)
    self.kernel = QuantizedParam(kernel)
    self.bias = nnx.data(None) if bias is None else nnx.Param(bias)
    self.in_features = k
    self.out_features = n
    self.format = format_label(kernel)
    self.out_dtype = out_dtype
    self.x_format = x_format

  @classmethod
  def from_linear(cls, linear, format: str, *, out_dtype=None,
                  x_format: Optional[str] = None) -> "QuantizedLinear":
    """The layer of an ``nnx.Linear`` with its kernel (in, out) = (K, N) quantized along K in
    format spec ``format`` (module docstring) and its bias kept. ``out_dtype`` defaults to the
    Linear's ``dtype`` (its computation dtype, None: x's dtype). Works under ``nnx.eval_shape``
    (an abstract layer for restoring a checkpoint)."""
    who = f"{cls.__name__}.from_linear"
    _check_plain(linear, nnx.Linear, who, "linear")
    parse_format(format, who)
    kernel = linear.kernel.get_value()
    if kernel.ndim != 2:
      raise ValueError(f"{who}: the Linear's kernel must be 2-D (in_features, out_features), got "
                       f"shape {tuple(kernel.shape)}")
    w = quantize_weight(jnp.asarray(kernel).T, format, who=who)
    if out_dtype is None:
      out_dtype = linear.dtype
    return _renamed(cls, who, w, _value(linear.bias), out_dtype=out_dtype, x_format=x_format)

  def __call__(self, x):
    x = jnp.asarray(x)
    if x.ndim < 1 or x.shape[-1] != self.in_features:
      raise ValueError(f"QuantizedLinear: x must be (..., in_features) with in_features = "
                       f"{self.in_features}, got shape {tuple(x.shape)}")
    return dot(x, self.kernel.get_value(), bias=_value(self.bias),
               **_dot_kwargs(self.out_dtype, self.x_format))


# ----------------------------------------------------------------------------------------------
# QuantizedEinsum
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EinsumPlan:
  """How an einsum ``x, kernel -> y`` becomes ``x (..., K) @ w (N, K).T``: the kernel's axes
  ``perm`` (free axes in output order, then the contracted axes in x's order) reshaped to
  (N, K); ``k_shape`` the contracted dims (trailing dims of x), ``n_shape`` the kernel's free
  dims (trailing dims of y); ``x_rank`` the rank of x (None with a leading ``...``)."""
  equation: str
  kernel_shape: Tuple[int, ...]
  perm: Tuple[int, ...]
  k_shape: Tuple[int, ...]
  n_shape: Tuple[int, ...]
  x_rank: Optional[int]

  @property
  def n(self) -> int:
    return int(np.prod(self.n_shape, dtype=np.int64))

  @property
  def k(self) -> int:
    return int(np.prod(self.k_shape, dtype=np.int64))


def einsum_plan(equation: str, kernel_shape, who: str = "QuantizedEinsum") -> EinsumPlan:
  """The :class:`EinsumPlan` of ``equation`` with a kernel of ``kernel_shape``, or a
  ``ValueError`` naming ``who`` and the equation. Served: two operands, explicit ``->``, the
  contracted labels the trailing dims of x (in any order in the kernel), every other label of
  x kept in the output in x's order, then the kernel's other labels (in any order); an optional
  leading ``...`` on x and the output."""
  eq = equation.replace(" ", "") if isinstance(equation, str) else equation
  if not isinstance(eq, str):
    raise TypeError(f"{who}: einsum_str must be a str, got {type(equation).__name__}")
  kernel_shape = tuple(int(d) for d in kernel_shape)

  def bad(rule):
    return ValueError(f"{who}: einsum {equation!r} is not supported: {rule}")

  if "->" not in eq or eq.count(",") != 1 or eq.count("->") != 1:
    raise bad("it must be explicit with two operands, 'x,kernel->y'")
  ins, out = eq.split("->")
  lhs, rhs = ins.split(",")
  ellipsis = lhs.startswith("...")
  if ellipsis != out.startswith("..."):
    raise bad("a '...' must lead both x and the output (or neither)")
  if ellipsis:
    lhs, out = lhs[3:], out[3:]
  for name, s in (("x", lhs), ("kernel", rhs), ("output", out)):
    if not all(c.isalpha() for c in s):
      raise bad(f"the {name} labels {s!r} must be letters ('...' only leading x and the output)")
    if len(set(s)) != len(s):
      raise bad(f"a label repeats in the {name} labels {s!r} (no diagonals or traces)")
  if len(rhs) != len(kernel_shape):
    raise bad(f"the kernel labels {rhs!r} do not match the kernel shape {kernel_shape}")
  contracted = [c for c in lhs if c in rhs]
  if not contracted:
    raise bad("no label is contracted between x and the kernel")
  shared = [c for c in contracted if c in out]
  if shared:
    raise bad(f"labels {''.join(shared)!r} of both x and the kernel are kept in the output (a "
              "batched weight); only contracted dims may be shared")
  batch = [c for c in lhs if c not in rhs]
  free = [c for c in rhs if c not in lhs]
  if lhs != "".join(batch) + "".join(contracted):
    raise bad(f"the contracted labels {''.join(contracted)!r} must be the trailing dims of x "
              f"{lhs!r}")
  summed = [c for c in free if c not in out]
  if summed:
    raise bad(f"kernel labels {''.join(summed)!r} are summed away (not in the output)")
  dropped = [c for c in batch if c not in out]
  if dropped:
    raise bad(f"x labels {''.join(dropped)!r} are summed away (not in the output)")
  if out[:len(batch)] != "".join(batch) or sorted(out[len(batch):]) != sorted(free):
    raise bad(f"the output {out!r} must be x's kept labels {''.join(batch)!r} in order, then "
              f"the kernel's labels {''.join(free)!r}")
  perm = tuple(rhs.index(c) for c in out[len(batch):]) + tuple(rhs.index(c) for c in contracted)
  return EinsumPlan(
    equation=equation, kernel_shape=kernel_shape, perm=perm,
    k_shape=tuple(kernel_shape[rhs.index(c)] for c in contracted),
    n_shape=tuple(kernel_shape[rhs.index(c)] for c in out[len(batch):]),
    x_rank=None if ellipsis else len(lhs))


def einsum_weight(kernel, plan: EinsumPlan):
  """The float einsum kernel as the (N, K) weight of ``plan`` (transposed and reshaped)."""
  kernel = jnp.asarray(kernel)
  return jnp.transpose(kernel, plan.perm).reshape(plan.n, plan.k)


class QuantizedEinsum(nnx.Module):
  """An einsum projection ``jnp.einsum(einsum_str, x, kernel) + bias`` on a quantized weight:
  x's contracted (trailing) dims are folded into K, the kernel's other dims into N, and the
  product is one :func:`jax_gmma.dot`.

  Args:
    einsum_str: the equation, as ``nnx.Einsum`` takes it (``"btd,dnh->btnh"``,
      ``"btnh,nhd->btd"``, ``"...d,df->...f"``); see :func:`einsum_plan` for the forms served.
    kernel_shape: the shape of the float einsum kernel.
    kernel: the (N, K) quantized weight: ``quantize_weight(einsum_weight(kernel, plan),
      format)`` (``from_einsum`` does this).
    bias: optional float bias of N elements in any shape (``nnx.Einsum``'s ``bias_shape``,
      e.g. (n, h)); stored as given.
    out_dtype, x_format: as for :class:`QuantizedLinear`.

  Unsupported equations raise a ``ValueError`` naming ``QuantizedEinsum`` and the equation.
  """

  def __init__(self, einsum_str: str, kernel_shape, kernel: Weight, bias=None, *, out_dtype=None,
               x_format: Optional[str] = None):
    who = type(self).__name__
    plan = einsum_plan(einsum_str, kernel_shape, who)
    n, k = _check_weight(kernel, who)
    if (n, k) != (plan.n, plan.k):
      raise ValueError(f"{who}: einsum {einsum_str!r} with kernel shape {plan.kernel_shape} needs "
                       f"an (N, K) = ({plan.n}, {plan.k}) weight, got ({n}, {k})")
    flat_bias = None
    if bias is not None:
      bias = jnp.asarray(bias)
      if int(bias.size) != n:
        raise ValueError(f"{who}: einsum {einsum_str!r}: bias must have N = {n} elements (the "
                         f"kernel's output dims {plan.n_shape}), got shape {tuple(bias.shape)}")
      flat_bias = primitive.check_bias(bias.reshape(n), n, who)
    out_dtype, x_format = _check_options(kernel, out_dtype, x_format, who)
    _probe(kernel, flat_bias, k, out_dtype, x_format, who)
    self.kernel = QuantizedParam(kernel)
    self.bias = nnx.data(None) if bias is None else nnx.Param(bias)
    self.einsum_str = einsum_str
    self.kernel_shape = plan.kernel_shape
    self.plan = plan
    self.format = format_label(kernel)
    self.out_dtype = out_dtype
    self.x_format = x_format

  @classmethod
  def from_einsum(cls, einsum, format: str, *, out_dtype=None,
                  x_format: Optional[str] = None) -> "QuantizedEinsum":
    """The layer of an ``nnx.Einsum`` (its ``einsum_str``, kernel and bias), the kernel
    quantized in format spec ``format``. ``out_dtype`` defaults to the Einsum's ``dtype``."""
    who = f"{cls.__name__}.from_einsum"
    _check_plain(einsum, nnx.Einsum, who, "einsum")
    if einsum.einsum_str is None:
      raise ValueError(f"{who}: the Einsum has no einsum_str (it is given per call); the "
                       "quantized layer needs the equation when it is built")
    parse_format(format, who)
    kernel = jnp.asarray(einsum.kernel.get_value())
    plan = einsum_plan(einsum.einsum_str, kernel.shape, who)
    w = quantize_weight(einsum_weight(kernel, plan), format, who=who)
    if out_dtype is None:
      out_dtype = einsum.dtype
    return _renamed(cls, who, einsum.einsum_str, kernel.shape, w, _value(einsum.bias),
                    out_dtype=out_dtype, x_format=x_format)

  def __call__(self, x):
    plan = self.plan
    x = jnp.asarray(x)
    nk = len(plan.k_shape)
    if ((plan.x_rank is not None and x.ndim != plan.x_rank) or x.ndim < nk
        or tuple(x.shape[x.ndim - nk:]) != plan.k_shape):
      want = ("" if plan.x_rank is None else f"rank {plan.x_rank}, ") + f"trailing dims {plan.k_shape}"
      raise ValueError(f"QuantizedEinsum: einsum {self.einsum_str!r}: x must have {want}, got "
                       f"shape {tuple(x.shape)}")
    lead = tuple(x.shape[:x.ndim - nk])
    bias = self.bias
    b = None if bias is None else bias.get_value().reshape(plan.n)
    y = dot(x.reshape(*lead, plan.k), self.kernel.get_value(), bias=b,
            **_dot_kwargs(self.out_dtype, self.x_format))
    return y.reshape(*lead, *plan.n_shape)


# ----------------------------------------------------------------------------------------------
# Fp8Linear
# ----------------------------------------------------------------------------------------------

def _constant(value):
  """An initializer returning ``value`` (``from_linear``: no random initialization)."""
  return lambda key, shape, dtype=None: value


class Fp8Linear(nnx.Module):
  """A trainable linear layer whose forward and backward GEMMs run in FP8:
  ``y = jax_gmma.fp8_linear(x, kernel.T, bias, recipe=recipe)``.

  The master weight is a float ``nnx.Param`` of shape (in_features, out_features), initialized
  as ``nnx.Linear`` does (LeCun normal kernel, zero bias): its state has ``nnx.Linear``'s
  structure, and :meth:`from_linear` takes one over. Gradients flow to x, the kernel and the
  bias (``nnx.grad``, optax through ``nnx.Optimizer``).

  Args:
    in_features, out_features: K and N: multiples of 16 (of 128 for ``recipe="blockwise"``).
    use_bias, dtype, param_dtype, kernel_init, bias_init, rngs: as for ``nnx.Linear``.
      ``dtype``: the computation dtype (x, kernel and bias are cast to it, bfloat16 / float16 /
      float32); None: x's and the kernel's result type, as ``nnx.Linear`` computes.
    recipe: ``"tensor"`` (per-tensor current scaling, e5m2 gradients) or ``"blockwise"``
      (DeepSeek-V3's 1x128 / 128x128 blocks); see :mod:`jax_gmma.train`.
    fast_accum_fwd, fast_accum_bwd: recipe ``"tensor"`` only (see :func:`jax_gmma.fp8_linear`).
  """

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True, dtype=None,
               param_dtype=jnp.float32, kernel_init: Callable = nnx.initializers.lecun_normal(),
               bias_init: Callable = nnx.initializers.zeros_init(), recipe: str = "tensor",
               fast_accum_fwd: Optional[bool] = None, fast_accum_bwd: Optional[bool] = None,
               rngs: nnx.Rngs):
    who = type(self).__name__
    if recipe not in RECIPES:
      raise ValueError(f"{who}: recipe must be one of {RECIPES}, got {recipe!r}")
    for name, v in (("in_features", in_features), ("out_features", out_features)):
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{who}: {name} must be a positive int, got {v!r}")
    align = 128 if recipe == "blockwise" else 16
    if in_features % align or out_features % align:
      raise ValueError(f"{who}: recipe={recipe!r} needs in_features (K) and out_features (N) "
                       f"multiples of {align} (the FP8 GEMMs' rule), got in_features = "
                       f"{in_features}, out_features = {out_features}")
    if recipe == "blockwise" and (fast_accum_fwd is not None or fast_accum_bwd is not None):
      raise ValueError(f"{who}: fast_accum_fwd / fast_accum_bwd apply to recipe='tensor' only (the "
                       "block-scaled kernels promote every 128 of K)")
    if dtype is not None:
      dtype = primitive.out_dtype_or_error(dtype, who, name="dtype")
    self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
    self.bias = (nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias
                 else nnx.data(None))
    self.in_features = int(in_features)
    self.out_features = int(out_features)
    self.use_bias = bool(use_bias)
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.recipe = recipe
    self.fast_accum_fwd = fast_accum_fwd
    self.fast_accum_bwd = fast_accum_bwd

  @classmethod
  def from_linear(cls, linear, *, recipe: str = "tensor", fast_accum_fwd: Optional[bool] = None,
                  fast_accum_bwd: Optional[bool] = None) -> "Fp8Linear":
    """The FP8 training layer of an ``nnx.Linear``: the same kernel and bias values (copies of
    its variables, metadata included), ``dtype`` and ``param_dtype``."""
    who = f"{cls.__name__}.from_linear"
    _check_plain(linear, nnx.Linear, who, "linear")
    layer = _renamed(cls, who, linear.in_features, linear.out_features,
                     use_bias=linear.bias is not None, dtype=linear.dtype,
                     param_dtype=linear.param_dtype, kernel_init=_constant(linear.kernel.get_value()),
                     bias_init=_constant(_value(linear.bias)), recipe=recipe,
                     fast_accum_fwd=fast_accum_fwd, fast_accum_bwd=fast_accum_bwd, rngs=nnx.Rngs(0))
    layer.kernel = linear.kernel.copy()
    if linear.bias is not None:
      layer.bias = linear.bias.copy()
    return layer

  def __call__(self, x):
    x = jnp.asarray(x)
    if x.ndim < 1 or x.shape[-1] != self.in_features:
      raise ValueError(f"Fp8Linear: x must be (..., in_features) with in_features = "
                       f"{self.in_features}, got shape {tuple(x.shape)}")
    kernel = self.kernel.get_value()
    bias = _value(self.bias)
    if self.dtype is not None:
      x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
      bias = None if bias is None else bias.astype(self.dtype)
      out_dtype = self.dtype
    else:
      out_dtype = jnp.result_type(x.dtype, kernel.dtype)
    fast = ({} if self.recipe == "blockwise" else
            {"fast_accum_fwd": self.fast_accum_fwd, "fast_accum_bwd": self.fast_accum_bwd})
    return fp8_linear(x, kernel.T, bias, out_dtype=out_dtype, recipe=self.recipe, **fast)


# ----------------------------------------------------------------------------------------------
# dot_general for nnx.Linear
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DotGeneral:
  """A ``dot_general`` for ``nnx.Linear(..., dot_general=...)`` (made by :func:`dot_general`):
  ``lhs (..., K) @ rhs`` with the float kernel ``rhs`` quantized to ``format`` on every call
  and multiplied by :func:`jax_gmma.dot`. Hashable (a static attribute of the Linear)."""
  format: str
  x_format: Optional[str] = None
  out_dtype: Any = None

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
               out_sharding=None):
    who = "jax_gmma.nn.dot_general"
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    try:
      (lc, rc), (lb, rb) = dimension_numbers
      lc, rc, lb, rb = (tuple(int(a) for a in t) for t in (lc, rc, lb, rb))
    except (TypeError, ValueError):
      raise ValueError(f"{who}: dimension_numbers must be ((lhs_contract, rhs_contract), "
                       f"(lhs_batch, rhs_batch)), got {dimension_numbers!r}") from None
    if (rhs.ndim != 2 or lhs.ndim < 1 or lb or rb or lc not in ((lhs.ndim - 1,), (-1,))
        or rc not in ((0,), (1,), (-2,), (-1,))):
      raise ValueError(f"{who}: serves lhs (..., K) contracted on its last axis with a 2-D rhs "
                       "(K, N) (contracting axis 0, nnx.Linear's kernel) or (N, K) (axis 1), no "
                       f"batch dims; got lhs shape {tuple(lhs.shape)}, rhs shape "
                       f"{tuple(rhs.shape)}, dimension_numbers {dimension_numbers!r}")
    if out_sharding is not None:
      raise ValueError(f"{who}: out_sharding must be None (the quantized GEMM follows the operands' "
                       f"shardings), got {out_sharding!r}")
    out_dtype = self.out_dtype if preferred_element_type is None else preferred_element_type
    if out_dtype is not None:
      out_dtype = primitive.out_dtype_or_error(out_dtype, who, name="preferred_element_type")
    w = rhs.T if rc[0] % 2 == 0 else rhs  # (N, K)
    if lhs.shape[-1] != w.shape[1]:
      raise ValueError(f"{who}: contraction mismatch: lhs has K = {lhs.shape[-1]}, rhs has K = "
                       f"{w.shape[1]} (shapes {tuple(lhs.shape)}, {tuple(rhs.shape)})")
    return _ste_dot(lhs, w, (self.format, self.x_format, out_dtype))


def dot_general(format: str, *, x_format: Optional[str] = None, out_dtype=None) -> DotGeneral:
  """A ``dot_general`` for ``nnx.Linear(..., dot_general=jax_gmma.nn.dot_general("fp8_channel"))``:
  the Linear keeps its float kernel, and every call quantizes it to format spec ``format``
  (module docstring) and multiplies with :func:`jax_gmma.dot` (the quantization runs in every
  call: for inference, convert the layer once with :class:`QuantizedLinear` instead).

  Served: ``lhs`` (..., K) contracted on its last axis with a 2-D ``rhs``, (K, N) (what
  ``nnx.Linear`` passes) or (N, K); other dimension numbers raise a ``ValueError``.
  ``preferred_element_type`` (or ``out_dtype``) sets the output dtype; ``precision`` is
  ignored (the quantized GEMM fixes the arithmetic).

  Differentiable in both operands: the activation's gradient is ``jax_gmma.dot``'s; the kernel's
  passes straight through the weight quantization (``dw = x.T @ g`` in float32), so a Linear
  built with it trains with quantization in the forward pass."""
  who = "jax_gmma.nn.dot_general"
  parse_format(format, who)
  if x_format is not None and not isinstance(x_format, str):
    raise TypeError(f"{who}: x_format must be None or a format name (str), got {x_format!r}")
  if x_format is not None and format.startswith(WEIGHTONLY_PREFIX):
    raise ValueError(f"{who}: x_format must be None for a weight-only format ({format!r}): its "
                     f"GEMM multiplies bf16 activations, got {x_format!r}")
  if out_dtype is not None:
    out_dtype = primitive.out_dtype_or_error(out_dtype, who)
  return DotGeneral(format=format.strip(), x_format=x_format, out_dtype=out_dtype)


def _quantized_dot(x, w, static):
  fmt, x_format, out_dtype = static
  wq = quantize_weight(w, fmt, who="jax_gmma.nn.dot_general")
  return dot(x, wq, **_dot_kwargs(out_dtype, x_format)), wq


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _ste_dot(x, w, static):
  return _quantized_dot(x, w, static)[0]


def _ste_fwd(x, w, static):
  y, wq = _quantized_dot(x, w, static)
  return y, (x, wq, jnp.zeros((0,), w.dtype))


def _ste_bwd(static, res, g):
  _, x_format, out_dtype = static
  x, wq, w_like = res
  kw = _dot_kwargs(out_dtype, x_format)
  _, vjp = jax.vjp(lambda x_: dot(x_, wq, **kw), x)
  (dx,) = vjp(g)
  n, k = g.shape[-1], x.shape[-1]
  dw = jax.lax.dot_general(g.reshape(-1, n).astype(jnp.float32), x.reshape(-1, k).astype(jnp.float32),
                           (((0,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                           preferred_element_type=jnp.float32)
  return dx, dw.astype(w_like.dtype)


_ste_dot.defvjp(_ste_fwd, _ste_bwd)


# ----------------------------------------------------------------------------------------------
# quantize_model
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LayerSummary:
  """One ``nnx.Linear`` / ``nnx.Einsum`` layer :func:`quantize_model` looked at.

  Attributes:
    path: the module path (``"layers/0/mlp/up"``).
    layer: ``"Linear"`` or ``"Einsum"``.
    kernel_shape: the float kernel's shape.
    format: the format spec it was converted to, None when left float.
    rule: the pattern of the rule that matched, None when none did.
    bytes_before: bytes of the float kernel and bias.
    bytes_after: bytes of the layer's weights afterwards (the quantized arrays as stored, e.g.
      one byte per element for an FP4 QuantizedArray, two elements per byte in a PackedWeight;
      plus the bias); ``bytes_before`` when left float.
    note: why a layer a rule converts was left float (``skip_unsupported=True``), else "".
  """
  path: str
  layer: str
  kernel_shape: Tuple[int, ...]
  format: Optional[str]
  rule: Optional[str]
  bytes_before: int
  bytes_after: int
  note: str = ""

  @property
  def converted(self) -> bool:
    return self.format is not None

  @property
  def weights(self) -> int:
    """Number of kernel elements."""
    return int(np.prod(self.kernel_shape, dtype=np.int64))


def _fmt_bytes(b: int) -> str:
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if b >= scale:
      return f"{b / scale:.1f} {unit}"
  return f"{b} B"


@dataclasses.dataclass(frozen=True)
class QuantizationSummary:
  """What :func:`quantize_model` did: one :class:`LayerSummary` per ``nnx.Linear`` /
  ``nnx.Einsum`` layer found (in path order), with totals. ``str(summary)`` is a table."""
  layers: Tuple[LayerSummary, ...]

  @property
  def converted(self) -> Tuple[LayerSummary, ...]:
    return tuple(s for s in self.layers if s.converted)

  @property
  def bytes_before(self) -> int:
    return sum(s.bytes_before for s in self.layers)

  @property
  def bytes_after(self) -> int:
    return sum(s.bytes_after for s in self.layers)

  def __len__(self) -> int:
    return len(self.layers)

  def __iter__(self) -> Iterator[LayerSummary]:
    return iter(self.layers)

  def __str__(self) -> str:
    header = ("path", "layer", "kernel", "format", "before", "after", "ratio")
    rows = []
    for s in self.layers:
      fmt = s.format if s.converted else ("float" + (" (unsupported, see below)" if s.note else
                                                      "" if s.rule is not None else " (no rule)"))
      ratio = f"{s.bytes_before / s.bytes_after:.2f}x" if s.bytes_after else "-"
      rows.append((s.path or "(root)", s.layer, "x".join(map(str, s.kernel_shape)), fmt,
                   _fmt_bytes(s.bytes_before), _fmt_bytes(s.bytes_after), ratio))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    right = {4, 5, 6}

    def line(r):
      return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    before, after = self.bytes_before, self.bytes_after
    total = (f"{len(self.converted)} of {len(self.layers)} layers quantized: "
             f"{_fmt_bytes(before)} -> {_fmt_bytes(after)}"
             + (f" ({before / after:.2f}x smaller)" if after else ""))
    notes = [f"{s.path}: left float: {s.note}" for s in self.layers if s.note]
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows), total,
                      *notes])


def _rules(rules, who: str) -> List[Tuple[Any, Optional[str], str]]:
  """[(compiled pattern, format spec or None, pattern text)], every spec checked."""
  if isinstance(rules, Mapping):
    rules = list(rules.items())
  if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
    raise TypeError(f"{who}: rules must be a sequence of (regex, format or None) pairs, got "
                    f"{type(rules).__name__}")
  out = []
  for i, rule in enumerate(rules):
    if not isinstance(rule, (tuple, list)) or len(rule) != 2:
      raise TypeError(f"{who}: rules[{i}] must be a (regex, format or None) pair, got {rule!r}")
    pattern, fmt = rule
    try:
      rx = re.compile(pattern)
    except (re.error, TypeError) as e:
      raise ValueError(f"{who}: rules[{i}]: {pattern!r} is not a regular expression: {e}") from None
    if fmt is not None:
      parse_format(fmt, f"{who}: rules[{i}] ({rx.pattern!r})")
      fmt = fmt.strip()
    out.append((rx, fmt, rx.pattern))
  return out


def _setter(parent, key, who: str, path: str):
  """A function that replaces ``parent``'s child ``key``, or the error for a parent whose child
  cannot be replaced in place."""
  if isinstance(parent, nnx.Module) and not isinstance(parent, (MutableSequence, MutableMapping)):
    return lambda new: setattr(parent, key, new)
  if not isinstance(parent, (MutableSequence, MutableMapping)):
    raise TypeError(f"{who}: cannot replace layer {path!r} in place: it is held in a "
                    f"{type(parent).__name__} (use a list, dict, nnx.List or nnx.Dict)")

  def put(new):
    parent[key] = new
  return put


def _check_plain(layer, cls, who: str, name: str) -> None:
  """``layer`` is an ``cls`` (nnx.Linear / nnx.Einsum) computing what ``cls`` computes (a
  subclass overriding ``__call__``, such as ``nnx.LoRALinear``, is refused)."""
  if not isinstance(layer, cls):
    raise TypeError(f"{who}: {name} must be an nnx.{cls.__name__}, got {type(layer).__name__}")
  if type(layer).__call__ is not cls.__call__:
    raise TypeError(f"{who}: {name} is a {type(layer).__name__}, which overrides "
                    f"nnx.{cls.__name__}.__call__; only the plain nnx.{cls.__name__} computation "
                    "can be converted")


def quantize_model(model, rules, *, verbose: bool = False, skip_unsupported: bool = False,
                   x_format: Optional[str] = None) -> QuantizationSummary:
  """Converts the ``nnx.Linear`` layers of ``model`` to :class:`QuantizedLinear` and its
  ``nnx.Einsum`` layers to :class:`QuantizedEinsum`, in place, by rules on their paths.

  ``rules``: a sequence (or an ordered mapping) of ``(regex, format)`` pairs. Each layer's
  module path, its attribute names and list indices joined by ``/`` (``"layers/0/mlp/up"``),
  is matched against the regexes in order with ``re.search`` (anchor with ``^``/``$`` for a
  whole path); the first match decides: a format spec (module docstring) converts the layer,
  None leaves it float. A layer no rule matches stays float. Only layers of exactly these
  classes are converted (subclasses such as ``nnx.LoRALinear`` change the computation and are
  left alone). A layer shared at several paths is converted once (matched by its first path)
  and replaced at every path.

  Nothing runs the model; each layer's kernel is quantized once. Every conversion is made
  before any layer is replaced, so an error leaves the model unchanged. A layer whose shape its
  format's GEMM cannot serve raises (naming the path and the rule) unless ``skip_unsupported``,
  which leaves it float and says why in the summary. ``x_format`` is passed to every
  :class:`QuantizedLinear` / :class:`QuantizedEinsum` except weight-only ones.

  Returns a :class:`QuantizationSummary` (printed when ``verbose``). To build an abstract
  quantized model for restoring a checkpoint, run the conversion inside ``nnx.eval_shape``.
  """
  who = "jax_gmma.nn.quantize_model"
  compiled = _rules(rules, who)
  if x_format is not None and not isinstance(x_format, str):
    raise TypeError(f"{who}: x_format must be None or a format name (str), got {x_format!r}")
  if type(model) in (nnx.Linear, nnx.Einsum):
    raise TypeError(f"{who}: model is itself an nnx.{type(model).__name__} and cannot be replaced "
                    "in place; use QuantizedLinear.from_linear / QuantizedEinsum.from_einsum")
  entries, new, layers = [], {}, {}
  for path, node in nnx.iter_graph(model):
    if type(node) not in (nnx.Linear, nnx.Einsum):
      continue
    name = "/".join(str(p) for p in path)
    layers[name] = node
    kernel = node.kernel.get_value()
    before = _nbytes(kernel) + _nbytes(_value(node.bias))
    layer = type(node).__name__
    rule = next(((fmt, text) for rx, fmt, text in compiled if rx.search(name)), None)
    if rule is None or rule[0] is None:
      entries.append(LayerSummary(name, layer, tuple(kernel.shape), None,
                                  None if rule is None else rule[1], before, before))
      continue
    fmt, text = rule
    xf = None if fmt.startswith(WEIGHTONLY_PREFIX) else x_format
    try:
      if layer == "Linear":
        q = QuantizedLinear.from_linear(node, fmt, x_format=xf)
      else:
        q = QuantizedEinsum.from_einsum(node, fmt, x_format=xf)
    except (TypeError, ValueError) as e:
      if not skip_unsupported:
        raise type(e)(f"{who}: layer {name!r} (nnx.{layer}, kernel {tuple(kernel.shape)}), rule "
                      f"{text!r} -> {fmt!r}: {e}") from None
      msg = str(e)
      reason = msg.split(": ", 1)[1] if ": " in msg else msg
      entries.append(LayerSummary(name, layer, tuple(kernel.shape), None, text, before, before,
                                  note=f"{fmt}: {reason}"))
      continue
    after = _nbytes(q.kernel.get_value()) + _nbytes(_value(q.bias))
    entries.append(LayerSummary(name, layer, tuple(kernel.shape), fmt, text, before, after))
    new[id(node)] = q
  # Every reference to a converted layer (shared layers have several), found before any change.
  setters, found = [], set()
  for path, node in nnx.iter_graph(model):
    if isinstance(node, nnx.Variable) or not isinstance(node, (nnx.Pytree, list, dict, tuple)):
      continue
    for key, child in nnx.iter_children(node):
      if id(child) in new:
        name = "/".join(str(p) for p in (*path, key))
        setters.append((_setter(node, key, who, name), new[id(child)]))
        found.add(id(child))
  missed = [s.path for s in entries if s.converted and id(layers[s.path]) not in found]
  if missed:
    raise TypeError(f"{who}: cannot replace layers {missed} in place (not held by a module, list "
                    "or dict)")
  for put, q in setters:
    put(q)
  summary = QuantizationSummary(tuple(entries))
  if verbose:
    print(summary)
  return summary
