"""CUDA-graph (XLA command buffer) test harness shared by the GPU test modules. Not a test
module; imported as ``from _cmdbuf import command_buffer_runs``.

A child process runs a jitted program of our custom calls under one XLA_FLAGS setting and
prints a JSON line (result hashes, capture counters); the three settings are command buffers
off, XLA's default, and forced for graphs of any size."""
import json
import os
import subprocess
import sys

#: XLA_FLAGS additions: command buffers off, default, forced for the smallest graphs.
MODES = {"off": "--xla_gpu_enable_command_buffer=", "default": "",
         "forced": "--xla_gpu_graph_min_graph_size=1"}


def run_child(args, flags, cwd=None, timeout=600):
  """Runs ``python *args`` with ``flags`` appended to XLA_FLAGS; the child's last stdout line,
  parsed as JSON."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
  r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                     timeout=timeout, cwd=cwd)
  assert r.returncode == 0, f"child failed with XLA_FLAGS={flags!r}:\n{r.stdout}\n{r.stderr[-4000:]}"
  return json.loads(r.stdout.strip().splitlines()[-1])


#: XLA's own ops deterministic and not autotuned (the same algorithm in every child), for a child
#: whose XLA ops around ours are large enough to vary: a grouped prefill chain at 4096 routed
#: rows (the router's dot, top-k, scatters around ragged_dot) differed between modes in one test
#: run of two on an H100, and with autotuning off alone gave 3 hashes in 3 runs with command
#: buffers off; with both flags, 4 runs of 4 agreed.
DETERMINISTIC_XLA = "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0"


def command_buffer_runs(args, cwd=None, extra_flags=""):
  """{mode: child result} for the three MODES (each with ``extra_flags`` added)."""
  return {mode: run_child(args, f"{extra_flags} {flags}".strip(), cwd=cwd) for mode, flags in MODES.items()}


def child_script(name):
  """Path of a child script next to the tests."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def check_bit_identical_and_captured(script, names=("chain", "small"), min_calls=32, extra_flags=""):
  """Runs child ``script`` (a file next to the tests that prints :func:`report`'s line) under
  the three MODES and checks: every result in ``names`` is bit-identical to command buffers off,
  and capture was real, not assumed (no capture with command buffers off; at least
  ``min_calls`` handler executions under capture by default, one more when forced if the child
  has a ``small`` program, which only forced command buffers capture). ``extra_flags``: more
  XLA_FLAGS for every mode (:data:`DETERMINISTIC_XLA`)."""
  runs = command_buffer_runs([child_script(script)], extra_flags=extra_flags)
  off, default, forced = runs["off"], runs["default"], runs["forced"]
  for name in names:
    assert default[name] == off[name], f"{name}: default command buffers differ from off"
    assert forced[name] == off[name], f"{name}: forced command buffers differ from off"
  assert off["captured"] == 0 and off["eager"] > 0
  assert default["captured"] >= min_calls, default
  assert forced["captured"] >= min_calls + ("small" in names), forced


def report(outs):
  """Child side: prints one JSON line, the sha256 of each named result array and the
  extension's counts of handler executions under stream capture and eager."""
  import hashlib
  from jax_gmma import _backend
  captured, eager = _backend.ext().capture_stats()
  res = {name: hashlib.sha256(v.tobytes()).hexdigest() for name, v in outs.items()}
  res.update(captured=captured, eager=eager)
  print(json.dumps(res))
