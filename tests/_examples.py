"""Helpers shared by the tests of the examples (test_minilm.py, test_llama_decode.py).

Not a test module (pytest collects test_*.py only); imported as ``from _examples import ...``,
which works because pytest puts tests/ (no __init__.py, rootdir conftest) on sys.path.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

import jax_gmma
from jax_gmma import _backend

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


def load_example(filename: str, module_name: str):
  """Import ``examples/<filename>`` from its path as module ``module_name`` (registered in
  sys.modules, so jit-static dataclasses and pickling can find it); returns the module."""
  spec = importlib.util.spec_from_file_location(module_name, EXAMPLES_DIR / filename)
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod
  spec.loader.exec_module(mod)
  return mod


def skip_unless_dot_runs() -> None:
  """Skip the calling test or fixture on a CUDA GPU where ``jax_gmma.dot`` has no kernel (and
  the reference is not allowed), with jax_gmma's reason. On CPU/TPU ``dot`` is the pure-JAX
  reference: nothing to check."""
  if _backend.cuda_devices():
    try:
      _backend.check_cuda_kernels("dot")
    except jax_gmma.KernelUnavailable as e:
      pytest.skip(f"jax_gmma.dot cannot run on this GPU: {e}")
