"""Numpy reference of the SparseCore host preprocessing ops, written from the spec (docs/preprocessing.md#host-preprocessing).

It is the test oracle, so it favours obviously-correct code over speed: Python loops over tokens,
float32 arithmetic written out step by step (every float operation is on np.float32 scalars, so
numpy never promotes to float64 except where the spec asks for double).

One function per op, taking numpy arrays / Python ints and returning numpy arrays (the CSR ops
return a dict keyed by TensorFlow's output names plus `num_dropped_ids`). An input the op must
reject raises `OpMustFail` (a ValueError); the reference only models the *limit* errors that
depend on the data (per-SparseCore id limits, minibatch division limits, buffer overflow, too many
minibatches). Shape/range validation is tested separately and not modelled here.

Behaviour of tf_sc_embedding that the spec lists as undefined or unchecked in TensorFlow, and that
this reference pins down ("deviation" below):
  * docs/preprocessing.md#sort-dedup-and-bucket/docs/preprocessing.md#minibatching duplicates are found by ordering on (col, row, position): a full (row, col) dedup whose
    gains merge into the first occurrence. Identical to TensorFlow for row-sorted input.
  * CSR buffer tails past the unpadded sizes hold PAD (float(PAD) for gains).
  * Both CSR ops fail when there are more minibatches than `max_minibatches_per_sc`.
"""
import numpy as np

PAD = 2147483647            # kXlaPadValue
PAD_GAIN = np.float32(PAD)  # 2147483648.0: the integer PAD converted to float32
XLA_PAD = 8                 # alignment of id segments and row-pointer blocks

f32 = np.float32


class OpMustFail(ValueError):
    """The op must fail on this input (a data-dependent limit is exceeded)."""


