"""JAX transformations of the GEMM primitives: ``jax.vmap`` rules, and clear errors for
differentiation of the raw primitives.

vmap. Every GEMM primitive multiplies row-side operands (the activation rows and their per-row
scales) by weight-side operands (the weight, its scales, bias). When only row-side operands are
batched, the batch is folded into M: one kernel launch for the whole batch (rows are
independent, so the result equals one GEMM per batch element). When a weight-side operand is
batched (a different weight per batch element), the batch runs as ``lax.map`` over the batch:
one GEMM per element, still on the kernel. MX primitives (swizzled, 128-row-padded scale
layouts) always take the ``lax.map`` path.

Differentiation. The primitives take raw FP8 / packed operands; their gradients are not
defined. Differentiate :func:`jax_gmma.dot` (gradient w.r.t. the float activations, the
quantized weight a constant) or train with :func:`jax_gmma.fp8_linear` (FP8 GEMMs forward and
backward). The JVP rules registered here raise an error that says so.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad, batching

from . import blockwise, mx, ops, weightonly

NOT_MAPPED = None  # jax.interpreters.batching.not_mapped (not public in every supported JAX)


def _batch_size(args, dims):
  for a, d in zip(args, dims):
    if d is not NOT_MAPPED:
      return a.shape[d]
  raise AssertionError("batching rule called without a batched operand")


def _front(x, d, size):
  """x with its batch dim first; an unbatched x broadcast to the batch."""
  if d is NOT_MAPPED:
    return jnp.broadcast_to(x, (size,) + x.shape)
  return jnp.moveaxis(x, d, 0)


def map_rule(prim):
  """The general rule: one primitive call per batch element (``lax.map``)."""
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


def _rows_scale(s, d, size, m):
  """A row-side scale operand, (1,) per tensor or (M,) per row, under a batch of ``size``:
  (size * M,) per row, or the unbatched (1,) as it is."""
  if d is NOT_MAPPED and s.shape[0] == 1:
    return s
  s = _front(s, d, size)
  return jnp.broadcast_to(s.reshape(size, -1), (size, m)).reshape(size * m)


def fold_rule(prim, weight_side, fold_rest):
  """The rule of a GEMM primitive whose operand 0 is the (M, K) activation: the batch folded
  into M when no operand in ``weight_side`` is batched, else :func:`map_rule`.
  ``fold_rest(args, dims, size, m, k, params)`` returns the other row-side operands (and params)
  for the folded M."""
  def rule(args, dims, **params):
    if any(dims[i] is not NOT_MAPPED for i in weight_side):
      return map_rule(prim)(args, dims, **params)
    size = _batch_size(args, dims)
    a3 = _front(args[0], dims[0], size)
    m = a3.shape[1]
    new, params = fold_rest(list(args), dims, size, m, a3.shape[2], dict(params))
    new[0] = a3.reshape(size * m, a3.shape[2])
    out = prim.bind(*new, **params)
    return out.reshape(size, m, out.shape[-1]), 0
  return rule


def _fp8_gemm_rest(args, dims, size, m, k, params):
  # (a, b, a_scale, b_scale, bias): a_scale (1,) or (M,)
  args[2] = _rows_scale(args[2], dims[2], size, m)
  return args, params


def _blockwise_rest(args, dims, size, m, k, params):
  # (a, b, a_scales_t, b_scales_t, bias): a_scales_t in the kernel layout (kb, scale_ld(M)) per
  # element -> (kb, size * M) -> padded kernel layout
  s = _front(args[2], dims[2], size)[:, :, :m]               # (size, kb, M)
  s = jnp.moveaxis(s, 0, 1).reshape(s.shape[1], size * m)    # (kb, size * M)
  args[2] = blockwise.kernel_scale_layout(s.T)
  return args, params


def _weightonly_rest(args, dims, size, m, kp, params):
  # (x, x_scale, packed, scales, global_scale, bias): x_scale (M,) or an ignored (1,)
  if params["has_x_scale"]:
    args[1] = _rows_scale(args[1], dims[1], size, m)
  elif dims[1] is not NOT_MAPPED:  # placeholder operand, ignored
    args[1] = jnp.moveaxis(args[1], dims[1], 0)[0]
  # The CTA shape was picked for M rows: re-picked for size * M unless it was forced.
  fmt, n = params["fmt"], params["n"]
  if (params["rows"], params["tokens"], params["k_warps"]) == weightonly.pick_cta(m, n, kp, fmt):
    params["rows"], params["tokens"], params["k_warps"] = weightonly.pick_cta(size * m, n, kp, fmt)
  return args, params


_fp8_gemm_rule = fold_rule(ops.fp8_gemm_p, (1, 3, 4), _fp8_gemm_rest)
_blockwise_rule = fold_rule(blockwise.fp8_blockwise_gemm_p, (1, 3, 4), _blockwise_rest)
_weightonly_rule = fold_rule(weightonly.weightonly_gemm_p, (2, 3, 4, 5), _weightonly_rest)


batching.primitive_batchers[ops.fp8_gemm_p] = _fp8_gemm_rule
batching.primitive_batchers[blockwise.fp8_blockwise_gemm_p] = _blockwise_rule
batching.primitive_batchers[weightonly.weightonly_gemm_p] = _weightonly_rule
batching.primitive_batchers[mx.mx_gemm_p] = map_rule(mx.mx_gemm_p)
batching.primitive_batchers[weightonly.weightonly_unpack_p] = map_rule(weightonly.weightonly_unpack_p)


# -- differentiation -----------------------------------------------------------------------------

_WHAT = {
    ops.fp8_gemm_p: "jax_gmma.fp8_gemm",
    blockwise.fp8_blockwise_gemm_p: "jax_gmma.blockwise_gemm / scaled_matmul",
    mx.mx_gemm_p: "jax_gmma.mx_gemm / scaled_matmul",
    weightonly.weightonly_gemm_p: "jax_gmma.weightonly_gemm",
    weightonly.weightonly_unpack_p: "jax_gmma.weightonly.unpack",
}


class NotDifferentiable(TypeError):
  """A raw-operand GEMM primitive was differentiated."""


def _no_jvp(prim):
  def rule(primals, tangents, **params):
    raise NotDifferentiable(
        f"{_WHAT[prim]} is not differentiable: it multiplies raw FP8 / packed operands. "
        "Differentiate jax_gmma.dot(x, w_q) instead (gradient w.r.t. the float activations x "
        "and bias; the quantized weight is a constant), or train with jax_gmma.fp8_linear(x, w) "
        "(float x and w, FP8 GEMMs forward and backward)")
  return rule


for _p in _WHAT:
  ad.primitive_jvps[_p] = _no_jvp(_p)
