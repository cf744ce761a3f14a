#!/usr/bin/env bash
# Builds everything with Bazel and runs the C++ unit tests, offline:
#   bazel build //...            -> bazel-bin/cc/_sc_ops.so (op library), bazel-bin/cc/_core.so
#   bazel test //cc/tests:all    -> cc/core unit tests against the spec's worked examples
# Uses Debian's bazel-bootstrap (Bazel 4.2.3), installed with apt-get when `bazel` is missing. All
# external repositories are local (third_party/); TensorFlow's headers and
# libtensorflow_framework.so.2 and pybind11 come from .venv (created by scripts/setup.sh when
# missing). Bazel's output base stays in its default location (~/.cache/bazel), not in the repo.
# Extra arguments are passed to both bazel commands.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bazel >/dev/null 2>&1; then
  echo "Installing bazel-bootstrap (Debian's Bazel 4.2.3)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q bazel-bootstrap
fi

if [ ! -x .venv/bin/python ]; then
  bash scripts/setup.sh
fi

# The repository rules in third_party/ read TensorFlow and pybind11 from this python.
repo_env=(--repo_env=PYTHON_BIN_PATH="$PWD/.venv/bin/python")

start=$(date +%s)
bazel build "${repo_env[@]}" "$@" //...
built=$(date +%s)
bazel test "${repo_env[@]}" "$@" //cc/tests:all
done_at=$(date +%s)
echo "bazel build //...: $((built - start)) s; bazel test //cc/tests:all: $((done_at - built)) s"
echo "Op library: bazel-bin/cc/_sc_ops.so; pybind11 module: bazel-bin/cc/_core.so"
