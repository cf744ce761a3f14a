"""Parity across input forms and execution modes: nested feature structures, int32/int64 ids, eager
single-replica steps, and building lazily from the first lookup.
"""
import pytest
import tensorflow as tf

from tests.api.parity_helpers import KINDS, run_parity


@pytest.mark.parametrize("replicas", ["none", 2])
def test_nested_feature_structures(replicas):
    """Features, weights and activations as a dict of lists of tuples."""
    template = {"x": [("a1", "a2"), ("b",)], "y": ["c"]}
    run_parity("adagrad", "sqrtn", "ragged", True, replicas, template=template)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("kind", KINDS)
def test_id_dtypes(dtype, kind):
    run_parity("sgd", "mean", kind, True, 2, dtype=dtype)


@pytest.mark.parametrize("replicas", ["none", 1])
def test_eager_single_replica(replicas):
    run_parity("ftrl", "mean", "sparse", True, replicas, use_function=False)


# --------------------------------------------------------------------------------------------
# Regression tests of library bugs found by this suite
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas", ["none"])
def test_lazy_build_from_first_lookup(replicas):
    run_parity("sgd", "sum", "dense", False, replicas, build=False)
