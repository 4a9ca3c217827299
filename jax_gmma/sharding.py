"""Sharded operands under ``jax.jit``: how each primitive is partitioned across devices.

XLA's partitioner (Shardy, or GSPMD) cannot see inside a custom call, so on its own it gathers a
custom call's sharded operands onto every device and runs the whole product everywhere. Each
primitive's lowering therefore goes through :func:`lowering`: in a program partitioned over
several devices (``jax.jit`` with sharded inputs or ``out_shardings``, Auto or Explicit mesh
axes) it is wrapped in ``jax.experimental.custom_partitioning``, whose partition callback (run
by XLA at compile time, with the global shapes and the shardings the partitioner proposes)
picks which dimensions stay sharded and lowers the primitive again on the local shapes, where
the CUDA lowering plans its kernel for the shard it runs. Single-device programs, shard_map
bodies and pmap lower as before.

The rules, one :class:`Rule` per primitive, each declared by its family (jax_gmma/ops/*.py)
with the helpers of this module:

- every dimension is named by a factor: ``m`` (tokens), ``n`` (output features), ``k`` (the
  contraction), one name per scale / bias dimension tied to it, a fresh name for a dimension
  that is never split (swizzled or padded scale layouts, packed K);
- a factor stays sharded when the mesh axes it arrives with are not taken by an earlier factor
  and the local shape still meets the kernel's rules (divisibility, alignment, whole scale
  blocks); otherwise its operands are gathered (replicated) along it and a warning says which
  dimension, why, and what it costs;
- the contraction ``k`` may stay sharded for ``fp8_gemm``, the block-scaled GEMM and
  ``ragged_dot`` (QuantizedArray experts): each
  device computes its partial product in float32, the partials are summed over the mesh axes
  (``psum``), then the bias is added and the result cast, so the result is the single-device
  product up to the order of float32 additions.

Never split (gathered, with a warning, when they arrive sharded): the K dimension of the
weight-only kernel, of ``mx_gemm`` and of quantization (packed K tiles, swizzled scale atoms,
padded K), and the experts ``G`` of ``ragged_dot`` (expert parallelism is the model's all-to-all
inside ``shard_map``).
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

from ._compat import (SPMDAxisContext, ShardingContext, custom_partitioning,
                      requires_devices_during_lowering)

F32 = np.dtype(np.float32)


class ShardingWarning(UserWarning):
  """A sharded operand dimension of a jax-gmma op is gathered before the op runs."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """How one primitive partitions.

  operands / results: a factor name per dimension of each operand / result (the Shardy rule).
  shardable: factors that may stay sharded, in priority order (mesh axes taken by an earlier
    factor are not reused for a later one).
  ties: factor -> the shardable factor it is split with, beyond the block factors of
    ``compound``, which are tied to their factor already (a scale dimension that runs along a
    data dimension at another size: 128-row scale blocks, 16-row weight strips).
  check: (factor, shard count) -> None when every shard still meets the kernel's rules, else
    the reason it does not.
  reduction: contraction factors in ``shardable``: each device computes ``partial(prim, args,
    params)`` (float32), the partials are summed over the mesh axes, and ``finish(sum, args,
    params)`` gives the result.
  local_params: (params, local operand shapes) -> the params to bind on a shard.
  compound: a tied factor's block structure for the Shardy rule (see sdy_rule).
  """
  operands: Tuple[Tuple[str, ...], ...]
  results: Tuple[Tuple[str, ...], ...]
  shardable: Tuple[str, ...]
  check: Callable[[str, int], Optional[str]]
  ties: Dict[str, str] = dataclasses.field(default_factory=dict)
  reduction: Tuple[str, ...] = ()
  partial: Optional[Callable] = None
  finish: Optional[Callable] = None
  local_params: Optional[Callable] = None
  compound: Dict[str, tuple] = dataclasses.field(default_factory=dict)

  def leader(self, f: str) -> str:
    if f in self.ties:
      return self.ties[f]
    for lead, c in self.compound.items():
      if c[0] == f and lead in self.shardable:
        return lead
    return f

  def sdy_rule(self):
    """The Shardy sharding rule (propagation: which shardings XLA proposes around the op;
    the partition callback decides). A factor with a tied block dimension (``compound``:
    factor -> (block factor, within-block factor, block size[, block count where the block
    factor appears only in compounds])) is written as the compound
    ``(block within)``, so that Shardy splits the data and its scale blocks alike."""
    def names(f):
      return self.compound[f][:2] if f in self.compound else (f,)

    def text(dims):
      return " ".join(f"({' '.join(names(f))})" if f in self.compound else f for f in dims)

    ops = ", ".join(text(o) for o in self.operands)
    res = ", ".join(text(r) for r in self.results)
    order = list(dict.fromkeys(n for o in self.operands + self.results for f in o for n in names(f)))
    in_results = {n for r in self.results for f in r for n in names(f)}
    reducing = {n for f in self.reduction for n in names(f)}
    reducing |= {n for n in order if self.leader(n) in self.reduction}
    sizes = {c[1]: c[2] for c in self.compound.values()}
    sizes.update({c[0]: c[3] for c in self.compound.values() if len(c) > 3})  # only in compounds
    # (Shardy wants each list in the factors' order of appearance)
    return f"{ops} -> {res}", dict(
        reduction_factors=tuple(n for n in order if n in reducing),
        need_replication_factors=tuple(n for n in order if n not in in_results and n not in reducing),
        **sizes)


#: primitive name -> (avals_in, params) -> Rule, as the families declared them
RULES: Dict[str, Callable] = {}


def vector(name: str, fresh: str, length: int, full: int) -> Tuple[str, ...]:
  """A per-row / per-column vector operand: tied to ``name`` when it has one entry per row
  (``full`` > 1), else a per-tensor scalar under a fresh factor."""
  return (name,) if length == full and full > 1 else (fresh,)


def fresh(prefix: str, ndim: int) -> Tuple[str, ...]:
  return tuple(f"{prefix}{i}" for i in range(ndim))


def divides(size: int, d: int, what: str) -> Optional[str]:
  return None if size % d == 0 else f"{what} = {size} is not a multiple of the {d} shards"


def aligned(size: int, d: int, align: int, what: str) -> Optional[str]:
  r = divides(size, d, what)
  if r is None and (size // d) % align:
    r = f"each shard's {what} ({size // d}) would not be a multiple of {align}"
  return r


def bias_factors(bias, n) -> Tuple[str, ...]:
  # (without a bias the operand is an ignored placeholder -- fp8_gemm passes its (N,) scales --
  # split like a bias, so that it is never gathered)
  return vector("n", "c", bias.shape[0], n)


def finish_bias(bias_index: int):
  def finish(acc, args, p):
    if p["has_bias"]:
      acc = acc + args[bias_index].astype(F32).reshape(1, -1)
    return acc.astype(p["out_dtype"])
  return finish


def partial_f32(prim, args, p):
  """The GEMM (a, b, scales, scales, bias) on a K shard without its bias, in float32 (summed
  across shards next)."""
  return prim.bind(*args[:4], jnp.zeros((1,), F32), **{**p, "out_dtype": F32, "has_bias": False})


# -- the partition callback -------------------------------------------------------------------------

def _axes(entry) -> Tuple[str, ...]:
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes: Tuple[str, ...]):
  return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def _specs(shapes_) -> list:
  out = []
  for s in shapes_:
    sh = getattr(s, "sharding", None)
    ndim = len(s.shape)
    spec = tuple(sh.spec) if isinstance(sh, NamedSharding) else ()
    spec = tuple(spec) + (None,) * (ndim - len(spec))
    # (a dimension of size 1 -- a per-tensor scale, a placeholder -- costs nothing to gather)
    out.append(tuple(e if size > 1 else None for e, size in zip(spec, s.shape)))
  return out


def plan(rule: Rule, mesh_shape: Dict[str, int], specs) -> Tuple[Dict[str, tuple], list]:
  """Which factors stay sharded over which mesh axes, from the operands' partition specs, and
  (factor, axes, reason) for each sharded operand dimension that is gathered instead. Pure."""
  wanted: Dict[str, tuple] = {}
  for labels, spec in zip(rule.operands, specs):
    for f, e in zip(labels, spec):
      lead = rule.leader(f)
      if lead in rule.shardable and lead not in wanted and _axes(e):
        wanted[lead] = _axes(e)
  chosen: Dict[str, tuple] = {}
  dropped = []
  used = set()
  for f in rule.shardable:
    axes = wanted.get(f)
    if not axes:
      continue
    if used & set(axes):
      dropped.append((f, axes, f"mesh axes {axes} already split another dimension"))
      continue
    why = rule.check(f, math.prod(mesh_shape[a] for a in axes))
    if why:
      dropped.append((f, axes, why))
      continue
    chosen[f] = axes
    used |= set(axes)
  reported = {f for f, _, _ in dropped}
  for labels, spec in zip(rule.operands, specs):
    for f, e in zip(labels, spec):
      lead = rule.leader(f)
      if _axes(e) and chosen.get(lead) != _axes(e) and lead not in reported:
        reported.add(lead)
        dropped.append((lead, _axes(e), "this op does not split that dimension"
                        if lead not in rule.shardable else f"split over {chosen.get(lead)} instead"))
  return chosen, dropped


def _named(mesh, labels, chosen, rule):
  return NamedSharding(mesh, PartitionSpec(*(_entry(chosen.get(rule.leader(f), ())) for f in labels)))


def _warn(name: str, dropped) -> None:
  for f, axes, why in dropped:
    warnings.warn(f"jax_gmma ({name}): the operands' '{f}' dimension arrives sharded over mesh "
                  f"axes {axes}, and is gathered onto every device before the op runs: {why}. "
                  "Shard it differently (see the README's multi-device section) or wrap the "
                  "op in jax.shard_map.", ShardingWarning, stacklevel=2)


def _partitioned(prim, avals_in, params):
  """A custom_partitioning function that binds ``prim`` with ``params``."""
  rule = RULES[prim.name](avals_in, params)
  multi = prim.multiple_results

  def whole(*args):
    out = prim.bind(*args, **params)
    return tuple(out) if multi else out

  cp = custom_partitioning(whole)

  def results(mesh, chosen):
    outs = tuple(_named(mesh, r, chosen, rule) for r in rule.results)
    return outs if multi else outs[0]

  def infer(mesh, arg_shapes, result_shape):
    chosen, _ = plan(rule, dict(mesh.shape), _specs(arg_shapes))
    return results(mesh, chosen)

  def partition(mesh, arg_shapes, result_shape):
    chosen, dropped = plan(rule, dict(mesh.shape), _specs(arg_shapes))
    _warn(prim.name, dropped)
    reduce_axes = tuple(a for f in rule.reduction for a in chosen.get(f, ()))

    def local(*args):
      p = params if rule.local_params is None else rule.local_params(params, [x.shape for x in args])
      if reduce_axes:
        acc = jax.lax.psum(rule.partial(prim, args, p), reduce_axes)
        return rule.finish(acc, args, p)
      out = prim.bind(*args, **p)
      return tuple(out) if multi else out

    args = tuple(_named(mesh, o, chosen, rule) for o in rule.operands)
    return mesh, local, results(mesh, chosen), args

  text, factors = rule.sdy_rule()
  cp.def_partition(partition=partition, infer_sharding_from_operands=infer,
                   sharding_rule=text, **factors)
  return cp


def _spmd(ctx) -> bool:
  """Whether this lowering is of a program that XLA partitions across several devices (not a
  single device, not inside shard_map's manual axes, not pmap)."""
  ac = ctx.module_context.axis_context
  if isinstance(ac, ShardingContext):
    return ac.num_devices > 1
  if isinstance(ac, SPMDAxisContext):
    return not ac.manual_axes and ac.mesh.size > 1
  return False


def lowering(prim, rule: Callable, partition_rule: Optional[Callable] = None) -> Callable:
  """``prim``'s lowering ``rule``, partitioned across devices (see the module docstring) where
  the program is partitioned, by ``partition_rule`` ((avals_in, params) -> :class:`Rule`).
  Every primitive of the package registers its lowerings through this (by
  :func:`jax_gmma.primitive.define`: one place for multi-device behaviour, as _vma is for
  shard_map types)."""
  if partition_rule is not None:
    RULES[prim.name] = partition_rule
  if custom_partitioning is None or prim.name not in RULES:
    return rule
  # custom_partitioning's lowering needs the device assignment (as jax's cuDNN ops do)
  requires_devices_during_lowering(prim)

  def lower(ctx, *args, **params):
    if not _spmd(ctx):
      return rule(ctx, *args, **params)
    fn = _partitioned(prim, ctx.avals_in, params)
    return mlir.lower_fun(fn, multiple_results=prim.multiple_results)(ctx, *args)

  return lower
