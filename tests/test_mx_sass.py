"""SASS of the Blackwell block-scaled kernels (no GPU needed): every sm_100a GEMM kernel issues
tcgen05 block-scaled MMAs (UTC*MMA), every sm_120a one block-scaled warp MMAs (QMMA/OMMA .SF),
all load with TMA, and none fell back to plain tensor-core code. Looks at the object files named
by JAX_GMMA_MX_OBJECTS (a glob; CI compiles the TUs there) or else the installed library;
skips with a reason where cuobjdump is missing or no Blackwell arch was built."""
import functools
import glob
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import check_sass  # noqa: E402

# The sm_120a block-scaled warp MMAs, as cuobjdump 13.0 prints them in the ten sm_120a TUs
# (one kernel each), with the (A element, B element, scale factor) types that the kernel's
# (mangled) name must then contain. Shape 16832 = m16n8k32 (f8f6f4 kind), 16864 = m16n8k64
# (mxf4 / nvf4 kinds); .E8 = UE8M0 scales per 32, .UE4M3.4X = NVFP4's E4M3 scales per 16.
SM120_MMA = {
    "QMMA.SF.16832.F32.E4M3.E4M3.E8": ("float_e4m3_t", "float_e4m3_t", "float_ue8m0_t"),  # MXFP8
    "QMMA.SF.16832.F32.E2M3.E2M3.E8": ("float_e2m3_t", "float_e2m3_t", "float_ue8m0_t"),  # MXFP6 e2m3
    "QMMA.SF.16832.F32.E4M3.E2M1.E8": ("float_e4m3_t", "float_e2m1_t", "float_ue8m0_t"),  # MXFP8 x MXFP4
    "OMMA.SF.16864.F32.E2M1.E2M1.E8": ("float_e2m1_t", "float_e2m1_t", "float_ue8m0_t"),  # MXFP4
    "OMMA.SF.16864.F32.E2M1.E2M1.UE4M3.4X": ("float_e2m1_t", "float_e2m1_t", "float_ue4m3_t"),  # NVFP4
}
# The tcgen05 block-scaled MMAs of the sm_100a grouped kernels (cpp/sm100_mx_gemm_grouped_blockscaled.cu),
# as cuobjdump 13.0 prints them, with the (element, scale factor) types that the kernel's name
# must then contain: the f8f6f4 kind (MXFP8), the mxf4 kind (MXFP4), the nvf4 kind (NVFP4, E4M3
# scales per 16: .4X); the 2-SM kernels' MMAs span the CTA pair (.2CTA after the mnemonic).
SM100_GROUPED_MMA = {
    "UTCQMMA": ("float_e4m3_t", "float_ue8m0_t"),
    "UTCOMMA": ("float_e2m1_t", "float_ue8m0_t"),
    "UTCOMMA.4X": ("float_e2m1_t", "float_ue4m3_t"),
}
# Any tensor-core MMA mnemonic (HMMA, IMMA, QMMA, OMMA, HGMMA, UTC*MMA, ... with modifiers).
ANY_MMA = re.compile(r"\b([A-Z]*MMA(?:\.[0-9A-Z_]+)*)\s")
# A block-scaled warp MMA's operands: D, A, B, C, then the two scale-factor registers.
SM120_OPERANDS = re.compile(r"\b[OQ]MMA\.SF(?:\.[0-9A-Z_]+)*\s+([^;]*);")


def _inputs():
  pattern = os.environ.get("JAX_GMMA_MX_OBJECTS")
  if pattern:
    return sorted(glob.glob(pattern))
  try:
    import jax_gmma
  except ImportError:
    return []
  return glob.glob(os.path.join(os.path.dirname(jax_gmma.__file__), "libjax_gmma_cuda*.so"))[:1]


