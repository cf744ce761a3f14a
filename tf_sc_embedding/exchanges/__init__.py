"""The exchanges of a plan, one per placement (base.Exchange), and the one place that chooses them.

* all_to_all.AllToAllExchange: sharded tables over several replicas (the default);
* all_gather.AllGatherExchange: sharded tables over one replica, or over several with
  `exchange="all_gather"` (SparseCore's per-partition limits);
* replicated.ReplicatedExchange: tables held whole by every replica;
* dynamic.DynamicExchange: open-vocabulary tables, their keys mapped to rows in the step.
"""
from absl import logging

from tf_sc_embedding.exchanges.all_gather import AllGatherExchange
from tf_sc_embedding.exchanges.all_to_all import AllToAllExchange
from tf_sc_embedding.exchanges.base import Exchange
from tf_sc_embedding.exchanges.dynamic import DynamicExchange
from tf_sc_embedding.exchanges.replicated import ReplicatedExchange

SINGLE = "single"   # one replica: no exchange of ids or rows


def choose(exchange, num_replicas, sparse_core_config):
    """The exchange of the sharded tables: "single", "all_to_all" or "all_gather"."""
    if num_replicas == 1:
        return SINGLE
    if exchange != "auto":
        return exchange
    limits = sparse_core_config is not None and (
        sparse_core_config.max_ids_per_table or sparse_core_config.max_unique_ids_per_table or
        sparse_core_config.allow_id_dropping)
    if limits:
        # Worth a line in the log: all-gather sends bytes that grow with the replica count.
        logging.info("tf_sc_embedding: exchange='auto' picked 'all_gather' over %d replicas: "
                     "SparseCoreEmbeddingConfig sets per-partition limits (max_ids_per_table, "
                     "max_unique_ids_per_table or allow_id_dropping), which only that exchange "
                     "implements. Without them it would pick 'all_to_all'; see "
                     "docs/multi_worker.md#exchange.", num_replicas)
        return "all_gather"
    return "all_to_all"


def build(plan, chosen, group, sparse_core_config, dynamic_tables=None, storage=None):
    """The exchanges of a plan, sharded tables first (the order every replica runs them in).
    dynamic_tables (dynamic_tables.DynamicTables) and storage: those of the plan's dynamic
    tables."""
    exchanges = []
    if plan.sharded is not None:
        if chosen == "all_to_all":
            exchanges.append(AllToAllExchange(plan.sharded, group))
        else:
            exchanges.append(AllGatherExchange(plan.sharded, group, sparse_core_config))
    if plan.dynamic is not None:
        exchanges.append(DynamicExchange(plan.dynamic, group, dynamic_tables, storage))
    if plan.replicated is not None:
        exchanges.append(ReplicatedExchange(plan.replicated, group))
    return exchanges


__all__ = ["Exchange", "AllToAllExchange", "AllGatherExchange", "DynamicExchange",
           "ReplicatedExchange", "choose",
           "build", "SINGLE"]
