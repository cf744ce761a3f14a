"""Prefetching the next batch's lookup (docs/pipelining.md#prefetching-the-next-lookup): a pipelined
step given `next_features` gives the numbers of pipelining without it, bit for bit, and both match
the numpy reference of one-step-stale training; a step given another batch than the one prefetched
for it, or with nothing prefetched (never, or forgotten by a plain lookup or a restore), fails
without writing anything."""
import numpy as np
import pytest
import tensorflow as tf

from tests.api.parity_helpers import (Trainer, assert_close, make_optimizer, num_replicas,
                                      placeholder_targets, random_steps)
from tests.api.test_pipelining import DelayedReference

STEPS = 4


class PrefetchingTrainer(Trainer):
    """A pipelined Trainer whose steps may also take the next step's batch."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, pipeline_execution_with_tensor_core=True, **kwargs)
        self.fill_fn = tf.function(self._fill)

    def _fill(self, features, weights):
        if self.replicas == "none":
            return self.embedding.prefetch(features, weights)
        return self.strategy.run(self.embedding.prefetch, args=(features, weights))

    def prefetch(self, feats):
        """Looks up feats now and keeps it for the next prefetching step."""
        self.fill_fn(*self.inputs(feats, placeholder_targets(feats))[:2])

    def prefetching_step(self, feats, targets, next_feats):
        """One step on feats that prefetches next_feats' lookup; {key: global activations}."""
        return self.step(feats, targets, next_feats)


def raw_state(trainer):
    """Every local shard of every table and slot, read without applying a kept update (reading
    the logical tables would apply it)."""
    return {f"{name}/{kind}/{i}": shard.numpy().copy()
            for name, kinds in trainer.embedding.variables.items()
            for kind, table in kinds.items() for i, shard in enumerate(table.shards)}


def assert_unchanged(trainer, before, where):
    for key, value in raw_state(trainer).items():
        np.testing.assert_array_equal(value, before[key], err_msg=f"{where}: {key}")


def _run(trainer, steps, prefetch):
    """Activations of every step; with prefetch, every step but the last prefetches the next."""
    results = []
    if prefetch:
        trainer.prefetch(steps[0][0])
    for n, (feats, targets) in enumerate(steps):
        if prefetch and n + 1 < len(steps):
            results.append(trainer.prefetching_step(feats, targets, steps[n + 1][0]))
        else:
            results.append(trainer.step(feats, targets))
    return results


@pytest.mark.parametrize("replicas,exchange,optimizer_name,replicated", [
    ("none", "auto", "adagrad", ()),
    pytest.param(2, "all_to_all", "adagrad", (), marks=pytest.mark.slow),
    (2, "all_gather", "adam", ()),
    (2, "all_to_all", "adagrad_momentum", ("small",)),
    pytest.param(4, "all_to_all", "ftrl", ("wide",), marks=pytest.mark.slow),
])
def test_prefetching_gives_the_numbers_of_pipelining_bit_for_bit(replicas, exchange,
                                                                 optimizer_name, replicated):
    optimizer = make_optimizer(optimizer_name)
    steps = random_steps(5, "sum", "ragged", True, num_replicas(replicas), steps=STEPS)
    kwargs = dict(exchange=exchange, replicated=replicated)
    prefetching = PrefetchingTrainer(replicas, optimizer, "sum", "ragged", **kwargs)
    pipelined = Trainer(replicas, optimizer, "sum", "ragged",
                        pipeline_execution_with_tensor_core=True, **kwargs)
    reference = DelayedReference(optimizer)
    got = _run(prefetching, steps, prefetch=True)
    want = _run(pipelined, steps, prefetch=False)
    for n, (feats, targets) in enumerate(steps):
        expected = reference.step(feats, targets)
        for k in expected:
            np.testing.assert_array_equal(got[n][k], want[n][k], err_msg=f"step {n}: '{k}'")
            assert_close(got[n][k], expected[k], f"step {n}: activations of '{k}'")
    reference.flush()
    reference.check_tables(prefetching, "after the last step")
    for name, table in pipelined.logical_tables().items():
        np.testing.assert_array_equal(prefetching.logical_tables()[name], table, err_msg=name)


