"""qwix integration: jax-gmma's GEMMs behind ``qwix.quantize_model`` (needs ``qwix``:
``pip install 'jax-gmma[qwix]'``).

``import jax_gmma.qwix_provider`` (the package itself never imports qwix) gives:

* :class:`GmmaProvider`: a qwix PTQ provider. ``qwix.quantize_model(model, GmmaProvider(rules),
  x)`` returns a Flax NNX model whose rule-matched ``nnx.Linear`` / ``nnx.Einsum`` layers (and
  other weight products through ``jax.lax.dot_general``, ``jnp.dot`` or ``jnp.einsum``) hold
  their weight quantized once in a jax-gmma format, in the kernels' (N, K) = (out, in)
  layout, and multiply it with :func:`jax_gmma.dot`.
* :func:`quantize_with_qwix_rules`: the same rules applied without qwix's interception: the
  layers are replaced by :class:`jax_gmma.nn.QuantizedLinear` / ``QuantizedEinsum`` through
  :func:`jax_gmma.nn.quantize_model` (nothing runs the model; the bias is fused into the GEMM).
* :func:`gmma_format`: the jax-gmma format spec a ``qwix.QuantizationRule`` maps to.

**Rules.** ``qwix.QuantizationRule(module_path=REGEX, weight_qtype=..., act_qtype=...,
tile_size=...)``, matched as qwix matches them (``re.fullmatch`` on the module path, first
match wins, ``op_names`` honoured). Rules with ``weight_qtype=None`` leave their layers float.
The qtypes map to jax-gmma's formats (:func:`gmma_format`):

=====================  ===================  =============  ===========================
``weight_qtype``       ``act_qtype``        ``tile_size``  format
=====================  ===================  =============  ===========================
``float8_e4m3fn``      ``float8_e4m3fn``    None           ``fp8_channel``
``float8_e4m3fn``      ``float8_e4m3fn``    128            ``fp8_1x128`` (or ``fp8_128x128``)
``"mxfp8"``            ``"mxfp8"``          None or 32     ``mxfp8``
``"mxfp4"``            ``"mxfp4"``          None or 32     ``mxfp4``
``"nvfp4"``            ``"nvfp4"``          None or 16     ``nvfp4``
``"mxfp4"``            None                 None or 32     ``wo:mxfp4`` (weight-only GEMM)
``"nvfp4"``            None                 None or 16     ``wo:nvfp4`` (weight-only GEMM)
=====================  ===================  =============  ===========================

The numerics are qwix's: weights per output channel (FP8; 128-element blocks along K with
``tile_size=128``: one scale per output channel and 128 of K, jax-gmma's ``fp8_1x128``;
``fp8_block_format="fp8_128x128"`` picks 128 x 128 weight blocks instead) or in MX / NVFP4
blocks along K; activations quantized on every call per token (per token and 128 of K for the
block-scaled FP8 formats, the weight's own MX / NVFP4 blocks for those formats), all with
absmax scales. jax-gmma's NVFP4 adds a per-tensor float32 scale over qwix's e4m3 block scales.
Refused with a ``ValueError`` naming the provider and the rule: qtypes without a jax-gmma GEMM
(``int8``, ``int4``, ``nf4``, ``float8_e5m2``, plain ``float4_e2m1fn``, ...); FP8 or MXFP8
weights without activation quantization (``act_qtype=None``: jax-gmma's FP8 GEMMs quantize
the activation too; the weight-only GEMM takes FP4 / FP6 weights); mismatched activation
qtypes; other tile sizes; calibration methods other than ``absmax``; static activation scales.

**How the provider works.** It is a ``qwix.PtqProvider`` and uses the same hooks: qwix wraps
the model's ``__call__`` and intercepts ``jax.lax.dot_general`` / ``jnp.dot`` /
``jnp.einsum``; the provider's :meth:`GmmaProvider.dot_general` / :meth:`GmmaProvider.einsum`
see the rule of the module making the call. On the first call (the one ``qwix.quantize_model``
makes with the sample input) a matched product whose right operand is one of the module's
``nnx.Param`` s has that parameter replaced on the module by a :class:`GmmaWeight` (the
quantized weight, its arrays held as :class:`jax_gmma.nn.QuantizedParam` variables), so the
float weight is quantized once; every later call finds the :class:`GmmaWeight` and runs one
:func:`jax_gmma.dot`. The quantized model works with ``nnx.jit``, ``nnx.split`` /
``nnx.merge`` and ``jax.make_jaxpr`` like any qwix PTQ model.

**Limitations.** Flax NNX models only (a linen model raises a ``TypeError``). Served products:
``x (..., K)`` contracted on its last axis with a 2-D kernel (contracted on either axis, no
batch dims), and two-operand einsums of the forms :func:`jax_gmma.nn.einsum_plan` serves;
another weight product under a matched rule raises (exclude it with a rule whose
``weight_qtype`` is None). A matched product of two activations (no weight) stays float.
Convolutions under a matched rule raise (restrict the rule with ``op_names=("dot_general",
"einsum")``). ``qwix.quantize_params`` (quantizing a float checkpoint into an abstract PTQ
model) does not know these weights: quantize the float model with ``qwix.quantize_model``, or
restore a checkpoint of the quantized model's state (``nnx.eval_shape(lambda:
qwix.quantize_model(...))`` builds the abstract model). Sharding annotations of the float kernel
are not carried to the quantized arrays. Only the method qwix wraps (the model's ``__call__``)
runs the provider: calling a quantized submodule on its own raises a ``TypeError``. The
provider builds on qwix's provider internals (``qwix._src``: the current module, the parameter
lookup), tested with qwix 0.1.8.

The GEMMs run jax-gmma's CUTLASS kernels on a Hopper GPU with the kernels built (the FP4
``QuantizedArray`` formats ``mxfp4`` / ``nvfp4`` need Blackwell; on Hopper use their
weight-only forms), and the pure-JAX reference elsewhere (CPU included).
"""
from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

