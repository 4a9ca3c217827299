"""Checks the sanitizer driver's host decoder of the weight-only prepared layout
(tools/sanitize/host_ref.h, wo_decode) against jax_gmma.weightonly's own decoder, on the CPU.

The driver fills the prepared bytes with random codes and decodes them on the host for its
reference; if the layout in jax_gmma/ops/weightonly.py changes, this script fails here (no GPU
needed) instead of the driver reporting a kernel mismatch on the GPU.

Run: python3 tools/sanitize/check_host_ref.py   (needs g++, numpy and jax_gmma importable)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "host_ref.h"
int main(int argc, char** argv) {
  int f = std::atoi(argv[1]);
  const long n = std::atol(argv[2]);
  const long kp = std::atol(argv[3]);
  std::vector<uint8_t> packed(n / 16 * (kp / 64) * sanitize::wo_tile_bytes(f));
  std::vector<uint8_t> scales(n / 16 * (kp / 64) * sanitize::wo_scale_bytes(f));
  FILE* in = std::fopen(argv[4], "rb");
  if (std::fread(packed.data(), 1, packed.size(), in) != packed.size()) return 2;
  if (std::fread(scales.data(), 1, scales.size(), in) != scales.size()) return 2;
  std::fclose(in);
  std::vector<float> w;
  if (!sanitize::wo_decode(f, n, kp, packed.data(), scales.data(), w)) return 3;
  FILE* out = std::fopen(argv[5], "wb");
  std::fwrite(w.data(), 4, w.size(), out);
  std::fclose(out);
  return 0;
}
"""


def main() -> int:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from jax_gmma.ops import weightonly as wo

  fmts = ["nvfp4", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2"]
  rng = np.random.default_rng(0)
  failures = 0
  with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "harness.cc")
    exe = os.path.join(tmp, "harness")
    with open(src, "w") as fh:
      fh.write(HARNESS)
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", HERE, src, "-o", exe], check=True)
    for fi, fmt in enumerate(fmts):
      for n, kp in ((16, 64), (48, 192)):
        s_, ks = n // 16, kp // 64
        packed = rng.integers(0, 256, (s_, ks, wo._TILE_BYTES[fmt]), dtype=np.uint8)
        if fmt == "nvfp4":
          codes = rng.integers(136, 169, (s_, ks, 64), dtype=np.uint8)
        else:
          codes = rng.integers(120, 131, (s_, ks, 32), dtype=np.uint8)
        blob = os.path.join(tmp, "in.bin")
        outp = os.path.join(tmp, "out.bin")
        with open(blob, "wb") as fh:
          fh.write(packed.tobytes())
          fh.write(codes.tobytes())
        rc = subprocess.run([exe, str(fi), str(n), str(kp), blob, outp]).returncode
        if rc != 0:
          print(f"{fmt} N={n} Kp={kp}: harness failed (exit {rc})")
          failures += 1
          continue
        got = np.fromfile(outp, dtype=np.float32).reshape(n, kp)
        want = np.asarray(wo._dequant_impl(packed, codes, np.ones((1,), np.float32), fmt, n, kp))
        bad = int(np.sum(got != want))
        print(f"{fmt} N={n} Kp={kp}: {'ok' if bad == 0 else f'{bad} of {got.size} values differ'}")
        failures += bad != 0
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
