"""SceMarkTouchedRows (cc/core/touched_rows.h): the rows a fused update writes, marked from its
own CSR inputs, against the reference's touched rows (delta exports, docs/deltas.md)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings

from tests.ops.test_property_lookup import SETTINGS, _touched, csr_cases
from tf_sc_embedding.optimizers.fused_update import UpdateInputs
from tf_sc_embedding.ops.touched_rows import mark_touched_rows


def _inputs(case, input_size=None):
    return UpdateInputs(
        tf.constant(case["row_pointers"], tf.int32), tf.constant(case["sample_ids"], tf.int32),
        tf.constant(case["token_ids"], tf.int32), tf.constant(case["gains"], tf.float32),
        tf.zeros([case["input_size"] if input_size is None else input_size, 1]),
        tf.constant(case["num_minibatches"], tf.int32))


def _attributes(case):
    return dict(num_sparsecores_per_device=case["sc_arg"], num_replica=case["num_replica"])


@settings(max_examples=200, **SETTINGS)
@given(case=csr_cases())
def test_marks_exactly_the_reference_touched_rows(case):
    flags = tf.Variable(np.full(case["table_rows"], 0, np.uint8))
    mark_touched_rows(flags, _inputs(case), "t", _attributes(case))
    np.testing.assert_array_equal(np.flatnonzero(flags.numpy()), _touched(case))
    # Marks add up: a second update's rows join the first's, nothing is cleared.
    flags.assign(np.full(case["table_rows"], 1, np.uint8))
    mark_touched_rows(flags, _inputs(case), "t", _attributes(case))
    assert np.all(flags.numpy() == 1)


def test_flags_of_another_height_fail_naming_the_table_and_change_nothing():
    case = dict(row_pointers=np.array([2] + [8] * 7, np.int32), sample_ids=np.zeros(8, np.int32),
                token_ids=np.array([0, 1] + [2**31 - 1] * 6, np.int32), gains=np.ones(8),
                input_size=1, num_minibatches=1, sc_arg=1, num_replica=1)
    flags = tf.Variable(np.zeros(3, np.uint8))
    mark_touched_rows(flags, _inputs(case), "t", _attributes(case))
    np.testing.assert_array_equal(flags.numpy(), [1, 1, 0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'"):
        bad = tf.Variable(np.zeros(3, np.float32))
        mark_touched_rows(bad, _inputs(case), "video", _attributes(case))
    with pytest.raises(tf.errors.InvalidArgumentError, match="table 'video'.*sample id"):
        mark_touched_rows(flags, _inputs(case, input_size=0), "video", _attributes(case))
    np.testing.assert_array_equal(flags.numpy(), [1, 1, 0])
