#!/usr/bin/env bash
# ablation of the FP4/FP6 decode kernel, kernel alone: 3 interleaved rounds
cd "$(dirname "$0")"
for r in 1 2 3; do
  for fmt in nvfp4 mxfp6_e2m3; do
    for shp in "16 28672 8192" "1 28672 8192" "16 8192 8192"; do
      for v in 0 1 2; do
        printf "r%d a%d " $r $v; ./wo_bench_a$v one $fmt $shp 0 0 0 400
      done
    done
  done
done
