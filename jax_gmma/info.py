"""`python -m jax_gmma info`: versions, GPU, built kernels, and the path each op takes here."""
from __future__ import annotations

import platform

import jax
import jaxlib

from . import _backend, configs


def info_text() -> str:
  lines = [f"jax-gmma {__import__('jax_gmma').__version__}",
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
  # Blackwell block-scaled MX / NVFP4 GEMMs (mx_gemm, dot on MX/NVFP4 weights), per format pair.
  from . import mx  # noqa: PLC0415
  cc = _backend.device_cc(devs[0]) if devs else None
  for (fa, fb), p in mx.paths_for_device(cc).items():
    lines.append(f"  {fa} x {fb} (mx_gemm): {p}")
  if e is not None and e.kernels():
    lines.append("kernels built:")
    seen = {}
    for k in e.kernels():
      seen.setdefault(k["config"], []).append(f"{k['a']}x{k['b']}->{k['d']}")
    for name, kinds in seen.items():
      cfg = configs.CONFIGS.get(name)
      lines.append(f"  {cfg if cfg else name}  [{len(kinds)} dtype combos]")
  return "\n".join(lines)