try:
  import flax.struct
  import qwix
  from flax import nnx
  from qwix._src.providers import ptq as qwix_ptq
  from qwix._src.utils import flax_util as qwix_flax_util
except ImportError as e:  # the optional dependency (pyproject extra "qwix")
  raise ImportError("jax_gmma.qwix_provider needs qwix (and flax): pip install 'jax-gmma[qwix]' "
                    "(or qwix)") from e

from . import primitive
from .api import dot
from .nn import (WEIGHTONLY_PREFIX, EinsumPlan, QuantizationSummary, QuantizedParam, einsum_plan,
                 einsum_weight, quantize_model, quantize_weight)

__all__ = ["GmmaProvider", "GmmaWeight", "gmma_format", "quantize_with_qwix_rules",
           "FP8_BLOCK_FORMATS"]

#: The weight formats ``tile_size=128`` FP8 rules may map to (``fp8_block_format``).
FP8_BLOCK_FORMATS = ("fp8_1x128", "fp8_128x128")

_PROVIDER = "jax_gmma.qwix_provider.GmmaProvider"
_FP8 = "float8_e4m3fn"
#: weight qtype -> (activation qtype -> format), for the rules with activation quantization
#: (None: the weight-only GEMM).
_FORMATS = {
  "mxfp8": {"mxfp8": "mxfp8"},
  "mxfp4": {"mxfp4": "mxfp4", None: WEIGHTONLY_PREFIX + "mxfp4"},
  "nvfp4": {"nvfp4": "nvfp4", None: WEIGHTONLY_PREFIX + "nvfp4"},
}
#: The block size along K of each MX / NVFP4 qtype (the only tile_size its rule may give).
_BLOCK = {"mxfp8": 32, "mxfp4": 32, "nvfp4": 16}
_SERVED = ("weight_qtype float8_e4m3fn with act_qtype float8_e4m3fn (tile_size None: "
           "fp8_channel; 128: fp8_1x128 / fp8_128x128), 'mxfp8' with act 'mxfp8', 'mxfp4' / "
           "'nvfp4' with the same act_qtype, or with act_qtype None for the weight-only GEMM")


