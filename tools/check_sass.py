"""Checks that the installed kernel library holds Hopper tensor-core code: every kernel uses
QGMMA (fp8 wgmma; HGMMA for the grouped bf16 kernels, whose MMA atom is bf16 x bf16) and TMA
loads (UTMALDG), and no kernel spills to local memory in its main
loop beyond a small bound. Needs cuobjdump (+ nvdisasm): the CUDA toolkit's, or pip's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm. Exits 0 with a note when no library was built.
Blackwell block-scaled kernels (sm_100a / sm_120a ELF sections) must instead contain their
arch's block-scaled MMA instructions (BLACKWELL_MMA) and TMA loads, not a plain-MMA fallback."""
import glob
import os
import re
import shutil
import subprocess
import sys


#: the MMA atom of bf16 x bf16 wgmma in a CUTLASS kernel's (mangled) name
BF16_MMA = "F32BF16BF16"


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


# Block-scaled MMA instructions per Blackwell arch, as cuobjdump 13.0 prints them:
#  sm_100a: tcgen05.mma with block scaling, issued by one thread: UTCQMMA (seen for the
#           mxf8f6f4 kind) / UTCOMMA etc., whose block-scaled form carries the scale factors as
#           two more tensor-memory operands after the accumulator:
#             UTCQMMA gdesc[A], gdesc[B], tmem[D], tmem[SFA], idesc[..], tmem[SFB], ...
#           (a plain tcgen05.mma has only gdesc, gdesc, tmem[D], idesc);
#  sm_120a: warp-level block-scaled MMA: QMMA / OMMA with the .SF modifier.
BLACKWELL_MMA = {
    "sm_100a": re.compile(r"\b(UTC[A-Z]*MMA(?:\.[0-9A-Z_]+)*)\s+gdesc\[[^\]]*\],\s*gdesc\[[^\]]*\],"
                          r"\s*tmem\[[^\]]*\],\s*tmem\[[^\]]*\],\s*idesc\[[^\]]*\],\s*tmem\["),
    "sm_120a": re.compile(r"\b[OQ]MMA\.SF(?:\.[0-9A-Z_]+)*"),
}
# What a block-scaled kernel that fell back to plain tensor-core code would contain instead.
FALLBACK_MMA = re.compile(r"\b(HMMA|HGMMA|QGMMA|IMMA)\b")


