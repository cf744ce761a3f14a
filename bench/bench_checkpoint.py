"""Checkpoint benchmark: save / restore throughput and peak memory of `TPUEmbeddingV2`
checkpoints on the 26-table Criteo-like workload (dim 32: ~2.2 GiB of parameters, plus the same
again for the Adagrad accumulators).

Phases, each timed and with the peak RSS growth over the RSS just before it (kernel high-water mark VmHWM, reset per phase):
  save          tf.train.Checkpoint.write of the built embedding (parameters + slots)
  restore       restore into the same, built embedding (in place)
  deferred      restore into a fresh, unbuilt embedding (optionally another replica count), then
                build(): the variables are created from the checkpoint (growth includes the new
                tables themselves, reported separately as "extra over the tables")
Throughput is logical bytes (parameters + slots) / wall time. The OS page cache is not dropped
between phases (no root-only cache dropping).

The checkpoint (about 4.8 GB at dim 32 with slots) goes to a new temporary directory, removed at
the end; with --directory it goes to that directory instead (created if missing), and the files
the benchmark wrote there are removed at the end, nothing else.

Usage: python bench/bench_checkpoint.py [--replicas 1] [--restore-replicas 2] [--dim 32]
       [--no-slots] [--directory DIR]
"""
import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

E = tf.tpu.experimental.embedding
MiB = float(1 << 20)
CHECKPOINT_NAME = "ckpt"   # the files are ckpt.index and ckpt.data-*


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--restore-replicas", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--no-slots", action="store_true", help="SGD instead of Adagrad")
    parser.add_argument("--directory", default=None,
                        help="where to write the checkpoint (default: a new temporary directory)")
    parser.add_argument("--deferred-from", default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim():
    try:
        import ctypes  # pylint: disable=import-outside-toplevel
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _hwm_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


class PeakRss:
    """Peak RSS growth of a phase: the kernel's high-water mark (VmHWM), reset at entry through
    /proc/self/clear_refs, minus the RSS at entry (exact; no sampling that could miss a peak)."""

    def __enter__(self):
        gc.collect()
        _malloc_trim()   # return freed heap pages, so growth is not hidden by reuse
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.start = rss_bytes()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.growth = _hwm_bytes() - self.start
        self.end_growth = rss_bytes() - self.start


def make_embedding(sce, vocab, dim, replicas, slots):
    strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
                if replicas > 1 else tf.distribute.get_strategy())
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner="mean",
                            initializer=tf.random_uniform_initializer(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    optimizer = E.SGD(learning_rate=0.05) if not slots else E.Adagrad(learning_rate=0.05)
    with strategy.scope():
        return sce.TPUEmbeddingV2(features, optimizer)


def deferred_phase(args, sce, vocab, slots):
    """Child process: restore before build, then build from the checkpoint."""
    import json  # pylint: disable=import-outside-toplevel
    with PeakRss() as m:
        fresh = make_embedding(sce, vocab, args.dim, args.restore_replicas, slots)
        status = tf.train.Checkpoint(embedding=fresh).read(args.deferred_from)
        fresh.build(per_replica_batch_size=64 * max(args.replicas, args.restore_replicas) //
                    args.restore_replicas)
        status.assert_consumed()
    variables = sum(4 * v.shape[0] * v.shape[1] for kinds in fresh.variables.values()
                    for sharded in kinds.values() for v in sharded.shards)
    print(json.dumps({"seconds": m.seconds, "growth": m.growth, "variables": int(variables),
                      "extra": m.growth - int(variables)}))


def main():
    args = parse_args()
    cpu = tf.config.list_physical_devices("CPU")[0]
    n = max(args.replicas, args.restore_replicas)
    if n > 1:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.data import CRITEO_LIKE_VOCABULARY_SIZES  # pylint: disable=import-outside-toplevel

    vocab = CRITEO_LIKE_VOCABULARY_SIZES
    slots = not args.no_slots
    if args.deferred_from:
        return deferred_phase(args, sce, vocab, slots)
    if args.directory is None:
        directory = tempfile.mkdtemp(prefix="sce_ckpt_bench_")
    else:
        directory = args.directory
        os.makedirs(directory, exist_ok=True)
        if _checkpoint_files(directory, CHECKPOINT_NAME):
            sys.exit(f"{directory} already holds a checkpoint named '{CHECKPOINT_NAME}'; "
                     "give an empty directory (its files would be overwritten and removed)")
    try:
        return run(args, sce, vocab, slots, os.path.join(directory, CHECKPOINT_NAME))
    finally:
        if args.directory is None:
            shutil.rmtree(directory, ignore_errors=True)
        else:   # only what this run wrote
            for name in _checkpoint_files(directory, CHECKPOINT_NAME):
                os.remove(os.path.join(directory, name))


def _checkpoint_files(directory, name):
    """The files of checkpoint `name` in `directory` (its index and data shards)."""
    return [f for f in os.listdir(directory) if f.startswith(name + ".")]


def run(args, sce, vocab, slots, prefix):
    """The three phases, with the checkpoint written under `prefix`."""
    directory, name = os.path.split(prefix)
    n = max(args.replicas, args.restore_replicas)
    kinds = 2 if slots else 1
    table_bytes = [4 * v * args.dim for v in vocab]
    total = kinds * sum(table_bytes)
    largest = max(table_bytes)
    batch = 64 * n

    print(f"# {len(vocab)} tables, {sum(vocab):,} rows, dim {args.dim}: parameters "
          f"{sum(table_bytes) / MiB:.0f} MiB, with slots {total / MiB:.0f} MiB; largest table "
          f"{largest / MiB:.0f} MiB")
    t0 = time.perf_counter()
    embedding = make_embedding(sce, vocab, args.dim, args.replicas, slots)
    embedding.build(per_replica_batch_size=batch // args.replicas)
    print(f"build ({args.replicas} replica(s)): {time.perf_counter() - t0:.1f} s")
    checkpoint = tf.train.Checkpoint(embedding=embedding)

    rows = []
    with PeakRss() as m:
        path = checkpoint.write(prefix)
    rows.append(("save", args.replicas, m))
    on_disk = sum(os.path.getsize(os.path.join(directory, f))
                  for f in _checkpoint_files(directory, name))

    with PeakRss() as m:
        checkpoint.read(path).assert_consumed()
    rows.append(("restore into built", args.replicas, m))

    # Deferred restore in a fresh process: freed memory of this process would be reused by the
    # allocator and hide the growth.
    import json  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    out = subprocess.run([sys.executable, __file__, "--deferred-from", path, "--replicas",
                          str(args.replicas), "--restore-replicas", str(args.restore_replicas),
                          "--dim", str(args.dim)] + (["--no-slots"] if args.no_slots else []),
                         check=True, capture_output=True, text=True).stdout
    deferred = json.loads(out.strip().splitlines()[-1])
    print(f"\ncheckpoint on disk: {on_disk / MiB:.0f} MiB; logical bytes: {total / MiB:.0f} MiB\n")
    print("| phase | replicas | seconds | MB/s | peak RSS growth (MiB) | "
          "extra over the tables (MiB) | largest table (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, replicas, m in rows:
        print(f"| {name} | {replicas} | {m.seconds:.2f} | {total / 1e6 / m.seconds:.0f} | "
              f"{m.growth / MiB:.0f} | {m.growth / MiB:.0f} | {largest / MiB:.0f} |")
    print(f"| deferred restore + build (fresh process) | {args.restore_replicas} | "
          f"{deferred['seconds']:.2f} | {total / 1e6 / deferred['seconds']:.0f} | "
          f"{deferred['growth'] / MiB:.0f} | {deferred['extra'] / MiB:.0f} | "
          f"{largest / MiB:.0f} |")
    print("\n'extra over the tables' for the deferred restore is the peak growth minus the bytes "
          f"of the variables it creates ({deferred['variables'] / MiB:.0f} MiB, padded, all "
          "replicas). Restore into the built embedding runs after the save in the same process, "
          "whose freed buffers the allocator reuses: its growth understates the transient.")


if __name__ == "__main__":
    sys.exit(main())
