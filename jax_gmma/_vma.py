"""Varying manual mesh axes ("vma", shard_map's ``check_vma=True`` types) for the primitives.

Inside ``jax.shard_map`` every value is typed with the manual mesh axes it varies over. JAX's
own ops give their outputs the union of their inputs' axes; a custom primitive has to say so in
its abstract evaluation (:func:`out_aval`), and a ``custom_vjp`` has to return each cotangent
with its primal's type (:func:`match`: summed over the axes the primal does not vary over, as
JAX's transpose of the implicit broadcast does). Outside shard_map, and under
``check_vma=False``, every set is empty and nothing changes.
"""
from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ._compat import HAS_MANUAL_AXIS_TYPE, ShapedArray, manual_axis_type


def varying(aval) -> frozenset:
  """The manual mesh axes an aval varies over (empty outside shard_map / with check_vma off)."""
  mat = getattr(aval, "mat", None)
  return frozenset(getattr(mat, "varying", None) or ())


def out_aval(shape, dtype, *avals) -> ShapedArray:
  """ShapedArray(shape, dtype) varying over every manual axis any of ``avals`` varies over."""
  sets = [varying(a) for a in avals]
  union = frozenset().union(*sets)
  if not union or not HAS_MANUAL_AXIS_TYPE:
    return ShapedArray(shape, dtype)
  base = next(a for a, s in zip(avals, sets) if s)
  mat = manual_axis_type(union)
  sharding = NamedSharding(base.sharding.mesh, PartitionSpec(*([None] * len(shape))))
  return ShapedArray(shape, dtype, sharding=sharding, manual_axis_type=mat)


def match(ct, like):
  """Cotangent ``ct`` typed like the primal ``like`` (an array or tracer of the same vma):
  summed over the axes only ``ct`` varies over, broadcast over the axes only ``like`` does."""
  have, want = varying(jax.typeof(ct)), varying(jax.typeof(like))
  extra, missing = tuple(sorted(have - want)), tuple(sorted(want - have))
  if extra:
    ct = jax.lax.psum(ct, extra)
  if missing:
    ct = jax.lax.pcast(ct, missing, to="varying")
  return ct


def like(x):
  """A zero-size stand-in for ``x`` in a custom_vjp's residuals: x's dtype and shard_map type,
  no data (what :func:`match` needs of the primal)."""
  return x.reshape(-1)[:0]


def bias_cotangent(g2, bias):
  """The cotangent of a bias added to every row of g2 (M, N): the float32 column sums in the
  bias's dtype, typed like the bias (None without one)."""
  if bias is None:
    return None
  return match(g2.astype("float32").sum(0).astype(bias.dtype), bias)
