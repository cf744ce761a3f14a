"""The single-replica fast path of TPUEmbeddingV2 (issue 8, item 1): the stacked COO op that
replaces one COO op per feature plus a concatenation, the one op per stacked table that also
computes the minibatch splits, and partition statistics taken from the minibatch-splits op
instead of extra counting ops. All must give exactly what they replace."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding import ops
from tf_sc_embedding.tables.layout import EmbeddingLayout
from tf_sc_embedding.tables.table_storage import PARAMETERS

E = tf.tpu.experimental.embedding
B = 16


def config(combiners=("sum", "mean", "sqrtn"), vocab=(50, 7, 300), dim=4):
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, combiner=c, name=f"t{i}")
              for i, (v, c) in enumerate(zip(vocab, combiners))]
    # Two features share table t0, so one table is looked up by several features.
    return {"a": E.FeatureConfig(table=tables[0], name="a"),
            "b": E.FeatureConfig(table=tables[1], name="b"),
            "c": E.FeatureConfig(table=tables[2], name="c"),
            "d": E.FeatureConfig(table=tables[0], name="d")}


def inputs(seed, vocab=(50, 7, 300), kinds=("ragged", "sparse", "dense", "ragged"),
           weighted=True):
    rng = np.random.default_rng(seed)
    vocab_of = dict(zip("abcd", (vocab[0], vocab[1], vocab[2], vocab[0])))
    features, weights = {}, {}
    for key, kind in zip("abcd", kinds):
        v = vocab_of[key]
        if kind == "dense":
            ids = rng.integers(0, v, size=(B,))
            features[key] = tf.constant(ids, tf.int64)
            weights[key] = tf.constant(rng.uniform(0.5, 2, size=(B,)), tf.float32)
            continue
        lengths = rng.integers(0, 5, size=B)
        n = int(lengths.sum())
        ids = rng.integers(0, v, size=n).astype(np.int32)
        w = rng.uniform(0.5, 2, size=n).astype(np.float32)
        ragged = tf.RaggedTensor.from_row_lengths(ids, lengths)
        ragged_w = tf.RaggedTensor.from_row_lengths(w, lengths)
        if kind == "sparse":
            features[key], weights[key] = ragged.to_sparse(), ragged_w.to_sparse()
        else:
            features[key], weights[key] = ragged, ragged_w
    return features, (weights if weighted else None)


def require_two_devices():
    """Skips unless the test setup configured at least 2 logical CPU devices (kept free of the
    conftest helpers so the file runs under either test layout)."""
    if len(tf.config.list_logical_devices("CPU")) < 2:
        pytest.skip("needs 2 logical CPU devices")


def layout_of(feature_config, replicas=1, sparse_cores=4):
    shapes = {p: (B,) for p in "abcd"}
    return EmbeddingLayout(feature_config, E.SGD(0.1), replicas, sparse_cores, shapes)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("replicas,sparse_cores", [(1, 4), (1, 2), (2, 4)])
def test_stacked_coo_equals_per_feature_lists_concatenated(weighted, replicas, sparse_cores):
    feature_config = config()
    layout = layout_of(feature_config, replicas, sparse_cores)
    features, weights = inputs(seed=replicas * 10 + sparse_cores, weighted=weighted)
    flat = tf.nest.flatten(features)
    flat_weights = tf.nest.flatten(weights) if weights else [None] * len(flat)
    fused = enqueue_lib.stacked_coo(layout, flat, flat_weights)
    lists = enqueue_lib.feature_coo_lists(layout, flat, flat_weights)
    assert set(fused) == set(layout.stacked_tables)
    for name in layout.stacked_tables:
        per_feature = [per_sc for _, per_sc in lists[name]]
        for k in range(3):
            expected = np.concatenate([f[k][i].numpy() for i in range(sparse_cores)
                                       for f in per_feature])
            got = fused[name][k].numpy()
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("replicas,sparse_cores", [(1, 4), (1, 2), (2, 4), (1, 1)])
def test_stacked_splits_equal_stacked_coo_then_minibatch_splits(weighted, replicas,
                                                                 sparse_cores):
    layout = layout_of(config(), replicas, sparse_cores)
    features, weights = inputs(seed=replicas * 100 + sparse_cores, weighted=weighted)
    flat = tf.nest.flatten(features)
    flat_weights = tf.nest.flatten(weights) if weights else [None] * len(flat)
    one_op, maxima = enqueue_lib.stacked_splits(layout, flat, flat_weights)
    coo = enqueue_lib.stacked_coo(layout, flat, flat_weights)
    for name, stacked in layout.stacked_tables.items():
        rows, cols, gains = coo[name]
        want = ops.get_minibatch_splits_with_physical_replica(
            tf.constant([""]), rows, cols, gains, sample_count=stacked.sample_count,
            num_replica=replicas, table_vocab_size=stacked.total_rows,
            feature_width=stacked.padded_width, num_sc_per_chip=sparse_cores, table_name=name,
            mini_batch_splits="", max_ids_per_partition=stacked.max_ids_per_partition,
            max_unique_ids_per_partition=stacked.max_unique_ids_per_partition)
        got = one_op[name]
        for field, expected in (("sorted_row_ids", want.sorted_row_ids),
                                ("sorted_col_ids", want.sorted_col_ids),
                                ("sorted_gains", want.sorted_gains), ("splits", want.splits),
                                ("id_counts", want.id_counts)):
            np.testing.assert_array_equal(getattr(got, field).numpy(), expected.numpy(),
                                          err_msg=f"{name} {field}")
        assert int(maxima[name][0]) == int(want.max_ids)
        assert int(maxima[name][1]) == int(want.max_uniques)


def test_stacked_splits_bad_input_fails_and_the_next_call_works():
    layout = layout_of(config())
    features, weights = inputs(seed=8)
    flat, flat_weights = tf.nest.flatten(features), tf.nest.flatten(weights)
    bad = dict(features)
    b = features["b"]   # a SparseTensor; table t1 has 7 rows
    bad["b"] = tf.SparseTensor(b.indices, tf.tensor_scatter_nd_update(
        b.values, [[0]], tf.constant([7], b.values.dtype)), b.dense_shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 't1', feature 'b': id 7"):
        enqueue_lib.stacked_splits(layout, tf.nest.flatten(bad), flat_weights)
    good, _ = enqueue_lib.stacked_splits(layout, flat, flat_weights)
    again, _ = enqueue_lib.stacked_splits(layout, flat, flat_weights)
    for name in good:
        for a, b in zip(good[name], again[name]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def _splits_op(**overrides):
    args = dict(sample_counts=[4, 4], row_offsets=[0, 4], col_offsets=[0, 8], col_shifts=[0, 1],
                vocabulary_sizes=[8, 8], combiners=["sum", "mean"], table_names=["t0", "t1"],
                feature_names=["f0", "f1"], num_sc_per_chip=2, num_sc_shards=2,
                stacked_table_sample_count=8, num_replica=1, table_vocab_size=16,
                table_name="stacked", max_ids_per_partition=64, max_unique_ids_per_partition=64)
    args.update(overrides)
    ids = tf.constant([0, 1, 2, 3], tf.int32)
    return ops.preprocessing.convert_features_to_minibatch_splits(
        [tf.zeros([0], tf.int32)] * 2, [ids, ids], [tf.constant(1.0)] * 2, **args)


@pytest.mark.parametrize("overrides,match", [
    (dict(table_vocab_size=10), "feature 'f1': id .* outside the rows \\[0, 10\\)"),
    (dict(row_offsets=[0, 0]), "feature 'f1'"),
    (dict(max_ids_per_partition=1, max_unique_ids_per_partition=1, max_division_level=0),
     "too many ids"),
    (dict(stacked_table_sample_count=6), "exceeds stacked_table_sample_count"),
    (dict(num_replica=3), "power of two"),
    (dict(sample_counts=[4]), "N = 2"),
    (dict(table_vocab_size=2 ** 64), "int64"),
])
def test_stacked_splits_rejects_bad_attributes(overrides, match):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=match):
        _splits_op(**overrides)
    _splits_op()   # a failed call leaves nothing behind


def test_stacked_coo_bad_id_names_the_feature():
    feature_config = config()
    layout = layout_of(feature_config)
    features, weights = inputs(seed=3)
    features["c"] = tf.RaggedTensor.from_row_lengths(
        tf.constant([1, 300, 2] + [0] * (B - 3), tf.int32), [1, 2] + [1] * (B - 3) + [0])
    weights["c"] = tf.ones_like(features["c"], tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 't2', feature 'c'"):
        enqueue_lib.stacked_coo(layout, tf.nest.flatten(features), tf.nest.flatten(weights))


def test_stacked_coo_in_tf_function_matches_eager():
    layout = layout_of(config())
    features, weights = inputs(seed=5)
    flat, flat_weights = tf.nest.flatten(features), tf.nest.flatten(weights)
    eager = enqueue_lib.stacked_coo(layout, flat, flat_weights)
    graph = tf.function(lambda f, w: enqueue_lib.stacked_coo(layout, f, w))(flat, flat_weights)
    for name in eager:
        for a, b in zip(eager[name], graph[name]):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_stacked_coo_rejects_mismatched_attribute_lengths():
    ids = tf.constant([0, 1], tf.int32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="N = 1"):
        ops.preprocessing.convert_features_to_stacked_coo_tensor(
            [tf.zeros([0], tf.int32)], [ids], [tf.constant(1.0)], sample_counts=[4, 4],
            row_offsets=[0], col_offsets=[0], col_shifts=[0], vocabulary_sizes=[8],
            combiners=["sum"], table_names=["t"], feature_names=["f"], num_sc_per_chip=2,
            num_sc_shards=2, stacked_table_sample_count=4)


def test_single_replica_running_stats_equal_compute_sparse_core_stats():
    feature_config = config()
    embedding = sce.TPUEmbeddingV2(feature_config, E.SGD(0.1))
    expected = {}
    for seed in range(3):
        features, weights = inputs(seed=seed, weighted=False)
        embedding.enqueue(features)
        max_ids, max_unique = sce.TPUEmbeddingV2.compute_sparse_core_stats(
            features, feature_config, num_tpu_chips=1, optimizer=E.SGD(0.1))
        for name in max_ids:
            old = expected.get(name, (0, 0))
            expected[name] = (max(old[0], int(max_ids[name])),
                              max(old[1], int(max_unique[name])))
    measured = embedding.sparse_core_stats
    assert set(measured) == set(expected)
    for name, (ids, unique) in expected.items():
        assert measured[name]["max_ids_per_partition"] == ids
        assert measured[name]["max_unique_ids_per_partition"] == unique
        assert measured[name]["batches"] == 3


def test_single_replica_enqueue_runs_no_extra_counting_ops():
    embedding = sce.TPUEmbeddingV2(config(), E.SGD(0.1))
    features, weights = inputs(seed=1)
    graph = tf.function(embedding.enqueue).get_concrete_function(features, weights).graph
    types = [op.type for op in graph.get_operations()]
    assert "SceGetStatsFromListOfSparseCoreCooTensors" not in types
    assert "SceConvertToListOfSparseCoreCooTensors" not in types
    # One op per stacked table from the ids to the splits; no COO in between.
    assert "SceConvertFeaturesToStackedCooTensor" not in types
    assert "SceGetMinibatchSplitsWithPhysicalReplica" not in types
    assert types.count("SceConvertFeaturesToMinibatchSplits") == len(
        embedding.plan.stacked_tables)


def test_all_gather_two_replicas_running_stats_equal_compute_sparse_core_stats():
    """The all-gather exchange also computes splits, so its statistics come from them too."""
    require_two_devices()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    feature_config = config()
    with strategy.scope():
        # Statistics cover the sharded tables; small tables would be replicated.
        embedding = sce.TPUEmbeddingV2(feature_config, E.SGD(0.1), exchange="all_gather",
                                       replication_threshold_bytes=0)
    per_replica = [inputs(seed=30, weighted=False)[0], inputs(seed=31, weighted=False)[0]]
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: per_replica[ctx.replica_id_in_sync_group])

    @tf.function
    def step(ids):
        strategy.run(lambda x: embedding(x)[0], args=(ids,))

    step(values)
    want = [sce.TPUEmbeddingV2.compute_sparse_core_stats(ids, feature_config, 2,
                                                         optimizer=E.SGD(0.1))
            for ids in per_replica]
    measured = embedding.sparse_core_stats
    assert set(measured) == set(want[0][0])
    for name, stats in measured.items():
        assert stats["batches"] == 2
        assert stats["max_ids_per_partition"] == max(int(w[0][name]) for w in want)
        assert stats["max_unique_ids_per_partition"] == max(int(w[1][name]) for w in want)


def _stacked_op(**overrides):
    args = dict(sample_counts=[4], row_offsets=[0], col_offsets=[0], col_shifts=[0],
                vocabulary_sizes=[8], combiners=["sum"], table_names=["t"], feature_names=["f"],
                num_sc_per_chip=2, num_sc_shards=2, stacked_table_sample_count=4)
    args.update(overrides)
    return ops.preprocessing.convert_features_to_stacked_coo_tensor(
        [tf.zeros([0], tf.int32)], [tf.constant([0, 1, 2, 3], tf.int32)], [tf.constant(1.0)],
        **args)


@pytest.mark.parametrize("overrides,match", [
    (dict(num_sc_shards=3), "power of two"),
    (dict(row_offsets=[-2]), "must be >= 0"),
    (dict(row_offsets=[2]), "divisible|exceeds"),
    (dict(stacked_table_sample_count=2), "exceeds stacked_table_sample_count"),
    (dict(col_offsets=[2 ** 31 - 2]), "does not fit in int32"),
    (dict(stacked_table_sample_count=2 ** 40), "stacked_table_sample_count"),
    (dict(num_sc_per_chip=2 ** 20), "num_sc_per_chip"),
    (dict(combiners=["max"]), "combiner"),
])
def test_stacked_coo_rejects_bad_attributes(overrides, match):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=match):
        _stacked_op(**overrides)


def test_stacked_coo_single_feature_values():
    rows, cols, gains = _stacked_op(col_offsets=[8], col_shifts=[1])
    # Dense ids 0..3, one per sample; SC 0 holds samples 0-1, SC 1 samples 2-3 (rows are the
    # stacked rows); cols are rotated by 1 within each group of 2 shards, then offset by 8.
    np.testing.assert_array_equal(rows.numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(cols.numpy(), [9, 8, 11, 10])
    np.testing.assert_array_equal(gains.numpy(), [1, 1, 1, 1])


def test_single_replica_update_takes_each_features_gradient_without_a_copy():
    """With one replica the fused update reads every feature's gradient where the user's graph
    left it (docs/optimizers.md#gradient-order): one gradient input per feature, the lookup's
    feature_rows_per_sc, and no concatenation of gradients in the step."""
    feature_config = config(dim=8)
    embedding = sce.TPUEmbeddingV2(feature_config, E.Adagrad(0.1))
    features, weights = inputs(seed=2)
    embedding.build(per_replica_batch_size=B)

    @tf.function
    def step(features, weights):
        activations, preserved = embedding.embedding_lookup(features, weights)
        gradients = tf.nest.map_structure(lambda a: 2.0 * a + 1.0, activations)
        return embedding.apply_gradients(gradients, preserved)

    graph = step.get_concrete_function(features, weights).graph
    updates = [op for op in graph.get_operations()
               if op.type == "SceResourceSparseDenseMatmulGradWithAdagradAndCsrInput"]
    layout = embedding.plan.sharded
    assert len(updates) == len(layout.stacked_tables)
    by_name = {op.get_attr("table_name").decode(): op for op in updates}
    multi_feature = 0
    for name, stacked in layout.stacked_tables.items():
        rows = enqueue_lib.feature_major_rows(layout, stacked)
        op = by_name[name]
        if rows is None:
            assert op.get_attr("N") == 1 and list(op.get_attr("feature_rows_per_sc")) == []
            continue
        multi_feature += 1
        assert op.get_attr("N") == len(stacked.features)
        assert list(op.get_attr("feature_rows_per_sc")) == list(rows)
    assert multi_feature >= 1   # table t0 is looked up by features a and d
    assert "ConcatV2" not in [op.type for op in graph.get_operations()]


def _enqueue_and_dequeue(embedding, features, weights):
    @tf.function
    def run(features, weights):
        preprocessed = embedding.enqueue(features, weights)
        return preprocessed, embedding.dequeue(preprocessed)[0]
    return run, run(features, weights)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_replica_enqueue_groups_and_dequeue_only_sums(dtype):
    """With one replica, enqueue also groups each stacked table's entries by activation row
    (docs/lookup.md#grouping-at-enqueue) and dequeue runs the grouped lookup only: the CSR
    lookup's activations, bit for bit, in the same (feature-major) row order."""
    from tf_sc_embedding.collectives import replica_group as collectives  # noqa: PLC0415
    from tf_sc_embedding.exchanges import all_gather  # noqa: PLC0415
    feature_config = config(dim=8)
    embedding = sce.TPUEmbeddingV2(feature_config, E.Adagrad(0.1),
                                   table_dtypes={f"t{i}": dtype for i in range(3)})
    features, weights = inputs(seed=3)
    embedding.build(per_replica_batch_size=B)
    run, (preprocessed, activations) = _enqueue_and_dequeue(embedding, features, weights)
    types = [op.type for op in run.get_concrete_function(features, weights).graph.get_operations()]
    layout = embedding.plan.sharded
    assert types.count("SceGroupLookupEntries") == len(layout.stacked_tables)
    assert types.count("SceResourceSparseDenseMatmulGrouped") == len(layout.stacked_tables)
    assert "SceResourceSparseDenseMatmulWithCsrInput" not in types
    # The CSR lookup on the same enqueued buffers, in the same row order.
    view = collectives.ReplicaView(embedding.replica_group)
    for name, stacked in layout.stacked_tables.items():
        packed = preprocessed[name]
        assert isinstance(packed.grouped, all_gather.GroupedEntries)
        table = embedding.variables[name][PARAMETERS].shard(0)
        rows = enqueue_lib.feature_major_rows(layout, stacked)
        grouped = all_gather.lookup(view, layout, stacked, packed.csr, table,
                                    feature_rows_per_sc=rows, grouped=packed.grouped)
        from_csr = all_gather.lookup(view, layout, stacked, packed.csr, table,
                                     feature_rows_per_sc=rows)
        np.testing.assert_array_equal(grouped.numpy(), from_csr.numpy())
    # And the embedding_lookup path gives dequeue's activations.
    looked_up = embedding.embedding_lookup(features, weights)[0]
    for path in activations:
        np.testing.assert_array_equal(activations[path].numpy(), looked_up[path].numpy())


def test_quantized_tables_are_not_grouped():
    """A quantized lookup adds in buffer order: its stacked table keeps the CSR lookup."""
    table = E.TableConfig(vocabulary_size=50, dim=4, name="q",
                          quantization_config=E.QuantizationConfig(num_buckets=16, lower=-0.5, upper=0.5))
    embedding = sce.TPUEmbeddingV2({"a": E.FeatureConfig(table=table, name="a")}, E.SGD(0.1))
    embedding.build(per_replica_batch_size=B)
    ids = tf.constant(np.arange(B) % 50, tf.int64)
    run, (preprocessed, _) = _enqueue_and_dequeue(embedding, {"a": ids}, None)
    types = [op.type for op in run.get_concrete_function({"a": ids}, None).graph.get_operations()]
    assert "SceGroupLookupEntries" not in types
    assert "SceResourceSparseDenseMatmulWithCsrInput" in types
    assert all(packed.grouped == () for packed in preprocessed.values())
