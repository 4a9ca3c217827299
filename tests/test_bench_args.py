"""Argument parsing of benchmarks/bench_fp8.py (CPU): --decode-shapes N:K lists."""
import argparse
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench_fp8():
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    spec = importlib.util.spec_from_file_location("bench_fp8_under_test",
                                                  os.path.join(ROOT, "benchmarks", "bench_fp8.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
  finally:
    sys.path.pop(0)


def test_decode_shapes_parse():
  b = _bench_fp8()
  assert b._nk_list("6144:4096,4096:4096,28672:4096") == [(6144, 4096), (4096, 4096), (28672, 4096)]
  assert b._nk_list("") == []
  for bad in ("6144x4096", "6144:", "a:b"):
    with pytest.raises(argparse.ArgumentTypeError, match="is not N:K"):
      b._nk_list(bad)
