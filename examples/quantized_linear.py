"""Format specs shared by the examples (``minilm.py``, ``llama_decode.py``), and how a float Flax
NNX model becomes each spec's variant.

Each example builds a float NNX model whose Linear layers are ``nnx.Linear`` (kernel (in, out)),
then converts a copy of it per format spec with :func:`convert`: the ``nnx.Linear`` layers whose
module path (``"layers/0/wqkv"``) matches the example's rules are replaced, in place:

* ``FMT``, a weight format ``jax_gmma.dot`` has a GEMM kernel for (``gemm_formats()``:
  ``jax_gmma.ops.tensorwise.WEIGHT_FORMATS`` + ``jax_gmma.ops.blockwise.WEIGHT_FORMATS``:
  ``fp8_tensor``, ``fp8_channel``, ``fp8_128x128``, ``fp8_1x128``) -> kind ``"gemm"``:
  ``jax_gmma.nn.quantize_model`` makes each a ``jax_gmma.nn.QuantizedLinear``. The weight is
  quantized once (``jax_gmma.quantize(kernel.T, FMT)``); every call is ``jax_gmma.dot(x, w_q,
  bias=b)`` with x quantized on the fly (per token to float8_e4m3fn, or to 1x128 blocks for
  block-scaled weights); the output dtype follows x. The CUTLASS kernel on a Hopper GPU with the
  kernels built, the pure-JAX reference elsewhere.
* ``wo:FMT``, FMT in ``jax_gmma.weightonly.WEIGHT_FORMATS`` (``weightonly_formats()``: ``nvfp4``,
  ``mxfp4``, ``mxfp6_e2m3``, ``mxfp6_e3m2``) -> kind ``"weightonly"``: ``quantize_model`` with
  the same spec, a ``QuantizedLinear`` holding a ``jax_gmma.PackedWeight``
  (``jax_gmma.weightonly.prepare``: FP4 / FP6 codes and block scales in the Hopper kernel's
  layout); every call is ``jax_gmma.dot(x, w_p, bias=b)`` on bf16 activations (float32 x is
  rounded to bf16; *no activation quantization*), float32 accumulation. The sm_90a kernel on a
  Hopper GPU with the kernels built, the pure-JAX reference elsewhere. (N must be a multiple of
  16.)
* ``emu:FMT``, any format in ``jax_gmma.FORMATS`` -> kind ``"emulated"``: an *emulation, not a
  GEMM kernel*, :class:`EmulatedLinear`. The weight is quantized and dequantized once (kept in
  float32); every call quantizes and dequantizes the activation in the format
  ``EMU_ACTIVATION_FORMAT`` pairs with the weight format (what its GEMM would consume), and a
  float32 dot (``Precision.HIGHEST``) multiplies them; the bias is added in float32 and the
  result cast to x's dtype.
* A plain ``FMT`` in ``jax_gmma.FORMATS`` without a GEMM kernel here is an error that points to
  ``emu:FMT`` (and ``wo:FMT`` where the weight-only kernel takes FMT; no silent emulation).
  Anything else raises ``UnknownFormat``.

An example with kinds of its own (llama_decode's ``bf16`` and ``xla_fp8``, minilm's float
rows) passes :func:`convert` a ``make`` function that builds its own layer from an
``nnx.Linear``; the same rules pick the layers.

Checkpoints (``--save DIR`` / ``--load DIR`` of both examples, orbax-checkpoint needed):
:func:`save_model` writes a converted model's ``nnx.state`` with
``jax_gmma.checkpoint_orbax.save_orbax`` (QuantizedArray / PackedWeight leaves bit for bit);
:func:`restore_model` reads it back into an abstract model of the same variant
(``nnx.eval_shape`` of the conversion: nothing quantized) with ``restore_orbax(path,
target=...)``. One directory per format: :func:`checkpoint_path`.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import MutableMapping, MutableSequence
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Type, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_gmma
import jax_gmma.nn as gnn
from jax_gmma import checkpoint_orbax

HIGHEST = jax.lax.Precision.HIGHEST  # float32 dots stay float32 (no TF32/bf16 passes on GPU)

#: How ``jax_gmma.dot`` quantizes the activation of a GEMM spec: per token (row).
GEMM_ACTIVATION_FORMAT = "fp8_channel"

#: Activation format an emulated weight format is paired with (what its GEMM would consume).
#: FP8 per-tensor/per-channel weights: activations per token (as ``jax_gmma.dot`` does);
#: DeepSeek-style 128x128 weight blocks: 1x128 activation blocks; MX/NV formats (every format not
#: listed): the same format.
EMU_ACTIVATION_FORMAT = {"fp8_tensor": "fp8_channel", "fp8_channel": "fp8_channel",
                         "fp8_128x128": "fp8_1x128", "fp8_1x128": "fp8_1x128"}

#: The kinds :func:`convert` hands to ``jax_gmma.nn.quantize_model``.
JAX_GMMA_KINDS = ("gemm", "weightonly")


def gemm_formats() -> Tuple[str, ...]:
  """Weight formats ``jax_gmma.dot`` runs as a GEMM on Hopper in the installed jax-gmma (FP8
  per-tensor / per-channel, the block-scaled fp8_128x128 / fp8_1x128, and the MX formats with a
  Hopper kernel for their own activation format: mxfp8)."""
  mx = jax_gmma.ops.mx
  hopper_mx = tuple(f for f in mx.WEIGHT_FORMATS if (f, f) in mx.KERNELS.get("sm_90a", {}))
  return jax_gmma.ops.tensorwise.WEIGHT_FORMATS + jax_gmma.ops.blockwise.WEIGHT_FORMATS + hopper_mx


def weightonly_formats() -> Tuple[str, ...]:
  """Weight formats of the FP4/FP6 weight-only GEMM (``wo:FMT``) in the installed jax-gmma
  (``jax_gmma.weightonly.WEIGHT_FORMATS``)."""
  return jax_gmma.weightonly.WEIGHT_FORMATS


class UnknownFormat(ValueError):
  """A spec that is neither a GEMM format, ``emu:FMT``, nor a format without a kernel."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """A parsed format spec (hashable)."""
  label: str                 # the spec as given ("fp8_channel", "emu:nvfp4", "wo:nvfp4", ...)
  kind: str                  # "gemm" | "emulated" | "weightonly" (+ an example's own kinds)
  fmt: Optional[str] = None  # weight format
  x_format: Optional[str] = None  # activation format (None: not quantized, weightonly's bf16)


S = TypeVar("S", bound=Spec)


def parse_spec(spec: str, cls: Type[S] = Spec) -> S:
  """``FMT`` -> a jax-gmma GEMM (FMT must have a kernel); ``emu:FMT`` -> the quantize/dequantize
  emulation; ``wo:FMT`` -> the FP4/FP6 weight-only GEMM (bf16 activations); built as ``cls`` (a
  ``Spec`` subclass). Raises ``ValueError`` otherwise (``UnknownFormat`` for a name that is no
  format at all)."""
  spec = spec.strip()
  if spec.startswith("wo:"):
    fmt = spec[3:]
    if fmt not in weightonly_formats():
      raise ValueError(f"{spec}: the FP4/FP6 weight-only GEMM has no format {fmt!r}; wo: formats: "
                       f"{', '.join(weightonly_formats()) or 'none in this jax-gmma'}")
    return cls(label=spec, kind="weightonly", fmt=fmt, x_format=None)
  if spec.startswith("emu:"):
    fmt = spec[4:]
    if fmt not in jax_gmma.FORMATS:
      raise ValueError(f"{spec}: unknown format {fmt!r}; formats: {', '.join(jax_gmma.FORMATS)}")
    return cls(label=spec, kind="emulated", fmt=fmt, x_format=EMU_ACTIVATION_FORMAT.get(fmt, fmt))
  if spec in gemm_formats():
    return cls(label=spec, kind="gemm", fmt=spec,
               x_format=spec if spec in jax_gmma.ops.mx.WEIGHT_FORMATS else GEMM_ACTIVATION_FORMAT)
  if spec in jax_gmma.FORMATS:
    wo = (f", or 'wo:{spec}' for the FP4/FP6 weight-only GEMM (bf16 activations)"
          if spec in weightonly_formats() else "")
    raise ValueError(f"{spec}: jax_gmma.dot has no GEMM kernel for this format yet (GEMM formats: "
                     f"{', '.join(gemm_formats())}); use 'emu:{spec}' for the dequantize "
                     f"emulation{wo}")
  wo = (f"; weight-only: wo:FMT with FMT in {', '.join(weightonly_formats())}"
        if weightonly_formats() else "")
  raise UnknownFormat(f"{spec}: unknown format; GEMM formats: {', '.join(gemm_formats())}; "
                      f"emulation: emu:FMT with FMT in {', '.join(jax_gmma.FORMATS)}{wo}")


# ----------------------------------------------------------------------------------------------
# Layers the examples add (jax-gmma's own come from jax_gmma.nn)
# ----------------------------------------------------------------------------------------------
class FrozenWeight(nnx.Variable):
  """A weight computed once from a float model's kernel (transposed, rounded or quantized):
  state like any variable (``nnx.split``, checkpoints), but no ``nnx.Param``, so optimizers
  leave it alone."""


def kernel_nk(linear: nnx.Linear):
  """The (N, K) = (out, in) weight of an ``nnx.Linear`` (its kernel is (in, out))."""
  return jnp.asarray(linear.kernel.get_value()).T


def bias_of(linear: nnx.Linear):
  return None if linear.bias is None else linear.bias.get_value()


class EmulatedLinear(nnx.Module):
  """``emu:FMT``: ``y = fq(x) @ w_fq.T + b`` in float32, cast to x's dtype, where ``w_fq`` is the
  (N, K) weight quantized to FMT and dequantized (once, float32) and ``fq(x)`` quantizes and
  dequantizes the activation in ``x_format`` on every call. A numerical emulation of the format,
  not a kernel."""

  def __init__(self, w_deq, bias=None, *, x_format: str):
    self.kernel = FrozenWeight(jnp.asarray(w_deq, jnp.float32))  # (N, K)
    self.bias = nnx.data(None) if bias is None else nnx.Param(jnp.asarray(bias))
    self.x_format = x_format

  @classmethod
  def from_linear(cls, linear: nnx.Linear, fmt: str, x_format: str) -> "EmulatedLinear":
    q = jax_gmma.quantize(kernel_nk(linear), fmt)
    return cls(jax_gmma.dequantize(q, jnp.float32), bias_of(linear), x_format=x_format)

  def __call__(self, x):
    w = self.kernel.get_value()
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).astype(jnp.float32)
    xq = jax_gmma.dequantize(jax_gmma.quantize(x2, self.x_format), jnp.float32)
    y = jax.lax.dot_general(xq, w, (((1,), (1,)), ((), ())), precision=HIGHEST,
                            preferred_element_type=jnp.float32)  # (M, K) x (N, K) -> (M, N)
    if self.bias is not None:
      y = y + self.bias.get_value()
    return y.astype(x.dtype).reshape(*lead, y.shape[-1])


# ----------------------------------------------------------------------------------------------
# Converting a float model
# ----------------------------------------------------------------------------------------------
Rules = Sequence[Tuple[str, Optional[Spec]]]


def _linears(model, rules: Rules) -> List[Tuple[object, object, str, nnx.Linear, Spec]]:
  """(parent, key, path, layer, spec) of every ``nnx.Linear`` of ``model`` that ``rules`` (first
  ``re.search`` match on the path, as ``jax_gmma.nn.quantize_model`` matches) give a spec."""
  compiled = [(re.compile(p), s) for p, s in rules]
  out = []
  for path, node in nnx.iter_graph(model):
    if not isinstance(node, nnx.Module):
      continue
    for key, child in nnx.iter_children(node):
      if type(child) is not nnx.Linear:
        continue
      name = "/".join(str(p) for p in (*path, key))
      spec = next((s for rx, s in compiled if rx.search(name)), None)
      if spec is not None:
        out.append((node, key, name, child, spec))
  return out


def convert(model, rules: Rules, make: Optional[Callable[[nnx.Linear, Spec], nnx.Module]] = None):
  """Converts ``model``'s ``nnx.Linear`` layers in place: each path is matched against ``rules``
  (``(regex, spec or None)`` pairs, first match decides). jax-gmma specs (kinds ``"gemm"``,
  ``"weightonly"``) go to ``jax_gmma.nn.quantize_model(model, rules)`` with the spec's label;
  ``emu:FMT`` becomes :class:`EmulatedLinear`; any other kind is ``make(linear, spec)`` (an
  example's own layer). Returns the ``jax_gmma.nn.QuantizationSummary`` of the quantize_model
  call (None when no jax-gmma spec applies). Works inside ``nnx.eval_shape`` (an abstract model
  to restore a checkpoint into)."""
  own = []
  for parent, key, name, linear, spec in _linears(model, rules):
    if spec.kind in JAX_GMMA_KINDS:
      continue
    if spec.kind == "emulated":
      layer = EmulatedLinear.from_linear(linear, spec.fmt, spec.x_format)
    elif make is not None:
      layer = make(linear, spec)
    else:
      raise ValueError(f"{name}: no layer for format {spec.label!r} (kind {spec.kind!r})")
    own.append((parent, key, layer))
  for parent, key, layer in own:  # every layer made before any is replaced
    if isinstance(parent, (MutableSequence, MutableMapping)):
      parent[key] = layer
    else:
      setattr(parent, key, layer)
  nn_rules = [(p, s.label if s is not None and s.kind in JAX_GMMA_KINDS else None)
              for p, s in rules]
  if not any(s is not None for _, s in nn_rules):
    return None
  return gnn.quantize_model(model, nn_rules)


# ----------------------------------------------------------------------------------------------
# Checkpoints (orbax, through jax_gmma.checkpoint_orbax)
# ----------------------------------------------------------------------------------------------
def checkpoint_path(root, label: str) -> Path:
  """Where ``--save ROOT`` puts the model of a format (``wo:nvfp4`` -> ``ROOT/wo-nvfp4``)."""
  return Path(root) / label.replace(":", "-")


def check_checkpoint_dirs(labels: Sequence[str], save_dir=None, load_dir=None) -> None:
  """``ValueError`` when ``load_dir`` lacks a format of ``labels`` or ``save_dir`` already holds
  one (checkpoints are never overwritten), or orbax is not installed."""
  if (save_dir is not None or load_dir is not None) and checkpoint_orbax.ocp is None:
    raise ValueError("--save / --load need orbax-checkpoint: pip install orbax-checkpoint")
  if load_dir is not None:
    missing = [lb for lb in labels if not checkpoint_path(load_dir, lb).exists()]
    if missing:
      raise ValueError(f"--load {load_dir}: no checkpoint of {', '.join(missing)} (save them with "
                       f"--save NEW_DIR --formats {','.join(missing)})")
  if save_dir is not None:
    there = [str(checkpoint_path(save_dir, lb)) for lb in labels
             if checkpoint_path(save_dir, lb).exists()]
    if there:
      raise ValueError(f"--save {save_dir}: {', '.join(there)} exist already; choose another "
                       "directory")


def save_model(path, model: nnx.Module) -> None:
  """The model's state (quantized weights included, bit for bit) as a new orbax checkpoint."""
  checkpoint_orbax.save_orbax(path, nnx.state(model))


def restore_model(path, abstract: nnx.Module) -> nnx.Module:
  """The model saved at ``path`` by :func:`save_model`, bit-exact, restored into ``abstract``
  (the same variant from ``nnx.eval_shape``: its structure, formats and shapes)."""
  graphdef, target = nnx.split(abstract)
  state = checkpoint_orbax.restore_orbax(path, target=target)

  def shapes_of(tree):
    return [(tuple(a.shape), np.dtype(a.dtype)) for a in jax.tree.leaves(tree)]

  if shapes_of(state) != shapes_of(target):
    raise ValueError(f"{path}: the checkpoint's arrays do not fit this model (saved from a model "
                     "of other shapes?)")
  return nnx.merge(graphdef, state)
