"""Every cross-replica transfer of the embedding goes through this module.

`ReplicaGroup` describes the replicas of the strategy the embedding was created under (how many,
which of them live in this process, which device each uses) and owns the collective group key.
`ReplicaView` is one replica's handle inside a step (`strategy.run`): its replica id and the
collectives all_to_all, all_gather, all_sum and all_max over every replica of the group.

A transport carries them (transports.py): TensorFlow's own collective ops
(`tf.raw_ops.Collective*V2`, the ops and transport `tf.distribute` uses; its replica context
offers all_reduce and all_gather but no all-to-all and no max, hence the raw ops), or oneCCL
between worker processes (oneccl.py). With TensorFlow's ops the embedding uses its own collective
group key (one per distinct set of devices), so its collectives never collide with the
strategy's.

Instance keys are handed out per replica and per call, when a step function runs (not when it
is traced): a collective instance is never reused, so its sizes may change from step to step.
All replicas (and all worker processes) run the same steps in the same order, so the keys agree.

Bytes. Every collective adds what the calling replica sends to `bytes_sent` (one int64 counter per
replica, read with `ReplicaGroup.bytes_sent()`), under the cost model of the usual algorithms:
all_to_all sends the W-1 chunks meant for other replicas, all_gather (ring) forwards W-1 chunks of
the replica's own size, all_sum (ring reduce-scatter + all-gather) sends 2 (W-1)/W of the tensor.
See docs/multi_worker.md#bytes-per-step.
"""
import collections
import threading

import numpy as np
import tensorflow as tf

from tf_sc_embedding import private_tf
from tf_sc_embedding.collectives import freed_memory, transports, wire

# Collective group keys of the embedding start here, far from the ones tf.distribute allocates
# (which count up from 1 per strategy and device set).
_GROUP_KEY_BASE = 0x5CE00000
_group_keys = {}
_group_keys_lock = threading.Lock()
# Last instance key per (group key, replica id), shared by every embedding of the process: a key
# is never used twice in a group, whichever embedding issues the collective.
_instance_keys = {}

# Per-replica int64 counters (ReplicaGroup.counter): bytes sent through the embedding's
# collectives and the collectives launched, gradient rows left unchanged because their gradient
# was not finite (TPUEmbeddingV2(non_finite_gradients="skip")), and ids dropped by
# allow_id_dropping.
BYTES_SENT = "collective_bytes_sent"
LAUNCHES = "collective_launches"
SKIPPED_GRADIENT_ROWS = "skipped_gradient_rows"
DROPPED_IDS = "dropped_ids"
# The fused updates applied so far by an embedding with a 16-bit table: the step whose bits
# stochastically round its rows (equal on every replica, since every replica applies every update).
UPDATE_STEPS = "update_steps"
COUNTERS = (BYTES_SENT, LAUNCHES, SKIPPED_GRADIENT_ROWS, DROPPED_IDS, UPDATE_STEPS)
# A collective that waits longer fails (a dead worker is an error within a minute, on every
# transport); 0 waits forever.
DEFAULT_TIMEOUT_SECONDS = 60.0


def _group_key(devices):
    with _group_keys_lock:
        if devices not in _group_keys:
            _group_keys[devices] = _GROUP_KEY_BASE + len(_group_keys)
        return _group_keys[devices]


StrategyReplicas = collections.namedtuple(
    "StrategyReplicas", ["num_replicas", "local_replica_ids", "local_devices", "num_workers",
                         "worker_index", "worker_addresses"])


def _worker_order(cluster_spec):
    """The tasks that run replicas, in replica order: the chief (if any), then the workers."""
    jobs = cluster_spec.as_dict()
    tasks = []
    for job in ("chief", "worker"):
        members = jobs.get(job, [])
        indices = sorted(members) if isinstance(members, dict) else range(len(members))
        tasks.extend((job, i) for i in indices)
    return tasks


