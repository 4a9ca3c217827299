"""Checks that the installed kernel library holds Hopper tensor-core code: every kernel uses
QGMMA (fp8 wgmma) and TMA loads (UTMALDG), and no kernel spills to local memory in its main
loop beyond a small bound. Needs cuobjdump (+ nvdisasm): the CUDA toolkit's, or pip's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm. Exits 0 with a note when no library was built."""
import glob
import os
import re
import shutil
import subprocess
import sys


def find_tool(name):
  path = shutil.which(name)
  if path:
    return path
  try:
    import nvidia
    for base in nvidia.__path__:
      hits = glob.glob(os.path.join(base, "*", "bin", name))
      if hits:
        return hits[0]
  except ImportError:
    pass
  return None


def main():
  # Paths on the command line (a library or object files, e.g. one compiled translation unit)
  # are checked instead of the installed library.
  libs = sys.argv[1:]
  if not libs:
    import jax_gmma
    libs = glob.glob(os.path.join(os.path.dirname(jax_gmma.__file__), "libjax_gmma_cuda*.so"))
  if not libs:
    print("check_sass: no CUDA kernel library installed; nothing to check")
    return 0
  cuobjdump = find_tool("cuobjdump")
  nvdisasm = find_tool("nvdisasm")
  if not cuobjdump or not nvdisasm:
    print("check_sass: cuobjdump/nvdisasm not found; skipped")
    return 0
  env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
  sass = "".join(subprocess.run([cuobjdump, "--dump-sass", lib], capture_output=True, text=True, env=env,
                                check=True).stdout for lib in (libs if sys.argv[1:] else libs[:1]))
  funcs = re.split(r"\n\s*Function : ", sass)[1:]
  kernels = [f for f in funcs if "GemmUniversal" in f.split("\n", 1)[0]]
  bad = []
  for f in kernels:
    name = f.split("\n", 1)[0][:80]
    if "QGMMA" not in f or "UTMALDG" not in f:
      bad.append(f"{name}: no QGMMA/UTMALDG")
    spills = len(re.findall(r"\bSTL\b", f))
    if spills > 32:
      bad.append(f"{name}: {spills} local-memory stores (register spills)")
  # Block-scaled family (sm90 FP8 blockwise-scaling mainloop), counted apart.
  n_block = sum("BlockwiseFP8" in f.split("\n", 1)[0] for f in kernels)
  print(f"check_sass: {len(kernels)} GEMM kernels ({n_block} block-scaled), all QGMMA + UTMALDG"
        if not bad else "\n".join(bad))
  return 1 if bad or not kernels else 0


if __name__ == "__main__":
  sys.exit(main())
