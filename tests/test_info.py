"""`python -m jax_gmma info` runs anywhere and says which path each op takes."""
import subprocess
import sys
import types

import pytest

from jax_gmma import _backend, info
from jax_gmma.ops import quantize as qkernel
from jax_gmma.info import info_text


def _path_line(text, prefix):
  lines = [ln for ln in text.splitlines() if ln.strip().startswith(prefix)]
  assert len(lines) == 1, (prefix, text)
  return lines[0]


def test_info_text_names_versions_and_paths():
  text = info_text()
  assert "jax " in text and "jaxlib " in text
  assert "fp8 per-tensor / per-channel" in text
  assert ("CUDA kernel" in text) or ("reference" in text) or ("ERROR" in text)
  # The FP4 weight-only GEMM and the activation quantize kernel report their path too.
  wo = _path_line(text, "FP4/FP6 weight-only nvfp4 / mxfp4 / mxfp6 x bf16 (weightonly_gemm, dot on PackedWeight):")
  qk = _path_line(text, "activation quantize fp8_1x128 / mxfp8, e4m3 (quantize):")
  if not _backend.cuda_devices():
    assert wo.endswith("pure-JAX reference (no CUDA GPU)"), wo
    assert qk.endswith("pure JAX (no CUDA GPU)"), qk
  else:
    assert ("jax_gmma_weightonly_gemm" in wo) or ("reference" in wo) or ("ERROR" in wo), wo
    assert ("jax_gmma_fp8_quantize" in qk) or ("pure JAX" in qk), qk


class _FakeExt:
  def __init__(self, targets):
    self._targets = targets

  def cuda_built(self):
    return True

  def registrations(self):
    return {t: None for t in self._targets}


_HOPPER = types.SimpleNamespace(compute_capability="9.0")


@pytest.mark.parametrize("targets", [("jax_gmma_weightonly_gemm", "jax_gmma_weightonly_unpack",
                                      "jax_gmma_weightonly_tile_x", "jax_gmma_fp8_quantize", "jax_gmma_fp8_grouped_gemm",
                                      "jax_gmma_weightonly_grouped_gemm"), ()])
def test_paths_on_hopper_with_kernels(monkeypatch, targets):
  """Hopper with the kernels built: the kernels, when the library has their handlers."""
  monkeypatch.setattr(_backend, "check_cuda_kernels", lambda op: _HOPPER)
  monkeypatch.setattr(_backend, "kernels_built", lambda: True)
  monkeypatch.setattr(_backend, "ext", lambda: _FakeExt(targets))
  monkeypatch.setattr(qkernel, "_target_in_library",
                      lambda: "jax_gmma_fp8_quantize" in targets)
  wo, qk = info.weightonly_path([_HOPPER]), info.quantize_path([_HOPPER])
  gr = info.grouped_path([_HOPPER])
  if targets:
    assert wo.startswith("CUDA kernel") and "jax_gmma_weightonly_gemm" in wo, wo
    assert qk.startswith("CUDA kernel") and "jax_gmma_fp8_quantize" in qk, qk
    assert gr.startswith("CUDA kernel") and "jax_gmma_fp8_grouped_gemm" in gr, gr
  else:  # an older library: the GEMM says it cannot run, quantize stays in JAX
    assert wo.startswith("ERROR") and "no jax_gmma_weightonly_gemm handler" in wo, wo
    assert qk.startswith("pure JAX") and "no jax_gmma_fp8_quantize handler" in qk, qk
    assert gr.startswith("ERROR") and "no jax_gmma_fp8_grouped_gemm handler" in gr, gr


def test_weightonly_path_needs_the_unpack_handler(monkeypatch):
  """A library with the decode GEMM but not the prefill unpack kernel is an older library."""
  monkeypatch.setattr(_backend, "check_cuda_kernels", lambda op: _HOPPER)
  monkeypatch.setattr(_backend, "kernels_built", lambda: True)
  monkeypatch.setattr(_backend, "ext", lambda: _FakeExt(("jax_gmma_weightonly_gemm",)))
  wo = info.weightonly_path([_HOPPER])
  assert wo.startswith("ERROR") and "no jax_gmma_weightonly_unpack handler" in wo, wo
  # nor without the tensor-core shapes' x tiling kernel
  monkeypatch.setattr(_backend, "ext", lambda: _FakeExt(("jax_gmma_weightonly_gemm", "jax_gmma_weightonly_unpack")))
  wo = info.weightonly_path([_HOPPER])
  assert wo.startswith("ERROR") and "no jax_gmma_weightonly_tile_x handler" in wo, wo


def test_paths_on_gpu_without_kernels(monkeypatch):
  """A CUDA GPU without kernels: the GEMM is an error unless the reference is allowed;
  quantization quietly stays pure JAX."""
  def refuse(op):
    raise _backend.KernelUnavailable(f"jax_gmma.{op}: no kernel")
  other = types.SimpleNamespace(compute_capability="8.0")
  monkeypatch.setattr(_backend, "check_cuda_kernels", refuse)
  monkeypatch.setattr(_backend, "kernels_built", lambda: False)
  wo, qk = info.weightonly_path([other]), info.quantize_path([other])
  assert wo.startswith("ERROR at trace time") and "weightonly_gemm" in wo, wo
  assert qk.startswith("pure JAX") and "8.0" in qk, qk
  monkeypatch.setattr(_backend, "check_cuda_kernels", lambda op: None)  # reference allowed
  assert info.weightonly_path([other]) == "pure-JAX reference (opted in)"
  assert info.quantize_path([other]).startswith("pure JAX")


def test_module_entry_point():
  r = subprocess.run([sys.executable, "-P", "-m", "jax_gmma", "info"], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  assert "jax-gmma" in r.stdout
  assert "FP4/FP6 weight-only" in r.stdout and "activation quantize" in r.stdout
  r = subprocess.run([sys.executable, "-P", "-m", "jax_gmma", "nope"], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2 and "usage" in r.stderr
