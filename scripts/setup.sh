#!/usr/bin/env bash
# Creates .venv (if needed), installs the pinned dependencies, and builds tf_sc_embedding in place
# (editable install). The C++ build is skipped when no source changed since the last build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp_deps=$(sha1sum requirements.txt | cut -c1-40)
if [ "$(cat .venv/.deps_stamp 2>/dev/null)" != "$stamp_deps" ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q -r requirements.txt
  echo "$stamp_deps" > .venv/.deps_stamp
fi
stamp_build=$(cat setup.py pyproject.toml $(find cc -type f | sort) | sha1sum | cut -c1-40)
if [ "$(cat .venv/.build_stamp 2>/dev/null)" != "$stamp_build" ] || ! ls tf_sc_embedding/_sc_ops*.so >/dev/null 2>&1; then
  echo "Building the tf_sc_embedding op library (about two minutes on 2 cores)..."
  python -m pip install -q --no-build-isolation -e .
  echo "$stamp_build" > .venv/.build_stamp
fi
