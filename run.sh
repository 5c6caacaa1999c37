#!/usr/bin/env bash
# understudy's one entry point for set-up, build, demo, tests and benchmarks.
#
#   ./run.sh demo     set up, build, and run the demo (CPU, or CUDA when present)
#   ./run.sh test     set up, build, and run every test (C runner and pytest, each also
#                     against an ASan + UBSan build, the C runner under TSan and Valgrind, the HIP build):
#                     every stage runs whatever the others did, a summary (stage, passed,
#                     failed, skipped, seconds) closes the run, and it fails if any stage failed
#   ./run.sh test-gpu on a machine with a CUDA device: build with the CUDA backend and run the
#                     C runner there, every GPU test (pytest -m gpu) and short runs of the GPU
#                     benchmarks, with the same summary; installs nothing
#   ./run.sh bench    set up, build, and run the benchmarks
#   ./run.sh build    set up and build only
#   ./run.sh serve-deps
#                     install only what the serving test needs (transformers' serving
#                     extras, the openai client), from $BUILD_DIR/wheelhouse when it holds them
#   ./run.sh serve-wheels [PYTHON_VERSION]
#                     download those wheels into $BUILD_DIR/wheelhouse, for a machine
#                     without a registry (e.g. 3.12 for the GPU machine's image)
#   ./run.sh fuzz KIND [SECONDS]
#                     run a parser's libFuzzer harness (clang; KIND: config, problem,
#                     state, hardware, reload) and merge what adds coverage into its
#                     corpus tests/data/fuzz/KIND (tests/data/fuzz/README.md)
#
# Set-up installs what is missing: the distribution's cJSON, uthash and dlpack
# headers (apt, as root), CMake and ninja, torch==2.13.0 when the Python has no
# torch (an existing torch is kept: the library is built against it), and pytest
# and scikit-build-core (with its wheels in $BUILD_DIR/wheelhouse, for the pip
# packaging test);
# `test` also installs Chromium (the HTML report is rendered headless in a
# test), Prometheus (promtool, the server) and prometheus_client for the
# metrics tests, transformers with its serving extras (fastapi, uvicorn,
# openai: SERVE_PINS) for the serving and the tensor-parallel ranks tests,
# kernels and flashinfer-bench (SOURCE_PINS, without their CUDA dependencies)
# for the hub-layer and Solution tests, and
# hipcc and libamdhip64-dev to check that the GPU code builds as HIP
# (UST_SKIP_HIP=1 skips that step, e.g. on a machine without apt).
# A set-up that fails (apt, pip) or a main build that fails stops the run at
# once; after that each stage's output is also kept in $BUILD_DIR/test-logs/.
# PYTHON selects the interpreter (default python3); BUILD_DIR the build tree.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build}

log() { printf '\n== %s\n' "$*"; }

# transformers and the pieces `transformers serve` and its test need (for
# `test` and `serve-deps`): the GPU machine's image has transformers 5.17.0,
# not the others
SERVE_PINS=(transformers==5.17.0 fastapi==0.165.0 uvicorn==0.54.0 openai==3.57.0)

# the kernel sources the candidate tests read (`test`): HF kernels (hub layers)
# and FlashInfer-Bench (Definition and Solution models), each without its
# declared dependencies, which would pull a CUDA torch (flashinfer-python);
# what they import is installed beside them
SOURCE_PINS=(kernels==0.19.1 flashinfer-bench==0.1.2)
SOURCE_DEPS=(tomlkit==0.15.3 docstring-parser==0.18.0 "pydantic>=2.0.0" "pyyaml>=6" "huggingface-hub>=1.32.0"
             "safetensors>=0.5.0" "packaging>=20.0")

