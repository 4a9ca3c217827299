"""The mixture-of-experts example (examples/moe.py): its layer equals a per-token float64 MoE
computed without any sorting, and its expert-parallel run (jax.shard_map, all-to-all of tokens,
on four virtual CPU devices) equals the single-device layer for every default expert format."""
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from _examples import EXAMPLES_DIR, load_example


def test_layer_matches_a_dense_per_token_moe():
  """Routing, sorting by expert, grouped GEMMs, unsorting and the weighted combine, checked
  against the MoE written token by token (float32 weights, jax.lax.ragged_dot)."""
  ex = load_example("moe.py", "moe_example")
  cfg = ex.Config(tokens=24, d_model=32, d_ff=48, experts=5, top_k=2)
  params = ex.init(cfg, seed=3)
  x = np.random.default_rng(4).standard_normal((cfg.tokens, cfg.d_model)).astype(np.float32)
  y = ex.single_device(cfg, ex.float_gmm)(jnp.asarray(x), params["router"], params["gate_up"],
                                          params["down"])
  router, gu, down = (np.asarray(params[k], np.float64) for k in ("router", "gate_up", "down"))
  logits = x.astype(np.float64) @ router
  want = np.zeros((cfg.tokens, cfg.d_model))
  for t in range(cfg.tokens):
    top = np.argsort(-logits[t], kind="stable")[:cfg.top_k]
    p = np.exp(logits[t, top] - logits[t, top].max())
    p /= p.sum()
    for e, pe in zip(top, p):
      gate, up = np.split(gu[e] @ x[t], 2)
      want[t] += pe * (down[e] @ (gate / (1 + np.exp(-gate)) * up))
  np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_expert_parallel_equals_single_device_on_four_cpu_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
  r = subprocess.run([sys.executable, "-P", str(EXAMPLES_DIR / "moe.py"), "--preset", "tiny",
                      "--expert-parallel"], env=env, capture_output=True, text=True, timeout=600)
  out = r.stdout
  assert r.returncode == 0, (out[-2000:], r.stderr[-4000:])
  assert "expert parallel: 4 devices on mesh axis 'ep', 2 experts and 16 tokens each" in out, out
  # tokens, their experts, the results: three all-to-alls; the experts' weights stay where they are
  assert "expert-parallel program: 3 all-to-all, 0 all-gather, 0 all-reduce" in out, out
  for spec in ("fp8_channel", "mxfp8", "wo:nvfp4"):
    line = next(ln for ln in out.splitlines() if ln.startswith(spec + " "))
    err, verdict = line.split()[1], " ".join(line.split()[2:])
    assert verdict == "identical", line
    assert float(err) < {"wo:nvfp4": 0.25}.get(spec, 0.12), line  # quantization error only
  assert out.strip().endswith("ok: expert-parallel == single device"), out
