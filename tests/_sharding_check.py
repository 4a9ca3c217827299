"""The check the sharding end-to-end scripts share (they run in a subprocess with virtual or real
devices; tests/test_sharding.py and tests/test_ragged_dot_sharding.py put tests/ on its path)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jax_gmma.sharding import ShardingWarning

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def check_sharded(fn, args, specs, mesh, want_collectives=(), warn=None, exact=True, rtol=2e-2,
                  kernels=False):
  """fn(*args) with args placed per specs on mesh (None: replicated) == fn on one device
  (bit-identical when exact, else within rtol); the compiled program's collectives are exactly
  want_collectives; a ShardingWarning iff warn (its text in the first one); with kernels, a
  jax-gmma FFI call in the compiled program."""
  want = jax.jit(fn)(*args)
  placed = [jax.device_put(a, NamedSharding(mesh, P() if s is None else s)) for a, s in zip(args, specs)]
  f = jax.jit(fn)
  assert "CustomSPMDPartitioning" in f.lower(*placed).as_text(), "not partitioned by jax_gmma"
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hlo = f.lower(*placed).compile().as_text()
  got = f(*placed)
  msgs = [str(w.message) for w in caught if issubclass(w.category, ShardingWarning)]
  assert bool(msgs) == bool(warn) and (not warn or warn in msgs[0]), msgs
  found = tuple(c for c in COLLECTIVES if c in hlo)
  assert found == tuple(want_collectives), (found, want_collectives)
  assert not kernels or 'custom_call_target="jax_gmma' in hlo, "no jax-gmma kernel in the program"
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g.astype(jnp.float32)), np.asarray(w.astype(jnp.float32))
    if exact:
      assert np.array_equal(g, w, equal_nan=True), float(np.abs(g - w).max())
    else:
      np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * float(np.abs(w).max()))
  return got
