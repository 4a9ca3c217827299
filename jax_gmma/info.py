"""`python -m jax_gmma info`: versions, GPU, built kernels, and the path each op takes here."""
from __future__ import annotations

import platform

import jax
import jaxlib

from . import _backend, _version, primitive
from .ops import grouped_configs, mx, quantize
from .ops import tensorwise_configs as configs
from .ops.weightonly import (PREFILL_FP8_MIN_M, PREFILL_MIN_M, TILE_X_TARGET, UNPACK_TARGET,
                             WEIGHTONLY_TARGET)


def weightonly_path(devs) -> str:
  """How the FP4/FP6 weight-only GEMM (``weightonly_gemm``, ``dot`` on a PackedWeight; target
  ``jax_gmma_weightonly_gemm``) runs here: the sm_90a kernel on Hopper with the library built,
  else the pure-JAX reference (an error on a CUDA GPU without the kernel, unless opted in)."""
  if not devs:
    return "pure-JAX reference (no CUDA GPU)"
  try:
    dev = _backend.check_cuda_kernels("weightonly_gemm")
  except _backend.KernelUnavailable as err:
    return f"ERROR at trace time unless the reference is allowed: {err}"
  if dev is None:
    return "pure-JAX reference (opted in)"
  for target in (WEIGHTONLY_TARGET, UNPACK_TARGET, TILE_X_TARGET):
    if target not in _registrations():
      return f"ERROR: the built library has no {target} handler (an older library); rebuild it"
  return (f"CUDA kernels (FP4/FP6 widened to bf16 in registers, XLA FFI {WEIGHTONLY_TARGET}: "
          "sm90a mma.sync, 8 / 16 tokens per CTA; from 17, 33 or 65 tokens by N: sm90a "
          "wgmma with the weights as its register operand and x tiled for its bulk copies "
          f"({TILE_X_TARGET}), 32 / 64 / 128 tokens per CTA, the shape by how its CTAs fill the "
          f"SMs; M >= {PREFILL_MIN_M}: {UNPACK_TARGET} + a bf16 GEMM; FP8 x and MX weights from "
          f"M = {PREFILL_FP8_MIN_M}: {UNPACK_TARGET} + jax-gmma's FP8 GEMM)")


def quantize_path(devs) -> str:
  """How ``quantize`` to fp8_1x128 / mxfp8 (float8_e4m3fn, K last) runs here: the activation
  quantize kernel (target ``jax_gmma_fp8_quantize``, jax_gmma/ops/quantize.py) on Hopper with
  the library built, else pure JAX (never an error: quantize always ran in JAX before)."""
  target = quantize.FP8_QUANTIZE_TARGET
  if not devs:
    return "pure JAX (no CUDA GPU)"
  if quantize.kernel_available():
    return f"CUDA kernel (sm90a, XLA FFI {target})"
  if _backend.kernels_built() and target not in _registrations():
    why = f"the built library has no {target} handler"
  else:
    why = f"no kernel for {_backend.device_cc(devs[0])} in this build"
  return f"pure JAX ({why}; quantize falls back silently, by design)"


def grouped_path(devs) -> str:
  """How ``ragged_dot`` (the grouped GEMM of mixture-of-experts layers) runs here: the grouped
  weight-streaming kernels on Hopper with the library built (targets
  ``jax_gmma_fp8_grouped_gemm``, ``jax_gmma_weightonly_grouped_gemm``), the grouped
  block-scaled kernels on sm_100a (``jax_gmma_mx_grouped_gemm``), else the pure-JAX reference
  (an error on a CUDA GPU without the kernels, unless opted in)."""
  if not devs:
    return "pure-JAX reference (no CUDA GPU)"
  if (mx.arch_for_cc(_backend.device_cc(devs[0])) == "sm_100a" and "sm_100a" in _backend.built_archs()
      and _backend.MX_GROUPED_GEMM_TARGET in _registrations()):
    names = ", ".join(grouped_configs.sm100_kernel_name(c) for cs in grouped_configs.SM100_CONFIGS.values()
                      for c in cs)
    return (f"CUDA kernels (sm_100a, NOT validated on hardware): {' / '.join(grouped_configs.SM100_CONFIGS)} "
            f"QuantizedArray experts on CUTLASS's grouped block-scaled GEMM (XLA FFI "
            f"{_backend.MX_GROUPED_GEMM_TARGET}, configs {names}); other expert formats: the "
            "reference, an error unless allowed")
  try:
    dev = _backend.check_cuda_kernels("ragged_dot")
  except _backend.KernelUnavailable as err:
    return f"ERROR at trace time unless the reference is allowed: {err}"
  if dev is None:
    return "pure-JAX reference (opted in)"
  target, wo = _backend.FP8_GROUPED_GEMM_TARGET, _backend.WEIGHTONLY_GROUPED_GEMM_TARGET
  unpack = _backend.WEIGHTONLY_UNPACK_TARGET
  for t in (target, wo, unpack):
    if t not in _registrations():
      return f"ERROR: the built library has no {t} handler (an older library); rebuild it"
  return (f"CUDA kernels (sm90a): {' / '.join(grouped_configs.KINDS)} experts weight streaming "
          f"(XLA FFI {target}, configs {', '.join(grouped_configs.CONFIGS)}), "
          f"{' / '.join(grouped_configs.PREFILL_KIND)} ones from {grouped_configs.PREFILL_MIN_ROWS} rows per "
          f"expert on CUTLASS's grouped GEMM "
          f"({', '.join(grouped_configs.PREFILL_CONFIGS)}; mxfp8 as exact bf16 operands: "
          f"{', '.join(grouped_configs.BF16_PREFILL_CONFIGS)}); "
          f"{' / '.join(grouped_configs.WEIGHTONLY_FORMATS)} experts weight streaming (XLA FFI {wo}), "
          f"{' / '.join(grouped_configs.WEIGHTONLY_BF16_FORMATS)} ones with a float x from "
          f"{grouped_configs.WEIGHTONLY_BF16_MIN_ROWS} rows per expert as exact bf16 operands "
          f"(unpacked by XLA FFI {unpack}, all experts in one launch)")


