"""jax-gmma: FP8 (and, later, block-scaled FP8/FP6/FP4) GEMMs for jax.jit programs.

CUTLASS kernels for Hopper (sm_90a) registered as XLA FFI custom calls; a pure-JAX reference
everywhere else. See README.md.
"""
__version__ = "0.1.0"

from . import configs, formats, layouts, shapes
from ._backend import allow_reference, set_allow_reference, KernelUnavailable
from .api import dot
from . import blockwise_configs
from .blockwise import blockwise_gemm, blockwise_gemm_reference, fp8_blockwise_gemm_p, scaled_matmul
from . import mx
from .mx import mx_gemm, mx_gemm_p
from . import weightonly
from .weightonly import PackedWeight, weightonly_gemm
from .configs import KernelConfig, select_config
from .formats import FORMATS, get_format
from .ops import fp8_gemm, fp8_gemm_p
from .quantize import QuantizedArray, dequantize, quantize
from .reference import fp8_gemm_reference
from .train import fp8_linear
from . import transforms  # vmap rules and differentiation errors of the primitives
from .shapes import BlockwiseProblem, GemmProblem, fp8_blockwise_problem, fp8_gemm_problem
from . import _backend as _b

_b.register_targets()  # no-op without the CUDA library; needs no GPU

__all__ = [
    "fp8_gemm", "dot", "quantize", "dequantize", "QuantizedArray", "fp8_gemm_reference",
    "allow_reference", "set_allow_reference", "KernelUnavailable", "GemmProblem",
    "fp8_gemm_problem", "KernelConfig", "select_config", "FORMATS", "get_format", "configs",
    "formats", "layouts", "shapes",
    "blockwise_gemm", "blockwise_gemm_reference", "fp8_blockwise_gemm_p", "scaled_matmul",
    "BlockwiseProblem", "fp8_blockwise_problem", "blockwise_configs",
    "mx", "mx_gemm", "mx_gemm_p",
    "weightonly", "weightonly_gemm", "PackedWeight", "fp8_linear", "transforms",
]