def strategy_replicas(strategy):
    """Where the replicas of `strategy` live; raises for strategies the embedding cannot shard over.

    Supported: the default strategy, OneDeviceStrategy, MirroredStrategy (replicas on local
    devices) and MultiWorkerMirroredStrategy (replicas on every worker process; each process holds
    the shards of its own replicas).
    """
    name = type(strategy).__name__
    num_replicas = strategy.num_replicas_in_sync
    supported = ("the default strategy, OneDeviceStrategy, MirroredStrategy and "
                 "MultiWorkerMirroredStrategy")
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy) or \
            "ParameterServer" in name or "TPU" in name or "CentralStorage" in name:
        raise ValueError(f"TPUEmbeddingV2 cannot be created under {name}: it shards tables over "
                         f"synchronous replicas; supported strategies are {supported}")
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        resolver = strategy.cluster_resolver
        local = list(strategy.extended.worker_devices)
        spec = resolver.cluster_spec()
        tasks = _worker_order(spec) if spec.jobs else [(None, 0)]
        me = (resolver.task_type, resolver.task_id) if spec.jobs else (None, 0)
        if me not in tasks:
            raise ValueError(f"TPUEmbeddingV2: task {me} of the cluster runs no replica (only "
                             f"the chief and the workers do: {tasks})")
        if len(tasks) * len(local) != num_replicas:
            raise ValueError(f"TPUEmbeddingV2: the strategy has {num_replicas} replicas but "
                             f"{len(tasks)} worker(s) x {len(local)} local device(s) = "
                             f"{len(tasks) * len(local)}; every worker must have the same number "
                             "of local replicas")
        index = tasks.index(me)
        first = index * len(local)
        addresses = tuple(spec.task_address(job, i) if job else "localhost" for job, i in tasks)
        return StrategyReplicas(num_replicas, tuple(range(first, first + len(local))),
                                tuple(local), len(tasks), index, addresses)
    if isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.OneDeviceStrategy)):
        local = list(strategy.extended.worker_devices)
        if len(local) != num_replicas:
            raise ValueError(f"TPUEmbeddingV2: {name} has {num_replicas} replicas but "
                             f"{len(local)} devices ({local})")
        return StrategyReplicas(num_replicas, tuple(range(num_replicas)), tuple(local), 1, 0,
                                ("localhost",))
    if not tf.distribute.has_strategy() or name == "_DefaultDistributionStrategy":
        if num_replicas != 1:
            raise ValueError(f"TPUEmbeddingV2: the default strategy reports {num_replicas} "
                             "replicas")
        return StrategyReplicas(1, (0,), (None,), 1, 0, ("localhost",))
    raise ValueError(f"TPUEmbeddingV2 cannot be created under {name}; supported strategies are "
                     f"{supported}")


