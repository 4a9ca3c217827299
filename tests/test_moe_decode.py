"""The mixture-of-experts decoder example (examples/moe_decode.py) on its tiny preset: the jitted
decode loop (one XLA program) computes what stepping the model one call at a time computes, the
FP8 block-scaled and MXFP4 expert variants agree with the bf16 model, the command line writes its
JSON, and on a GPU without grouped kernels (simulated) the quantized formats are skipped with the
reason by default and run the reference, said so, with --allow-reference."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from _examples import EXAMPLES_DIR, load_example

# Teacher-forced outputs of the tiny preset (batch 4 x 16 steps) against bf16's. Measured (CPU,
# seeds 0-3): fp8_128x128 mean cos 0.9979-0.9994, worst 0.934-0.990, rel err 0.036-0.065;
# wo:mxfp4 mean 0.9918-0.9941, worst 0.918-0.960, rel err 0.109-0.128. The worst rows are
# tokens whose router picked another expert (close logits); the thresholds leave room for that.
MIN_COS = {"fp8_128x128": (0.995, 0.85), "wo:mxfp4": (0.985, 0.85)}  # (mean, worst)
MAX_REL_ERR = {"fp8_128x128": 0.12, "wo:mxfp4": 0.2}


@pytest.fixture(scope="module")
def md():
  return load_example("moe_decode.py", "jax_gmma_moe_decode_example")


@pytest.fixture(scope="module")
def result(md):
  # allow_reference: on a CUDA GPU without grouped kernels the quantized formats run the reference
  return md.run(cfg=md.PRESETS["tiny"], batch=4, steps=16, repeats=1, seed=0, allow_reference=True,
                log=lambda s: None)


def test_quantized_experts_agree_with_bf16(result):
  rows = {r["format"]: r for r in result["results"]}
  assert list(rows) == ["bf16", "fp8_128x128", "wo:mxfp4"] and not result["skipped"]
  assert rows["bf16"]["path"] == "xla" and rows["bf16"]["speedup_vs_bf16"] == 1.0
  for spec in ("fp8_128x128", "wo:mxfp4"):
    r = rows[spec]
    tf = r["teacher_forced_vs_bf16"]
    assert r["path"] in (("reference", "kernel") if md_on_gpu() else ("reference",)), r
    assert r["tokens_per_s"] > 0
    assert tf["cos_mean"] >= MIN_COS[spec][0] and tf["cos_min"] >= MIN_COS[spec][1], (spec, tf)
    assert tf["rel_err"] <= MAX_REL_ERR[spec], (spec, tf)
    assert 0 < tf["rel_err"] and r["expert_weight_bytes"] < rows["bf16"]["expert_weight_bytes"] / 1.5
    assert len(r["free_running_vs_bf16"]["cos_mean_per_step"]) == result["steps"]
    assert r["free_running_vs_bf16"]["cos_mean_per_step"][0] > 0.97  # step 0: the same input
  if not md_on_gpu():
    assert any("pure-JAX reference" in n for n in result["notes"])


def md_on_gpu():
  from jax_gmma import _backend
  return bool(_backend.cuda_devices())


@pytest.mark.parametrize("spec", ("fp8_128x128", "wo:mxfp4"))
def test_layers_quantized_in_place_equal_stacking(md, cpu_device, spec):
  """The experts quantized one layer at a time into a donated stack equal the layers quantized
  one by one and stacked."""
  import jax
  cfg = md.Config(hidden=64, inter=32, experts=4, top_k=2, layers=3)
  w = md.init_master(cfg, seed=3)["layers"]["gate_up"]
  got = md._quantize_layers(w, spec=spec)
  one = lambda wl: md.moe.quantize_experts(jax.numpy.swapaxes(wl, 1, 2), spec)
  want = jax.tree.map(lambda *a: np.stack(a), *[one(w[i]) for i in range(cfg.layers)])
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_decode_loop_equals_stepping(md, cpu_device):
  """The fori_loop program (teacher forcing off) equals calling one decode step at a time, and
  teacher forcing on the loop's own inputs reproduces it."""
  import jax
  import jax.numpy as jnp
  cfg = md.Config(hidden=64, inter=32, experts=4, top_k=2, layers=2)
  master = md.init_master(cfg, seed=1)
  h0 = jax.random.normal(jax.random.key(2), (3, cfg.hidden)).astype(jnp.bfloat16)
  for spec in ("bf16", "fp8_128x128"):
    params, gmm = md.prepare(master, spec), md.gmm_of(spec)
    steps = 4
    outs = jax.jit(lambda p, h, f, u: md.generate(p, h, f, u, cfg=cfg, gmm=gmm, steps=steps))
    none = jnp.zeros((steps,) + h0.shape, jnp.bfloat16)
    got = np.asarray(outs(params, h0, none, False), np.float32)
    step = jax.jit(lambda p, h: md.decode_step(p, h, cfg, gmm))
    h, want = h0, []
    for _ in range(steps):
      h = step(params, h)
      want.append(np.asarray(h, np.float32))
    np.testing.assert_allclose(got, np.stack(want), rtol=0, atol=0, err_msg=spec)
    inputs = jnp.concatenate([h0[None], jnp.asarray(got[:-1], jnp.bfloat16)])
    np.testing.assert_array_equal(np.asarray(outs(params, h0, inputs, True), np.float32), got)


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  root = str(EXAMPLES_DIR.parent)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
  return subprocess.run([sys.executable, "-P", str(EXAMPLES_DIR / "moe_decode.py"), *args], env=env,
                        capture_output=True, text=True, timeout=600)


