"""Mid-level API benchmark (issue 8, item 3): what a user meets through `TPUEmbeddingV2`, phase by
phase, against a TensorFlow user's training step on the same batches in the same rounds, at several
vocabulary caps; then the step time as the largest table grows from 10^4 to 10^7 rows.

Workload: the Criteo-like batches (26 features, one table each, vocabularies capped at --caps,
dim 32, batch 4096, weighted ragged ids, combiner sum), 1 replica, --threads threads. Every
function takes its batch with `next(iterator)` inside (the recommended way to feed a step; passing
52 ragged tensors as arguments costs TensorFlow ~3 ms per call before any op runs, see
BENCHMARKS.md "Class overhead"), from a repeating pool of --batches distinct batches, so both sides
read the same batches and neither reuses one cache-hot batch.

Phases, each in its own `tf.function`:
  enqueue                 `embedding.enqueue(ids, weights)` (host preprocessing, all tables)
  embedding_lookup        enqueue + dequeue
  step, fused Adagrad     enqueue + lookup + a dense logistic loss + `apply_gradients`
  step, fused SGD         the same with an SGD-trained embedding
  step, row-wise Adagrad  the same with `tf_sc_embedding.RowWiseAdagrad` (one accumulator per row)
  ..., bfloat16 rows      embedding_lookup and the Adagrad step with the tables in bfloat16
  TF step                 `tf.nn.embedding_lookup_sparse` per table + the same loss +
                          `tf.compat.v1.train.AdagradOptimizer` (sparse apply)
Every round calls every function once in turn (shared load hits all alike). Reported: the median
wall time and the median CPU time of the process (all threads) per call, and TF step / our
Adagrad step from the wall medians.

Interleaving puts every phase right after a different one, often the 50-150 ms TensorFlow step;
on the VMs measured so far a call that follows such a pause is slower (threads have gone to
sleep, caches hold the other function's data). A training loop calls the same step back to back,
so each function is also timed in runs of consecutive calls ("back to back": --rounds calls in
two blocks per function, the blocks of all functions alternating), and both figures are printed.

Usage: python bench/bench_api.py [--caps 1000000,4000000] [--rounds 40] [--threads 2]
       [--scaling-sizes 10000,...] [--skip-scaling]
       python bench/bench_api.py --delta-tracking [--caps 4000000]   (tracking on against off)
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_sc_embedding as sce  # noqa: E402
from common import ragged_features  # noqa: E402
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402
from tf_sc_embedding.data.criteo_like import CRITEO_LIKE_VOCABULARY_SIZES  # noqa: E402

LEARNING_RATE = 0.05
E = tf.tpu.experimental.embedding


def add_workload_arguments(parser, rounds, batches):
    """The arguments of the Criteo-like workload that every class-level benchmark takes:
    --batch, --dim, --batches (distinct batches in the pool), --rounds and --threads."""
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--batches", type=int, default=batches,
                        help="distinct batches in the pool")


def use_threads(count):
    """TensorFlow's inter- and intra-op thread pools of this process, `count` threads each."""
    tf.config.threading.set_intra_op_parallelism_threads(count)
    tf.config.threading.set_inter_op_parallelism_threads(count)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser, rounds=40, batches=4)
    parser.add_argument("--caps", default="1000000,4000000",
                        help="vocabulary caps (rows) of the phase comparison; \"\" skips it")
    parser.add_argument("--combiner", default="sum")
    parser.add_argument("--scaling-sizes", default="10000,100000,1000000,10000000")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--delta-tracking", action="store_true",
                        help="only measure the Adagrad step with delta tracking on against off "
                             "(at the first cap), once in each creation order")
    parser.add_argument("--delta-order", default="", help=argparse.SUPPRESS)   # one child's
    return parser.parse_args()