need_apt=()
[ -f /usr/include/cjson/cJSON.h ] || need_apt+=(libcjson-dev)
[ -f /usr/include/uthash.h ] || need_apt+=(uthash-dev)
[ -f /usr/include/dlpack/dlpack.h ] || need_apt+=(libdlpack-dev)
[ "${1:-}" != test ] || command -v valgrind >/dev/null || need_apt+=(valgrind)
[ "${1:-}" != test ] || command -v chromium >/dev/null || need_apt+=(chromium)

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
  if [ "${1:-}" = test ]; then
    { command -v promtool && command -v prometheus; } >/dev/null || install_prometheus
    "$PY" -c 'import prometheus_client' 2>/dev/null || "$PY" -m pip install -q prometheus_client
    install_serve # transformers (pinned) for the serving and the tensor-parallel ranks tests
    install_sources # kernels and flashinfer-bench (pinned) for the hub-layer and Solution tests
    # The packaging test builds the package with pip, without isolation and
    # without an index: the build backend must be installed, and its wheels
    # at hand for the isolated build it also tries.
    "$PY" -c 'import scikit_build_core' 2>/dev/null || "$PY" -m pip install -q "scikit-build-core>=0.10"
    if ! ls "$BUILD_DIR/wheelhouse"/scikit_build_core-*.whl >/dev/null 2>&1; then
      "$PY" -m pip download -q --only-binary=:all: -d "$BUILD_DIR/wheelhouse" "scikit-build-core>=0.10"
    fi
    UST_WHEELHOUSE=$(cd "$BUILD_DIR/wheelhouse" && pwd)
    export UST_WHEELHOUSE
    [ -n "${UST_SKIP_HIP:-}" ] || install_hip
  fi
}

install_serve() {
  # `transformers serve` under client traffic (tests/python/test_serve.py):
  # transformers with its serving extras and the openai client, pinned; torch
  # stays the installed one. With their wheels in $BUILD_DIR/wheelhouse
  # (`serve-wheels`), the extras come from there, without an index, and the
  # installed transformers is kept: a machine with no registry.
  if "$PY" - "${SERVE_PINS[@]}" 2>/dev/null <<'PYEOF'
import importlib.metadata as m, sys
if any(m.version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])):
    sys.exit(1)
from transformers.utils.import_utils import is_serve_available
import prometheus_client
sys.exit(0 if is_serve_available() else 1)
PYEOF
  then
    return 0
  fi
  if ls "$BUILD_DIR/wheelhouse"/fastapi-*.whl >/dev/null 2>&1; then
    log "installing ${SERVE_PINS[*]:1} from $BUILD_DIR/wheelhouse"
    "$PY" -m pip install -q --no-index --find-links "$BUILD_DIR/wheelhouse" "${SERVE_PINS[@]:1}" prometheus_client
  else
    log "installing transformers serving: ${SERVE_PINS[*]}"
    "$PY" -m pip install -q "transformers[serving]==${SERVE_PINS[0]#*==}" "${SERVE_PINS[@]:1}" prometheus_client
  fi
}

install_sources() {
  if "$PY" - "${SOURCE_PINS[@]}" 2>/dev/null <<'PYEOF'
import importlib.metadata as m, sys
sys.exit(1 if any(m.version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])) else 0)
PYEOF
  then
    return 0
  fi
  log "installing ${SOURCE_PINS[*]} (without their CUDA dependencies)"
  "$PY" -m pip install -q "${SOURCE_DEPS[@]}"
  "$PY" -m pip install -q --no-deps "${SOURCE_PINS[@]}"
}

serve_wheels() {
  # The serving extras' wheels and those of what they need, for CPython
  # VERSION (default: this one's) on x86-64 Linux, into $BUILD_DIR/wheelhouse,
  # for `serve-deps` on a machine that reaches no registry.
  local v=${1:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
  "$PY" -m pip download -q --only-binary=:all: --python-version "$v" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$BUILD_DIR/wheelhouse" "${SERVE_PINS[@]:1}" prometheus_client
  echo "run.sh: wheels for CPython $v in $BUILD_DIR/wheelhouse"
}

install_prometheus() {
  # promtool and the Prometheus server, which the metrics tests run (their own
  # servers, on loopback): the distribution's package without the node exporter
  # it recommends, and without starting its system service (a policy-rc.d that
  # says no, only for the install and only where none is in place).
  if [ "$(id -u)" != 0 ]; then
    echo "run.sh: promtool or prometheus missing and not root: apt-get install --no-install-recommends prometheus" >&2
    exit 1
  fi
  log "installing prometheus (promtool and the server, for the metrics tests)"
  local policy=/usr/sbin/policy-rc.d made= rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
      >/dev/null; } || rc=$?
  [ -z "$made" ] || rm -f "$policy"
  return "$rc"
}

