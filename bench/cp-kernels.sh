#!/bin/sh
# Where the CP=4 time goes, kernel by kernel: Nsight Compute times every
# kernel of one warm-up + one repetition of a CP=4 run (S = 32k, bf16, 16
# heads of 128, causal; kernels serialised, ncu's base clocks) and
# bench/ncu_sum.py sums them by kernel and grid. The benchmark runs its
# single-rank reference first, in the same process: its attention kernels
# are the rows whose grid covers the whole sequence (x = 32768 / 128 = 256);
# the others are the CP=4 block calls of all ranks. If CP=4's kernel time
# over the single rank's is as large as the ratio bench/cp.sh measures, the
# overhead is in the kernels on the ring's shorter blocks, not in
# communication or synchronisation (docs/notes/gpu-testing-runs.md, run 13). Output in
# the folder given as $1 (default bench-logs): ncu-cp4.csv, kernels.txt.
# Environment: BUILD (default build-gpu), GPU_ARCHS (default 90), MODE
# (default p2p), LAYOUT (default zigzag).
set -eu
cd "$(dirname "$0")/.."
. bench/build.sh

build_targets infinicp-bench backend-cuda

export INFINICP_MODULE_PATH="$build/kernels/cuda"
bench="$build/tools/infinicp-bench --device cuda --dtype bf16 --heads 16 --kv-heads 16 --dim 128 --seq 32768"
ncu --csv --metrics gpu__time_duration.sum $bench --cp 4 --reps 1 --timing-only \
    --mode "${MODE:-p2p}" --layout "${LAYOUT:-zigzag}" >"$logs/ncu-cp4.csv" 2>"$logs/ncu-cp4.log"
python3 bench/ncu_sum.py "$logs/ncu-cp4.csv" | tee "$logs/kernels.txt"