def delta_tracking_cost(cap, args):
    """The fused Adagrad step with delta tracking (docs/deltas.md) on and off.

    The embedding created second runs slower back to back on the machines measured (about 10%
    with identical configurations: its 4.8 GB of tables land elsewhere), so each order runs in a
    process of its own and the ratios are combined (geometric mean)."""
    if not args.delta_order:
        ratios = []
        for order in ("off,on", "on,off"):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                                  f"--delta-order={order}"], check=True, capture_output=True,
                                 text=True).stdout
            line = next(l for l in out.splitlines() if l.startswith("RATIOS "))
            print("\n".join(l for l in out.splitlines() if l is not line))
            ratios.append([float(x) for x in line.split()[1:]])
        combined = [(a * b) ** 0.5 for a, b in zip(*ratios)]
        print("\ntracking on / off, both creation orders combined: interleaved "
              f"{combined[0]:.3f}x wall, {combined[1]:.3f}x CPU; back to back {combined[2]:.3f}x "
              f"wall, {combined[3]:.3f}x CPU")
        return
    vocab = capped_vocabulary(cap)
    pool = batch_pool(vocab, args.batch, args.batches)
    functions = {f"tracking {state}": our_functions(
        vocab, args.dim, args.batch, args.combiner, E.Adagrad(learning_rate=LEARNING_RATE), pool,
        phases=False, delta_tracking=state == "on")["step"]
        for state in args.delta_order.split(",")}
    medians = interleaved(functions, args.rounds)
    steady = back_to_back(functions, args.rounds)
    print(f"\n### Delta tracking, vocabularies capped at {cap:,} rows ({sum(vocab):,} rows), "
          f"batch {args.batch}, dim {args.dim}, {args.threads} threads, median of "
          f"{args.rounds} calls\n")
    print("| step, fused Adagrad | interleaved wall ms | CPU ms | back to back wall ms | CPU ms |"
          "\n|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {steady[name][0]:.1f} | "
              f"{steady[name][1]:.1f} |")
    ratios = []
    for label, result in (("interleaved", medians), ("back to back", steady)):
        on, off = result["tracking on"], result["tracking off"]
        print(f"tracking on / off, {label}: {on[0] / off[0]:.3f}x (wall), "
              f"{on[1] / off[1]:.3f}x (CPU)")
        ratios += [on[0] / off[0], on[1] / off[1]]
    print("RATIOS " + " ".join(f"{r:.5f}" for r in ratios))


def capped_vocabulary(cap):
    return [min(v, cap) for v in CRITEO_LIKE_VOCABULARY_SIZES]


def batch_pool(vocab, batch, count, seed=0):
    """`count` distinct batches as {"ids", "weights"} dicts of ragged tensors, and labels."""
    workload = CriteoLikeWorkload(vocabulary_sizes=vocab, seed=seed)
    rng = np.random.default_rng(seed + 1)
    pool = []
    for index in range(count):
        b = workload.batch(batch, index=index)
        ids, weights = ragged_features(b)
        labels = tf.constant((rng.random(batch) < 0.3).astype(np.float32))
        pool.append((ids, weights, labels))
    return pool


def dataset_over(pool, convert=None):
    """An endless dataset of the pool's elements (converted once, up front)."""
    elements = [convert(*e) if convert else e for e in pool]
    dataset = tf.data.Dataset.from_tensors(elements[0])
    for element in elements[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(element))
    return dataset.repeat()


def iterator_over(pool, convert=None):
    """An endless iterator over the pool (elements converted once, up front)."""
    return iter(dataset_over(pool, convert))


def dense_head(num_features, dim):
    rng = np.random.default_rng(0)
    return tf.constant(rng.normal(0, 0.1, size=(num_features * dim, 1)).astype(np.float32))


def logistic_loss(activations, head, labels):
    logits = tf.matmul(tf.concat(activations, 1), head)[:, 0]
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))


def replica_training_step(embedding, names, head):
    """One replica's training step on (ids, weights, labels): the lookup, a dense logistic loss
    (`head`) over the features `names`, and apply_gradients; returns the loss."""
    def replica_step(ids, weights, labels):
        activations, preserved = embedding.embedding_lookup(ids, weights)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            loss = logistic_loss([activations[n] for n in names], head, labels)
        embedding.apply_gradients(tape.gradient(loss, activations), preserved)
        return loss
    return replica_step


def training_step(embedding, names, head):
    """A tf.function of replica_training_step over `next(iterator)` (one replica)."""
    replica_step = replica_training_step(embedding, names, head)

    @tf.function
    def step(iterator):
        return replica_step(*next(iterator))
    return step


def our_functions(vocab, dim, batch, combiner, optimizer, pool, phases=True,
                  table_dtype="float32", embeddings=None, delta_tracking=False):
    """{phase name: no-argument callable} through TPUEmbeddingV2 with one fused optimizer (and
    rows stored in `table_dtype`). `embeddings`: a list the built embedding is appended to."""
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner=combiner,
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    embedding = sce.TPUEmbeddingV2(features, optimizer,
                                   table_dtypes={t.name: table_dtype for t in tables},
                                   delta_tracking=delta_tracking)
    embedding.build(per_replica_batch_size=batch)
    if embeddings is not None:
        embeddings.append(embedding)
    head = dense_head(len(vocab), dim)
    names = [f"f{i}" for i in range(len(vocab))]

    @tf.function
    def enqueue(iterator):
        ids, weights, _ = next(iterator)
        return embedding.enqueue(ids, weights)

    @tf.function
    def lookup(iterator):
        ids, weights, _ = next(iterator)
        return embedding.embedding_lookup(ids, weights)[0]

    @tf.function
    def dequeue(iterator):   # the lookup alone, of a batch enqueued in the input pipeline
        (preprocessed,) = next(iterator)
        return embedding.dequeue(preprocessed)[0]

    step = training_step(embedding, names, head)
    result = {}
    if phases:
        for name, fn in (("enqueue", enqueue), ("embedding_lookup", lookup)):
            it = iterator_over(pool)
            result[name] = lambda fn=fn, it=it: fn(it)   # returns once its ops have run
        # Each pool batch enqueued once, up front, as an input pipeline would (tf.data.map).
        enqueued = iterator_over(pool, lambda ids, weights, _: (embedding.enqueue(ids, weights),))
        result["dequeue"] = lambda: dequeue(enqueued)
    it = iterator_over(pool)
    result["step"] = lambda: step(it).numpy()
    return result


