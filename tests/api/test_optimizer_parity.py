"""Optimizer behaviour against the references: optimizer variants, weight clipping, per-table
optimizers, callable learning rates and features without a gradient.
"""
import logging

import numpy as np
import pytest

from tests.api import reference_training as rt
from tests.api.parity_helpers import (E, LOSS_SCALE, TABLES, ReferenceRun, Trainer, assert_close,
                                      make_optimizer, random_steps, run_parity)


# --------------------------------------------------------------------------------------------
# Optimizer variants, clipping, per-table optimizers
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer_name,kwargs,replicas", [
    ("adagrad_momentum", dict(use_nesterov=False, beta2=1.0, exponent=2.0), 2),
    ("adam", dict(sum_inside_sqrt=False), 1),
    ("ftrl", dict(multiply_linear_by_learning_rate=True, learning_rate_power=-0.7), 2),
    ("ftrl", dict(l1_regularization_strength=0.0), "none"),
], ids=["adagrad_momentum-plain", "adam-eps_outside_sqrt", "ftrl-multiply_linear", "ftrl-no_l1"])
def test_optimizer_variants(optimizer_name, kwargs, replicas):
    run_parity(optimizer_name, "mean", "ragged", True, replicas, optimizer_kwargs=kwargs)


@pytest.mark.parametrize("optimizer_name,replicas", [("sgd", 2), ("adam", "none"), ("ftrl", 1)])
def test_weight_clipping_is_applied(optimizer_name, replicas):
    """Our choice: clip_weight_min/max clip the new table rows (never the slots)."""
    trainer, reference, _ = run_parity(
        optimizer_name, "sum", "ragged", True, replicas,
        optimizer_kwargs=dict(clip_weight_min=-0.2, clip_weight_max=0.25))
    tables = trainer.logical_tables()
    touched = sorted(reference.touched["big"])
    assert tables["big"][touched].min() >= np.float32(-0.2)
    assert tables["big"][touched].max() <= np.float32(0.25)
    # The clip bounds are actually reached (the test data is large enough to need clipping).
    assert np.isclose(tables["big"][touched], 0.25).any()


def test_per_table_optimizers():
    """Each table uses its own optimizer (different optimizers cannot share a stacked table)."""
    run_parity(None, "sqrtn", "sparse", True, 2, table_optimizers={
        "big": make_optimizer("adagrad"), "small": make_optimizer("sgd"),
        "wide": make_optimizer("ftrl")})


def test_table_optimizer_overrides_global_optimizer():
    run_parity("sgd", "sum", "ragged", False, "none",
               table_optimizers={"small": make_optimizer("adam")})


def test_callable_learning_rate_is_reevaluated_each_step():
    """The learning rate callable reads a variable that changes between steps."""
    run_parity("adagrad", "sum", "ragged", True, 2, learning_rates=[0.1, 0.5, 0.02])


def test_callable_learning_rate_eager():
    """Eagerly, a plain Python callable is called again at every apply_gradients."""
    calls, current = [], {"lr": 0.0}

    def schedule():
        calls.append(1)
        return current["lr"]

    optimizer = E.SGD(learning_rate=schedule)
    trainer = Trainer("none", optimizer, "sum", "ragged", use_function=False)
    reference = ReferenceRun({t.name: optimizer for t in TABLES})
    for step, (feats, targets) in enumerate(random_steps(0, "sum", "ragged", True, 1)):
        lr = current["lr"] = [0.3, 0.1, 0.05][step]
        lrs = {t.name: lr for t in TABLES}
        count = len(calls)
        acts = trainer.step(feats, targets)
        assert len(calls) > count  # re-evaluated
        expected = rt.forward(reference.tables, feats)
        grads = {k: LOSS_SCALE * a + targets[k] for k, a in expected.items()}
        reference.tables, reference.slots = rt.apply_gradients(
            reference.tables, reference.slots, reference.optimizers, feats, grads, lrs)
        for name, value in trainer.logical_tables().items():
            assert_close(value, reference.tables[name], f"step {step}: table {name}")


@pytest.mark.parametrize("replicas", ["none", 2])
def test_none_gradient_means_zeros_with_warning(replicas, caplog):
    """a2 has no gradient: rows it touches still get one optimizer step with G = 0 from it
    (Adam decays their moments), a1's gradient on the shared table still applies."""
    with caplog.at_level(logging.WARNING):
        run_parity("adam", "mean", "ragged", True, replicas, none_gradients=("a2",))
    assert "No gradient for feature 'a2'" in caplog.text