def _qtype_name(qtype) -> Optional[str]:
  """A qwix qtype as a name: 'float8_e4m3fn' for jnp.float8_e4m3fn, strings as given."""
  if qtype is None or isinstance(qtype, str):
    return qtype
  try:
    return np.dtype(qtype).name
  except TypeError:
    return repr(qtype)


def _describe(rule) -> str:
  return (f"module_path={rule.module_path!r}, weight_qtype={_qtype_name(rule.weight_qtype)!r}, "
          f"act_qtype={_qtype_name(rule.act_qtype)!r}, tile_size={rule.tile_size!r}")


def gmma_format(rule, *, fp8_block_format: str = "fp8_1x128", who: str = "jax_gmma.qwix_provider"
                ) -> Optional[str]:
  """The jax-gmma format spec (``"fp8_channel"``, ``"wo:nvfp4"``, ... as :mod:`jax_gmma.nn`
  takes them) of a ``qwix.QuantizationRule``, None when its ``weight_qtype`` is None (the rule
  leaves its layers float). The table is in the module docstring; a rule jax-gmma has no GEMM
  for raises a ``ValueError`` naming ``who`` and the rule. ``fp8_block_format``: the weight
  format of FP8 rules with ``tile_size=128`` (``"fp8_1x128"``, qwix's own blocking, or
  ``"fp8_128x128"``)."""
  if not isinstance(rule, qwix.QuantizationRule):
    raise TypeError(f"{who}: rules must be qwix.QuantizationRule objects, got "
                    f"{type(rule).__name__}")
  if fp8_block_format not in FP8_BLOCK_FORMATS:
    raise ValueError(f"{who}: fp8_block_format must be one of {FP8_BLOCK_FORMATS}, got "
                     f"{fp8_block_format!r}")
  weight, act, tile = _qtype_name(rule.weight_qtype), _qtype_name(rule.act_qtype), rule.tile_size

  def bad(why):
    return ValueError(f"{who}: rule ({_describe(rule)}): {why}")

  if weight is None:
    return None
  if weight == _FP8:
    if act != _FP8:
      if act is None:
        raise bad("jax-gmma's FP8 GEMMs quantize the activation too (per token); set "
                  "act_qtype=jnp.float8_e4m3fn, or use weight_qtype 'nvfp4' / 'mxfp4' with "
                  "act_qtype None for the weight-only GEMM")
      raise bad(f"FP8 weights pair with act_qtype float8_e4m3fn in jax-gmma, got {act!r}")
    fmt = {None: "fp8_channel", 128: fp8_block_format}.get(tile)
    if fmt is None or isinstance(tile, bool):
      raise bad(f"FP8 weights take tile_size None (per channel) or 128 (blocks of 128 along K), "
                f"got {tile!r}")
  elif weight in _FORMATS:
    pairs = _FORMATS[weight]
    if act not in pairs:
      acts = " or ".join(repr(a) for a in pairs)
      raise bad(f"weight_qtype {weight!r} pairs with act_qtype {acts} in jax-gmma, got {act!r}")
    fmt = pairs[act]
    if tile not in (None, _BLOCK[weight]) or isinstance(tile, bool):
      raise bad(f"{weight} has blocks of {_BLOCK[weight]} along K: tile_size must be None or "
                f"{_BLOCK[weight]}, got {tile!r}")
  else:
    raise bad(f"jax-gmma has no GEMM for weight_qtype {weight!r}; it serves {_SERVED}. Quantize "
              "these layers with qwix.PtqProvider, or exclude them with a rule whose "
              "weight_qtype is None")
  if rule.weight_calibration_method != "absmax":
    raise bad(f"jax-gmma quantizes weights with absmax scales; weight_calibration_method must be "
              f"'absmax', got {rule.weight_calibration_method!r}")
  if rule.act_calibration_method not in (None, "absmax"):
    raise bad(f"jax-gmma quantizes activations with absmax scales; act_calibration_method must be "
              f"None or 'absmax', got {rule.act_calibration_method!r}")
  if rule.act_static_scale:
    raise bad("jax-gmma quantizes activations with a scale computed on every call; "
              "act_static_scale must be None or False")
  return fmt


