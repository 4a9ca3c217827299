#!/usr/bin/env bash
# Compiles Blackwell block-scaled translation units (sm_100a and sm_120a) to object files, one
# nvcc at a time, prints each one's wall time and peak memory (GNU time), then checks the
# objects' SASS (tools/check_sass.py: each kernel's arch's block-scaled MMAs -- UTC*MMA with
# scale-factor operands on sm_100a, QMMA/OMMA.SF on sm_120a -- TMA, no fallback, no spills;
# skipped without cuobjdump). No GPU needed. Used by CI (a subset, then tests/test_mx_sass.py on
# the objects) and to measure the build cost.
#   tools/compile_blackwell.sh OUTDIR [TU.cu ...]     (default: every sm100/sm120 TU)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/compile_blackwell.sh OUTDIR [TU.cu ...]}
shift
mkdir -p "$out"
tus=("$@")
if [ ${#tus[@]} -eq 0 ]; then tus=(cpp/sm100_mx_gemm_blockscaled_*.cu cpp/sm120_mx_gemm_blockscaled_*.cu); fi
cutlass=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
objs=()
for tu in "${tus[@]}"; do
  base=$(basename "$tu" .cu)
  case "$base" in
    sm100_*) gencode="-gencode=arch=compute_100a,code=sm_100a" ;;
    sm120_*) gencode="-gencode=arch=compute_120a,code=sm_120a" ;;
    *) echo "not a Blackwell TU: $tu" >&2; exit 2 ;;
  esac
  /usr/bin/time -f "$base: %e s wall, %M KB peak" -o "$out/$base.time" \
    nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC $gencode \
      -Icpp/include -I"$cutlass/include" -I"$cutlass/tools/util/include" -c "$tu" -o "$out/$base.o"
  cat "$out/$base.time"
  objs+=("$out/$base.o")
done
python3 tools/check_sass.py "${objs[@]}"
