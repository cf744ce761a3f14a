"""Checkpoints of tables trained with row-wise Adagrad: the accumulator is saved as the logical
[vocabulary_size, 1] slot, restores into any replica count before or after build() and training
continues exactly; TensorFlow's serving class reads the tables; a slot of the other shape (an
element-wise Adagrad checkpoint) is refused, naming the table, and nothing is written, unless the
optimizer is changed on purpose (allow_optimizer_change)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.checkpoint import ckpt_lib
from tf_sc_embedding.saving import checkpointing
from tests.checkpoint.test_checkpoint import assert_states_equal
from tests.devices import require_replicas

E = tf.tpu.experimental.embedding
OPTIMIZER = "row_wise_adagrad"


def _trained(replicas, steps):
    strategy, embedding = ckpt_lib.make_embedding(replicas, optimizer=OPTIMIZER)
    ckpt_lib.Trainer(strategy, embedding).run(range(steps))
    return embedding


def test_the_accumulator_is_saved_as_one_value_per_row(tmp_path):
    embedding = _trained(1, 2)
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    shapes = dict(tf.train.list_variables(path))
    for table, vocab in ckpt_lib.VOCAB.items():
        assert shapes[f"embedding/{table}.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE"] == [vocab, 1]
        accumulator = ckpt_lib.state(embedding)[f"{table}/accumulators"]
        assert accumulator.shape == (vocab, 1) and np.any(accumulator != np.float32(0.1))


@pytest.mark.parametrize("build_first", [False, True])
def test_restore_on_two_replicas_continues_exactly(tmp_path, build_first):
    require_replicas(2)
    saved = _trained(2, 2)
    path = tf.train.Checkpoint(embedding=saved).save(str(tmp_path / "ckpt"))
    strategy, restored = ckpt_lib.make_embedding(2, optimizer=OPTIMIZER, build=build_first)
    status = tf.train.Checkpoint(embedding=restored).restore(path)
    if not build_first:
        restored.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // 2)
    status.assert_consumed()
    assert_states_equal(ckpt_lib.state(saved), ckpt_lib.state(restored))
    ckpt_lib.Trainer(strategy, restored).run(range(2, 4))
    assert_states_equal(ckpt_lib.state(_trained(2, 4)), ckpt_lib.state(restored))


def test_restore_into_another_replica_count(tmp_path):
    require_replicas(4)
    saved = _trained(1, 2)
    path = tf.train.Checkpoint(embedding=saved).save(str(tmp_path / "ckpt"))
    strategy, restored = ckpt_lib.make_embedding(4, optimizer=OPTIMIZER, build=False)
    tf.train.Checkpoint(embedding=restored).restore(path).assert_existing_objects_matched()
    restored.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // 4)
    assert_states_equal(ckpt_lib.state(saved), ckpt_lib.state(restored))
    ckpt_lib.Trainer(strategy, restored).run(range(2, 4))
    # Across replica counts cross-replica sums round differently (see test_checkpoint.py).
    assert_states_equal(ckpt_lib.state(_trained(1, 4)), ckpt_lib.state(restored), exact=False)


def test_tensorflow_serving_class_reads_the_tables(tmp_path):
    embedding = _trained(1, 2)
    path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "ckpt"))
    tables = ckpt_lib.table_configs(initializer=lambda name: tf.zeros_initializer())
    features = {f: E.FeatureConfig(table=tables[t], name=f) for f, t in ckpt_lib.FEATURES.items()}
    serving = E.TPUEmbeddingForServing(features, E.SGD(0.1))   # serving needs no slots
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
    expected = ckpt_lib.state(embedding)
    for name, kinds in serving._variables.items():   # noqa: SLF001
        np.testing.assert_array_equal(kinds["parameters"].numpy(), expected[f"{name}/parameters"])


def test_an_element_wise_accumulator_is_refused_naming_the_table(tmp_path):
    strategy, adagrad = ckpt_lib.make_embedding(1, optimizer="adagrad")
    ckpt_lib.Trainer(strategy, adagrad).run(range(1))
    path = tf.train.Checkpoint(embedding=adagrad).save(str(tmp_path / "ckpt"))
    _, embedding = ckpt_lib.make_embedding(1, optimizer=OPTIMIZER)
    before = ckpt_lib.state(embedding)
    with pytest.raises(ValueError, match=r"table '\w+'.*accumulators has shape \[\d+, \d+\].*"
                                         r"\[vocabulary_size, 1\]: the optimizer's slot is "
                                         r"row-wise.*Nothing was restored"):
        tf.train.Checkpoint(embedding=embedding).restore(path)
    assert_states_equal(before, ckpt_lib.state(embedding))


@pytest.mark.parametrize("source,target", [("adagrad", OPTIMIZER), (OPTIMIZER, "adagrad")])
def test_changing_between_element_wise_and_row_wise_adagrad_on_purpose(tmp_path, source,
                                                                       target):
    """Inside allow_optimizer_change() the tables restore and the other optimizer's accumulators
    (same name, other width) keep their initial values, with a warning; training goes on."""
    strategy, saved = ckpt_lib.make_embedding(1, optimizer=source)
    ckpt_lib.Trainer(strategy, saved).run(range(2))
    path = tf.train.Checkpoint(embedding=saved).save(str(tmp_path / "ckpt"))
    strategy, embedding = ckpt_lib.make_embedding(1, optimizer=target)
    initial = ckpt_lib.state(embedding)
    with checkpointing.allow_optimizer_change():
        tf.train.Checkpoint(embedding=embedding).restore(path).expect_partial()
    restored, trained = ckpt_lib.state(embedding), ckpt_lib.state(saved)
    for key in restored:
        expected = trained[key] if key.endswith("/parameters") else initial[key]
        np.testing.assert_array_equal(restored[key], expected, err_msg=key)
    ckpt_lib.Trainer(strategy, embedding).run(range(2, 3))
