"""The grouped-GEMM (mixture-of-experts) benchmark, benchmarks/bench_moe.py, on a CPU: its quick
run checks every variant against float64 and writes the JSON / markdown / PNG report; the XLA
FP8 spellings equal jax.lax.ragged_dot's rule (empty groups, rows past the groups); the routing
is computed on the device; ours on a GPU without a grouped kernel becomes an "unavailable" cell
with jax-gmma's reason (simulated here), or the reference with --allow-reference."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _examples import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_moe.py")
#: every impl that runs without torch, and the fields of a measured row
JAX_IMPLS = {"ours_fp8_128x128", "ours_fp8_channel", "ours_mxfp8", "ours_wo_mxfp4", "ours_wo_nvfp4",
             "dense_fp8_128x128", "dense_fp8_channel", "lax_ragged_dot_bf16", "xla_fp8_loop",
             "xla_fp8_capacity", "xla_fp8_gather"}
MEASURED = {"median_us", "chain_us", "tflops", "rel_err", "quant_err", "tol", "vs_bf16",
            "vs_best_xla_fp8", "best_xla_fp8", "rows", "active_experts", "max_group", "layers",
            "distinct_weights", "weight_bytes_per_expert", "lowered_to"}


def _load():
  return load_benchmark("bench_moe.py", "bench_moe_under_test")


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # a smoke run is compile-bound: LLVM's -O0 halves it on CPU
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench_moe")
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--quick", "--out", str(out)], env=_env(),
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return out, json.loads((out / "bench_moe.json").read_text()), r.stdout


def test_quick_run_checks_and_reports_every_variant(quick):
  out, data, stdout = quick
  assert not data["failures"] and data["meta"]["backend"] == "cpu"
  rows = data["rows"]
  assert {r["impl"] for r in rows} == JAX_IMPLS  # torch: skipped without a CUDA GPU (a note)
  assert any("torch" in n and "skipped" in n for n in data["notes"])
  cells = {(r["phase"], r["tokens"], r["routing"]) for r in rows}
  assert cells == {("decode", 4, "uniform"), ("decode", 4, "zipf"), ("prefill", 64, "uniform"),
                   ("prefill", 64, "zipf")}
  for r in rows:
    if r["impl"] == "xla_fp8_gather" and r["phase"] == "prefill":
      assert r["status"] == "skipped" and r["reason"] == "decode cells only"
      continue
    if r["impl"].startswith("dense_") and r["phase"] == "decode":
      assert r["status"] == "skipped" and r["reason"] == "prefill cells only"
      continue
    if r["phase"] == "prefill" and r["impl"] in ("ours_fp8_128x128", "ours_fp8_channel"):
      assert r["vs_dense"] > 0, r  # t(dense GEMM of the same FLOPs) / t(grouped)
    assert r["status"] == "ok", r
    assert MEASURED <= set(r), sorted(MEASURED - set(r))
    assert r["median_us"] > 0 and r["tflops"] > 0 and r["rows"] == r["tokens"] * 2
    assert r["rel_err"] <= r["tol"] and r["rel_err"] < 1e-2, r  # own dequantized operands
    assert r["vs_bf16"] > 0 and r["vs_best_xla_fp8"] > 0 and r["best_xla_fp8"].startswith("xla_fp8")
    assert (r["gbps"] > 0) if r["phase"] == "decode" else ("gbps" not in r)
    # the formats' own rounding against the unquantized bf16 operands
    limit = {"ours_wo_mxfp4": 0.2, "ours_wo_nvfp4": 0.2, "lax_ragged_dot_bf16": 1e-2}
    if r["impl"].startswith("dense_"):
      assert r["quant_err"] is None  # its rows multiply expert 0, not their own
    else:
      assert r["quant_err"] < limit.get(r["impl"], 0.08), r
    if r["family"] == "ours":
      assert r["path"] == "reference"
  lax_rows = [r for r in rows if r["impl"] == "lax_ragged_dot_bf16"]
  assert all(r["vs_bf16"] == 1.0 for r in lax_rows)
  zipf = [r for r in rows if r["routing"] == "zipf" and r["phase"] == "prefill"]
  uni = [r for r in rows if r["routing"] == "uniform" and r["phase"] == "prefill"]
  assert zipf[0]["max_group"] > uni[0]["max_group"]  # skewed routing: a hotter expert
  md = (out / "bench_moe.md").read_text()
  for text in ("## tiny (decode)", "## tiny (prefill)", "| ours_fp8_128x128 | reference |",
               "vs XLA FP8", "vs dense", "skipped [1]", "1. prefill cells only",
               "2. decode cells only"):
    assert text in md, text
  assert (out / "bench_moe.png").exists()  # matplotlib is a test dependency here
  assert "wrote" in stdout


def test_render_only_rewrites_the_report(quick, tmp_path):
  out, data, _ = quick
  (tmp_path / "bench_moe.json").write_text(json.dumps(data))
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--render-only", "--report", str(tmp_path),
                      "--no-plot"], env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert (tmp_path / "bench_moe.md").read_text() == (out / "bench_moe.md").read_text()


def test_merge_joins_runs_into_one_report(quick, tmp_path):
  """--merge: a run split in two by impl (one cell measured in both, the later one kept) merges
  back into the same report; runs on different device kinds are refused."""
  out, data, _ = quick
  impls = list(dict.fromkeys(r["impl"] for r in data["rows"]))
  halves = (impls[:len(impls) // 2 + 1], impls[len(impls) // 2:])
  dirs = []
  for i, part in enumerate(halves):
    d = tmp_path / f"run{i}"
    d.mkdir()
    rows = [{k: v for k, v in r.items() if not k.startswith("vs_") and k != "best_xla_fp8"}
            for r in data["rows"] if r["impl"] in part]  # the ratios: recomputed by the merge
    if i == 0:  # the shared impl's cells, measured differently in the earlier run
      rows = [dict(r, median_us=r["median_us"] * 3) if r["impl"] == part[-1] and r.get("median_us")
              else r for r in rows]
    meta = dict(data["meta"], wall_s=1.5)
    (d / "bench_moe.json").write_text(json.dumps(dict(data, meta=meta, rows=rows)))
    dirs.append(str(d))
  merged_dir = tmp_path / "merged"
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--merge", ",".join(dirs), "--out", str(merged_dir),
                      "--no-plot"], env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  got = json.loads((merged_dir / "bench_moe.json").read_text())
  assert got["rows"] == data["rows"]  # order, the later run's cell, the recomputed ratios
  assert got["meta"]["wall_s"] == 3.0 and len(got["meta"]["runs"]) == 2 and "argv" not in got["meta"]
  md = (merged_dir / "bench_moe.md").read_text().splitlines()
  merged_line = [i for i, line in enumerate(md) if line.startswith("- merged from 2 runs on this device")]
  assert len(merged_line) == 1 and md[merged_line[0] - 1].startswith("- device:")
  del md[merged_line[0]]
  assert md == (out / "bench_moe.md").read_text().splitlines()
  other = tmp_path / "other"
  other.mkdir()
  (other / "bench_moe.json").write_text(json.dumps(dict(data, meta=dict(data["meta"], device_kind="X"))))
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--merge", f"{dirs[0]},{other}", "--out",
                      str(tmp_path / "no"), "--no-plot"], env=_env(), capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 2 and "one device kind" in r.stderr


def test_model_presets_need_a_gpu():
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--presets", "mixtral-8x7b", "--out", "/dev/null"],
                     env=_env(), capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "need a CUDA GPU" in r.stderr and "--quick" in r.stderr


@pytest.fixture(scope="module")
def bm():
  return _load()


def test_xla_fp8_spellings_follow_ragged_dot_rule(bm, cpu_device):
  """Empty groups, a total below M (the rows past it are zeros): each spelling equals
  jax.lax.ragged_dot on the same dequantized operands, to bf16 rounding."""
  import jax
  import jax.numpy as jnp
  g, m, n, k = 4, 12, 32, 64
  x = jax.random.normal(jax.random.key(0), (m, k)).astype(jnp.bfloat16)
  w = bm.q_rows(jax.random.normal(jax.random.key(1), (g, n, k)).astype(jnp.bfloat16))
  gs = jnp.array([3, 0, 5, 2], jnp.int32)  # 10 of 12 rows
  x8, sx = bm.q_rows(x)
  want = jax.lax.ragged_dot((x8.astype(jnp.float32) * sx[:, None]),
                            jnp.swapaxes(w[0].astype(jnp.float32) * w[1][..., None], 1, 2), gs,
                            precision=jax.lax.Precision.HIGHEST)
  assert np.all(np.asarray(want)[10:] == 0)
  for fn, cap in ((bm.xla_fp8_loop, 5), (bm.xla_fp8_capacity, 5), (bm.xla_fp8_gather, None)):
    got = np.asarray(jax.jit(lambda x, w, gs: fn(x, w, gs, cap=cap))(x, w, gs), np.float32)
    np.testing.assert_allclose(got, np.asarray(want), rtol=2e-2, atol=2e-2 * np.abs(want).max(),
                               err_msg=fn.__name__)
    assert np.all(got[10:] == 0), fn.__name__


def test_routing_runs_on_the_device(bm, cpu_device):
  """dispatch: rows sorted by expert, group sizes that sum to T x local top-k, each row the
  token the router sent to that group; the zipf bias concentrates the rows."""
  import jax
  import jax.numpy as jnp
  p = bm.PRESETS["tiny"]
  key = jax.random.key(3)
  x_tok = jax.random.normal(key, (64, p.hidden)).astype(jnp.bfloat16)
  router = jax.random.normal(jax.random.key(4), (p.hidden, p.experts)) / p.hidden ** 0.5
  for routing in ("uniform", "zipf"):
    bias = bm.routing_bias(p, routing, 1.2, 0)
    rows, gs = bm.dispatch(x_tok, router, bias, k=p.local_k, g=p.experts)
    gs = np.asarray(gs)
    assert rows.shape == (64 * p.local_k, p.hidden) and gs.sum() == 64 * p.local_k
    logits = np.asarray(x_tok, np.float64) @ np.asarray(router, np.float64) + np.asarray(bias)
    top = np.argsort(-logits, axis=1)[:, :p.local_k]
    want = np.bincount(top.reshape(-1), minlength=p.experts)
    np.testing.assert_array_equal(gs, want)
  assert bm.capacity([np.array([3, 9, 0])], 12) == 12 and bm.capacity([np.array([3, 5])], 64) == 8
  assert bm.PRESETS["deepseek-v3"].rows(16) == 16 and bm.PRESETS["qwen3-30b-a3b"].rows(16) == 128


def test_ours_unavailable_on_a_gpu_is_recorded_not_fatal(bm, tmp_path, monkeypatch,
                                                        ragged_dot_without_kernel):
  """A CUDA GPU whose ragged_dot has no kernel (simulated: the backend reports a GPU, and
  jax_gmma.ragged_dot refuses unless the reference is allowed): ours' cells are "unavailable"
  with jax-gmma's reason and the run succeeds; --allow-reference times the reference instead."""
  from jax_gmma import _backend
  monkeypatch.setattr(_backend, "cuda_devices", lambda: ["fake"])
  monkeypatch.setattr(sys.modules["bench_fp8"], "warm_gpu", lambda *a, **kw: None)  # RunBase.begin
  argv = ["--quick", "--no-torch", "--no-plot", "--prefill-tokens", "", "--routings", "uniform",
          "--impls", "ours_fp8_128x128,lax_ragged_dot_bf16"]
  assert bm.main(argv + ["--out", str(tmp_path / "a")]) == 0
  rows = {r["impl"]: r for r in json.loads((tmp_path / "a" / "bench_moe.json").read_text())["rows"]}
  ours = rows["ours_fp8_128x128"]
  assert ours["status"] == "unavailable" and "no grouped GEMM kernel (simulated)" in ours["reason"]
  assert "median_us" not in ours and rows["lax_ragged_dot_bf16"]["status"] == "ok"
  assert "unavailable [1]" in (tmp_path / "a" / "bench_moe.md").read_text()
  assert bm.main(argv + ["--out", str(tmp_path / "b"), "--allow-reference"]) == 0
  data = json.loads((tmp_path / "b" / "bench_moe.json").read_text())
  ours = next(r for r in data["rows"] if r["impl"] == "ours_fp8_128x128")
  assert ours["status"] == "ok" and ours["path"] == "reference" and ours["rel_err"] < 1e-2
  assert any("not a kernel's" in n for n in data["notes"])


