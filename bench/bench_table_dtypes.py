"""16-bit rows against float32 rows through the class (issue 33, item 5): enqueue (the host
preprocessing of a batch, which with one replica packs and groups its entries), embedding_lookup,
the lookup of an enqueued batch (dequeue) and the training step, with only these embeddings in the
process.

bench_api.py also times bfloat16 rows, beside six other configurations of 4M-row caps (about 20
GB held at once on a 24 GB machine). There the tables built last often stay on 4 KiB pages: the
kernels ask the kernel to back large tables with 2 MiB pages (cc/core/huge_pages.h,
MADV_COLLAPSE), which fails under memory pressure, and the bfloat16 tables, built last, then pay
a TLB miss on nearly every row while the float32 ones do not. A user's job holds one embedding;
so does each configuration here, two at a time, and the report gives the process's memory on
huge pages after warm-up, so a run where they could not be had shows it.

Workload: bench_api.py's Criteo-like batches (26 features, one table each, vocabularies capped at
--cap, dim 32, batch 4096, weighted ragged ids, combiner sum), the optimizer of --optimizer, a
dense logistic loss. Reported: median wall and CPU per call, interleaved and back to back
(bench_api.py explains both), and float32 / 16-bit from the wall medians (above 1: 16-bit rows
faster).

"dequeue x8" runs eight dequeues in one tf.function call, each after the one before (its times are
per lookup): on a 2-core machine about 1.1 ms of a call of `dequeue` alone is TensorFlow's
dispatch (Python, the iterator, the returned activations), the same for both dtypes
(BENCHMARKS.md, "Where a `dequeue` call's time goes"); a training step pays it once for its lookup,
update and dense model together.

Besides the class's calls, "lookup kernels" runs only the lookup ops that `dequeue` runs (one per
stacked table, on the table variables, as many threads), on the enqueued buffers of the same
batches built beforehand: no CSR conversion, no grouping, no input iterator, no activation split. The part of
`dequeue` that is the same for both dtypes is what it takes beyond them.

Usage: python bench/bench_table_dtypes.py [--cap 4000000] [--rounds 30]
       [--optimizer adagrad|row_wise_adagrad] [--dtype bfloat16|float16]
"""
import argparse
import itertools
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_sc_embedding as sce  # noqa: E402
from bench_api import (LEARNING_RATE, add_workload_arguments, back_to_back,  # noqa: E402
                       batch_pool, capped_vocabulary, interleaved, iterator_over, our_functions,
                       use_threads)

E = tf.tpu.experimental.embedding
# Lookups per call of the chained dequeue (its time is reported per lookup).
CHAINED = 8
PHASES = ("enqueue", "embedding_lookup", "dequeue", f"dequeue x{CHAINED}", "lookup kernels",
          "step")


def lookup_kernels(embedding, pool):
    """A no-argument callable running the lookup ops of `dequeue` alone, on the enqueued buffers
    of the pool's batches (in turn, as `dequeue` takes them), built once here
    (bench_class_overhead.ClassKernelsAlone's preprocessing, then the grouping by activation row
    that one replica's enqueue adds; the class's internals, benchmark only)."""
    from bench_class_overhead import ClassKernelsAlone  # noqa: PLC0415
    from tf_sc_embedding.collectives import replica_group as collectives  # noqa: PLC0415
    from tf_sc_embedding.preprocessing import enqueue
    from tf_sc_embedding.exchanges import all_gather  # noqa: PLC0415
    layout = embedding.plan.sharded
    view = collectives.ReplicaView(embedding.replica_group)
    batch, dim = layout.features[0].sample_count, layout.features[0].table.dim
    rows = {name: enqueue.feature_major_rows(layout, stacked)
            for name, stacked in layout.stacked_tables.items()}
    runs = []
    for ids, weights, _ in pool:
        unused_gradients = {path: tf.zeros([batch, dim]) for path in ids}  # the lookup reads none
        kernels = ClassKernelsAlone(embedding, tf.nest.flatten(ids), tf.nest.flatten(weights),
                                    unused_gradients)
        csrs = {name: kernels.preprocessed[name].csr for name in layout.stacked_tables}
        grouped = {name: (all_gather.group_entries(layout, stacked, csrs[name], rows[name])
                          if all_gather.groups_at_enqueue(layout, stacked) else ())
                   for name, stacked in layout.stacked_tables.items()}

        @tf.function
        def run(kernels=kernels, csrs=csrs, grouped=grouped):
            variables = kernels._variables(view)  # noqa: SLF001
            return [all_gather.lookup(view, layout, stacked, csrs[name], variables[name][0],
                                      feature_rows_per_sc=rows[name], grouped=grouped[name])
                    for name, stacked in layout.stacked_tables.items()]

        runs.append(run)
    turns = itertools.cycle(runs)
    return lambda: next(turns)()


