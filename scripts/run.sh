#!/usr/bin/env bash
# Sets up the environment and runs the main job: trains a DLRM-style model with the Keras
# EmbeddingLayer on the built-in teacher-labelled Criteo-like data (Keras progress bar), reports
# held-out AUC and log loss, saves a checkpoint and exports the serving model, all under ./out
# (or --output-dir). Extra arguments go to the job: `bash scripts/run.sh --help` lists the flags.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# A quiet start: hide TensorFlow's C++ INFO/WARNING lines, and keep oneDNN's custom ops off (their
# start-up banner is printed before TensorFlow's log level applies, once per loaded library).
# Either can be overridden from the environment, e.g. TF_ENABLE_ONEDNN_OPTS=1 bash scripts/run.sh.
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export TF_ENABLE_ONEDNN_OPTS=${TF_ENABLE_ONEDNN_OPTS:-0}
exec python -m tf_sc_embedding.examples.dlrm "$@"