# ----------------------------------------------------------------------------------------------
# the quantized weight a module holds
# ----------------------------------------------------------------------------------------------

def _unboxed(tree):
  """``tree`` with its ``nnx.Variable`` leaves replaced by their values."""
  return jax.tree.map(lambda v: v.get_value() if isinstance(v, nnx.Variable) else v, tree,
                      is_leaf=lambda v: isinstance(v, nnx.Variable))


@flax.struct.dataclass
class GmmaWeight:
  """A module weight quantized by :class:`GmmaProvider`: ``weight`` is the (N, K) = (out, in)
  :class:`~jax_gmma.QuantizedArray` or :class:`~jax_gmma.PackedWeight` that
  :func:`jax_gmma.dot` multiplies. On the module its arrays are
  :class:`jax_gmma.nn.QuantizedParam` variables (``nnx.state(model, QuantizedParam)``; paths
  such as ``kernel/weight/data``), not ``nnx.Param``: optimizers leave them alone.

  Static fields: ``format`` (the spec, e.g. ``"fp8_channel"``, ``"wo:nvfp4"``),
  ``kernel_shape`` / ``kernel_dtype`` (the float weight's; ``shape``, ``ndim`` and ``dtype``
  report them, so module code reading them, such as ``nnx.Einsum``'s bias broadcast, works),
  ``contract`` (for a ``dot_general`` weight: the kernel axis contracted, 0 for
  ``nnx.Linear``'s (in, out) kernel) or ``plan`` (for an einsum weight: its
  :class:`jax_gmma.nn.EinsumPlan`). ``w[...]`` (how ``nnx.Linear`` reads its kernel) and
  ``w.value`` give it with plain arrays."""
  weight: Any
  format: str = flax.struct.field(pytree_node=False)
  kernel_shape: Tuple[int, ...] = flax.struct.field(pytree_node=False)
  kernel_dtype: str = flax.struct.field(pytree_node=False)
  contract: Optional[int] = flax.struct.field(pytree_node=False, default=None)
  plan: Optional[EinsumPlan] = flax.struct.field(pytree_node=False, default=None)

  shape = property(lambda self: self.kernel_shape)
  ndim = property(lambda self: len(self.kernel_shape))
  dtype = property(lambda self: np.dtype(self.kernel_dtype))

  @property
  def value(self) -> "GmmaWeight":
    """This weight with plain arrays (its variables unboxed)."""
    return self.replace(weight=_unboxed(self.weight))

  def __jax_array__(self):
    raise TypeError(f"GmmaWeight: a quantized {self.format} weight of shape {self.kernel_shape} is "
                    "no array; it is multiplied by jax_gmma.dot inside the method qwix quantized "
                    "(call the quantized model, not the submodule on its own)")

  def __getitem__(self, key):
    if key is not Ellipsis and key != ():
      raise TypeError(f"GmmaWeight: a quantized {self.format} weight can only be read whole "
                      f"([...]), got index {key!r}")
    return self.value


nnx.register_data_type(GmmaWeight)


# ----------------------------------------------------------------------------------------------
# the provider
# ----------------------------------------------------------------------------------------------

