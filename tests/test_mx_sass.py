"""SASS of the Blackwell block-scaled kernels (no GPU needed): every sm_100a GEMM kernel issues
tcgen05 block-scaled MMAs (UTC*MMA), every sm_120a one block-scaled warp MMAs (QMMA/OMMA .SF),
all load with TMA, and none fell back to plain tensor-core code. Looks at the object files named
by JAX_GMMA_MX_OBJECTS (a glob; CI compiles the TUs there) or else the installed library;
skips with a reason where cuobjdump is missing or no Blackwell arch was built."""
import glob
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import check_sass  # noqa: E402


def _inputs():
  pattern = os.environ.get("JAX_GMMA_MX_OBJECTS")
  if pattern:
    return sorted(glob.glob(pattern))
  try:
    import jax_gmma
  except ImportError:
    return []
  return glob.glob(os.path.join(os.path.dirname(jax_gmma.__file__), "libjax_gmma_cuda*.so"))[:1]


def test_blackwell_kernels_use_block_scaled_mma():
  cuobjdump, nvdisasm = check_sass.find_tool("cuobjdump"), check_sass.find_tool("nvdisasm")
  if not cuobjdump or not nvdisasm:
    pytest.skip("cuobjdump / nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
  files = _inputs()
  if not files:
    pytest.skip("no kernel library installed and JAX_GMMA_MX_OBJECTS not set")
  env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
  sass = "".join(subprocess.run([cuobjdump, "--dump-sass", f], capture_output=True, text=True, env=env,
                                check=True).stdout for f in files)
  kernels = check_sass.blackwell_kernels(sass)
  if not kernels:
    pytest.skip(f"no sm_100a / sm_120a kernels in {', '.join(files)} (built with the default "
                "JAX_GMMA_CUDA_ARCHS=90a?)")
  assert check_sass.check_blackwell(kernels) == []
  for arch, name, mmas, _ in kernels:
    assert mmas, (arch, name)