def split_by_arch(sass):
  """[(arch, text)] chunks of a cuobjdump --dump-sass listing, one per ELF section."""
  parts = re.split(r"(?m)^\s*arch = (sm_\w+)\s*$", sass)
  out = [(None, parts[0])]
  out += [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
  return out


def blackwell_kernels(sass):
  """[(arch, kernel name, set of block-scaled MMA mnemonics, SASS text)] for the sm_100a /
  sm_120a GEMM kernels of a cuobjdump --dump-sass listing."""
  found = []
  for arch, chunk in split_by_arch(sass):
    if arch not in BLACKWELL_MMA:
      continue
    for f in re.split(r"\n\s*Function : ", chunk)[1:]:
      name = f.split("\n", 1)[0]
      if "GemmUniversal" in name:
        found.append((arch, name, set(BLACKWELL_MMA[arch].findall(f)), f))
  return found


# The grouped (mixture-of-experts) block-scaled kernels of cpp/sm100_mx_gemm_grouped_blockscaled.cu:
# CUTLASS's ptr-array GEMMs (GroupProblemShape in the name, checked as every Blackwell GEMM above)
# and the plain-CUDA setup / scale re-layout kernels that run before them (no spills).
GROUPED_GEMM = "GroupProblemShape"
GROUPED_HELPER = "sm100_grouped_mx"


def grouped_helper_kernels(sass):
  """[(kernel name, SASS text)] of the sm_100a grouped family's setup and re-layout kernels."""
  found = []
  for arch, chunk in split_by_arch(sass):
    if arch != "sm_100a":
      continue
    for f in re.split(r"\n\s*Function : ", chunk)[1:]:
      name = f.split("\n", 1)[0]
      if GROUPED_HELPER in name and "GemmUniversal" not in name:
        found.append((name, f))
  return found


def check_grouped_helpers(helpers):
  """Problems found in the grouped family's helper kernels (register spills)."""
  return [f"sm_100a {name[:80]}: local-memory stores (register spills)" for name, text in helpers
          if re.search(r"\bSTL\b", text)]


def check_blackwell(kernels):
  """Problems found in the Blackwell kernels (empty list: all good)."""
  bad = []
  for arch, name, mmas, text in kernels:
    short = name[:80]
    if not mmas:
      fb = sorted(set(FALLBACK_MMA.findall(text)))
      bad.append(f"{arch} {short}: no block-scaled MMA" + (f" (fallback: {', '.join(fb)})" if fb else ""))
    if "UTMALDG" not in text:
      bad.append(f"{arch} {short}: no TMA load (UTMALDG)")
    spills = len(re.findall(r"\bSTL\b", text))
    if spills > 32:
      bad.append(f"{arch} {short}: {spills} local-memory stores (register spills)")
  return bad


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
  # Blackwell block-scaled (MX / NVFP4) kernels: checked per arch (cuobjdump prints an
  # "arch = sm_XX" header before each ELF's functions), apart from the Hopper ones.
  bw = blackwell_kernels(sass)
  helpers = grouped_helper_kernels(sass)
  bw_bad = check_blackwell(bw) + check_grouped_helpers(helpers)
  sass = "".join(chunk for arch, chunk in split_by_arch(sass) if arch not in BLACKWELL_MMA)
  funcs = re.split(r"\n\s*Function : ", sass)[1:]
  # CUTLASS kernels (GemmUniversal) and jax-gmma's own wgmma mainloop (Hopper MXFP8).
  kernels = [f for f in funcs if any(k in f.split("\n", 1)[0] for k in ("GemmUniversal", "mxf8_gemm_kernel"))]
  bad = list(bw_bad)
  if bw:
    counts = ", ".join(f"{a}: {sum(1 for k in bw if k[0] == a)}" for a in sorted({k[0] for k in bw}))
    grouped = sum(GROUPED_GEMM in k[1] for k in bw)
    if grouped:
      counts += f"; {grouped} grouped, with {len(helpers)} setup / re-layout kernels"
    print(f"check_sass: {len(bw)} Blackwell block-scaled GEMM kernels ({counts})"
          + ("" if bw_bad else ", all with block-scaled MMA (" + ", ".join(sorted(
              {m for k in bw for m in k[2]})) + ") + UTMALDG"))
    if not kernels and not bw_bad:
      return 0
  n_bf16 = 0
  for f in kernels:
    name = f.split("\n", 1)[0][:80]
    mma = "HGMMA" if BF16_MMA in f.split("\n", 1)[0] else "QGMMA"
    n_bf16 += mma == "HGMMA"
    if mma not in f or "UTMALDG" not in f:
      bad.append(f"{name}: no {mma}/UTMALDG")
    spills = len(re.findall(r"\bSTL\b", f))
    if spills > 32:
      bad.append(f"{name}: {spills} local-memory stores (register spills)")
  # Block-scaled family (sm90 FP8 blockwise-scaling mainloop), counted apart.
  n_block = sum("BlockwiseFP8" in f.split("\n", 1)[0] for f in kernels)
  n_mx = sum("mxf8_gemm_kernel" in f.split("\n", 1)[0] for f in kernels)
  # The FP8 weight-streaming kernels (cpp/include/jax_gmma/fp8_stream.cuh: dense decode and
  # grouped; MXFP8, 1x128 x 128x128 / 1x128 and per-row scale policies; mma.sync, no TMA):
  # tensor-core MMAs, no spills.
  stream = [f for f in funcs if "fp8_stream" in f.split("\n", 1)[0] and "stream_kernel" in f.split("\n", 1)[0]]
  n_grouped = sum("grouped_stream_kernel" in f.split("\n", 1)[0] for f in stream)
  n_stream_mx = sum("MxScales" in f.split("\n", 1)[0] and "grouped_stream_kernel" not in f.split("\n", 1)[0]
                    for f in stream)
  for f in stream:
    name = f.split("\n", 1)[0][:80]
    if not re.search(r"\bHMMA\b", f):
      bad.append(f"{name}: no HMMA (mma.sync)")
    if re.search(r"\bSTL\b", f):
      bad.append(f"{name}: local-memory stores (register spills)")
  print(f"check_sass: {len(kernels)} GEMM kernels ({n_block} block-scaled 1x128, {n_mx} MXFP8, "
        f"{n_bf16} grouped bf16), all QGMMA (bf16: HGMMA) + UTMALDG; {len(stream)} FP8 streaming kernels ({n_stream_mx} MXFP8, "
        f"{len(stream) - n_stream_mx - n_grouped} block-scaled 1x128, {n_grouped} grouped), all HMMA"
        if not bad else "\n".join(bad))
  return 1 if bad or not kernels else 0


if __name__ == "__main__":
  sys.exit(main())
