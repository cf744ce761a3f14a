"""Every counter of an embedding in one typed record, read at once (`TPUEmbeddingV2.counters()`).

The counters live where they are counted: per replica in the replica group's variables (dropped
ids, skipped gradient rows, bytes sent), per open-vocabulary table in its key-to-row maps
(unadmitted ids, refused keys). This module is the one place that names them for users, so a new
counter is a new field here, not a new method on the facade.
"""
import dataclasses
from typing import Mapping

from tf_sc_embedding.collectives import replica_group


@dataclasses.dataclass(frozen=True)
class EmbeddingCounters:
    """The embedding's counters since it was built (docs/statistics.md#counters).

    dropped_ids: ids dropped by `allow_id_dropping` because a partition was full, summed over this
      process's replicas (sum the workers' values for the job's total).
    skipped_gradient_rows: rows left unchanged because their gradient was not finite
      (`non_finite_gradients="skip"`), summed over this process's replicas.
    collective_bytes_sent: {local replica id: bytes its embedding collectives sent}.
    collective_launches: {local replica id: embedding collectives it launched} (all-to-alls,
      all-gathers and all-reduces; per step, bench/bench_multiworker.py reports them).
    unadmitted_ids: {open-vocabulary table: occurrences of keys that held no row} (below the
      admission threshold, refused, or a string whose fingerprint another string holds); they
      read zeros and trained nothing. Over every replica and worker.
    refused_keys: {open-vocabulary table: admissions refused because every row of the key's shard
      was held}. Over every replica and worker.
    """
    dropped_ids: int
    skipped_gradient_rows: int
    collective_bytes_sent: Mapping[int, int]
    collective_launches: Mapping[int, int]
    unadmitted_ids: Mapping[str, int]
    refused_keys: Mapping[str, int]


def read_counters(group, dynamic_tables):
    """The counters of a replica group and its open-vocabulary tables. With several worker
    processes and open vocabularies a collective: every worker must call it."""
    def local_sum(name):
        return sum(group.counter_values(name).values())
    return EmbeddingCounters(
        dropped_ids=local_sum(replica_group.DROPPED_IDS),
        skipped_gradient_rows=local_sum(replica_group.SKIPPED_GRADIENT_ROWS),
        collective_bytes_sent=group.bytes_sent(),
        collective_launches=group.launches(),
        unadmitted_ids=dynamic_tables.counter("unadmitted_ids"),
        refused_keys=dynamic_tables.counter("refused_keys"))
