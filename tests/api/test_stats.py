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
    theirs = inspect.signature(E.TPUEmbeddingV2.compute_sparse_core_stats)
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


@pytest.mark.parametrize("exchange", ["all_to_all", "all_gather"])
def test_running_maxima_two_replicas_match_static_method(exchange):
    # all-gather: the counts of the splits op the exchange runs; all-to-all: those of the routing
    # op (SceRouteIdsToOwners). The static method counts with the statistics op.
    require_replicas(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():   # statistics cover the sharded tables (small ones are replicated)
        embedding = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1), exchange=exchange,
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


# --------------------------------------------------------------------------------------------
# Online limits (adapt_sparse_core_limits) and the dropped-ids counter
# --------------------------------------------------------------------------------------------

def _two_replica_steps(embedding, strategy, per_replica_batches, train=True):
    @tf.function
    def step(ids):
        def fn(ids):
            activations, preserved = embedding(ids)
            if train:
                embedding.apply_gradients(activations, preserved)
            return activations["watched"]
        return strategy.run(fn, args=(ids,))
    outputs = []
    for pair in per_replica_batches:
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, pair=pair: pair[ctx.replica_id_in_sync_group])
        outputs.append([v.numpy() for v in
                        strategy.experimental_local_results(step(values))])
    return outputs


@pytest.mark.parametrize("exchange", ["all_to_all", "all_gather"])
def test_online_limits_are_raised_to_the_agreed_maxima_and_do_not_change_training(exchange):
    """Limits start at the configured values, are raised to the running maxima over both
    replicas (every replica and process agree), never go down, and the numbers are those of a
    run without limits."""
    require_replicas(2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    config = E.SparseCoreEmbeddingConfig(max_ids_per_table={"video": 2},
                                         max_unique_ids_per_table={"video": 1000})
    with strategy.scope():
        adaptive = sce.TPUEmbeddingV2(features_config(), optimizer=E.Adagrad(0.1),
                                      sparse_core_embedding_config=config, exchange=exchange,
                                      table_placement={"video": "sharded"},
                                      adapt_sparse_core_limits=True)
        plain = sce.TPUEmbeddingV2(features_config(), optimizer=E.Adagrad(0.1),
                                   exchange=exchange, table_placement={"video": "sharded"})
    assert plain.sparse_core_limits is None
    batches = [(batch(seed=30), batch(seed=31, skew=True)), (batch(seed=32), batch(seed=33))]
    got = _two_replica_steps(adaptive, strategy, batches)
    want = _two_replica_steps(plain, strategy, batches)
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(adaptive.embedding_tables[adaptive.feature_config["watched"].table],
                               plain.embedding_tables[plain.feature_config["watched"].table],
                               rtol=1e-6, atol=1e-7)
    measured = [sce.TPUEmbeddingV2.compute_sparse_core_stats(ids, features_config(), 2,
                                                             optimizer=E.Adagrad(0.1))
                for pair in batches for ids in pair]
    max_ids = max(int(m[0]["video"]) for m in measured)
    assert max_ids > 2
    assert adaptive.sparse_core_limits == {
        "video": {"max_ids_per_partition": max_ids, "max_unique_ids_per_partition": 1000}}


def test_online_limits_start_at_tensorflows_default_and_need_statistics():
    embedding = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                                   adapt_sparse_core_limits=True)
    ids = batch(seed=40, rows=8)
    embedding(ids)
    assert embedding.sparse_core_limits == {
        "video": {"max_ids_per_partition": 256, "max_unique_ids_per_partition": 256}}
    # 64 samples, 16 per SparseCore, each with the 25 ids of partition 0 (id mod 4 == 0): 400
    # (sample, id) pairs and 25 unique ids in one partition.
    skewed = {"watched": tf.RaggedTensor.from_row_lengths(
        np.tile(np.arange(0, VOCAB, 4, dtype=np.int64), 64), np.full(64, 25))}
    trained = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                                 adapt_sparse_core_limits=True)
    trained(skewed)
    assert trained.sparse_core_limits["video"] == {
        "max_ids_per_partition": 400, "max_unique_ids_per_partition": 256}
    with pytest.raises(ValueError, match="adapt_sparse_core_limits needs track_sparse_core_stats"):
        sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                           adapt_sparse_core_limits=True, track_sparse_core_stats=False)


