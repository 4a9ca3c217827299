"""Multi-GPU partitioning under jax.jit: the CPU test's script (tests/test_sharding.py) on the
machine's GPUs, where each shard runs the CUDA kernels planned for its local shape. Needs two
or more Hopper GPUs (skipped otherwise)."""
import os

import pytest

from jax_gmma import _backend
from test_sharding import _SCRIPT, run_script  # noqa: E402 (tests/ helper)

pytestmark = pytest.mark.gpu


def test_partitioned_under_jit_on_gpus():
  n = len(_backend.cuda_devices())
  if n < 2:
    pytest.skip(f"needs 2 or more GPUs, this machine has {n}")
  flags = os.environ.get("XLA_FLAGS", "")
  r = run_script(_SCRIPT, {"JAX_GMMA_SHARDING_EXACT": "0", "JAX_GMMA_SHARDING_KERNELS": "1",
                           "XLA_FLAGS": flags, "JAX_PLATFORMS": "cuda"}, timeout=900)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-2000:], r.stderr[-4000:])
