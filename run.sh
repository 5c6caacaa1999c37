#!/usr/bin/env bash
# understudy's one entry point for set-up, build, demo, tests and benchmarks.
#
#   ./run.sh demo     set up, build, and run the demo (CPU, or CUDA when present)
#   ./run.sh test     set up, build, and run every test (C runner, sanitizer build, pytest)
#   ./run.sh bench    set up, build, and run the benchmarks
#   ./run.sh build    set up and build only
#
# Set-up installs what is missing: the distribution's cJSON, uthash and dlpack
# headers (apt, as root), CMake and ninja, torch==2.13.0 when the Python has no
# torch (an existing torch is kept: the library is built against it), and pytest.
# PYTHON selects the interpreter (default python3); BUILD_DIR the build tree.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build}

log() { printf '\n== %s\n' "$*"; }

need_apt=()
[ -f /usr/include/cjson/cJSON.h ] || need_apt+=(libcjson-dev)
[ -f /usr/include/uthash.h ] || need_apt+=(uthash-dev)
[ -f /usr/include/dlpack/dlpack.h ] || need_apt+=(libdlpack-dev)

setup() {
  if [ ${#need_apt[@]} -gt 0 ] && [ -z "${UST_DEPS_PREFIX:-}" ]; then
    log "installing ${need_apt[*]}"
    if [ "$(id -u)" != 0 ]; then
      echo "run.sh: ${need_apt[*]} missing and not root: install them with apt-get" >&2
      exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    log "installing torch==2.13.0"
    "$PY" -m pip install -q torch==2.13.0
  fi
  command -v cmake >/dev/null || "$PY" -m pip install -q cmake
  command -v ninja >/dev/null || "$PY" -m pip install -q ninja || true
  if [ "${1:-}" = test ] && ! "$PY" -c 'import pytest' 2>/dev/null; then
    "$PY" -m pip install -q pytest
  fi
}

# configure DIR [cmake options...]: once per build tree.
configure() {
  local dir=$1 args=("${@:2}")
  command -v ninja >/dev/null && args+=(-G Ninja)
  [ -n "${UST_DEPS_PREFIX:-}" ] && args+=("-DCMAKE_PREFIX_PATH=$UST_DEPS_PREFIX")
  [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" "${args[@]}" >/dev/null
}

build() {
  configure "$BUILD_DIR" -DUST_PYTHON="$(command -v "$PY")" -DUST_GPU="${UST_GPU:-auto}"
  cmake --build "$BUILD_DIR" -j"$(nproc)"
}

sanitized_c_tests() {
  # The C core again under AddressSanitizer + UBSan (no torch needed).
  configure "$BUILD_DIR-asan" -DUST_TORCH=OFF -DUST_SANITIZE=ON -DUST_GPU=none -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$BUILD_DIR-asan" -j"$(nproc)" --target ust_test_runner
  ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan/ust_test_runner"
}

cmd=${1:-}
case "$cmd" in
  build) setup; build ;;
  demo) setup; build; log demo; PYTHONPATH=python-shim "$PY" -m understudy demo "${@:2}" ;;
  test)
    setup test; build
    log "C tests"; "$BUILD_DIR/ust_test_runner"
    log "C tests, ASan + UBSan"; sanitized_c_tests
    log "Python tests (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m pytest -q tests/python "${@:2}"
    ;;
  bench)
    setup; build
    log "dispatcher overhead"; PYTHONPATH=python-shim "$PY" benchmarks/overhead.py "${@:2}"
    log "comparison bandwidth"; PYTHONPATH=python-shim "$PY" benchmarks/compare.py
    ;;
  *) echo "usage: ./run.sh demo|test|bench|build" >&2; exit 2 ;;
esac