class GmmaProvider(qwix.PtqProvider):
  """A ``qwix.PtqProvider`` that quantizes rule-matched weights into jax-gmma formats and runs
  their products with :func:`jax_gmma.dot` (module docstring)::

    rules = [qwix.QuantizationRule(module_path=r".*mlp.*", weight_qtype=jnp.float8_e4m3fn,
                                   act_qtype=jnp.float8_e4m3fn)]
    qmodel = qwix.quantize_model(model, GmmaProvider(rules), x)

  Args:
    rules: ``qwix.QuantizationRule`` s, in order of precedence. Every rule is checked here
      (:func:`gmma_format`): one jax-gmma has no GEMM for raises a ``ValueError`` naming the
      provider and the rule.
    fp8_block_format: the weight format of FP8 rules with ``tile_size=128``: ``"fp8_1x128"``
      (one scale per output channel and 128 of K, as qwix blocks weights) or ``"fp8_128x128"``.
    disable_jit: as for ``qwix.PtqProvider``.

  Attribute ``formats``: the format spec of each rule (None: left float), in rule order.
  """

  def __init__(self, rules: Sequence[Any], *, fp8_block_format: str = "fp8_1x128",
               disable_jit: bool = False):
    if isinstance(rules, (str, bytes, qwix.QuantizationRule)) or not isinstance(rules, Sequence):
      raise TypeError(f"{_PROVIDER}: rules must be a sequence of qwix.QuantizationRule, got "
                      f"{type(rules).__name__}")
    formats = []
    for i, rule in enumerate(rules):
      formats.append(gmma_format(rule, fp8_block_format=fp8_block_format,
                                 who=f"{_PROVIDER}: rules[{i}]"))
    super().__init__(rules, disable_jit=disable_jit)
    self.formats: Tuple[Optional[str], ...] = tuple(formats)
    self.fp8_block_format = fp8_block_format
    self._format_of = {id(r): f for r, f in zip(self._rules, formats)}

  # -- helpers -----------------------------------------------------------------------------------

  def _where(self, rule) -> str:
    path = "/".join(map(str, qwix_flax_util.get_current_module_path()))
    fmt = self._format_of[id(rule)]
    return f"{_PROVIDER}: module {path!r}, rule ({_describe(rule)}) -> {fmt!r}"

  def _weight_name(self, rhs, rule) -> Optional[str]:
    """The name of the module's float parameter ``rhs`` is, None for an activation."""
    if isinstance(rhs, qwix_ptq.WithAux):
      raise TypeError(f"{self._where(rule)}: this weight was already quantized by qwix's own "
                      "PtqProvider; quantize the float model with GmmaProvider instead")
    return qwix_flax_util.find_param(rhs)

  def _store(self, name: str, weight: GmmaWeight, rule) -> None:
    """Replaces the current module's float parameter ``name`` by ``weight``."""
    module = qwix_flax_util.get_current_module()
    if not isinstance(module, nnx.Module):
      raise TypeError(f"{self._where(rule)}: GmmaProvider quantizes Flax NNX models; got a "
                      f"{type(module).__name__} (linen)")
    setattr(module, name, jax.tree.map(QuantizedParam, weight))

  def _quantize(self, w_nk, rule, kernel, **layout) -> GmmaWeight:
    fmt = self._format_of[id(rule)]
    try:
      q = quantize_weight(w_nk, fmt, who=self._where(rule))
    except (TypeError, ValueError) as e:
      raise type(e)(f"{e} (exclude this module with a rule whose weight_qtype is None)") from None
    return GmmaWeight(weight=q, format=fmt, kernel_shape=tuple(int(d) for d in kernel.shape),
                      kernel_dtype=np.dtype(kernel.dtype).name, **layout)

  def _out_dtype(self, preferred_element_type, out_sharding, rule):
    if out_sharding is not None:
      raise ValueError(f"{self._where(rule)}: out_sharding must be None (the quantized GEMM "
                       f"follows the operands' shardings), got {out_sharding!r}")
    if preferred_element_type is None:
      return None
    return primitive.out_dtype_or_error(preferred_element_type, self._where(rule),
                                        name="preferred_element_type")

  def _dot(self, x, weight: GmmaWeight, out_dtype, rule):
    """``jax_gmma.dot(x, weight)``, its errors (a shape the format's GEMM cannot serve, such as
    K not a multiple of 16 for FP8) naming the module and the rule."""
    try:
      return dot(x, weight.value.weight, out_dtype=out_dtype)
    except (TypeError, ValueError) as e:
      raise type(e)(f"{self._where(rule)}: {e} (exclude this module with a rule whose weight_qtype "
                    "is None)") from None

  # -- intercepted ops ---------------------------------------------------------------------------

  def dot_general(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                  *, out_sharding=None):
    """``jax.lax.dot_general`` under the model: a matched product of an activation ``lhs``
    (..., K) with a 2-D weight ``rhs`` runs :func:`jax_gmma.dot` on the weight quantized once
    (module docstring); anything else runs ``jax.lax.dot_general``."""
    rule, _ = self._get_current_rule_and_op_id("dot_general")

    def plain():
      return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                 preferred_element_type=preferred_element_type,
                                 out_sharding=out_sharding)

    if rule is None or rule.weight_qtype is None:
      return plain()
    if not isinstance(rhs, GmmaWeight):
      name = self._weight_name(rhs, rule)
      if name is None:  # a product of two activations: no weight to quantize
        return plain()
    lhs = jnp.asarray(lhs)
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = (tuple(int(a) for a in t) for t in (lc, rc, lb, rb))
    nd = len(rhs.shape)
    if (nd != 2 or lhs.ndim < 1 or lb or rb or lc not in ((lhs.ndim - 1,), (-1,))
        or rc not in ((0,), (1,), (-2,), (-1,))):
      raise ValueError(f"{self._where(rule)}: serves x (..., K) contracted on its last axis with a "
                       f"2-D weight (contracted on either axis, no batch dims); got x shape "
                       f"{tuple(lhs.shape)}, weight shape {tuple(rhs.shape)}, dimension_numbers "
                       f"{dimension_numbers!r} (exclude this module with a rule whose weight_qtype "
                       "is None)")
    contract = rc[0] % 2
    if not isinstance(rhs, GmmaWeight):
      kernel = jnp.asarray(rhs)
      rhs = self._quantize(kernel.T if contract == 0 else kernel, rule, kernel, contract=contract)
      self._store(name, rhs, rule)
    elif rhs.plan is not None or rhs.contract != contract:
      raise ValueError(f"{self._where(rule)}: the weight was quantized for "
                       + (f"einsum {rhs.plan.equation!r}" if rhs.plan is not None else
                          f"contraction on its axis {rhs.contract}")
                       + f", now used with dot_general dimension_numbers {dimension_numbers!r}")
    k = rhs.kernel_shape[contract]
    if lhs.shape[-1] != k:
      raise ValueError(f"{self._where(rule)}: contraction mismatch: x has K = {lhs.shape[-1]}, the "
                       f"weight {rhs.kernel_shape} has K = {k}")
    out_dtype = self._out_dtype(preferred_element_type, out_sharding, rule)
    return self._dot(lhs, rhs, out_dtype, rule)

  def einsum(self, einsum_str, *operands, precision=None, preferred_element_type=None,
             _dot_general=jax.lax.dot_general, out_sharding=None):
    """``jnp.einsum`` under the model: a matched two-operand einsum of an activation with a
    weight, of a form :func:`jax_gmma.nn.einsum_plan` serves, runs :func:`jax_gmma.dot` on the
    weight quantized once; anything else runs ``jnp.einsum``."""
    rule, _ = self._get_current_rule_and_op_id("einsum")

    def plain():
      return jnp.einsum(einsum_str, *operands, precision=precision,
                        preferred_element_type=preferred_element_type, _dot_general=_dot_general,
                        out_sharding=out_sharding)

    if rule is None or rule.weight_qtype is None or len(operands) != 2:
      return plain()
    lhs, rhs = operands
    if not isinstance(rhs, GmmaWeight):
      name = self._weight_name(rhs, rule)
      if name is None:
        return plain()
    equation = einsum_str.replace(" ", "") if isinstance(einsum_str, str) else einsum_str
    if not isinstance(rhs, GmmaWeight):
      kernel = jnp.asarray(rhs)
      try:
        plan = einsum_plan(equation, kernel.shape, self._where(rule))
      except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (exclude this module with a rule whose weight_qtype is None)") from None
      rhs = self._quantize(einsum_weight(kernel, plan), rule, kernel, plan=plan)
      self._store(name, rhs, rule)
    elif rhs.plan is None or rhs.plan.equation != equation:
      raise ValueError(f"{self._where(rule)}: the weight was quantized for "
                       + (f"einsum {rhs.plan.equation!r}" if rhs.plan is not None
                          else "dot_general")
                       + f", now used with einsum {einsum_str!r}")
    plan = rhs.plan
    x = jnp.asarray(lhs)
    nk = len(plan.k_shape)
    if ((plan.x_rank is not None and x.ndim != plan.x_rank) or x.ndim < nk
        or tuple(x.shape[x.ndim - nk:]) != plan.k_shape):
      raise ValueError(f"{self._where(rule)}: einsum {einsum_str!r}: x must end in dims "
                       f"{plan.k_shape}, got shape {tuple(x.shape)}")
    out_dtype = self._out_dtype(preferred_element_type, out_sharding, rule)
    lead = tuple(x.shape[:x.ndim - nk])
    y = self._dot(x.reshape(*lead, plan.k), rhs, out_dtype, rule)
    return y.reshape(*lead, *plan.n_shape)

  def conv_general_dilated(self, lhs, rhs, *args, **kwargs):
    """Convolutions have no jax-gmma GEMM: one under a rule that quantizes weights raises;
    otherwise ``jax.lax.conv_general_dilated`` runs."""
    rule, _ = self._get_current_rule_and_op_id("conv_general_dilated", only_rule=True)
    if rule is not None and rule.weight_qtype is not None:
      raise ValueError(f"{self._where(rule)}: jax-gmma has no convolution; restrict the rule to "
                       "op_names=('dot_general', 'einsum') or exclude this module")
    return jax.lax.conv_general_dilated(lhs, rhs, *args, **kwargs)


