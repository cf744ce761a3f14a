"""Forward sparse-dense matmul over CSR-wrapped COO buffers (docs/lookup.md#forward-lookup)."""
from tf_sc_embedding._library import library as _lib
from tf_sc_embedding.ops._variables import handle_of, is_variable


def xla_sparse_dense_matmul_with_csr_input(
        row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains, embedding_table,
        num_minibatches_per_physical_sparse_core, input_size, quantization_config_low,
        quantization_config_high, quantization_config_num_buckets, table_name,
        num_sparsecores_per_device=-1, num_replica=1, num_source_replicas=1, first_local_shard=0,
        num_local_shards=-1, feature_rows_per_sc=(), name=None):
    """Activations [input_size, dim]: gain-weighted sums of the referenced table rows.

    `embedding_table` is the whole stacked table ([num_shards * rows_per_shard, dim]) as a tensor,
    or a resource variable, which is read in place without a copy.

    For data-parallel training, the CSR buffers of `num_source_replicas` replicas may be passed
    concatenated (all-gathered); the activations of all of them are returned, one block after the
    other. A table that holds only shards [first_local_shard, first_local_shard +
    num_local_shards) contributes only the rows it holds; summing the partial activations of all
    shard owners gives the full result.

    `feature_rows_per_sc` (not in TensorFlow's signature) changes the order of the rows: when
    given, each SparseCore's samples are cut into consecutive features of these sizes and every
    replica's block is written feature-major, so each feature's rows are contiguous
    (docs/lookup.md#activation-row-order). Empty keeps TensorFlow's order.
    """
    kwargs = dict(
        row_pointers=row_pointers, sorted_sample_ids=sorted_sample_ids,
        sorted_token_ids=sorted_token_ids, sorted_gains=sorted_gains,
        num_minibatches_per_physical_sparse_core=num_minibatches_per_physical_sparse_core,
        input_size=input_size, quantization_config_low=quantization_config_low,
        quantization_config_high=quantization_config_high,
        quantization_config_num_buckets=quantization_config_num_buckets, table_name=table_name,
        num_sparsecores_per_device=num_sparsecores_per_device, num_replica=num_replica,
        num_source_replicas=num_source_replicas, first_local_shard=first_local_shard,
        num_local_shards=num_local_shards, feature_rows_per_sc=list(feature_rows_per_sc),
        name=name)
    if is_variable(embedding_table):
        return _lib.sce_resource_sparse_dense_matmul_with_csr_input(
            embedding_table=handle_of(embedding_table), **kwargs)
    return _lib.sce_xla_sparse_dense_matmul_with_csr_input(embedding_table=embedding_table, **kwargs)


def group_lookup_entries(row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains,
                         num_minibatches_per_physical_sparse_core, input_size, table_rows,
                         table_name, num_sparsecores_per_device=-1, num_replica=1,
                         num_source_replicas=1, first_local_shard=0, num_local_shards=-1,
                         feature_rows_per_sc=(), name=None):
    """The CSR's valid entries grouped by activation row (docs/lookup.md#grouping-at-enqueue).

    Returns (activation_row_begin int32 [input_size + 1], entry_rows int32 [n], entry_gains
    float32 [n]): activation row a (in the order `feature_rows_per_sc` gives, as for
    `xla_sparse_dense_matmul_with_csr_input`) sums the gain-weighted table rows
    entry_rows[activation_row_begin[a]:activation_row_begin[a + 1]], shard offsets included, in
    the order that lookup adds them. `table_rows` is the row count of the table the lookup will
    be given (the local shards'), at most 2**31 - 1. Not a TensorFlow op: it lets a batch's
    grouping run once, in the input pipeline, instead of inside every lookup of it.
    """
    return _lib.sce_group_lookup_entries(
        row_pointers=row_pointers, sorted_sample_ids=sorted_sample_ids,
        sorted_token_ids=sorted_token_ids, sorted_gains=sorted_gains,
        num_minibatches_per_physical_sparse_core=num_minibatches_per_physical_sparse_core,
        input_size=input_size, table_rows=table_rows, table_name=table_name,
        num_sparsecores_per_device=num_sparsecores_per_device, num_replica=num_replica,
        num_source_replicas=num_source_replicas, first_local_shard=first_local_shard,
        num_local_shards=num_local_shards, feature_rows_per_sc=list(feature_rows_per_sc),
        name=name)


def sparse_dense_matmul_grouped(activation_row_begin, entry_rows, entry_gains, embedding_table,
                                table_name, name=None):
    """Activations [len(activation_row_begin) - 1, dim] of entries `group_lookup_entries` grouped:
    the same values, bit for bit, as the CSR lookup it was grouped for.

    `embedding_table` is a tensor or a resource variable (read in place, no copy); float32,
    bfloat16 or float16 rows are summed in float32. Every offset and row is checked against the
    table before anything is read (InvalidArgumentError naming `table_name`).
    """
    kwargs = dict(activation_row_begin=activation_row_begin, entry_rows=entry_rows,
                  entry_gains=entry_gains, table_name=table_name, name=name)
    if is_variable(embedding_table):
        return _lib.sce_resource_sparse_dense_matmul_grouped(
            embedding_table=handle_of(embedding_table), **kwargs)
    return _lib.sce_sparse_dense_matmul_grouped(embedding_table=embedding_table, **kwargs)
