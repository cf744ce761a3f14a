"""The open-vocabulary key map (`SceKeyRowMapStep`, docs/dynamic_vocabulary.md) against the hash
tables a TensorFlow user has for the same job, on the same keys in the same run.

A user who wants "key -> row, a new row for a new key" from stock TensorFlow looks the batch up in
a `tf.lookup.experimental.DenseHashTable` or `MutableHashTable` (int64 -> int64), gives the
missing distinct keys the next free rows and inserts them: `lookup`, `unique`, `insert`. Ours is
one op that also counts admissions and takes rows back (threshold 1, no eviction here).

Phases, each a `tf.function` per call, keys drawn once beforehand (uniform random int64):
  insert   batches of --batch keys never seen, until --capacity keys are held (the map fills
           from empty to its full load); keys/s per batch, median and mean over the fill;
  lookup   batches of --batch keys drawn from the held keys, --rounds times.
Memory: the resident-set growth from before a table is created to after it holds --capacity keys,
per key (ours includes the 8 bytes of row metadata per row of capacity), after a small table of
the same kind has mapped one batch. Each kind runs in its own child process.

Usage: taskset -c 0 python bench/bench_key_row_map.py [--capacity 4194304] [--batch 1048576]
       [--rounds 10] [--tables ours,dense,mutable]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLES = ("ours", "dense", "mutable")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1 << 22)
    parser.add_argument("--batch", type=int, default=1 << 20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _make_table(kind, capacity):
    """(map_fn(keys) -> rows, size_fn) for one table kind."""
    import tensorflow as tf  # noqa: PLC0415
    if kind == "ours":
        from tf_sc_embedding.ops.key_row_map import KeyRowMap  # noqa: PLC0415
        table = KeyRowMap("bench", capacity)
        step = tf.Variable(0, dtype=tf.int64)

        @tf.function
        def map_fn(keys):
            rows = table.map_step(keys, step).rows
            step.assign_add(1)
            return rows
        return map_fn, lambda: int(table.sizes()[0])
    if kind == "dense":
        table = tf.lookup.experimental.DenseHashTable(
            key_dtype=tf.int64, value_dtype=tf.int64, default_value=-1,
            empty_key=tf.int64.min, deleted_key=tf.int64.min + 1,
            initial_num_buckets=1 << (2 * capacity - 1).bit_length())
    else:
        table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)

    @tf.function
    def map_fn(keys):
        rows = tf.reshape(table.lookup(keys), [-1])
        missing, _ = tf.unique(tf.boolean_mask(keys, rows < 0))
        first = table.size()
        table.insert(missing, first + tf.range(tf.size(missing, out_type=tf.int64)))
        return table.lookup(keys)
    return map_fn, lambda: int(table.size())


def run_child(kind, capacity, batch, rounds):
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    rng = np.random.default_rng(1)
    fill = rng.integers(-2**63, 2**63 - 1, size=capacity, dtype=np.int64)
    batches = [tf.constant(fill[i:i + batch]) for i in range(0, capacity, batch)]
    held = [tf.constant(rng.choice(fill, size=batch)) for _ in range(rounds)]
    # A small table of the same kind first maps one batch: the runtime's own first-use memory
    # (threads, allocator pools, traced functions) comes before the baseline.
    warm_fn, _ = _make_table(kind, 16)
    warm_fn(held[0]).numpy()
    before = _rss_bytes()
    map_fn, size_fn = _make_table(kind, capacity)
    insert = []
    for keys in batches:
        start = time.perf_counter()
        map_fn(keys).numpy()
        insert.append(keys.shape[0] / (time.perf_counter() - start))
    grown = _rss_bytes() - before
    assert size_fn() == capacity, (size_fn(), capacity)
    lookup = []
    for keys in held:
        start = time.perf_counter()
        rows = map_fn(keys).numpy()
        lookup.append(keys.shape[0] / (time.perf_counter() - start))
        assert (rows >= 0).all()
    print(json.dumps(dict(insert_median=statistics.median(insert),
                          insert_mean=len(insert) / sum(1 / r for r in insert),
                          lookup_median=statistics.median(lookup),
                          bytes_per_key=grown / capacity)))


def main():
    args = parse_args()
    if args.child:
        run_child(args.child, args.capacity, args.batch, args.rounds)
        return
    results = {}
    for kind in args.tables.split(","):
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--capacity", str(args.capacity),
             "--batch", str(args.batch), "--rounds", str(args.rounds)],
            capture_output=True, text=True, timeout=1800, cwd=ROOT, check=True)
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"capacity {args.capacity} keys, batches of {args.batch}; M keys/s, one op per batch")
    print(f"{'table':<8} {'insert (median)':>16} {'insert (fill)':>14} {'lookup':>8} "
          f"{'bytes/key':>10}")
    for kind, r in results.items():
        print(f"{kind:<8} {r['insert_median'] / 1e6:16.1f} {r['insert_mean'] / 1e6:14.1f} "
              f"{r['lookup_median'] / 1e6:8.1f} {r['bytes_per_key']:10.1f}")
    if "ours" in results:
        for kind, r in results.items():
            if kind == "ours":
                continue
            o = results["ours"]
            print(f"ours / {kind}: insert {o['insert_mean'] / r['insert_mean']:.1f}x, lookup "
                  f"{o['lookup_median'] / r['lookup_median']:.1f}x, memory per key "
                  f"{r['bytes_per_key'] / o['bytes_per_key']:.1f}x less")


if __name__ == "__main__":
    main()
