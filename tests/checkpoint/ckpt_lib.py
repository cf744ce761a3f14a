"""Small deterministic training setup shared by the checkpoint tests and their subprocesses."""
import numpy as np
import tensorflow as tf

import tf_sc_embedding as sce
from tests import devices

E = tf.tpu.experimental.embedding
GLOBAL_BATCH = 32
VOCAB = {"video": 100, "user": 33, "item": 1000}
DIM = {"video": 10, "user": 16, "item": 8}
COMBINER = {"video": "sum", "user": "mean", "item": "sqrtn"}
FEATURES = {"f_video": "video", "f_video2": "video", "f_user": "user", "f_item": "item"}


def table_configs(vocab=None, dim=None, initializer=None):
    vocab = dict(VOCAB, **(vocab or {}))
    dim = dict(DIM, **(dim or {}))
    return {name: E.TableConfig(
        vocabulary_size=vocab[name], dim=dim[name], combiner=COMBINER[name], name=name,
        initializer=initializer(name) if initializer else
        tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=len(name)))
        for name in VOCAB}


def make_optimizer(name="adagrad"):
    if name == "adagrad":
        return E.Adagrad(learning_rate=0.1)
    if name == "adam":
        return E.Adam(learning_rate=0.05)
    if name == "ftrl":
        return E.FTRL(learning_rate=0.1)
    if name == "sgd":
        return E.SGD(learning_rate=0.1)
    if name == "row_wise_adagrad":
        return sce.RowWiseAdagrad(learning_rate=0.1, initial_accumulator_value=0.1)
    raise ValueError(name)


def make_strategy(replicas):
    if replicas == 1:
        return tf.distribute.get_strategy()
    return devices.mirrored_strategy(replicas)


def make_embedding(replicas, stacking=True, optimizer="adagrad", build=True, replicated=(),
                   **table_kwargs):
    tables = table_configs(**table_kwargs)
    features = {f: E.FeatureConfig(table=tables[t], name=f) for f, t in FEATURES.items()}
    strategy = make_strategy(replicas)
    config = E.SparseCoreEmbeddingConfig(disable_table_stacking=not stacking)
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, make_optimizer(optimizer),
                                       sparse_core_embedding_config=config,
                                       replication_threshold_bytes=0,
                                       table_placement={t: "replicated" for t in replicated})
    if build:
        embedding.build(per_replica_batch_size=GLOBAL_BATCH // replicas)
    return strategy, embedding


def global_batch(step, with_weights=True):
    rng = np.random.default_rng(1000 + step)
    ids, weights = {}, {}
    for feature, table in FEATURES.items():
        lengths = rng.integers(0, 4, size=GLOBAL_BATCH)
        n = int(lengths.sum())
        ids[feature] = tf.RaggedTensor.from_row_lengths(
            rng.integers(0, VOCAB[table], size=n).astype(np.int64), lengths)
        weights[feature] = tf.RaggedTensor.from_row_lengths(
            rng.uniform(0.5, 1.5, size=n).astype(np.float32), lengths)
    return ids, (weights if with_weights else None)


class Trainer:
    """Runs deterministic training steps on an embedding under its strategy."""

    def __init__(self, strategy, embedding):
        self.strategy, self.embedding = strategy, embedding
        self.replicas = strategy.num_replicas_in_sync

        @tf.function
        def step(ids, weights):
            def fn(ids, weights):
                activations, preserved = embedding(ids, weights)
                grads = tf.nest.map_structure(lambda a: tf.sin(3.0 * a) + 0.25, activations)
                embedding.apply_gradients(grads, preserved)
                return activations
            return strategy.run(fn, args=(ids, weights))
        self._step = step

    def _distribute(self, structure):
        if self.replicas == 1:
            return structure
        per = GLOBAL_BATCH // self.replicas
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: {k: v[ctx.replica_id_in_sync_group * per:
                              (ctx.replica_id_in_sync_group + 1) * per]
                         for k, v in structure.items()})

    def run(self, steps):
        """Runs global steps `steps` (an iterable of step indices); returns the last activations."""
        activations = None
        for s in steps:
            ids, weights = global_batch(s)
            out = self._step(self._distribute(ids), self._distribute(weights))
            if self.replicas > 1:
                out = {k: tf.concat(self.strategy.experimental_local_results(v), 0)
                       for k, v in out.items()}
            activations = {k: v.numpy() for k, v in out.items()}
        return activations


def state(embedding):
    """{"<table>/<kind>": logical array} of the parameters and every slot."""
    return {f"{t}/{k}": np.array(v) for t, kinds in
            embedding.logical_tables(include_slots=True).items() for k, v in kinds.items()}


def save_state(path, embedding):
    np.savez(path, **state(embedding))


def load_state(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}

