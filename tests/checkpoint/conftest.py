"""Configures 8 logical CPU devices before any TensorFlow op runs (MirroredStrategy with 1, 2, 4
and 8 replicas in one process); tests needing more replicas than configured skip themselves."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logical_cpus import NUM_LOGICAL_CPUS, configure  # noqa: E402,F401

AVAILABLE_CPUS = configure()

