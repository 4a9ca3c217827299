"""The sharded GEMM benchmark, benchmarks/bench_sharded.py, on four virtual CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4): its --tiny run checks every format, split
and device count against float64 before timing it, and writes the JSON / markdown / PNG report,
the llama_decode tokens/s per device count included (--llama)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from _examples import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_sharded.py")
FORMATS = {"bf16", "xla_fp8", "fp8_channel", "fp8_128x128", "mxfp8", "wo_nvfp4"}


def _load():
  return load_benchmark("bench_sharded.py", "bench_sharded_under_test")


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("NCCL_NVLS_ENABLE", None)
  # four virtual devices; a smoke run is compile-bound: LLVM's -O0 halves it on CPU
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
                      " --xla_backend_optimization_level=0").strip()
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench_sharded")
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--tiny", "--llama", "--out", str(out)],
                     env=_env(), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return out, json.loads((out / "bench_sharded.json").read_text()), r.stdout


def test_every_cell_checked_and_timed(tiny):
  _, data, _ = tiny
  meta = data["meta"]
  assert not data["failures"] and meta["backend"] == "cpu" and meta["device_count"] == 4
  assert meta["devices"] == [1, 2, 4] and meta["nccl_nvls_enable"] == "0"
  gemm = [r for r in data["rows"] if r["kind"] == "gemm"]
  cells = {(r["devices"], r["split"], r["format"]) for r in gemm}
  want = {(1, "none", f) for f in FORMATS} | {(d, s, f) for d in (2, 4) for s in ("column", "row")
                                              for f in FORMATS}
  assert cells == want and len(gemm) == len(want)
  for r in gemm:
    assert r["status"] == "ok", r
    assert r["rel_err"] <= r["tolerance"] and r["finite"], r
    assert r["median_us"] > 0 and r["tflops"] > 0 and r["vs_1dev"] > 0, r
    assert r["vs_bf16"] > 0 and r["vs_xla_fp8"] > 0, r
    assert r["sharding_warnings"] == [], r  # every split kept, no operand gathered
    if r["split"] == "row":
      assert "all-reduce" in r["collectives"], r  # the partial products summed
    else:
      assert r["collectives"] == {}, r  # column-parallel / one device: no collective
    if r["devices"] > 1:
      assert r["how"] == ("shard_map" if r["split"] == "row" and r["format"] in ("mxfp8", "wo_nvfp4")
                          else "partitioner"), r
  # each device holds 1 / D of the weight (per-tensor / per-channel scales aside)
  one = {r["format"]: r["weight_bytes_per_device"] for r in gemm if r["devices"] == 1}
  for r in gemm:
    assert r["weight_bytes_per_device"] <= one[r["format"]] / r["devices"] * 1.05 + 8192, r


def test_llama_tokens_per_second_per_device_count(tiny):
  _, data, _ = tiny
  llama = [r for r in data["rows"] if r["kind"] == "llama"]
  assert {(r["devices"], r["format"]) for r in llama} == {(d, f) for d in (1, 2, 4)
                                                         for f in ("bf16", "fp8_channel")}
  for r in llama:
    assert r["status"] == "ok" and r["tokens_per_s"] > 0 and r["vs_1dev"] > 0, r
    assert r["sharding_warnings"] == [], r
    if r["devices"] > 1:
      assert "all-reduce" in r["collectives"], r
      assert r["weight_bytes_per_device"] < r["weight_bytes"], r


def test_markdown_and_plot(tiny):
  out, data, stdout = tiny
  md = (out / "bench_sharded.md").read_text()
  assert "| D | format | split | how | us | TFLOP/s | x bf16 | x xla_fp8 |" in md
  assert "## llama_decode (tiny-tp" in md and "plumbing check only" in md
  assert md.count("| ok |") == len([r for r in data["rows"] if r.get("status") == "ok"])
  assert "wrote " in stdout
  if importlib.util.find_spec("matplotlib") is None:
    assert any("plot skipped" in n for n in data["notes"])
  else:
    assert (out / "bench_sharded.png").stat().st_size > 0


def test_render_only(tiny, tmp_path):
  out, data, _ = tiny
  (tmp_path / "bench_sharded.json").write_text(json.dumps(data))
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--render-only", "--no-plot", "--out", str(tmp_path)],
                     env=_env(), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert (tmp_path / "bench_sharded.md").read_text().startswith("# jax-gmma sharded GEMM benchmark")


def test_bad_arguments():
  mod = _load()
  for argv in (["--formats", "fp8_nope"], ["--splits", "diagonal"], ["--devices", "0"],
               ["--tiny", "--devices", "3"]):
    with pytest.raises(SystemExit) as e:
      mod.parse_args(argv)
    assert e.value.code == 2, argv
  a = mod.parse_args(["--tiny"])
  assert (a.m, a.n, a.k) == mod.TINY_MNK and a.llama_preset == "tiny-tp"
  a = mod.parse_args([])
  assert (a.m, a.n, a.k) == (8192, 8192, 8192) and a.devices == (1, 2, 4)
