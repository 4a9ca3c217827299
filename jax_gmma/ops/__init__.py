"""The op families, one module each (+ its configs module), and the registry ``jax_gmma.dot``
asks: each family declares the weights it serves (``WEIGHT_FORMATS`` / ``serves(w)``) and a
``dot(x, w, ...)`` entry.

* :mod:`.quantize`    quantize() / dequantize() and the activation quantize kernel
* :mod:`.tensorwise`  fp8_gemm (per-tensor / per-row / per-channel scales)
* :mod:`.blockwise`   blockwise_gemm (1x128 / 128x128 block scales)
* :mod:`.mx`          mx_gemm (MX / NVFP4 block-scaled operands)
* :mod:`.weightonly`  weightonly_gemm, prepare, unpack (FP4 / FP6 weights, bf16 / FP8 activations)
"""
from . import blockwise, mx, quantize, tensorwise, weightonly

#: The GEMM families, in the order ``jax_gmma.dot`` asks them.
FAMILIES = (tensorwise, blockwise, mx, weightonly)
#: QuantizedArray weight formats some family multiplies (``dot``'s error message lists them).
QUANTIZED_WEIGHT_FORMATS = tensorwise.WEIGHT_FORMATS + blockwise.WEIGHT_FORMATS + mx.WEIGHT_FORMATS


def family_for(w):
  """The family whose ``dot`` multiplies weight ``w``, or None."""
  for family in FAMILIES:
    if family.serves(w):
      return family
  return None
