"""Step 1 of the all-to-all exchange (docs/multi_worker.md#exchange): which unique ids a replica
asks each owner for. One radix sort and one scan (cc/core/id_routing.h) instead of TensorFlow's
unique + argsort + bincount + gathers; optionally, one more scan gives the table's partition
statistics (max ids and max unique ids per partition), so that the exchange need not run the
minibatch-splits op on the same COO only to count them."""
import collections

import tensorflow as tf

from tf_sc_embedding._library import library as _lib

# rows: [unique] int32, rows of the owners' variables grouped by owner; counts: [W] unique ids per
# owner; positions: [ids] index of each id's unique id in rows; max_ids, max_unique_ids: int32
# scalars, the partition statistics (0 without rows_per_sparse_core).
IdRoute = collections.namedtuple(
    "IdRoute", ["rows", "counts", "positions", "max_ids", "max_unique_ids"])


def route_ids_to_owners(ids, num_replicas, sparse_cores_per_replica, rows_per_shard,
                        row_ids=None, rows_per_sparse_core=0, table_name="", name=None):
    """IdRoute of the stacked ids `ids` (int32 [n], each in [0, W * S * R)).

    Stacked id c is owned by replica (c mod W*S) div S, at row ((c mod W*S) mod S) * R + c div W*S
    of its variable (docs/layout.md#table-layout). An id outside the table fails with
    InvalidArgument naming the table.

    Partition statistics: with `rows_per_sparse_core` > 0, `row_ids` are the sample rows of the
    ids in the stacked COO (int32 [n], nondecreasing, in [0, S * rows_per_sparse_core): the
    SparseCore-major order of the stacked COO op). A partition is a (source SparseCore
    row div rows_per_sparse_core, target shard c mod W*S) pair; `max_ids` is the most ids of one
    partition, counting an id repeated within one sample once, and `max_unique_ids` the most
    distinct ids of one partition. These equal the max_ids / max_uniques the minibatch-splits op
    gives for the same COO at max_division_level 0 without limits (the exchange once ran that op
    for the counts alone), but come from the sort the routing does anyway, for one extra pass over its result instead of
    a second sort and dedup of the COO. Bad row_ids (length, range, order) fail with
    InvalidArgument naming the table. With rows_per_sparse_core = 0 (the default) both are 0 and
    `row_ids` is not read (None passes an empty vector).
    """
    if row_ids is None:
        row_ids = tf.zeros([0], tf.int32)
    rows, counts, positions, max_ids, max_unique_ids = _lib.sce_route_ids_to_owners(
        ids=ids, row_ids=row_ids, num_replicas=num_replicas,
        sparse_cores_per_replica=sparse_cores_per_replica, rows_per_shard=rows_per_shard,
        rows_per_sparse_core=rows_per_sparse_core, table_name=table_name, name=name)
    return IdRoute(rows, counts, positions, max_ids, max_unique_ids)