def tensorflow_step(vocab, dim, combiner, pool):
    """The TensorFlow user's step: embedding_lookup_sparse + tf.compat.v1 Adagrad."""
    tables = [tf.Variable(tf.random.uniform([v, dim], -0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    optimizer = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE, initial_accumulator_value=0.1)
    head = dense_head(len(vocab), dim)
    names = [f"f{i}" for i in range(len(vocab))]

    def to_sparse(ids, weights, labels):
        return ({n: ids[n].to_sparse() for n in names},
                {n: weights[n].to_sparse() for n in names}, labels)

    @tf.function
    def step(iterator):
        sparse_ids, sparse_weights, labels = next(iterator)
        with tf.GradientTape() as tape:
            activations = [tf.nn.embedding_lookup_sparse(t, sparse_ids[n], sparse_weights[n],
                                                         combiner=combiner)
                           for t, n in zip(tables, names)]
            loss = logistic_loss(activations, head, labels)
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    it = iterator_over(pool, to_sparse)
    return lambda: step(it).numpy()


class _Timings:
    """Per function name, the wall and CPU (process, all threads) milliseconds of its calls."""

    def __init__(self, names):
        self.wall = {name: [] for name in names}
        self.cpu = {name: [] for name in names}

    def call(self, name, fn):
        w, c = time.perf_counter(), time.process_time()
        fn()
        self.wall[name].append((time.perf_counter() - w) * 1e3)
        self.cpu[name].append((time.process_time() - c) * 1e3)

    def medians(self):
        """{name: (median wall ms, median CPU ms)}."""
        return {name: (statistics.median(self.wall[name]), statistics.median(self.cpu[name]))
                for name in self.wall}


def interleaved(functions, rounds, warmup=2):
    """{name: (median wall ms, median CPU ms)}, every round calling every function in turn."""
    for fn in functions.values():
        for _ in range(warmup):
            fn()
    timings = _Timings(functions)
    for _ in range(rounds):
        for name, fn in functions.items():
            timings.call(name, fn)
    return timings.medians()


def back_to_back(functions, rounds, blocks=2):
    """{name: (median wall ms, median CPU ms)} over `rounds` calls per function, made in `blocks`
    runs of consecutive calls; the runs of all functions alternate (drift hits all alike)."""
    timings = _Timings(functions)
    for _ in range(blocks):
        for name, fn in functions.items():
            fn()   # the first call after another function is not counted
            for _ in range(max(1, rounds // blocks)):
                timings.call(name, fn)
    return timings.medians()


def compare_at_cap(cap, args):
    vocab = capped_vocabulary(cap)
    pool = batch_pool(vocab, args.batch, args.batches)
    functions = {}
    adagrad = our_functions(vocab, args.dim, args.batch, args.combiner,
                            E.Adagrad(learning_rate=LEARNING_RATE), pool)
    functions["enqueue"] = adagrad["enqueue"]
    functions["embedding_lookup (enqueue + lookup)"] = adagrad["embedding_lookup"]
    functions["dequeue (lookup of an enqueued batch)"] = adagrad["dequeue"]
    functions["step, fused Adagrad"] = adagrad["step"]
    functions["step, fused SGD"] = our_functions(
        vocab, args.dim, args.batch, args.combiner, E.SGD(learning_rate=LEARNING_RATE), pool,
        phases=False)["step"]
    functions["step, fused row-wise Adagrad"] = our_functions(
        vocab, args.dim, args.batch, args.combiner, sce.RowWiseAdagrad(learning_rate=LEARNING_RATE),
        pool, phases=False)["step"]
    bf16 = our_functions(vocab, args.dim, args.batch, args.combiner,
                         E.Adagrad(learning_rate=LEARNING_RATE), pool, table_dtype="bfloat16")
    functions["embedding_lookup, bfloat16 rows"] = bf16["embedding_lookup"]
    functions["dequeue, bfloat16 rows"] = bf16["dequeue"]
    functions["step, fused Adagrad, bfloat16 rows"] = bf16["step"]
    functions["step, fused row-wise Adagrad, bfloat16 rows"] = our_functions(
        vocab, args.dim, args.batch, args.combiner, sce.RowWiseAdagrad(learning_rate=LEARNING_RATE),
        pool, phases=False, table_dtype="bfloat16")["step"]
    functions["TF step (embedding_lookup_sparse + tf.compat.v1 Adagrad)"] = tensorflow_step(
        vocab, args.dim, args.combiner, pool)
    medians = interleaved(functions, args.rounds)
    steady = back_to_back(functions, args.rounds)
    print(f"\n### Vocabularies capped at {cap:,} rows ({sum(vocab):,} rows), batch {args.batch}, "
          f"dim {args.dim}, combiner {args.combiner}, {args.threads} threads, median of "
          f"{args.rounds} calls\n")
    print("| phase | interleaved wall ms | CPU ms | back to back wall ms | CPU ms |\n"
          "|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {steady[name][0]:.1f} | "
              f"{steady[name][1]:.1f} |")
    theirs_name = "TF step (embedding_lookup_sparse + tf.compat.v1 Adagrad)"
    for label, result in (("interleaved", medians), ("back to back", steady)):
        ours, theirs = result["step, fused Adagrad"], result[theirs_name]
        print(f"\nTF step / our Adagrad step, {label}: {theirs[0] / ours[0]:.2f}x (wall), "
              f"{theirs[1] / ours[1]:.2f}x (CPU)")
        row_wise = result["step, fused row-wise Adagrad"]
        print(f"row-wise / element-wise Adagrad step, {label}: {row_wise[0] / ours[0]:.2f}x "
              f"(wall), {row_wise[1] / ours[1]:.2f}x (CPU)")
        lookup32 = result["embedding_lookup (enqueue + lookup)"]
        lookup16 = result["embedding_lookup, bfloat16 rows"]
        step16 = result["step, fused Adagrad, bfloat16 rows"]
        dequeue32 = result["dequeue (lookup of an enqueued batch)"]
        dequeue16 = result["dequeue, bfloat16 rows"]
        row_wise16 = result["step, fused row-wise Adagrad, bfloat16 rows"]
        print(f"float32 / bfloat16 rows, {label}: embedding_lookup {lookup32[0] / lookup16[0]:.2f}x,"
              f" dequeue {dequeue32[0] / dequeue16[0]:.2f}x, Adagrad step {ours[0] / step16[0]:.2f}x"
              f", row-wise Adagrad step {row_wise[0] / row_wise16[0]:.2f}x"
              " (wall; above 1: bfloat16 faster)")


def scaling(args):
    """Step time as one table grows, all sizes interleaved round by round (shared load)."""
    print("\n### Step time as the largest table grows (25 tables capped at 10^4 rows, batch "
          f"{args.batch}, median of {args.rounds} rounds)\n")
    sizes = [int(s) for s in args.scaling_sizes.split(",")]
    steps = {}
    for size in sizes:
        vocab = capped_vocabulary(10_000)
        vocab[2] = size
        pool = batch_pool(vocab, args.batch, args.batches)
        steps[size] = our_functions(vocab, args.dim, args.batch, args.combiner,
                                    E.Adagrad(learning_rate=LEARNING_RATE), pool,
                                    phases=False)["step"]
    medians = interleaved(steps, args.rounds)
    first = medians[sizes[0]][0]
    print("| largest table rows | ms per step | CPU ms | vs. smallest |\n|---|---:|---:|---:|")
    for size in sizes:
        wall, cpu = medians[size]
        print(f"| {size:,} | {wall:.1f} | {cpu:.1f} | {wall / first:.2f}x |")


def main():
    args = parse_args()
    caps = [int(c) for c in args.caps.split(",") if c]
    if len(caps) > 1 and not args.delta_tracking:
        # One process per cap: the tables of every configuration at a 4M cap take about 20 GB,
        # and TensorFlow keeps a finished cap's tables alive, so two caps in one process can
        # exceed a 24 GB machine.
        for cap in caps:
            # argparse keeps the last --caps given.
            subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                            f"--caps={cap}", "--skip-scaling"], check=True)
        caps = []
    use_threads(args.threads)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    if args.delta_tracking:
        delta_tracking_cost(caps[0] if caps else 1_000_000, args)
        print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
        return
    for cap in caps:
        compare_at_cap(cap, args)
    if not args.skip_scaling:
        scaling(args)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
