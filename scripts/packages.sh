#!/bin/sh
# The Debian packages, end to end: build them with dpkg-buildpackage from a
# copy of this tree, check them with lintian, install them with apt, build and
# run the autopkgtest consumers (debian/tests) against the INSTALLED library,
# check that every exported symbol has a man page and that pages render, then
# remove the packages again.
#
# Each check prints one line "PASS name", "FAIL name" or "SKIP name" and
# appends it to build-packages/results.txt (.ci/run counts them). Exits 1 if a
# check failed. Logs are kept in build-packages/.
#
# The package build runs with DEB_BUILD_OPTIONS=nocheck: CI runs the test
# suites before this step (scripts/test.sh). PACKAGES_RUN_TESTS=1 runs them in
# dh_auto_test as well. Run as root or with sudo: it installs and removes
# packages on this machine.
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
out=$root/build-packages
results=$out/results.txt

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
failed=0
start=$(date +%s)

result() { # PASS|FAIL|SKIP, name, detail...
    verdict=$1 name=$2
    shift 2
    echo "$verdict $name${*:+: $*}" | tee -a "$results"
    [ "$verdict" != FAIL ] || failed=1
}

elapsed() { echo "$(($(date +%s) - start)) s"; }

rm -rf "$out"
mkdir -p "$out/src"
: >"$results"
sh scripts/deps.sh dpkg-dev debhelper fakeroot lintian man-db dh-python || {
    result FAIL packages-deps "could not install the packaging tools"
    exit 1
}

# Build from a copy, so the tree (and the folder above it) stay clean: the
# tracked and untracked-but-not-ignored files, as in a fresh clone.
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$out/src"
else
    tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$out/src"
fi

# The source package too, before the build adds files to the tree: lintian
# checks debian/ itself through it.
(cd "$out" && dpkg-source -b src) >"$out/source.log" 2>&1 ||
    result FAIL package-source "see build-packages/source.log"

profiles=""
nvcc=$(command -v nvcc || ls "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" 2>/dev/null || true)
[ -n "$nvcc" ] || profiles=pkg.infinicp.nocuda
options="nocheck"
[ "${PACKAGES_RUN_TESTS:-0}" = 1 ] && options=""
options="$options parallel=$(nproc)"
echo "== dpkg-buildpackage -us -uc -b${profiles:+ -P$profiles} (DEB_BUILD_OPTIONS='$options')"
if (cd "$out/src" && DEB_BUILD_OPTIONS=$options dpkg-buildpackage -us -uc -b ${profiles:+-P$profiles}) \
    >"$out/build.log" 2>&1; then
    result PASS package-build "$(ls "$out"/*.deb | wc -l) packages in $(elapsed)"
else
    tail -n 60 "$out/build.log"
    result FAIL package-build "see build-packages/build.log"
    exit 1
