"""Checkpoint benchmark: save / restore throughput and peak memory of `TPUEmbeddingV2`
checkpoints on the 26-table Criteo-like workload (dim 32: ~2.2 GiB of parameters, plus the same
again for the Adagrad accumulators).

Phases, each timed and with the peak RSS growth over the RSS just before it (sampled every 2 ms):
  save          tf.train.Checkpoint.write of the built embedding (parameters + slots)
  restore       restore into the same, built embedding (in place)
  deferred      restore into a fresh, unbuilt embedding (optionally another replica count), then
                build(): the variables are created from the checkpoint (growth includes the new
                tables themselves, reported separately as "extra over the tables")
Throughput is logical bytes (parameters + slots) / wall time. The checkpoint is written to
--directory; the OS page cache is not dropped between phases (no root-only cache dropping).

Usage: python bench/bench_checkpoint.py [--replicas 1] [--restore-replicas 2] [--dim 32]
       [--no-slots] [--directory /tmp/sce_ckpt_bench]
"""
import argparse
import gc
import os
import shutil
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

E = tf.tpu.experimental.embedding
MiB = float(1 << 20)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--restore-replicas", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--no-slots", action="store_true", help="SGD instead of Adagrad")
    parser.add_argument("--directory", default="/tmp/sce_ckpt_bench")
    return parser.parse_args()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples RSS in a thread; .growth is the peak minus the RSS at entry."""

    def __enter__(self):
        gc.collect()
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.t0 = time.perf_counter()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.growth = self.peak - self.start
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
    kinds = 2 if slots else 1
    table_bytes = [4 * v * args.dim for v in vocab]
    total = kinds * sum(table_bytes)
    largest = max(table_bytes)
    shutil.rmtree(args.directory, ignore_errors=True)
    os.makedirs(args.directory)
    prefix = os.path.join(args.directory, "ckpt")
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
    on_disk = sum(os.path.getsize(os.path.join(args.directory, f))
                  for f in os.listdir(args.directory))

    with PeakRss() as m:
        checkpoint.read(path).assert_consumed()
    rows.append(("restore into built", args.replicas, m))

    del checkpoint, embedding
    gc.collect()
    with PeakRss() as m:
        fresh = make_embedding(sce, vocab, args.dim, args.restore_replicas, slots)
        status = tf.train.Checkpoint(embedding=fresh).read(path)
        fresh.build(per_replica_batch_size=batch // args.restore_replicas)
        status.assert_consumed()
    rows.append(("deferred restore + build", args.restore_replicas, m))

    print(f"\ncheckpoint on disk: {on_disk / MiB:.0f} MiB; logical bytes: {total / MiB:.0f} MiB\n")
    print("| phase | replicas | seconds | MB/s | peak RSS growth (MiB) | "
          "extra over the tables (MiB) | largest table (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, replicas, m in rows:
        extra = m.growth - (m.end_growth if name.startswith("deferred") else 0)
        print(f"| {name} | {replicas} | {m.seconds:.2f} | {total / 1e6 / m.seconds:.0f} | "
              f"{m.growth / MiB:.0f} | {extra / MiB:.0f} | {largest / MiB:.0f} |")
    shutil.rmtree(args.directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
