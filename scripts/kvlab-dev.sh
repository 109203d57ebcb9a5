#!/usr/bin/env bash
# One entry point for the README's two commands on a fresh Debian 12 machine:
#   scripts/kvlab-dev.sh run   install what is missing, build Release, run `kvlab kvcalc` on the default presets
#   scripts/kvlab-dev.sh test  install what is missing, build Release and Debug+ASan/UBSan, run the whole test suite
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make libcli11-dev libfmt-dev libeigen3-dev doctest-dev nlohmann-json3-dev gnuplot-nox help2man
          clang libclang-rt-14-dev libomp-14-dev  # clang: the sanitizer build and its fuzz targets
          ccache                                  # a rebuild of the same code, in any clone, reuses its objects
          chromium imagemagick fonts-dejavu-core) # the browser test of kvlab report (tests/browser/report.cmake)

# ccache keys on paths relative to the source tree (another clone hits the same entries) and not on the
# build directory; it stores at most 5 GiB (ccache's default), under ~/.cache/ccache
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true

install_missing() {
    local missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "kvlab-dev: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

jobs=$(nproc 2>/dev/null || echo 2)

build() {  # build <preset>
    cmake --preset "$1" >/dev/null
    cmake --build --preset "$1" -j"$jobs"
}

case "${1:-}" in
run)
    install_missing
    cmake --preset release >/dev/null
    # what it runs, and what `cmake --install build/release` copies (kvlab builds every layer of the
    # library; kvlab_shell_files, the man page and completion); `test` builds everything
    cmake --build --preset release -j"$jobs" --target kvlab kvlab_shell_files
    ./build/release/kvlab kvcalc
    ;;
test)
    install_missing
    build release
    ctest --preset release -j"$jobs"
    build debug-asan
    ctest --preset debug-asan -j"$jobs"
    ;;
*)
    echo "usage: scripts/kvlab-dev.sh run|test" >&2
    exit 2
    ;;
esac
