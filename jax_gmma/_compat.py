"""The one module that reaches into ``jax._src`` or version-dependent jax paths.

Everything else in jax_gmma imports these names from here, so a JAX upgrade that moves one of
them is fixed in one place.
"""
from __future__ import annotations

try:  # jax >= 0.4.36
  from jax.extend.core import Primitive
except ImportError:  # pragma: no cover
  from jax.core import Primitive
from jax.core import ShapedArray
from jax._src import dispatch as _dispatch
from jax._src import sharding_impls as _sharding_impls

try:
  from jax._src import core as _core  # ShapedArray(..., manual_axis_type=), ManualAxisType
  HAS_MANUAL_AXIS_TYPE = hasattr(_core, "ManualAxisType")
except ImportError:  # pragma: no cover
  _core, HAS_MANUAL_AXIS_TYPE = None, False

try:
  from jax.experimental.custom_partitioning import custom_partitioning
except ImportError:  # pragma: no cover
  custom_partitioning = None

try:  # public in jax >= 0.4.31 (jax.export)
  from jax.export import is_symbolic_dim
  from jax.export import register_pytree_node_serialization
except ImportError:  # pragma: no cover
  from jax._src.core import is_symbolic_dim
  from jax._src.export._export import register_pytree_node_serialization

__all__ = ["Primitive", "ShapedArray", "apply_primitive", "requires_devices_during_lowering",
           "ShardingContext", "SPMDAxisContext", "HAS_MANUAL_AXIS_TYPE", "manual_axis_type",
           "custom_partitioning", "is_symbolic_dim", "register_pytree_node_serialization"]

#: Eager execution of a primitive (through jit).
apply_primitive = _dispatch.apply_primitive
#: The lowering's axis contexts (single program partitioned by XLA / shard_map manual axes).
ShardingContext = _sharding_impls.ShardingContext
SPMDAxisContext = _sharding_impls.SPMDAxisContext


def requires_devices_during_lowering(prim) -> None:
  """Marks ``prim`` as needing the device assignment when lowered (custom_partitioning's
  lowering does, as jax's cuDNN ops do)."""
  _dispatch.prim_requires_devices_during_lowering.add(prim)


def manual_axis_type(varying: frozenset):
  """shard_map's type of a value varying over the manual axes ``varying``."""
  return _core.ManualAxisType(varying=varying, unreduced=frozenset(), reduced=frozenset())
