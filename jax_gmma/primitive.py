"""One place that turns a family's declaration into a JAX primitive.

Every GEMM / quantization primitive of jax_gmma is defined by :func:`define`:

* eager execution through ``jit`` (``apply_primitive``) and the family's abstract evaluation;
* the default lowering (every platform): the family's pure-JAX reference, through the
  sharding wrapper (:func:`jax_gmma.sharding.lowering`, with the family's partition rule);
* the CUDA lowering, through the same wrapper: the family says why its kernel cannot run here
  (``kernel_missing``, None when it can); without a kernel the primitive raises
  :class:`~jax_gmma.KernelUnavailable` with the remedy, or runs the reference when the user
  allowed it (``jax_gmma.allow_reference``) or the family falls back quietly by design
  (quantization); with one, the FFI targets are registered and the family's kernel lowering runs;
* the ``jax.vmap`` rule (built by :mod:`jax_gmma.batching` from the family's pieces);
* differentiation: the raw-operand primitives raise :class:`NotDifferentiable` naming the
  user-facing function (a family may give its own JVP instead);
* the graph-safety trait: whether the kernel's FFI handler may be captured in a CUDA graph /
  XLA command buffer (declared in C++ by ``ffi/graph_safety.h``; recorded here for ``info``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Dict, Optional

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import _backend, sharding
from .numerics import shapes
from ._compat import Primitive, ShapedArray, apply_primitive

__all__ = ["define", "Op", "OPS", "NotDifferentiable", "ffi_with_workspace", "FLOAT_DTYPES",
           "dtype_name", "check_float", "float_activation", "out_dtype_or_error", "check_bias", "check_splits",
           "caller_of", "named", "CALLER"]

#: The float dtypes of the GEMMs' float operands (activations, bias) and outputs.
FLOAT_DTYPES = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32))
#: The optional primitive parameter that names what the user called, for the errors raised at
#: lowering time: ``(function, a argument, b argument)``, e.g. ``("dot", "x", "w")``.
CALLER = "caller"


class NotDifferentiable(TypeError):
  """A raw-operand GEMM primitive was differentiated."""


@dataclasses.dataclass(frozen=True)
class Op:
  """A defined primitive and the pieces it was made of."""
  p: Primitive
  user_fn: str                  # what the user called ("jax_gmma.fp8_gemm"), for messages
  reference: Callable           # pure-JAX fn(*args, **params)
  reference_lowering: Callable  # (ctx, *args, **params), unwrapped
  cuda_lowering: Callable       # (ctx, *args, **params), unwrapped
  graph_safe: bool


#: primitive name -> Op, every primitive jax_gmma defines
OPS: Dict[str, Op] = {}


# -- argument checks the public GEMM functions share -----------------------------------------
# Each takes ``who``, the public function the user called ("jax_gmma.dot"), which starts the
# message; the message then names the argument and the rule.

def dtype_name(dt) -> str:
  try:
    return np.dtype(dt).name
  except TypeError:
    return repr(dt)


def _names(dtypes) -> str:
  return ", ".join(np.dtype(d).name for d in dtypes)


def check_float(dtype, who: str, name: str, allowed=None, what: str = "array") -> np.dtype:
  """``dtype`` of argument ``name`` must be a real floating dtype (``allowed``: one of these):
  integer, bool and complex dtypes are refused (a complex value would lose its imaginary part
  in the float32 maths, an integer one is not what the kernels read)."""
  dt = np.dtype(dtype)
  if allowed is not None:
    if dt not in allowed:
      raise TypeError(f"{who}: {name} must be a floating {what} ({_names(allowed)}), got {dt.name}")
    return dt
  if not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{who}: {name} must be floating point (a real floating {what}), got {dt.name}")
  return dt


def float_activation(x, who: str):
  """``x`` as a JAX array of bfloat16, float16 or float32: what a GEMM entry point that also
  takes a QuantizedArray activation accepts as a float one; anything else is a TypeError
  naming ``who``."""
  try:
    x = jnp.asarray(x)
  except TypeError:
    raise TypeError(f"{who}: x must be a floating array (bfloat16, float16, float32) or a "
                    f"jax_gmma.QuantizedArray, got {type(x).__name__}") from None
  if np.dtype(x.dtype) not in FLOAT_DTYPES:
    raise TypeError(f"{who}: x must be a floating array (bfloat16, float16, float32) or a "
                    f"jax_gmma.QuantizedArray, got {np.dtype(x.dtype).name}")
  return x


def out_dtype_or_error(out_dtype, who: str, allowed=FLOAT_DTYPES, name: str = "out_dtype") -> np.dtype:
  """``out_dtype`` as a numpy dtype, or a TypeError naming it: one of ``allowed``."""
  names = [np.dtype(d).name for d in allowed]
  rule = (f"{name} must be {', '.join(names[:-1])} or {names[-1]}" if len(names) > 1
          else f"{name} must be {names[0]}") + " (one of the floating dtypes the kernels write)"
  try:
    dt = np.dtype(jnp.dtype(out_dtype))
  except (TypeError, ValueError):
    raise TypeError(f"{who}: {rule}, got {out_dtype!r}") from None
  if dt not in allowed:
    raise TypeError(f"{who}: {rule}, got {dt.name}")
  return dt


def check_bias(bias, n: int, who: str):
  """None, or ``bias`` as an array: a real floating (N,) vector."""
  if bias is None:
    return None
  bias = jnp.asarray(bias)
  check_float(bias.dtype, who, "bias", what="(N,) vector")
  if tuple(bias.shape) != (n,):
    raise ValueError(f"{who}: bias must have shape (N,) = ({n},), got {tuple(bias.shape)}")
  return bias


def check_splits(splits, who: str, stream_k: Optional[bool] = None):
  """``splits``: None (the heuristic's), or an int >= 0 (0: CUTLASS's stream-K heuristic, 1:
  data-parallel, > 1: split-K); with a forced config that is not stream-K, only 1."""
  if splits is None:
    return None
  if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)):
    raise TypeError(f"{who}: splits must be None or an int >= 0, got {splits!r}")
  if splits < 0:
    raise ValueError(f"{who}: splits must be None or an int >= 0, got {splits}")
  if stream_k is False and splits != 1:
    raise ValueError(f"{who}: splits must be 1 (or None) for a config without stream-K, got {splits}")
  return int(splits)


def named(who: str, fn: Callable, *args, **kwargs):
  """``fn(*args, **kwargs)`` (a shape rule of :mod:`jax_gmma.numerics.shapes` or a config
  lookup), its TypeError / ValueError re-raised with ``who`` in front: the public function the
  user called."""
  try:
    return fn(*args, **kwargs)
  except (TypeError, ValueError) as e:
    msg = str(e)
    if msg.startswith(who + ":"):
      raise
    raise type(e)(f"{who}: {msg}") from None


def check_fp8_weight(w, who: str) -> None:
  """What the FP8 kernel families (tensorwise, block-scaled) need of a QuantizedArray weight
  ``w`` beyond its format: float8_e4m3fn elements, and N a multiple of ``shapes.N_ALIGN``
  (16-byte aligned output rows); errors name ``who``'s argument w."""
  n = w.canonical_shape[0]
  if np.dtype(w.dtype) != shapes.F8E4M3:
    raise TypeError(f"{who}: w must have float8_e4m3fn elements (the FP8 kernels take e4m3 weights), "
                    f"got {np.dtype(w.dtype).name}; quantize(w, {w.format.name!r}) with the default dtype")
  if n % shapes.N_ALIGN:
    raise ValueError(f"{who}: N (w's rows) must be a multiple of {shapes.N_ALIGN} for {w.format.name} "
                     f"weights (16-byte aligned output rows), got {n}")


