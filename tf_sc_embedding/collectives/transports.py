"""Transports: what carries the bytes of the embedding's collectives between replicas.

`EmbeddingOptions(exchange_transport=...)` picks one per embedding; the replica group
(replica_group.py) hands every collective to it, so no exchange knows which transport runs:

- "tensorflow": TensorFlow's own collective ops (`tf.raw_ops.Collective*V2`), the ops and the
  transport `tf.distribute` uses (in process between local devices, gRPC between workers).
- "oneccl": Intel's oneAPI Collective Communications Library (oneccl.py), shared memory between
  workers of one host and TCP between hosts, for jobs of several worker processes with one
  replica each. Needs the optional extra (`pip install .[oneccl]`).
- "auto" (the default): "oneccl" when the extra is installed and the job has several worker
  processes of one replica each, else "tensorflow".

A transport launches one replica's collective in graph mode: `launch(kind, value, replica_id)`
with kind "all_to_all", "all_gather" or "all_sum" (only if `sums`; otherwise the replica view
gathers and sums in replica order), `launch_ragged(value, lengths, replica_id)` if `ragged` (an
all-to-all whose chunks have their own lengths, which reach the receivers with the bytes; its
`ragged_sent(value, lengths)` says what goes on the wire per destination), and `connect()` forms
whatever it needs once the variables are created, eagerly and on every worker at the same point
of the program.
"""
import tensorflow as tf

from tf_sc_embedding import private_tf
from tf_sc_embedding.collectives import oneccl, oneccl_library

TRANSPORTS = ("auto", "oneccl", "tensorflow")


class TensorFlowTransport:
    """TensorFlow's collective ops over the group's collective key."""

    name = "tensorflow"
    sums = True
    ragged = False   # all-to-alls of equal chunks only (counted.py gathers the counts first)

    def __init__(self, group):
        self.group = group

    def connect(self):
        pass

    def launch(self, kind, value, replica_id):
        group = self.group

        def next_key():
            return group.next_instance_key(replica_id)

        common = dict(group_size=group.num_replicas, group_key=group.group_key(),
                      instance_key=private_tf.call_time_int32(next_key),
                      ordering_token=[group.ordering_token(replica_id).handle],
                      communication_hint="ring", timeout_seconds=group.timeout_seconds)
        if kind == "all_to_all":
            return tf.raw_ops.CollectiveAllToAllV2(input=value, **common)
        if kind == "all_gather":
            return tf.raw_ops.CollectiveGatherV2(input=value, **common)
        return tf.raw_ops.CollectiveReduceV2(input=value, merge_op="Add", final_op="Id",
                                             **common)


def oneccl_fits(group):
    """Why oneCCL cannot carry this group's collectives, or None when it can."""
    if group.num_workers > 1 and len(group.local_replica_ids) > 1:
        return (f"each worker runs {len(group.local_replica_ids)} replicas; the oneCCL transport "
                "runs one replica per worker process")
    if group.num_workers == 1 and group.num_replicas > 1:
        return ("the replicas run in one process; the oneCCL transport connects worker "
                "processes (MultiWorkerMirroredStrategy with one replica per worker)")
    return None


def create(name, group):
    """The transport `name` (one of TRANSPORTS) for `group`; raises ValueError for a transport
    that cannot serve it, or for "oneccl" without the extra."""
    if name not in TRANSPORTS:
        raise ValueError(f"exchange_transport must be one of {TRANSPORTS}, got {name!r}")
    if name == "auto":
        use_oneccl = (group.num_workers > 1 and oneccl_fits(group) is None and
                      oneccl_library.is_installed())
        name = "oneccl" if use_oneccl else "tensorflow"
    if name == "tensorflow" or group.num_replicas == 1:
        return TensorFlowTransport(group)
    oneccl_library.require_installed()
    why_not = oneccl_fits(group)
    if why_not is not None:
        raise ValueError(f"exchange_transport='oneccl': {why_not}; use 'tensorflow' or 'auto'")
    return oneccl.OnecclTransport(group)
