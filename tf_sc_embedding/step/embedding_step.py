"""`EmbeddingStep`: what one training step does with built tables, for every exchange alike.

`TPUEmbeddingV2.build()` creates it from the plan, the storage and the exchanges (one per
placement, exchanges/). It owns the per-step behaviour: enqueue (host preprocessing), dequeue
(lookup), apply_gradients (the fused update, or keeping it for the next step with pipelining),
the non-finite gradient policy, the partition statistics and the online limits. It loops over the
exchanges in order and never asks which kind each is.
"""
import contextlib

import tensorflow as tf

from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding.preprocessing import online_limits as online_limits_lib
from tf_sc_embedding.step import pipelining
from tf_sc_embedding.step import prefetch as prefetch_lib
from tf_sc_embedding.preprocessing import stats as stats_lib
from tf_sc_embedding.ops import gradient_check


class EmbeddingStep:
    """Enqueue, dequeue and apply_gradients of one built embedding (see the module docstring)."""

    def __init__(self, plan, storage, exchanges, group, options, sparse_core_config, pipelined,
                 touched=None):
        """touched: None, or the deltas.tracking.TouchedRows whose flags the updates mark."""
        self.plan = plan
        self._touched = touched
        self.exchanges = list(exchanges)
        self.storage = storage
        self._group = group
        self._non_finite = options.non_finite_gradients
        self._paths = [f.path for f in plan.features]
        self._tables_of_features = [f.table.name for f in plan.features]
        self.stats = self.online_limits = None
        if options.track_sparse_core_stats and plan.sharded is not None:
            self.stats = stats_lib.RunningStats(plan.sharded)
            if options.adapt_sparse_core_limits:
                self.online_limits = online_limits_lib.OnlineLimits(self.stats,
                                                                    sparse_core_config)
        self.stash = self.prefetched = None
        if pipelined:
            self.stash = pipelining.UpdateStash(
                self._update_targets(group.local_replica_ids[0]), group)
            self.prefetched = prefetch_lib.PrefetchStash(group)

    # ----------------------------------------------------------------------------- enqueue
    def enqueue(self, flat_ids, flat_weights, device=None, summarize=None):
        """{stacked name: preprocessed ids} of one replica's batch (flat, in feature order)."""
        ids = dict(zip(self._paths, flat_ids))
        weights = dict(zip(self._paths, flat_weights))
        result = {}
        with tf.device(device) if device else contextlib.nullcontext():
            for exchange in self.exchanges:
                observe = (self._stats_observer(summarize)
                           if self.stats is not None and exchange.layout is self.stats.layout
                           else None)
                result.update(exchange.preprocess(ids, weights, observe))
        return result

    def _stats_observer(self, summarize):
        if summarize is None:   # one replica of the process writes the summaries
            context = tf.distribute.get_replica_context()
            summarize = True
            if context is not None and context.num_replicas_in_sync > 1:
                replica = tf.get_static_value(context.replica_id_in_sync_group)
                summarize = replica is None or int(replica) == self._group.local_replica_ids[0]
        return lambda maxima: self.stats.observe_maxima(maxima, summarize)

    # ----------------------------------------------------------------------------- dequeue
    def dequeue(self, preprocessed, training=True):
        """(flat activations in feature order, preserved) of this replica's batch.

        A lookup that does not use a prefetched one makes it stale: it is forgotten. training=
        False: open vocabularies read their keys without admitting or counting them."""
        view = collectives.ReplicaView(self._group)
        if self.prefetched is not None:
            self.prefetched.forget(view.replica_id)
        variables = self.storage.stacked_variables()
        by_path, preserved = {}, []
        apply_kept = None
        if self.stash is not None:
            apply_kept = lambda: self._apply_kept(view.replica_id)   # noqa: E731
        for exchange in self.exchanges:
            activations, kept = exchange.lookup(view, preprocessed, variables, training,
                                                apply_kept)
            by_path.update(activations)
            preserved.append(kept)
        if self.online_limits is not None:
            self.online_limits.update(view)
        return [by_path[p] for p in self._paths], tuple(preserved)

    def prefetch(self, preprocessed, batch):
        """Runs what each exchange can of one replica's lookup of a batch now (from the tables
        as they are: `Exchange.look_ahead`) and keeps it for the next prefetching lookup
        (prefetch.py); returns the op that marks it kept. batch: (flat ids, flat weights)."""
        view = collectives.ReplicaView(self._group)
        variables = self.storage.stacked_variables()
        aheads = [exchange.look_ahead(view, preprocessed, variables)
                  for exchange in self.exchanges]
        if self.online_limits is not None:
            self.online_limits.update(view)
        return self.prefetched.keep(view.replica_id, aheads,
                                    prefetch_lib.batch_fingerprint(*batch))

    def lookup_prefetching(self, enqueue_next, current, upcoming, training=True):
        """(flat activations, preserved) of this step's batch, prefetched by the previous step
        (or `prefetch`) and completed here (`Exchange.lookup_after`); then what can be
        prefetched of the next batch's lookup, kept for the next step.

        enqueue_next: a callable that preprocesses the next batch; current / upcoming: (flat ids,
        flat weights) of this step's and the next step's batch. The kept update of the previous
        step (pipelining) is applied between the two: the next lookup reads the tables it leaves.
        Nothing else runs before this step's batch passed its checks (prefetch.py), nothing of
        it is mapped before the next batch passed its own, and the prefetch it reads is then
        used up (a step that fails later leaves none). The preserved outputs returned come out
        once the next lookup is kept, so a step that fails its gradient checks in
        apply_gradients still leaves the next batch prefetched.
        """
        view = collectives.ReplicaView(self._group)
        replica = view.replica_id
        current = tuple([v if v is None or isinstance(v, (tf.RaggedTensor, tf.SparseTensor))
                         else tf.convert_to_tensor(v) for v in part] for part in current)
        aheads, current = self.prefetched.read(replica, prefetch_lib.batch_fingerprint(*current),
                                               current)
        # Once checked, the prefetch is used up: a step that fails later leaves none, so the
        # next try prefetches again (and an open vocabulary's maps start from their steps then).
        with tf.control_dependencies(enqueue_lib.tensors_of(current)):
            forgotten = self.prefetched.forget(replica)
        with tf.control_dependencies([forgotten]):
            next_preprocessed = enqueue_next()   # may overlap the update
        # Nothing of this batch is mapped before the next batch passed its checks: a bad
        # next_features fails the step with every map as it was.
        ids, weights = dict(zip(self._paths, current[0])), dict(zip(self._paths, current[1]))
        variables = self.storage.stacked_variables()
        apply_kept = lambda: self._apply_kept(replica)   # noqa: E731
        by_path, preserved = {}, []
        with tf.control_dependencies(enqueue_lib.tensors_of(next_preprocessed) + [forgotten]):
            for exchange, ahead in zip(self.exchanges, aheads):
                activations, kept = exchange.lookup_after(
                    view, ahead, lambda e=exchange: e.preprocess(ids, weights), variables,
                    training, apply_kept)
                by_path.update(activations)
                preserved.append(kept)
        flat, preserved = [by_path[p] for p in self._paths], tuple(preserved)
        checked = [t for t in tf.nest.flatten((flat, preserved)) if t is not None]
        with tf.control_dependencies(checked):
            # Apply_gradients then finds nothing kept.
            applied = self._apply_kept(replica)
        with tf.control_dependencies([applied]):
            kept = self.prefetch(next_preprocessed, upcoming)
        with tf.control_dependencies([kept]):
            preserved = tf.nest.map_structure(
                lambda t: None if t is None else tf.identity(t), preserved)
        return flat, preserved

    def _apply_kept(self, replica_id):
        """Runs a replica's kept update (pipelining) now, counting skipped rows."""
        skipped = self.stash.apply_pending(replica_id, self._update_targets(replica_id),
                                           self._non_finite)
        if self._non_finite == "skip":
            counter = self._group.counter(replica_id, collectives.SKIPPED_GRADIENT_ROWS)
            skipped = counter.assign_add(skipped)
        return skipped

    def check_preserved(self, preserved):
        """preserved_outputs must be what dequeue returned (checked before any collective)."""
        ok = (isinstance(preserved, tuple) and len(preserved) == len(self.exchanges) and
              all(e.is_preserved(p) for e, p in zip(self.exchanges, preserved)) and
              all(isinstance(t, (tf.Tensor, tf.Variable))
                  for t in tf.nest.flatten(preserved) if t is not None))
        if not ok:
            raise ValueError("preserved_outputs must be the second value returned by dequeue / "
                             "embedding_lookup of this embedding in the same step (stacked "
                             f"tables {sorted(self.plan.stacked_tables)}); got "
                             f"{type(preserved).__name__}")

    # ----------------------------------------------------------------------------- update
    def _update_targets(self, replica_id):
        variables = self.storage.stacked_variables()
        targets = {}
        for exchange in self.exchanges:
            targets.update(exchange.update_targets(replica_id, variables))
        if self._touched is not None:
            targets = {name: target._replace(touched=self._touched.flags(name, replica_id))
                       for name, target in targets.items()}
        return targets

    def apply_gradients(self, flat_gradients, preserved):
        """The fused update of this step (or, pipelined, the previous step's; this one is kept).

        Returns tensors to depend on; with non_finite_gradients="skip" they count skipped rows.
        """
        view = collectives.ReplicaView(self._group)   # fails outside strategy.run
        self.check_preserved(preserved)
        by_path = dict(zip(self._paths, flat_gradients))
        stacked = [exchange.stack_gradients(by_path) for exchange in self.exchanges]
        targets = self._update_targets(view.replica_id)
        mode = self._non_finite
        skipped = []
        # No table is updated before every table's inputs passed validation: a bad id in one
        # feature must leave all tables unchanged, not only the table it belongs to.
        before = [t for t in tf.nest.flatten(preserved) if isinstance(t, tf.Tensor)]
        if self.stash is not None:
            # The previous step's update, after this step's lookup (program order on the table
            # variables) and independent of this step's gradients: it overlaps the dense work.
            # This step's checks wait for it, so a failing step never cancels it half-way.
            with tf.control_dependencies(before):   # once the lookup has read the tables
                skipped.append(self.stash.apply_pending(view.replica_id, targets, mode))
            before.append(skipped[-1])
        with tf.control_dependencies(before):
            inputs = self._update_inputs(view, preserved, stacked, flat_gradients, mode)
            recording = pipelining.summaries_recording() if self.stash is not None else True
            run_now = lambda: self._run(targets, inputs, mode)   # noqa: E731
            keep = lambda: self._keep(view.replica_id, inputs)   # noqa: E731
            if recording is True:      # sequential (also while summaries are recorded)
                skipped.append(run_now())
            elif recording is False:
                skipped.append(keep())
            else:
                skipped.append(tf.cond(recording, run_now, keep))
        updates = list(skipped)
        if mode == "skip":
            counter = self._group.counter(view.replica_id, collectives.SKIPPED_GRADIENT_ROWS)
            updates.append(counter.assign_add(tf.add_n(skipped)))
        return updates

    def _update_inputs(self, view, preserved, stacked, flat_gradients, mode):
        """{stacked name: UpdateInputs} after every exchange, checked finite in "error" mode.

        Every replica marks the features whose gradient has a NaN or Inf, and the marks are agreed
        over all replicas (inside the first exchange that carries them, else by an all-gather of
        their own), so every replica takes the same decision: the stateless check fails the step
        on every replica before any write, since the updates consume their inputs only as
        forwarded by the check (docs/optimizers.md#non-finite-gradients).
        """
        flags = carrier = None
        if mode == "error":
            flags = gradient_check.non_finite_flags(
                [None if g is None else tf.convert_to_tensor(g) for g in flat_gradients])
            carrier = next((e for e in self.exchanges if e.carries_flags), None)
            if carrier is None:
                stacked = self._require_finite(view.all_max(flags), stacked)
        inputs, agreed = {}, None
        for exchange, kept, gradients in zip(self.exchanges, preserved, stacked):
            carries = exchange is carrier
            values, agreed_here = exchange.update_inputs(view, kept, gradients,
                                                         flags if carries else None)
            inputs.update(values)
            if carries:
                agreed = agreed_here
        if agreed is not None:
            inputs = self._require_finite(agreed, inputs)
        return inputs

    def _require_finite(self, agreed_flags, values):
        checked = gradient_check.require_finite_gradients(
            agreed_flags, tf.nest.flatten(values), self._paths, self._tables_of_features)
        return tf.nest.pack_sequence_as(values, checked)

    @staticmethod
    def _run(targets, inputs, mode):
        keys = list(targets)
        results = fused_update.run_all(targets, inputs, mode)
        if mode == "skip":
            return fused_update.skipped_rows([targets[k] for k in keys], results)
        with tf.control_dependencies(results):
            return tf.constant(0, tf.int64)

    def _keep(self, replica_id, inputs):
        with tf.control_dependencies([self.stash.keep(replica_id, inputs)]):
            return tf.constant(0, tf.int64)

    def apply_pending(self, replica_ids_and_devices):
        """Runs the kept update of the given replicas (pipelining); [] without pipelining."""
        if self.stash is None:
            return []
        results = []
        for replica_id, device in replica_ids_and_devices:
            with tf.device(device):
                results.append(self._apply_kept(replica_id))
        return results

    def discard_kept(self):
        """Forgets the kept update and prefetched lookups (a restore replaced the tables)."""
        if self.stash is not None:
            self.stash.discard()
            self.prefetched.discard()
            for exchange in self.exchanges:
                exchange.discard_kept()