def test_command_line_writes_json(tmp_path):
  out = tmp_path / "moe.json"
  r = _cli("--steps", "4", "--repeats", "1", "--batch", "2", "--formats", "fp8_128x128",
           "--layers", "1", "--experts", "4", "--hidden", "128", "--json", str(out))
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  data = json.loads(out.read_text())
  assert [x["format"] for x in data["results"]] == ["bf16", "fp8_128x128"]
  assert data["config"] == dict(hidden=128, inter=128, experts=4, top_k=2, layers=1, eps=1e-6)
  assert data["steps"] == 4 and data["batch"] == 2
  assert "tok/s" in r.stdout and "fp8_128x128  reference" in r.stdout
  bad = _cli("--formats", "fp9_nope")
  assert bad.returncode == 2 and "unknown expert format" in bad.stderr


def test_gpu_without_grouped_kernels_skips_or_says_reference(md, monkeypatch, cpu_device,
                                                            ragged_dot_without_kernel):
  """Simulated: the backend reports a CUDA GPU and ragged_dot refuses without the reference.
  Default: the quantized formats are skipped with jax-gmma's reason; --allow-reference: they run
  the reference and the notes say so."""
  monkeypatch.setattr(md, "on_cuda", lambda: True)
  cfg = md.Config(hidden=64, inter=32, experts=4, top_k=2, layers=1)
  kw = dict(formats=("bf16", "fp8_128x128", "wo:mxfp4"), cfg=cfg, batch=2, steps=2, repeats=1,
            log=lambda s: None)
  res = md.run(**kw)
  assert [r["format"] for r in res["results"]] == ["bf16"]
  assert set(res["skipped"]) == {"fp8_128x128", "wo:mxfp4"}
  assert all("no grouped GEMM kernel (simulated)" in why for why in res["skipped"].values())
  assert any(n.startswith("fp8_128x128 skipped:") for n in res["notes"])
  res = md.run(allow_reference=True, **{**kw, "formats": ("fp8_128x128",)})
  assert [r["path"] for r in res["results"]] == ["xla", "reference"]
  assert any("ran its pure-JAX reference on the GPU" in n for n in res["notes"])


@pytest.mark.gpu
def test_gpu_preset_shapes_run_or_skip_with_reason():
  """On a Hopper GPU: the gpt-oss-20b shapes (2 layers) decode in bf16; the quantized formats run
  a kernel or are skipped with jax-gmma's reason (never the reference without the flag)."""
  env = dict(os.environ)
  root = str(EXAMPLES_DIR.parent)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
  r = subprocess.run([sys.executable, "-P", str(EXAMPLES_DIR / "moe_decode.py"), "--preset",
                      "gpt-oss-20b", "--layers", "2", "--steps", "4", "--repeats", "1"], env=env,
                     capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "bf16 " in r.stdout and "reference  " not in r.stdout
  for spec in ("fp8_128x128", "wo:mxfp4"):
    assert f"{spec}  kernel" in r.stdout or f"{spec} skipped:" in r.stdout, r.stdout[-3000:]