# configure DIR [cmake options...]: once per build tree.
configure() {
  local dir=$1 args=("${@:2}")
  command -v ninja >/dev/null && args+=(-G Ninja)
  [ -n "${UST_DEPS_PREFIX:-}" ] && args+=("-DCMAKE_PREFIX_PATH=$UST_DEPS_PREFIX")
  [ -f "$dir/CMakeCache.txt" ] || cmake -S . -B "$dir" "${args[@]}" >/dev/null
}

build() {
  configure "$BUILD_DIR" -DUST_PYTHON="$(command -v "$PY")" -DUST_TEST_CANDIDATES=ON -DUST_GPU="${UST_GPU:-$( \
    [ "$cmd" = test ] && command -v nvcc >/dev/null && echo cuda || echo auto)}" # test: CUDA compiles wherever nvcc is
  cmake --build "$BUILD_DIR" -j"$(nproc)"
}

install_hip() {
  # The distribution's hipcc toolchain for the HIP build, and the CMake its
  # ROCm layout needs (>= 3.27, see CMakeLists.txt).
  if ! command -v hipcc >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
      echo "run.sh: hipcc missing and not root: apt-get install hipcc libamdhip64-dev (or UST_SKIP_HIP=1)" >&2
      exit 1
    fi
    log "installing hipcc libamdhip64-dev"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc libamdhip64-dev >/dev/null
  fi
  if ! "$PY" - <<'PYEOF'
import re, subprocess, sys
v = re.search(r"(\d+)\.(\d+)", subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout)
sys.exit(0 if v and (int(v[1]), int(v[2])) >= (3, 27) else 1)
PYEOF
  then
    "$PY" -m pip install -q "cmake>=3.27"
  fi
}

hip_build() {
  # The GPU code again as HIP (AMD), compiled by the distribution's hipcc
  # toolchain: it cannot run here, it must build. Its C tests run (host-only).
  configure "$BUILD_DIR-hip" -DUST_TORCH=OFF -DUST_GPU=hip
  cmake --build "$BUILD_DIR-hip" -j"$(nproc)" --target ust_test_runner
  "$BUILD_DIR-hip/ust_test_runner"
}

sanitized_c_tests() {
  # The C core again under AddressSanitizer + UBSan (no torch needed).
  configure "$BUILD_DIR-asan" -DUST_TORCH=OFF -DUST_SANITIZE=ON -DUST_GPU=none -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$BUILD_DIR-asan" -j"$(nproc)" --target ust_test_runner
  ASAN_OPTIONS=detect_leaks=1 "$BUILD_DIR-asan/ust_test_runner"
}

sanitized_python_tests() {
  # libunderstudy.so (the C core and the torch bridge) and the example
  # candidates built with ASan + UBSan, run by the Python tests in the
  # installed torch, which is not sanitized. The sanitizer runtime must be the
  # process's first library, hence LD_PRELOAD of the compiler's runtimes; the
  # tests' subprocesses inherit it and the library path, and each test checks
  # its subprocess's exit status. Leak checking is off: Python and torch keep
  # their allocations until exit. PYTHONMALLOC=malloc puts Python's small
  # objects (the ctypes structs the library writes into) on the sanitized heap.
  # The build has no GPU backend, so GPUs are hidden and the CUDA tests skip.
  # A report ends the process (exit status 1); --capture=sys leaves native
  # stderr uncaptured so that the report is printed, not lost with the process
  # (understudy's warnings from the tests' deliberate failures show as well).
  # The tests' own Python subprocesses keep the sanitizer but not
  # PYTHONMALLOC (tests/python/conftest.py says why).
  local dir="$BUILD_DIR-asan-py" cc runtime
  configure "$dir" -DUST_PYTHON="$(command -v "$PY")" -DUST_TORCH=ON -DUST_SANITIZE=ON -DUST_GPU=none \
    -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$dir" -j"$(nproc)"
  dir=$(cd "$dir" && pwd)
  cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$dir/CMakeCache.txt")
  runtime="$("$cc" -print-file-name=libasan.so) $("$cc" -print-file-name=libubsan.so)"
  LD_PRELOAD="$runtime${LD_PRELOAD:+ $LD_PRELOAD}" PYTHONMALLOC=malloc CUDA_VISIBLE_DEVICES= \
    ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    UNDERSTUDY_LIB="$dir/libunderstudy.so" UNDERSTUDY_CANDIDATES="$dir/candidates" \
    "$PY" -m pytest -q -rs --durations=25 --capture=sys tests/python "$@"
}

