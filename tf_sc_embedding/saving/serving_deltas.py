"""`apply_delta(path)` of the serving SavedModel: deltas applied in place with stock ops only.

The serving model (serving.py) keeps the delta position of the tables it was exported from, and
each delta names the position it applies to (deltas/delta_format.py), so a live model takes the
deltas written after its export in order and refuses any other. Everything a delta holds is
read and checked first: its parts and their chain line, each file's size and farmhash64
fingerprint against the part's chain.txt index, the .npy headers, ids within their table, keys
against the rows sent, room for new keys. Only then, behind those checks, is anything written:

* a fixed table: the delta's rows scattered into the serving rows (int8 rows re-quantized per
  row with the export's own rule, serving_rows.py);
* an open vocabulary: its keys live in a stock mutable hash table. Removed keys (tombstones)
  leave it and give their rows back to a stack of free rows; new keys take rows from that
  stack; every key the delta carries gets its row written. A key the table does not hold,
  evicted ones included, reads the zero row, as at export.

The number of parts is the training job's worker count at export (a static loop): a delta with
another count fails its checks.
"""
import tensorflow as tf

from tf_sc_embedding.deltas import delta_format as fmt

_NPY_MAGIC = b"\x93NUMPY\x01\x00"
_DECODED = {"float32": tf.float32, "float16": tf.float16, "bfloat16": tf.bfloat16}
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_HEX = list("0123456789abcdef")


def _require(condition, message):
    """An assertion whose error carries only `message` (a delta's bytes may not be text)."""
    return tf.debugging.Assert(tf.reduce_all(condition), [message])


def decode_ids(data):
    """(ids, checks) of uint8 LEB128 varint gaps (delta_format.encode_ids), with stock ops."""
    data = tf.cast(data, tf.int64)
    size = tf.size(data, out_type=tf.int64)
    ends = data < 128
    count = tf.reduce_sum(tf.cast(ends, tf.int64))
    group = tf.cumsum(tf.cast(ends, tf.int64), exclusive=True)   # the id of each byte
    starts = tf.concat([[0], tf.reshape(tf.where(ends), [-1])[:-1] + 1], 0)
    position = tf.range(size) - tf.gather(starts, tf.minimum(group, count))
    checks = [_require(tf.logical_or(tf.equal(size, 0), tf.reduce_all(ends[-1:])),
                       "ids: the last id is cut short"),
              _require(position < 9, "ids: a gap is too long")]
    with tf.control_dependencies(checks):
        shifted = tf.bitwise.left_shift(tf.bitwise.bitwise_and(data, 127), 7 * position)
        gaps = tf.math.unsorted_segment_sum(shifted, group, count)
    return tf.cumsum(gaps), checks


