"""Helpers of the Keras tests (a module name of its own: every test directory has a conftest)."""
import pytest
import tensorflow as tf


def require_replicas(n):
    available = len(tf.config.list_logical_devices("CPU"))
    if n > available:
        pytest.skip(f"needs {n} logical CPU devices, only {available} are configured")


def mirrored_strategy(replicas=2):
    """A MirroredStrategy over the first logical CPUs, with a fresh collective key base:
    strategies created in one process must not share collective instance keys (TensorFlow's own
    strategy_combinations bumps the same base)."""
    require_replicas(replicas)
    tf.distribute.MirroredStrategy._collective_key_base += 100000  # pylint: disable=protected-access
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
