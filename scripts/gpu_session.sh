#!/usr/bin/env bash
# One GPU session: install with a prebuilt kernel library (built on a CPU machine with
#   cmake -S . -B build/cuda && cmake --build build/cuda -j2 --target jax_gmma_cuda
# and copied to prebuilt/), print `info`, run the GPU tests and the benchmark.
# Usage: scripts/gpu_session.sh [pytest -k expr] [bench suite]
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/jax_gmma_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$REPO"
t0=$(date +%s)
JAX_GMMA_PREBUILT_CUDA_LIB="$REPO/prebuilt/libjax_gmma_cuda.so" \
  python3 -m pip install --no-build-isolation --no-deps --no-index -q . > "$OUT/install.log" 2>&1 \
  || { tail -40 "$OUT/install.log"; exit 1; }
echo "install: $(( $(date +%s) - t0 )) s"
cd /tmp && python3 -m jax_gmma info | tee "$OUT/info.txt"
cd "$REPO"
if [ "${1:-}" != "none" ]; then
  python3 -P -m pytest -q -p no:cacheprovider tests ${1:+-k "$1"} 2>&1 | tee "$OUT/pytest.log" | tail -30
fi
if [ -n "${2:-}" ]; then
  python3 -P benchmarks/bench_fp8.py --suite "$2" --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
