#!/usr/bin/env bash
# Sets up the environment and runs the default test suite. Extra arguments go to pytest
# (for example `bash scripts/test.sh -m slow` runs the slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec python -m pytest -q "$@"
