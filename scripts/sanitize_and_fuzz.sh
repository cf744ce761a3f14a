#!/usr/bin/env bash
# Sanitizers and fuzzing (issue 10). Exits non-zero on any crash, sanitizer report, hang or
# failed unit test. Three stages:
#   1. the cc/core unit tests (cc/tests/core_test.cc) built with -fsanitize=address,undefined;
#   2. every libFuzzer target in fuzz/ (clang, -fsanitize=fuzzer,address,undefined) for
#      FUZZ_SECONDS each, starting from the committed seed corpus fuzz/corpus/<target>;
#   3. the op-level fuzzer (fuzz/op_fuzzer.py) through TensorFlow for OP_FUZZ_SECONDS, each case
#      in a child process with a timeout (needs the op library: bash scripts/setup.sh).
#
# Usage: bash scripts/sanitize_and_fuzz.sh            # CI: about 1-2 minutes of fuzzing
#        bash scripts/sanitize_and_fuzz.sh --long     # FUZZ_SECONDS=600, OP_FUZZ_SECONDS=1800
# Environment: FUZZ_SECONDS, OP_FUZZ_SECONDS, OP_FUZZ_SEED, FUZZ_OUT (default build/fuzz),
#              SKIP_OP_FUZZ=1 (stages 1-2 only), CLANG (default clang++).
# Results: $FUZZ_OUT/summary.txt (executions and crashes per stage), crash inputs under
# $FUZZ_OUT/artifacts (libFuzzer) and $FUZZ_OUT/op_crashes (op fuzzer).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

FUZZ_SECONDS=${FUZZ_SECONDS:-10}
OP_FUZZ_SECONDS=${OP_FUZZ_SECONDS:-40}
if [ "${1:-}" = "--long" ]; then
  FUZZ_SECONDS=${LONG_FUZZ_SECONDS:-600}
  OP_FUZZ_SECONDS=${LONG_OP_FUZZ_SECONDS:-1800}
fi
OP_FUZZ_SEED=${OP_FUZZ_SEED:-$(( $(date +%s) % 100000 ))}
OUT=${FUZZ_OUT:-$ROOT/build/fuzz}
CLANG=${CLANG:-clang++}
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

# --- 1. sanitized unit tests ---------------------------------------------------------------------
echo "== 1. cc/core unit tests with -fsanitize=address,undefined"
if "$CLANG" "${COMMON[@]}" -fsanitize=address,undefined cc/core/*.cc cc/tests/core_test.cc \
     -o "$OUT/core_test_sanitized" && "$OUT/core_test_sanitized" > "$OUT/core_test.log" 2>&1; then
  note "unit tests (ASan+UBSan): $(tail -1 "$OUT/core_test.log")"
else
  cat "$OUT/core_test.log" 2>/dev/null | tail -40
  note "unit tests (ASan+UBSan): FAILED"
  failures=$((failures + 1))
fi

# --- 2. libFuzzer targets ------------------------------------------------------------------------
echo "== 2. libFuzzer targets, ${FUZZ_SECONDS}s each"
mkdir -p "$OUT/obj" "$OUT/artifacts" "$OUT/corpus"
objects=()
for src in cc/core/*.cc; do
  obj="$OUT/obj/$(basename "$src" .cc).o"
  "$CLANG" "${COMMON[@]}" -fsanitize=fuzzer-no-link,address,undefined -c "$src" -o "$obj" || exit 2
  objects+=("$obj")
done
total_execs=0
# Crashes are counted among the artifacts this run writes: $OUT keeps those of earlier runs.
run_stamp="$OUT/artifacts/.run_started"
touch "$run_stamp"
for src in fuzz/fuzz_*.cc; do
  name=$(basename "$src" .cc)
  "$CLANG" "${COMMON[@]}" -fsanitize=fuzzer,address,undefined "$src" "${objects[@]}" \
    -o "$OUT/$name" || exit 2
  mkdir -p "$OUT/corpus/$name"
  log="$OUT/$name.log"
  # The working corpus lives under $OUT; the committed seeds are read-only inputs.
  # -timeout: a hang, not a slow input on a loaded machine (the largest accepted minibatch
  # configurations take about a second of CPU under ASan).
  "$OUT/$name" -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=2560 \
    -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$name-" \
    "$OUT/corpus/$name" "fuzz/corpus/$name" > "$log" 2>&1
  status=$?
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
note "libFuzzer total: $total_execs executions in $(ls fuzz/fuzz_*.cc | wc -l) targets x ${FUZZ_SECONDS}s"

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

echo "== summary ($SUMMARY)"
cat "$SUMMARY"
[ "$failures" -eq 0 ] || { echo "$failures stage(s) failed"; exit 1; }
echo "no crashes, no sanitizer reports"
