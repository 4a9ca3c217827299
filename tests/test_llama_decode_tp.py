"""Tensor parallelism of the Llama decoder example (examples/llama_decode.py --tensor-parallel N).

A subprocess with eight virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)
builds the ``tiny-tp`` model (one layer), lays it out for N = 2 and 4 devices (tp_layout), and
for bf16, fp8_channel, fp8_128x128 and wo:nvfp4 runs the same variant once on one device and once
with its weights placed by tp_specs on a 1-D ``tp`` mesh (the jax-gmma primitives partitioned by
jax_gmma.sharding's rules, as on N GPUs). Checked: the prefill logits equal the 1-device run's
within the format's tolerance and the greedy tokens agree; the compiled decode loop
(``generate.lower(...).compile().as_text()``) has an all-reduce (the row-parallel GEMMs) and no
all-gather of a weight-sized operand (no weight is gathered); compilation raised no
ShardingWarning; each device holds about 1 / N of the layer weights. Then the command line
(``--tensor-parallel 2 --check-tp --json``) on the same shapes. And the regrouped float model
(tp_layout) computes the logits of the plain one.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORMATS = ("bf16", "fp8_channel", "fp8_128x128", "wo:nvfp4")
#: relative (Frobenius) difference of the prefill logits against the 1-device run: the partial
#: products are summed in another order (float32 partials for jax-gmma's GEMMs; XLA's bf16 dot
#: partials for bf16), so a few bf16 roundings may differ.
TOL = {"bf16": 1e-2, "fp8_channel": 1e-2, "fp8_128x128": 1e-2, "wo:nvfp4": 1e-2}

_SCRIPT = r'''
import json, os, sys
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from _examples import load_example

ld = load_example("llama_decode.py", "llama_decode_tp")
assert len(jax.devices()) == 8, jax.devices()
cfg = ld.LlamaConfig(layers=1, **{**ld.PRESETS["tiny-tp"], "vocab": 512})
prompt = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (2, 6)), jnp.int32)
STEPS, MAX_SEQ = 4, 12


def bf16_logits(model):
  graphdef, state = nnx.split(ld.build_variant(model, ld.parse_variant("bf16")))
  return np.asarray(ld.forward(graphdef, nnx.to_pure_dict(state), prompt), np.float64)


def min_weight_shard(placed):
  """The smallest weight shard a device holds: the data of every GEMM weight (not its scales)."""
  shard_bytes = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(placed["layers"])[0]:
    names = ld._key_names(path)
    if leaf.ndim >= 2 and not {"scales", "global_scale", "scale"} & set(names):
      shard_bytes.append(int(np.prod(leaf.sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize)
  return min(shard_bytes)


def gathers(hlo):
  """The result type of every all-gather of a compiled program."""
  out = []
  for line in hlo.splitlines():
    if " all-gather(" in line or " all-gather-start(" in line:
      out.append(line.split("=", 1)[1].split(" all-gather", 1)[0].strip())
  return out


plain = bf16_logits(ld.Llama(cfg, seed=0))
for tp in (2, 4):
  model = ld.Llama(cfg, seed=0)
  ld.tp_layout(model, tp)
  # the regrouped model is the same function (rows of wqkv / w_gate_up permuted), on one device
  laid = bf16_logits(model)
  print("LAYOUT " + json.dumps(dict(tp=tp, rel=float(np.linalg.norm(laid - plain) / np.linalg.norm(plain)))))
  mesh = ld.tp_mesh(tp)
  for fmt in sys.argv[1].split(","):
    vmodel = ld.build_variant(model, ld.parse_variant(fmt), tp)
    graphdef, state = nnx.split(vmodel)
    params = nnx.to_pure_dict(state)
    placed = ld.place(params, mesh)
    one = ld.Programs(graphdef, params, prompt, STEPS, MAX_SEQ)
    par = ld.Programs(graphdef, placed, prompt, STEPS, MAX_SEQ, mesh)
    out = {}
    for name, p in (("one", one), ("tp", par)):
      logits0, tok0, toks, _, _ = p.once()
      out[name] = {"logits0": np.asarray(logits0, np.float32),
                   "tokens": np.concatenate([np.asarray(tok0)[:, None], np.asarray(toks)], 1)}
    row = dict(tp=tp, format=fmt, diff=ld.tp_difference(out["one"], out["tp"]),
               collectives=ld.hlo_collectives(par.hlo), gathers=gathers(par.hlo),
               all_reduce="all-reduce(" in par.hlo or "all-reduce-start(" in par.hlo,
               min_weight_shard_bytes=min_weight_shard(placed),
               warnings=par.sharding_warnings + one.sharding_warnings,
               layer_bytes=ld.tree_nbytes(params["layers"]),
               layer_bytes_per_device=ld.per_device_nbytes(placed["layers"]),
               finite=bool(np.all(np.isfinite(out["tp"]["logits0"]))))
    print("ROW " + json.dumps(row), flush=True)
  if tp == 2 and "wo:nvfp4" in sys.argv[1]:
    # control: wqkv's packed FP4 weight placed split along its K tiles, which the weight-only
    # rule never keeps: jax_gmma gathers it (a warning, a weight-sized all-gather)
    P = jax.sharding.PartitionSpec
    specs = ld.tp_specs(params, tp)
    specs["layers"][0]["wqkv"]["kernel"] = jax.tree.map(
        lambda l: P(None, "tp") if l.ndim == 3 else P(), params["layers"][0]["wqkv"]["kernel"])
    bad = jax.device_put(params, jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs))
    ctl = ld.Programs(graphdef, bad, prompt, STEPS, MAX_SEQ, mesh)
    print("CONTROL " + json.dumps(dict(tp=tp, gathers=gathers(ctl.hlo), warnings=ctl.sharding_warnings,
                                       min_weight_shard_bytes=min_weight_shard(placed))), flush=True)
print("done")
'''


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # compile-bound on a CPU: LLVM's -O0 halves it
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
  env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT / "tests"), str(ROOT), env.get("PYTHONPATH"))))
  return env


@pytest.fixture(scope="module")
def run():
  r = subprocess.run([sys.executable, "-P", "-c", _SCRIPT, ",".join(FORMATS)], env=_env(),
                     capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert r.returncode == 0 and r.stdout.strip().endswith("done"), (r.stdout[-3000:], r.stderr[-5000:])
  out = [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ROW ")]
  assert len(out) == 2 * len(FORMATS), out
  layout = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("LAYOUT ")]
  control = [json.loads(line[8:]) for line in r.stdout.splitlines() if line.startswith("CONTROL ")]
  return out, layout, control


@pytest.fixture(scope="module")
def rows(run):
  return run[0]


def test_tp_layout_is_the_same_model(run):
  """tp_layout regroups the fused projections' rows: the bf16 model's logits do not change."""
  layout = run[1]
  assert [x["tp"] for x in layout] == [2, 4]
  for x in layout:
    assert x["rel"] < 1e-3, x


def _bytes(hlo_type: str) -> int:
  """Bytes of the largest array in an HLO type such as ``f32[1,4]{0,1}`` or a tuple of them."""
  import re
  sizes = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8,
           "s64": 8}
  best = 0
  for dt, dims in re.findall(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]", hlo_type):
    n = 1
    for d in filter(None, dims.split(",")):
      n *= int(d)
    best = max(best, n * sizes.get(dt, 1))
  return best


@pytest.mark.parametrize("fmt", FORMATS)
def test_logits_match_one_device(rows, fmt):
  for r in (r for r in rows if r["format"] == fmt):
    d = r["diff"]
    assert r["finite"], r
    assert d["logits_rel_diff"] <= TOL[fmt], (r["tp"], d)
    assert d["logits_max_abs_diff"] <= 5 * TOL[fmt] * d["logits_max_abs"], (r["tp"], d)
    assert d["top1_agree"] == 1.0 and d["greedy_equal"], (r["tp"], d)


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_loop_all_reduces_and_gathers_no_weight(rows, fmt):
  for r in (r for r in rows if r["format"] == fmt):
    assert r["all_reduce"], r  # the row-parallel GEMMs' partial sums
    assert r["collectives"]["all-reduce"]["count"] >= 2, r["collectives"]  # wo and w_down
    for g in r["gathers"]:  # the result of an all-gather is tp x its operand
      assert _bytes(g) // r["tp"] < r["min_weight_shard_bytes"], (r["tp"], g, r["min_weight_shard_bytes"])
    assert r["warnings"] == [], r["warnings"]  # no operand of a jax-gmma op was gathered


def test_the_gather_check_sees_a_gathered_weight(run):
  """The control: a weight placed split along a dimension its op does not split is gathered,
  and the checks above would see it (a warning, an all-gather of a weight-sized operand)."""
  (ctl,) = run[2]
  assert ctl["warnings"] and "gathered onto every device" in ctl["warnings"][0], ctl
  assert any(_bytes(g) // ctl["tp"] >= ctl["min_weight_shard_bytes"] for g in ctl["gathers"]), ctl


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_device_holds_its_share_of_the_weights(rows, fmt):
  for r in (r for r in rows if r["format"] == fmt):
    # the norms' gains (and per-tensor / global scales) are the only replicated layer arrays
    assert r["layer_bytes_per_device"] <= r["layer_bytes"] / r["tp"] + 64 * 1024, r


def test_command_line_tensor_parallel_check(tmp_path):
  out = tmp_path / "tp.json"
  env = _env()
  env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  r = subprocess.run([sys.executable, "-P", str(ROOT / "examples" / "llama_decode.py"), "--preset",
                      "tiny-tp", "--layers", "1", "--vocab", "512", "--formats", "fp8_channel",
                      "--tensor-parallel", "2", "--check-tp", "--prompt-len", "4", "--gen-tokens",
                      "3", "--repeats", "1", "--no-progress", "--json", str(out)],
                     env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
  assert "MiB per device" in r.stdout and "x 1 device" in r.stdout, r.stdout[-3000:]
  res = json.loads(out.read_text())
  assert res["tensor_parallel"] == 2 and res["check_tp"] and len(res["tp_devices"]) == 2
  for row in res["results"]:
    assert row["tp"] == 2 and row["weight_bytes_per_device"] < row["weight_bytes"], row
    assert row["tp_check"]["logits_rel_diff"] <= 1e-2 and row["tp_check"]["greedy_equal"], row
    assert "all-reduce" in row["collectives"] and row["sharding_warnings"] == [], row


def test_command_line_refuses_indivisible_heads():
  r = subprocess.run([sys.executable, "-P", str(ROOT / "examples" / "llama_decode.py"), "--preset",
                      "tiny", "--tensor-parallel", "4", "--no-progress"],
                     env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert r.returncode == 2 and "kv_heads (2) must be a multiple of it" in r.stderr, r.stderr[-2000:]