def test_a_step_given_another_batch_than_the_prefetched_one_fails_and_writes_nothing():
    optimizer = make_optimizer("adagrad")
    trainer = PrefetchingTrainer("none", optimizer, "sum", "ragged")
    reference = DelayedReference(optimizer)
    steps = random_steps(6, "sum", "ragged", True, 1, steps=4)
    reference.step(*steps[0])
    trainer.prefetch(steps[0][0])
    trainer.prefetching_step(*steps[0], steps[1][0])   # prefetches batch 1, keeps update 0
    before = raw_state(trainer)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not the batch prefetched"):
        trainer.prefetching_step(*steps[2], steps[3][0])   # batch 2 is not batch 1
    assert_unchanged(trainer, before, "after the failed step")   # update 0 still kept
    # The prefetch is still there for the right batch, and training goes on correctly.
    for n in (1, 2):
        expected = reference.step(*steps[n])
        acts = trainer.prefetching_step(*steps[n], steps[n + 1][0])
        for k in expected:
            assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
    reference.flush()
    reference.check_tables(trainer, "end")


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_non_finite_step_drops_its_update_and_keeps_the_next_prefetch(replicas):
    """A step whose gradient has a NaN fails (as without prefetching) after its prefetch of the
    next batch was kept: the next step goes on without calling prefetch again."""
    optimizer = make_optimizer("sgd")
    trainer = PrefetchingTrainer(replicas, optimizer, "sum", "ragged")
    reference = DelayedReference(optimizer)
    steps = random_steps(10, "sum", "ragged", True, replicas, steps=4)
    trainer.prefetch(steps[0][0])
    for n, (feats, targets) in enumerate(steps[:3]):
        fails = n == 1
        if fails:
            targets = {k: v.copy() for k, v in targets.items()}
            targets["c"][targets["c"].shape[0] - 1, 0] = np.nan   # the last replica's sample
        expected = reference.step(feats, targets, fails=fails)
        if fails:
            with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'c'"):
                trainer.prefetching_step(feats, targets, steps[n + 1][0])
            continue
        acts = trainer.prefetching_step(feats, targets, steps[n + 1][0])
        for k in expected:
            assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
    reference.flush()
    reference.check_tables(trainer, "end")


def _step_without_prefetch_fails(trainer, feats, targets, next_feats):
    before = raw_state(trainer)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no prefetched lookup"):
        trainer.prefetching_step(feats, targets, next_feats)
    assert_unchanged(trainer, before, "after a step without a prefetch")


def test_a_plain_lookup_forgets_the_prefetch():
    optimizer = make_optimizer("sgd")
    trainer = PrefetchingTrainer("none", optimizer, "sum", "ragged")
    reference = DelayedReference(optimizer)
    steps = random_steps(7, "sum", "ragged", True, 1, steps=4)
    trainer.prefetch(steps[0][0])
    for n, ((feats, targets), next_feats) in enumerate(
            [(steps[0], steps[1][0]), (steps[1], None)]):
        expected = reference.step(feats, targets)
        acts = (trainer.step(feats, targets) if next_feats is None
                else trainer.prefetching_step(feats, targets, next_feats))
        for k in expected:
            assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
    # Step 1 looked batch 1 up without the prefetch of step 0, which is now forgotten (it was
    # read before step 0's update), even for the very batch it holds.
    _step_without_prefetch_fails(trainer, *steps[1], steps[2][0])
    trainer.prefetch(steps[2][0])
    for n in (2, 3):
        expected = reference.step(*steps[n])
        acts = (trainer.prefetching_step(*steps[n], steps[3][0]) if n == 2
                else trainer.step(*steps[n]))
        for k in expected:
            assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
    reference.flush()
    reference.check_tables(trainer, "end")


