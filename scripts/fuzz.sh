#!/bin/sh
# Fuzz libinfinicp's parsers and argument checks for a bounded time under
# ASan+UBSan with clang's libFuzzer: every target in tests/fuzz, each from
# its seed corpus. Usage: sh scripts/fuzz.sh [seconds per target, default 60]
# Writes one line per target to build-fuzz/results.txt ("PASS name: ..." or
# "FAIL name: ...") and exits non-zero when a target found something; the
# reproducer is left in build-fuzz/ (crash-*, leak-*, timeout-*, oom-*).
set -u
cd "$(dirname "$0")/.."
seconds=${1:-60}
command -v clang >/dev/null || { echo "fuzz.sh: clang is needed (sh scripts/deps.sh installs it)"; exit 1; }
# An existing build folder is configured again, so that these options (and
# changes to meson_options.txt) reach it, as scripts/test.sh does.
reconfigure=""
[ -f build-fuzz/meson-private/coredata.dat ] && reconfigure=--reconfigure
CC=clang meson setup $reconfigure build-fuzz -Dfuzz=enabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link \
    -Dcuda=disabled -Dmpi=disabled -Ddocs=disabled >build-fuzz.setup.log 2>&1 ||
    { cat build-fuzz.setup.log; rm -rf build-fuzz; exit 1; }
# Only the fuzzers (and the library): the other tests are gcc's business.
targets=""
for seeds in tests/fuzz/corpus/*/; do
    targets="$targets fuzz-$(basename "$seeds")"
done
# shellcheck disable=SC2086
meson compile -C build-fuzz $targets || exit 1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
results=build-fuzz/results.txt
: >"$results"
status=0
for seeds in tests/fuzz/corpus/*/; do
    name=$(basename "$seeds")
    work=build-fuzz/corpus-$name # libFuzzer adds what it finds to the first folder
    mkdir -p "$work"
    dict=""
    [ -f "tests/fuzz/$name.dict" ] && dict="-dict=../tests/fuzz/$name.dict"
    log=build-fuzz/fuzz-$name.log
    echo "== fuzz-$name for $seconds s"
    # shellcheck disable=SC2086
    (cd build-fuzz && "./tests/fuzz/fuzz-$name" "../$work" "../$seeds" $dict \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1) \
        >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ $rc = 0 ]; then
        echo "PASS fuzz-$name: ${runs:-?} inputs in $seconds s" | tee -a "$results"
    else
        tail -40 "$log"
        echo "FAIL fuzz-$name: exit status $rc after ${runs:-?} inputs (see $log)" | tee -a "$results"
        status=1
    fi
done
exit $status
