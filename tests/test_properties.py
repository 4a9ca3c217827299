"""Property-based tests (hypothesis) of ``jax_gmma.dot`` on every weight format it accepts.

Each example draws a weight format's shape bucket (x rank 1-3, M from 1 to 512, N and K from
the format's granularity with tails where the format allows them), the x dtype, a bias or none,
scale magnitudes of x and w (2^e with e tiny (-60), normal, huge (+60); in a second test near
float32's smallest normal or the input dtype's maximum), a spread of row magnitudes and all-zero
rows. One jitted
program per bucket runs ``dot`` for every output dtype the family gives, for a float x (each
``x_format`` that applies) and for a pre-quantized ``QuantizedArray`` x, and returns the
quantized activations it used. Properties, per output:

- shape and dtype as documented;
- relative Frobenius error against the float64 product of the dequantized operands (decoded
  from the stored elements and scales in float64) within the per-format tolerance of
  ``docs/formats.md``, wherever the exact result lies well inside the output dtype's normal
  range;
- finite inputs whose exact product is within range give finite outputs;
- an all-zero product gives exactly zero.

Buckets are few per format, so XLA compiles one program per bucket and the rest of the
examples reuse it. The CPU variant (the pure-JAX reference, CI) runs a few examples per
format; the GPU variant runs the kernels on at least 1000 examples in all (scale with
``JAX_GMMA_PROPERTY_EXAMPLES``, the GPU total; ``JAX_GMMA_PROPERTY_CPU_EXAMPLES``, per format
on CPU). ``JAX_GMMA_PROPERTY_REPORT=path.json`` appends the counts of each run to a JSON file.

``test_dot_extreme_magnitudes`` draws operands near float32's limits (a product still in range);
a zero-size batch and a 1-D x on FP8 weights have tests of their own.
"""
import dataclasses
import functools
import json
import math
import os
import threading
import zlib

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the property tests need hypothesis "
                                 "(python3 -m pip install hypothesis)")
from hypothesis import HealthCheck, event, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_gmma  # noqa: E402

SW = "sm100_128x4"
E4, E5 = "float8_e4m3fn", "float8_e5m2"
BF16, F16, F32 = np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
ALL_OUTS = (BF16, F16, F32)
MX_FORMATS = ("mxfp8", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "nvfp4")
K_BLOCK = {"mxfp8": 32, "mxfp4": 32, "mxfp6_e2m3": 32, "mxfp6_e3m2": 32, "nvfp4": 16}

# Relative Frobenius error bounds (docs/formats.md, "Precision and test tolerances"; the same
# numbers as tests/test_gpu_fp8.py, test_gpu_mx_sm90.py and test_weightonly.py).
TOL_FP8 = {BF16: 1e-2, F16: 2e-3, F32: 1e-3}
TOL_MX = {BF16: 1e-2, F16: 1e-2, F32: 1e-3}
TOL_WO = {BF16: 8e-3, F32: 1e-5}
TOL_WO_FP8X = {BF16: 8e-3, F32: 3e-4}  # FP8 activations may take the FP8 tensor-core prefill
TOL_CPU_F32 = 1e-5                      # the reference path in float32 (docs: about 1e-6)


@dataclasses.dataclass(frozen=True)
class Bucket:
  """One compiled program: x of shape lead + (K,) and dtype x_dtype, a (N, K) weight."""
  lead: tuple
  n: int
  k: int
  x_dtype: str = "float32"
  bias: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
  name: str                # test id
  wfmt: str                # weight format (quantize / weightonly.prepare)
  packed: bool             # PackedWeight (weightonly.prepare) instead of a QuantizedArray
  outs: tuple              # output dtypes dot gives for this weight
  x_formats: tuple         # x_format values for a float x
  x_quant: tuple           # (format, element dtype) of a QuantizedArray x
  buckets: tuple
  hopper_kernel: bool      # False: the GPU variant runs the reference (allowed explicitly)
  weight: float = 1.0      # share of the GPU examples


def _b(leads, nks, dtypes=("float32", "bfloat16", "float16")):
  """Buckets: every lead shape once, cycling through (N, K) pairs, x dtypes and bias."""
  out = []
  for i, lead in enumerate(leads):
    n, k = nks[i % len(nks)]
    out.append(Bucket(tuple(lead), n, k, dtypes[i % len(dtypes)], i % 3 == 1))
  return tuple(out)


