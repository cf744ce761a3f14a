"""Table layouts do not change the numbers: replicated tables (sparse allreduce) against the
references and the sharded path, and stacked against unstacked tables.
"""
import numpy as np
import pytest

from tests.api.parity_helpers import E, TABLES, run_parity


@pytest.mark.parametrize("optimizer_name,combiner,kind,replicas,replicated", [
    ("adagrad", "sum", "ragged", 2, ("big", "small", "wide")),
    ("adam", "mean", "sparse", 4, ("small",)),
    ("ftrl", "sqrtn", "dense", 2, ("wide",)),
    # Eight replicas take over a minute on a slow 2-core machine: the CI's slow step.
    pytest.param("sgd", "mean", "ragged", 8, ("big", "wide"), marks=pytest.mark.slow),
], ids=["all_replicated-2", "small_replicated-4", "wide_replicated-2", "two_replicated-8"])
def test_replicated_tables_train_like_the_references(optimizer_name, combiner, kind, replicas,
                                                    replicated):
    """Replicated tables (whole on every replica, sparse allreduce of the touched rows) give the
    numbers of both references, alone or mixed with sharded tables in one embedding."""
    trainer, _, _ = run_parity(optimizer_name, combiner, kind, True, replicas,
                               replicated=replicated)
    plan = trainer.embedding.placement_plan
    assert {t for t, p in plan.items() if p == "replicated"} == set(replicated)


@pytest.mark.parametrize("optimizer_name,combiner,replicas", [
    ("adagrad", "sum", 2), ("adam", "mean", 4), ("ftrl", "sqrtn", 2)])
def test_replicated_tables_equal_the_sharded_path_to_1e6(optimizer_name, combiner, replicas):
    """The sparse allreduce of replicated tables and the all-to-all of sharded ones differ only in
    the order of float32 sums: activations, tables and slots agree to 1e-6 relative."""
    sharded, _, sharded_acts = run_parity(optimizer_name, combiner, "ragged", True, replicas)
    replicated, _, replicated_acts = run_parity(optimizer_name, combiner, "ragged", True,
                                                replicas, replicated=tuple(t.name for t in TABLES))
    assert set(replicated.embedding.placement_plan.values()) == {"replicated"}
    assert set(sharded.embedding.placement_plan.values()) == {"sharded"}
    close = dict(rtol=1e-6, atol=1e-7)
    for step, (a, b) in enumerate(zip(replicated_acts, sharded_acts)):
        for k in b:
            np.testing.assert_allclose(a[k], b[k], err_msg=f"step {step}, {k}", **close)
    for name, value in sharded.logical_tables().items():
        np.testing.assert_allclose(replicated.logical_tables()[name], value, err_msg=name,
                                   **close)
    for name, slots in sharded.logical_slots().items():
        for slot, value in slots.items():
            np.testing.assert_allclose(replicated.logical_slots()[name][slot], value,
                                       err_msg=f"{name}/{slot}", **close)


@pytest.mark.parametrize("replicas", [1, 2])
def test_stacked_and_unstacked_tables_give_identical_results(replicas):
    stacked, _, stacked_acts = run_parity("adagrad", "mean", "ragged", True, replicas)
    unstacked, _, unstacked_acts = run_parity(
        "adagrad", "mean", "ragged", True, replicas,
        sc_config=E.SparseCoreEmbeddingConfig(disable_table_stacking=True))
    # The configs really differ: big and small share one stacked table only when stacking.
    names = lambda t: {k: v.stacked_table_name for k, v in t.embedding.embedding_layouts.items()}
    assert names(stacked)["big"] == names(stacked)["small"]
    assert len(set(names(unstacked).values())) == len(TABLES)
    for a, b in zip(stacked_acts, unstacked_acts):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    for name, value in stacked.logical_tables().items():
        np.testing.assert_array_equal(value, unstacked.logical_tables()[name])
    for name, slots in stacked.logical_slots().items():
        for s, value in slots.items():
            np.testing.assert_array_equal(value, unstacked.logical_slots()[name][s])
