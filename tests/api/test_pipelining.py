"""`pipeline_execution_with_tensor_core=True` (docs/pipelining.md) against the numpy reference run
with the one-step delay: step n looks up tables holding the updates of steps 0..n-2, every update
is applied exactly once and in order, and reads of the tables apply the last kept update first."""
import numpy as np
import pytest
import tensorflow as tf

from tests.api import reference_training as rt
from tests.api.parity_helpers import (LOSS_SCALE, TABLES, Trainer, assert_close, initial_table,
                                      make_optimizer, num_replicas, random_steps)

STEPS = 4


class DelayedReference:
    """The numpy reference of pipelined training: a step's update is applied one step late."""

    def __init__(self, optimizer):
        self.optimizers = {t.name: optimizer for t in TABLES}
        self.tables = {t.name: initial_table(t) for t in TABLES}
        self.slots = {t.name: rt.initial_slots(optimizer, (t.vocab, t.dim)) for t in TABLES}
        self.kept = None

    def _apply(self, feats, grads):
        self.tables, self.slots = rt.apply_gradients(self.tables, self.slots, self.optimizers,
                                                     feats, grads)

    def flush(self):
        if self.kept is not None:
            self._apply(*self.kept)
            self.kept = None

    def step(self, feats, targets, sequential=False, fails=False):
        """Expected activations of one step. sequential: summaries recorded (the kept update,
        then this step's, both now); fails: the step stops at the non-finite check (the kept
        update has been applied, this step's is dropped)."""
        acts = rt.forward(self.tables, feats)
        grads = {k: LOSS_SCALE * a + targets[k] for k, a in acts.items()}
        self.flush()
        if fails:
            return acts
        if sequential:
            self._apply(feats, grads)
        else:
            self.kept = (feats, grads)
        return acts

    def check_tables(self, trainer, where):
        tables, slots = trainer.logical_tables(), trainer.logical_slots()
        for name in self.tables:
            assert_close(tables[name], self.tables[name], f"{where}: table '{name}'")
            for s in self.slots[name]:
                assert_close(slots[name][s], self.slots[name][s], f"{where}: slot '{s}' of {name}")


def _pipelined(optimizer_name):
    """(a one-replica pipelined Trainer, its DelayedReference)."""
    optimizer = make_optimizer(optimizer_name)
    trainer = Trainer("none", optimizer, "sum", "ragged",
                      pipeline_execution_with_tensor_core=True)
    return trainer, DelayedReference(optimizer)


def _train(trainer, reference, steps, where, **step_kwargs):
    for n, (feats, targets) in enumerate(steps):
        expected = reference.step(feats, targets, **step_kwargs)
        acts = trainer.step(feats, targets)
        for k in expected:
            assert_close(acts[k], expected[k], f"{where}, step {n}: activations of '{k}'")


@pytest.mark.parametrize("replicas,exchange,optimizer_name,replicated", [
    ("none", "auto", "adagrad", ()),
    ("none", "auto", "sgd", ()),
    (2, "all_to_all", "adagrad", ()),
    (2, "all_gather", "adam", ()),
    (2, "all_to_all", "adagrad_momentum", ("small",)),
    (4, "all_to_all", "ftrl", ("wide",)),
])
def test_pipelined_training_matches_the_delayed_reference(replicas, exchange, optimizer_name,
                                                          replicated):
    optimizer = make_optimizer(optimizer_name)
    trainer = Trainer(replicas, optimizer, "sum", "ragged", exchange=exchange,
                      replicated=replicated, pipeline_execution_with_tensor_core=True)
    reference = DelayedReference(optimizer)
    steps = random_steps(0, "sum", "ragged", True, num_replicas(replicas), steps=STEPS)
    _train(trainer, reference, steps, "pipelined")
    # Reading the tables applies the kept update of the last step: all STEPS updates.
    reference.flush()
    reference.check_tables(trainer, "after the last step")
    reference.check_tables(trainer, "read again (nothing left to apply)")