# ----------------------------------------------------------------------------------------------
# the rules without interception
# ----------------------------------------------------------------------------------------------

def _gmma_rules(rules, fp8_block_format: str, who: str) -> List[Tuple[str, Optional[str]]]:
  """qwix rules as :func:`jax_gmma.nn.quantize_model` rules (anchored regex, format spec)."""
  if isinstance(rules, (str, bytes, qwix.QuantizationRule)) or not isinstance(rules, Sequence):
    raise TypeError(f"{who}: rules must be a sequence of qwix.QuantizationRule, got "
                    f"{type(rules).__name__}")
  out = []
  for i, rule in enumerate(rules):
    fmt = gmma_format(rule, fp8_block_format=fp8_block_format, who=f"{who}: rules[{i}]")
    ops = set(rule.op_names)
    if ops and not ops & {"dot_general", "einsum"}:
      continue  # matches no Linear / Einsum layer
    if ops and not {"dot_general", "einsum"} <= ops:
      raise ValueError(f"{who}: rules[{i}] ({_describe(rule)}): op_names {sorted(ops)} select "
                       "one kind of layer (nnx.Linear runs dot_general, nnx.Einsum einsum), which "
                       "path rules cannot express; use GmmaProvider")
    try:
      re.compile(rule.module_path)
    except (re.error, TypeError) as e:
      raise ValueError(f"{who}: rules[{i}]: module_path {rule.module_path!r} is not a regular "
                       f"expression: {e}") from None
    out.append((rf"^(?:{rule.module_path})\Z", fmt))
  return out