def chained_dequeue(embedding, pool):
    """A no-argument callable running CHAINED dequeues in one tf.function call, each of a batch
    enqueued beforehand and each after the one before has written its activations (as the lookups
    of successive training steps run): the lookup's own time, with one Python dispatch and one
    function launch for CHAINED lookups instead of one each."""
    enqueued = iterator_over(pool, lambda ids, weights, _: (embedding.enqueue(ids, weights),))

    @tf.function
    def run(iterator):
        activations = {}
        for _ in range(CHAINED):
            with tf.control_dependencies(tf.nest.flatten(activations)):
                (preprocessed,) = next(iterator)
            activations = embedding.dequeue(preprocessed)[0]
        return activations

    return lambda: run(enqueued)


def per_call(name, milliseconds):
    """The time of one lookup: a chained call's time divided by its lookups."""
    return milliseconds / CHAINED if name.startswith(f"dequeue x{CHAINED}") else milliseconds


def huge_page_mb():
    """MB of this process's memory on transparent huge pages (Linux; None elsewhere)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=4_000_000)
    add_workload_arguments(parser, rounds=30, batches=4)
    parser.add_argument("--optimizer", choices=("adagrad", "row_wise_adagrad"),
                        default="adagrad")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    args = parser.parse_args()
    use_threads(args.threads)
    vocab = capped_vocabulary(args.cap)
    pool = batch_pool(vocab, args.batch, args.batches)

    def optimizer():
        if args.optimizer == "adagrad":
            return E.Adagrad(learning_rate=LEARNING_RATE)
        return sce.RowWiseAdagrad(learning_rate=LEARNING_RATE)

    functions = {}
    for dtype in ("float32", args.dtype):
        embeddings = []
        built = our_functions(vocab, args.dim, args.batch, "sum", optimizer(), pool,
                              table_dtype=dtype, embeddings=embeddings)
        built["lookup kernels"] = lookup_kernels(embeddings[0], pool)
        built[f"dequeue x{CHAINED}"] = chained_dequeue(embeddings[0], pool)
        for phase in PHASES:
            functions[f"{phase}, {dtype} rows"] = built[phase]
    medians = interleaved(functions, args.rounds)
    huge = huge_page_mb()
    steady = back_to_back(functions, args.rounds)
    print(f"\n### {args.optimizer}, vocabularies capped at {args.cap:,} rows ({sum(vocab):,} "
          f"rows), batch {args.batch}, dim {args.dim}, {args.threads} threads, median of "
          f"{args.rounds} calls\n")
    print("| call | interleaved wall ms | CPU ms | back to back wall ms | CPU ms |\n"
          "|---|---:|---:|---:|---:|")
    for name, (wall, cpu) in medians.items():
        print(f"| {name} | {per_call(name, wall):.2f} | {per_call(name, cpu):.2f} | "
              f"{per_call(name, steady[name][0]):.2f} | {per_call(name, steady[name][1]):.2f} |")
    if huge is not None:
        print(f"\nmemory on 2 MiB pages after warm-up: {huge:,.0f} MB")
    for label, result in (("interleaved", medians), ("back to back", steady)):
        ratios = ", ".join(
            f"{phase} {result[f'{phase}, float32 rows'][0] / result[f'{phase}, {args.dtype} rows'][0]:.2f}x"
            for phase in PHASES)
        print(f"float32 / {args.dtype} rows, {label}: {ratios} (wall; above 1: {args.dtype} "
              "faster)")


if __name__ == "__main__":
    main()
