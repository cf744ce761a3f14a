#!/usr/bin/env bash
# Sanitizers and fuzzing (issue 10). Exits non-zero on any crash, sanitizer report, hang or
# failed unit test. Four stages:
#   1. the cc/core unit tests (cc/tests/core_test.cc) built with -fsanitize=address,undefined;
#   2. every libFuzzer target in fuzz/ (clang, -fsanitize=fuzzer,address,undefined) for
#      FUZZ_SECONDS each, starting from the committed seed corpus fuzz/corpus/<target>;
#   3. the op-level fuzzer (fuzz/op_fuzzer.py) through TensorFlow for OP_FUZZ_SECONDS, each case
#      in a child process with a timeout (needs the op library: bash scripts/setup.sh);
#   4. the delta reader (fuzz/delta_fuzzer.py) for DELTA_FUZZ_SECONDS: damaged deltas applied to an
#      embedding and to a serving model fail cleanly and change nothing.
#
# Every compile, and every run of stages 1-2, is a job of its own; FUZZ_JOBS of them (default: the
# number of cores) run at once, the longest builds first (the unit tests and the fused update's
# harness, which instantiate every optimizer, row type and instruction set).
#
# Usage: bash scripts/sanitize_and_fuzz.sh            # CI: about 1-2 minutes of fuzzing
#        bash scripts/sanitize_and_fuzz.sh --long     # FUZZ_SECONDS=600, OP_FUZZ_SECONDS=1800
# Environment: FUZZ_SECONDS, OP_FUZZ_SECONDS, DELTA_FUZZ_SECONDS, OP_FUZZ_SEED, FUZZ_OUT (default
#              build/fuzz), SKIP_OP_FUZZ=1 (stages 1-2 only), CLANG (default clang++), FUZZ_JOBS.
# Results: $FUZZ_OUT/summary.txt (executions and crashes per stage), crash inputs under
# $FUZZ_OUT/artifacts (libFuzzer) and $FUZZ_OUT/op_crashes (op fuzzer).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

FUZZ_SECONDS=${FUZZ_SECONDS:-10}
OP_FUZZ_SECONDS=${OP_FUZZ_SECONDS:-40}
DELTA_FUZZ_SECONDS=${DELTA_FUZZ_SECONDS:-20}
# The fused update's harness instantiates every optimizer, row type and instruction set of the
# kernel: at -O1 under ASan and UBSan clang takes about 9.5 minutes on it (UBSan's checks; ASan alone
# takes 2), at -O0 about 2.5. A short run compiles it at -O0 (fewer executions in its seconds, the
# same checks); a long one at -O1, as every other target.
FUSED_UPDATE_OPT=${FUSED_UPDATE_OPT:--O0}
if [ "${1:-}" = "--long" ]; then
  FUZZ_SECONDS=${LONG_FUZZ_SECONDS:-600}
  OP_FUZZ_SECONDS=${LONG_OP_FUZZ_SECONDS:-1800}
  DELTA_FUZZ_SECONDS=${LONG_DELTA_FUZZ_SECONDS:-600}
  FUSED_UPDATE_OPT=-O1
fi
OP_FUZZ_SEED=${OP_FUZZ_SEED:-$(( $(date +%s) % 100000 ))}
OUT=${FUZZ_OUT:-$ROOT/build/fuzz}
CLANG=${CLANG:-clang++}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failures=0
note() { echo "$*" | tee -a "$SUMMARY"; }

# --- toolchain -----------------------------------------------------------------------------------
fuzzer_runtime_present() {
  "$CLANG" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null | grep -q /
}
if ! command -v "$CLANG" >/dev/null 2>&1 || ! fuzzer_runtime_present; then
  echo "Installing clang and its libFuzzer/sanitizer runtimes (apt-get)..."
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null
fi
command -v "$CLANG" >/dev/null 2>&1 || { echo "clang++ not available"; exit 2; }

