#!/usr/bin/env bash
# Sets up the environment and runs the main job (for now: a short TPUEmbeddingV2 training demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
exec python examples/train_demo.py "$@"
