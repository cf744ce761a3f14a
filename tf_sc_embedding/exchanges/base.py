"""The exchange interface: one placement's input distribution, lookup and output distribution.

A plan (layout.EmbeddingPlan) places every table either sharded over the replicas or replicated on
each; the sharded tables are exchanged all-to-all or all-gathered. Each of these is one `Exchange`
object owning the tables of its part of the plan, in the spirit of TorchRec's `EmbeddingSharding`
(input dist -> lookup -> output dist). The training step (step.py) loops over the exchanges of a
plan in order and never asks which kind it holds; everything that differs between placements lives
in the subclasses:

* `preprocess`: host preprocessing of one replica's features (with or without minibatch splits);
* `lookup`: ids to their rows and rows to the activations of every feature, plus the state the
  update needs (`preserved`), which `is_preserved` recognizes. A pipelined update runs once it
  has the preserved outputs (step.py), so every tensor of `preserved` must come out only after
  the lookup is done reading the tables: a table value still alive when the update writes makes
  the update copy the whole table (all_to_all.py ties its owner rows to the packing for this);
* `look_ahead`, `lookup_after`: the same lookup split in two for prefetching
  (docs/pipelining.md#prefetching-the-next-lookup): the part that may run a step early, and the
  rest, in the step that consumes the batch;
* `stack_gradients`, `update_targets`, `update_inputs`: the backward pass, ending with one fused
  optimizer update per stacked table on the replica's own variables (fused_update.py).
"""
import abc
import collections

from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.optimizers import fused_update
from tf_sc_embedding.tables.table_storage import PARAMETERS

# What a prefetch keeps of one exchange's lookup of the next batch (prefetch.PrefetchStash):
# `activations` ({feature path: tensor}, shapes fixed by the layout) and `kept`, a nest of
# tensors whose sizes change with every batch, which `lookup_after` completes.
Ahead = collections.namedtuple("Ahead", ["activations", "kept"])


class Exchange(abc.ABC):
    """The tables of one part of the plan and how a step moves their ids, rows and gradients."""

    # Whether preprocessing proposes minibatch splits (only the CSR lookups consume them).
    with_splits = False
    # Whether the gradient exchange can agree on the non-finite flags of every replica in the same
    # collective (docs/optimizers.md#non-finite-gradients); else the step agrees on them itself.
    carries_flags = False

    def __init__(self, layout, group):
        self.layout = layout
        self.group = group

    @property
    def stacked_tables(self):
        return self.layout.stacked_tables

    # ----------------------------------------------------------------- input distribution
    def preprocess(self, ids_by_path, weights_by_path, observe_maxima=None):
        """{stacked name: preprocessed ids} of one replica's batch (enqueue.preprocess)."""
        features = self.layout.features
        return enqueue_lib.preprocess(
            self.layout, [ids_by_path[f.path] for f in features],
            [weights_by_path[f.path] for f in features], with_splits=self.with_splits,
            observe_maxima=observe_maxima)

    # ----------------------------------------------------------------- lookup
    def lookup(self, view, preprocessed, variables, training=True, apply_kept=None):
        """({feature path: activations}, preserved) of this replica's batch.

        variables: {stacked name: {kind: table_storage.ShardedTable}} of the whole plan.
        training: False for a lookup that must change no state (only open vocabularies have
        state a lookup changes; exchanges/dynamic.py).
        apply_kept: with pipelining, a callable that returns the op running this replica's kept
        update now. Only a lookup that could hand a row of that update to another key before it
        runs calls it (exchanges/dynamic.py); the others leave the update to the step.
        """
        del training, apply_kept
        parameters = {name: variables[name][PARAMETERS].shard(view.replica_id)
                      for name in self.stacked_tables}
        stacked_activations, preserved = self._lookup_stacked(view, preprocessed, parameters)
        by_path = {}
        for name, stacked in self.stacked_tables.items():
            by_path.update(enqueue_lib.unstack_activations(
                self.layout, stacked, stacked_activations[name],
                feature_major=self.feature_major_rows(name) is not None))
        return by_path, preserved

    def look_ahead(self, view, preprocessed, variables):
        """The part of a later batch's lookup a prefetch runs now (an `Ahead`): by default all
        of it, since a lookup of fixed tables changes no state and reads tables that hold what
        the consuming step's lookup would read (docs/pipelining.md#the-same-numbers)."""
        activations, preserved = self.lookup(view, preprocessed, variables)
        return Ahead(activations, preserved)

    def lookup_after(self, view, ahead, preprocess, variables, training=True, apply_kept=None):
        """(activations by path, preserved) of the batch `look_ahead` gave `ahead` for, in the
        step that consumes it. preprocess: a callable giving this exchange's preprocessing of
        the batch (for an exchange that looks ahead only partly); training and apply_kept as
        for `lookup`."""
        del view, preprocess, variables, training, apply_kept
        return ahead.activations, ahead.kept

    @abc.abstractmethod
    def _lookup_stacked(self, view, preprocessed, parameters):
        """({stacked name: [samples, padded_width] activations}, preserved)."""

    @abc.abstractmethod
    def is_preserved(self, preserved):
        """Whether `preserved` is what this exchange's lookup returned (checked statically)."""

    def feature_major_rows(self, name):
        """Each feature's rows per SparseCore when the lookup of stacked table `name` writes its
        activations feature-major (docs/lookup.md#activation-row-order), else None."""
        del name
        return None

    def gradient_order(self, name):
        """The order enqueue.stack_gradients gives stacked table `name`'s gradients in."""
        del name
        return enqueue_lib.SPARSE_CORE_MAJOR

    # ----------------------------------------------------------------- output distribution
    def stack_gradients(self, gradients_by_path):
        """{stacked name: gradients} from the gradients of the features' activations."""
        return {name: enqueue_lib.stack_gradients(self.layout, stacked, gradients_by_path,
                                                  self.gradient_order(name))
                for name, stacked in self.stacked_tables.items()}

    def update_targets(self, replica_id, variables):
        """{stacked name: fused_update.UpdateTarget} of one replica (no tensor of a step)."""
        targets = {}
        for name, stacked in self.stacked_tables.items():
            kinds = variables[name]
            arguments = self._update_arguments(replica_id)
            rows = self.feature_major_rows(name)
            if rows is not None:
                arguments = dict(arguments, feature_rows_per_sc=rows)
            targets[name] = fused_update.UpdateTarget(
                stacked, arguments, kinds[PARAMETERS].shard(replica_id),
                [kinds[slot].shard(replica_id) for slot in stacked.optimizer.slot_names],
                self._counts_skipped_rows(replica_id),
                self.group.counter(replica_id, collectives.UPDATE_STEPS))
        return targets

    @abc.abstractmethod
    def _update_arguments(self, replica_id):
        """The fused update op's static shard attributes on one replica."""

    def _counts_skipped_rows(self, replica_id):
        """Whether rows this replica's update skips count in its skipped-rows counter."""
        del replica_id
        return True

    def discard_kept(self):
        """Forgets what the exchange holds about a kept update (pipelining), which a restore has
        just discarded (eagerly, every local replica)."""

    @abc.abstractmethod
    def update_inputs(self, view, preserved, gradients, flags=None):
        """({stacked name: fused_update.UpdateInputs}, agreed flags or None) of this step.

        gradients: stack_gradients' result. flags (int32 [features]) are only given to an
        exchange that carries_flags; it returns their maximum over all replicas.
        """