fi
# The -dbgsym packages are built and linted, not installed.
debs=$(ls "$out"/*.deb | grep -v -- '-dbgsym_')
if [ -n "$nvcc" ]; then
    if ls "$out"/libinfinicp1-cuda_*.deb >/dev/null 2>&1; then
        result PASS package-cuda "built with $nvcc"
    else
        result FAIL package-cuda "nvcc is at $nvcc but no libinfinicp1-cuda package was built"
    fi
else
    result SKIP package-cuda "no nvcc on this machine"
fi

echo "== lintian"
# Errors and warnings fail. An override, if one is ever needed, goes in
# debian/<package>.lintian-overrides with a comment saying why (none so far).
if lintian --fail-on error,warning --display-info --pedantic "$out"/*.changes "$out"/*.dsc \
    >"$out/lintian.log" 2>&1; then
    result PASS lintian "$(grep -c '^[IP]:' "$out/lintian.log") info tags, no warnings or errors"
else
    cat "$out/lintian.log"
    result FAIL lintian "$(grep -c '^[EW]:' "$out/lintian.log") errors and warnings"
fi

# Minimal Debian images tell dpkg not to unpack man pages and documentation
# (/etc/dpkg/dpkg.cfg.d/excludes); let ours through while this step runs.
dpkg_include=/etc/dpkg/dpkg.cfg.d/zz-infinicp-packages-step
trap '$SUDO rm -f "$dpkg_include"' EXIT
if grep -Eqs '^path-exclude=/usr/share/(man|doc)' /etc/dpkg/dpkg.cfg.d/*; then
    echo "== dpkg excludes man pages or documentation here; including libinfinicp's"
    printf '%s\n' "path-include=/usr/share/man/man1/infinicp-bench.1*" \
        "path-include=/usr/share/man/man3/cp_*" "path-include=/usr/share/man/man7/infinicp*" \
        "path-include=/usr/share/doc/infinicp-doc/*" | $SUDO tee "$dpkg_include" >/dev/null
fi

pkgs=$(for d in $debs; do dpkg-deb -f "$d" Package; done)
remove() {
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -q $pkgs >>"$out/apt.log" 2>&1
}
echo "== apt-get install $(echo $pkgs)"
# shellcheck disable=SC2086
if DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $debs \
    >"$out/apt.log" 2>&1; then
    result PASS install "$(echo $pkgs)"
else
    tail -n 30 "$out/apt.log"
    result FAIL install "see build-packages/apt.log"
    remove
    exit 1
fi

# The autopkgtests (each Test-Command of debian/tests/control), against the
# installed packages.
sed -n 's/^Test-Command: *//p' debian/tests/control >"$out/tests.txt"
while read -r cmd; do
    t=${cmd##* }
    t=${t##*/} # a test that is a script of its own is named by its file
    echo "== $cmd"
    AUTOPKGTEST_TMP="" sh -c "$cmd" >"$out/$t.log" 2>&1 </dev/null
    rc=$?
    cat "$out/$t.log"
    case $rc in
    0) result PASS "$t" ;;
    77) result SKIP "$t" "$(sed -n 's/^.* skipped: //p' "$out/$t.log" | head -n 1)" ;;
    *) result FAIL "$t" "exit status $rc" ;;
    esac
done <"$out/tests.txt"

# Every symbol the installed library exports has a man page.
lib=$(realpath "/usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libinfinicp.so.1")
symbols=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ { sub(/@.*/, "", $3); print $3 }' | sort -u)
nsym=$(echo "$symbols" | grep -c .)
missing=""
for s in $symbols; do
    man -w 3 "$s" >/dev/null 2>&1 || missing="$missing $s"
done
if [ "$nsym" -eq 0 ]; then
    result FAIL man-pages "no exported functions found in $lib"
elif [ -z "$missing" ]; then
    result PASS man-pages "man -w finds a page for all $nsym exported functions"
else
    result FAIL man-pages "no page for:$missing"
fi

# Pages render without complaint, and say what they document:
# cp_attn_forward(3) once the library exports it.
render() { # section, page
    text=$(MANWIDTH=80 man --warnings -P cat "$1" "$2" 2>"$out/man-$2.err")
    if [ -n "$text" ] && [ ! -s "$out/man-$2.err" ] &&
        echo "$text" | grep -q "^SYNOPSIS" && echo "$text" | grep -q "$2"; then
        result PASS "man-render-$2" "$(echo "$text" | wc -l) lines"
    else
        cat "$out/man-$2.err"
        result FAIL "man-render-$2" "man $1 $2 did not render cleanly"
    fi
}
render 3 cp_context_create
render 1 infinicp-bench
render 7 infinicp
if echo "$symbols" | grep -qx cp_attn_forward; then
    render 3 cp_attn_forward
else
    result SKIP man-render-cp_attn_forward "the library does not export cp_attn_forward yet"
fi

# The shipped tool runs from the installed library.
want=$(dpkg-parsechangelog -l debian/changelog -S Version)
want=${want%-*}
got=$(env -u LD_LIBRARY_PATH /usr/bin/infinicp-bench --version 2>&1)
if [ "$got" = "$want" ]; then
    result PASS installed-bench "infinicp-bench --version = $got"
else
    result FAIL installed-bench "infinicp-bench --version printed '$got', package version $want"
fi
if echo "$pkgs" | grep -qx infinicp-doc; then
    if [ -s /usr/share/doc/infinicp-doc/html/infinicp_8h.html ]; then
        result PASS installed-doc "HTML reference in /usr/share/doc/infinicp-doc/html"
    else
        result FAIL installed-doc "/usr/share/doc/infinicp-doc/html/infinicp_8h.html missing"
    fi
fi

remove
if dpkg -S "$lib" >/dev/null 2>&1 || [ -e "$lib" ]; then
    result FAIL remove "$lib still installed after apt-get purge"
else
    result PASS remove "$(echo $pkgs)"
fi
echo "packages step: $(elapsed)"
exit $failed
