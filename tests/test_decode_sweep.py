"""benchmarks/decode_sweep.py on the CPU: tiny shapes through the reference lowering (the
numbers mean nothing here; the GPU run is benchmarks/run_gpu.sh's decode_sweep step)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import decode_sweep  # noqa: E402


def test_goals_follow_the_bands():
  assert decode_sweep.goal("wo:nvfp4", 16) == 1.5
  assert decode_sweep.goal("wo:mxfp4", 17) == 1.3
  assert decode_sweep.goal("wo:mxfp6_e3m2", 256) == 1.0
  assert decode_sweep.goal("fp8_channel", 1) == 1.0
  assert decode_sweep.goal("fp8_128x128", 1) is None
  row = dict(m=64, us={"xla_fp8": 10.0, "wo:nvfp4": 8.0, "fp8_channel": 9.0, "mxfp8": 9.9})
  assert decode_sweep.misses(row, "wo:nvfp4")          # 1.25x < 1.3x
  assert not decode_sweep.misses(row, "fp8_channel")   # 1.11x
  assert decode_sweep.misses(row, "mxfp8")             # 1.01x < 0.95 x 1.11x
  assert decode_sweep.misses(row, "bf16") is None


def test_floors():
  # 28672 x 8192: NVFP4 weights 132 MB (27.5 µs at 4.8 TB/s) and bf16 tensor cores (M = 64:
  # 30.4 µs; M = 256: 121.6 µs); FP8 weights 235 MB (48.9 µs), FP8 tensor cores (M = 256: 60.8).
  f = decode_sweep.floor_us
  assert 27 < f("wo:nvfp4", 1, 28672, 8192) < 28
  assert 30 < f("wo:nvfp4", 64, 28672, 8192) < 31
  assert 121 < f("wo:mxfp4", 256, 28672, 8192) < 122
  assert 48 < f("xla_fp8", 16, 28672, 8192) < 50
  assert 60 < f("fp8_channel", 256, 28672, 8192) < 62


def test_tiny_sweep_writes_checked_results(tmp_path):
  out = tmp_path / "sweep"
  rc = decode_sweep.main(["--out", str(out), "--nk", "128x256", "--ms", "1,20",
                          "--formats", "fp8_channel,wo:nvfp4,wo:mxfp6_e2m3", "--repeats", "1",
                          "--rounds", "1", "--wo-kernel"])
  assert rc == 0
  data = json.loads((out / "decode_sweep.json").read_text())
  assert [r["m"] for r in data["rows"]] == [1, 20] and data["meta"]["failures"] == []
  for r in data["rows"]:
    assert set(r["rel_err"]) == {"fp8_channel", "wo:nvfp4", "wo:mxfp6_e2m3", "wo:nvfp4/kernel",
                                 "wo:mxfp6_e2m3/kernel"}
    assert max(r["rel_err"].values()) < decode_sweep.TOL
    assert {"fp8_channel", "wo:nvfp4", "xla_fp8", "bf16"} <= set(r["us"])
  md = (out / "decode_sweep.md").read_text()
  assert "| 128 x 256 | 20 |" in md and "Ceilings" in md and "Goals per token band" in md
  assert "| wo:nvfp4 | XLA FP8 |" in md
  # No CUDA torch here: the torch peers are skipped with a note saying why, never an error.
  assert data["meta"]["torch"].startswith("skipped") and data["meta"]["torch_4bit"]
  assert decode_sweep.TORCH_FP8 not in data["rows"][0]["us"]
  assert set(data["rows"][0]["floor_us"]) >= {"fp8_channel", "wo:nvfp4", "xla_fp8"}
  assert data["meta"]["partial"] is False
  assert decode_sweep.main(["--report", str(out)]) == 0
  # Two runs of other shapes merge into one report (rows in order, failures of both).
  other = tmp_path / "other"
  other.mkdir()
  data2 = dict(meta=dict(data["meta"], failures=["x"]), rows=[dict(data["rows"][0], n=256),
                                                             dict(data["rows"][0], m=8)])
  (other / "decode_sweep.json").write_text(json.dumps(data2))
  merged = tmp_path / "merged"
  assert decode_sweep.main(["--report", f"{out},{other}", "--out", str(merged)]) == 0
  both = json.loads((merged / "decode_sweep.json").read_text())
  assert [(r["n"], r["m"]) for r in both["rows"]] == [(128, 1), (128, 8), (128, 20), (256, 1)]
  assert both["meta"]["failures"] == ["x"] and len(both["meta"]["merged"]) == 2
  assert "| 256 x 256 | 1 |" in (merged / "decode_sweep.md").read_text()
  with pytest.raises(SystemExit, match="twice"):
    decode_sweep.main(["--report", f"{out},{out}", "--out", str(merged)])


def test_unknown_format_is_refused():
  with pytest.raises(SystemExit):
    decode_sweep.main(["--formats", "fp8_channel,int4"])


def test_torch_peer_column():
  row = dict(m=16, n=8192, k=8192, us={"xla_fp8": 30.0, "fp8_channel": 28.0, "torch_fp8": 31.0},
             floor_us={"xla_fp8": 14.0, "fp8_channel": 14.0, "torch_fp8": 14.0})
  md = decode_sweep.markdown(dict(date="d", device="gpu", jax="j", jax_gmma="g", xla_flags=""), [row])
  assert "torch_fp8" in md and "0.97x" in md  # 30 / 31: XLA's FP8 dot over the peer's time
  assert decode_sweep.misses(row, "torch_fp8") is None  # a peer has no goal
