"""The fused update's touched_flags (cc/core/touched_rows.h): the rows an in-place update writes,
marked by the update itself, against the reference's touched rows (delta exports,
docs/deltas.md)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings

from tests.ops.test_property_lookup import SETTINGS, _touched, csr_cases
from tf_sc_embedding.ops.fused_update import fused_update_function

sgd = fused_update_function("sgd")


def _update(case, table, flags, input_size=None, name="t"):
    rows = case["input_size"] if input_size is None else input_size
    return sgd(case["row_pointers"], case["sample_ids"], case["token_ids"],
               np.asarray(case["gains"], np.float32), np.ones([rows, table.shape[1]], np.float32),
               0.1, table, case["num_minibatches"], name,
               num_sparsecores_per_device=case["sc_arg"], num_replica=case["num_replica"],
               touched_flags=flags)


@settings(max_examples=200, **SETTINGS)
@given(case=csr_cases())
def test_marks_exactly_the_rows_the_reference_touches(case):
    table = tf.Variable(np.zeros((case["table_rows"], 2), np.float32))
    flags = tf.Variable(np.zeros(case["table_rows"], np.uint8))
    _update(case, table, flags)
    np.testing.assert_array_equal(np.flatnonzero(flags.numpy()), _touched(case))
    # Marks add up: a second update's rows join the first's, nothing is cleared.
    flags.assign(np.ones(case["table_rows"], np.uint8))
    _update(case, table, flags)
    assert np.all(flags.numpy() == 1)


def test_bad_flags_or_inputs_fail_naming_the_table_and_write_nothing():
    case = dict(row_pointers=np.array([2] + [8] * 7, np.int32), sample_ids=np.zeros(8, np.int32),
                token_ids=np.array([0, 1] + [2**31 - 1] * 6, np.int32),
                gains=np.ones(8, np.float32), input_size=1, num_minibatches=1, sc_arg=1,
                num_replica=1)
    table = tf.Variable(np.zeros((3, 2), np.float32))
    flags = tf.Variable(np.zeros(3, np.uint8))
    _update(case, table, flags)
    np.testing.assert_array_equal(flags.numpy(), [1, 1, 0])
    before = table.numpy()
    for bad in (tf.Variable(np.zeros(4, np.uint8)), tf.Variable(np.zeros(3, np.float32))):
        with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*touched-row"):
            _update(case, table, bad, name="video")
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'"):
        _update(case, table, flags, input_size=0, name="video")   # a sample id out of range
    np.testing.assert_array_equal(flags.numpy(), [1, 1, 0])
    np.testing.assert_array_equal(table.numpy(), before)
    with pytest.raises(ValueError, match="in-place form"):
        _update(case, tf.constant(before), flags)
