#!/usr/bin/env bash
# Creates .venv (if needed), installs the pinned dependencies, and builds tf_sc_embedding in place
# (editable install). The C++ build is skipped when no source changed since the last build.
# SCE_ONECCL=1 also installs the oneCCL extra (requirements-oneccl.txt) and builds the oneCCL
# transport's kernels into the cache, so that no test pays for that build.
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
if [ "${SCE_ONECCL:-0}" = 1 ] && [ "$(cat .venv/.oneccl_stamp 2>/dev/null)" != "$(sha1sum requirements-oneccl.txt | cut -c1-40)" ]; then
  python -m pip install -q -r requirements-oneccl.txt
  sha1sum requirements-oneccl.txt | cut -c1-40 > .venv/.oneccl_stamp
fi
# The oneCCL transport's sources are not part of this build (oneccl_library.py compiles them).
stamp_build=$(cat setup.py pyproject.toml $(find cc -type f -not -path 'cc/transport/*' \
  -not -path 'cc/kernels/oneccl/*' | sort) | sha1sum | cut -c1-40)
if [ "$(cat .venv/.build_stamp 2>/dev/null)" != "$stamp_build" ] || ! ls tf_sc_embedding/_sc_ops*.so >/dev/null 2>&1; then
  echo "Building the tf_sc_embedding op library (about two minutes on 2 cores)..."
  python -m pip install -q --no-build-isolation -e .
  echo "$stamp_build" > .venv/.build_stamp
fi
if [ "${SCE_ONECCL:-0}" = 1 ]; then
  python -c "from tf_sc_embedding.collectives import oneccl_library as o; o.library_path()"
fi
