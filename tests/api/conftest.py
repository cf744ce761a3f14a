"""Configures 8 logical CPU devices before any TensorFlow op runs, so the API tests can run
MirroredStrategy with 1, 2, 4 and 8 replicas in one process.

Logical devices can only be configured before TensorFlow initializes its runtime. pytest imports
this conftest while collecting tests/api, which happens before any test runs; the configuration
is harmless for the other test files (they use the first CPU device). If the runtime was
nevertheless initialized earlier (e.g. a plugin ran TF ops at import), the configuration fails
and the tests that need more replicas than there are devices skip themselves
(`require_replicas`).
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from logical_cpus import NUM_LOGICAL_CPUS, configure  # noqa: E402,F401

AVAILABLE_CPUS = configure()


def require_replicas(n):
    """Skips the calling test when fewer than n logical CPUs could be configured."""
    if n > AVAILABLE_CPUS:
        pytest.skip(f"needs {n} logical CPU devices, only {AVAILABLE_CPUS} are configured "
                    "(TensorFlow was initialized before tests/api/conftest.py ran)")


@pytest.fixture(autouse=True)
def _fresh_collective_keys():
    """MirroredStrategies with different device counts must not share collective group keys
    (TensorFlow's own strategy_combinations bumps the same base): leave a fresh base behind for
    whatever strategy is created next, in these tests or in later test directories."""
    yield
    tf.distribute.MirroredStrategy._collective_key_base += 100000