thread_sanitized_c_tests() {
  # The C core again under ThreadSanitizer: the threaded tests (the route
  # table, the control plane beside calls, snapshots) find no race.
  configure "$BUILD_DIR-tsan" -DUST_TORCH=OFF -DUST_GPU=none -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
  cmake --build "$BUILD_DIR-tsan" -j"$(nproc)" --target ust_test_runner
  TSAN_OPTIONS=halt_on_error=1 "$BUILD_DIR-tsan/ust_test_runner"
}

valgrind_c_tests() {
  # The plain C runner under Memcheck (it follows each test's forked
  # process): no invalid read or write, no use of an uninitialised value,
  # no memory definitely lost. Valgrind implements no seccomp: the
  # confinement test is told so (it is run by the other builds).
  UST_TEST_UNDER_VALGRIND=1 UST_TEST_TIMEOUT_S=600 valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite \
    "$BUILD_DIR/ust_test_runner"
}

# ---- stages ------------------------------------------------------------------
# `test` and `test-gpu` run their stages one after the other, each whatever
# the others did, and close with a table: per stage, the tests that passed,
# failed and were skipped (as its C runner or pytest counted them) and its
# seconds. The run fails at its end when a stage failed. Set-up and the main
# build are not stages: when they fail nothing can be tested, and the run
# stops at once, saying so.
STAGES=()   # "name|result|passed|failed|skipped|seconds", one per stage
LOG_DIR=    # each stage's output, kept for its counts and for reading later
RUN_START=$(date +%s)

stop_on_setup_failure() {
  set -E
  trap 'echo "run.sh: set-up or build failed (line $LINENO: $BASH_COMMAND): no test ran" >&2' ERR
}

setup_done() {
  trap - ERR
  set +E
  LOG_DIR="$BUILD_DIR/test-logs"
  rm -rf "$LOG_DIR"
  mkdir -p "$LOG_DIR"
  STAGES+=("set-up and build|ok|-|-|-|$(($(date +%s) - RUN_START))")
}

# stage NAME COMMAND [ARGS...]: runs COMMAND (a function of this file, or a
# program) in a subshell under set -e, its output shown and kept.
stage() {
  local name=$1 out rc t0
  shift
  log "$name"
  out="$LOG_DIR/$(printf '%02d' ${#STAGES[@]})-$(printf '%s' "$name" | tr -cs 'A-Za-z0-9' '-' | sed 's/-*$//').log"
  t0=$(date +%s)
  set +e
  ( set -e; "$@" ) 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  local counts
  counts=$(stage_counts "$out")
  STAGES+=("$name|$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")|$counts|$(($(date +%s) - t0))")
}

skip_stage() { STAGES+=("$1|skipped: $2|-|-|-|0"); }

