"""Tests import the *installed* jax_gmma (run them with `python3 -P -m pytest tests`, so the
source tree, which lacks the compiled extension, does not shadow it)."""
import os

import pytest

# Under pytest-xdist every worker is a process with its own JAX client on the same GPU: none may
# take XLA's default 75% of the GPU's memory up front (the second worker's allocations would
# fail). Off unless the caller set it.
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# GPU test runs are short on device time: XLA's GEMM autotuning (for the reference dots and
# peers, never our kernels) costs seconds per new shape. Off unless the caller set it.
if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()


def _hopper_with_kernels():
  try:
    import jax
    from jax_gmma import _backend
  except Exception as e:  # pragma: no cover
    return False, f"import failed: {e}"
  devs = _backend.cuda_devices()
  if not devs:
    return False, f"no CUDA GPU visible to JAX (backend {jax.default_backend()})"
  if not _backend.kernels_built():
    return False, "jax_gmma was built without CUDA kernels"
  cc = _backend.device_cc(devs[0])
  if cc != "9.0":
    return False, f"GPU compute capability {cc} has no sm_90a kernels"
  return True, ""


def pytest_collection_modifyitems(config, items):
  ok, why = None, None
  for item in items:
    if "gpu" in item.keywords:
      if ok is None:
        ok, why = _hopper_with_kernels()
      if not ok:
        item.add_marker(pytest.mark.skip(reason=f"GPU test: {why}"))


@pytest.fixture
def cpu_device():
  """Runs the test's computations on JAX's CPU device (every jax install has one): for tests
  of the pure-JAX reference maths, which on a Hopper GPU would otherwise run a jax-gmma kernel
  (tested against float64 with its own tolerances in the GPU tests)."""
  import jax
  with jax.default_device(jax.devices("cpu")[0]):
    yield


@pytest.fixture
def fake_hopper(monkeypatch):
  """The backend believes it runs on an H200 with the sm_90a kernels built (CPU tests of the
  CUDA lowering's decisions and messages; nothing runs on the fake device)."""
  from jax_gmma import _backend

  class Dev:
    compute_capability = "9.0"
    device_kind = "NVIDIA H200"
    core_count = 132
  monkeypatch.setattr(_backend, "kernels_built", lambda: True)
  monkeypatch.setattr(_backend, "built_archs", lambda: ["sm_90a"])
  monkeypatch.setattr(_backend, "cuda_devices", lambda: [Dev()])


@pytest.fixture
def fake_blackwell(monkeypatch):
  """The backend believes it runs on a B200 (compute capability 10.0, 148 SMs) with the sm_90a
  and sm_100a kernels built (CPU tests of the CUDA lowering's decisions and messages; nothing
  runs on the fake device, and no Blackwell GPU exists here to run one)."""
  from jax_gmma import _backend

  class Dev:
    compute_capability = "10.0"
    device_kind = "NVIDIA B200"
    core_count = 148
  monkeypatch.setattr(_backend, "kernels_built", lambda: True)
  monkeypatch.setattr(_backend, "built_archs", lambda: ["sm_90a", "sm_100a"])
  monkeypatch.setattr(_backend, "cuda_devices", lambda: [Dev()])


@pytest.fixture
def ragged_dot_without_kernel(monkeypatch):
  """``jax_gmma.ragged_dot`` as on a CUDA GPU without its grouped kernel: KernelUnavailable
  unless the reference is allowed (then the reference runs); the global opt-in off whatever
  JAX_GMMA_ALLOW_REFERENCE says. The test fakes the GPU itself."""
  import jax_gmma
  from jax_gmma import _backend
  real = jax_gmma.ragged_dot

  def no_kernel(*a, **kw):
    if not _backend.reference_allowed():
      raise _backend.unavailable("ragged_dot", "no grouped GEMM kernel (simulated)")
    return real(*a, **kw)
  monkeypatch.setattr(jax_gmma, "ragged_dot", no_kernel)
  monkeypatch.setattr(_backend, "_global_allow", [False])
