"""Where the CUDA kernels come from: the compiled extension, FFI target registration, the
device checks, and the opt-in switch for the reference path on CUDA GPUs without kernels."""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Optional

import jax

FP8_GEMM_TARGET = "jax_gmma_fp8_gemm"
FP8_BLOCKWISE_GEMM_TARGET = "jax_gmma_fp8_blockwise_gemm"
MX_GEMM_TARGET = "jax_gmma_mx_gemm"  # MX / NVFP4 block-scaled GEMMs (jax_gmma/ops/mx.py; MXFP8 on Hopper)
WEIGHTONLY_GEMM_TARGET = "jax_gmma_weightonly_gemm"
WEIGHTONLY_UNPACK_TARGET = "jax_gmma_weightonly_unpack"
WEIGHTONLY_TILE_X_TARGET = "jax_gmma_weightonly_tile_x"  # x tiled for the tensor-core weight-only shapes
FP8_QUANTIZE_TARGET = "jax_gmma_fp8_quantize"
FP8_GROUPED_GEMM_TARGET = "jax_gmma_fp8_grouped_gemm"  # jax_gmma.ragged_dot (jax_gmma/ops/grouped.py)
WEIGHTONLY_GROUPED_GEMM_TARGET = "jax_gmma_weightonly_grouped_gemm"  # ragged_dot on FP4 / FP6 experts
MX_GROUPED_GEMM_TARGET = "jax_gmma_mx_grouped_gemm"  # ragged_dot on block-scaled experts (sm_100a)
#: Every FFI target of the kernel library.
TARGETS = (FP8_GEMM_TARGET, FP8_BLOCKWISE_GEMM_TARGET, MX_GEMM_TARGET, WEIGHTONLY_GEMM_TARGET,
           WEIGHTONLY_UNPACK_TARGET, WEIGHTONLY_TILE_X_TARGET, FP8_QUANTIZE_TARGET, FP8_GROUPED_GEMM_TARGET,
           WEIGHTONLY_GROUPED_GEMM_TARGET, MX_GROUPED_GEMM_TARGET)
#: Compute capabilities (as jax reports them) that have kernels, by built arch (the FP8
#: tensorwise / blockwise families; the MX / NVFP4 family has its own map, jax_gmma.ops.mx.ARCH_FOR_CC).
ARCH_FOR_CC = {"9.0": "sm_90a"}

_state = threading.local()
_lock = threading.Lock()
_registered = False
_prepared: set = set()


@functools.lru_cache(maxsize=None)
def _load_ext():
  try:
    from . import _gmma_ext  # type: ignore[attr-defined]
  except ImportError as e:
    return None, str(e)
  return _gmma_ext, None


def ext():
  """The nanobind extension module, or None when the package was installed without it."""
  return _load_ext()[0]


def ext_import_error() -> Optional[str]:
  """Why the extension could not be imported (None when it was)."""
  return _load_ext()[1]


def kernels_built() -> bool:
  e = ext()
  return bool(e is not None and e.cuda_built() and e.kernels())


def built_archs() -> list:
  e = ext()
  return [a for a in (e.built_archs().split(",") if e is not None else []) if a]


def register_targets() -> bool:
  """Registers the FFI targets with XLA (once). Needs no GPU."""
  global _registered
  with _lock:
    if _registered:
      return True
    e = ext()
    if e is None or not e.cuda_built():
      return False
    for name, capsule in e.registrations().items():
      jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    _registered = True
    return True


# -- the opt-in reference switch ------------------------------------------------------------

def _env_allow() -> bool:
  return os.environ.get("JAX_GMMA_ALLOW_REFERENCE", "0").lower() in ("1", "true", "yes")


_global_allow = [None]


def set_allow_reference(allow: Optional[bool]) -> None:
  """Process-wide: let ops on CUDA GPUs without a kernel run the (slower) pure-JAX reference.
  None restores the default (the JAX_GMMA_ALLOW_REFERENCE environment variable)."""
  _global_allow[0] = allow


@contextlib.contextmanager
def allow_reference(allow: bool = True):
  """Context manager form of :func:`set_allow_reference` (applies to tracing inside it)."""
  prev = getattr(_state, "allow", None)
  _state.allow = allow
  try:
    yield
  finally:
    _state.allow = prev


def reference_allowed() -> bool:
  local = getattr(_state, "allow", None)
  if local is not None:
    return local
  if _global_allow[0] is not None:
    return _global_allow[0]
  return _env_allow()


# -- devices --------------------------------------------------------------------------------

def cuda_devices() -> list:
  out = []
  for d in jax.devices():
    version = str(getattr(d.client, "platform_version", "")).lower()
    if d.platform in ("gpu", "cuda") and "rocm" not in version:
      out.append(d)
  return out


def device_cc(dev) -> str:
  return str(getattr(dev, "compute_capability", "?"))


class KernelUnavailable(RuntimeError):
  pass


REFUSAL = ("Refusing to fall back silently to the slower pure-JAX reference; set "
           "JAX_GMMA_ALLOW_REFERENCE=1, call jax_gmma.set_allow_reference(True), or trace inside "
           "`with jax_gmma.allow_reference():` to run it anyway.")


def unavailable(op: str, why: str) -> KernelUnavailable:
  """The error of an op whose kernel cannot run here (``why``) and whose reference path was not
  allowed: what is missing and the remedy."""
  return KernelUnavailable(f"jax_gmma.{op}: {why}. {REFUSAL}")


def first_cuda_device():
  """The CUDA device the lowerings plan for (the first one), or None."""
  devs = cuda_devices()
  return devs[0] if devs else None


def missing_reason(op: str) -> Optional[str]:
  """Why the FP8 / weight-only kernels cannot run here (no library, no CUDA device, no kernel
  for its compute capability), or None when they can."""
  dev = first_cuda_device()
  if not kernels_built():
    err = ext_import_error()
    return ("jax_gmma was installed without CUDA kernels" + (f" ({err})" if err else "") +
            "; reinstall with nvcc on PATH (JAX_GMMA_CUDA=1)")
  if dev is None:
    return "no CUDA device is visible to JAX"
  if device_cc(dev) not in ARCH_FOR_CC or ARCH_FOR_CC[device_cc(dev)] not in built_archs():
    return (f"no {op} kernel for compute capability {device_cc(dev)} ({dev.device_kind}); "
            f"built archs: {', '.join(built_archs()) or 'none'}")
  return None


def check_cuda_kernels(op: str) -> Optional[object]:
  """Returns the CUDA device to plan for, or None when the reference path should be used.
  Raises KernelUnavailable (with the remedy) when there is no kernel and no opt-in."""
  why = missing_reason(op)
  if why is None:
    return first_cuda_device()
  if reference_allowed():
    return None
  raise unavailable(op, why)


def prepare_devices() -> None:
  """One-time kernel setup (shared-memory attributes) on every local CUDA device, done at
  trace time so that it never happens inside a CUDA-graph capture."""
  e = ext()
  for d in cuda_devices():
    hw = getattr(d, "local_hardware_id", d.id)
    if hw in _prepared:
      continue
    with _lock:
      if hw in _prepared:
        continue
      msg = e.prepare(int(hw))
      if msg:
        raise RuntimeError(f"jax_gmma: kernel setup failed on {d}: {msg}")
      _prepared.add(hw)
