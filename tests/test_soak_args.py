"""benchmarks/soak.py on CPU (the reference path): argument parsing, and a tiny run in a
subprocess that writes soak.json / soak.md / soak.png."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "soak.py")


def _soak():
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import soak
  finally:
    sys.path.pop(0)
  return soak


def test_parse_args():
  soak = _soak()
  a = soak.parse_args([])
  assert a.calls == 100000 and a.chunk == 1000 and a.families == list(soak.ALL)
  a = soak.parse_args(["--quick"])
  assert a.calls == 2000 and a.quick
  a = soak.parse_args(["--calls", "20", "--families", "fp8_channel,quantize", "--out", "d"])
  assert a.calls == 20 and a.families == ["fp8_channel", "quantize"] and a.out == "d"
  with pytest.raises(SystemExit):
    soak.parse_args(["--families", "fp9"])
  with pytest.raises(SystemExit):
    soak.parse_args(["--calls", "0"])


def test_tiny_run_writes_the_files(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  out = tmp_path / "soak"
  r = subprocess.run([sys.executable, SCRIPT, "--calls", "20", "--families", "fp8_channel", "--out",
                      str(out)], env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((out / "soak.json").read_text())
  assert data["meta"]["suite"] == "soak" and not data["failures"]
  (row,) = data["rows"]
  assert row["family"] == "fp8_channel" and row["calls"] == 20 and row["chunks"] == 4
  assert row["identical"] and row["recompiled"] and row["finite"]
  assert data["threads"]["ok"]
  md = (out / "soak.md").read_text()
  assert "| fp8_channel |" in md and "bit-identical to one thread" in md
  try:
    import matplotlib  # noqa: F401
  except ImportError:
    return
  assert (out / "soak.png").stat().st_size > 1000
