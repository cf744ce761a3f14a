"""Helpers of the Keras tests."""
import numpy as np
import tensorflow as tf

from tests import devices


def mirrored_strategy(replicas=2):
    """A MirroredStrategy over the first logical CPUs with fresh collective keys."""
    return devices.mirrored_strategy(replicas)


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
