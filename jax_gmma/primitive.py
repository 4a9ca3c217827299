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
import numpy as np
from jax.interpreters import ad, batching, mlir

from . import _backend, sharding
from ._compat import Primitive, ShapedArray, apply_primitive

__all__ = ["define", "Op", "OPS", "NotDifferentiable", "ffi_with_workspace"]


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
           graph_safe: bool = True) -> Op:
  """Defines the primitive ``name`` from a family's declaration.

  abstract_eval(*avals, **params): the output aval(s).
  reference(*args, **params): the pure-JAX computation (default lowering and fallback).
  user_fn: the user-facing function, named by the not-differentiable error.
  kernel(ctx, *args, **params): the CUDA lowering when a kernel can run (targets registered).
  kernel_missing(ctx, params): None when the kernel can run here, else why not (a sentence).
  op: the name in KernelUnavailable messages ("jax_gmma.<op>: <why>. Refusing ...").
  quiet_fallback: run the reference without a kernel, never refuse (quantization).
  partition_rule(avals_in, params) -> sharding.Rule: how the primitive partitions.
  vmap(prim) -> batching rule; jvp: a JVP rule instead of the not-differentiable error.
  graph_safe: the kernel's FFI handler is command-buffer compatible.
  """
  p = Primitive(name)
  p.multiple_results = multiple_results
  p.def_impl(functools.partial(apply_primitive, p))
  p.def_abstract_eval(abstract_eval)

  def reference_lowering(ctx, *args, **params):
    return mlir.lower_fun(reference, multiple_results=multiple_results)(ctx, *args, **params)

  def cuda_lowering(ctx, *args, **params):
    why = None if kernel_missing is None else kernel_missing(ctx, params)
    if why is not None:
      if quiet_fallback or _backend.reference_allowed():
        return reference_lowering(ctx, *args, **params)
      raise _backend.unavailable(op or name, why)
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