# -ffp-contract=off as in every build of the library (setup.py, .bazelrc): no fused multiply-add,
# so each instruction-set version of a kernel gives the same bits (checked by the unit tests).
COMMON=(-std=c++17 -g -O1 -ffp-contract=off -I"$ROOT" -fno-omit-frame-pointer -fno-sanitize-recover=all)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# --- a pool of background jobs ------------------------------------------------------------------
# `spawn NAME COMMAND...` runs COMMAND in the background once fewer than FUZZ_JOBS jobs are running,
# its output in $OUT/jobs/NAME.log and its exit status in $OUT/jobs/NAME.status.
mkdir -p "$OUT/jobs"
rm -f "$OUT"/jobs/*.status
spawn() {
  local name=$1
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n; done
  ( "$@" > "$OUT/jobs/$name.log" 2>&1; echo $? > "$OUT/jobs/$name.status" ) &
}
status_of() { cat "$OUT/jobs/$1.status" 2>/dev/null || echo 127; }
# Waits for every job; fails the script (exit 2) when one of the named builds failed.
builds_ok() {
  wait
  local name
  for name in "$@"; do
    if [ "$(status_of "$name")" != 0 ]; then
      tail -40 "$OUT/jobs/$name.log"
      echo "build $name failed"
      exit 2
    fi
  done
}

# --- builds (stages 1 and 2) ----------------------------------------------------------------------
echo "== building the sanitized unit tests and ${FUZZ_JOBS}-way parallel libFuzzer targets"
mkdir -p "$OUT/obj" "$OUT/obj_tests" "$OUT/artifacts" "$OUT/corpus"
# The longest build first: the fused update's harness, then the others.
targets=(fuzz_fused_update)
for src in fuzz/fuzz_*.cc; do
  name=$(basename "$src" .cc)
  [ "$name" = fuzz_fused_update ] || targets+=("$name")
done
compile_fuzz() { "$CLANG" "${COMMON[@]}" "${@:3}" -fsanitize=fuzzer-no-link,address,undefined -c "$1" -o "$2"; }
compile_tests() { "$CLANG" "${COMMON[@]}" -fsanitize=address,undefined -c "$1" -o "$2"; }
spawn core_test_main compile_tests cc/tests/core_test.cc "$OUT/obj_tests/core_test.o"
builds=(core_test_main)
for name in "${targets[@]}"; do
  opt=()
  [ "$name" = fuzz_fused_update ] && opt=("$FUSED_UPDATE_OPT")
  spawn "harness_$name" compile_fuzz "fuzz/$name.cc" "$OUT/obj/$name.harness.o" "${opt[@]}"
  builds+=("harness_$name")
done
core_objects=()
test_objects=("$OUT/obj_tests/core_test.o")
for src in cc/core/*.cc; do
  name=$(basename "$src" .cc)
  spawn "core_$name" compile_fuzz "$src" "$OUT/obj/$name.o"
  spawn "test_$name" compile_tests "$src" "$OUT/obj_tests/$name.o"
  builds+=("core_$name" "test_$name")
  core_objects+=("$OUT/obj/$name.o")
  test_objects+=("$OUT/obj_tests/$name.o")
done
builds_ok "${builds[@]}"
spawn link_core_test "$CLANG" "${COMMON[@]}" -fsanitize=address,undefined "${test_objects[@]}" \
  -o "$OUT/core_test_sanitized"
links=(link_core_test)
for name in "${targets[@]}"; do
  spawn "link_$name" "$CLANG" "${COMMON[@]}" -fsanitize=fuzzer,address,undefined \
    "$OUT/obj/$name.harness.o" "${core_objects[@]}" -o "$OUT/$name"
  links+=("link_$name")
done
builds_ok "${links[@]}"

# --- runs of stages 1 and 2 -----------------------------------------------------------------------
echo "== 1. cc/core unit tests with -fsanitize=address,undefined; 2. libFuzzer targets, ${FUZZ_SECONDS}s each"
# Crashes are counted among the artifacts this run writes: $OUT keeps those of earlier runs.
run_stamp="$OUT/artifacts/.run_started"
touch "$run_stamp"
spawn run_core_test "$OUT/core_test_sanitized"
fuzz_one() {
  local name=$1
  mkdir -p "$OUT/corpus/$name"
  # The working corpus lives under $OUT; the committed seeds are read-only inputs.
  # -timeout: a hang, not a slow input on a loaded machine (the largest accepted minibatch
  # configurations take about a second of CPU under ASan).
  "$OUT/$name" -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$name-" \
    "$OUT/corpus/$name" "fuzz/corpus/$name"
}
for name in "${targets[@]}"; do spawn "run_$name" fuzz_one "$name"; done
wait

if [ "$(status_of run_core_test)" = 0 ]; then
  note "unit tests (ASan+UBSan): $(tail -1 "$OUT/jobs/run_core_test.log")"
else
  tail -40 "$OUT/jobs/run_core_test.log"
  note "unit tests (ASan+UBSan): FAILED"
  failures=$((failures + 1))
fi
total_execs=0
for name in "${targets[@]}"; do
  log="$OUT/jobs/run_$name.log"
  status=$(status_of "run_$name")
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  case "$execs" in ''|*[!0-9]*) execs=0 ;; esac
  total_execs=$((total_execs + execs))
  crashes=$(find "$OUT/artifacts" -name "$name-*" -newer "$run_stamp" | wc -l)
  if [ "$status" -ne 0 ] || grep -q "ERROR: AddressSanitizer\|runtime error:\|ERROR: libFuzzer" "$log"; then
    grep -m5 "ERROR\|runtime error\|invariant violated" "$log"
    note "$name: FAILED (exit $status) after $execs executions; artifacts: $OUT/artifacts/$name-*"
    failures=$((failures + 1))
  else
    note "$name: $execs executions, $crashes crashes, corpus $(ls "$OUT/corpus/$name" | wc -l) inputs"
  fi
done
note "libFuzzer total: $total_execs executions in ${#targets[@]} targets x ${FUZZ_SECONDS}s"

# --- 3. op-level fuzzer through TensorFlow --------------------------------------------------------
if [ "${SKIP_OP_FUZZ:-0}" != "1" ]; then
  echo "== 3. op-level fuzzer, ${OP_FUZZ_SECONDS}s (seed $OP_FUZZ_SEED)"
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python
  if "$PY" fuzz/op_fuzzer.py --seconds "$OP_FUZZ_SECONDS" --seed "$OP_FUZZ_SEED" --timeout 60 \
       --crash-dir "$OUT/op_crashes" > "$OUT/op_fuzzer.log" 2>&1; then
    note "op fuzzer: $(tail -1 "$OUT/op_fuzzer.log")"
  else
    tail -20 "$OUT/op_fuzzer.log"
    note "op fuzzer: FAILED (crashes recorded in $OUT/op_crashes): $(tail -1 "$OUT/op_fuzzer.log")"
    failures=$((failures + 1))
  fi
fi

# --- 4. the delta reader (docs/deltas.md): damaged deltas through the embedding and the serving model
if [ "${SKIP_OP_FUZZ:-0}" != "1" ]; then
  echo "== 4. delta reader fuzzer, ${DELTA_FUZZ_SECONDS}s (seed $OP_FUZZ_SEED)"
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python
  if timeout $((DELTA_FUZZ_SECONDS + 300)) "$PY" fuzz/delta_fuzzer.py --seconds "$DELTA_FUZZ_SECONDS" \
       --seed "$OP_FUZZ_SEED" > "$OUT/delta_fuzzer.log" 2>&1; then
    note "$(tail -1 "$OUT/delta_fuzzer.log")"
  else
    tail -20 "$OUT/delta_fuzzer.log"
    note "delta fuzzer: FAILED: $(tail -1 "$OUT/delta_fuzzer.log")"
    failures=$((failures + 1))
  fi
fi

echo "== summary ($SUMMARY)"
cat "$SUMMARY"
[ "$failures" -eq 0 ] || { echo "$failures stage(s) failed"; exit 1; }
echo "no crashes, no sanitizer reports"
