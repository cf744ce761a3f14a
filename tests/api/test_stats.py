"""SparseCore partition statistics: TensorFlow's `compute_sparse_core_stats` (signature and
result structure) against a brute-force count, the running maxima of every enqueued batch with
1 and 2 replicas, TensorBoard summaries, and the limits fed back into SparseCoreEmbeddingConfig."""
import glob
import inspect

import numpy as np
import pytest
import tensorflow as tf

from tests.devices import require_replicas
import tf_sc_embedding as sce

E = tf.tpu.experimental.embedding
VOCAB, DIM, B = 97, 8, 32


def features_config():
    table = E.TableConfig(vocabulary_size=VOCAB, dim=DIM, combiner="sum", name="video",
                          initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=3))
    return {"watched": E.FeatureConfig(table=table, name="watched")}


def batch(seed, rows=B, skew=False):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, size=rows)
    n = int(lengths.sum())
    ids = rng.integers(0, 8 if skew else VOCAB, size=n)
    return {"watched": tf.RaggedTensor.from_row_lengths(ids.astype(np.int64), lengths)}


def brute_force(ids, chips, sparse_cores):
    """Max over (source SparseCore, partition) of deduplicated ids and of unique ids (one
    unstacked table, rotation 0: partition = id mod chips * sparse_cores)."""
    rows = ids["watched"].to_list()
    per_sc = len(rows) // sparse_cores
    partitions = chips * sparse_cores
    max_ids = max_unique = 0
    for sc in range(sparse_cores):
        pairs = {(s, i) for s in range(sc * per_sc, (sc + 1) * per_sc) for i in rows[s]}
        for p in range(partitions):
            in_p = [(s, i) for s, i in pairs if i % partitions == p]
            max_ids = max(max_ids, len(in_p))
            max_unique = max(max_unique, len({i for _, i in in_p}))
    return max_ids, max_unique


def test_signature_is_tensorflows():
    from tensorflow.python.tpu import tpu_embedding_v3  # pylint: disable=import-outside-toplevel
    theirs = inspect.signature(tpu_embedding_v3.TPUEmbeddingV2.compute_sparse_core_stats)
    ours = inspect.signature(sce.TPUEmbeddingV2.compute_sparse_core_stats)
    assert list(ours.parameters) == list(theirs.parameters)
    assert [p.default for p in ours.parameters.values()] == \
        [p.default for p in theirs.parameters.values()]


@pytest.mark.parametrize("chips,sparse_cores", [(1, 4), (2, 4), (4, 2)])
def test_static_method_matches_brute_force(chips, sparse_cores):
    ids = batch(seed=chips * 10 + sparse_cores)
    max_ids, max_unique = sce.TPUEmbeddingV2.compute_sparse_core_stats(
        ids, features_config(), num_tpu_chips=chips, num_sc_per_chip=sparse_cores,
        optimizer=E.SGD(0.1))
    assert list(max_ids) == ["video"] and list(max_unique) == ["video"]
    assert (int(max_ids["video"]), int(max_unique["video"])) == \
        brute_force(ids, chips, sparse_cores)


def test_running_maxima_single_replica_and_summaries(tmp_path):
    embedding = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1))
    writer = tf.summary.create_file_writer(str(tmp_path))
    batches = [batch(seed=s, skew=s == 2) for s in range(4)]

    @tf.function
    def step(ids):
        activations, preserved = embedding(ids)
        embedding.apply_gradients(activations, preserved)

    with writer.as_default(step=0):
        for ids in batches:
            step(ids)
    writer.flush()
    expected = [brute_force(ids, 1, 4) for ids in batches]
    stats = embedding.sparse_core_stats["video"]
    assert stats["batches"] == 4
    assert stats["max_ids_per_partition"] == max(e[0] for e in expected)
    assert stats["max_unique_ids_per_partition"] == max(e[1] for e in expected)
    assert embedding.suggested_sparse_core_limits() == (
        {"video": stats["max_ids_per_partition"]},
        {"video": stats["max_unique_ids_per_partition"]})
    tags = {}
    for path in glob.glob(str(tmp_path / "events*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(
                    float(tf.make_ndarray(value.tensor)))
    assert tags["sparse_core/video/max_ids_per_partition"] == [float(e[0]) for e in expected]
    assert tags["sparse_core/video/running_max_unique_ids_per_partition"][-1] == \
        stats["max_unique_ids_per_partition"]


def test_running_maxima_two_replicas_match_static_method():
    require_replicas(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():   # statistics cover the sharded tables (small ones are replicated)
        embedding = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                                       table_placement={"video": "sharded"})
    per_replica = [batch(seed=20), batch(seed=21, skew=True)]
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: per_replica[ctx.replica_id_in_sync_group])

    @tf.function
    def step(ids):
        def fn(ids):
            activations, preserved = embedding(ids)
            embedding.apply_gradients(activations, preserved)
        strategy.run(fn, args=(ids,))
    step(values)
    want = [sce.TPUEmbeddingV2.compute_sparse_core_stats(ids, features_config(), 2,
                                                         optimizer=E.SGD(0.1))
            for ids in per_replica]
    stats = embedding.sparse_core_stats["video"]
    assert stats["batches"] == 2
    assert stats["max_ids_per_partition"] == max(int(w[0]["video"]) for w in want)
    assert stats["max_unique_ids_per_partition"] == max(int(w[1]["video"]) for w in want)


def test_measured_limits_run_without_dropping_and_tracking_can_be_off():
    ids = batch(seed=7)
    max_ids, max_unique = sce.TPUEmbeddingV2.compute_sparse_core_stats(
        ids, features_config(), 1, optimizer=E.SGD(0.1))
    config = E.SparseCoreEmbeddingConfig(
        max_ids_per_table={k: int(v) for k, v in max_ids.items()},
        max_unique_ids_per_table={k: int(v) for k, v in max_unique.items()})
    limited = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                                 sparse_core_embedding_config=config,
                                 track_sparse_core_stats=False)
    plain = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1))
    np.testing.assert_allclose(limited(ids)[0]["watched"].numpy(),
                               plain(ids)[0]["watched"].numpy(), rtol=1e-6)
    assert limited.sparse_core_stats is None
