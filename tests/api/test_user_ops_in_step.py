"""Stateful ops of the user's model in a step over several replicas
(docs/multi_worker.md#in-step-checks): a `tf.print` or `tf.debugging.Assert` after the lookup must
not deadlock the embedding's collectives.

TensorFlow runs stateful ops without a resource input in program order over a whole
`tf.function`, and under MirroredStrategy that function holds every replica's step one after the
other. Had the embedding such an op on the way into a replica's collectives (it had: the int64 id
range checks, the prefetch checks, the validation of received string keys), it would wait for the
user's op in the previous replica's dense model, which waits for that replica's collectives,
which wait for the first replica. Every case runs with a collective timeout, so a deadlock fails
in seconds instead of hanging."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.api import parity_helpers as ph
from tests.api.test_dynamic_vocabulary import ids_tensor, key_values

E = tf.tpu.experimental.embedding
BATCH = 16
REPLICAS = 2


def make_embedding(strategy, exchange, key_dtype, placement, pipelined):
    items = E.TableConfig(vocabulary_size=64, dim=4, name="items")
    ids = E.TableConfig(vocabulary_size=32, dim=4, name="ids")
    features = {"f1": E.FeatureConfig(table=items, name="f1"),
                "f2": E.FeatureConfig(table=ids, name="f2")}
    dynamic = ({} if key_dtype is None else
               {"items": sce.DynamicVocabulary(key_dtype=key_dtype)})
    with strategy.scope():
        return sce.TPUEmbeddingV2(
            features, optimizer=E.Adagrad(0.1), exchange=exchange,
            table_placement={"ids": placement}, dynamic_vocabularies=dynamic,
            pipeline_execution_with_tensor_core=pipelined, collective_timeout_seconds=20)


@pytest.mark.parametrize("exchange,key_dtype,placement,prefetch", [
    ("all_to_all", None, "sharded", False),
    ("all_gather", None, "sharded", False),
    ("all_to_all", None, "replicated", True),
    ("all_to_all", tf.string, "sharded", False),
    pytest.param("all_to_all", tf.string, "sharded", True, marks=pytest.mark.slow),
    pytest.param("all_to_all", tf.int64, "replicated", True, marks=pytest.mark.slow),
])
def test_a_print_and_an_assert_in_the_dense_model_do_not_deadlock(exchange, key_dtype, placement,
                                                                    prefetch):
    strategy = ph.make_strategy(REPLICAS)
    embedding = make_embedding(strategy, exchange, key_dtype, placement, pipelined=prefetch)
    rng = np.random.default_rng(0)
    keys = (rng.integers(0, 64, 20) if key_dtype is None else key_values(rng, 20, key_dtype))
    batches = [{"f1": [list(rng.choice(keys, 2)) for _ in range(BATCH)],
                "f2": [list(rng.integers(0, 32, 2)) for _ in range(BATCH)]} for _ in range(4)]

    def features(batch):
        size = BATCH // REPLICAS
        per_replica = [{k: ids_tensor(s[r * size:(r + 1) * size], "ragged",
                                      key_dtype if k == "f1" and key_dtype else tf.int64)
                        for k, s in batch.items()} for r in range(REPLICAS)]
        return strategy.experimental_distribute_values_from_function(
            lambda context: per_replica[context.replica_id_in_sync_group])

    def replica_step(batch, upcoming=None):
        if upcoming is None:
            activations, preserved = embedding(batch)
        else:
            activations, preserved = embedding(batch, next_features=upcoming)
        total = tf.add_n([tf.reduce_sum(a) for a in activations.values()])
        # The user's stateful ops without a resource input, after the lookup.
        tf.print("activations sum", total, output_stream="file:///dev/null")
        checked = tf.debugging.Assert(tf.math.is_finite(total), ["non-finite activations"])
        with tf.control_dependencies([checked]):
            gradients = {k: 0.5 * a for k, a in activations.items()}
        with tf.control_dependencies(embedding.apply_gradients(gradients, preserved)):
            return tf.identity(total)

    plain = tf.function(lambda b: strategy.run(replica_step, args=(b,)))
    prefetching = tf.function(lambda b, u: strategy.run(replica_step, args=(b, u)))
    if prefetch:
        tf.function(lambda b: strategy.run(embedding.prefetch, args=(b,)))(features(batches[0]))
    for n, batch in enumerate(batches):
        if prefetch and n + 1 < len(batches):
            prefetching(features(batch), features(batches[n + 1]))
        else:
            plain(features(batch))
    if key_dtype is not None:
        assert len(embedding.export_dynamic_table("items")[0]) > 0
