"""Forward sparse-dense matmul over CSR-wrapped COO buffers (spec §13)."""
from tf_sc_embedding._library import library as _lib
from tf_sc_embedding.ops._variables import handle_of, is_variable


def xla_sparse_dense_matmul_with_csr_input(
        row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains, embedding_table,
        num_minibatches_per_physical_sparse_core, input_size, quantization_config_low,
        quantization_config_high, quantization_config_num_buckets, table_name,
        num_sparsecores_per_device=-1, num_replica=1, name=None):
    """Activations [input_size, dim]: gain-weighted sums of the referenced table rows.

    `embedding_table` is the whole stacked table ([num_shards * rows_per_shard, dim]) as a tensor,
    or a resource variable, which is read in place without a copy.
    """
    kwargs = dict(
        row_pointers=row_pointers, sorted_sample_ids=sorted_sample_ids,
        sorted_token_ids=sorted_token_ids, sorted_gains=sorted_gains,
        num_minibatches_per_physical_sparse_core=num_minibatches_per_physical_sparse_core,
        input_size=input_size, quantization_config_low=quantization_config_low,
        quantization_config_high=quantization_config_high,
        quantization_config_num_buckets=quantization_config_num_buckets, table_name=table_name,
        num_sparsecores_per_device=num_sparsecores_per_device, num_replica=num_replica, name=name)
    if is_variable(embedding_table):
        return _lib.sce_resource_sparse_dense_matmul_with_csr_input(
            embedding_table=handle_of(embedding_table), **kwargs)
    return _lib.sce_xla_sparse_dense_matmul_with_csr_input(embedding_table=embedding_table, **kwargs)
