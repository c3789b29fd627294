#!/bin/sh
# CP on one GPU (local transport, every rank a thread on device 0):
#  1. peak device memory per rank of p2p zigzag at S = 128k, CP = 8, against
#     the analytical minimum (inputs + outputs + double buffers);
#  2. CP=4 against CP=1 at S = 32k tokens (a stream of its own per rank), every mode and layout, causal and
#     no mask (issue target: p2p zigzag and a2a within 1.10x of CP=1);
#  3. the target's modes in separate processes, ROUNDS (default 3) times each, with the median ratio.
# Builds like bench/bench.sh; output goes to the folder given as $1 (default
# bench-logs): cp4.txt, memory.txt, rounds.txt.
# Environment: BUILD (default build-gpu), GPU_ARCHS (default 90), REPS (default 5), ROUNDS (default 3).
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
# 3. The issue's modes again, each in a process of its own, ROUNDS times (the
#    device's speed drifts by a few per cent between runs a second apart, as
#    much as the distance to the target): every round's step ratio, then
#    their median.
: >"$logs/rounds.txt"
for ml in "p2p zigzag" "a2a zigzag" "a2a contiguous"; do
    set -- $ml
    i=0
    while [ "$i" -lt "${ROUNDS:-3}" ]; do
        $bench --cp 4 --seq 32768 --reps "$reps" --timing-only --mode "$1" --layout "$2" |
            awk -v m="$1" -v l="$2" '$1 == m && $2 == l { print m, l, $12 }' >>"$logs/rounds.txt"
        i=$((i + 1))
    done
done
echo "causal, CP=4 step / CP=1 step, one process a round:"
awk '{ k = $1 " " $2; v[k] = v[k] " " $3; n[k]++; x[k, n[k]] = $3 }
     END { for (k in n) { m = n[k]; for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
                              if (x[k, j] < x[k, i]) { t = x[k, i]; x[k, i] = x[k, j]; x[k, j] = t }
                          med = m % 2 ? x[k, (m + 1) / 2] : (x[k, m / 2] + x[k, m / 2 + 1]) / 2
                          printf "%-16s rounds%s  median %.3f\n", k, v[k], med } }' "$logs/rounds.txt" |
    sort | tee -a "$logs/cp4.txt"