def round_up(x, m):
    return -(-x // m) * m


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#from-ids-to-coo-entries shared helpers


def row_ids(indices_or_row_splits, num_values):
    """docs/preprocessing.md#input-forms: the sample (row) of every token, for dense, sparse and ragged input."""
    index = np.asarray(indices_or_row_splits)
    if index.ndim == 2:                      # SparseTensor indices: row = first coordinate
        return index[:, 0].astype(np.int64)
    if index.size == 0:                      # dense: token i is sample i
        return np.arange(num_values, dtype=np.int64)
    lengths = np.diff(index.astype(np.int64))  # ragged row_splits
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def combiner_scales(rows, weights, sample_count, combiner):
    """docs/preprocessing.md#combiners: per-row float32 normaliser, or None for "sum".

    Sums are accumulated in float32 in token order; 1/x and 1/sqrt(x) are evaluated in double from
    a float32 sum (and a float32 sqrt for sqrtn), then rounded to float32.
    """
    if combiner == "sum":
        return None
    total = [f32(0)] * sample_count
    for r, w in zip(rows, weights):
        total[r] = f32(total[r] + (w if combiner == "mean" else f32(w * w)))
    scale = np.zeros(sample_count, np.float32)
    for r, t in enumerate(total):
        if t != 0:
            denominator = float(t) if combiner == "mean" else float(np.sqrt(f32(t)))
            scale[r] = f32(1.0 / denominator)
    return scale


def adjacent_dedup(rows, cols, weights):
    """docs/preprocessing.md#adjacent-merge: merge a token into the last emitted entry when (row, col) is equal."""
    entries = []  # [row, col, weight]
    for r, c, w in zip(rows, cols, weights):
        if entries and entries[-1][0] == r and entries[-1][1] == c:
            entries[-1][2] = f32(entries[-1][2] + w)
        else:
            entries.append([int(r), int(c), f32(w)])
    return entries


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#coo-conversion ConvertToCooTensor


def convert_to_coo_tensor(indices_or_row_splits, values, weights, sample_count, combiner):
    """Returns (row_ids int32, col_ids int32, gains float32) in input token order."""
    values = np.asarray(values, np.int64).reshape(-1)
    weights = np.broadcast_to(np.asarray(weights, np.float32), values.shape)
    rows = row_ids(indices_or_row_splits, len(values))
    scale = combiner_scales(rows, weights, sample_count, combiner)
    entries = adjacent_dedup(rows, values, weights)
    out_rows = np.array([e[0] for e in entries], np.int32)
    out_cols = np.array([e[1] for e in entries], np.int32)
    if scale is None:
        gains = [e[2] for e in entries]
    else:
        gains = [f32(e[2] * scale[e[0]]) for e in entries]
    return out_rows, out_cols, np.array(gains, np.float32)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform ConvertToListOfSparseCoreCooTensors


def stacked_col(col, col_offset, col_shift, num_sc_shards):
    """docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform step 4: raw id -> stacked-table col id (rotation inside the shard bits, plus offset)."""
    low_bits = num_sc_shards - 1
    return ((col + col_shift) & low_bits) + (col & ~low_bits) + col_offset


def convert_to_list_of_sparse_core_coo_tensors(
        indices_or_row_splits, values, weights, sample_count, num_sc_per_chip, row_offset,
        col_offset, col_shift, num_sc_shards, stacked_table_sample_count, combiner):
    """Returns three lists (one entry per SparseCore) of row ids, col ids and gains."""
    rows, cols, gains = convert_to_coo_tensor(indices_or_row_splits, values, weights,
                                              sample_count, combiner)
    rows = rows.astype(np.int64)
    cols = cols.astype(np.int64)
    samples_per_sc = sample_count // num_sc_per_chip
    stacked_per_sc = stacked_table_sample_count // num_sc_per_chip
    sc = rows // samples_per_sc
    new_rows = rows % samples_per_sc + row_offset // num_sc_per_chip + stacked_per_sc * sc
    new_cols = stacked_col(cols, col_offset, col_shift, num_sc_shards)
    row_list, col_list, gain_list = [], [], []
    for i in range(num_sc_per_chip):
        mine = sc == i  # entries are row-ordered, so this keeps emission order
        row_list.append(new_rows[mine].astype(np.int32))
        col_list.append(new_cols[mine].astype(np.int32))
        gain_list.append(gains[mine])
    return row_list, col_list, gain_list


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#sort-dedup-and-bucket SortListOfSparseCoreCooTensors and docs/preprocessing.md#id-statistics GetStatsFromListOfSparseCoreCooTensors


def full_dedup(rows, cols, gains):
    """Orders entries by (col, row, position) and merges equal (row, col) pairs into the first.

    Returns a list of [row, col, gain] in that order (gains summed in float32 in position order).
    """
    rows = np.asarray(rows, np.int64)
    cols = np.asarray(cols, np.int64)
    order = np.lexsort((np.arange(len(rows)), rows, cols))  # last key is the primary one
    kept = []
    for i in order:
        if kept and kept[-1][0] == rows[i] and kept[-1][1] == cols[i]:
            kept[-1][2] = f32(kept[-1][2] + gains[i])
        else:
            kept.append([int(rows[i]), int(cols[i]), f32(gains[i])])
    return kept


def _dedup_member_tables(row_ids_list, col_ids_list, gains_list, col_offset_list):
    """docs/preprocessing.md#sort-dedup-and-bucket steps 2-3: per member table (ascending col_offset), the deduped entries in sorted order.

    Returns a list of (row, col, gain, table_index).
    """
    entries = []
    for table_index, offset in enumerate(sorted(set(col_offset_list))):
        features = [f for f, o in enumerate(col_offset_list) if o == offset]
        rows = np.concatenate([np.asarray(row_ids_list[f], np.int64) for f in features])
        cols = np.concatenate([np.asarray(col_ids_list[f], np.int64) for f in features])
        gains = np.concatenate([np.asarray(gains_list[f], np.float32) for f in features])
        entries += [(r, c, g, table_index) for r, c, g in full_dedup(rows, cols, gains)]
    return entries


def _ids_and_uniques_per_shard(entries, num_shards):
    ids = np.zeros(num_shards, np.int64)
    unique_cols = [set() for _ in range(num_shards)]
    for _, col, _, table_index in entries:
        ids[col % num_shards] += 1
        unique_cols[col % num_shards].add((table_index, col))
    return ids, np.array([len(u) for u in unique_cols], np.int64)


def sort_list_of_sparse_core_coo_tensors(
        row_ids_list, col_ids_list, gains_list, sample_count_list, col_offset_list, num_replica,
        num_sc_per_chip, max_ids_per_sparse_core, max_unique_ids_per_sparse_core):
    """Returns (sorted_row_ids, sorted_col_ids, sorted_gains, id_counts) for one source SC."""
    num_shards = num_replica * num_sc_per_chip
    entries = _dedup_member_tables(row_ids_list, col_ids_list, gains_list, col_offset_list)
    ids, uniques = _ids_and_uniques_per_shard(entries, num_shards)
    for p in range(num_shards):
        if ids[p] > max_ids_per_sparse_core:
            raise OpMustFail(f"sparse core {p} gets {ids[p]} ids")
        if uniques[p] > max_unique_ids_per_sparse_core:
            raise OpMustFail(f"sparse core {p} gets {uniques[p]} unique ids")
    id_counts = np.concatenate([[0], np.cumsum(ids)]).astype(np.int32)
    # Scatter by target shard; a stable sort keeps (member table, col, row) order inside a shard.
    shard = np.array([col % num_shards for _, col, _, _ in entries], np.int64)
    order = np.argsort(shard, kind="stable")
    batch = sum(sample_count_list)
    shard_bits = num_shards.bit_length() - 1
    rows = np.array([entries[i][0] % batch for i in order], np.int32)
    cols = np.array([entries[i][1] >> shard_bits for i in order], np.int32)
    gains = np.array([entries[i][2] for i in order], np.float32)
    return rows, cols, gains, id_counts


def get_stats_from_list_of_sparse_core_coo_tensors(
        row_ids_list, col_ids_list, gains_list, sample_count_list, col_offset_list, num_replica,
        num_sc_per_chip):
    """Returns (max_ids_per_sparse_core, max_unique_ids_per_sparse_core) for one source SC."""
    entries = _dedup_member_tables(row_ids_list, col_ids_list, gains_list, col_offset_list)
    ids, uniques = _ids_and_uniques_per_shard(entries, num_replica * num_sc_per_chip)
    return int(ids.max()), int(uniques.max())


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#split-encoding split encoding


def bits_to_bucket_splits(bits, max_division_level):
    """Split points (sorted) of all set bits; bit k splits heap node k at its midpoint."""
    points = []
    for k in range(2 ** max_division_level - 1):
        if (bits >> k) & 1:
            level = (k + 1).bit_length() - 1
            offset = k - (2 ** level - 1)
            points.append(2 ** (max_division_level - 1 - level) * (2 * offset + 1))
    return sorted(points)


def bucket_splits_to_bits(points, max_division_level):
    """Inverse of bits_to_bucket_splits: a point with t trailing zero bits is a level L-1-t node."""
    bits = 0
    for x in points:
        trailing_zeros = (x & -x).bit_length() - 1
        level = max_division_level - 1 - trailing_zeros
        bits |= 1 << (2 ** level - 1 + (x >> (trailing_zeros + 1)))
    return bits


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-wrapped-coo-buffers / docs/preprocessing.md#csr-buffers-with-minibatches packing of the CSR-wrapped COO buffers


def _pack_csr(segments, num_shards, capacity, max_minibatches_per_sc, allow_id_dropping):
    """Lays out segments[s][b][p] = (tokens, samples, gains) as in docs/preprocessing.md#csr-wrapped-coo-buffers step 3.

    Returns the CSR dict; tails past the unpadded sizes are PAD (deviation: TF leaves them
    uninitialized).
    """
    num_sc = len(segments)
    num_minibatches = len(segments[0])
    if num_minibatches > max_minibatches_per_sc:
        raise OpMustFail(f"{num_minibatches} minibatches > {max_minibatches_per_sc}")
    if capacity % XLA_PAD:
        raise OpMustFail("id buffer size not a multiple of 8")
    block = round_up(num_shards, XLA_PAD)
    row_pointers = np.full(max_minibatches_per_sc * num_sc * block, PAD, np.int32)
    samples = np.full(capacity, PAD, np.int32)
    tokens = np.full(capacity, PAD, np.int32)
    gains = np.full(capacity, PAD_GAIN, np.float32)
    position = 0   # next free id slot
    pointer = 0    # next row-pointer entry
    dropped = 0
    for s in range(num_sc):
        for b in range(num_minibatches):
            for p in range(num_shards):
                seg_tokens, seg_samples, seg_gains = segments[s][b][p]
                n = len(seg_tokens)
                if position + n > capacity:
                    if not allow_id_dropping:
                        raise OpMustFail("id buffer overflow")
                    dropped += position + n - capacity
                    n = capacity - position
                tokens[position:position + n] = seg_tokens[:n]
                samples[position:position + n] = seg_samples[:n]
                gains[position:position + n] = seg_gains[:n]
                position += n
                row_pointers[pointer] = position   # end of the segment before padding
                pointer += 1
                position = round_up(position, XLA_PAD)
            block_end = round_up(pointer, XLA_PAD)
            row_pointers[pointer:block_end] = position
            pointer = block_end
    return {
        "row_pointers": row_pointers,
        "sorted_sample_ids": samples,
        "sorted_token_ids": tokens,
        "sorted_gains": gains,
        "row_pointers_unpadded_size": num_minibatches * num_sc * block,
        "ids_unpadded_size": position,
        "num_minibatches": num_minibatches,
        "num_dropped_ids": dropped,
    }


def _or_of(splits):
    bits = 0
    for x in np.asarray(splits, np.int64).reshape(-1):
        bits |= int(x)
    return bits


def convert_to_sparse_core_csr_wrapped_coo_tensor(
        sorted_row_ids_list, sorted_col_ids_list, sorted_gains_list, id_counts_list, splits,
        sample_count_per_sc, num_replica, num_sc_per_chip, max_minibatches_per_sc,
        max_ids_per_chip_per_sample, allow_id_dropping, max_division_level=6):
    """docs/preprocessing.md#csr-wrapped-coo-buffers. id_counts of P+1 elements: one segment per shard (copied into every minibatch);
    of P*D+1 elements: segment (p, minibatch [lo, hi)) = [id_counts[p*D+lo], id_counts[p*D+hi])."""
    num_shards = num_replica * num_sc_per_chip
    divisions = 2 ** max_division_level
    bounds = [0] + bits_to_bucket_splits(_or_of(splits), max_division_level) + [divisions]
    minibatching = len(id_counts_list[0]) == num_shards * divisions + 1
    segments = []
    for s in range(num_sc_per_chip):
        counts = np.asarray(id_counts_list[s])
        data = (np.asarray(sorted_col_ids_list[s]), np.asarray(sorted_row_ids_list[s]),
                np.asarray(sorted_gains_list[s], np.float32))
        per_minibatch = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            per_shard = []
            for p in range(num_shards):
                if minibatching:
                    begin, end = counts[p * divisions + lo], counts[p * divisions + hi]
                else:
                    begin, end = counts[p], counts[p + 1]
                per_shard.append(tuple(a[begin:end] for a in data))
            per_minibatch.append(per_shard)
        segments.append(per_minibatch)
    capacity = max_ids_per_chip_per_sample * sample_count_per_sc * num_sc_per_chip
    return _pack_csr(segments, num_shards, capacity, max_minibatches_per_sc, allow_id_dropping)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#minibatching GetMinibatchSplitsWithPhysicalReplica


def get_minibatch_splits_with_physical_replica(
        row_ids, col_ids, gains, sample_count, num_replica, num_sc_per_chip, table_vocab_size,
        max_ids_per_partition, max_unique_ids_per_partition, max_division_level=6):
    """Returns a dict with TensorFlow's output names: sorted_row_ids, sorted_col_ids,
    sorted_gains, splits, id_counts, max_ids, max_uniques. Input rows must be sorted."""
    S, P = num_sc_per_chip, num_replica * num_sc_per_chip
    L, D = max_division_level, 2 ** max_division_level
    division_size = -(-table_vocab_size // D)
    samples_per_sc = sample_count // S
    row_ids = np.asarray(row_ids, np.int64)
    col_ids = np.asarray(col_ids, np.int64)
    gains = np.asarray(gains, np.float32)

    counts = np.zeros((S, P, D), np.int64)   # ids per (source SC, shard, bucket) after dedup
    kept = []                                # (s, p, bucket, col, row, gain) in sorted order
    pre = after = 0
    max_ids = max_uniques = 0
    for s in range(S):
        mine = row_ids // samples_per_sc == s
        uniques = np.zeros((P, D), np.int64)
        for row, col, gain in full_dedup(row_ids[mine], col_ids[mine], gains[mine]):
            p, bucket = col % P, min(col // division_size, D - 1)
            counts[s, p, bucket] += 1
            kept.append((s, p, bucket, col, row, gain))
        for col in {e[3] for e in kept if e[0] == s}:  # distinct cols of this SC
            uniques[col % P, min(col // division_size, D - 1)] += 1
        for p in range(P):
            if (counts[s, p] > max_ids_per_partition).any() or (
                    uniques[p] > max_unique_ids_per_partition).any():
                raise OpMustFail(f"a division of replica {p} on sparse core {s} is too big")
            # ids_below[d] = ids of this (SC, replica) in divisions [0, d); same for uniques.
            ids_below = [0] + np.cumsum(counts[s, p]).tolist()
            uniques_below = [0] + np.cumsum(uniques[p]).tolist()
            max_ids = max(max_ids, ids_below[D])
            max_uniques = max(max_uniques, uniques_below[D])

            def fits(lo, hi):
                return (ids_below[hi] - ids_below[lo] <= max_ids_per_partition and
                        uniques_below[hi] - uniques_below[lo] <= max_unique_ids_per_partition)

            # Top-down search, sharing `pre` across all replicas and SCs.
            for level in range(L):
                width = D >> level
                for q in range(2 ** level):
                    parent = 2 ** (level - 1) - 1 + q // 2
                    if level > 0 and not (pre >> parent) & 1:
                        continue
                    if not fits(q * width, (q + 1) * width):
                        pre |= 1 << (2 ** level - 1 + q)
            # Greedy merge of adjacent sections that fit together.
            points = [0] + bits_to_bucket_splits(pre, L) + [D]
            start, emitted = 0, []
            for i in range(1, len(points)):
                if not fits(points[start], points[i]):
                    emitted.append(points[i - 1])
                    start = i - 1
            after |= bucket_splits_to_bits(emitted, L)

    kept.sort(key=lambda e: e[:3])  # stable: (col, row) order inside each (s, p, bucket)
    shard_bits = P.bit_length() - 1
    return {
        "sorted_row_ids": np.array([e[4] % samples_per_sc for e in kept], np.int32),
        "sorted_col_ids": np.array([e[3] >> shard_bits for e in kept], np.int32),
        "sorted_gains": np.array([e[5] for e in kept], np.float32),
        "splits": after,
        "id_counts": np.concatenate([[0], np.cumsum(counts.reshape(-1))]).astype(np.int32),
        "max_ids": max_ids,
        "max_uniques": max_uniques,
    }


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-buffers-with-minibatches GetMinibatchesInCsrWithPhysicalReplica


def get_minibatches_in_csr_with_physical_replica(
        row_ids, col_ids, gains, splits, id_counts, sample_count, num_replica, num_sc_per_chip,
        max_minibatches_per_sc, max_ids_per_chip_per_sample, allow_id_dropping=False,
        max_division_level=6):
    """docs/preprocessing.md#csr-buffers-with-minibatches: the docs/preprocessing.md#csr-wrapped-coo-buffers packing with segment (s, b, p) = divisions [lo, hi) of group s*P+p."""
    P, D = num_replica * num_sc_per_chip, 2 ** max_division_level
    bounds = [0] + bits_to_bucket_splits(_or_of(splits), max_division_level) + [D]
    data = (np.asarray(col_ids), np.asarray(row_ids), np.asarray(gains, np.float32))
    segments = []
    for s in range(num_sc_per_chip):
        per_minibatch = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            per_shard = []
            for p in range(P):
                group = (s * P + p) * D
                begin, end = id_counts[group + lo], id_counts[group + hi]
                per_shard.append(tuple(a[begin:end] for a in data))
            per_minibatch.append(per_shard)
        segments.append(per_minibatch)
    capacity = max_ids_per_chip_per_sample * sample_count
    return _pack_csr(segments, P, capacity, max_minibatches_per_sc, allow_id_dropping)