class ReplicaGroup:
    """The replicas of one embedding: placement facts plus the collective group and counters."""

    def __init__(self, strategy, timeout_seconds=DEFAULT_TIMEOUT_SECONDS,
                 wire_precision="float32", transport="auto"):
        self.strategy = strategy
        wire.wire_dtype(wire_precision, wire.ROWS)   # an unknown precision fails here
        self.wire_precision = wire_precision
        replicas = strategy_replicas(strategy)
        self.num_replicas = replicas.num_replicas
        self.local_replica_ids = replicas.local_replica_ids
        self.local_devices = replicas.local_devices
        self.num_workers = replicas.num_workers
        self.worker_index = replicas.worker_index
        self.worker_addresses = replicas.worker_addresses
        self.timeout_seconds = float(timeout_seconds)
        self._counters = {}
        self._ordering_tokens = {}
        self._group_key = None
        self._restored_update_step = 0   # the update step until the counters exist
        self.transport = transports.create(transport, self)

    @property
    def is_multi_worker(self):
        return self.num_workers > 1

    # -- per-replica values of this process's replicas
    def local_values(self, structure):
        """One structure per local replica from a structure of per-replica values (a value that
        is not per-replica is the same for every replica)."""
        count = len(self.local_replica_ids)

        def per_replica(value):
            if not isinstance(value, tf.distribute.DistributedValues):
                return [value] * count
            values = list(self.strategy.experimental_local_results(value))
            if len(values) != count:
                raise ValueError(f"a per-replica input has {len(values)} values, this process "
                                 f"runs {count} replicas")
            return values

        if isinstance(structure, tf.distribute.DistributedValues):
            return per_replica(structure)
        columns = [per_replica(value) for value in tf.nest.flatten(structure)]
        return [tf.nest.pack_sequence_as(structure, [c[i] for c in columns])
                for i in range(count)]

    def map_local_replicas(self, fn, features, weights, device, what):
        """fn(features, weights, device, first) on each local replica's part of per-replica
        inputs (cross-replica context only), on `device` or else the replica's device; returns
        the per-replica value of the results."""
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            raise ValueError(f"per-replica (distributed) inputs are only accepted by {what} in "
                             "cross-replica context (outside strategy.run); inside strategy.run "
                             "pass each replica's own tensors")
        if device is not None:
            tf.DeviceSpec.from_string(device)   # a malformed device string fails here
        local_features = self.local_values(features)
        local_weights = ([None] * len(local_features) if weights is None
                         else self.local_values(weights))
        return self.distribute([
            fn(f, w, device or replica_device, i == 0) for i, (f, w, replica_device) in
            enumerate(zip(local_features, local_weights, self.local_devices))])

    def distribute(self, local_outputs):
        """The per-replica value whose part on local replica i is local_outputs[i]."""
        local_ids = list(self.local_replica_ids)
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: local_outputs[local_ids.index(int(tf.get_static_value(
                ctx.replica_id_in_sync_group)))])

    def gather_local_arrays(self, arrays):
        """Every replica's int32 vector, in replica order, from this process's ({local replica
        id: numpy int32 [n_r]}), eagerly. With several worker processes a collective that every
        worker must call: the lengths are gathered first, then the vectors padded to the
        longest (strategy.gather needs equal shapes). State of varying size (the maps of open
        vocabularies, dynamic_tables.py) is read this way."""
        if not self.is_multi_worker:
            return [np.asarray(arrays[r], np.int32) for r in sorted(arrays)]

        def gathered(per_local):
            def value_fn(context):
                replica = context.replica_id_in_sync_group
                with tf.device(self.device_of(replica)):
                    return tf.constant(per_local[replica])
            values = self.strategy.experimental_distribute_values_from_function(value_fn)
            return self.strategy.gather(values, axis=0).numpy()

        lengths = gathered({r: np.array([len(a)], np.int32) for r, a in arrays.items()})
        longest = int(lengths.max())
        padded = gathered({r: np.pad(np.asarray(a, np.int32), (0, longest - len(a)))
                           for r, a in arrays.items()}).reshape(self.num_replicas, longest)
        return [padded[r, :lengths[r]] for r in range(self.num_replicas)]

    def calling_replicas(self):
        """(replica id, device) of the replica calling in replica context, else of every local
        replica (cross-replica context, or one replica)."""
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            replica_id = ReplicaView(self).replica_id
            return [(replica_id, self.device_of(replica_id))]
        return list(zip(self.local_replica_ids, self.local_devices))

    def device_of(self, replica_id):
        """The device of a replica of this process; any other replica id is an error."""
        try:
            return self.local_devices[self.local_replica_ids.index(replica_id)]
        except ValueError:
            raise ValueError(f"replica {replica_id} does not run in this process (local replicas: "
                             f"{list(self.local_replica_ids)})") from None

    def group_key(self):
        if self._group_key is None:
            if self.is_multi_worker:
                resolver = self.strategy.cluster_resolver
                devices = ("cluster", repr(sorted(resolver.cluster_spec().as_dict().items())),
                           len(self.local_devices))
            else:
                devices = tuple(str(d) for d in self.local_devices)
            self._group_key = _group_key(devices)
        return self._group_key

    def next_instance_key(self, replica_id):
        slot = (self.group_key(), replica_id)
        with _group_keys_lock:
            key = _instance_keys.get(slot, 0) + 1
            _instance_keys[slot] = key
            return key

    def create_variables(self):
        """Per local replica: the counters (COUNTERS) and the collectives' ordering token; then,
        in a multi-worker job, malloc keeps freed memory (freed_memory.py) and the transport
        connects (every worker calls this at the same point of the program).

        The ordering token is a resource on the replica's device that every collective of the
        replica takes as input, so TensorFlow runs them in program order on every replica (without
        it, collectives between devices of one process can wait for each other forever).
        """
        if self._ordering_tokens:
            return
        self._create_counters_and_tokens()
        if self.is_multi_worker:
            freed_memory.keep_freed_memory()
        with tf.init_scope():
            self.transport.connect()

    def _create_counters_and_tokens(self):
        with tf.init_scope():
            for replica_id, device in zip(self.local_replica_ids, self.local_devices):
                with tf.device(device):
                    for name in COUNTERS:
                        initial = self._restored_update_step if name == UPDATE_STEPS else 0
                        self._counters.setdefault(name, {})[replica_id] = \
                            private_tf.plain_variable(tf.constant(initial, tf.int64),
                                                      f"{name}_replica_{replica_id}")
                    self._ordering_tokens[replica_id] = private_tf.plain_variable(
                        tf.constant(0.0), f"collective_ordering_token_replica_{replica_id}")

    def ordering_token(self, replica_id):
        return self._ordering_tokens[replica_id]

    def counter(self, replica_id, name=BYTES_SENT):
        """The int64 counter variable `name` of a local replica (None before create_variables)."""
        return self._counters.get(name, {}).get(replica_id)

    def counter_values(self, name):
        """{local replica id: value of counter `name`}."""
        return {r: int(c.numpy()) for r, c in self._counters.get(name, {}).items()}

    def update_step(self):
        """Fused updates applied so far (equal on every replica; the value restored before the
        counters existed until then)."""
        values = self.counter_values(UPDATE_STEPS)
        return int(values[min(values)]) if values else self._restored_update_step

    def restore_update_step(self, value):
        """Sets every local replica's update step (kept for create_variables before it)."""
        self._restored_update_step = int(value)
        for counter in self._counters.get(UPDATE_STEPS, {}).values():
            counter.assign(int(value))

    def bytes_sent(self):
        """{local replica id: bytes this replica sent through the embedding's collectives}."""
        return self.counter_values(BYTES_SENT)

    def launches(self):
        """{local replica id: collectives this replica launched}."""
        return self.counter_values(LAUNCHES)

    def reset_bytes_sent(self):
        """Zeroes the traffic counters: bytes sent and collectives launched."""
        for name in (BYTES_SENT, LAUNCHES):
            for c in self._counters.get(name, {}).values():
                c.assign(0)


