"""SceRequire (tf_sc_embedding/ops/require.py): the stateless in-step check forwards its values
when every element of the condition holds, fails with the caller's message otherwise, and runs
inside a tf.function whose only use of it is its outputs."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding.ops.require import require


def test_forwards_every_value_unchanged():
    values = [tf.constant([1, 2, 3], tf.int64), tf.constant(["a"]), tf.zeros([2, 0])]
    out = require(tf.constant([True, True]), values, "never")
    for got, want in zip(out, values):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert require(True, [], "never") == []


@pytest.mark.parametrize("condition", [False, [True, False], [[True], [False]]])
def test_fails_with_the_message_when_any_element_is_false(condition):
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'x': bad ids"):
        require(condition, [tf.constant(1)], "feature 'x': bad ids")


def test_an_empty_condition_holds():
    [out] = require(tf.zeros([0], tf.bool), [tf.constant(7)], "never")
    assert int(out) == 7


def test_the_check_runs_in_a_function_and_is_not_stateful():
    @tf.function
    def checked(x):
        [y] = require(tf.reduce_all(x >= 0), [x], "negative")
        return y * 2

    np.testing.assert_array_equal(checked(tf.constant([1, 2])).numpy(), [2, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative"):
        checked(tf.constant([1, -2]))
    graph = checked.get_concrete_function(tf.TensorSpec([None], tf.int32)).graph
    ops = [op for op in graph.get_operations() if op.type == "SceRequire"]
    assert len(ops) == 1 and not ops[0].op_def.is_stateful