def test_raise_op_logs_each_change_and_rejects_bad_statistics():
    from tf_sc_embedding.ops.online_limits import raise_sparse_core_limits  # noqa: PLC0415
    limits = tf.Variable([[4, 4], [8, 8]], dtype=tf.int32)
    after = raise_sparse_core_limits(limits, tf.constant([[6, 3], [8, 9]]), ["a", "b"])
    np.testing.assert_array_equal(after.numpy(), [[6, 4], [8, 9]])
    np.testing.assert_array_equal(limits.numpy(), [[6, 4], [8, 9]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'b'.*must be >= 0"):
        raise_sparse_core_limits(limits, tf.constant([[7, 7], [-1, 0]]), ["a", "b"])
    np.testing.assert_array_equal(limits.numpy(), [[6, 4], [8, 9]])   # nothing written
    with pytest.raises(tf.errors.InvalidArgumentError, match="observed must be int32 of shape"):
        raise_sparse_core_limits(limits, tf.constant([[7, 7]]), ["a", "b"])


def test_raise_op_logs_to_stderr(tmp_path):
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    script = (
        "import tensorflow as tf\n"
        "from tf_sc_embedding.ops.online_limits import raise_sparse_core_limits\n"
        "v = tf.Variable([[4, 4]], dtype=tf.int32)\n"
        "raise_sparse_core_limits(v, tf.constant([[9, 4]]), ['video'])\n"
        "raise_sparse_core_limits(v, tf.constant([[9, 4]]), ['video'])\n")
    env = dict(__import__("os").environ, TF_CPP_MIN_LOG_LEVEL="0")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=120, check=True)
    lines = [l for l in result.stderr.splitlines() if "raised online" in l]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "table 'video': max_ids_per_partition raised online from 4 to 9" in lines[0]


def test_dropped_ids_are_counted_like_the_op_counts_them():
    config = E.SparseCoreEmbeddingConfig(allow_id_dropping=True, max_ids_per_chip_per_sample=1)
    embedding = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1),
                                   sparse_core_embedding_config=config)
    embedding.build(per_replica_batch_size=B)
    layout = embedding.embedding_layouts["video"]
    vocab_rows = layout.num_sparse_cores * layout.total_rows_per_sparse_core_shard
    from tf_sc_embedding.preprocessing import enqueue   # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.tables.layout import EmbeddingLayout   # pylint: disable=import-outside-toplevel
    one_replica = EmbeddingLayout(features_config(), E.SGD(0.1), 1, 4, {"watched": (B,)})
    total = 0
    for seed in (50, 51):
        ids = batch(seed=seed)
        preprocessed = enqueue.preprocess(one_replica, [ids["watched"]], [None])["video"]
        csr = sce.ops.get_minibatches_in_csr_with_physical_replica(
            tf.constant([""]), preprocessed.sorted_row_ids, preprocessed.sorted_col_ids,
            preprocessed.sorted_gains, preprocessed.splits, preprocessed.id_counts,
            sample_count=B, num_replica=1, max_minibatches_per_sc=64,
            max_ids_per_chip_per_sample=1, table_vocab_size=vocab_rows, feature_width=DIM,
            num_sc_per_chip=4, table_name="video",
            mini_batch_in_csr="", allow_id_dropping=True)
        total += int(csr.num_dropped_ids)
        # With one replica, the class's enqueue packs the CSR buffers (and drops the ids) itself.
        assert int(embedding.enqueue(ids)["video"].num_dropped) == int(csr.num_dropped_ids)
    assert total > 0
    for seed in (50, 51):
        embedding(batch(seed=seed))
    assert embedding.counters().dropped_ids == total
    plain = sce.TPUEmbeddingV2(features_config(), optimizer=E.SGD(0.1))
    plain(batch(seed=50))
    assert plain.counters().dropped_ids == 0


@pytest.mark.parametrize("replicas", [2, 32768])
def test_all_to_all_statistics_match_the_static_method_at_any_replica_count(replicas):
    # The all-to-all exchange counts in its routing op (one pass over the routing's sort), with
    # no per-(SparseCore, shard) array, so it takes any replica count the layout takes.
    from tf_sc_embedding.preprocessing import enqueue   # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.exchanges import all_to_all   # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.tables.layout import EmbeddingLayout   # pylint: disable=import-outside-toplevel
    ids = batch(seed=40)
    layout = EmbeddingLayout(features_config(), E.SGD(0.1), replicas, 4, {"watched": (B,)})
    observed = {}
    coo = enqueue.preprocess(layout, [ids["watched"]], [None], with_splits=False)
    all_to_all.route(layout, coo, observe_maxima=observed.update)
    with pytest.raises(ValueError, match="partition statistics come with the splits"):
        enqueue.preprocess(layout, [ids["watched"]], [None], with_splits=False,
                           observe_maxima=observed.update)
    max_ids, max_unique = sce.TPUEmbeddingV2.compute_sparse_core_stats(
        ids, features_config(), replicas, optimizer=E.SGD(0.1))
    assert {name: (int(a), int(b)) for name, (a, b) in observed.items()} == {
        "video": (int(max_ids["video"]), int(max_unique["video"]))}
