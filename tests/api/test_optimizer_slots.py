"""TensorFlow's optimizer slots are bound to the fused ops' slot inputs by name, and the binding is
checked when tf_sc_embedding.optimizers.configs is imported: a rename or a changed slot list in TensorFlow
or in the op library fails loudly; a mere reorder in TensorFlow changes nothing."""
import dataclasses

import pytest
import tensorflow as tf

from tf_sc_embedding.optimizers import configs as optimizers
from tf_sc_embedding.ops import OPTIMIZERS
from tf_sc_embedding.optimizers.row_wise_adagrad import RowWiseAdagrad

E = tf.tpu.experimental.embedding


def test_every_tensorflow_slot_feeds_the_op_input_of_the_same_role():
    expected = {
        E.SGD: {},
        E.Adagrad: {"accumulators": "accumulator"},
        E.AdagradMomentum: {"accumulators": "accumulator", "momenta": "momenta"},
        E.Adam: {"momenta": "momenta", "velocities": "velocity"},
        E.FTRL: {"accumulators": "accumulator", "linears": "linear"},
        RowWiseAdagrad: {"accumulators": "accumulator"},
    }
    for cls, slots in expected.items():
        fused = optimizers.fused_optimizer(cls(learning_rate=0.1), "test", 8)
        assert dict(zip(fused.slot_names, fused.slot_inputs)) == slots, cls.__name__
        assert fused.slot_inputs == OPTIMIZERS[fused.definition_name].slots


def test_import_time_check_passes_for_the_installed_tensorflow():
    optimizers.check_slot_bindings()


class _RenamedAdam(E.Adam):
    def _slot_names(self):
        return ["momenta", "second_moments"]


class _ReorderedAdam(E.Adam):
    """TensorFlow's Adam with its slots listed the other way round (initial values 2 and 1)."""

    def _slot_names(self):
        return ["velocities", "momenta"]

    def _slot_initializers(self):
        return [tf.constant_initializer(2.0), tf.constant_initializer(1.0)]


def test_import_time_check_fails_on_a_renamed_tensorflow_slot():
    bindings = {_RenamedAdam: optimizers._BINDINGS[E.Adam]}
    with pytest.raises(ImportError, match="second_moments"):
        optimizers.check_slot_bindings(bindings)


def test_import_time_check_fails_when_the_op_slots_do_not_match():
    wrong = dataclasses.replace(optimizers._BINDINGS[E.Adam],
                                slots={"momenta": "momenta", "velocities": "variance"})
    with pytest.raises(ImportError, match="velocity"):
        optimizers.check_slot_bindings({E.Adam: wrong})


def test_a_reordered_tensorflow_slot_list_is_matched_by_name(monkeypatch):
    monkeypatch.setitem(optimizers._BINDINGS, _ReorderedAdam, optimizers._BINDINGS[E.Adam])
    config = _ReorderedAdam(learning_rate=0.1, beta_1=0.5)
    fused = optimizers.fused_optimizer(config, "test", 8)
    assert fused.slot_names == ("momenta", "velocities")
    assert fused.slot_inputs == ("momenta", "velocity")
    assert [i.get_config()["value"] for i in fused.slot_initializers] == [1.0, 2.0]


def test_a_config_with_renamed_slots_is_rejected_naming_them(monkeypatch):
    monkeypatch.setitem(optimizers._BINDINGS, _RenamedAdam, optimizers._BINDINGS[E.Adam])
    with pytest.raises(ValueError, match="table 't'.*second_moments"):
        optimizers.fused_optimizer(_RenamedAdam(learning_rate=0.1), "table 't'", 8)


def test_slot_widths_come_from_the_op_library():
    """Row-wise Adagrad's accumulator is one float per row; every other slot is as wide as the
    table (the op library's SlotShape, read through ops.OPTIMIZERS)."""
    row_wise = optimizers.fused_optimizer(RowWiseAdagrad(learning_rate=0.1), "t", 24)
    assert row_wise.slot_width("accumulators", 24) == 1
    assert row_wise.hyperparameters == {"epsilon": 1e-8, "embedding_dim": 24}
    adagrad = optimizers.fused_optimizer(E.Adagrad(learning_rate=0.1), "t", 24)
    assert adagrad.slot_width("accumulators", 24) == 24
    assert OPTIMIZERS["row_wise_adagrad"].row_wise_slots == (True,)
    assert not any(any(d.row_wise_slots) for n, d in OPTIMIZERS.items() if n != "row_wise_adagrad")
