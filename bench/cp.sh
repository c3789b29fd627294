#!/bin/sh
# CP on one GPU (local transport, every rank a thread on device 0):
#  1. peak device memory per rank of p2p zigzag at S = 128k, CP = 8, against
#     the analytical minimum (inputs + outputs + double buffers);
#  2. CP=4 against CP=1 at S = 32k tokens (a stream of its own per rank), every mode and layout, causal and
#     no mask (issue target: p2p zigzag and a2a within 1.10x of CP=1).
# Builds like bench/bench.sh; output goes to the folder given as $1 (default
# bench-logs): cp4.txt, memory.txt.
# Environment: BUILD (default build-gpu), GPU_ARCHS (default 90), REPS (default 5).
set -eu
cd "$(dirname "$0")/.."
. bench/build.sh

build_targets infinicp-bench backend-cuda

export INFINICP_MODULE_PATH="$build/kernels/cuda"
bench="$build/tools/infinicp-bench --device cuda --dtype bf16 --heads 16 --kv-heads 16 --dim 128"
$bench --cp 8 --seq 131072 --reps 2 --memory --mode p2p --layout zigzag | tee "$logs/memory.txt"
: >"$logs/cp4.txt"
for mask in "" --no-mask; do
    $bench --cp 4 --seq 32768 --reps "$reps" --timing-only $mask | tee -a "$logs/cp4.txt"
done
