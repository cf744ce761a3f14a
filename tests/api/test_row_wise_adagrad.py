"""Row-wise Adagrad (`tf_sc_embedding.RowWiseAdagrad`): one accumulator per row, through the op,
the class on every exchange and replica count, checkpoints, serving and bad configurations.

The numbers are checked against the numpy reference (tests/reference/lookup.py
`row_wise_adagrad_step`, FBGEMM's exact row-wise Adagrad) by the parity harness, which also runs
it in the optimizer x combiner x input kind x replicas cross product (test_training_parity.py).
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tf_sc_embedding import ops
from tests.api import parity_helpers as ph
from tests.devices import require_replicas
from tests.reference import lookup as ref_lookup

E = tf.tpu.experimental.embedding


@pytest.mark.parametrize("replicas,exchange,replicated,pipelining", [
    (2, "all_to_all", (), False),
    (4, "all_to_all", ("small",), False),
    (2, "all_gather", (), False),
    (4, "all_gather", (), True),
    (2, "all_to_all", ("small", "wide"), True),
])
def test_every_exchange_matches_the_numpy_reference(replicas, exchange, replicated, pipelining):
    require_replicas(replicas)
    ph.run_parity("row_wise_adagrad", "mean", "ragged", True, replicas, exchange=exchange,
                  replicated=replicated, pipeline_execution_with_tensor_core=pipelining)


def test_per_table_optimizer_next_to_elementwise_adagrad_and_clipping():
    ph.run_parity("adagrad", "sum", "sparse", False, 2 if len(tf.config.list_logical_devices(
        "CPU")) >= 2 else "none", table_optimizers={
            "wide": sce.RowWiseAdagrad(learning_rate=0.3, initial_accumulator_value=0.0,
                                       epsilon=1e-2, clip_weight_min=-0.2, clip_weight_max=0.25)})


def test_callable_learning_rate():
    ph.run_parity("row_wise_adagrad", "sum", "dense", False, "none",
                  learning_rates=[0.1, 0.02, 0.3])


def test_slot_is_one_float_per_row_everywhere():
    trainer, _, _ = ph.run_parity("row_wise_adagrad", "sum", "dense", False, "none")
    embedding = trainer.embedding
    for name, config in trainer.tables.items():
        slot = embedding.logical_slot(config, "accumulators")
        assert slot.shape == (config.vocabulary_size, 1), name
    for kinds in embedding.storage.stacked_variables().values():
        for shard in kinds["accumulators"].shards:
            assert shard.shape[1] == 1


def _op_inputs(width, rows=16):
    """One SparseCore, one replica: a CSR of three entries on rows 2, 2 and 5."""
    csr = ref_lookup.pack_csr({(0, 0, 0): [(0, 2, 1.0), (1, 2, 0.5), (1, 5, 2.0)]}, 1, 1, 1)
    grads = np.linspace(-1.0, 1.0, 2 * width, dtype=np.float32).reshape(2, width)
    table = np.linspace(0.0, 1.0, rows * width, dtype=np.float32).reshape(rows, width)
    return csr, grads, table


def test_op_functional_form_averages_over_embedding_dim_only():
    width, dim = 8, 6
    csr, grads, table = _op_inputs(width)
    grads[:, dim:] = 3.0   # padding columns: not in the mean (their gradient is 0 in training)
    accumulator = np.full((table.shape[0], 1), 0.1, np.float32)
    new_table, new_acc = ops.xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input(
        *csr, grads, 0.5, table, accumulator, 1, epsilon=1e-3, embedding_dim=dim,
        table_name="t", num_sparsecores_per_device=1)
    expected_table, expected_acc = table.copy(), accumulator.copy()
    for row, g in {2: grads[0] + 0.5 * grads[1], 5: 2.0 * grads[1]}.items():
        w, (a,) = ref_lookup.row_wise_adagrad_step(
            g.astype(np.float32), table[row], [accumulator[row]], 0.5,
            {"epsilon": 1e-3, "embedding_dim": dim}, -np.inf, np.inf)
        expected_table[row], expected_acc[row] = w, a
    np.testing.assert_allclose(new_table.numpy(), expected_table, rtol=1e-6)
    np.testing.assert_allclose(new_acc.numpy(), expected_acc, rtol=1e-6)
    assert new_acc.numpy()[2, 0] != 0.1 and np.all(np.delete(new_acc.numpy(), [2, 5]) == 0.1)


def test_op_rejects_a_table_shaped_slot_and_a_bad_embedding_dim():
    csr, grads, table = _op_inputs(8)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 't'.*slot 'accumulator'.*row-wise slot must be \[16,1\]"):
        ops.xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input(
            *csr, grads, 0.5, table, np.zeros_like(table), 1, epsilon=1e-3, embedding_dim=8,
            table_name="t", num_sparsecores_per_device=1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"table 't'.*embedding_dim must be in \[1, 2\^24\], got 0"):
        ops.xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input(
            *csr, grads, 0.5, table, np.zeros((16, 1), np.float32), 1, epsilon=1e-3,
            embedding_dim=0, table_name="t", num_sparsecores_per_device=1)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="table 't'.*embedding_dim 9 exceeds the table's width 8"):
        ops.xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input(
            *csr, grads, 0.5, table, np.zeros((16, 1), np.float32), 1, epsilon=1e-3,
            embedding_dim=9, table_name="t", num_sparsecores_per_device=1)


@pytest.mark.parametrize("kwargs,message", [
    (dict(learning_rate=0.0), "learning_rate must be a number > 0"),
    (dict(learning_rate=-1.0), "learning_rate must be a number > 0"),
    (dict(epsilon=0.0), "epsilon must be a number > 0"),
    (dict(epsilon=-1e-8), "epsilon must be a number > 0"),
    (dict(initial_accumulator_value=-0.1), "initial_accumulator_value must be a number >= 0"),
    (dict(clip_weight_min=1.0, clip_weight_max=0.0), "clip_weight_min"),
])
def test_bad_hyperparameters_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sce.RowWiseAdagrad(**kwargs)


@pytest.mark.parametrize("attribute,value", [("learning_rate", 0.0), ("epsilon", -1.0)])
def test_embedding_construction_names_the_table_of_a_bad_row_wise_optimizer(attribute, value):
    optimizer = sce.RowWiseAdagrad(learning_rate=0.1)
    setattr(optimizer, attribute, value)   # changed after the config checked it
    table = E.TableConfig(vocabulary_size=8, dim=4, name="video", optimizer=optimizer)
    with pytest.raises(ValueError, match=f"table 'video'.*{attribute} must be a number > 0"):
        sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.Adagrad(0.1))


def test_tables_of_different_dims_do_not_share_a_row_width():
    """dim 6 and dim 8 pad to the same width; row-wise Adagrad averages over each table's own
    dim, so they go to different stacked tables (each with its own embedding_dim); two tables
    of dim 8 share one."""
    optimizer = sce.RowWiseAdagrad(learning_rate=0.1)
    tables = [E.TableConfig(vocabulary_size=8, dim=d, name=name, optimizer=optimizer)
              for name, d in (("t6", 6), ("t8", 8), ("u8", 8))]
    embedding = sce.TPUEmbeddingV2({f"f{i}": E.FeatureConfig(table=t)
                                    for i, t in enumerate(tables)})
    embedding.build(per_replica_batch_size=4)
    stacked = {t.name: s for s in embedding.plan.stacked_tables.values() for t in s.tables}
    assert stacked["t6"].name != stacked["t8"].name
    assert stacked["t8"].name == stacked["u8"].name   # same dim: they still stack
    assert stacked["t6"].optimizer.hyperparameters["embedding_dim"] == 6