def _hex(fingerprint):
    """The lowercase hex of a fingerprint's 8 bytes, as Python's bytes.hex() writes it."""
    value = tf.cast(fingerprint, tf.int32)
    pairs = tf.stack([tf.gather(_HEX, value // 16), tf.gather(_HEX, value % 16)], 1)
    return tf.strings.reduce_join(tf.reshape(pairs, [-1]))


class PartReader:
    """Reads one part of a delta with stock ops (inside a tf.function), collecting checks."""

    def __init__(self, path, part):
        """path: the delta directory (a string tensor); part: this part's directory name."""
        self.part_dir = tf.strings.join([path, "/", part])
        self.label = part   # messages name the part and the file
        lines = tf.strings.split(tf.strings.strip(tf.io.read_file(
            tf.strings.join([self.part_dir, "/chain.txt"]))), "\n")
        head = tf.strings.split(lines[0], " ")
        index = tf.strings.split(lines[1:], " ").to_tensor("")
        self.checks = [_require(tf.equal(tf.size(head), 3), f"{part}/chain.txt: malformed"),
                       _require(tf.equal(tf.shape(index)[1], 3), f"{part}/chain.txt: malformed")]
        with tf.control_dependencies(self.checks):
            self.position, self.previous, self.parts = head[0], head[1], head[2]
            self._names, self._bytes, self._hashes = index[:, 0], index[:, 1], index[:, 2]

    def payload(self, name):
        """The bytes after the .npy header of file `name` (a string scalar), once its size and
        fingerprint match the index and its header starts like a .npy 1.0 file's."""
        where = f"{self.label}/{name}"
        content = tf.io.read_file(tf.strings.join([self.part_dir, "/" + name]))
        found = tf.reshape(tf.where(tf.equal(self._names, name)), [-1])
        at = tf.minimum(tf.concat([found, [0]], 0)[0],
                        tf.maximum(tf.size(self._names, out_type=tf.int64) - 1, 0))
        size = tf.strings.length(content)
        fingerprint = _hex(tf.fingerprint(tf.reshape(content, [1]))[0])
        checks = [
            _require(tf.equal(tf.size(found), 1), f"{where}: not in chain.txt"),
            _require(tf.equal(tf.strings.as_string(size), self._bytes[at]),
                     f"{where}: truncated (not the size indexed)"),
            _require(tf.equal(fingerprint, self._hashes[at]),
                     f"{where}: corrupted (not the fingerprint indexed)"),
            _require(tf.equal(tf.strings.substr(content, 0, 8), _NPY_MAGIC),
                     f"{where}: not a .npy 1.0 file")]
        self.checks += checks
        with tf.control_dependencies(checks):
            header = tf.cast(tf.io.decode_raw(tf.strings.substr(content, 8, 2), tf.uint16)[0],
                             tf.int32)
            return tf.strings.substr(content, 10 + header, size - 10 - header)

    def array(self, name, dtype):
        return tf.io.decode_raw(self.payload(name), dtype)

    def ids(self, table, rows):
        ids, checks = decode_ids(self.array(f"{table}.ids.npy", tf.uint8))
        self.checks += checks + [_require(ids < rows, f"{self.label}/{table}.ids.npy: a row is "
                                                      "past the table")]
        return ids

    def values(self, table, dtype, dim, count):
        payload = self.payload(f"{table}.values.npy")
        check = _require(tf.equal(tf.cast(tf.strings.length(payload), tf.int64),
                                  count * dim * _ITEM_BYTES[dtype]),
                         f"{self.label}/{table}.values.npy: its rows do not match the ids")
        self.checks.append(check)
        with tf.control_dependencies([check]):
            raw = tf.io.decode_raw(payload, _DECODED[dtype])
        return tf.reshape(tf.cast(raw, tf.float32), [-1, dim])

    def keys(self, stem, strings):
        if not strings:
            return self.array(f"{stem}.npy", tf.int64)
        data = self.payload(f"{stem}.npy")
        offsets = self.array(f"{stem}_offsets.npy", tf.int64)
        lengths = offsets[1:] - offsets[:-1]
        checks = [_require(tf.logical_and(
            tf.equal(offsets[-1], tf.cast(tf.strings.length(data), tf.int64)),
            tf.reduce_all(lengths >= 0)), f"{self.label}/{stem}_offsets.npy: bad key offsets")]
        self.checks += checks
        with tf.control_dependencies(checks):
            return tf.strings.substr(tf.fill(tf.shape(lengths), data),
                                     tf.cast(offsets[:-1], tf.int32), tf.cast(lengths, tf.int32))


class DynamicRows(tf.Module):
    """An open vocabulary's serving keys: a mutable hash table key -> row, and a stack of the
    free rows. Rows [0, capacity) hold keys; row `capacity` is the zero row."""

    def __init__(self, keys, capacity, key_dtype):
        super().__init__(name=None)
        count = len(keys)
        self.capacity = int(capacity)
        with tf.device("CPU:0"):
            self.table = tf.lookup.experimental.MutableHashTable(
                key_dtype, tf.int64, default_value=tf.constant(self.capacity, tf.int64))
            if count:
                self.table.insert(tf.constant(keys, key_dtype), tf.range(count, dtype=tf.int64))
            free = tf.concat([tf.range(count, self.capacity, dtype=tf.int64),
                              tf.zeros([count], tf.int64)], 0)
            self.free_rows = tf.Variable(free, trainable=False, name="free_rows")
            self.free_count = tf.Variable(self.capacity - count, dtype=tf.int64,
                                          trainable=False, name="free_count")

    def plan(self, keys, removed):
        """(checks, apply() -> the keys' rows) of removing `removed`, then holding `keys`."""
        keys, removed = tf.reshape(keys, [-1]), tf.reshape(removed, [-1])
        old = tf.reshape(self.table.lookup(removed), [-1])
        freed = tf.boolean_mask(old, old < self.capacity)
        current = tf.reshape(self.table.lookup(keys), [-1])
        is_new = current >= self.capacity
        new = tf.reduce_sum(tf.cast(is_new, tf.int64))
        checks = [_require(new <= self.free_count + tf.size(freed, out_type=tf.int64),
                           "the delta holds more keys than the serving table has rows")]

        def apply():
            removed_op = self.table.remove(removed)
            with tf.control_dependencies([removed_op]):
                count = self.free_count.read_value()
                positions = count + tf.range(tf.size(freed, out_type=tf.int64))
                pushed = self.free_rows.scatter_update(tf.IndexedSlices(freed, positions))
            with tf.control_dependencies([pushed]):
                top = count + tf.size(freed, out_type=tf.int64)
                taken = self.free_rows[top - new:top]
                assigned = self.free_count.assign(top - new)
            with tf.control_dependencies([assigned]):
                rows = tf.tensor_scatter_nd_update(current, tf.where(is_new), taken)
                inserted = self.table.insert(keys, rows)
            with tf.control_dependencies([inserted]):
                return tf.identity(rows)
        return checks, apply


def join_rows(ids, values, key_rows, where):
    """(checks, the values of each key's row) from the rows a delta sent (ids, values)."""
    order = tf.argsort(ids)
    ordered = tf.gather(ids, order)
    at = tf.minimum(tf.searchsorted(ordered, key_rows, out_type=tf.int64),
                    tf.maximum(tf.size(ids, out_type=tf.int64) - 1, 0))
    found = tf.logical_or(tf.equal(tf.size(key_rows), 0), tf.logical_and(
        tf.size(ids) > 0, tf.reduce_all(tf.equal(tf.gather(ordered, at), key_rows))))
    checks = [_require(found, f"{where}: a key's row was not sent")]
    with tf.control_dependencies(checks):
        return checks, tf.gather(values, tf.gather(order, at))


def apply_delta(module, path):
    """The body of ServingModule.apply_delta: returns the model's new delta position."""
    parts = module.delta_parts
    readers = [PartReader(path, fmt.part_name(w, parts)) for w in range(parts)]
    done = tf.io.matching_files(tf.strings.join([path, "/part-*-of-*.done"]))
    checks = [_require(tf.equal(tf.size(done), parts),
                       f"the delta is incomplete or not of {parts} part(s)")]
    for reader in readers:
        checks += [
            _require(tf.equal(reader.parts, str(parts)), f"{reader.label}: another part count"),
            _require(tf.equal(reader.position, readers[0].position),
                     f"{reader.label}: a part of another delta"),
            _require(tf.equal(reader.previous, module.delta_position),
                     "the delta does not follow the serving model's position (an earlier delta "
                     "is missing, it was applied already, or it is of another run)")]
    writes = []
    for name, info in module.delta_tables.items():
        ids, values = [], []
        for reader in readers:
            ids.append(reader.ids(name, info["stored_rows"]))
            values.append(reader.values(name, info["dtype"], info["dim"],
                                        tf.size(ids[-1], out_type=tf.int64)))
        ids, values = tf.concat(ids, 0), tf.concat(values, 0)
        checks.append(_require(tf.math.is_finite(values), f"table '{name}': non-finite rows"))
        dynamic = module.dynamic_rows.get(name)
        if dynamic is None:
            writes.append((module.rows[name], ids, values, None))
            continue
        strings = info["key_dtype"] == "string"
        keys = tf.concat([r.keys(f"{name}.keys", strings) for r in readers], 0)
        removed = tf.concat([r.keys(f"{name}.tombstones", strings) for r in readers], 0)
        key_rows = tf.concat([r.array(f"{name}.key_rows.npy", tf.int64) for r in readers], 0)
        checks.append(_require(tf.equal(tf.size(key_rows), tf.size(keys)),
                               f"table '{name}': keys without rows"))
        joined_checks, key_values = join_rows(ids, values, key_rows, f"table '{name}'")
        plan_checks, assign = dynamic.plan(keys, removed)
        checks += joined_checks + plan_checks
        writes.append((module.rows[name], None, key_values, assign))
    # Every check, of every part and table, before the first write.
    checks += [c for r in readers for c in r.checks]
    with tf.control_dependencies(checks):
        done_writes = []
        for rows, ids, values, assign in writes:
            with tf.control_dependencies(done_writes):
                target = assign() if assign is not None else ids
                done_writes.append(rows.scatter(target, values))
        with tf.control_dependencies(done_writes):
            return module.delta_position.assign(readers[0].position)