# M (the product of lead) from 1 to 512, ranks 1-3; decode sizes, tile edges and tails.
_LEADS_ALL = [(), (1,), (2,), (7,), (16,), (33,), (64,), (127,), (129,), (300,), (2, 3), (4, 33),
              (1, 1), (3, 100)]
_TW_NK = [(8, 16), (16, 48), (24, 128), (136, 272), (264, 144), (48, 512)]      # K % 16, N % 8
_BW_NK = [(8, 16), (136, 200), (24, 128), (264, 272), (16, 112), (128, 384)]     # partial 128 blocks
_MX8_NK = [(8, 32), (16, 40), (24, 200), (136, 256), (264, 96), (8, 500)]        # K padded to 32
_FP4_NK = [(8, 32), (16, 50), (24, 256), (136, 96), (264, 128), (8, 250)]        # stored K % 32
_FP6_NK = [(8, 128), (16, 100), (24, 256), (136, 250), (264, 128), (8, 384)]     # stored K % 128
_WO_NK = [(16, 7), (32, 64), (48, 100), (144, 128), (16, 200), (272, 256)]       # N % 16, any K

FAMILIES = {f.name: f for f in [
    Family("fp8_tensor", "fp8_tensor", False, ALL_OUTS, ("fp8_channel", "fp8_tensor"),
           (("fp8_channel", E5), ("fp8_tensor", E4)), _b(_LEADS_ALL, _TW_NK), True),
    Family("fp8_channel", "fp8_channel", False, ALL_OUTS, ("fp8_channel", "fp8_tensor"),
           (("fp8_tensor", E5), ("fp8_channel", E4)), _b(_LEADS_ALL, _TW_NK), True),
    Family("fp8_128x128", "fp8_128x128", False, ALL_OUTS, ("fp8_channel",), (("fp8_1x128", E4),),
           _b(_LEADS_ALL, _BW_NK), True),
    Family("fp8_1x128", "fp8_1x128", False, ALL_OUTS, ("fp8_channel",), (("fp8_1x128", E4),),
           _b(_LEADS_ALL, _BW_NK), True),
    # M = 512: the exact bf16 route of MXFP8 on Hopper.
    Family("mxfp8", "mxfp8", False, ALL_OUTS, ("fp8_channel",), (("mxfp8", E4),),
           _b(_LEADS_ALL + [(512,)], _MX8_NK), True),
    Family("nvfp4", "nvfp4", False, ALL_OUTS, ("fp8_channel",), (("nvfp4", None),),
           _b(_LEADS_ALL, _FP4_NK), False, 1 / 3),
    Family("mxfp4", "mxfp4", False, ALL_OUTS, ("fp8_channel", "mxfp8"), (("mxfp4", None),),
           _b(_LEADS_ALL, _FP4_NK), False, 1 / 3),
    Family("mxfp6_e2m3", "mxfp6_e2m3", False, ALL_OUTS, ("fp8_channel", "mxfp8"),
           (("mxfp6_e2m3", None),), _b(_LEADS_ALL, _FP6_NK), False, 1 / 3),
    Family("mxfp6_e3m2", "mxfp6_e3m2", False, ALL_OUTS, ("fp8_channel", "mxfp8"),
           (("mxfp6_e3m2", None),), _b(_LEADS_ALL, _FP6_NK), False, 1 / 3),
] + [
    # Weight-only: M = 127 / 128 / 129 straddle the decode-kernel / prefill switch.
    Family(f"packed_{f}", f, True, (BF16, F32), ("bf16",), (("fp8_channel", E4), ("fp8_tensor", E5)),
           _b(_LEADS_ALL + [(128,)], _WO_NK), True)
    for f in ("nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2")
]}


