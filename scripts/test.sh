#!/bin/sh
# Build libinfinicp and run the whole test suite: the CMocka suites three
# times (a normal build with the CUDA module when nvcc is present, the same
# build under valgrind memcheck, an AddressSanitizer + UndefinedBehaviorSanitizer
# build), every libFuzzer target under ASan+UBSan (FUZZ_SECONDS each, default
# 60), and the Debian packages (build, lintian, install, autopkgtests, man
# pages, purge; scripts/packages.sh). Exits non-zero if anything failed; the
# fuzz and package steps write one PASS/FAIL/SKIP line per check into
# build-fuzz/results.txt and build-packages/results.txt.
#
# --quick: the normal build and its CMocka suites only (no valgrind,
# sanitizers, fuzzers or packages), for the edit-and-test loop.
set -u
cd "$(dirname "$0")/.." || exit 1
quick=0
case "${1:-}" in
"") ;;
--quick) quick=1 ;;
*) echo "usage: sh scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
sh scripts/deps.sh || exit 1
status=0

# What an earlier run left must not count as this run's (.ci/run counts
# these files): a step that stops before it writes its own leaves none.
rm -f build-fuzz/results.txt build-packages/results.txt build/pytest-results.xml \
    build/meson-logs/testlog*.json build-asan/meson-logs/testlog*.json

run_suite() { # build-dir, meson setup options...
    dir=$1
    shift
    # An existing build folder is configured again, so that the options
    # here (and changes to meson_options.txt) reach it.
    reconfigure=""
    [ -f "$dir/meson-private/coredata.dat" ] && reconfigure=--reconfigure
    echo "== $dir: meson setup $reconfigure $*"
    meson setup $reconfigure "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; return 1; }
    meson compile -C "$dir" || return 1
    meson test -C "$dir" --print-errorlogs --num-processes 2 || return 1
}

run_suite build || status=1
[ $quick = 1 ] && exit $status
# Zero leaks and no uninitialised reads (tests/valgrind.supp: third-party noise only).
# Not the GPU suites: the CUDA runtime itself is not clean under memcheck (it
# reports its own driver probing even with no GPU); GPU memory is checked with
# compute-sanitizer on a GPU machine instead (docs/GPU-TESTING.md).
echo "== build: meson test --setup valgrind"
meson test -C build --setup valgrind --no-suite gpu --no-suite python --print-errorlogs --num-processes 2 || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Ddocs=disabled \
    || status=1
echo "== fuzzers: ${FUZZ_SECONDS:-60} s each"
sh scripts/fuzz.sh "${FUZZ_SECONDS:-60}" || status=1
echo "== Debian packages"
sh scripts/packages.sh || status=1
exit $status
