#!/usr/bin/env bash
# Sets up the environment and runs the default test suite. Extra arguments go to pytest
# (for example `bash scripts/test.sh -m slow` runs the slow tests).
#
# The tests are spread over PYTEST_WORKERS pytest processes (pytest-xdist; default 2, one per core
# of the CI machine; 0 runs them in this process). Each process configures its own logical CPU
# devices (tests/conftest.py) and every test writes under its own tmp_path. The multi-worker
# cluster tests share one xdist group, so they run one after another on one process
# (tests/multiworker).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
