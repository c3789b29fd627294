#!/bin/sh
# Install what building and testing libinfinicp needs on Debian 12, if missing.
# Run as root (or through sudo). Safe to run again: installs nothing when all is there.
# Arguments name further packages a step needs (scripts/packages.sh passes its own).
set -eu
# clang's libFuzzer and sanitizer runtimes are in libclang-rt-dev, which
# clang only recommends (scripts/fuzz.sh links against them).
pkgs="meson ninja-build gcc g++ pkg-config binutils libcmocka-dev mandoc valgrind
      libopenmpi-dev openmpi-bin libjansson-dev libopenblas-dev doxygen clang libclang-rt-dev
      python3 python3-numpy python3-pytest $*"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