def test_report_written_after_each_impl(bm, tmp_path, monkeypatch, cpu_device):
  """A run stopped inside a preset keeps the cells of the impls it finished: the report is
  rewritten after each impl, marked partial until the run ends."""
  seen = []
  real = bm.report

  def spy(*a, **kw):
    out = real(*a, **kw)
    data = json.loads((tmp_path / "bench_moe.json").read_text())
    seen.append((data["meta"]["complete"], sorted({r["impl"] for r in data["rows"]})))
    return out
  monkeypatch.setattr(bm, "report", spy)
  argv = ["--quick", "--no-torch", "--no-plot", "--prefill-tokens", "", "--routings", "uniform",
          "--decode-tokens", "1", "--impls", "ours_fp8_channel,lax_ragged_dot_bf16", "--out", str(tmp_path)]
  assert bm.main(argv) == 0
  assert seen == [(False, ["ours_fp8_channel"]), (False, ["lax_ragged_dot_bf16", "ours_fp8_channel"]),
                  (True, ["lax_ragged_dot_bf16", "ours_fp8_channel"])]
  assert "Partial" not in (tmp_path / "bench_moe.md").read_text()


@pytest.mark.gpu
def test_quick_run_on_a_gpu(tmp_path):
  """On a Hopper GPU: the quick run finishes; ours is measured (a kernel) or unavailable with
  jax-gmma's reason, never a crash; every measured row passed its check."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--quick", "--out", str(tmp_path), "--no-plot"],
                     env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  data = json.loads((tmp_path / "bench_moe.json").read_text())
  for row in data["rows"]:
    if row["family"] == "ours":
      assert row["status"] in ("ok", "unavailable"), row
      assert row["status"] == "unavailable" or row["path"] == "kernel", row
    if row["status"] == "ok":
      assert row["rel_err"] <= row["tol"], row


def test_merge_keeps_the_notes_of_the_rows_it_keeps(quick, tmp_path):
  """A note on one cell goes with that cell's row: dropped when a later run replaced the row;
  a run-wide note on the plot is dropped (the merge draws its own), one on the torch peers
  kept while no run measured them; the timing settings of the runs show as a range."""
  out, data, _ = quick
  row = next(r for r in data["rows"] if r.get("status") == "ok")
  cell = f"{row['preset']} {row['phase']} T={row['tokens']} {row['routing']} {row['impl']}"
  early = dict(data, meta=dict(data["meta"], repeats=10, repeat_ms=20.0),
               notes=[f"{cell}: rel_err 3e-02 > tolerance 2e-02", "plot skipped (no cell)",
                      "torch peers: skipped (--no-torch)", "a run-wide remark"])
  late = dict(data, rows=[row], notes=[f"{cell} failed: something else"])
  dirs = []
  for i, d in enumerate((early, late)):
    p = tmp_path / f"run{i}"
    p.mkdir()
    (p / "bench_moe.json").write_text(json.dumps(d))
    dirs.append(str(p))
  r = subprocess.run([sys.executable, "-P", SCRIPT, "--merge", ",".join(dirs), "--out",
                      str(tmp_path / "m"), "--no-plot"], env=_env(), capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  got = json.loads((tmp_path / "m" / "bench_moe.json").read_text())
  assert got["notes"] == ["torch peers: skipped (--no-torch)", "a run-wide remark",
                          f"{cell} failed: something else"]
  md = (tmp_path / "m" / "bench_moe.md").read_text()
  lo, hi = sorted({data["meta"]["repeats"], 10})
  assert f"median of {lo}-{hi} repeats" in md
