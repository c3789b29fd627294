#!/bin/sh
# Build libinfinicp and run the demo: CP attention across in-process ranks on the CPU.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
[ -d build ] || meson setup build >/dev/null
meson compile -C build >/dev/null
exec ./build/tools/infinicp-bench "$@"
