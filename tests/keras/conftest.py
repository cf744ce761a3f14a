"""Configures 8 logical CPU devices before any TensorFlow op runs, so the Keras tests can run
MirroredStrategy with 2 replicas next to single-replica models in one process; tests needing more
devices than could be configured (TensorFlow initialized earlier) skip themselves."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logical_cpus import NUM_LOGICAL_CPUS, configure  # noqa: E402,F401

AVAILABLE_CPUS = configure()


@pytest.fixture(autouse=True, scope="module")
def _fresh_collective_keys():
    yield
    tf.distribute.MirroredStrategy._collective_key_base += 100000  # pylint: disable=protected-access