class ReplicaView:
    """The calling replica inside a step: its id, and collectives over every replica."""

    def __init__(self, group):
        self.group = group
        self.num_replicas = group.num_replicas
        context = tf.distribute.get_replica_context()
        if self.num_replicas > 1 and (context is None or
                                      context.num_replicas_in_sync != self.num_replicas):
            raise RuntimeError("with several replicas, the embedding must be called inside "
                               "strategy.run (in replica context)")
        if self.num_replicas == 1:
            self.replica_id = 0
        else:
            self.replica_id = tf.get_static_value(context.replica_id_in_sync_group)
            if self.replica_id is None:
                raise RuntimeError("the replica id must be known when the step is traced")
            self.replica_id = int(self.replica_id)
        if self.replica_id not in group.local_replica_ids:
            raise RuntimeError(f"replica {self.replica_id} does not run in this process")

    # -- launching
    def _launch(self, kind, value, lengths=None):
        """Runs one collective of this replica; eagerly, all local replicas' at once.

        Eager `strategy.run` runs the replicas of a process one after another, so an eager
        collective would wait forever for the next replica: there the replicas hand their values
        to a cross-replica merge_call that runs every local replica's collective in one
        tf.function. `lengths`: a ragged all-to-all's lengths.
        """
        if not tf.executing_eagerly():
            return _collective(self.group, kind, value, self.replica_id, lengths)
        context = tf.distribute.get_replica_context()
        group = self.group

        def merge_fn(strategy, per_replica, per_replica_lengths):
            values = strategy.experimental_local_results(per_replica)
            all_lengths = ([None] * len(values) if per_replica_lengths is None else
                           strategy.experimental_local_results(per_replica_lengths))

            @tf.function(autograph=False)
            def run_all():
                results = []
                for replica, device, v, n in zip(group.local_replica_ids, group.local_devices,
                                                 values, all_lengths):
                    with tf.device(device):
                        results.append(_collective(group, kind, v, replica, n))
                return results

            results = dict(zip(group.local_replica_ids, run_all()))

            def result_of(ctx):
                return results[int(tf.get_static_value(ctx.replica_id_in_sync_group))]

            return strategy.experimental_distribute_values_from_function(result_of)

        return context.merge_call(merge_fn, args=(value, lengths))

    # -- collectives
    def all_to_all(self, value, payload=None):
        """value: [W, ...]; row d goes to replica d; returns [W, ...] with row s from replica s.
        payload (wire.ROWS, wire.GRADIENTS or None): what a float32 value carries, which decides
        the dtype it travels in (wire.py; None: exactly as it is)."""
        if self.num_replicas == 1:
            return value
        rows = tf.TensorShape(value.shape)[0] if value.shape.rank else None
        if rows is not None and rows != self.num_replicas:
            # A mismatched all-to-all aborts TensorFlow's collective executor for the process.
            raise ValueError(f"all_to_all needs one row per replica ({self.num_replicas}), got "
                             f"shape {value.shape}")
        return wire.on_the_wire(lambda v: self._launch("all_to_all", v), value,
                                self.group.wire_precision, payload)

    @property
    def counts_ride(self):
        """Whether the transport has a ragged all-to-all, so that the counts of an exchange ride
        with its first payload instead of in an all-gather of their own (counted.py)."""
        return self.num_replicas > 1 and self.group.transport.ragged

    def ragged_all_to_all(self, value, lengths, payload=None):
        """value: [W, chunk]; the first lengths[d] (int) elements of row d go to replica d.
        Returns [W, longest received] with row s holding what replica s sent, then zeros. Only
        where counts_ride."""
        lengths = tf.cast(lengths, tf.int64)
        return wire.on_the_wire(lambda v: self._launch("ragged_all_to_all", v, lengths), value,
                                self.group.wire_precision, payload)

    def all_gather(self, value):
        """Concatenation along axis 0 of every replica's value (equal shapes)."""
        return value if self.num_replicas == 1 else self._launch("all_gather", value)

    def all_sum(self, value):
        if self.num_replicas == 1:
            return value
        if self.group.transport.sums:
            return self._launch("all_sum", value)
        return tf.reduce_sum(self.all_gather(value[None]), axis=0)   # in replica order

    def all_max(self, value):
        """Elementwise max over all replicas of a small 1-D tensor (gathered, then reduced)."""
        if self.num_replicas == 1:
            return value
        gathered = self.all_gather(value[None])
        return tf.reduce_max(gathered, axis=0)

    def all_or(self, value):
        """Bitwise OR of an int64 scalar over all replicas."""
        if self.num_replicas == 1:
            return value
        gathered = self.all_gather(tf.reshape(value, [1]))
        return tf.foldl(tf.bitwise.bitwise_or, gathered, initializer=tf.constant(0, value.dtype))


