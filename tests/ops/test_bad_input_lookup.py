"""Bad inputs to the lookup and fused-update ops (docs/lookup.md#invalid-inputs): each fails with InvalidArgumentError
naming the table, without crashing, and a failing in-place step leaves the table and every slot
variable bit-for-bit unchanged. Also: in-place updates are copy-on-write for held tensors."""
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.reference import lookup as ref  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.ops.fused_update import fused_update_function  # noqa: E402

TABLE = "bad_table_x"
S, C, R, DIM, B_SC = 2, 1, 4, 3, 2  # 2 SparseCores, 2 shards of 4 rows, 2 samples per SC

# Default hyperparameters per op attribute name (valid values).
HYPER_DEFAULTS = {
    "use_nesterov": False, "exponent": 2.0, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7,
    "use_sum_inside_sqrt": True, "multiply_linear_by_learning_rate": False, "beta": 0.0,
    "learning_rate_power": -0.5, "l1_regularization_strength": 0.0,
    "l2_regularization_strength": 0.0, "embedding_dim": DIM,
}


def _valid_inputs():
    segments = {(0, 0, 0): [(0, 1, 1.0), (1, 1, 0.5)], (0, 0, 1): [(1, 3, 2.0)],
                (1, 0, 0): [(0, 0, 1.0)], (1, 0, 1): [(0, 2, -1.0), (1, 3, 1.0)]}
    rp, sa, to, ga = ref.pack_csr(segments, S, 1, S * C)
    rng = np.random.default_rng(0)
    return dict(
        row_pointers=rp, sorted_sample_ids=sa, sorted_token_ids=to, sorted_gains=ga,
        activation_gradients=rng.normal(size=(S * B_SC, DIM)).astype(np.float32),
        learning_rate=np.float32(0.1),
        table=rng.normal(size=(S * C * R, DIM)).astype(np.float32),
        num_minibatches=np.int32(1),
        attrs=dict(num_sparsecores_per_device=S, num_replica=C),
        clip=None, quantization=(0.0, 0.0, 0),
    )


def _slot_shape(definition, name, table_shape):
    """A slot's valid shape: the table's, or [rows, 1] for a row-wise slot (a table that is not
    a matrix, itself a bad input, gets slots of its own shape)."""
    if len(table_shape) != 2:
        return table_shape
    return (table_shape[0], definition.slot_width(name, table_shape[1]))


def _slot_value(name, shape):
    return np.full(shape, 0.5 if name in ("accumulator", "velocity") else 0.25, np.float32)


def _slots(definition, table_shape):
    return [_slot_value(s, _slot_shape(definition, s, table_shape)) for s in definition.slots]


# Mutations: name -> function(inputs dict) modifying it in place. `kinds` says which ops see the
# input ("fwd" = lookup, "upd" = fused update).
def _set(key, index, value):
    def mutate(d):
        d[key] = d[key].copy()
        d[key][index] = value
    return mutate


def _decreasing(d):
    d["row_pointers"] = d["row_pointers"].copy()
    assert d["row_pointers"][1] >= 8
    d["row_pointers"][1] = 1   # below the 8-aligned start of its segment and below row_pointers[0]


def _past_end(d):
    n = len(d["sorted_token_ids"])
    d["row_pointers"] = d["row_pointers"].copy()
    d["row_pointers"][S * 8 - 1:] = n + 3


