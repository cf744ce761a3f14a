"""A guard on every bit the multi-replica exchange computes.

The exchange may be rewritten for speed (fewer collectives, fused kernels, other row orders), but
its numbers must not move: after several training steps at 2 and 4 replicas the activations of
every step and every table and slot must hash to what the exchange gave when these hashes were
recorded. A change that is meant to alter them must say so in its commit and record new hashes:
run this file with SCE_PRINT_EXCHANGE_HASHES=1 and paste what it prints.

The library's row loops pick their instruction set at run time (cc/core/vector_isa.h), so hashes
are recorded per instruction set of this machine's CPU; on a CPU whose set has none recorded the
test says so and skips. MirroredStrategy replicas in one process run the same exchange code as
MultiWorkerMirroredStrategy workers (tests/multiworker compares the two).
"""
import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.devices import mirrored_strategy

E = tf.tpu.experimental.embedding
PER_REPLICA_BATCH = 32
STEPS = 4

# (instruction set, replicas, configuration) -> sha256 of every step's activations and of the final
# logical tables and slots (recorded at a9960b5, Intel Xeon with AVX-512; the replicated entry at
# 4e17e65, checked equal to what 1f01a79 gives). With 2 replicas the replicated tables give the
# same bits as sharded ones: each row's two contributions are added in the same order.
EXPECTED = {
    ("avx512", 2, "all_to_all"): "9670209281c6dcc152ffd050f64a99ff479e313f74591192f1d48ff3c21f01fb",
    ("avx512", 4, "all_to_all"): "6f8cac9d574065deed67034d25337c6b6442654e981d3b942eeb7ab5d3d40421",
    ("avx512", 2, "all_gather"): "626efa4fff9883b7699c6cb65baa9aa4826712e60722674b8698e126f10005a9",
    ("avx512", 2, "all_to_all_replicated"):
        "9670209281c6dcc152ffd050f64a99ff479e313f74591192f1d48ff3c21f01fb",
}


def _instruction_set():
    """The widest row-loop instruction set this CPU runs, as cc/core/vector_isa.cc picks it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    if {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= set(flags):
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= set(flags) else "baseline"


def _config():
    rng = np.random.default_rng(7)
    tables, features = [], {}
    for i, (vocab, dim, combiner) in enumerate([(97, 8, "sum"), (300, 16, "mean"),
                                                (41, 16, "sqrtn"), (1000, 8, "mean")]):
        initial = rng.uniform(-0.5, 0.5, size=(vocab, dim)).astype(np.float32)
        tables.append(E.TableConfig(vocabulary_size=vocab, dim=dim, combiner=combiner,
                                    name=f"t{i}", initializer=tf.constant_initializer(initial)))
    for i, table in enumerate(tables):
        features[f"f{i}"] = E.FeatureConfig(table=table, name=f"f{i}")
        features[f"g{i}"] = E.FeatureConfig(table=table, name=f"g{i}")   # two per table: stacking
    return features


def _batches(features, replicas):
    """Per step, per replica: ragged ids with weights (some samples empty, ids repeated)."""
    rng = np.random.default_rng(replicas)
    steps = []
    for _ in range(STEPS):
        per_replica = []
        for _ in range(replicas):
            ids, weights = {}, {}
            for name, feature in features.items():
                lengths = rng.integers(0, 4, size=PER_REPLICA_BATCH)
                values = rng.zipf(1.3, size=int(lengths.sum())) % feature.table.vocabulary_size
                ids[name] = tf.RaggedTensor.from_row_lengths(values.astype(np.int64), lengths)
                weights[name] = tf.RaggedTensor.from_row_lengths(
                    rng.uniform(0.5, 2.0, size=int(lengths.sum())).astype(np.float32), lengths)
            per_replica.append((ids, weights))
        steps.append(per_replica)
    return steps


# Configurations: the exchange option, and for "all_to_all_replicated" two of the four tables held
# whole by every replica (the replicated exchange: local lookup, sparse allreduce of gradients).
PLACEMENTS = {"all_to_all_replicated": {"t0": "replicated", "t2": "replicated"}}


def _digest(replicas, configuration):
    strategy = mirrored_strategy(replicas)
    features = _config()
    exchange = configuration.replace("_replicated", "")
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, E.Adagrad(learning_rate=0.3),
                                       exchange=exchange,
                                       table_placement=PLACEMENTS.get(configuration, {}))
    embedding.build(per_replica_batch_size=PER_REPLICA_BATCH)

    @tf.function
    def step(ids, weights):
        def replica_step(ids, weights):
            activations, preserved = embedding(ids, weights)
            # Exact arithmetic on every instruction set: a scaled copy plus a constant.
            embedding.apply_gradients(
                tf.nest.map_structure(lambda a: a * 0.5 + 0.25, activations), preserved)
            return activations
        return strategy.run(replica_step, args=(ids, weights))

    digest = hashlib.sha256()
    for per_replica in _batches(features, replicas):
        inputs = strategy.experimental_distribute_values_from_function(
            lambda ctx, p=per_replica: p[ctx.replica_id_in_sync_group])
        activations = step(*inputs)
        for name in sorted(activations):
            for value in strategy.experimental_local_results(activations[name]):
                digest.update(np.ascontiguousarray(value.numpy()).tobytes())
    for name, kinds in sorted(embedding.logical_tables(include_slots=True).items()):
        for kind, value in sorted(kinds.items()):
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("replicas,exchange", [(2, "all_to_all"), (4, "all_to_all"),
                                               (2, "all_gather"), (2, "all_to_all_replicated")])
def test_exchange_keeps_every_bit(replicas, exchange):
    key = (_instruction_set(), replicas, exchange)
    got = _digest(replicas, exchange)
    if os.environ.get("SCE_PRINT_EXCHANGE_HASHES"):
        print(f"\n    {key!r}: {got!r},")
    if EXPECTED.get(key) is None:
        pytest.skip(f"no hashes recorded for {key} (this CPU's instruction set); got {got}")
    assert got == EXPECTED[key], (
        f"the {exchange} exchange at {replicas} replicas no longer gives the recorded bits "
        "(see this file's docstring)")
