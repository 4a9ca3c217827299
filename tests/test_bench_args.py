"""Argument parsing of benchmarks/bench_fp8.py (CPU): --decode-shapes N:K lists, --large-configs
specs and --large-shapes lists; benchmarks/bench_weightonly.py's decode options and chain glue."""
import argparse
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_bench(name):
  """benchmarks/<name>.py as a module (its directory on sys.path while it imports)."""
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
  finally:
    sys.path.pop(0)


def _bench_fp8():
  return _load_bench("bench_fp8")


def test_decode_shapes_parse():
  b = _bench_fp8()
  assert b._nk_list("6144:4096,4096:4096,28672:4096") == [(6144, 4096), (4096, 4096), (28672, 4096)]
  assert b._nk_list("") == []
  for bad in ("6144x4096", "6144:", "a:b"):
    with pytest.raises(argparse.ArgumentTypeError, match="is not N:K"):
      b._nk_list(bad)


def test_large_config_specs_parse():
  b = _bench_fp8()
  assert b._config_spec("128x192x128_c2x1_coop_fast") == ("128x192x128_c2x1_coop_fast",
                                                          "128x192x128_c2x1_coop_fast", None, None, None)
  assert b._config_spec("cfg:0@1/n") == ("cfg:0@1/n", "cfg", 0, 1, "n")
  assert b._config_spec("cfg@/m") == ("cfg@/m", "cfg", None, None, "m")
  assert b._config_spec("cfg:2@4") == ("cfg:2@4", "cfg", 2, 4, None)
  for bad in ("", ":1", "cfg:x", "cfg@", "cfg@a/n", "cfg@1/z"):
    with pytest.raises(argparse.ArgumentTypeError, match="is not CONFIG"):
      b._config_spec(bad)
  args = b.parse_args(["--suite", "large", "--large-configs", "a,b:1@2/n", "--large-shapes", "64x128x256"])
  assert [c[0] for c in args.large_configs] == ["a", "b:1@2/n"]
  assert args.large_shapes == [(64, 128, 256)] and not args.single_call and args.large_sets == 0


def test_large_shapes_parse():
  b = _bench_fp8()
  assert b._mnk_list("4096x2112x7168,1x2x3") == [(4096, 2112, 7168), (1, 2, 3)]
  assert b._mnk_list("") == []
  for bad in ("4096x2112", "4096x2112x7168x1", "ax2x3"):
    with pytest.raises(argparse.ArgumentTypeError, match="is not MxNxK"):
      b._mnk_list(bad)


def _bench_weightonly():
  return _load_bench("bench_weightonly")


def test_weightonly_decode_args():
  b = _bench_weightonly()
  p = argparse.ArgumentParser()
  p.add_argument("--decode-shapes", type=b._nk_list)
  p.add_argument("--decode-ms", type=b._int_list)
  a = p.parse_args(["--decode-shapes", "28672:8192,8192:8192", "--decode-ms", "1,4"])
  assert a.decode_shapes == [(28672, 8192), (8192, 8192)] and a.decode_ms == (1, 4)
  for bad in ("0", "1,x", ""):
    with pytest.raises(argparse.ArgumentTypeError):
      b._int_list(bad)


def test_weightonly_chain_glue():
  """The decode chain's next input: 'prefix' takes the first M*K elements of the output (a
  contiguous prefix), 'columns' its first K columns; N < K tiles the output either way."""
  import numpy as np
  b = _bench_weightonly()
  y = np.arange(4 * 48, dtype=np.float32).reshape(4, 48)
  pre = np.asarray(b._to_k(y, 32, "prefix"), np.float32)
  col = np.asarray(b._to_k(y, 32, "columns"), np.float32)
  np.testing.assert_array_equal(pre, y.reshape(-1)[:128].reshape(4, 32).astype(np.float32))
  np.testing.assert_array_equal(col, y[:, :32])
  small = np.asarray(b._to_k(y[:, :16], 40, "prefix"), np.float32)
  np.testing.assert_array_equal(small, np.concatenate([y[:, :16]] * 3, axis=1)[:, :40])


def test_weightonly_prefill_interleaved(tmp_path):
  """The prefill suite at a tiny shape (any backend): every impl checked against its float64
  reference and timed in interleaved rounds."""
  import json
  b = _bench_weightonly()
  rc = b.main(["--suite", "prefill", "--prefill-ms", "128", "--prefill-shapes", "64:256",
               "--repeats", "2", "--repeat-ms", "1", "--rounds", "2", "--out", str(tmp_path),
               "--impls", "ours_nvfp4_fp8r,ours_mxfp4_fp8,ours_fp8"])
  assert rc == 0
  res = json.load(open(tmp_path / "bench_weightonly.json"))
  rows = [r for r in res["rows"] if r["suite"] == "prefill"]
  assert [r["impl"] for r in rows] == ["ours_nvfp4_fp8r", "ours_mxfp4_fp8", "ours_fp8"]
  assert all(r["rounds"] == 2 and r["us"] > 0 for r in rows) and not res["failures"]


def test_bench_train_smoke(tmp_path):
  """benchmarks/bench_train.py end to end on a tiny shape: every impl compiled, checked, timed
  in interleaved rounds, ratios to both peers, JSON + markdown written."""
  import json  # noqa: PLC0415
  b = _load_bench("bench_train")
  assert b.main(["--shapes", "32x128x256", "--rounds", "2", "--repeats", "1", "--target-s", "0.001",
                 "--out", str(tmp_path)]) == 0
  rows = json.load(open(tmp_path / "bench_train.json"))["rows"]
  assert {r["impl"] for r in rows} == set(b.IMPLS)
  for r in rows:
    assert r["rounds"] == 2 and r["vs_xla_fp8"] > 0 and r["vs_bf16"] > 0
    assert r["rel_err_y"] < (0.1 if "fp8" in r["impl"] else 1e-2)
  assert (tmp_path / "bench_train.md").exists()
