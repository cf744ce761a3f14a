"""Open-vocabulary tables (docs/dynamic_vocabulary.md#in-the-training-step): keys mapped to rows
in the step that consumes the batch, then looked up and updated as fixed tables are.

`preprocess` (enqueue) only checks the keys and keeps them: it may run ahead of training (in a
`tf.data` pipeline), and a row taken back from an expired key while an older batch's update is
still to come would receive that update for the wrong key. `lookup` then, per table, in one call
over all its features' occurrences (feature order, then sample order):

1. maps the keys to rows (dynamic_tables.DynamicTable.map_keys); an occurrence without a row
   reads the scratch row, the one row beyond the table's capacity;
2. writes the initial values and slot values of every row given to a key in this step, and
   zeros into the scratch row (whose last update held the gradients of unadmitted keys). The
   map lists the rows to reset until the writes confirm them, so a step aborted between its
   mapping and its writes leaves them to the next step instead of unreset;
3. looks the rows up as the all-to-all exchange does, without its exchange (one replica holds
   every row): the routing op's unique rows are gathered from the variable and summed into the
   activations by the gathered segment sum; backward, the same op sums the gradients to one row
   per unique row, and the fused update writes those rows (all_to_all.owned_rows_inputs). Each
   sample's rows are summed in input order, and the gradients of a row in sample order, so no
   number depends on which physical row a key holds: a run restored from a checkpoint (whose
   keys hold other rows) continues bit for bit, and the numbers are those of a fixed table
   exchanged all-to-all.

One replica only, for now: the embedding refuses dynamic tables over several replicas
(embedding.py).
"""
import collections

import tensorflow as tf

from tf_sc_embedding.exchanges import all_to_all
from tf_sc_embedding.exchanges import base
from tf_sc_embedding.ops import segment_sum
from tf_sc_embedding.ops.assign_rows import assign_rows
from tf_sc_embedding.table_storage import PARAMETERS, TableStorage

# Per stacked table, what apply_gradients needs from the lookup.
LookedUpTable = collections.namedtuple("LookedUpTable", [
    "sample_rows",        # [ids] row of each id's sample in the stacked activations
    "unique_positions",   # [ids] position of each id's row among unique_rows
    "gains",              # [ids] combiner weight of each id
    "unique_rows",        # [unique] rows of the variable that the ids read
])


