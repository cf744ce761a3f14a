#!/usr/bin/env bash
# Long fuzzing run: every libFuzzer target for LONG_FUZZ_SECONDS (default 600 s) and the op-level
# fuzzer for LONG_OP_FUZZ_SECONDS (default 1800 s); see scripts/sanitize_and_fuzz.sh.
exec bash "$(dirname "$0")/sanitize_and_fuzz.sh" --long "$@"
