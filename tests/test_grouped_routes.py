"""benchmarks/grouped_routes.py on a CPU: its quick run checks every route against float64 and the
other route, writes the JSON and markdown, and restores the library's thresholds after each
forced route; --render-only re-renders a run."""
import json
import os
import subprocess
import sys

import pytest
from _examples import load_benchmark

from jax_gmma.ops import grouped_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "grouped_routes.py")


def _load():
  return load_benchmark("grouped_routes.py", "grouped_routes_under_test")


def test_quick_run_checks_and_reports(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--quick", "--specs", "fp8_128x128,wo:mxfp4",
                      "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((tmp_path / "grouped_routes.json").read_text())
  assert not data["failures"]
  rows = data["rows"]
  assert len(rows) == 2 * 2 * 2  # specs x rows x routes
  assert all(r["status"] == "ok" for r in rows)
  assert {r["route"] for r in rows} == {"tiles_64", "tiles_128", "weightonly", "bf16_route"}
  md = (tmp_path / "grouped_routes.md").read_text()
  assert md.count("| 4 x 64 x 256 |") == 4
  (tmp_path / "grouped_routes.md").unlink()
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--render-only", str(tmp_path)], env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and (tmp_path / "grouped_routes.md").read_text() == md


def test_forced_thresholds_are_scoped():
  b = _load()
  before = grouped_configs.PREFILL_128_MIN_ROWS
  with pytest.raises(RuntimeError):
    with b.forced(PREFILL_128_MIN_ROWS=0):
      assert grouped_configs.PREFILL_128_MIN_ROWS == 0
      raise RuntimeError("cell failed")
  assert grouped_configs.PREFILL_128_MIN_ROWS == before
  assert b.picked("wo:mxfp4", 32, grouped_configs.WEIGHTONLY_BF16_MIN_ROWS) == "bf16_route"
  assert b.picked("fp8_128x128", 32, grouped_configs.PREFILL_128_MIN_ROWS - 1) == "tiles_64"
