"""The preprocessing path: `enqueue` inside `tf.data` then `dequeue` in the step is bit-for-bit
`embedding_lookup`, and minibatching (tiny per-partition id limits) loses no id.
"""
import copy

import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding.exchanges import all_gather

from tests.api.parity_helpers import (E, PER_REPLICA_BATCH, TABLES, Trainer, assert_close, loss_of,
                                      make_optimizer, num_replicas, random_steps, run_parity)


# --------------------------------------------------------------------------------------------
# enqueue inside tf.data, dequeue in the step
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,replicas", [("dense", 2), ("ragged", "none"), ("sparse", 1)])
def test_enqueue_in_dataset_map_then_dequeue(kind, replicas):
    """Preprocessing inside `tf.data.Dataset.map` + `dequeue` in the step is bit-for-bit the
    same as `embedding_lookup` in the step (which is checked against the references)."""
    _, _, expected_history = run_parity("adagrad", "mean", kind, True, replicas)
    reference_trainer, _, _ = run_parity("adagrad", "mean", kind, True, replicas)

    trainer = Trainer(replicas, make_optimizer("adagrad"), "mean", kind)
    embedding, n = trainer.embedding, trainer.n
    steps = random_steps(0, "mean", kind, True, n)
    # Elements in the order the distributed iterator hands them out: step-major, then replica.
    elements = [trainer.replica_inputs(feats, targets, r)
                for feats, targets in steps for r in range(n)]

    def generator():
        yield from elements

    spec = tf.nest.map_structure(tf.type_spec_from_value, elements[0])

    def dataset_fn(input_context=None):
        dataset = tf.data.Dataset.from_generator(generator, output_signature=spec)
        return dataset.map(lambda ids, weights, targets: (embedding.enqueue(ids, weights),
                                                          targets))

    def replica_step(preprocessed, targets):
        activations, preserved = embedding.dequeue(preprocessed)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            loss = loss_of(activations, targets)
        embedding.apply_gradients(tape.gradient(loss, activations), preserved)
        return activations

    @tf.function
    def train_step(iterator):
        if replicas == "none":
            return replica_step(*next(iterator))
        return trainer.strategy.run(replica_step, args=next(iterator))

    if replicas == "none":
        iterator = iter(dataset_fn())
    else:
        iterator = iter(trainer.strategy.distribute_datasets_from_function(dataset_fn))
    for step in range(len(steps)):
        acts = trainer.global_values(train_step(iterator))
        for k, value in acts.items():
            np.testing.assert_array_equal(value, expected_history[step][k])
    for name, value in trainer.logical_tables().items():
        np.testing.assert_array_equal(value, reference_trainer.logical_tables()[name])
    for name, slots in trainer.logical_slots().items():
        for s, value in slots.items():
            np.testing.assert_array_equal(value, reference_trainer.logical_slots()[name][s])


# --------------------------------------------------------------------------------------------
# Minibatching
# --------------------------------------------------------------------------------------------

SPARSE_CORES = 4


def at_most_two_samples_per_id_and_sparse_core(steps, seed=1):
    """Rewrites ids so that on every (replica, SparseCore) no id is used by more than 2 samples
    (over all features of its table); ids still repeat across SparseCores and replicas.

    The minibatching limits count (sample, id) pairs per SparseCore and vocabulary division, and
    a single division over the limit is an error (docs/preprocessing.md#minibatch-split-search), so with limits of 2 this is the
    most duplication that can be valid.
    """
    rng = np.random.default_rng(seed)
    specs = {t.name: t for t in TABLES}
    per_sc = PER_REPLICA_BATCH // SPARSE_CORES
    out = []
    for feats, targets in steps:
        feats = copy.deepcopy(feats)
        global_batch = len(next(iter(feats.values())).ids)
        for start in range(0, global_batch, per_sc):  # one (replica, SparseCore) block
            counts = {}
            for f in feats.values():
                pool = list(range(specs[f.table].hot)) + [specs[f.table].vocab - 1]
                used = counts.setdefault(f.table, {})
                for b in range(start, start + per_sc):
                    sample = f.ids[b]
                    for j, i in enumerate(sample):
                        if i in sample[:j]:
                            continue  # the same sample again: counted once
                        if used.get(i, 0) >= 2:
                            free = [x for x in pool if used.get(x, 0) < 2 and x not in sample]
                            i = sample[j] = int(rng.choice(free))
                        used[i] = used.get(i, 0) + 1
        out.append((feats, targets))
    return out


def minibatched(preprocessed):
    """Whether one stacked table's enqueued batch is split into minibatches: a replica's own
    splits, or with one replica the CSR buffers enqueue packed under them."""
    if isinstance(preprocessed, all_gather.PackedCsr):
        return int(preprocessed.csr.num_minibatches) > 1
    return int(preprocessed.splits) != 0


@pytest.mark.parametrize("optimizer_name,kind,replicas", [
    ("adam", "ragged", 2), ("sgd", "sparse", "none"),
    pytest.param("ftrl", "dense", 4, marks=pytest.mark.slow)])
def test_minibatching_gives_identical_results(optimizer_name, kind, replicas):
    """Tiny per-partition limits (2 ids, 2 unique ids) force minibatches; no id may be lost."""
    data = at_most_two_samples_per_id_and_sparse_core
    unlimited, _, unlimited_acts = run_parity(optimizer_name, "sum", kind, True, replicas,
                                              data_filter=data)
    stacked_names = {v.stacked_table_name
                     for v in unlimited.embedding.embedding_layouts.values()}
    config = E.SparseCoreEmbeddingConfig(
        max_ids_per_table={name: 2 for name in stacked_names},
        max_unique_ids_per_table={name: 2 for name in stacked_names})
    limited, _, limited_acts = run_parity(optimizer_name, "sum", kind, True, replicas,
                                          sc_config=config, data_filter=data)
    # The limits did split the batches into minibatches.
    feats, targets = data(random_steps(0, "sum", kind, True, num_replicas(replicas)))[0]
    ids, weights, _ = limited.replica_inputs(feats, targets, 0)
    preprocessed = limited.embedding.enqueue(ids, weights)
    assert any(minibatched(p) for p in preprocessed.values())
    # Same results up to float32 reordering: a sample's ids are accumulated minibatch by
    # minibatch. (Both runs were also checked against the references by run_parity.)
    for step, (a, b) in enumerate(zip(unlimited_acts, limited_acts)):
        for k in a:
            assert_close(b[k], a[k], f"step {step}: activations of '{k}'")
    for name, value in unlimited.logical_tables().items():
        assert_close(limited.logical_tables()[name], value, f"table '{name}'")
    for name, slots in unlimited.logical_slots().items():
        for s, value in slots.items():
            assert_close(limited.logical_slots()[name][s], value, f"slot '{s}' of '{name}'")