def _mx_k_ok(xfmt, wfmt, k):
  """mx_gemm's rule: the stored (block-padded) K a multiple of 32, or of 128 for MXFP6 and for
  FP4 mixed with FP8."""
  kp = -(-k // K_BLOCK[xfmt]) * K_BLOCK[xfmt]
  fp6 = "mxfp6" in xfmt or "mxfp6" in wfmt
  mixed = (xfmt == "mxfp8") != (wfmt == "mxfp8")
  return kp % (128 if fp6 or mixed else 32) == 0


def x_variants(fam, bucket):
  """The x forms one program multiplies: ("float", x_format) and ("quant", format, dtype)."""
  out = []
  for xf in fam.x_formats:
    if (_is_mx(fam) and not _mx_k_ok(fam.wfmt if xf == "fp8_channel" else xf, fam.wfmt, bucket.k)):
      continue
    out.append(("float", xf))
  for xf, dt in fam.x_quant:
    if _is_mx(fam) and not _mx_k_ok(xf, fam.wfmt, bucket.k):
      continue
    out.append(("quant", xf, dt))
  return tuple(out)


def _is_mx(fam):
  """A QuantizedArray MX / NVFP4 weight (mx_gemm), not a PackedWeight."""
  return fam.wfmt in MX_FORMATS and not fam.packed


def _act_format(fam, v):
  """The format dot quantizes a float x to (None: a float x is multiplied in bf16)."""
  if fam.packed:
    return None
  if fam.wfmt in ("fp8_tensor", "fp8_channel"):
    return v[1]
  if fam.wfmt in ("fp8_128x128", "fp8_1x128"):
    return "fp8_1x128"
  return fam.wfmt if v[1] == "fp8_channel" else v[1]


def _parts(q):
  return (q.data, q.scales, q.global_scale)


@functools.lru_cache(maxsize=None)
def _program(fam_name, variants, has_bias):
  """The jitted program of a bucket: {key: dot output} and {variant: the activation parts}."""
  fam = FAMILIES[fam_name]
  mx = _is_mx(fam)

  def run(x, w, bias):
    outs, acts = {}, {}
    k = x.shape[-1]
    for v in variants:
      vk = "|".join(str(p) for p in v)
      if v[0] == "float":
        xin, kw = x, ({} if fam.packed else {"x_format": v[1]})
        af = _act_format(fam, v)
        if af is not None:  # the same quantization dot runs, kept in row-major scales
          src = x.reshape(-1, k) if mx or x.ndim == 1 else x
          acts[vk] = _parts(jax_gmma.quantize(src, af, dtype=jnp.float8_e4m3fn if "fp8" in af or
                                              af == "mxfp8" else None))
      else:
        _, xf, dt = v
        src = x.reshape(-1, k) if mx or x.ndim == 1 else x
        qkw = {} if dt is None else {"dtype": jnp.dtype(dt)}
        xin = jax_gmma.quantize(src, xf, layout=SW if mx else "rowmajor", **qkw)
        kw = {}
        acts[vk] = _parts(jax_gmma.quantize(src, xf, **qkw))
      for od in fam.outs:
        outs[f"{vk}|{od.name}"] = jax_gmma.dot(xin, w, bias=bias if has_bias else None, out_dtype=od, **kw)
    return outs, acts

  return jax.jit(run)


# -- float64 decoding of stored operands (docs/formats.md) -------------------------------------

def decode64(parts, fmt, k, shape):
  """Float64 values of a quantized operand from its stored elements and row-major scales."""
  data, scales, gs = parts
  d = np.asarray(data).astype(np.float64)
  s = np.asarray(scales).astype(np.float64)
  kp = d.shape[-1]
  if fmt == "fp8_tensor":
    v = d * s
  elif fmt == "fp8_channel":
    v = d * s
  elif fmt == "fp8_1x128":
    v = d * np.repeat(s, 128, -1)[..., :kp]
  elif fmt == "fp8_128x128":
    rows = d.shape[-2]
    v = d * np.repeat(np.repeat(s, 128, -2)[..., :rows, :], 128, -1)[..., :kp]
  elif fmt in K_BLOCK:
    v = d * np.repeat(s, K_BLOCK[fmt], -1)[..., :kp]
    if fmt == "nvfp4":
      v = v * float(np.asarray(gs, np.float64).reshape(()))
  else:
    raise AssertionError(fmt)
  return v[..., :k].reshape(shape)


# -- strategies ---------------------------------------------------------------------------------

# Exponent ranges of the magnitude categories, per input dtype. "low": far below 1, "sat": far
# above (bfloat16 / float32 inputs). The kernels' epilogues and the references compute in
# float32: the product of a scale and the FP8 accumulator, and NVFP4's product of the two
# global scales, must stay inside float32's normal range, so operands within about 2^20 of
# float32's largest value or 2^-100 of its smallest are outside the supported range
# (docs/bad-inputs.md, "Value ranges"); these categories stop short of those limits.
E_RANGES = {
    "float32": {"normal": (-6, 6), "tiny": (-64, -56), "low": (-100, -90), "huge": (56, 64),
                "sat": (100, 108)},
    "float16": {"normal": (-6, 6), "tiny": (-22, -14), "low": (-24, -20), "huge": (6, 10),
                "sat": (11, 13)},
}
E_RANGES["bfloat16"] = E_RANGES["float32"]
MAIN = ("normal", "normal", "normal", "tiny", "huge")
EXTREME = ("low", "sat")


@st.composite
def cases(draw, fam, buckets, extreme=False):
  """One example. Main: magnitudes 2^-64 .. 2^64 per operand. Extreme: at least one operand near
  a float32 limit ("low": near the smallest normal, where FP8 scales clamp; "sat": near the
  input dtype's largest value), or one at a limit and the other its opposite ("balance"), so
  the product itself stays in range."""
  bucket = draw(st.sampled_from(buckets))
  xr = E_RANGES[bucket.x_dtype]
  if extreme:
    xcat = draw(st.sampled_from(("normal",) + EXTREME))
    wcat = draw(st.sampled_from(EXTREME + ("balance",) if xcat == "normal" else
                                ("normal", "balance") + EXTREME))
  else:
    xcat, wcat = draw(st.sampled_from(MAIN)), draw(st.sampled_from(MAIN))
  ex = draw(st.integers(*xr[xcat]))
  if wcat == "balance":  # the opposite of x's magnitude: extreme operands, product in range
    ew = max(-108, min(108, -ex + draw(st.integers(-4, 4))))
  else:
    ew = draw(st.integers(*E_RANGES["float32"][wcat]))
  if fam.wfmt == "nvfp4" and not fam.packed:
    # NVFP4 x NVFP4 multiplies the two global scales first (docs/bad-inputs.md, "Value ranges"):
    # operand magnitudes whose product is below 2^-100 underflow there.
    ew = max(ew, -100 - ex)
  return dict(bucket=bucket, ex=ex, ew=ew, seed=draw(st.integers(0, 2 ** 31 - 1)),
              spread_x=draw(st.sampled_from((0, 0, 3, 12))), spread_w=draw(st.sampled_from((0, 0, 3, 12))),
              zero_rows=draw(st.booleans()))


def _values(rng, shape, e, spread, zero_rows, dtype):
  """Gaussian values clipped to 4 sigma, times 2^e, rows spread over 2^+-spread; the result is
  finite in dtype (exponents are clamped to keep it so)."""
  v = np.clip(rng.standard_normal(shape), -4, 4)
  if spread and len(shape) >= 1:
    v = v * np.exp2(rng.integers(-spread, 1, shape[:-1] + (1,)))
  if zero_rows and len(shape) >= 2 and shape[-2] > 1:
    v[..., rng.integers(0, shape[-2]), :] = 0
  v = v * 2.0 ** e
  out = v.astype(np.float32).astype(jnp.dtype(dtype))
  assert np.isfinite(np.asarray(out, np.float64)).all()
  return out


# -- the property -------------------------------------------------------------------------------

RESULTS = {}


def _check_output(out, ref, od, tol, label, stats):
  """The per-output properties; returns what was asserted."""
  out64 = np.asarray(out, np.float64)
  fi = jnp.finfo(jnp.dtype(od))  # (NumPy's finfo does not know bfloat16 in every version)
  big = float(np.max(np.abs(ref))) if ref.size else 0.0
  if big == 0.0:
    assert np.all(out64 == 0), f"{label}: the exact product is zero, got max |out| {np.abs(out64).max()}"
    stats["zero"] += 1
    return
  if big > float(fi.max) / 2:
    stats["overflow_skipped"] += 1
    event("exact product beyond the output range")
    return
  assert np.isfinite(out64).all(), f"{label}: non-finite output for an in-range product (max {big:.3g})"
  rms = float(np.sqrt(np.mean(ref * ref)))
  if rms < float(fi.tiny) * 2.0 ** (fi.nmant + 2):
    stats["finite_only"] += 1
    event("product near the output's subnormal range: finiteness only")
    return
  err = float(np.linalg.norm(out64 - ref) / np.linalg.norm(ref))
  assert err < tol, f"{label}: relative Frobenius error {err:.3g} >= {tol}"
  stats["accuracy"] += 1


def _tol(fam, backend, od, v):
  if backend == "cpu" and od == F32:
    return TOL_CPU_F32
  if fam.packed:
    return (TOL_WO_FP8X if v[0] == "quant" else TOL_WO)[od]
  if fam.wfmt in MX_FORMATS:
    return TOL_MX[od]
  return TOL_FP8[od]


def _make_weight(fam, w):
  """(the weight dot gets, its float64 values); None when prepare refuses it (checked)."""
  if not fam.packed:
    lay = SW if _is_mx(fam) else "rowmajor"
    wq = jax_gmma.quantize(w, fam.wfmt, layout=lay)
    w64 = decode64(_parts(jax_gmma.quantize(w, fam.wfmt)), fam.wfmt, w.shape[-1], w.shape)
    return wq, w64
  wq = jax_gmma.quantize(w, fam.wfmt)
  w64 = decode64(_parts(wq), fam.wfmt, w.shape[-1], w.shape)
  # Block scales out of the kernel's exact range fold into a power-of-two global scale: prepare
  # refuses only spans of more than ~126 binades, far beyond these draws.
  return jax_gmma.weightonly.prepare(wq, fam.wfmt), w64


def run_example(fam, backend, case, stats):
  b = case["bucket"]
  rng = np.random.default_rng(case["seed"])
  x = _values(rng, b.lead + (b.k,), case["ex"], case["spread_x"], case["zero_rows"], b.x_dtype)
  ew = case["ew"]
  w = _values(rng, (b.n, b.k), ew, case["spread_w"], case["zero_rows"], "float32")
  note(f"{fam.name} {b} ex={case['ex']} ew={ew} seed={case['seed']}")
  wq, w64 = _make_weight(fam, w)
  bias = None
  bias64 = 0.0
  if b.bias:
    be = max(-120, min(120, case["ex"] + ew))
    bias = (rng.integers(-8, 9, b.n) / 4.0 * 2.0 ** be).astype(np.float32)
    bias64 = bias.astype(np.float64)
  variants = x_variants(fam, b)
  outs, acts = _program(fam.name, variants, b.bias)(x, wq, bias)
  for v in variants:
    vk = "|".join(str(p) for p in v)
    if vk in acts:
      af = _act_format(fam, v) if v[0] == "float" else v[1]
      x64 = decode64(acts[vk], af, b.k, (-1, b.k))
    else:  # a float x on FP4 / FP6 weight-only: multiplied in bf16
      x64 = np.asarray(jnp.asarray(x).astype(jnp.bfloat16), np.float64).reshape(-1, b.k)
    # A QuantizedArray x of an MX weight (or from a 1-D x) is 2-D: (M, K).
    m_shape = b.lead if v[0] == "float" or not (_is_mx(fam) or not b.lead) else (-1,)
    ref = (x64 @ w64.T + bias64).reshape(m_shape + (b.n,))
    m_shape = ref.shape[:-1]
    for od in fam.outs:
      out = outs[f"{vk}|{od.name}"]
      label = f"{fam.name} {backend} {b} x={vk} out={od.name} ex={case['ex']} ew={ew}"
      assert out.shape == m_shape + (b.n,), f"{label}: shape {out.shape}"
      assert out.dtype == od, f"{label}: dtype {out.dtype}"
      _check_output(out, ref, od, _tol(fam, backend, od, v), label, stats)
  stats["examples"] += 1


def _buckets(fam, backend):
  """The GPU draws every bucket; the CPU (where compiling dominates) every fourth: 1-D and 2-D /
  3-D x, tails, a few compiles per format, the rest of its examples varying the values."""
  return fam.buckets if backend == "gpu" else fam.buckets[::4]


def _examples(fam, backend, extreme=False):
  if backend == "cpu":
    return int(os.environ.get("JAX_GMMA_PROPERTY_CPU_EXAMPLES", "10")) // (3 if extreme else 1)
  total = int(os.environ.get("JAX_GMMA_PROPERTY_EXAMPLES", "1200")) // (6 if extreme else 1)
  weights = sum(f.weight for f in FAMILIES.values())
  return max(1, math.ceil(total * fam.weight / weights))


class _Stats(dict):
  def __missing__(self, key):
    return 0


def _record(fam, backend, stats, n):
  RESULTS[(backend, fam.name)] = dict(stats)
  print(f"\n[properties] {backend} {fam.name}: {stats['examples']} examples "
        f"(max_examples {n}), {stats['accuracy']} outputs checked to tolerance, "
        f"{stats['finite_only']} finiteness only, {stats['zero']} exact zeros, "
        f"{stats['overflow_skipped']} beyond range, {stats['refused']} refused weights")
  path = os.environ.get("JAX_GMMA_PROPERTY_REPORT")
  if path:  # several pytest-xdist workers may append at once: an exclusive lock on the file
    import fcntl
    with open(path, "a+") as f:
      fcntl.flock(f, fcntl.LOCK_EX)
      f.seek(0)
      text = f.read()
      data = json.loads(text) if text.strip() else {}
      data[f"{backend}/{fam.name}"] = dict(stats, max_examples=n)
      data["total_examples"] = sum(v["examples"] for v in data.values() if isinstance(v, dict))
      f.seek(0)
      f.truncate()
      json.dump(data, f, indent=1, sort_keys=True)


def _run_property(backend, fam_name, extreme):
  fam = FAMILIES[fam_name]
  n = _examples(fam, backend, extreme)
  stats = _Stats()
  tag = f"{backend}{'/extreme' if extreme else ''}"

  # A fixed seed per format: each format draws its own examples, the same on every run.
  @hypothesis.seed(zlib.crc32(f"{tag}/{fam.name}".encode()))
  @settings(max_examples=n, derandomize=True, deadline=None, database=None, print_blob=True,
            suppress_health_check=list(HealthCheck))
  @given(case=cases(fam, _buckets(fam, backend), extreme))
  def prop(case):
    run_example(fam, backend, case, stats)

  if backend == "cpu":
    with jax.default_device(jax.devices("cpu")[0]), jax_gmma.allow_reference():
      prop()
  elif fam.hopper_kernel:
    prop()
  else:  # no Hopper kernel for these QuantizedArray weights: the reference, opted in
    with jax_gmma.allow_reference():
      prop()
  _record(fam, tag, stats, n)
  assert stats["examples"] + stats["refused"] >= 1
  return stats


BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("fam_name", list(FAMILIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_dot_matches_float64(backend, fam_name):
  stats = _run_property(backend, fam_name, extreme=False)
  assert stats["accuracy"] >= 1, "no output was checked to tolerance: the strategies went astray"


@pytest.mark.parametrize("fam_name", list(FAMILIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_dot_extreme_magnitudes(backend, fam_name):
  """Operands near float32's limits whose exact product is in range (a separate test, so that a
  failure here leaves the main property's examples running)."""
  _run_property(backend, fam_name, extreme=True)


# -- edge shapes: a 1-D x on FP8 weights, a zero-size batch ----------------------------------

def _weight_for(fam, n, k):
  w = np.random.default_rng(5).standard_normal((n, k)).astype(np.float32)
  if fam.packed:
    return jax_gmma.weightonly.prepare(w, fam.wfmt)
  return jax_gmma.quantize(w, fam.wfmt, layout=SW if fam.wfmt in MX_FORMATS else "rowmajor")


@pytest.mark.parametrize("fam_name", ["fp8_tensor", "fp8_channel", "fp8_128x128", "fp8_1x128"])
def test_1d_x_on_fp8_weights(fam_name, cpu_device):
  fam = FAMILIES[fam_name]
  w = _weight_for(fam, 16, 128)
  x = np.random.default_rng(6).standard_normal(128).astype(np.float32)
  y = jax.jit(jax_gmma.dot)(x, w)
  assert y.shape == (16,)
  y2 = jax.jit(jax_gmma.dot)(x[None], w)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(y2)[0])


@pytest.mark.parametrize("lead", [(0,), (2, 0)])
@pytest.mark.parametrize("fam_name", list(FAMILIES))
def test_zero_size_batch(fam_name, lead, cpu_device):
  fam = FAMILIES[fam_name]
  k = 128
  with jax_gmma.allow_reference():
    w = _weight_for(fam, 16, k)
    y = jax.jit(jax_gmma.dot)(np.zeros(lead + (k,), np.float32), w)
  assert y.shape == lead + (16,) and y.dtype == jnp.float32


# -- GPU: two threads at once, and the same program twice ---------------------------------------

def _det_programs():
  """(name, make) pairs: make() returns (jitted f, args). Kernels of every family, a decode
  shape, split-K and stream-K forced (both documented as deterministic), and quantize."""
  rng = np.random.default_rng(11)

  def arr(shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)

  w1 = arr((4096, 2048), 0.05)
  progs = {}

  def add(name, fn, *args):
    progs[name] = (fn, args)

  wc = jax_gmma.quantize(w1, "fp8_channel")
  add("fp8_channel_m256", lambda x, w: jax_gmma.dot(x, w), arr((256, 2048)).astype(jnp.bfloat16), wc)
  add("fp8_channel_decode_m8", lambda x, w: jax_gmma.dot(x, w), arr((8, 2048)).astype(jnp.bfloat16), wc)
  wt = jax_gmma.quantize(w1, "fp8_tensor")
  add("fp8_tensor_m64", lambda x, w: jax_gmma.dot(x, w, x_format="fp8_tensor"),
      arr((64, 2048)).astype(jnp.bfloat16), wt)
  add("fp8_splitk_3", lambda x, w: jax_gmma.dot(x, w, config="swap_128x16x128_coop_streamk_2lvl", splits=3),
      arr((16, 2048)).astype(jnp.bfloat16), wc)
  add("fp8_streamk", lambda x, w: jax_gmma.dot(x, w, config="128x128x128_c1x1_coop_streamk_2lvl", splits=0),
      arr((300, 2048)).astype(jnp.bfloat16), wc)
  add("fp8_128x128", lambda x, w: jax_gmma.dot(x, w), arr((200, 2048)).astype(jnp.bfloat16),
      jax_gmma.quantize(w1, "fp8_128x128"))
  add("mxfp8_m33", lambda x, w: jax_gmma.dot(x, w), arr((33, 2048)).astype(jnp.bfloat16),
      jax_gmma.quantize(w1, "mxfp8", layout=SW))
  add("nvfp4_packed_m4", lambda x, w: jax_gmma.dot(x, w), arr((4, 2048)).astype(jnp.bfloat16),
      jax_gmma.weightonly.prepare(w1, "nvfp4"))
  add("mxfp6_e3m2_packed_m200", lambda x, w: jax_gmma.dot(x, w), arr((200, 2048)).astype(jnp.bfloat16),
      jax_gmma.weightonly.prepare(w1, "mxfp6_e3m2"))
  add("quantize_mxfp8", lambda x: jax_gmma.quantize(x, "mxfp8", layout=SW).data.view(jnp.uint8),
      arr((512, 2048)))
  return progs


def _bits(x):
  x = np.asarray(x)
  return x.view(np.uint8).tobytes() if x.dtype.itemsize else x.tobytes()


@pytest.mark.gpu
def test_two_threads_and_determinism():
  progs = _det_programs()
  # Single thread: each program twice, compiled once; then a fresh compile: bit-identical.
  single = {}
  for name, (fn, args) in progs.items():
    f = jax.jit(fn)
    a = _bits(f(*args))
    b = _bits(f(*args))
    c = _bits(jax.jit(fn)(*args))
    assert a == b, f"{name}: the same program run twice differs"
    assert a == c, f"{name}: a second compile of the same program differs"
    single[name] = a
  # Two threads, each tracing, compiling and running its own half of the programs (different
  # families and shapes) at once, several rounds; every result bit-identical to the single run.
  names = sorted(progs)
  halves = [names[0::2], names[1::2]]
  errors, barrier = [], threading.Barrier(2)

  def worker(mine):
    try:
      barrier.wait()
      for _ in range(3):
        for name in mine:
          fn, args = progs[name]
          got = _bits(jax.jit(lambda *a, fn=fn: fn(*a))(*args))  # a new function: a new trace
          if got != single[name]:
            errors.append(f"{name}: differs from the single-thread result")
    except Exception as e:  # noqa: BLE001 (reported below)
      errors.append(f"{mine}: {type(e).__name__}: {e}")

  threads = [threading.Thread(target=worker, args=(h,)) for h in halves]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors, "\n".join(errors)
