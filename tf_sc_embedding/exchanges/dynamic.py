"""Open-vocabulary tables (docs/dynamic_vocabulary.md#in-the-training-step): keys mapped to rows
in the step that consumes the batch, then looked up and updated as fixed tables are.

`preprocess` (enqueue) only checks the keys and keeps them: it may run ahead of training (in a
`tf.data` pipeline), and a row taken back from an expired key while an older batch's update is
still to come would receive that update for the wrong key. `lookup` then, per table, over all
its features' occurrences (feature order, then sample order):

1. brings the keys to the map that holds them: one replica maps every occurrence itself; over
   several replicas each key goes to its owner shard's map (exchanges/key_exchange.py, one
   all-gather and one all-to-all for all tables), with its occurrences, so admission counts
   every replica's batch;
2. maps the keys to table rows (dynamic_tables.DynamicTable.map_keys); an occurrence without a
   row reads the owner's scratch row. Over several replicas the maps share the table's
   capacity: a map whose own rows are taken borrows the others' free rows in the step
   (`_map_lending`; dynamic_shards.ShardRows says where each row is stored);
3. writes the initial values and slot values of every row given to a key in this step (on the
   replica that stores it), and zeros into the scratch row (whose last update held the
   gradients of unadmitted keys). The map lists the rows to reset until the writes confirm
   them, so a step aborted between its mapping and its writes leaves them to the next step
   instead of unreset;
4. sends each key's row back to the replicas that asked (a second all-to-all), and looks the
   rows up as the all-to-all exchange does: over several replicas with its exchange; on one
   replica without it. There, when training, each map also numbers the distinct rows of its
   step (no routing sort: the COO converts the numbers themselves, `_lookup_numbered`); the
   unique rows are read in place in the variable (float32 rows, no quantization, one
   activation matrix per feature; else gathered first) and summed into the activations by the
   gathered segment sum, and backward the same op sums the gradients to one row per unique row
   for the fused update (all_to_all.owned_rows_inputs), padded to a multiple of the
   SparseCores by the segment sum itself. Each sample's rows are summed in input order, and
   the gradients of a row in sample order, so no number depends on which physical row a key
   holds, nor on the order of the unique rows: a run restored from a checkpoint (whose keys
   hold other rows) continues bit for bit, and the numbers are those of a fixed table
   exchanged all-to-all on as many replicas.
"""
import collections

import tensorflow as tf

from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
from tf_sc_embedding import private_tf
from tf_sc_embedding.exchanges import all_to_all
from tf_sc_embedding.exchanges import base
from tf_sc_embedding.exchanges import key_exchange
from tf_sc_embedding.ops import segment_sum
from tf_sc_embedding.ops.assign_rows import assign_rows
from tf_sc_embedding.ops.key_row_map import RowsToReset
from tf_sc_embedding.tables.table_storage import PARAMETERS, TableStorage

# What a dynamic lookup preserves for its update: `tables`, the lookup's own (one replica:
# {stacked name: LookedUpTable}; several: all_to_all.lookup's), and `steps`, the step each table's
# maps mapped (int64 [tables], -1 for a lookup that mapped nothing): the update records them, so
# that a later lookup knows whether a kept update may still write rows of keys it could evict
# (_settle_kept_update).
DynamicLookup = collections.namedtuple("DynamicLookup", ["tables", "steps"])
# Per stacked table, what apply_gradients needs from the lookup (one replica).
LookedUpTable = collections.namedtuple("LookedUpTable", [
    "sample_rows",        # [ids] row of each id's sample in the stacked activations
    "unique_positions",   # [ids] position of each id's row among unique_rows
    "gains",              # [ids] combiner weight of each id
    "unique_rows",        # [unique] rows of the variable that the ids read
])


