"""jax-gmma: FP8 and block-scaled (FP8 / FP6 / FP4) GEMMs for jax.jit programs.

CUTLASS kernels for Hopper (sm_90a) registered as XLA FFI custom calls; a pure-JAX reference
everywhere else. See README.md.

Layers (each imports only from the ones above it): ``_compat`` / ``_backend``; ``numerics``
(formats, codec, scaling, layouts, shapes); ``arrays``; the primitive machinery (``primitive``,
``sharding``, ``batching``, ``_vma``); the op families (``ops``); the public API (``api``,
``train``, ``info``).
"""
from ._version import __version__

from . import _backend
from ._backend import KernelUnavailable, allow_reference, set_allow_reference
from .arrays import QuantizedArray
from .numerics import formats, layouts, shapes
from .numerics.formats import FORMATS, get_format
from .numerics.shapes import BlockwiseProblem, GemmProblem, fp8_blockwise_problem, fp8_gemm_problem
from .primitive import NotDifferentiable
from . import ops
from .ops import blockwise, mx, weightonly
from .ops import blockwise_configs
from .ops import tensorwise_configs as configs
from .ops.blockwise import blockwise_gemm, blockwise_gemm_reference, fp8_blockwise_gemm_p
from .ops.mx import mx_gemm, mx_gemm_p
from .ops.quantize import dequantize, quantize
from .ops.tensorwise import fp8_gemm, fp8_gemm_p, fp8_gemm_reference
from .ops.tensorwise_configs import KernelConfig, select_config
from .ops.weightonly import PackedWeight, weightonly_gemm
from .api import dot, export_disabled_checks, ragged_dot, scaled_matmul
from .train import fp8_linear
from . import checkpoint

_backend.register_targets()  # no-op without the CUDA library; needs no GPU

__all__ = [
    "fp8_gemm", "dot", "quantize", "dequantize", "QuantizedArray", "fp8_gemm_reference",
    "allow_reference", "set_allow_reference", "KernelUnavailable", "GemmProblem",
    "fp8_gemm_problem", "KernelConfig", "select_config", "FORMATS", "get_format", "configs",
    "formats", "layouts", "shapes",
    "blockwise_gemm", "blockwise_gemm_reference", "fp8_blockwise_gemm_p", "scaled_matmul",
    "BlockwiseProblem", "fp8_blockwise_problem", "blockwise_configs",
    "mx", "mx_gemm", "mx_gemm_p",
    "weightonly", "weightonly_gemm", "PackedWeight", "fp8_linear", "NotDifferentiable",
    "export_disabled_checks", "checkpoint", "ragged_dot",
]