# stage_beside NAME COMMAND [ARGS...] [--then NAME COMMAND [ARGS...]]...: stages
# run one after the other in the background, beside the stages that follow
# (the machine's cores are otherwise half idle: the test processes mostly
# run one thread and wait on their children); their output goes to their
# logs alone and is shown when stage_join collects them. Their rows keep
# their places in the table.
BESIDE=()   # "index|pid|log", one per stage running in the background
stage_beside() {
  local groups=() group=() arg
  for arg in "$@"; do
    if [ "$arg" = --then ]; then
      groups+=("$(printf '%q ' "${group[@]}")")
      group=()
    else
      group+=("$arg")
    fi
  done
  groups+=("$(printf '%q ' "${group[@]}")")
  local g name out index outs=()
  for g in "${groups[@]}"; do
    eval "set -- $g"
    name=$1 index=${#STAGES[@]}
    out="$LOG_DIR/$(printf '%02d' "$index")-$(printf '%s' "$name" | tr -cs 'A-Za-z0-9' '-' | sed 's/-*$//').log"
    log "$name: started beside the stages below (its output follows when it ends: $out)"
    STAGES+=("$name|running|-|-|-|0")
    outs+=("$index|$out")
  done
  (
    local k=0 t0
    for g in "${groups[@]}"; do
      eval "set -- $g"
      out=${outs[k]#*|}
      shift
      t0=$(date +%s)
      set +e
      ( set -e; "$@" ) >"$out" 2>&1 </dev/null
      echo "$? $(($(date +%s) - t0))" >"$out.status"
      k=$((k + 1))
    done
  ) &
  local pid=$!
  for g in "${outs[@]}"; do
    BESIDE+=("${g%%|*}|$pid|${g#*|}")
  done
}

# Waits for every stage started by stage_beside; shows each one's output and
# fills in its row.
stage_join() {
  local entry index pid out rc secs name
  for entry in "${BESIDE[@]}"; do
    IFS='|' read -r index pid out <<<"$entry"
    wait "$pid" || true
    name=${STAGES[$index]%%|*}
    log "$name (run beside the stages above)"
    cat "$out"
    read -r rc secs <"$out.status" 2>/dev/null || { rc=1; secs=0; }
    STAGES[index]="$name|$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")|$(stage_counts "$out")|$secs"
  done
  BESIDE=()
}

# "passed|failed|skipped" from a stage's output: the last closing line of a
# C runner (its "name: passed=N failed=N [skipped=N]" line; run.sh's checks
# print one too) and of pytest, added up; "-" where the output has none.
stage_counts() {
  "$PY" - "$1" <<'PYEOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
n, found = {"passed": 0, "failed": 0, "skipped": 0}, set()
runner = re.findall(r"^[\w.-]+: passed=(\d+) failed=(\d+)(?: skipped=(\d+))?", text, re.M)
if runner:
    p, f, s = runner[-1]
    n["passed"] += int(p); n["failed"] += int(f); n["skipped"] += int(s or 0)
    found |= {"passed", "failed"} | ({"skipped"} if s else set())
closing = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)\b.* in [\d.]+s\b", l)]
if closing:
    for k, v in ((m[2], int(m[1])) for m in re.finditer(r"(\d+) (passed|failed|skipped|errors?)\b", closing[-1])):
        k = "failed" if k.startswith("error") else k
        n[k] += v
    found |= {"passed", "failed", "skipped"}
print("|".join(str(n[k]) if k in found else "-" for k in ("passed", "failed", "skipped")))
PYEOF
}

