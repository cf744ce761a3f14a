#!/usr/bin/env bash
# Builds and runs the cc/core unit tests without Bazel (plain g++), e.g. from the Python test
# suite: `bash cc/tests/run_core_tests.sh`. Prints "N passed, N failed"; exits non-zero on a
# compile error or a failed check. CXX overrides the compiler.
set -euo pipefail
cd "$(dirname "$0")/../.."
out_dir=$(mktemp -d "${TMPDIR:-/tmp}/sce_core_test.XXXXXX")
trap 'rm -rf "$out_dir"' EXIT
# -ffp-contract=off as in every build of the library (setup.py, .bazelrc): the tests compare the
# AVX-512, AVX2 and baseline kernels bit for bit.
"${CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -Wall -Wno-sign-compare -I. cc/core/*.cc \
  cc/tests/core_test.cc \
  -o "$out_dir/core_test"
"$out_dir/core_test"
