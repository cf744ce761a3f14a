"""The owner side of the all-to-all exchange's backward pass (docs/multi_worker.md#exchange): the
rows of its own variable a replica received gradients for -> the CSR the fused update kernels
read, in one op (cc/core/owner_csr.h) instead of an argsort, gathers, a bincount and three
scatters."""
import collections

from tf_sc_embedding._library import library as _lib

# row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains: the CSR (one source replica,
# one minibatch) whose entry i reads gradient row i; activation_rows: rows of the gradient the
# update reads (S * ceil(n / S): the received gradients, then zero rows).
OwnerCsr = collections.namedtuple("OwnerCsr", ["row_pointers", "sorted_sample_ids",
                                               "sorted_token_ids", "sorted_gains",
                                               "activation_rows"])


def owner_csr(rows, num_replicas, sparse_cores_per_replica, rows_per_shard, replica_id,
              table_name="", name=None):
    """OwnerCsr of `rows` (int32 [n], rows of this replica's variable, each in [0, S * R)).

    Entry i is sample i mod M of source SparseCore i div M (M = ceil(n / S)), so the gradients
    are read in the order the rows were received; each (source SparseCore, shard) segment keeps
    that order and starts 8-aligned (docs/preprocessing.md#csr). A row outside the variable fails with InvalidArgument naming the
    table.
    """
    return OwnerCsr(*_lib.sce_owner_csr(
        rows=rows, num_replicas=num_replicas, sparse_cores_per_replica=sparse_cores_per_replica,
        rows_per_shard=rows_per_shard, replica_id=replica_id, table_name=table_name, name=name))
