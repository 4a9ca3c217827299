"""``jax.vmap`` rule builders of the GEMM primitives (mechanism only: each family hands its
pieces to :func:`jax_gmma.primitive.define`).

Every GEMM primitive multiplies row-side operands (the activation rows and their per-row
scales) by weight-side operands (the weight, its scales, bias). When only row-side operands are
batched, the batch is folded into M: one kernel launch for the whole batch (rows are
independent, so the result equals one GEMM per batch element). When a weight-side operand is
batched (a different weight per batch element), the batch runs as ``lax.map`` over the batch:
one GEMM per element, still on the kernel. MX primitives (swizzled, 128-row-padded scale
layouts) always take the ``lax.map`` path.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

NOT_MAPPED = None  # jax.interpreters.batching.not_mapped (not public in every supported JAX)


def batch_size(args, dims):
  for a, d in zip(args, dims):
    if d is not NOT_MAPPED:
      return a.shape[d]
  raise AssertionError("batching rule called without a batched operand")


def front(x, d, size):
  """x with its batch dim first; an unbatched x broadcast to the batch."""
  if d is NOT_MAPPED:
    return jnp.broadcast_to(x, (size,) + x.shape)
  return jnp.moveaxis(x, d, 0)


def map_rule(prim):
  """The general rule: one primitive call per batch element (``lax.map``). Also a ``vmap``
  builder for :func:`jax_gmma.primitive.define`."""
  def rule(args, dims, **params):
    idx = [i for i, d in enumerate(dims) if d is not NOT_MAPPED]
    mapped = [jnp.moveaxis(args[i], dims[i], 0) for i in idx]

    def one(xs):
      full = list(args)
      for i, x in zip(idx, xs):
        full[i] = x
      return prim.bind(*full, **params)

    return lax.map(one, mapped), 0
  return rule


def rows_scale(s, d, size, m):
  """A row-side scale operand, (1,) per tensor or (M,) per row, under a batch of ``size``:
  (size * M,) per row, or the unbatched (1,) as it is."""
  if d is NOT_MAPPED and s.shape[0] == 1:
    return s
  s = front(s, d, size)
  return jnp.broadcast_to(s.reshape(size, -1), (size, m)).reshape(size * m)


def fold_rule(prim, weight_side, fold_rest):
  """The rule of a GEMM primitive whose operand 0 is the (M, K) activation: the batch folded
  into M when no operand in ``weight_side`` is batched, else :func:`map_rule`.
  ``fold_rest(args, dims, size, m, k, params)`` returns the other row-side operands (and params)
  for the folded M."""
  def rule(args, dims, **params):
    if any(dims[i] is not NOT_MAPPED for i in weight_side):
      return map_rule(prim)(args, dims, **params)
    size = batch_size(args, dims)
    a3 = front(args[0], dims[0], size)
    m = a3.shape[1]
    new, params = fold_rest(list(args), dims, size, m, a3.shape[2], dict(params))
    new[0] = a3.reshape(size * m, a3.shape[2])
    out = prim.bind(*new, **params)
    return out.reshape(size, m, out.shape[-1]), 0
  return rule


def fold(weight_side, fold_rest):
  """A ``vmap`` builder for :func:`jax_gmma.primitive.define`: :func:`fold_rule` of the
  primitive with these weight-side operands and row-side ``fold_rest``."""
  return lambda prim: fold_rule(prim, weight_side, fold_rest)