class DynamicExchange(base.Exchange):
    """The dynamic tables of a plan (layout.EmbeddingPlan.dynamic)."""

    def __init__(self, layout, group, dynamic_tables, storage):
        super().__init__(layout, group)
        self._dynamic = dynamic_tables
        self._storage = storage
        for stacked in layout.stacked_tables.values():
            for placement in stacked.tables:   # the maps were made for the same placement
                shards = dynamic_tables.table(placement.name).shards
                if shards.rotation != (placement.layout.sparse_core_shard_rotation %
                                       shards.num_shards):
                    raise RuntimeError(f"table '{placement.name}': its maps give out rows for "
                                       "another layout than the one built")
        count = sum(len(stacked.tables) for stacked in layout.stacked_tables.values())
        # Per local replica, the steps of the lookup whose update the last step kept or ran.
        self._updated_steps = {}
        with tf.init_scope():
            for replica_id, device in zip(group.local_replica_ids, group.local_devices):
                with tf.device(device):
                    self._updated_steps[replica_id] = private_tf.plain_variable(
                        tf.fill([count], tf.constant(-1, tf.int64)),
                        f"dynamic_updated_steps_replica_{replica_id}")

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

    def lookup(self, view, preprocessed, variables, training=True, apply_kept=None):
        """training=False (inference) reads the keys' rows without changing the maps: no count,
        admission or eviction; a key without a row reads zeros. apply_kept: see
        `_settle_kept_update`."""
        return self._lookup(view, preprocessed, variables, training, apply_kept, None)

    def look_ahead(self, view, preprocessed, variables):
        """A prefetch only sends the keys to their owners (over several replicas): mapping them
        counts, admits and evicts, which must happen in the step that trains the batch, or a
        prefetch the loop never consumes (the last batch, a restore) would leave its counts
        (docs/dynamic_vocabulary.md#pipelining). The maps' last steps read here are the ones
        the consuming step's maps start from: any lookup in between forgets the prefetch."""
        del variables
        if view.num_replicas == 1:
            return base.Ahead({}, ())
        with tf.control_dependencies(enqueue_lib.tensors_of(preprocessed)):
            tables, keys = self._tables(preprocessed)
            sent = key_exchange.send_keys(view, keys, self._last_steps(view, tables))
        return base.Ahead({}, sent)

    def lookup_after(self, view, ahead, preprocess, variables, training=True, apply_kept=None):
        """Maps the keys `look_ahead` sent (one replica: the batch's own) and looks them up."""
        return self._lookup(view, preprocess(), variables, training, apply_kept,
                            ahead.kept or None)

    def _lookup(self, view, preprocessed, variables, training, apply_kept, sent):
        # Keys are mapped (and counted) only once every table's ids of the batch passed the
        # preprocessing checks: a batch that fails there leaves the maps as they were.
        with tf.control_dependencies(enqueue_lib.tensors_of(preprocessed)):
            by_path, preserved, steps = self._lookup_after_checks(
                view, preprocessed, variables, training, apply_kept, sent)
        return by_path, DynamicLookup(preserved, steps)

    def _tables(self, preprocessed):
        """(per dynamic table (placement, stacked table, its features' paths, their keys, the
        stacked table's preprocessed features by path), per table every occurrence of its keys
        in feature order)."""
        tables = []
        for stacked_name, stacked in self.stacked_tables.items():
            features = dict(zip([f.path for f in stacked.features], preprocessed[stacked_name]))
            for placement in stacked.tables:
                table = self._dynamic.table(placement.name)
                paths = [f.path for f in stacked.features if f.table.name == placement.name]
                keys = [table.check_keys(features[p][0], p) for p in paths]
                tables.append((placement, stacked, paths, keys, features))
        return tables, [tf.concat(t[3], axis=0) for t in tables]

    def _lookup_after_checks(self, view, preprocessed, variables, training, apply_kept, sent):
        """(activations by path, the lookup's preserved outputs, the steps mapped); sent:
        send_keys' result when a prefetch sent the keys (several replicas), else None."""
        tables, keys = self._tables(preprocessed)
        steps = [None] * len(tables)   # inference on one replica: no step is mapped
        at_owner = route = None
        if view.num_replicas > 1:   # each key to its owner's map, once per replica
            at_owner, route, steps = sent or key_exchange.send_keys(
                view, keys, self._last_steps(view, tables))
            keys = [k.keys if not training else key_exchange.every_occurrence(k.keys, k.counts)
                    for k in at_owner]
        elif training:   # one replica: its maps' next step
            steps = [last + 1 for last in self._last_steps(view, tables)]
        mapped = tf.stack(steps) if training else tf.fill([len(tables)], tf.constant(-1, tf.int64))
        settled = []
        if training and apply_kept is not None:
            settled = [self._settle_kept_update(view.replica_id, apply_kept, mapped)]
        with tf.control_dependencies(settled):
            if view.num_replicas == 1 and training:
                by_path, preserved = self._lookup_numbered(view, tables, keys, variables, steps)
                return by_path, preserved, mapped
            by_path = {}
            if training:   # several replicas: the maps lend each other rows
                rows_at_owner, resets = self._map_lending(view, tables, keys, variables, steps)
            else:
                resets, rows_at_owner = [], []
                for (placement, stacked, _, _, _), owned in zip(tables, keys):
                    rows, written = self._map_table(view, placement, stacked, owned, variables,
                                                    False)
                    rows_at_owner.append(rows)
                    resets.extend(written)
        if view.num_replicas > 1:
            if training:   # the row of each key's first occurrence (all of them read it)
                rows_at_owner = [tf.gather(rows, tf.cumsum(k.counts, exclusive=True))
                                 for rows, k in zip(rows_at_owner, at_owner)]
            rows_at_owner = key_exchange.return_rows(view, route, rows_at_owner)
        for (_, _, paths, table_keys, features), rows in zip(tables, rows_at_owner):
            by_path.update(_ids_by_path(paths, table_keys, features, rows))
        # The rows' preprocessing does not wait for the row writes; only reading the tables does.
        routed = all_to_all.preprocess_and_route(
            self, {p: ids for p, (ids, _) in by_path.items()},
            {p: weights for p, (_, weights) in by_path.items()})
        with tf.control_dependencies(resets):
            by_path, preserved = super().lookup(view, routed, variables)
        return by_path, preserved, mapped

    def _last_steps(self, view, tables):
        """Per table, the last step this replica's map mapped (int64)."""
        return [self._dynamic.table(t[0].name).last_step(view.replica_id) for t in tables]

    def _settle_kept_update(self, replica_id, apply_kept, steps):
        """With pipelining, the op that runs the kept update of an earlier step before this
        step's maps, when this step maps a number more than one past the steps of that update's
        lookup (docs/dynamic_vocabulary.md#pipelining).

        A kept update writes the rows of keys its lookup saw. A key expires only after more than
        steps_to_live >= 1 unseen steps, so the step right after that lookup cannot give such a
        row to another key, and the update may run after this step's lookup, as it does for
        fixed tables. A step that maps a later number can: after a step that failed once its
        keys were mapped (its update never kept, the earlier one still waiting), or after a
        step aborted on some replicas only (every map then maps one past the largest last
        step). The kept update then runs first, once."""
        skips = tf.reduce_any(steps > self._updated_steps[replica_id].read_value() + 1)
        return tf.cond(skips, lambda: tf.identity(apply_kept()),
                       lambda: tf.constant(0, tf.int64))

    def _lookup_numbered(self, view, tables, keys, variables, steps):
        """One replica, training: each map numbers the distinct rows of its step
        (DynamicTable.map_keys, numbered), so the ids the stacked COO converts are already
        positions among the stacked table's unique rows (each table's numbers offset by the
        unique rows of the tables before it), and the routing op's sort and deduplication are not
        needed. Equal, entry for entry, to routing the rows: the COO merges adjacent equal ids of
        a sample, and two occurrences have equal numbers exactly when they have equal rows."""
        members, resets = {}, []
        for table, owned, step in zip(tables, keys, steps):
            placement, stacked = table[0], table[1]
            numbered, written = self._map_table(view, placement, stacked, owned, variables,
                                                True, step, numbered=True)
            members.setdefault(stacked.name, []).append((table, numbered))
            resets.extend(written)
        by_path, unique_rows = {}, {}
        for name, tables_of_stack in members.items():
            counts = tf.stack([tf.size(n.unique_rows) for _, n in tables_of_stack])
            offsets = tf.cumsum(counts, exclusive=True)
            storage = []
            for k, ((placement, _, paths, table_keys, features), numbered) in enumerate(
                    tables_of_stack):
                by_path.update(_ids_by_path(paths, table_keys, features,
                                            numbered.positions + offsets[k]))
                storage.append(self._storage.storage_rows(placement.name,
                                                          numbered.unique_rows)[1])
            unique_rows[name] = tf.concat(storage, axis=0)
        flat = [by_path[f.path] for f in self.layout.features]
        coo = enqueue_lib.stacked_coo(self.layout, [ids for ids, _ in flat],
                                      [weights for _, weights in flat], positions=True)
        routed = {name: all_to_all.RoutedIds(coo[name][0], coo[name][2], unique_rows[name],
                                             tf.size(unique_rows[name])[tf.newaxis],
                                             coo[name][1])
                  for name in self.stacked_tables}
        with tf.control_dependencies(resets):
            return super().lookup(view, routed, variables)

    def _lookup_stacked(self, view, preprocessed, parameters):
        if view.num_replicas > 1:
            return all_to_all.lookup(view, self.layout, preprocessed, parameters)
        S = self.layout.sparse_cores_per_replica
        activations, preserved = {}, {}
        for name, table in self.stacked_tables.items():
            routed = preprocessed[name]
            blocks = all_to_all.feature_blocks(self.layout, table)
            if (blocks is not None and table.quantization is None and
                    table.dtype == "float32"):
                # The unique rows are read in place in the variable's value (not copied), not
                # gathered into a copy first.
                activations[name] = segment_sum.gathered_segment_sum_to_features(
                    parameters[name].read_value(), routed.unique_positions, routed.gains,
                    routed.row_ids, S, blocks, row_indices=routed.unique_rows, table_name=name)
            else:
                # 16-bit or quantized rows are gathered, widened and quantized first: from the
                # variable's value (a ResourceGather would put the variable in copy-on-read
                # mode, after which its in-place updates copy the whole table).
                rows = tf.gather(parameters[name].read_value(), routed.unique_rows)
                rows = all_to_all.quantized(tf.cast(rows, tf.float32), table.quantization)
                if blocks is not None:
                    activations[name] = segment_sum.gathered_segment_sum_to_features(
                        rows, routed.unique_positions, routed.gains, routed.row_ids, S, blocks,
                        table_name=name)
                else:
                    activations[name] = segment_sum.gathered_segment_sum(
                        rows, routed.unique_positions, routed.gains, routed.row_ids,
                        table.sample_count, table_name=name)
            # The update's rows come out only once the lookup read the table: a value of the
            # table still alive when the update writes would make it copy the whole table.
            with tf.control_dependencies(tf.nest.flatten(activations[name])):
                unique_rows = tf.identity(routed.unique_rows)
            preserved[name] = LookedUpTable(routed.row_ids, routed.unique_positions, routed.gains,
                                            unique_rows)
        return activations, preserved

    def is_preserved(self, preserved):
        if not (isinstance(preserved, DynamicLookup) and isinstance(preserved.steps, tf.Tensor)):
            return False
        tables = preserved.tables
        if self.layout.num_replicas > 1:
            return all_to_all.is_exchanged(tables, self.layout)
        return (isinstance(tables, dict) and set(tables) == set(self.stacked_tables) and
                all(isinstance(v, LookedUpTable) for v in tables.values()))

    def gradient_order(self, name):
        return all_to_all.gradient_order(self.layout, name)

    def _update_arguments(self, replica_id):
        return all_to_all.owned_rows_arguments(self.layout, replica_id)

    def discard_kept(self):
        for variable in self._updated_steps.values():
            variable.assign(tf.fill(tf.shape(variable), tf.constant(-1, tf.int64)))

    def update_inputs(self, view, preserved, gradients, flags=None):
        del flags   # never given: this exchange does not carry them (the step agrees on them)
        # The steps whose rows this update writes (_settle_kept_update), recorded before the
        # update's inputs exist, so before the step can keep them.
        recorded = self._updated_steps[view.replica_id].assign(preserved.steps)
        inputs, agreed = self._update_inputs(view, preserved.tables, gradients)
        with tf.control_dependencies([recorded]):
            return tf.nest.map_structure(
                lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, inputs), agreed

    def _update_inputs(self, view, preserved, gradients):
        if view.num_replicas > 1:
            received, _ = all_to_all.exchange_gradients(view, self.layout, preserved, gradients)
            return all_to_all.owned_rows_inputs(self.layout, view.replica_id, received,
                                                padded=True), None
        S = self.layout.sparse_cores_per_replica
        rows = {}
        for name, table in self.stacked_tables.items():
            state = preserved[name]
            # One gradient row per unique row, then zero rows up to a multiple of S, as the
            # owner's update reads them (all_to_all.owned_rows_inputs, padded): written by the
            # segment sum itself, with no padded copy.
            padded = (tf.size(state.unique_rows) + S - 1) // S * S
            blocks = all_to_all.feature_blocks(self.layout, table)
            if blocks is not None:
                per_unique = segment_sum.gathered_segment_sum_from_features(
                    gradients[name], state.sample_rows, state.gains, state.unique_positions,
                    padded, S, blocks, table_name=name)
            else:
                per_unique = segment_sum.gathered_segment_sum(
                    gradients[name], state.sample_rows, state.gains, state.unique_positions,
                    padded, table_name=name)
            rows[name] = (state.unique_rows, per_unique)
        return all_to_all.owned_rows_inputs(self.layout, 0, rows, padded=True), None

    def _map_lending(self, view, tables, keys, variables, steps):
        """Several replicas, training: (per table the table row of each key this replica's map
        holds, the writes to wait for), with the table's capacity shared by all the maps
        (docs/dynamic_vocabulary.md#capacity-over-several-replicas).

        1. Each map maps its keys; keys that find every row of the map taken wait
           (DynamicTable.begin_map), and the map reports [waiting keys, rows it can lend, rows
           to reset that another replica stores].
        2. One all-gather of those counts (all tables); from them every replica computes the
           same plan: maps with free rows lend them, replica after replica, to the maps with
           waiting keys, replica after replica (`_lending_plan`).
        3. Only when some map lends or must reset a row another replica stores (every replica
           takes the same branch): lenders give up their rows (DynamicTable.lend_rows), an
           all-to-all brings them to the borrowers, each map ends its step
           (DynamicTable.finish_map: waiting keys take lent rows in order, the rest are
           refused), and the rows to reset that another replica stores go there, with their
           keys, for it to write (`_reset_elsewhere`). Otherwise each map ends its step alone.
        """
        me, W = view.replica_id, view.num_replicas
        names = [t[0].name for t in tables]
        dynamic = [self._dynamic.table(n) for n in names]
        begun = [table.begin_map(me, owned, step)
                 for table, owned, step in zip(dynamic, keys, steps)]
        counts = tf.stack([b.counts for b in begun])                        # [T, 3]
        gathered = tf.reshape(view.all_gather(tf.cast(counts, tf.int32)[None]),
                              [W, len(tables), 3])
        plan = _lending_plan(gathered[:, :, 0], gathered[:, :, 1])          # [T, W lender, W]
        exchange = tf.logical_or(tf.reduce_any(plan > 0),
                                 tf.reduce_any(gathered[:, :, 2] > 0))

        def finish(lent_by_table, after):
            rows, to_reset, stats = [], [], []
            for table, owned, part, lent in zip(dynamic, keys, begun, lent_by_table):
                r, listed, counted = table.finish_map(me, lent, owned, part, after)
                rows.append(r)
                to_reset.append(listed)
                stats.append(counted)
            return rows, to_reset, stats

        def shared():
            lent_out = [table.lend_rows(me, tf.reduce_sum(plan[t, me]))
                        for t, table in enumerate(dynamic)]
            send = tf.transpose(plan[:, me, :])                             # [W dest, T]
            receive = tf.transpose(plan[:, :, me])                          # [W source, T]
            chunk = tf.maximum(tf.reduce_max(tf.reduce_sum(plan, axis=0)), 1)
            lent_in = all_to_all.unpack_by_replica(
                all_to_all.all_to_all_flat(view, all_to_all.pack_by_replica(
                    lent_out, send, chunk)), receive, [None] * len(tables))
            rows, to_reset, stats = finish(lent_in, lent_out)
            written = self._reset_elsewhere(view, tables, dynamic, to_reset, variables)
            return rows, [t.rows for t in to_reset], [t.keys for t in to_reset], stats, written

        def alone():
            rows, to_reset, stats = finish([tf.zeros([0], tf.int32)] * len(tables), ())
            return (rows, [t.rows for t in to_reset], [t.keys for t in to_reset], stats,
                    tf.constant(0, tf.int32))

        # The branches touch only this replica's maps and variables: the counters (one variable
        # of the process) are updated after the branch, or one replica's branch would wait for
        # another's.
        rows, reset_rows, reset_keys, stats, written = tf.cond(exchange, shared, alone)
        resets = [table.count(s) for table, s in zip(dynamic, stats)]
        for (placement, stacked, _, _, _), table, listed_rows, listed_keys in zip(
                tables, dynamic, reset_rows, reset_keys):
            listed = RowsToReset(listed_rows, listed_keys)
            writes = self._write_resets(view, placement, stacked, table,
                                        table.in_table_rows(listed), variables, scratch=True)
            resets.extend(writes)
            with tf.control_dependencies([written]):
                resets.append(table.confirm_reset(me, listed, writes))
        return rows, resets

    def _reset_elsewhere(self, view, tables, dynamic, to_reset, variables):
        """Sends every table's rows to reset that another replica stores (rows of the whole
        table, with their keys) to that replica, which writes their initial values and slots;
        returns an op to wait for. One all-gather of the counts and one all-to-all."""
        me, W = view.replica_id, view.num_replicas
        payloads, counts = [], []
        for table, listed in zip(dynamic, to_reset):
            stored, _ = table.shards.share_of_tensor(listed.rows)
            elsewhere = tf.not_equal(stored, me)
            stored = tf.boolean_mask(stored, elsewhere)
            order = tf.argsort(stored, stable=True)
            rows = tf.gather(tf.boolean_mask(listed.rows, elsewhere), order)
            keys = tf.gather(tf.boolean_mask(listed.keys, elsewhere), order)
            words = tf.concat([rows[:, None], tf.reshape(tf.bitcast(keys, tf.int32), [-1, 2])],
                              axis=1)
            payloads.append(words)
            counts.append(tf.math.bincount(stored, minlength=W, maxlength=W, dtype=tf.int32))
        send = tf.stack(counts, axis=1)                                     # [W dest, T]
        every = tf.reshape(view.all_gather(send[None]), [W, W, len(tables)])
        chunk = tf.maximum(tf.reduce_max(tf.reduce_sum(every, axis=2)) * 3, 1)
        received = all_to_all.unpack_by_replica(
            all_to_all.all_to_all_flat(view, all_to_all.pack_by_replica(payloads, send, chunk)),
            every[:, me, :], [3] * len(tables))
        writes = []
        for (placement, stacked, _, _, _), table, words in zip(tables, dynamic, received):
            keys = tf.reshape(tf.bitcast(tf.reshape(words[:, 1:], [-1, 2]), tf.int64), [-1])
            listed = table.in_table_rows(RowsToReset(words[:, 0], keys))
            writes.extend(self._write_resets(view, placement, stacked, table, listed, variables,
                                             scratch=False))
        with tf.control_dependencies(writes):
            return tf.constant(0, tf.int32)

    def _write_resets(self, view, placement, stacked, table, to_reset, variables, scratch):
        """The writes of the initial values and slots of rows to reset (RowsToReset in table
        rows) that this replica stores (scratch: and of its scratch row)."""
        replica = view.replica_id
        rows = (table.rows_to_write(replica, to_reset) if scratch else to_reset.rows)
        # Where the rows to write live: the same for the parameters and every slot.
        owner, storage_rows = self._storage.storage_rows(placement.name, rows)
        mine = None   # one replica stores every row
        if view.num_replicas > 1:
            mine = tf.equal(owner, replica)
            storage_rows = tf.boolean_mask(storage_rows, mine)
        writes = []
        for kind in table.kinds:
            width = (placement.dim if kind == PARAMETERS
                     else TableStorage.stored_width(stacked, kind))
            values = table.reset_values(to_reset, kind, width)
            if not scratch:
                values = values[:-1]
            if mine is not None:
                values = tf.boolean_mask(values, mine)
            variable = variables[stacked.name][kind].shard(replica)
            writes.append(assign_rows(variable, storage_rows, values, placement.name))
        return writes

    def _map_table(self, view, placement, stacked, keys, variables, training, step=None,
                   numbered=False):
        """(table row of each key, the row writes to wait for) of the keys of one table that
        this replica's map holds (one replica: every occurrence of the batch; several, only
        for inference: each key the key exchange brought, once; training over several replicas
        maps through _map_lending); step: the step to map (None: this map's next one).

        The rows written are the map's rows to reset (this step's new rows, after those of a
        step aborted before its writes ran) and the replica's scratch row; the map forgets them
        only once the writes ran. Not training: the keys are only found; the scratch row (which
        the last update may have written) and any rows an aborted step left are reset (over
        several replicas those this replica stores, confirmed by the next training step)."""
        table = self._dynamic.table(placement.name)
        replica = view.replica_id
        if training:
            rows, to_reset, _ = table.map_keys(replica, keys, step, numbered)
        else:
            rows, to_reset, _ = table.find_keys(replica, keys)
        writes = self._write_resets(view, placement, stacked, table, to_reset, variables,
                                    scratch=True)
        if view.num_replicas > 1:
            # Inference over several replicas (training maps through _map_lending): rows an
            # aborted step left may be stored elsewhere and were not written here, so they stay
            # listed for the next training step, which writes them where they are stored.
            return rows, writes
        confirmed = table.confirm_reset(replica, to_reset, writes)
        return rows, writes + [confirmed]


