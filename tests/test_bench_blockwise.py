"""The block-scaled benchmark's smoke suite runs on CPU (pure-JAX reference path) and writes a
JSON with a row per implementation (torch is skipped without a CUDA GPU)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_blockwise.py")


def _env():
  env = dict(os.environ)
  env["JAX_PLATFORMS"] = "cpu"
  env["JAX_GMMA_ALLOW_REFERENCE"] = "1"
  # Use the installed jax_gmma when it has blockwise_gemm, else this checkout (CPU needs no
  # compiled extension).
  try:
    import jax_gmma
    installed_ok = hasattr(jax_gmma, "blockwise_gemm")
  except Exception:
    installed_ok = False
  if not installed_ok:
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


def test_smoke_suite_on_cpu(tmp_path):
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--suite", "smoke", "--out", str(out),
                      "--repeats", "2", "--repeat-ms", "1", "--no-torch", "--no-plot"],
                     env=_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((out / "bench_blockwise.json").read_text())
  assert not data["failures"]
  assert (out / "bench_blockwise.md").exists()
  assert not (out / "bench_blockwise.png").exists()
  rows = data["rows"]
  gemm = {r["impl"] for r in rows if r["kind"] == "gemm"}
  assert gemm == {"ours_1d2d", "ours_pertensor", "xla_fp8", "ours_mxfp8", "ours_mxfp8[kernel]",
                  "jax_nn_scaled_matmul_mxfp8", "bf16"}
  decode = {r["impl"] for r in rows if r["kind"] == "decode"}
  assert decode == {"ours_1d2d", "ours_pertensor", "xla_fp8", "ours_mxfp8", "ours_mxfp8_jaxquant",
                    "jax_nn_scaled_matmul_mxfp8"}
  quant = {r["impl"] for r in rows if r["kind"] == "quant"}
  assert quant == {"quantize_1x128", "quantize_fp8_channel", "ours_1d2d_gemm",
                   "quantize_1x128+ours_1d2d"}
  for r in rows:
    assert r["median_us"] > 0, r
    if r["kind"] != "quant":
      assert r["rel_err"] < 2e-2, r
  for r in rows:
    if r["impl"] == "ours_1d2d":
      assert r["path"] == "reference" and r["config"] and set(r["speedup_vs"]) >= {
          "ours_pertensor", "jax_nn_scaled_matmul_mxfp8", "ours_mxfp8"}
    if r["impl"].startswith("ours_mxfp8"):
      assert r["path"] == "reference" and r["config"].startswith("sm90_mxf8_")
  assert data["meta"]["backend"] == "cpu"
  assert not data["bars"]  # smoke rows are not held to the target bars


def test_bad_usage_without_gpu(tmp_path):
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--suite", "large", "--out", str(tmp_path)],
                     env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr[-2000:]


def test_smoke_forced_mx_configs_on_cpu(tmp_path):
  """--mx-configs adds decode rows ours_mxfp8[CONFIG] (the config forced, checked like ours);
  an unknown config name is a usage error."""
  name = "sm90_mxf8_blockscaled_swap_128x64"
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--suite", "smoke", "--out", str(out), "--repeats", "1",
                      "--repeat-ms", "1", "--no-torch", "--no-plot", "--impls", "ours_mxfp8",
                      "--mx-configs", name], env=_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((out / "bench_blockwise.json").read_text())
  assert not data["failures"]
  forced = [row for row in data["rows"] if row["impl"] == f"ours_mxfp8[{name}]"]
  assert forced and all(row["kind"] == "decode" and row["config"] == name and row["rel_err"] < 2e-2
                        for row in forced)
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--suite", "smoke", "--mx-configs", "nope"], env=_env(),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "--mx-configs: unknown nope" in r.stderr