class LocalView:
    """A replica's view of a layout laid out for one replica (replicated tables): no collectives."""
    num_replicas = 1
    replica_id = 0
    counts_ride = False

    @staticmethod
    def all_to_all(value, payload=None):  # pylint: disable=unused-argument
        return value

    @staticmethod
    def all_gather(value):
        return value

    all_sum = all_max = all_or = all_gather


# Bytes one replica sends per byte of its input, as (numerator, denominator) with W replicas.
_SENT_FRACTION = {"all_to_all": lambda w: (w - 1, w), "all_gather": lambda w: (w - 1, 1),
                  "all_sum": lambda w: (2 * (w - 1), w)}


@tf.autograph.experimental.do_not_convert
def _collective(group, kind, value, replica_id, lengths=None):
    """One replica's collective op (graph mode) on the group's transport, its bytes counted."""
    w = group.num_replicas
    counter = group.counter(replica_id)
    if counter is not None:
        if kind == "ragged_all_to_all":
            on_wire = group.transport.ragged_sent(value, lengths)   # elements per destination
            nbytes = (tf.reduce_sum(on_wire) - on_wire[replica_id]) * value.dtype.size
        else:
            numerator, denominator = _SENT_FRACTION[kind](w)
            nbytes = tf.size(value, out_type=tf.int64) * value.dtype.size
            nbytes = nbytes * numerator // denominator
        counter.assign_add(nbytes)
        group.counter(replica_id, LAUNCHES).assign_add(1)
    if kind == "ragged_all_to_all":
        return group.transport.launch_ragged(value, lengths, replica_id)
    return group.transport.launch(kind, value, replica_id)