def _lending_plan(waiting, free):
    """int32 [T, W, W]: per table, the rows replica q's map lends replica r's ([t, q, r]), from
    every map's waiting keys and lendable rows ([W, T] each, gathered). Lenders in replica order
    fill borrowers in replica order: the overlap of lender q's interval of the free rows' running
    sum with borrower r's interval of the waiting keys' running sum, so no map lends more than
    it has and no map gets more than it waits for; every replica computes the same plan."""
    waiting = tf.transpose(waiting)                                     # [T, W]
    free = tf.transpose(free)
    free_end = tf.cumsum(free, axis=1)
    wait_end = tf.cumsum(waiting, axis=1)
    low = tf.maximum((free_end - free)[:, :, None], (wait_end - waiting)[:, None, :])
    high = tf.minimum(free_end[:, :, None], wait_end[:, None, :])
    return tf.maximum(high - low, 0)


def _ones_like(ids):
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(tf.ones_like(ids.flat_values, tf.float32))
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape)
    return tf.ones(tf.shape(ids), tf.float32)


def _ids_by_path(paths, table_keys, features, values):
    """{path: (ids, weights)} of one table's features, each feature's keys replaced by its part
    of `values` (one value per occurrence of the table's keys, features in `paths` order)."""
    parts = (tf.split(values, [tf.size(k) for k in table_keys]) if len(table_keys) > 1
             else [values])
    return {p: (_with_values(features[p][0], part), features[p][1])
            for p, part in zip(paths, parts)}


def _with_values(ids, values):
    """ids with its keys replaced by their rows (same kind and structure)."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(values)
    if isinstance(ids, tf.SparseTensor):
        return tf.SparseTensor(ids.indices, values, ids.dense_shape)
    return tf.reshape(values, tf.shape(ids))
