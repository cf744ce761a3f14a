"""Step 1 of the all-to-all exchange (docs/multi_worker.md#exchange): which unique ids a replica
asks each owner for. One radix sort and one scan (cc/core/id_routing.h) instead of TensorFlow's
unique + argsort + bincount + gathers."""
import collections

from tf_sc_embedding._library import library as _lib

# rows: [unique] int32, rows of the owners' variables grouped by owner; counts: [W] unique ids per
# owner; positions: [ids] index of each id's unique id in rows.
IdRoute = collections.namedtuple("IdRoute", ["rows", "counts", "positions"])


def route_ids_to_owners(ids, num_replicas, sparse_cores_per_replica, rows_per_shard,
                        table_name="", name=None):
    """IdRoute of the stacked ids `ids` (int32 [n], each in [0, W * S * R)).

    Stacked id c is owned by replica (c mod W*S) div S, at row ((c mod W*S) mod S) * R + c div W*S
    of its variable (docs/layout.md#table-layout). An id outside the table fails with
    InvalidArgument naming the table.
    """
    rows, counts, positions = _lib.sce_route_ids_to_owners(
        ids=ids, num_replicas=num_replicas, sparse_cores_per_replica=sparse_cores_per_replica,
        rows_per_shard=rows_per_shard, table_name=table_name, name=name)
    return IdRoute(rows, counts, positions)
