"""SparseCore embedding ops that run on CPU.

Function and argument names follow `tensorflow.python.tpu.ops.gen_xla_ops`, so code written for
TensorFlow's (kernel-less outside TPUs) ops ports by changing one import. What TensorFlow reads from
the TPU topology or runtime is an extra keyword argument with a default (4 SparseCores per replica,
1 replica).
"""
from tf_sc_embedding.ops.preprocessing import (
    convert_to_coo_tensor,
    convert_to_list_of_sparse_core_coo_tensors,
    convert_to_sparse_core_csr_wrapped_coo_tensor,
    get_minibatch_splits_with_physical_replica,
    get_minibatches_in_csr_with_physical_replica,
    get_stats_from_list_of_sparse_core_coo_tensors,
    sort_list_of_sparse_core_coo_tensors,
)
from tf_sc_embedding.ops.lookup import (
    group_lookup_entries,
    sparse_dense_matmul_grouped,
    xla_sparse_dense_matmul_with_csr_input,
)
from tf_sc_embedding.ops.fused_update import (
    OPTIMIZERS,
    xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input,
    xla_sparse_dense_matmul_grad_with_adagrad_momentum_and_csr_input,
    xla_sparse_dense_matmul_grad_with_adam_and_csr_input,
    xla_sparse_dense_matmul_grad_with_ftrl_and_csr_input,
    xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input,
    xla_sparse_dense_matmul_grad_with_sgd_and_csr_input,
)

__all__ = [
    "OPTIMIZERS",
    "convert_to_coo_tensor",
    "convert_to_list_of_sparse_core_coo_tensors",
    "convert_to_sparse_core_csr_wrapped_coo_tensor",
    "get_minibatch_splits_with_physical_replica",
    "get_minibatches_in_csr_with_physical_replica",
    "get_stats_from_list_of_sparse_core_coo_tensors",
    "group_lookup_entries",
    "sort_list_of_sparse_core_coo_tensors",
    "sparse_dense_matmul_grouped",
    "xla_sparse_dense_matmul_with_csr_input",
    "xla_sparse_dense_matmul_grad_with_sgd_and_csr_input",
    "xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input",
    "xla_sparse_dense_matmul_grad_with_adagrad_momentum_and_csr_input",
    "xla_sparse_dense_matmul_grad_with_adam_and_csr_input",
    "xla_sparse_dense_matmul_grad_with_ftrl_and_csr_input",
    "xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input",
]
