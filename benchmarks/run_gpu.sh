#!/usr/bin/env bash
# One GPU session on the device machine. The kernel library is built on a CPU machine
#   cmake -S . -B build/cuda && cmake --build build/cuda -j2 --target jax_gmma_cuda
# and copied to prebuilt/ (carried with the call); here only the small extension is built.
# The sweep steps time the sweep-only kernels only when the library was configured with
# -DJAX_GMMA_SWEEP_KERNELS=1 (default off; without them benchmarks/sweep.py times the production configs).
#
# Usage: scripts/gpu_session.sh MODE
#   tests    all tests (GPU tests included); TESTS="tests/x.py -k 'expr'" replaces the selection; with wheels of
#            pytest-xdist/execnet in prebuilt/wheels they run in $WORKERS processes (the GPU tests
#            are dominated by XLA compiles on the host)
#   measure  SASS check, key GPU tests, large + decode + host benchmark suites
#   decode   SASS check, CUDA-graph test, decode chains (+ DECODE_CONFIGS rows), host cost
#   sweep    benchmarks/sweep.py: decode + large suites (SWEEP_*_ARGS add options), host cost
#   steps    tests, sass, sweep_decode, sweep_large, large (+ LARGE_ARGS), decode, host, bw_large, bw_decode,
#            bw_quant (block-scaled benchmark suites, BW_ARGS add options), wo_smoke, wo_decode, wo_prefill, wo_all (FP4
#            weight-only suites), diag (DIAG script, DIAG_ARGS), mxf8_configs (MXFP8 configs forced: MX_CONFIGS), minilm, llama (examples);
#            MODE may list several
#            separated by commas (e.g. tests,sweep_decode)
# Logs and results go to $OUT (at most 8 files come back from the device machine).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ORIG=$REPO  # the carried checkout (.minilm/, .whl/ for the MiniLM example live here)
OUT=${OUT:-/tmp/jax_gmma_out}
MODE=${1:-tests}
mkdir -p "$OUT"
# prebuilt/libjax_gmma_cuda.so.xz (the library xz-compressed: 16 MB -> 1 MB, which leaves the
# 64 MiB carry room for .minilm/): unpacked here when the .so itself was not carried.
if [ -f "$REPO/prebuilt/libjax_gmma_cuda.so.xz" ] && [ ! -f "$REPO/prebuilt/libjax_gmma_cuda.so" ]; then
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$REPO/prebuilt/libjax_gmma_cuda.so.xz" "$REPO/prebuilt/libjax_gmma_cuda.so"
fi
# prebuilt/src.tar: the source tree the prebuilt library was built from (so the extension and
# the Python side match the library even while the checkout moves on); used when present.
if [ -f "$REPO/prebuilt/src.tar" ]; then
  rm -rf /tmp/src && mkdir -p /tmp/src && tar -xf "$REPO/prebuilt/src.tar" -C /tmp/src \
    && mkdir -p /tmp/src/prebuilt && cp -r "$REPO"/prebuilt/*.so "$REPO"/prebuilt/wheels /tmp/src/prebuilt/ \
    && { [ ! -f "$REPO/prebuilt/mxf8_bench" ] || cp "$REPO/prebuilt/mxf8_bench" /tmp/src/prebuilt/; } \
    && REPO=/tmp/src
fi
export PYTHONUNBUFFERED=1
cd "$REPO"
JAX_GMMA_PREBUILT_CUDA_LIB="$REPO/prebuilt/libjax_gmma_cuda.so" \
  python3 -m pip install --no-build-isolation --no-deps --no-index -q . > /tmp/install.log 2>&1 \
  || { tail -40 /tmp/install.log; exit 1; }
(cd /tmp && python3 -m jax_gmma info) > "$OUT/info.txt"
XDIST=""
if ls prebuilt/wheels/*.whl > /dev/null 2>&1 && \
   python3 -m pip install --no-deps --no-index -q prebuilt/wheels/*.whl > /dev/null 2>&1; then
  XDIST="-n ${WORKERS:-8}"
fi
bench() {  # suite, timeout, extra args...
  local suite=$1 limit=$2; shift 2
  mkdir -p "$OUT/$suite"
  timeout "$limit" python3 -P benchmarks/bench_fp8.py --suite "$suite" --repeats 10 --out "$OUT/$suite" "$@"
}
step() {
  case "$1" in
    tests)
      eval "XLA_PYTHON_CLIENT_PREALLOCATE=false timeout ${T_TEST:-560} \
        python3 -P -m pytest -q -p no:cacheprovider $XDIST ${TESTS:-tests}" ;;
    sass) python3 -P tools/check_sass.py ;;
    sweep_decode)
      timeout ${T_SWEEP_DECODE:-200} python3 -P benchmarks/sweep.py --suite decode --out "$OUT/sweep" ${SWEEP_DECODE_ARGS:-} ;;
    sweep_large)
      timeout ${T_SWEEP_LARGE:-240} python3 -P benchmarks/sweep.py --suite large --out "$OUT/sweep" ${SWEEP_LARGE_ARGS:-} ;;
    large) bench large ${T_LARGE:-300} ${LARGE_ARGS:-} ;;
    decode) bench decode ${T_DECODE:-150} --no-plot --decode-configs "${DECODE_CONFIGS:-}" ${DECODE_ARGS:-} ;;
    host) bench host ${T_HOST:-60} --no-plot ;;
    minilm)  # examples/minilm.py on the GPU: needs .minilm/ (--export-half) and .whl/ carried
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$ORIG"/.whl/*.whl
      PYTHONPATH=/tmp/site timeout ${T_MINILM:-150} python3 -P examples/minilm.py --model-dir "$ORIG/.minilm" \
        --formats "${MINILM_FORMATS:-fp8_tensor,fp8_channel,fp8_128x128,emu:mxfp8,emu:nvfp4,wo:nvfp4,wo:mxfp4}" --json "$OUT/minilm.json" ;;
    llama)
      timeout ${T_LLAMA:-200} python3 -P examples/llama_decode.py --layers ${LLAMA_LAYERS:-32} \
        --gen-tokens ${LLAMA_TOKENS:-64} --repeats 2 --no-progress \
        --formats "${LLAMA_FORMATS:-bf16,xla_fp8,fp8_channel,fp8_128x128,wo:nvfp4,wo:mxfp4}" --json "$OUT/llama.json" ;;
    wo_smoke|wo_decode|wo_prefill|wo_all)  # benchmarks/bench_weightonly.py suites
      mkdir -p "$OUT/$1"
      timeout ${T_WO:-300} python3 -P benchmarks/bench_weightonly.py --suite "${1#wo_}" --out "$OUT/$1" ${WO_ARGS:-} ;;
    bw_large|bw_decode|bw_quant)  # benchmarks/bench_blockwise.py suites
      mkdir -p "$OUT/$1"
      timeout ${T_BW:-240} python3 -P benchmarks/bench_blockwise.py --suite "${1#bw_}" --out "$OUT/$1" ${BW_ARGS:-} ;;
    mxf8_configs)  # MXFP8 configs the heuristic does not pick (MX_CONFIGS, comma list) against today's picks:
      # kernel alone (tools/bench_mxf8_kernel.cu, carried as prebuilt/mxf8_bench: float64 checks of the
      # configs matching MXF8_CHECK_ONLY, then timings), then the decode chains with the configs forced
      if [ -x prebuilt/mxf8_bench ]; then
        MXF8_CHECK_ONLY=${MXF8_CHECK_ONLY:-swap} timeout 120 prebuilt/mxf8_bench 20 \
          && MXF8_SHAPES=${MXF8_SHAPES:-32x8192x8192,64x8192x8192,128x8192x8192,64x28672x8192,128x28672x8192} \
             MXF8_TIME_ONLY="${MXF8_TIME_ONLY:-swap_64x32|swap_64x64|swap_128x64|swap_64x128}" timeout 240 prebuilt/mxf8_bench 50 skip
      else
        echo "mxf8_configs: no prebuilt/mxf8_bench (build it as tools/bench_mxf8_kernel.cu says); kernel-alone step skipped"
      fi
      mkdir -p "$OUT/mxf8_configs"
      timeout ${T_BW:-300} python3 -P benchmarks/bench_blockwise.py --suite decode --out "$OUT/mxf8_configs" \
        --impls ours_mxfp8,ours_pertensor --decode-ms ${MXF8_MS:-1,16,32,64,128} --mx-configs "${MX_CONFIGS:-}" ;;
    diag)  # a tools/diag_*.py script (DIAG, default tools/diag_chain_slice.py) with DIAG_ARGS; its --out files tarred
      rm -rf /tmp/diag && mkdir -p /tmp/diag
      timeout ${T_DIAG:-400} python3 -P ${DIAG:-tools/diag_chain_slice.py} --out /tmp/diag ${DIAG_ARGS:-}
      tar -czf "$OUT/diag.tgz" -C /tmp diag ;;
    # composite modes
    sweep) step sweep_decode; step sweep_large; step host ;;
    measure) step sass; TESTS="${TESTS:-tests/test_gpu_fp8.py -k 'every_config or command_buffers or batch_dims or nan_inf or dot_on_gpu or no_silent'}" step tests
             step large; step decode; step host ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}
{
  # MODE: one step or a comma-separated list, e.g. tests,sweep_decode
  for s in ${MODE//,/ }; do
    echo "=== step $s ($(date -u +%H:%M:%S))"
    step "$s"
  done
} > "$OUT/run.log" 2>&1
grep -E "=== step|passed|failed|error|check_sass|TFLOP/s|TF/s|^M=|us/GEMM|us/call" "$OUT/run.log" | head -150
