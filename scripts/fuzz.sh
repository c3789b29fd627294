#!/bin/sh
# Fuzz libinfinicp's parsers for a bounded time under ASan+UBSan with clang's
# libFuzzer. Usage: sh scripts/fuzz.sh [seconds per target, default 60]
# Exits non-zero when a target finds a crash; the reproducer is left in
# build-fuzz/ (crash-*, leak-*, timeout-*).
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (apt-get install clang)"; exit 1; }
[ -d build-fuzz ] || CC=clang meson setup build-fuzz -Dfuzz=enabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link \
    -Dcuda=disabled -Dmpi=disabled -Ddocs=disabled
meson compile -C build-fuzz
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for seeds in tests/fuzz/corpus/*/; do
    name=$(basename "$seeds")
    work=build-fuzz/corpus-$name # libFuzzer adds what it finds to the first folder
    mkdir -p "$work"
    (cd build-fuzz && "./tests/fuzz/fuzz-$name" "../$work" "../$seeds" \
        -dict="../tests/fuzz/$name.dict" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1)
done