# Prints the table; returns 1 when a stage failed.
summary() {
  local line name result p f s secs failed=()
  log "summary of ./run.sh $1 (each stage's output: $LOG_DIR/)"
  printf '%-58s %7s %7s %8s %8s  %s\n' stage passed failed skipped seconds result
  for line in "${STAGES[@]}"; do
    IFS='|' read -r name result p f s secs <<<"$line"
    printf '%-58s %7s %7s %8s %8s  %s\n' "$name" "$p" "$f" "$s" "$secs" "$result"
    case $result in ok | skipped*) ;; *) failed+=("$name") ;; esac
  done
  printf '%-58s %7s %7s %8s %8s\n' "total" "" "" "" "$(($(date +%s) - RUN_START))"
  if [ ${#failed[@]} -gt 0 ]; then
    printf '\nrun.sh: %d of %d stages failed:' "${#failed[@]}" "$((${#STAGES[@]} - 1))" >&2
    printf ' "%s"' "${failed[@]}" >&2
    printf '\n' >&2
    return 1
  fi
  printf '\nrun.sh: every stage passed\n'
}

run_tests() {
  stop_on_setup_failure
  setup test
  build
  local torch_version
  torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
  setup_done
  export UNDERSTUDY_TEST_SETUP=1 # the set-up installed what the tests need: a missing tool fails them
  stage "C tests" "$BUILD_DIR/ust_test_runner"
  # two streams of about the same length: the sanitized Python tests, then
  # Memcheck and the HIP build, beside the other C runs and the plain pytest
  local hip=(--then "HIP build (compile only) and its C tests" hip_build)
  [ -z "${UST_SKIP_HIP:-}" ] || hip=()
  stage_beside "Python tests, libunderstudy.so under ASan + UBSan" sanitized_python_tests "$@" \
    --then "C tests, Valgrind Memcheck" valgrind_c_tests "${hip[@]}"
  [ -z "${UST_SKIP_HIP:-}" ] || skip_stage "HIP build (compile only) and its C tests" "UST_SKIP_HIP is set"
  stage "C tests, ASan + UBSan" sanitized_c_tests
  stage "C tests, ThreadSanitizer" thread_sanitized_c_tests
  stage "Python tests (torch $torch_version)" "$PY" -m pytest -q -rs --durations=25 tests/python "$@"
  stage_join
  summary test
}

# ---- test-gpu ----------------------------------------------------------------
# On a machine with a CUDA device: the library built with the CUDA backend
# in $BUILD_DIR-cuda, its C runner (the ring, gate and comparison tests run on
# the device there), every Python test marked gpu (tests/python/conftest.py:
# the tests that need a CUDA device and skip without one) and short runs of
# the GPU benchmarks. Nothing is installed: a GPU machine may reach no
# registry. What is missing is named, and the run stops.
gpu_setup() {
  "$PY" - <<'PYEOF' || exit 1
import sys
try:
    import torch
except ImportError as e:
    sys.exit(f"run.sh: no GPU: test-gpu needs a CUDA device (and torch in {sys.executable}: {e})")
if not torch.cuda.is_available():
    sys.exit(f"run.sh: no GPU: test-gpu needs a CUDA device (torch {torch.__version__} sees none)")
PYEOF
  if ! command -v nvcc >/dev/null && [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    export CUDACXX=/usr/local/cuda/bin/nvcc
  fi
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ] || missing+=("nvcc (CUDA's compiler)")
  "$PY" -c 'import pytest' 2>/dev/null || missing+=("pytest (in $PY)")
  if [ ${#need_apt[@]} -gt 0 ] && [ -z "${UST_DEPS_PREFIX:-}" ]; then
    missing+=("the headers of ${need_apt[*]} (or UST_DEPS_PREFIX: a prefix with include/cjson/cJSON.h," \
      "include/uthash.h, include/dlpack/dlpack.h and libcjson)")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "run.sh: test-gpu installs nothing, and this machine lacks: ${missing[*]}" >&2
    exit 1
  fi
}

gpu_python_tests() {
  local dir
  dir=$(cd "$BUILD_DIR-cuda" && pwd)
  UNDERSTUDY_LIB="$dir/libunderstudy.so" UNDERSTUDY_CANDIDATES="$dir/candidates" \
    "$PY" -m pytest -q -rs -m gpu tests/python "$@"
}

# Short runs of the benchmarks that run on a GPU: each must run to its end
# (their own checks included: the comparison's element counts, the replays
# attributed, the verdicts given); the figures of such short runs are not
# figures to keep. Closes with a line the summary reads.
gpu_bench_checks() {
  local dir passed=0 failed=0 b
  dir=$(cd "$BUILD_DIR-cuda" && pwd)
  local -a runs=(
    "overhead.py --devices cuda --calls 2000 --rounds 3"
    "compare.py --mb 16 --rounds 3"
    "kernel_time.py --batch 1 --tokens 8"
    "graph_replay.py --steps 5"
    "graph_shadow.py --replays 100 --rounds 3 --batch-replays 50"
    "e2e_overhead.py --device cuda --models mistral --batch 1 --tokens 8 --rounds 2"
  )
  for b in "${runs[@]}"; do
    log "benchmarks/$b"
    # shellcheck disable=SC2086 # each entry is a command line
    if UNDERSTUDY_LIB="$dir/libunderstudy.so" PYTHONPATH=python-shim "$PY" benchmarks/$b; then
      echo "ok benchmarks/$b"
      passed=$((passed + 1))
    else
      echo "not ok benchmarks/$b (exit $?)"
      failed=$((failed + 1))
    fi
  done
  echo "benchmarks: passed=$passed failed=$failed"
  [ "$failed" = 0 ]
}

run_gpu_tests() {
  stop_on_setup_failure
  gpu_setup
  configure "$BUILD_DIR-cuda" -DUST_PYTHON="$(command -v "$PY")" -DUST_GPU=cuda
  cmake --build "$BUILD_DIR-cuda" -j"$(nproc)"
  setup_done
  stage "C tests (CUDA build, on the GPU)" "$BUILD_DIR-cuda/ust_test_runner"
  stage "Python GPU tests (pytest -m gpu)" gpu_python_tests "$@"
  stage "GPU benchmarks, short runs" gpu_bench_checks
  summary test-gpu
}

fuzz() {
  # libFuzzer needs clang and its runtime (Debian: clang libclang-rt-dev). The
  # harness is fed the corpus and the dictionary; new inputs go to a scratch
  # folder, crashes (inputs that break the parser's contract) to another, and
  # fuzzing goes on past them. Then -merge=1 copies into the corpus only the
  # inputs that reach code the corpus did not.
  local kind=${1:?usage: ./run.sh fuzz config|problem|state|hardware|reload [SECONDS]} secs=${2:-60}
  [ -d "tests/data/fuzz/$kind" ] || { echo "run.sh: no corpus tests/data/fuzz/$kind" >&2; exit 2; }
  if ! command -v clang >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
      echo "run.sh: clang missing and not root: apt-get install clang libclang-rt-dev" >&2
      exit 1
    fi
    log "installing clang libclang-rt-dev"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev >/dev/null
  fi
  local dir="$BUILD_DIR-fuzz"
  CC=clang CXX=clang++ configure "$dir" -DUST_TORCH=OFF -DUST_GPU=none -DUST_LIBFUZZER=ON -DCMAKE_BUILD_TYPE=Debug
  cmake --build "$dir" --target "ust_libfuzz_$kind"
  local work="$dir/work-$kind"
  mkdir -p "$work/new" "$work/crashes"
  # its exit status says whether it crashed: the crashes are listed below
  "$dir/ust_libfuzz_$kind" -fork="$(nproc)" -ignore_crashes=1 -max_total_time="$secs" \
    -dict=tests/fuzz/understudy.dict -artifact_prefix="$work/crashes/" "$work/new" "tests/data/fuzz/$kind" || true
  "$dir/ust_libfuzz_$kind" -merge=1 "tests/data/fuzz/$kind" "$work/new"
  if [ -n "$(ls -A "$work/crashes")" ]; then
    echo "run.sh: inputs that broke the $kind parser's contract are in $work/crashes/ (replay one with" \
      "$dir/ust_libfuzz_$kind FILE): add each to tests/data/fuzz/$kind, as bug-* until it is fixed" >&2
    exit 1
  fi
}

cmd=${1:-}
case "$cmd" in
  build) setup; build ;;
  demo) setup; build; log demo; PYTHONPATH=python-shim "$PY" -m understudy demo "${@:2}" ;;
  test) run_tests "${@:2}" ;;
  test-gpu) run_gpu_tests "${@:2}" ;;
  bench)
    setup; build
    log "dispatcher overhead"; PYTHONPATH=python-shim "$PY" benchmarks/overhead.py "${@:2}"
    log "comparison bandwidth"; PYTHONPATH=python-shim "$PY" benchmarks/compare.py
    ;;
  fuzz) fuzz "${@:2}" ;;
  serve-deps) install_serve ;;
  serve-wheels) serve_wheels "${@:2}" ;;
  *) echo "usage: ./run.sh demo|test|test-gpu|bench|build|fuzz|serve-deps|serve-wheels" >&2; exit 2 ;;
esac