class DynamicExchange(base.Exchange):
    """The dynamic tables of a plan (layout.EmbeddingPlan.dynamic) on one replica."""

    def __init__(self, layout, group, dynamic_tables, storage):
        super().__init__(layout, group)
        self._dynamic = dynamic_tables
        self._storage = storage

    def preprocess(self, ids_by_path, weights_by_path, observe_maxima=None):
        """{stacked name: per feature (keys as given, weights or ones)}: checked, not mapped."""
        del observe_maxima   # the step observes only the sharded tables' statistics
        result = {}
        for feature in self.layout.features:
            table = self._dynamic.table(feature.table.name)
            ids = ids_by_path[feature.path]
            if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
                ids = tf.convert_to_tensor(ids)
            table.check_keys(ids, feature.path)
            weights = weights_by_path[feature.path]
            if weights is None:   # numerically the same as no weights: every gain is 1
                weights = _ones_like(ids)
            result.setdefault(feature.table.layout.stacked_table_name, []).append((ids, weights))
        return {name: tuple(features) for name, features in result.items()}

    def lookup(self, view, preprocessed, variables, training=True):
        """training=False (inference) reads the keys' rows without changing the maps: no count,
        admission or eviction; a key without a row reads zeros."""
        # Keys are mapped (and counted) only once every table's ids of the batch passed the
        # preprocessing checks: a batch that fails there leaves the maps as they were.
        checked = [t for t in tf.nest.flatten(preprocessed, expand_composites=True)
                   if isinstance(t, tf.Tensor)]
        with tf.control_dependencies(checked):
            return self._lookup_after_checks(view, preprocessed, variables, training)

    def _lookup_after_checks(self, view, preprocessed, variables, training):
        by_path = {}
        resets = []
        for stacked_name, stacked in self.stacked_tables.items():
            features = dict(zip([f.path for f in stacked.features], preprocessed[stacked_name]))
            for table in stacked.tables:
                mapped, written = self._map_table(view, table, stacked, features, variables,
                                                  training)
                by_path.update(mapped)
                resets.extend(written)
        with tf.control_dependencies(resets):
            routed = all_to_all.preprocess_and_route(
                self, {p: ids for p, (ids, _) in by_path.items()},
                {p: weights for p, (_, weights) in by_path.items()})
            return super().lookup(view, routed, variables)

    def _lookup_stacked(self, view, preprocessed, parameters):
        del view   # one replica: every row is local
        S = self.layout.sparse_cores_per_replica
        activations, preserved = {}, {}
        for name, table in self.stacked_tables.items():
            routed = preprocessed[name]
            rows = tf.gather(parameters[name], routed.unique_rows)
            rows = all_to_all.quantized(tf.cast(rows, tf.float32), table.quantization)
            blocks = all_to_all.feature_blocks(self.layout, table)
            if blocks is not None:
                activations[name] = segment_sum.gathered_segment_sum_to_features(
                    rows, routed.unique_positions, routed.gains, routed.row_ids, S, blocks,
                    table_name=name)
            else:
                activations[name] = segment_sum.gathered_segment_sum(
                    rows, routed.unique_positions, routed.gains, routed.row_ids,
                    table.sample_count, table_name=name)
            preserved[name] = LookedUpTable(routed.row_ids, routed.unique_positions, routed.gains,
                                            routed.unique_rows)
        return activations, preserved

    def is_preserved(self, preserved):
        return (isinstance(preserved, dict) and set(preserved) == set(self.stacked_tables) and
                all(isinstance(v, LookedUpTable) for v in preserved.values()))

    def gradient_order(self, name):
        return all_to_all.gradient_order(self.layout, name)

    def _update_arguments(self, replica_id):
        del replica_id   # the one replica
        return all_to_all.owned_rows_arguments(self.layout, 0)

    def update_inputs(self, view, preserved, gradients, flags=None):
        del view, flags   # one replica; flags are never given: this exchange does not carry them
        S = self.layout.sparse_cores_per_replica
        rows = {}
        for name, table in self.stacked_tables.items():
            state = preserved[name]
            unique = tf.size(state.unique_rows)
            blocks = all_to_all.feature_blocks(self.layout, table)
            if blocks is not None:
                per_unique = segment_sum.gathered_segment_sum_from_features(
                    gradients[name], state.sample_rows, state.gains, state.unique_positions,
                    unique, S, blocks, table_name=name)
            else:
                per_unique = segment_sum.gathered_segment_sum(
                    gradients[name], state.sample_rows, state.gains, state.unique_positions,
                    unique, table_name=name)
            rows[name] = (state.unique_rows, per_unique)
        return all_to_all.owned_rows_inputs(self.layout, 0, rows), None

    def _map_table(self, view, placement, stacked, features, variables, training):
        """({path: (row ids, weights)} of one table's features, the row writes to wait for).

        The rows written are the map's rows to reset (this step's new rows, after those of a
        step aborted before its writes ran) and the scratch row; the map forgets them only
        once the writes ran. Not training: the keys are only found; the scratch row (which the
        last update may have written) and any rows an aborted step left are reset."""
        table = self._dynamic.table(placement.name)
        paths = [f.path for f in stacked.features if f.table.name == placement.name]
        keys = [table.check_keys(features[p][0], p) for p in paths]
        if training:
            rows, new_rows, step = table.map_keys(tf.concat(keys, axis=0))
        else:
            rows, new_rows, step = table.find_keys(tf.concat(keys, axis=0))
        parts = tf.split(rows, [tf.size(k) for k in keys])
        # Where the rows to write live: the same for the parameters and every slot.
        replica, storage_rows = self._storage.storage_rows(placement.name,
                                                           table.rows_to_write(new_rows))
        mine = tf.equal(replica, view.replica_id)
        storage_rows = tf.boolean_mask(storage_rows, mine)
        writes = []
        for kind in table.kinds:
            width = (placement.dim if kind == PARAMETERS
                     else TableStorage.stored_width(stacked, kind))
            values = table.reset_values(new_rows, step, kind, width)
            variable = variables[stacked.name][kind].shard(view.replica_id)
            writes.append(assign_rows(variable, storage_rows, tf.boolean_mask(values, mine),
                                      placement.name))
        confirmed = table.confirm_reset(new_rows, writes)
        return {p: (_with_values(features[p][0], part), features[p][1])
                for p, part in zip(paths, parts)}, writes + [confirmed]


def _ones_like(ids):
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(tf.ones_like(ids.flat_values, tf.float32))
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape)
    return tf.ones(tf.shape(ids), tf.float32)


def _with_values(ids, values):
    """ids with its keys replaced by their rows (same kind and structure)."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(values)
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, values, ids.dense_shape)
    return tf.reshape(values, tf.shape(ids))
