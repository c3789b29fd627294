#!/bin/sh
# Kernel throughput of libinfinicp's CUDA attention against PyTorch SDPA's
# flash and cuDNN backends, on the same GPU, shapes and kind of data (random
# bf16 in [-1, 1]). Builds the library with the CUDA module (unless $BUILD
# already holds a build), runs tests/bench-gpu --csv and sdpa_baseline.py,
# and prints one table (bench/table.py). Results go to the folder given as
# $1 (default bench-logs): results.csv, table.md, tflops.png.
# Environment: BUILD (default build-gpu), GPU_ARCHS (default 90), REPS (default 5).
set -eu
cd "$(dirname "$0")/.."
. bench/build.sh

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())'
} | tee "$logs/versions.txt"

build_targets infinicp-bench bench-gpu backend-cuda

INFINICP_MODULE_PATH="$build/kernels/cuda" "$build/tests/bench-gpu" --csv "$reps" >"$logs/results.csv"
python3 bench/sdpa_baseline.py "$reps" >>"$logs/results.csv"
python3 bench/table.py "$logs/results.csv" "$logs/tflops.png" | tee "$logs/table.md"
