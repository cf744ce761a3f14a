"""The online partition-limit update op (docs/preprocessing.md#online-limits)."""
from tf_sc_embedding._library import library as _lib
from tf_sc_embedding.ops._variables import handle_of


def raise_sparse_core_limits(limits, observed, table_names, name=None):
    """limits (int32 [T, 2] variable) = max(limits, observed); logs each raised limit.

    Columns: max ids and max unique ids per partition; rows: `table_names`. Returns the limits
    after the update.
    """
    return _lib.sce_raise_sparse_core_limits(limits=handle_of(limits), observed=observed,
                                             table_names=list(table_names), name=name)
