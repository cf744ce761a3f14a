"""The oneCCL transport: the embedding's collectives over Intel's oneAPI Collective Communications
Library, between the worker processes of a MultiWorkerMirroredStrategy job (one replica each).

MultiWorkerMirroredStrategy stays the engine (the cluster from TF_CONFIG, the dense gradients,
checkpoints, failure handling); only the embedding's own all-to-alls and all-gathers move to
oneCCL, which moves the same bytes several times cheaper than TensorFlow's gRPC collectives
(BENCHMARKS.md#multi-worker).

Bootstrap, with no launcher and nothing for the user to set. When the embedding creates its
variables, on every worker at the same point: the environment below is applied (before oneCCL
first reads it), worker 0 starts oneCCL's key-value store, its address reaches the other workers
through one TensorFlow all-gather over the MWMS cluster, and every worker forms the communicator
(rank = worker index, the order of tasks in TF_CONFIG). Each embedding forms its own communicator.
Before that, the worker removes the shared-memory regions dead processes of its host left behind
(shared_memory.py: they fill /dev/shm, and a reused process id made libfabric crash).

Environment (`settings`; a variable the user already set is left alone):
- CCL_ATL_TRANSPORT=ofi (libfabric, not MPI), CCL_PROCESS_LAUNCHER=none with CCL_LOCAL_RANK /
  CCL_LOCAL_SIZE from the workers that share this worker's host;
- CCL_WORKER_OFFLOAD=0: the communicator's own thread drives progress while it waits (oneCCL's
  default worker thread busy-polls and pins itself to the last core, whatever the job's affinity);
- CCL_OFI_LIBRARY_PATH and FI_PROVIDER_PATH: the libfabric of the impi-rt wheel;
- FI_PROVIDER=tcp when the workers live on several hosts (libfabric's default, shared memory,
  serves one host only);
- CCL_KVS_IFACE=lo and FI_TCP_IFACE=lo when every worker's address is a loopback one.

Order: every collective of a replica takes the replica's ordering token, so TensorFlow runs them
in program order, and the communicator's thread runs them in the order they arrive: the same on
every worker. A collective that waits longer than collective_timeout_seconds, or whose peer's
TensorFlow server stops answering, fails with an error naming the transport and the peer
(cc/transport/oneccl_communicator.h).
"""
import ipaddress
import itertools
import os
import threading

import numpy as np
import tensorflow as tf

from tf_sc_embedding.collectives import oneccl_library, shared_memory

# How long forming a communicator may take when collective_timeout_seconds is 0 (wait forever
# for collectives): a worker that never comes is still an error, not a hang.
CONNECT_TIMEOUT_SECONDS = 120.0
_names = itertools.count()
_names_lock = threading.Lock()


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(address):
    host = address.rsplit(":", 1)[0]
    return "localhost" if _is_loopback(host) else host


def settings(peers, rank, installation):
    """{variable: value} oneCCL needs for worker `rank` of workers at `peers` ("host:port")."""
    hosts = [host_of(p) for p in peers]
    same_host = [r for r, h in enumerate(hosts) if h == hosts[rank]]
    values = {
        "CCL_ATL_TRANSPORT": "ofi",
        "CCL_LOG_LEVEL": "error",
        "CCL_PROCESS_LAUNCHER": "none",
        "CCL_LOCAL_RANK": str(same_host.index(rank)),
        "CCL_LOCAL_SIZE": str(len(same_host)),
        "CCL_WORKER_OFFLOAD": "0",
        "CCL_OFI_LIBRARY_PATH": installation.fabric,
        "FI_PROVIDER_PATH": installation.providers,
    }
    if len(set(hosts)) > 1:
        values["FI_PROVIDER"] = "tcp"
    if all(h == "localhost" for h in hosts):
        values["CCL_KVS_IFACE"] = "lo"
        values["FI_TCP_IFACE"] = "lo"
    return values


def apply_settings(values):
    """Sets each variable the environment does not set yet; returns what was applied."""
    applied = {}
    for name, value in values.items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    return applied


class OnecclTransport:
    """The collectives of one embedding over its own oneCCL communicator."""

    name = "oneccl"
    sums = False   # all_sum: all_gather, then a sum in replica order (replica_group.py)
    ragged = True

    def __init__(self, group):
        self.group = group
        self.peers = group.worker_addresses
        self.rank = group.worker_index
        self.communicator = None

    def connect(self):
        """Forms the communicator (eagerly, on every worker at the same point)."""
        if self.communicator is not None:
            return
        group = self.group
        apply_settings(settings(self.peers, self.rank, oneccl_library.installation()))
        shared_memory.clean_up_around_this_worker()
        ops = oneccl_library.load()
        with _names_lock:
            name = f"tf_sc_embedding_{next(_names)}"
        replica = group.local_replica_ids[0]
        address = np.zeros(256, np.int32)
        if self.rank == 0:
            with tf.device("CPU:0"):
                created = ops.sce_oneccl_create_store(communicator=name).numpy()
            address[:len(created)] = np.frombuffer(created, np.uint8)
        address = group.gather_local_arrays({replica: address})[0]
        timeout = group.timeout_seconds or CONNECT_TIMEOUT_SECONDS
        with tf.device("CPU:0"):
            ops.sce_oneccl_connect(address=address.astype(np.uint8).tobytes(),
                                   communicator=name, size=group.num_workers, rank=self.rank,
                                   timeout_seconds=timeout, peers=list(self.peers))
        self.communicator = name

    def launch(self, kind, value, replica_id):
        ops = oneccl_library.load()
        token = self.group.ordering_token(replica_id).handle
        if kind not in ("all_to_all", "all_gather"):
            raise ValueError(f"the oneCCL transport has no {kind} (the replica view sums "
                             "gathers)")
        return ops.sce_oneccl_collective(input=value, ordering_token=token, kind=kind,
                                         communicator=self.communicator,
                                         group_size=self.group.num_replicas)

    @staticmethod
    def ragged_sent(value, lengths):
        """Elements a ragged all-to-all puts on the wire per destination: every chunk but the
        last goes out whole (oneCCL's alltoallv takes one contiguous buffer; the input's stride
        puts chunk d + 1 right after chunk d, cc/transport/oneccl_communicator.cc), the last one
        as long as it is."""
        w = value.shape[0]
        whole = tf.fill([w - 1], tf.shape(value, out_type=tf.int64)[1])
        return tf.concat([whole, lengths[w - 1:]], axis=0)

    def launch_ragged(self, value, lengths, replica_id):
        """A ragged all-to-all (SceOnecclRaggedAllToAll): [W, longest received chunk]."""
        ops = oneccl_library.load()
        token = self.group.ordering_token(replica_id).handle
        output, _ = ops.sce_oneccl_ragged_all_to_all(
            input=value, lengths=lengths, ordering_token=token, communicator=self.communicator,
            group_size=self.group.num_replicas)
        return output
