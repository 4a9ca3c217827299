"""Helpers shared by the tests of the examples (test_minilm.py, test_llama_decode.py).

Not a test module (pytest collects test_*.py only); imported as ``from _examples import ...``,
which works because pytest puts tests/ (no __init__.py, rootdir conftest) on sys.path.
"""
import importlib.util
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jax_gmma
from jax_gmma import _backend

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def load_example(filename: str, module_name: str, directory: Path = EXAMPLES_DIR):
  """Import ``examples/<filename>`` (or ``directory/<filename>``) from its path as module
  ``module_name`` (registered in sys.modules, so jit-static dataclasses and pickling can find
  it); returns the module."""
  spec = importlib.util.spec_from_file_location(module_name, directory / filename)
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod
  spec.loader.exec_module(mod)
  return mod


def load_benchmark(filename: str, module_name: str):
  """``benchmarks/<filename>`` as module ``module_name``, its directory on sys.path while it
  imports (the benchmarks import their shared helpers from bench_fp8)."""
  sys.path.insert(0, str(BENCHMARKS_DIR))
  try:
    return load_example(filename, module_name, BENCHMARKS_DIR)
  finally:
    sys.path.pop(0)


def skip_unless_dot_runs() -> None:
  """Skip the calling test or fixture on a CUDA GPU where ``jax_gmma.dot`` has no kernel (and
  the reference is not allowed), with jax_gmma's reason. On CPU/TPU ``dot`` is the pure-JAX
  reference: nothing to check."""
  if _backend.cuda_devices():
    try:
      _backend.check_cuda_kernels("dot")
    except jax_gmma.KernelUnavailable as e:
      pytest.skip(f"jax_gmma.dot cannot run on this GPU: {e}")


def _is_weight(x) -> bool:
  return isinstance(x, (jax_gmma.QuantizedArray, jax_gmma.PackedWeight))


def assert_same_tree(a, b) -> None:
  """Two pytrees (e.g. the nnx states of a saved and a reloaded model) have the same structure,
  the same QuantizedArray / PackedWeight objects (format, shape, layout) at the same places, and
  bit-identical arrays of the same dtypes and shapes."""
  oa, ta = jax.tree_util.tree_flatten(a, is_leaf=_is_weight)
  ob, tb = jax.tree_util.tree_flatten(b, is_leaf=_is_weight)
  assert ta == tb, (ta, tb)
  for x, y in zip(oa, ob):
    assert type(x) is type(y), (x, y)
    if _is_weight(x):
      assert x.tree_flatten()[1] == y.tree_flatten()[1], (x, y)
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    assert (x.dtype, x.shape) == (y.dtype, y.shape), (x, y)
    np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))