def test_pipelining_delays_activations_by_exactly_one_update():
    """The delay is real: the second step's activations differ from sequential training's."""
    optimizer = make_optimizer("sgd")
    steps = random_steps(1, "sum", "ragged", True, 1, steps=2)
    results = []
    for pipelining in (False, True):
        trainer = Trainer("none", optimizer, "sum", "ragged",
                          pipeline_execution_with_tensor_core=pipelining)
        results.append([trainer.step(f, t) for f, t in steps])
    for k in results[0][0]:
        np.testing.assert_array_equal(results[0][0][k], results[1][0][k])   # step 0: same
    assert any(not np.array_equal(results[0][1][k], results[1][1][k]) for k in results[0][1])


def test_apply_pending_gradients_and_restore(tmp_path):
    trainer, reference = _pipelined("adagrad")
    steps = random_steps(2, "sum", "ragged", True, 1, steps=3)
    _train(trainer, reference, steps[:2], "first steps")
    trainer.embedding.apply_pending_gradients()          # explicit flush, then nothing kept
    reference.flush()
    trainer.embedding.apply_pending_gradients()
    reference.check_tables(trainer, "after the flush")
    checkpoint = tf.train.Checkpoint(embedding=trainer.embedding)
    saved = {name: t.copy() for name, t in trainer.logical_tables().items()}
    path = checkpoint.save(str(tmp_path / "ckpt"))
    _train(trainer, reference, steps[2:], "third step")   # keeps an update...
    checkpoint.restore(path)                              # ...that the restore discards
    for name, table in trainer.logical_tables().items():
        np.testing.assert_array_equal(table, saved[name], err_msg=name)


def test_sequential_while_summaries_are_recorded(tmp_path):
    trainer, reference = _pipelined("adagrad")
    steps = random_steps(3, "sum", "ragged", True, 1, steps=4)
    writer = tf.summary.create_file_writer(str(tmp_path))
    record = tf.Variable(False)
    with writer.as_default(), tf.summary.record_if(lambda: record):
        # Decided when the step runs (record_if with a variable): steps 0-1 pipelined, step 2
        # recorded (the kept update, then its own), step 3 pipelined again.
        for n, (feats, targets) in enumerate(steps):
            record.assign(n == 2)
            expected = reference.step(feats, targets, sequential=n == 2)
            acts = trainer.step(feats, targets)
            for k in expected:
                assert_close(acts[k], expected[k], f"step {n}: activations of '{k}'")
    reference.flush()
    reference.check_tables(trainer, "end")

    # Recording known when the step is traced: always sequential, no delay at all.
    sequential, reference = _pipelined("adagrad")
    with writer.as_default(), tf.summary.record_if(True):
        _train(sequential, reference, steps, "recording", sequential=True)
    reference.check_tables(sequential, "recording")


@pytest.mark.parametrize("replicas,replicated", [(1, ()), (2, ()), (2, ("small",))])
def test_failed_step_applies_the_kept_update_once_and_drops_its_own(replicas, replicated):
    # With 2 replicas the non-finite marks are agreed inside the gradient all-to-all; only
    # replica 1's gradient is bad, and both replicas must fail the step alike.
    if replicas == 1:
        trainer, reference = _pipelined("sgd")
    else:
        optimizer = make_optimizer("sgd")
        trainer = Trainer(replicas, optimizer, "sum", "ragged", replicated=replicated,
                          pipeline_execution_with_tensor_core=True)
        reference = DelayedReference(optimizer)
    steps = random_steps(4, "sum", "ragged", True, num_replicas(replicas), steps=4)
    _train(trainer, reference, steps[:1], "step 0")
    feats, targets = steps[1]
    bad = {k: v.copy() for k, v in targets.items()}
    bad["c"][targets["c"].shape[0] - 1, 0] = np.nan   # the last replica's last sample
    reference.step(feats, bad, fails=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'c'"):
        trainer.step(feats, bad)
    _train(trainer, reference, steps[2:], "step 2")
    reference.flush()
    reference.check_tables(trainer, "end")