def _registrations() -> dict:
  e = _backend.ext()
  try:
    return dict(e.registrations()) if e is not None and e.cuda_built() else {}
  except Exception:  # noqa: BLE001 - an extension without the call: no handlers known
    return {}


def info_text() -> str:
  lines = [f"jax-gmma {_version.__version__}",
           f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}"]
  e = _backend.ext()
  if e is None:
    lines.append(f"extension: NOT built ({_backend.ext_import_error()})")
  else:
    by_arch = {}
    for k in e.kernels():
      by_arch[k.get("arch", 90)] = by_arch.get(k.get("arch", 90), 0) + 1
    per_arch = ", ".join(f"sm_{a}: {c}" for a, c in sorted(by_arch.items()))
    lines.append(f"extension: built, CUDA kernels {'yes' if e.cuda_built() else 'no'}, "
                 f"archs: {e.built_archs() or 'none'}, {len(e.kernels())} kernels"
                 + (f" ({per_arch})" if per_arch else ""))
  devs = _backend.cuda_devices()
  if devs:
    for d in devs:
      lines.append(f"GPU {d.id}: {d.device_kind}, compute capability {_backend.device_cc(d)}, "
                   f"{getattr(d, 'core_count', '?')} SMs, platform {d.client.platform_version}")
  else:
    lines.append(f"GPU: none visible to JAX (backend: {jax.default_backend()})")
  # Which path each op takes on this machine.
  try:
    dev = _backend.check_cuda_kernels("fp8_gemm") if devs else None
    path = "CUDA kernel (CUTLASS sm90a, XLA FFI)" if dev is not None else (
        "pure-JAX reference (no CUDA GPU)" if not devs else "pure-JAX reference (opted in)")
  except _backend.KernelUnavailable as err:
    path = f"ERROR at trace time unless the reference is allowed: {err}"
  lines.append("formats / paths:")
  lines.append(f"  fp8 per-tensor / per-channel (fp8_gemm, dot): {path}")
  lines.append(f"  FP4/FP6 weight-only nvfp4 / mxfp4 / mxfp6 x bf16 (weightonly_gemm, dot on PackedWeight): "
               f"{weightonly_path(devs)}")
  lines.append(f"  activation quantize fp8_1x128 / mxfp8, e4m3 (quantize): {quantize_path(devs)}")
  lines.append(f"  grouped GEMM for mixture-of-experts (ragged_dot): {grouped_path(devs)}")
  # Block-scaled MX / NVFP4 GEMMs (mx_gemm, dot on MX/NVFP4 weights; MXFP8 also on Hopper), per pair.
  cc = _backend.device_cc(devs[0]) if devs else None
  for (fa, fb), p in mx.paths_for_device(cc).items():
    lines.append(f"  {fa} x {fb} (mx_gemm): {p}")
  safe = sorted(name for name, op in primitive.OPS.items() if op.graph_safe)
  lines.append(f"CUDA-graph safe FFI calls (XLA command buffers): {', '.join(safe)}")
  if e is not None and e.kernels():
    lines.append("kernels built:")
    seen = {}
    for k in e.kernels():
      seen.setdefault(k["config"], []).append(f"{k['a']}x{k['b']}->{k['d']}")
    for name, kinds in seen.items():
      cfg = configs.CONFIGS.get(name)
      lines.append(f"  {cfg if cfg else name}  [{len(kinds)} dtype combos]")
  return "\n".join(lines)