def test_a_restore_forgets_the_prefetch(tmp_path):
    optimizer = make_optimizer("sgd")
    trainer = PrefetchingTrainer("none", optimizer, "sum", "ragged")
    steps = random_steps(8, "sum", "ragged", True, 1, steps=3)
    checkpoint = tf.train.Checkpoint(embedding=trainer.embedding)
    path = checkpoint.save(str(tmp_path / "ckpt"))
    reference = DelayedReference(optimizer)                 # the initial tables, as saved
    trainer.prefetch(steps[0][0])
    trainer.prefetching_step(*steps[0], steps[1][0])
    trainer.prefetching_step(*steps[1], steps[2][0])        # prefetches batch 2
    checkpoint.restore(path)
    _step_without_prefetch_fails(trainer, *steps[2], steps[0][0])
    trainer.prefetch(steps[2][0])
    expected = reference.step(*steps[2])
    acts = trainer.prefetching_step(*steps[2], steps[0][0])
    for k in expected:
        assert_close(acts[k], expected[k], f"after the restore: activations of '{k}'")


def test_next_features_need_pipelining_and_matching_structures():
    optimizer = make_optimizer("sgd")
    trainer = Trainer("none", optimizer, "sum", "ragged")
    steps = random_steps(9, "sum", "ragged", True, 1, steps=1)
    features, weights, _ = trainer.replica_inputs(*steps[0], 0)
    with pytest.raises(ValueError, match="pipeline_execution_with_tensor_core"):
        trainer.embedding(features, weights, next_features=features)
    with pytest.raises(ValueError, match="next_weights given without next_features"):
        trainer.embedding(features, weights, next_weights=weights)
    with pytest.raises(ValueError, match="prefetch .* needs pipeline_execution_with_tensor_core"):
        trainer.embedding.prefetch(features, weights)
    pipelined = PrefetchingTrainer("none", optimizer, "sum", "ragged")
    with pytest.raises(ValueError, match="next_features must have the same structure"):
        pipelined.embedding(features, weights, next_features={"a1": features["a1"]})
    for change in (lambda t: t[:3], lambda t: tf.cast(t, tf.int32)):   # batch size, dtype
        unlike = dict(features, b=change(features["b"]))
        with pytest.raises(ValueError, match="feature 'b': next_features must be a batch like"):
            pipelined.embedding(features, weights, next_features=unlike)


def test_the_batch_fingerprint_tells_batches_apart():
    from tf_sc_embedding.step.prefetch import batch_fingerprint  # pylint: disable=import-outside-toplevel

    def fingerprint(ids, weights=None, dense=(7, 8)):
        ragged = tf.ragged.constant(ids, tf.int64)
        gains = None if weights is None else tf.ragged.constant(weights, tf.float32)
        sparse = tf.sparse.from_dense(tf.constant([[1, 0], [0, 2]], tf.int64))
        strings = tf.constant(["x", "y"])
        return int(batch_fingerprint([ragged, tf.constant(dense, tf.int32), sparse, strings],
                                     [gains, None, None, None]))

    base = fingerprint([[1, 2], [3]], [[1.0, 2.0], [3.0]])
    assert base == fingerprint([[1, 2], [3]], [[1.0, 2.0], [3.0]])
    assert base != fingerprint([[1], [2, 3]], [[1.0], [2.0, 3.0]])   # same ids, other samples
    assert base != fingerprint([[1, 2], [4]], [[1.0, 2.0], [3.0]])   # one id
    assert base != fingerprint([[1, 2], [3]], [[1.0, 2.0], [3.5]])   # one weight
    assert base != fingerprint([[1, 2], [3]], [[1.0, 2.0], [3.0]], dense=(7, 9))


def test_an_eager_prefetch_starts_a_traced_loop():
    """prefetch() called eagerly records no batch-dependent sizes: the traced steps that follow
    (whose batches have other numbers of ids) read it and go on."""
    optimizer = make_optimizer("adagrad")
    trainer = PrefetchingTrainer("none", optimizer, "sum", "ragged")
    reference = DelayedReference(optimizer)
    steps = random_steps(11, "sum", "ragged", True, 1, steps=4)
    features, weights, _ = trainer.inputs(steps[0][0], placeholder_targets(steps[0][0]))
    trainer.embedding.prefetch(features, weights)
    for n in range(3):
        expected = reference.step(*steps[n])
        acts = trainer.prefetching_step(*steps[n], steps[n + 1][0])
        for k in expected:
            assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
