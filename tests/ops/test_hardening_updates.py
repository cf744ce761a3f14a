"""Issue 10, items 3, 5 and 7: the fused update ops reject aliased variables, refuse non-finite
gradients by default (writing nothing), skip and count them on request, and name the table and the
argument in dtype errors of resource variables."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.reference import lookup as ref  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.ops.fused_update import fused_update_function  # noqa: E402

TABLE = "nonfinite_table"
S, C, R, DIM, B_SC = 2, 1, 4, 3, 2  # 2 SparseCores, 2 shards of 4 rows, 2 samples per SC
OPTIMIZER_NAMES = sorted(ops.OPTIMIZERS)
HYPER_DEFAULTS = {
    "use_nesterov": False, "exponent": 2.0, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7,
    "use_sum_inside_sqrt": True, "multiply_linear_by_learning_rate": False, "beta": 0.0,
    "learning_rate_power": -0.5, "l1_regularization_strength": 0.0,
    "l2_regularization_strength": 0.0, "embedding_dim": DIM,
}
# (source SC, minibatch, shard) -> [(sample, token, gain)]. Activation row = sc * B_SC + sample.
SEGMENTS = {(0, 0, 0): [(0, 1, 1.0), (1, 1, 0.5)], (0, 0, 1): [(1, 3, 2.0)],
            (1, 0, 0): [(0, 0, 1.0)], (1, 0, 1): [(0, 2, -1.0), (1, 3, 1.0)]}


def _table_rows_of_activation(row):
    """Rows of the (2-shard) table that activation row `row` contributes to."""
    sc, sample = divmod(row, B_SC)
    return sorted({shard * R + token for (s, _, shard), entries in SEGMENTS.items() if s == sc
                   for (smp, token, _) in entries if smp == sample})


def _inputs(seed=0):
    rp, sa, to, ga = ref.pack_csr(SEGMENTS, S, 1, S * C)
    rng = np.random.default_rng(seed)
    return dict(rp=rp, sa=sa, to=to, ga=ga,
                grads=rng.normal(size=(S * B_SC, DIM)).astype(np.float32),
                table=rng.normal(size=(S * C * R, DIM)).astype(np.float32))


def _slots(name, shape):
    """Initial slots of a table of `shape` (a row-wise slot has one column)."""
    definition = ops.OPTIMIZERS[name]
    return [np.full((shape[0], definition.slot_width(s, shape[1])),
                    0.5 if s in ("accumulator", "velocity") else 0.25, np.float32)
            for s in definition.slots]


def _update(name, d, table, slots, grads=None, gains=None, **kwargs):
    definition = ops.OPTIMIZERS[name]
    hypers = {h: HYPER_DEFAULTS[h] for h, _ in definition.hyperparameters}
    return fused_update_function(name)(
        d["rp"], d["sa"], d["to"], d["ga"] if gains is None else gains,
        d["grads"] if grads is None else grads, np.float32(0.1), table, *slots, np.int32(1),
        table_name=TABLE, num_sparsecores_per_device=S, num_replica=C, **hypers, **kwargs)


def _bits(x):
    return np.asarray(x).view(np.uint32)


def _as_list(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


# ------------------------------------------------------------------------------------------------
# Item 5: non-finite gradients


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_gradient_fails_and_writes_nothing(optimizer, bad):
    d = _inputs()
    grads = d["grads"].copy()
    grads[3, 1] = bad   # activation row 3 = SC 1, sample 1 -> shard 1 row 3
    slots = _slots(optimizer, d["table"].shape)
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    before = [v.numpy().copy() for v in variables]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"table '{TABLE}'.*activation_gradients row 3 .*non-finite.*"
                             r"Nothing was updated"):
        _update(optimizer, d, variables[0], variables[1:], grads=grads)
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(_bits(v.numpy()), _bits(b))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"table '{TABLE}'"):
        _update(optimizer, d, d["table"], slots, grads=grads)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_non_finite_gain_fails(optimizer):
    d = _inputs()
    gains = d["ga"].copy()
    gains[0] = np.nan
    slots = _slots(optimizer, d["table"].shape)
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    before = [v.numpy().copy() for v in variables]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"sorted_gains\[0\] is nan"):
        _update(optimizer, d, variables[0], variables[1:], gains=gains)
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(_bits(v.numpy()), _bits(b))


def test_non_finite_in_unreferenced_row_is_harmless():
    """A NaN in an activation row no id refers to changes nothing and is not an error."""
    d = _inputs()
    rp, sa, to, ga = ref.pack_csr({k: [e for e in v if not (k[0] == 1 and e[0] == 1)]
                                   for k, v in SEGMENTS.items()}, S, 1, S * C)
    d2 = dict(d, rp=rp, sa=sa, to=to, ga=ga)
    grads = d["grads"].copy()
    grads[3, :] = np.nan   # row 3 (SC 1, sample 1) is no longer referenced
    slots = _slots("adagrad", d["table"].shape)
    with_nan = _update("adagrad", d2, d["table"], slots, grads=grads)
    clean = d["grads"].copy()
    clean[3, :] = 0.0
    reference = _update("adagrad", d2, d["table"], slots, grads=clean)
    for a, b in zip(_as_list(with_nan), _as_list(reference)):
        np.testing.assert_array_equal(_bits(a.numpy()), _bits(b.numpy()))


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
def test_skip_mode_skips_and_counts(optimizer):
    d = _inputs()
    grads = d["grads"].copy()
    grads[0, 2] = np.nan   # row 0 = SC 0 sample 0 -> table row 1
    grads[2, 0] = np.inf   # row 2 = SC 1 sample 0 -> table rows 0 and 6
    skipped_rows = sorted(set(_table_rows_of_activation(0) + _table_rows_of_activation(2)))
    assert skipped_rows == [0, 1, 6]
    slots = _slots(optimizer, d["table"].shape)

    # What the finite rows must become: the update with the bad gradient rows zeroed (rows 0, 1
    # and 6 only get contributions from bad rows, so only the skipped rows differ).
    clean = grads.copy()
    clean[0, :] = 0.0
    clean[2, :] = 0.0
    expected = _as_list(_update(optimizer, d, d["table"], slots, grads=clean))
    originals = [d["table"]] + slots

    # Functional form.
    result, count = _update(optimizer, d, d["table"], slots, grads=grads,
                            non_finite_gradients="skip", return_num_skipped_rows=True)
    assert int(count) == len(skipped_rows)
    for got, e, o in zip(_as_list(result), expected, originals):
        want = e.numpy().copy()
        want[skipped_rows] = o[skipped_rows]
        np.testing.assert_array_equal(_bits(got.numpy()), _bits(want))

    # In-place form: same values; skipped rows of the table and every slot bit-identical.
    variables = [tf.Variable(x) for x in originals]
    count = _update(optimizer, d, variables[0], variables[1:], grads=grads,
                    non_finite_gradients="skip", return_num_skipped_rows=True)
    assert int(count) == len(skipped_rows)
    for v, got in zip(variables, _as_list(result)):
        np.testing.assert_array_equal(_bits(v.numpy()), _bits(got.numpy()))
    # Without asking for the count the in-place form keeps returning None eagerly.
    assert _update(optimizer, d, variables[0], variables[1:], grads=grads,
                   non_finite_gradients="skip") is None


def test_skip_mode_in_graph_mode():
    d = _inputs()
    grads = d["grads"].copy()
    grads[3, 0] = np.nan
    table = tf.Variable(d["table"])
    acc = tf.Variable(np.full(d["table"].shape, 0.5, np.float32))

    @tf.function
    def step(g):
        return _update("adagrad", d, table, [acc], grads=g, non_finite_gradients="skip",
                       return_num_skipped_rows=True)

    assert int(step(tf.constant(grads))) == len(_table_rows_of_activation(3))
    skipped = _table_rows_of_activation(3)
    np.testing.assert_array_equal(_bits(table.numpy()[skipped]), _bits(d["table"][skipped]))
    assert np.all(np.isfinite(table.numpy())) and np.all(np.isfinite(acc.numpy()))
    assert int(step(tf.constant(d["grads"]))) == 0


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
def test_finite_inputs_are_bit_identical_in_both_modes(optimizer):
    d = _inputs(seed=3)
    slots = _slots(optimizer, d["table"].shape)
    default = _as_list(_update(optimizer, d, d["table"], slots))
    skip, count = _update(optimizer, d, d["table"], slots, non_finite_gradients="skip",
                          return_num_skipped_rows=True)
    assert int(count) == 0
    for a, b in zip(default, _as_list(skip)):
        np.testing.assert_array_equal(_bits(a.numpy()), _bits(b.numpy()))
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    _update(optimizer, d, variables[0], variables[1:])
    for a, v in zip(default, variables):
        np.testing.assert_array_equal(_bits(a.numpy()), _bits(v.numpy()))


def test_non_finite_gradients_value_is_checked():
    d = _inputs()
    with pytest.raises(ValueError, match="non_finite_gradients must be 'error' or 'skip'"):
        _update("sgd", d, d["table"], [], non_finite_gradients="ignore")


# ------------------------------------------------------------------------------------------------
# Item 3: aliased variables


@pytest.mark.parametrize("optimizer", [n for n in OPTIMIZER_NAMES if ops.OPTIMIZERS[n].slots])
def test_table_passed_as_slot_is_rejected(optimizer):
    d = _inputs()
    definition = ops.OPTIMIZERS[optimizer]
    table = tf.Variable(d["table"])
    others = [tf.Variable(x) for x in _slots(optimizer, d["table"].shape)]
    for i, slot in enumerate(definition.slots):
        slots = list(others)
        slots[i] = table
        before = [v.numpy().copy() for v in [table] + others]
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"table '{TABLE}': the same variable is passed as "
                                 rf"'embedding_table' and '{slot}'"):
            _update(optimizer, d, table, slots)
        for v, b in zip([table] + others, before):
            np.testing.assert_array_equal(_bits(v.numpy()), _bits(b))


def test_two_slots_sharing_a_variable_are_rejected():
    d = _inputs()
    table = tf.Variable(d["table"])
    slot = tf.Variable(np.full(d["table"].shape, 0.25, np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="the same variable is passed as 'momenta' and 'velocity'"):
        _update("adam", d, table, [slot, slot])


def test_aliasing_rejected_in_graph_mode():
    d = _inputs()
    table = tf.Variable(d["table"])

    @tf.function
    def step():
        _update("adagrad", d, table, [table])

    with pytest.raises(tf.errors.InvalidArgumentError, match="the same variable"):
        step()


def test_functional_form_with_one_tensor_twice_is_not_aliased():
    """Tensors are values: the functional form updates copies, so passing one tensor as the table
    and the accumulator gives exactly the result of two equal tensors."""
    d = _inputs()
    shared = tf.constant(np.abs(d["table"]) + 0.5)
    same = _update("adagrad", d, shared, [shared])
    separate = _update("adagrad", d, tf.constant(shared.numpy()), [tf.constant(shared.numpy())])
    for a, b in zip(same, separate):
        np.testing.assert_array_equal(_bits(a.numpy()), _bits(b.numpy()))
    np.testing.assert_array_equal(shared.numpy(), np.abs(d["table"]) + 0.5)


def test_distinct_variables_with_equal_values_are_fine():
    d = _inputs()
    table = tf.Variable(d["table"])
    acc = tf.Variable(d["table"])   # same values, different variable (copy-on-write buffers)
    _update("adagrad", d, table, [acc])
    assert not np.array_equal(table.numpy(), d["table"])


# ------------------------------------------------------------------------------------------------
# Item 7: dtype errors of resource variables name the table and the argument


@pytest.mark.parametrize("which", ["embedding_table", "accumulator"])
def test_dtype_error_names_table_and_argument(which):
    d = _inputs()
    table = tf.Variable(d["table"].astype(np.float64 if which == "embedding_table" else np.float32))
    acc = tf.Variable(np.full(d["table"].shape, 0.5,
                              np.float64 if which == "accumulator" else np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"table '{TABLE}': variable '{which}' must be float32"
                             rf"{', bfloat16 or float16' if which == 'embedding_table' else ''}, "
                             "got double"):
        _update("adagrad", d, table, [acc])


def test_lookup_dtype_error_names_table():
    d = _inputs()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"table '{TABLE}': variable 'embedding_table' must be float32"):
        ops.xla_sparse_dense_matmul_with_csr_input(
            d["rp"], d["sa"], d["to"], d["ga"], tf.Variable(d["table"].astype(np.float64)),
            np.int32(1), S * B_SC, 0.0, 0.0, 0, TABLE, num_sparsecores_per_device=S)