def caller_of(params, default: tuple) -> tuple:
  """The ``(function, a argument, b argument)`` a primitive's parameters name (``CALLER``), or
  ``default``."""
  c = params.get(CALLER)
  return tuple(c) if c else tuple(default)


def _not_differentiable(user_fn: str):
  def rule(primals, tangents, **params):
    raise NotDifferentiable(
        f"{user_fn} is not differentiable: it multiplies raw FP8 / packed operands. "
        "Differentiate jax_gmma.dot(x, w_q) instead (gradient w.r.t. the float activations x "
        "and bias; the quantized weight is a constant), or train with jax_gmma.fp8_linear(x, w) "
        "(float x and w, FP8 GEMMs forward and backward)")
  return rule


def define(name: str, *, abstract_eval: Callable, reference: Callable, user_fn: str,
           kernel: Optional[Callable] = None, kernel_missing: Optional[Callable] = None,
           op: Optional[str] = None, quiet_fallback: bool = False,
           multiple_results: bool = False, partition_rule: Optional[Callable] = None,
           vmap: Optional[Callable] = None, jvp: Optional[Callable] = None,
           graph_safe: bool = True, symbolic_ok: bool = False) -> Op:
  """Defines the primitive ``name`` from a family's declaration.

  abstract_eval(*avals, **params): the output aval(s).
  reference(*args, **params): the pure-JAX computation (default lowering and fallback).
  user_fn: the user-facing function, named by the not-differentiable error.
  kernel(ctx, *args, **params): the CUDA lowering when a kernel can run (targets registered).
  kernel_missing(ctx, params): None when the kernel can run here, else why not (a sentence).
  op: the name in KernelUnavailable messages ("jax_gmma.<op>: <why>. Refusing ..."), unless the
    bound parameters name the caller (``CALLER``: the public function the user called).
  quiet_fallback: run the reference without a kernel, never refuse (quantization).
  partition_rule(avals_in, params) -> sharding.Rule: how the primitive partitions.
  vmap(prim) -> batching rule; jvp: a JVP rule instead of the not-differentiable error.
  graph_safe: the kernel's FFI handler is command-buffer compatible.
  symbolic_ok: the kernel lowering accepts symbolic (``jax.export`` shape-polymorphic) dims;
    otherwise a symbolic dim reaching the CUDA lowering is refused by name (the kernel picks
    its tile configuration and workspace from M when the program is lowered).
  """
  p = Primitive(name)
  p.multiple_results = multiple_results
  p.def_impl(functools.partial(apply_primitive, p))
  p.def_abstract_eval(abstract_eval)

  def reference_lowering(ctx, *args, **params):
    params.pop(CALLER, None)
    return mlir.lower_fun(reference, multiple_results=multiple_results)(ctx, *args, **params)

  def cuda_lowering(ctx, *args, **params):
    why = None if kernel_missing is None else kernel_missing(ctx, params)
    if why is not None:
      if quiet_fallback or _backend.reference_allowed():
        return reference_lowering(ctx, *args, **params)
      # the function the user called (a public entry point passes it as the CALLER parameter)
      raise _backend.unavailable(caller_of(params, (op or name,))[0], why)
    if not symbolic_ok and any(not shapes.is_constant_dim(d) for a in getattr(ctx, "avals_in", ())
                               for d in getattr(a, "shape", ())):
      who = caller_of(params, (op or name,))[0]
      who = who if who.startswith("jax_gmma.") else f"jax_gmma.{who}"
      raise ValueError(
          f"{who}: a symbolic dimension (jax.export shape polymorphism) reaches the CUDA kernel, "
          "which picks its tile configuration and workspace from M when the program is lowered; "
          "export it for CUDA with concrete shapes (one export per token bucket). Symbolic token "
          "dimensions export for the reference (platforms=('cpu',)) and for PackedWeight weights")
    params.pop(CALLER, None)
    _backend.register_targets()
    return kernel(ctx, *args, **params)

  # Default lowering (every platform): the pure-JAX reference.
  mlir.register_lowering(p, sharding.lowering(p, reference_lowering, partition_rule))
  if kernel is not None:
    mlir.register_lowering(p, sharding.lowering(p, cuda_lowering, partition_rule), platform="cuda")
  if vmap is not None:
    batching.primitive_batchers[p] = vmap(p)
  ad.primitive_jvps[p] = jvp if jvp is not None else _not_differentiable(user_fn)
  defined = Op(p=p, user_fn=user_fn, reference=reference, reference_lowering=reference_lowering,
               cuda_lowering=cuda_lowering, graph_safe=graph_safe)
  OPS[name] = defined
  return defined


def ffi_with_workspace(target: str, ctx, args, workspace_bytes: int, **attrs):
  """The FFI call of a GEMM whose kernel takes a workspace (stream-K partials and flags) as a
  second result: XLA owns the memory, so it is valid under CUDA-graph replay and nothing is
  allocated at run time. Returns the GEMM's result only."""
  ws_aval = ShapedArray((max(int(workspace_bytes), 16),), np.dtype(np.uint8))
  rule = jax.ffi.ffi_lowering(target)
  sub = ctx.replace(avals_out=[ctx.avals_out[0], ws_aval])
  return [rule(sub, *args, **attrs)[0]]