def _truncate_ids(d):
    for k in ("sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
        d[k] = d[k][:-9]


def _truncate(key, n):
    def mutate(d):
        d[key] = d[key][:n]
    return mutate


def _reshape(key, shape):
    def mutate(d):
        d[key] = np.reshape(d[key], shape)
    return mutate


def _attr(key, value):
    def mutate(d):
        d["attrs"] = dict(d["attrs"], **{key: value})
    return mutate


def _table_rows_not_divisible(d):
    d["table"] = np.concatenate([d["table"], d["table"][:1]])


def _grad_width(d):
    d["activation_gradients"] = np.zeros((S * B_SC, DIM + 1), np.float32)


def _grad_rows_not_divisible(d):
    d["activation_gradients"] = np.zeros((S * B_SC + 1, DIM), np.float32)


def _set_value(key, value):
    def mutate(d):
        d[key] = value
    return mutate


BAD_CSR = {
    "row_pointers_decreasing": _decreasing,
    "row_pointers_past_ids": _past_end,
    "ids_shorter_than_row_pointers": _truncate_ids,
    "row_pointers_too_short": _truncate("row_pointers", S * 8 - 1),
    "first_row_pointer_negative": _set("row_pointers", 0, -1),
    "token_id_eq_rows_per_shard": _set("sorted_token_ids", 0, R),
    "token_id_negative": _set("sorted_token_ids", 0, -2),
    "sample_id_negative": _set("sorted_sample_ids", 0, -1),
    "sample_id_too_large": _set("sorted_sample_ids", 0, B_SC),
    "gains_shorter": _truncate("sorted_gains", -1),
    "sample_ids_shorter": _truncate("sorted_sample_ids", -1),
    "token_ids_longer": lambda d: d.update(sorted_token_ids=np.concatenate(
        [d["sorted_token_ids"], np.int32([0])])),
    "row_pointers_rank_2": _reshape("row_pointers", (1, -1)),
    "sample_ids_rank_2": _reshape("sorted_sample_ids", (2, -1)),
    "gains_rank_0": _set_value("sorted_gains", np.float32(1.0)),
    "minibatches_zero": _set_value("num_minibatches", np.int32(0)),
    "minibatches_too_many": _set_value("num_minibatches", np.int32(2)),
    "minibatches_not_scalar": _set_value("num_minibatches", np.int32([1, 1])),
    "minibatches_shape_1": _set_value("num_minibatches", np.int32([1])),
    "table_rows_not_divisible": _table_rows_not_divisible,
    "num_sc_not_power_of_two": _attr("num_sparsecores_per_device", 3),
    "num_sc_zero": _attr("num_sparsecores_per_device", 0),
    "num_sc_minus_two": _attr("num_sparsecores_per_device", -2),
    "num_replica_zero": _attr("num_replica", 0),
}

BAD_UPDATE_ONLY = {
    "grad_wrong_width": _grad_width,
    "grad_rows_not_divisible_by_sc": _grad_rows_not_divisible,
    "grad_rank_1": lambda d: d.update(activation_gradients=d["activation_gradients"][:, 0]),
    "grad_rank_3": _reshape("activation_gradients", (S * B_SC, DIM, 1)),
    "learning_rate_vector": _set_value("learning_rate", np.float32([0.1, 0.2])),
    "learning_rate_shape_1": _set_value("learning_rate", np.float32([0.1])),
    "learning_rate_empty": _set_value("learning_rate", np.zeros([0], np.float32)),
    "learning_rate_matrix": _set_value("learning_rate", np.float32([[0.1, 0.2], [0.3, 0.4]])),
    "clip_min_above_max": _set_value("clip", (1.0, -1.0)),
    "table_rank_1": lambda d: d.update(table=d["table"].reshape(-1)),
}

BAD_FORWARD_ONLY = {
    "quantization_one_bucket": _set_value("quantization", (-1.0, 1.0, 1)),
    "quantization_low_eq_high": _set_value("quantization", (1.0, 1.0, 4)),
    "quantization_low_above_high": _set_value("quantization", (2.0, 1.0, 4)),
    "quantization_nan_bound": _set_value("quantization", (float("nan"), 1.0, 4)),
    "input_size_not_divisible_by_sc": _set_value("input_size", S * B_SC + 1),
    "table_rank_1": lambda d: d.update(table=d["table"].reshape(-1)),
}


def _assert_names_table(error):
    assert f"'{TABLE}'" in str(error.value.message), error.value.message


def _forward(d, table):
    q = d["quantization"]
    return ops.xla_sparse_dense_matmul_with_csr_input(
        d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"],
        table, d["num_minibatches"], d.get("input_size", S * B_SC), q[0], q[1], q[2], TABLE,
        **d["attrs"])


def _update(name, d, table, slots):
    definition = ops.OPTIMIZERS[name]
    hypers = {h: HYPER_DEFAULTS[h] for h, _ in definition.hyperparameters}
    kwargs = dict(hypers, **d["attrs"])
    if d["clip"] is not None:
        kwargs.update(clip_weight_min=d["clip"][0], clip_weight_max=d["clip"][1])
    return fused_update_function(name)(
        d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"],
        d["activation_gradients"], d["learning_rate"], table, *slots, d["num_minibatches"],
        table_name=TABLE, **kwargs)


def test_valid_inputs_pass():
    """Sanity: the unmodified inputs are accepted by every op and form."""
    d = _valid_inputs()
    _forward(d, d["table"])
    _forward(d, tf.Variable(d["table"]))
    for name, definition in ops.OPTIMIZERS.items():
        slots = _slots(definition, d["table"].shape)
        _update(name, d, d["table"], slots)
        variables = [tf.Variable(x) for x in [d["table"]] + slots]
        _update(name, d, variables[0], variables[1:])
        assert not np.array_equal(variables[0].numpy(), d["table"])


@pytest.mark.parametrize("mutation", sorted({**BAD_CSR, **BAD_FORWARD_ONLY}))
def test_forward_rejects(mutation):
    d = _valid_inputs()
    {**BAD_CSR, **BAD_FORWARD_ONLY}[mutation](d)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _forward(d, d["table"])
    _assert_names_table(error)
    var = tf.Variable(d["table"])
    before = var.numpy().copy()
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _forward(d, var)
    _assert_names_table(error)
    np.testing.assert_array_equal(var.numpy(), before)


@pytest.mark.parametrize("optimizer", sorted(ops.OPTIMIZERS))
@pytest.mark.parametrize("mutation", sorted({**BAD_CSR, **BAD_UPDATE_ONLY}))
def test_update_rejects_and_leaves_variables_unchanged(optimizer, mutation):
    d = _valid_inputs()
    {**BAD_CSR, **BAD_UPDATE_ONLY}[mutation](d)
    definition = ops.OPTIMIZERS[optimizer]
    slots = _slots(definition, d["table"].shape)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _update(optimizer, d, d["table"], slots)
    _assert_names_table(error)
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    before = [v.numpy().copy() for v in variables]
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        _update(optimizer, d, variables[0], variables[1:])
    _assert_names_table(error)
    for v, b in zip(variables, before):
        np.testing.assert_array_equal(v.numpy().view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("optimizer", [n for n, d in sorted(ops.OPTIMIZERS.items()) if d.slots])
@pytest.mark.parametrize("which", ["rows", "cols", "rank"])
def test_slot_shape_mismatch(optimizer, which):
    d = _valid_inputs()
    definition = ops.OPTIMIZERS[optimizer]
    for bad_index in range(len(definition.slots)):
        slots = []
        for i, name in enumerate(definition.slots):
            shape = _slot_shape(definition, name, d["table"].shape)
            if i == bad_index:
                shape = {"rows": (shape[0] + 2, shape[1]), "cols": (shape[0], shape[1] + 1),
                         "rank": (shape[0] * shape[1],)}[which]
            slots.append(_slot_value(name, shape))
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            _update(optimizer, d, d["table"], slots)
        _assert_names_table(error)
        assert definition.slots[bad_index] in str(error.value.message)
        variables = [tf.Variable(x) for x in [d["table"]] + slots]
        before = [v.numpy().copy() for v in variables]
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            _update(optimizer, d, variables[0], variables[1:])
        _assert_names_table(error)
        for v, b in zip(variables, before):
            np.testing.assert_array_equal(v.numpy().view(np.uint32), b.view(np.uint32))


def test_mixing_variables_and_tensors_is_a_type_error():
    d = _valid_inputs()
    slots = [_slot_value("accumulator", d["table"].shape)]
    with pytest.raises(TypeError, match=TABLE):
        _update("adagrad", d, tf.Variable(d["table"]), slots)


def test_failing_step_after_good_step_keeps_good_state():
    """A valid step changes the variables; a following invalid one changes nothing more."""
    d = _valid_inputs()
    slots = _slots(ops.OPTIMIZERS["adam"], d["table"].shape)
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    _update("adam", d, variables[0], variables[1:])
    after_good = [v.numpy().copy() for v in variables]
    bad = dict(d)
    BAD_CSR["token_id_eq_rows_per_shard"](bad)
    with pytest.raises(tf.errors.InvalidArgumentError):
        _update("adam", bad, variables[0], variables[1:])
    for v, b in zip(variables, after_good):
        np.testing.assert_array_equal(v.numpy(), b)


# ------------------------------------------------------------------------------------------------
# Copy-on-write: tensors read from a variable before an in-place update keep their values.
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("optimizer", sorted(ops.OPTIMIZERS))
@pytest.mark.parametrize("hold", ["read_value", "identity", "convert"])
def test_in_place_update_is_copy_on_write(optimizer, hold):
    d = _valid_inputs()
    definition = ops.OPTIMIZERS[optimizer]
    slots = _slots(definition, d["table"].shape)
    variables = [tf.Variable(x) for x in [d["table"]] + slots]
    holders = {"read_value": lambda v: v.read_value(), "identity": tf.identity,
               "convert": tf.convert_to_tensor}
    held = [holders[hold](v) for v in variables]
    held_np = [h.numpy().copy() for h in held]
    functional = _update(optimizer, d, d["table"], slots)
    functional = functional if isinstance(functional, (list, tuple)) else [functional]
    _update(optimizer, d, variables[0], variables[1:])
    for h, before in zip(held, held_np):
        np.testing.assert_array_equal(h.numpy(), before)   # the held tensors did not change
    for v, f in zip(variables, functional):
        np.testing.assert_array_equal(v.numpy(), f.numpy())  # the variables did


def test_copy_on_write_in_graph_mode():
    d = _valid_inputs()
    var = tf.Variable(d["table"])
    acc = tf.Variable(np.full(d["table"].shape, 0.5, np.float32))

    @tf.function
    def step():
        old = var.read_value()
        old_acc = tf.identity(acc)
        _update("adagrad", d, var, [acc])
        return old, old_acc, var.read_value()

    old, old_acc, new = step()
    np.testing.assert_array_equal(old.numpy(), d["table"])
    np.testing.assert_array_equal(old_acc.numpy(), np.full(d["table"].shape, 0.5, np.float32))
    assert not np.array_equal(new.numpy(), d["table"])
    np.testing.assert_array_equal(var.numpy(), new.numpy())


def test_functional_form_does_not_modify_inputs():
    d = _valid_inputs()
    table = tf.constant(d["table"])
    acc = tf.constant(np.full(d["table"].shape, 0.5, np.float32))
    table_np, acc_np = table.numpy().copy(), acc.numpy().copy()
    new_table, new_acc = _update("adagrad", d, table, [acc])
    np.testing.assert_array_equal(table.numpy(), table_np)
    np.testing.assert_array_equal(acc.numpy(), acc_np)
    assert not np.array_equal(new_table.numpy(), table_np)
    assert math.isfinite(float(np.sum(new_acc.numpy())))
