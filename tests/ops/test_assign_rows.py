"""SceAssignRows (tf_sc_embedding.ops.assign_rows): whole rows written in place, checked first."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding.ops.assign_rows import assign_rows


def test_writes_rows_in_place_and_leaves_the_rest():
    variable = tf.Variable(np.arange(20, dtype=np.float32).reshape(5, 4))
    handle_before = variable.handle
    assign_rows(variable, tf.constant([3, 0, 3], tf.int32),
                tf.constant([[9, 9, 9], [7, 7, 7], [8, 8, 8]], tf.float32), "t")
    want = np.arange(20, dtype=np.float32).reshape(5, 4)
    want[0, :3] = 7
    want[3, :3] = 8   # a repeated row takes its last values; column 3 keeps its value
    np.testing.assert_array_equal(variable.numpy(), want)
    assert variable.handle is handle_before


def test_sixteen_bit_variables_round_to_nearest():
    for dtype in (tf.bfloat16, tf.float16):
        variable = tf.Variable(tf.zeros([2, 2], dtype))
        value = np.float32(1.0 + 2.0 ** -10 + 2.0 ** -12)
        assign_rows(variable, tf.constant([1], tf.int32), tf.constant([[value, -3.0]]), "t")
        np.testing.assert_array_equal(variable.numpy().astype(np.float32)[1],
                                      tf.cast(tf.constant([value, -3.0]), dtype).numpy()
                                      .astype(np.float32))


def test_inside_a_function_and_with_no_rows():
    variable = tf.Variable(tf.ones([3, 2]))

    @tf.function
    def write_nothing():
        assign_rows(variable, tf.zeros([0], tf.int32), tf.zeros([0, 2]), "t")

    write_nothing()
    np.testing.assert_array_equal(variable.numpy(), np.ones([3, 2]))


@pytest.mark.parametrize("rows,values,match", [
    ([0, 3], [[1.0], [2.0]], "row 3 \\(entry 1\\) is outside the variable's 3 rows"),
    ([-1], [[1.0]], "row -1"),
    ([0], [[1.0, 2.0, 3.0]], "values have 3 columns, the variable only 2"),
])
def test_bad_rows_fail_naming_the_table_and_write_nothing(rows, values, match):
    variable = tf.Variable(tf.ones([3, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'users': " + match):
        assign_rows(variable, tf.constant(rows, tf.int32), tf.constant(values), "users")
    np.testing.assert_array_equal(variable.numpy(), np.ones([3, 2]))


def test_shape_mismatch_fails():
    variable = tf.Variable(tf.ones([3, 2]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        assign_rows(variable, tf.constant([0, 1], tf.int32), tf.constant([[1.0, 1.0]]), "t")
