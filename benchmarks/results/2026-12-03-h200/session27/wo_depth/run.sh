#!/usr/bin/env bash
# FP4 decode kernel: ring depth 2 vs 4 (library) at the pick, 3 interleaved rounds
cd "$(dirname "$0")"
for r in 1 2 3; do
  for fmt in nvfp4 mxfp4; do
    for shp in "1 8192 8192" "4 8192 8192" "8 8192 8192" "16 8192 8192" "1 4096 14336" "16 4096 14336" "1 8192 28672" "1 28672 8192" "4 28672 8192" "1 14336 4096" "1 4096 4096"; do
      for b in wo_bench_a0 wo_bench_d2full; do
        printf "r%d %-16s " $r $b; ./$b one $fmt $shp 0 0 0 400
      done
    done
  done
done
