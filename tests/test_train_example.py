"""The FP8 training example (examples/train_mlp_fp8.py) on a tiny config: every layer kind
trains (the loss falls well below its start) and the FP8 recipes track bf16. Runs on JAX's
default backend: the reference on CPU, jax-gmma's kernels on a Hopper GPU."""
from _examples import load_example


def test_train_mlp_fp8_tracks_bf16():
  ex = load_example("train_mlp_fp8.py", "train_mlp_fp8_example")
  curves, _ = ex.run(list(ex.LAYERS), steps=40, d=128, hidden=256, batch=64)
  last = {k: sum(c[-5:]) / 5 for k, c in curves.items()}
  for kind, c in curves.items():
    assert last[kind] < 0.6 * c[0], (kind, c[0], last[kind])
  for kind in ("fp8_tensor", "fp8_blockwise"):
    assert abs(last[kind] / last["bf16"] - 1) < 0.05, (kind, last)
