#!/usr/bin/env bash
# Short GPU session: install, SASS check, CUDA-graph test, decode chains (with extra decode
# configs as tuning rows), host cost. Writes at most 8 files under $OUT.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/jax_gmma_out}
mkdir -p "$OUT/decode" "$OUT/host"
export PYTHONUNBUFFERED=1
cd "$REPO"
JAX_GMMA_PREBUILT_CUDA_LIB="$REPO/prebuilt/libjax_gmma_cuda.so" \
  python3 -m pip install --no-build-isolation --no-deps --no-index -q . > /tmp/install.log 2>&1 \
  || { tail -40 /tmp/install.log; exit 1; }
{
  python3 -P tools/check_sass.py
  timeout ${T_TEST:-45} python3 -P -m pytest -q -p no:cacheprovider tests/test_gpu_fp8.py \
    -k "${TESTS:-command_buffers or batch_dims}"
  timeout ${T_DECODE:-150} python3 -P benchmarks/bench_fp8.py --suite decode --repeats 10 --no-plot \
    --decode-configs "${DECODE_CONFIGS:-swap_64x16x128_pingpong_2lvl,swap_64x64x128_pingpong_2lvl,swap_128x32x128_coop_streamk_2lvl}" \
    --out "$OUT/decode"
  timeout ${T_HOST:-40} python3 -P benchmarks/bench_fp8.py --suite host --repeats 10 --no-plot --out "$OUT/host"
} > "$OUT/run.log" 2>&1
grep -E "passed|failed|check_sass|ours|xla_fp8 " "$OUT/run.log" | head -70
