#!/bin/sh
# A GPU timeline of one infinicp-bench run: kernels, copies and memsets per
# stream (CUPTI activity records; bench/trace/cupti-trace.c), cut into
# forward / backward segments by bench/trace_sum.py.
#   sh bench/trace.sh LOGDIR [infinicp-bench arguments]
# Default arguments: p2p zigzag, CP = 4, S = 32k, causal, 2 repetitions.
# Environment: BUILD (default build-gpu), CUDA_HOME (default /usr/local/cuda).
set -eu
cd "$(dirname "$0")/.."
logs=${1:-bench-logs}
[ $# -gt 0 ] && shift
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
build=${BUILD:-build-gpu}
cuda=${CUDA_HOME:-/usr/local/cuda}
# CUPTI: CUPTI_HOME, the toolkit's, or the one a Python CUDA wheel installed
cupti=${CUPTI_HOME:-$cuda/extras/CUPTI}
if [ ! -f "$cupti/include/cupti.h" ] && [ ! -f "$cuda/include/cupti.h" ]; then
    # (pip wheels put it under site-packages/nvidia/.../include)
    h=$(find /usr /opt "$HOME" -name cupti.h -path "*include*" 2>/dev/null | head -1)
    [ -n "$h" ] && cupti=$(dirname "$(dirname "$h")")
fi
inc=$cupti/include
[ -f "$inc/cupti.h" ] || inc=$cuda/include
so=$(find "$cupti/" "$cuda/" -name 'libcupti.so*' 2>/dev/null | sort | head -1)
[ -f "$inc/cupti.h" ] && [ -n "$so" ] || { echo "trace.sh: no CUPTI found (set CUPTI_HOME)" >&2; exit 1; }
# the newest record structures the installed CUPTI declares
rec() { cat "$inc"/cupti_activity*.h | grep -o "CUpti_Activity$1[0-9]*" | sort -V | tail -1; }
cc -O2 -shared -fPIC -o "$logs/cupti-trace.so" bench/trace/cupti-trace.c -I"$inc" -I"$cuda/include" \
    -DKREC="$(rec Kernel)" -DMREC="$(rec Memcpy)" -DSREC="$(rec Memset)" "$so" -Wl,-rpath,"$(dirname "$so")"
[ $# -gt 0 ] || set -- --mode p2p --layout zigzag --cp 4 --seq 32768 --reps 2
export INFINICP_MODULE_PATH="$build/kernels/cuda"
INFINICP_TRACE_OUT="$logs/trace.csv" LD_PRELOAD="$logs/cupti-trace.so" \
    "$build/tools/infinicp-bench" --device cuda --dtype bf16 --heads 16 --kv-heads 16 --dim 128 --timing-only "$@"
python3 bench/trace_sum.py "$logs/trace.csv"
