#!/usr/bin/env bash
cd "$(dirname "$0")"
for r in 1 2 3; do
  for fmt in nvfp4 mxfp4; do
    ./wo_bench_sa one $fmt 16 28672 8192 32 16 2 400
    ./wo_bench_sa one $fmt 16 28672 8192 16 16 2 400
    ./wo_bench_sb one $fmt 16 28672 8192 32 16 2 400 | sed 's/kw2/kw2 (2 groups x16)/'
    ./wo_bench_w24 one $fmt 16 28672 8192 16 16 2 400 | sed 's/$/ cap24/'
    ./wo_bench_w28 one $fmt 16 28672 8192 16 16 2 400 | sed 's/$/ cap28/'
    ./wo_bench_d2 one $fmt 16 28672 8192 16 16 2 400 | sed "s/$/ depth2/"
    ./wo_bench_sa one $fmt 16 8192 8192 16 16 2 400
  done
done
