"""Helpers of the Keras tests (a module name of its own: every test directory has a conftest)."""
import numpy as np
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


# Two tables with deterministic initial values, shared by the Keras layer tests.
E = tf.tpu.experimental.embedding
VOCAB = {"a": 16, "b": 8}
DIM = {"a": 4, "b": 2}


def initial(name):
    v, d = VOCAB[name], DIM[name]
    return (np.arange(v * d, dtype=np.float32).reshape(v, d) / (v * d) - 0.3).astype(np.float32)


def feature_config(combiner="sum"):
    tables = {n: E.TableConfig(vocabulary_size=VOCAB[n], dim=DIM[n], combiner=combiner,
                               name=f"t_{n}", initializer=tf.constant_initializer(initial(n)))
              for n in VOCAB}
    return {n: E.FeatureConfig(table=tables[n], name=n) for n in VOCAB}
