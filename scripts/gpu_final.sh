#!/usr/bin/env bash
# The measuring GPU session: install (prebuilt kernel library), SASS check, GPU tests of the
# configs and CUDA graphs, decode sweep, benchmark suites. Writes at most 8 files under $OUT.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/jax_gmma_out}
mkdir -p "$OUT/large" "$OUT/decode" /tmp/host
export PYTHONUNBUFFERED=1
cd "$REPO"
log="$OUT/run.log"
JAX_GMMA_PREBUILT_CUDA_LIB="$REPO/prebuilt/libjax_gmma_cuda.so" \
  python3 -m pip install --no-build-isolation --no-deps --no-index -q . > /tmp/install.log 2>&1 \
  || { tail -40 /tmp/install.log; exit 1; }
{
  cd /tmp && python3 -m jax_gmma info && cd "$REPO"
  python3 -P tools/check_sass.py
  timeout ${T_TEST:-120} python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_fp8.py \
    -k "${TESTS:-every_config or command_buffers or batch_dims or nan_inf or dot_on_gpu or no_silent}"
  timeout ${T_SWEEP:-150} python3 -P benchmarks/sweep.py --suite decode --repeats 5 --out "$OUT"
  timeout ${T_LARGE:-150} python3 -P benchmarks/bench_fp8.py --suite large --repeats 10 --out "$OUT/large"
  timeout ${T_DECODE:-130} python3 -P benchmarks/bench_fp8.py --suite decode --repeats 10 --no-plot --out "$OUT/decode"
  timeout ${T_HOST:-60} python3 -P benchmarks/bench_fp8.py --suite host --repeats 10 --no-plot --out /tmp/host \
    && cp /tmp/host/bench_fp8.json "$OUT/host_bench_fp8.json"
} > "$log" 2>&1
grep -E "passed|failed|check_sass|^M=|pick|ERROR" "$log" | head -60
tail -45 "$log"
