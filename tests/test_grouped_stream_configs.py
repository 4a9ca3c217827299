"""benchmarks/grouped_stream_configs.py on a CPU: its quick run checks every cell against float64
and writes the JSON and markdown; the config it forces is the one ragged_dot lowers with, and the
library's own pick is restored after it."""
import json
import os
import subprocess
import sys

import pytest
from _examples import load_benchmark

from jax_gmma.ops import grouped_configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "grouped_stream_configs.py")


def _load():
  return load_benchmark("grouped_stream_configs.py", "grouped_stream_configs_under_test")


def test_quick_run_checks_and_reports(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--quick", "--out", str(tmp_path)], env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((tmp_path / "grouped_stream_configs.json").read_text())
  assert not data["failures"]
  rows = data["rows"]
  # two GEMMs x (four streaming configs + the weight-only kernel's own pick)
  assert len(rows) == 2 * (len(grouped_configs.CONFIGS) + 1)
  assert all(r["status"] == "ok" and r["rel_err"] <= r["tol"] for r in rows)
  assert {r["config"] for r in rows} == set(grouped_configs.CONFIGS) | {"auto"}
  md = (tmp_path / "grouped_stream_configs.md").read_text()
  assert md.count("| tiny |") == 2 and "stream_16x8_kw4" in md


def test_forced_config_is_scoped():
  b = _load()
  pick = grouped_configs.select_config
  p = grouped_configs.GroupedProblem(m=1024, n=4096, k=2048, g=8, fmt="fp8_128x128")
  with b.forced_config("stream_16x8_kw8"):
    assert grouped_configs.select_config(p, 132) == "stream_16x8_kw8"
  assert grouped_configs.select_config is pick
  with pytest.raises(RuntimeError):
    with b.forced_config("stream_16x8_kw4"):
      raise RuntimeError("cell failed")
  assert grouped_configs.select_config is pick


def test_bad_arguments_are_refused():
  b = _load()
  with pytest.raises(SystemExit):
    b.parse_args(["--configs", "stream_16x32_kw4"])
  with pytest.raises(SystemExit):
    b.parse_args(["--presets", "llama"])