@functools.lru_cache(maxsize=None)
def _blackwell_kernels():
  """(input files, [(arch, name, block-scaled MMAs, SASS)]), or pytest.skip with the reason."""
  cuobjdump, nvdisasm = check_sass.find_tool("cuobjdump"), check_sass.find_tool("nvdisasm")
  if not cuobjdump or not nvdisasm:
    pytest.skip("cuobjdump / nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
  files = tuple(_inputs())
  if not files:
    pytest.skip("no kernel library installed and JAX_GMMA_MX_OBJECTS not set")
  env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
  sass = "".join(subprocess.run([cuobjdump, "--dump-sass", f], capture_output=True, text=True, env=env,
                                check=True).stdout for f in files)
  return files, check_sass.blackwell_kernels(sass)


def test_blackwell_kernels_use_block_scaled_mma():
  files, kernels = _blackwell_kernels()
  if not kernels:
    pytest.skip(f"no sm_100a / sm_120a kernels in {', '.join(files)} (built with the default "
                "JAX_GMMA_CUDA_ARCHS=90a?)")
  assert check_sass.check_blackwell(kernels) == []
  for arch, name, mmas, _ in kernels:
    assert mmas, (arch, name)


def test_sm120_kernels_use_block_scaled_warp_mma():
  files, kernels = _blackwell_kernels()
  sm120_objects = [f for f in files if os.path.basename(f).startswith("sm120_")]
  kernels = [k for k in kernels if k[0] == "sm_120a"]
  # sm_120a objects given: one kernel per TU, never a skip.
  assert len(kernels) >= len(sm120_objects), (files, len(kernels))
  if not kernels:
    pytest.skip(f"no sm_120a kernels in {', '.join(files)} (JAX_GMMA_CUDA_ARCHS without 120a?)")
  assert check_sass.check_blackwell(kernels) == []
  for _, name, _, text in kernels:
    body = text.split("\n", 1)[1]  # the SASS, without the kernel's name
    mmas = set(ANY_MMA.findall(body))
    # Only block-scaled MMAs of one known kind: no plain HMMA / QMMA / OMMA fallback (scales
    # applied outside the tensor cores) next to or instead of them.
    assert len(mmas) == 1 and mmas <= SM120_MMA.keys(), (name[:120], sorted(mmas))
    a, b, sf = SM120_MMA[mmas.pop()]
    assert a in name and b in name and sf in name, (name[:120], a, b, sf)
    for operands in SM120_OPERANDS.findall(body):
      assert len(operands.split(",")) >= 6, operands  # D, A, B, C, SFA, SFB


def test_sm100_grouped_kernels():
  """The grouped (mixture-of-experts) unit: CUTLASS ptr-array GEMMs, one block-scaled MMA kind
  each matching its formats, all three kinds present (MXFP8, NVFP4, MXFP4) in 1-SM and 2-SM
  form, and the setup / scale re-layout kernels that run before them without spills."""
  files, kernels = _blackwell_kernels()
  grouped_objects = [f for f in files if "grouped" in os.path.basename(f)]
  grouped = [k for k in kernels if check_sass.GROUPED_GEMM in k[1]]
  if not grouped_objects and not grouped:
    pytest.skip(f"no sm100 grouped kernels in {', '.join(files)}")
  assert len(grouped) >= 12, (files, len(grouped))  # 3 format pairs x 1-SM / 2-SM x 2 outputs
  assert check_sass.check_blackwell(grouped) == []
  kinds = set()
  for _, name, mmas, _ in grouped:
    assert len(mmas) == 1, (name[:120], sorted(mmas))
    mma = mmas.pop()
    kind = mma.replace(".2CTA", "")
    assert kind in SM100_GROUPED_MMA, (name[:120], mma)
    element, sf = SM100_GROUPED_MMA[kind]
    assert element in name and sf in name, (name[:120], mma)
    kinds.add((kind, ".2CTA" in mma))
  assert kinds == {(k, two) for k in SM100_GROUPED_MMA for two in (False, True)}
  cuobjdump = check_sass.find_tool("cuobjdump")
  env = dict(os.environ, PATH=os.path.dirname(check_sass.find_tool("nvdisasm")) + os.pathsep
             + os.environ.get("PATH", ""))
  sass = "".join(subprocess.run([cuobjdump, "--dump-sass", f], capture_output=True, text=True, env=env,
                                check=True).stdout for f in files)
  helpers = check_sass.grouped_helper_kernels(sass)
  assert len(helpers) >= 2 * 12, len(helpers)  # a setup and a re-layout kernel per GEMM
  assert check_sass.check_grouped_helpers(helpers) == []