def quantize_with_qwix_rules(model, rules, *, fp8_block_format: str = "fp8_1x128",
                             verbose: bool = False, skip_unsupported: bool = False
                             ) -> QuantizationSummary:
  """Applies ``qwix.QuantizationRule`` s to ``model`` with :func:`jax_gmma.nn.quantize_model`:
  in place, each ``nnx.Linear`` / ``nnx.Einsum`` whose path a rule matches (``re.fullmatch``,
  first match wins, as qwix matches) becomes a :class:`jax_gmma.nn.QuantizedLinear` /
  ``QuantizedEinsum`` in the rule's format (:func:`gmma_format`); rules with
  ``weight_qtype=None`` keep layers float. Nothing runs the model (no sample input; works under
  ``nnx.eval_shape``). Rules whose ``op_names`` exclude both ``dot_general`` and ``einsum`` are
  skipped; ones naming just one of them raise. ``verbose`` / ``skip_unsupported``: as for
  :func:`jax_gmma.nn.quantize_model`. Returns its :class:`jax_gmma.nn.QuantizationSummary`."""
  who = "jax_gmma.qwix_provider.quantize_with_qwix_rules"
  return quantize_model(model, _gmma_rules(rules, fp8_block_format, who), verbose=verbose,
                        skip_unsupported=skip_unsupported)

