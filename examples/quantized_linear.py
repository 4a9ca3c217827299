"""The quantized Linear shared by the examples (``minilm.py``, ``llama_decode.py``).

A *format spec* names how a Linear ``y = x @ w.T (+ b)`` with an (N, K) = (out, in) weight is
computed. The grammar every example accepts:

* ``FMT``, a weight format ``jax_gmma.dot`` has a GEMM kernel for (``gemm_formats()``, i.e.
  ``jax_gmma.ops.tensorwise.WEIGHT_FORMATS``: ``fp8_tensor``, ``fp8_channel`` today) -> kind ``"gemm"``.
  The weight is quantized once with ``jax_gmma.quantize(w, FMT)``; every call is
  ``jax_gmma.dot(x, w_q, bias=b)`` with x quantized per token to float8_e4m3fn on the fly
  (``x_format = GEMM_ACTIVATION_FORMAT``); the output dtype follows x. The CUTLASS kernel on a
  Hopper GPU with the kernels built, the pure-JAX reference elsewhere.
* ``emu:FMT``, any format in ``jax_gmma.FORMATS`` -> kind ``"emulated"``: an *emulation, not a
  GEMM kernel*. The weight is quantized and dequantized once (kept in float32); every call
  quantizes and dequantizes the activation in the format ``EMU_ACTIVATION_FORMAT`` pairs with the
  weight format (what its GEMM would consume), and a float32 dot (``Precision.HIGHEST``)
  multiplies them; the bias is added in float32 and the result cast to x's dtype.
* ``wo:FMT``, FMT in ``jax_gmma.weightonly.WEIGHT_FORMATS`` (``weightonly_formats()``: ``nvfp4``,
  ``mxfp4``) -> kind ``"weightonly"``: a real FP4 *weight-only* GEMM. The weight is quantized
  once to FMT and laid out for the Hopper kernel with ``jax_gmma.weightonly.prepare(w, FMT)`` (a
  ``PackedWeight``: FP4 codes and block scales in the kernel's layout); every call is
  ``jax_gmma.dot(x.astype(bfloat16), w_p, bias=b.astype(bfloat16))``: the activation stays bf16
  (*no activation quantization*), the kernel widens the FP4 weights to bf16 in registers and
  accumulates in float32, the output (bf16) is cast to x's dtype. The sm_90a kernel on a Hopper
  GPU with the kernels built, the pure-JAX reference elsewhere. (N must be a multiple of 16.)
* A plain ``FMT`` in ``jax_gmma.FORMATS`` without a GEMM kernel is an error that points to
  ``emu:FMT`` (and ``wo:FMT`` where the weight-only kernel takes FMT; no silent emulation); when
  the format gains a kernel, its plain name runs it. Anything else raises ``UnknownFormat``.

An example with kinds of its own (llama_decode's ``bf16`` and ``xla_fp8``) subclasses
``QuantizedLinear``, handles those kinds in ``prepare``/``linear`` and in its parser, and leaves
the rest to ``parse_spec`` and the methods here.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Type, TypeVar

import jax
import jax.numpy as jnp

import jax_gmma

HIGHEST = jax.lax.Precision.HIGHEST  # float32 dots stay float32 (no TF32/bf16 passes on GPU)

#: How ``jax_gmma.dot`` quantizes the activation of a GEMM spec: per token (row).
GEMM_ACTIVATION_FORMAT = "fp8_channel"

#: Activation format an emulated weight format is paired with (what its GEMM would consume).
#: FP8 per-tensor/per-channel weights: activations per token (as ``jax_gmma.dot`` does);
#: DeepSeek-style 128x128 weight blocks: 1x128 activation blocks; MX/NV formats (every format not
#: listed): the same format.
EMU_ACTIVATION_FORMAT = {"fp8_tensor": "fp8_channel", "fp8_channel": "fp8_channel",
                         "fp8_128x128": "fp8_1x128", "fp8_1x128": "fp8_1x128"}


def gemm_formats() -> Tuple[str, ...]:
  """Weight formats ``jax_gmma.dot`` runs as a GEMM in the installed jax-gmma (FP8 per-tensor /
  per-channel, and the block-scaled fp8_128x128 / fp8_1x128)."""
  return jax_gmma.ops.tensorwise.WEIGHT_FORMATS + jax_gmma.ops.blockwise.WEIGHT_FORMATS


def weightonly_formats() -> Tuple[str, ...]:
  """Weight formats of the FP4/FP6 weight-only GEMM (``wo:FMT``) in the installed jax-gmma
  (``jax_gmma.weightonly.WEIGHT_FORMATS``)."""
  return jax_gmma.weightonly.WEIGHT_FORMATS


class UnknownFormat(ValueError):
  """A spec that is neither a GEMM format, ``emu:FMT``, nor a format without a kernel."""


@dataclasses.dataclass(frozen=True)
class QuantizedLinear:
  """How a Linear is computed. Hashable: it is a static jit argument."""
  label: str                 # the spec as given ("fp8_channel", "emu:nvfp4", "wo:nvfp4", ...)
  kind: str                  # "gemm" | "emulated" | "weightonly" (+ a subclass's own kinds)
  fmt: Optional[str] = None  # weight format
  x_format: Optional[str] = None  # activation format (None: not quantized, weightonly's bf16)

  def prepare(self, w):
    """The (N, K) float weight as this kind stores it; done once, outside the jitted model.
    gemm: the QuantizedArray; emulated: the dequantized weight in float32; weightonly: the
    ``PackedWeight`` (FP4 in the Hopper kernel layout)."""
    if self.kind == "weightonly":
      return jax_gmma.weightonly.prepare(w, self.fmt)
    q = jax_gmma.quantize(w, self.fmt)
    if self.kind == "gemm":
      return q
    return jax_gmma.dequantize(q, jnp.float32)  # emulated: the weight's rounding, in float32

  def linear(self, x, w, bias=None):
    """x (..., K) float, ``w`` from ``prepare`` -> x @ w.T (+ bias), (..., N) in x's dtype."""
    if self.kind == "gemm":
      return jax_gmma.dot(x, w, bias=bias, x_format=self.x_format)  # out dtype follows x
    if self.kind == "weightonly":  # bf16 activations x FP4 weights -> bf16, then x's dtype
      b = None if bias is None else jnp.asarray(bias).astype(jnp.bfloat16)
      return jax_gmma.dot(x.astype(jnp.bfloat16), w, bias=b).astype(x.dtype)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).astype(jnp.float32)
    xq = jax_gmma.dequantize(jax_gmma.quantize(x2, self.x_format), jnp.float32)
    y = jax.lax.dot_general(xq, w, (((1,), (1,)), ((), ())), precision=HIGHEST,
                            preferred_element_type=jnp.float32)  # (M, K) x (N, K) -> (M, N)
    if bias is not None:
      y = y + bias
    return y.astype(x.dtype).reshape(*lead, y.shape[-1])


Q = TypeVar("Q", bound=QuantizedLinear)


def parse_spec(spec: str, cls: Type[Q] = QuantizedLinear) -> Q:
  """``FMT`` -> a jax-gmma GEMM (FMT must have a kernel); ``emu:FMT`` -> the quantize/dequantize
  emulation; ``wo:FMT`` -> the FP4/FP6 weight-only GEMM (bf16 activations); built as ``cls`` (a
  ``QuantizedLinear`` subclass). Raises ``ValueError`` otherwise (``UnknownFormat`` for a name
  that is no format at all)."""
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
    return cls(label=spec, kind="gemm", fmt=spec, x_format=GEMM_ACTIVATION_FORMAT)
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
