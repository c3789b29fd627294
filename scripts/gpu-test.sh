#!/bin/sh
# Build libinfinicp with the CUDA module and, on a machine with an NVIDIA GPU,
# run the GPU suites, compute-sanitizer (memcheck, racecheck, synccheck) on a subset, and
# the kernel benchmark. Logs go to the folder given as $1 (default gpu-logs).
# Environment: GPU_ARCHS (default 90), BUILD (default build-gpu),
# SANITIZE_CASES (attention cases the sanitizers run, default gqa).
set -u
cd "$(dirname "$0")/.."
logs=${1:-gpu-logs}
build=${BUILD:-build-gpu}
mkdir -p "$logs"
status=0

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nvcc --version | tail -2; } \
    | tee "$logs/device.txt"

if [ ! -d "$build" ]; then
    meson setup "$build" -Dgpu_archs="${GPU_ARCHS:-90}" -Dmpi=disabled -Ddocs=disabled >"$logs/build.log" 2>&1 \
        || { tail -40 "$logs/build.log"; exit 1; }
fi
start=$(date +%s)
meson compile -C "$build" >>"$logs/build.log" 2>&1 || { grep -E "error|FAILED" "$logs/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - start)) s"

meson test -C "$build" --suite gpu --suite unit --print-errorlogs --timeout-multiplier 3 >"$logs/test.log" 2>&1 || status=1
cp "$build/meson-logs/testlog.txt" "$logs/testlog.txt"
grep -E "^ *[0-9]+/[0-9]+ " "$logs/test.log"
# the per-case error table of the attention suite
grep -E "^[a-z0-9-]+ +(f32|f16|bf16) " "$logs/testlog.txt" | sort -u >"$logs/errors.txt"
grep -c . "$logs/errors.txt"
grep "FAIL" "$logs/errors.txt" | head -20

mod="$build/kernels/cuda"
INFINICP_MODULE_PATH=$mod timeout 300 "$build/tests/bench-gpu" 5 2>&1 | tee "$logs/bench.txt" || status=1

# time of each fused kernel (forward, dK/dV, dQ) for the first bench shapes
if command -v ncu >/dev/null 2>&1; then
    INFINICP_MODULE_PATH=$mod timeout 200 ncu --clock-control none -k regex:mma_kernel -c 12 \
        --metrics gpu__time_duration.sum "$build/tests/bench-gpu" 1 2>&1 \
        | grep -E "mma_kernel|gpu__time_duration" | sed -E 's/\(attn_params\).*//' | tee -a "$logs/bench.txt"
fi

for tool in memcheck racecheck synccheck; do
    INFINICP_MODULE_PATH=$mod INFINICP_GPU_TEST_CASES=${SANITIZE_CASES:-gqa} timeout 300 \
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$build/tests/test-gpu-kernels" >"$logs/$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: exit $rc"
    tail -4 "$logs/$tool.log"
    [ $rc -eq 0 ] || status=1
done
exit $status
