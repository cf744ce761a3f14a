"""Kernel throughput (issue 8, item 2): the kernels `TPUEmbeddingV2` runs on its stacked tables,
each alone on inputs computed beforehand, at 1 and 2 intra-op threads (one process per thread
count), on the Criteo-like batch (26 tables capped at --vocabulary-cap rows, dim 32, batch 4096,
weighted ragged ids, combiner sum, 2 stacked tables).

The fused updates run twice: with the gradients stacked into one tensor in the CSR's order,
and with one gradient tensor per feature as `TPUEmbeddingV2.apply_gradients` passes them with one
replica (read feature-major, docs/optimizers.md#gradient-order).

Reported per kernel: median wall ms and CPU ms per call, and throughput: ids per second for the
preprocessing and the forward lookup, distinct rows per second for the fused updates (the rows a
batch touches; each is updated once), in total and per thread ("per core": divided by the
threads, so perfect scaling keeps it constant).

Usage: python bench/bench_kernels.py [--threads 1,2] [--calls 40] [--vocabulary-cap 4000000]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="intra-op thread counts to measure")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--vocabulary-cap", type=int, default=4_000_000)
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


def measure(args):
    """Runs in a process with args.child intra-op threads; returns {kernel: (wall, cpu)} ms."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.config.threading.set_intra_op_parallelism_threads(args.child)
    tf.config.threading.set_inter_op_parallelism_threads(args.child)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_class_overhead import ClassKernelsAlone, class_functions  # pylint: disable=import-outside-toplevel
    from common import ragged_features  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.collectives import replica_group as collectives  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.optimizers import fused_update
    from tf_sc_embedding.exchanges import all_gather as sharded_lookup  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.preprocessing import enqueue as enqueue_lib  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.data import CriteoLikeWorkload  # pylint: disable=import-outside-toplevel
    E = tf.tpu.experimental.embedding

    vocab = [min(v, args.vocabulary_cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    batch = CriteoLikeWorkload(vocabulary_sizes=vocab).batch(args.batch)
    ids, weights = ragged_features(batch)
    gradients = {f"f{i}": tf.random.stateless_normal([args.batch, args.dim], seed=[7, i])
                 for i in range(len(vocab))}
    num_ids = sum(len(x) for x in batch.ids)
    distinct_rows = sum(len(np.unique(x)) for x in batch.ids)   # one table per feature

    functions = {}
    for name, optimizer in (("Adagrad", E.Adagrad(learning_rate=0.05)),
                            ("SGD", E.SGD(learning_rate=0.05))):
        embedding = class_functions(vocab, args.dim, args.batch, "sum", optimizer)[0]
        kernels = ClassKernelsAlone(embedding, tf.nest.flatten(ids), tf.nest.flatten(weights),
                                    gradients)
        layout = kernels.layout
        view = collectives.ReplicaView(embedding.replica_group)

        splits = kernels.splits()

        @tf.function
        def pack(splits=splits, layout=layout):
            return {n: sharded_lookup.pack_one_replica(layout, s, splits[n], None).csr
                    for n, s in layout.stacked_tables.items()}

        csrs = pack()
        variables = kernels._variables(view)  # noqa: SLF001

        @tf.function
        def forward(csrs=csrs, layout=layout, variables=variables):
            return [sharded_lookup.lookup(view, layout, s, csrs[n], variables[n][0])
                    for n, s in layout.stacked_tables.items()]

        def make_update(per_feature, csrs=csrs, layout=layout, variables=variables,
                        embedding=embedding, kernels=kernels):
            """The fused update of every stacked table, its gradients in one tensor in the CSR's
            order, or (per_feature) as the class passes them with one replica: each feature's
            [batch, dim] gradient as it is, read feature-major."""
            plan = embedding.plan
            by_path = dict(zip(embedding.feature_paths, tf.nest.flatten(gradients)))
            grads, arguments = {}, {}
            for n, s in layout.stacked_tables.items():
                arguments[n] = sharded_lookup.shard_arguments(layout, view.replica_id)
                grads[n] = kernels.stacked_gradients[n]
                if per_feature:
                    arguments[n] = dict(arguments[n], feature_rows_per_sc=enqueue_lib
                                        .feature_major_rows(layout, s))
                    grads[n] = enqueue_lib.stack_gradients(plan, s, by_path,
                                                           enqueue_lib.PER_FEATURE)

            @tf.function
            def update():
                for n, s in layout.stacked_tables.items():
                    target = fused_update.UpdateTarget(
                        s, arguments[n], *variables[n], True,
                        embedding.replica_group.counter(view.replica_id,
                                                        collectives.UPDATE_STEPS))
                    fused_update.run(target, sharded_lookup.update_inputs(view, csrs[n], grads[n]))
            return update

        if name == "Adagrad":
            functions["preprocessing: ids to minibatch splits (one op per stacked table)"] = (
                kernels.splits)
            functions["preprocessing: CSR packing"] = pack
            functions["forward lookup"] = forward
        functions[f"fused {name} update"] = make_update(False)
        functions[f"fused {name} update, per-feature gradients"] = make_update(True)

    results = {}
    for name, fn in functions.items():
        fn()
        fn()
        wall, cpu = [], []
        for _ in range(args.calls):
            w, c = time.perf_counter(), time.process_time()
            fn()
            wall.append((time.perf_counter() - w) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
        results[name] = (statistics.median(wall), statistics.median(cpu))
    return {"kernels": results, "ids": num_ids, "distinct_rows": distinct_rows}


def main():
    args = parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    rows = {}
    for threads in (int(t) for t in args.threads.split(",")):
        command = [sys.executable, os.path.abspath(__file__), "--child", str(threads),
                   "--calls", str(args.calls), "--batch", str(args.batch), "--dim",
                   str(args.dim), "--vocabulary-cap", str(args.vocabulary_cap)]
        output = subprocess.run(command, check=True, capture_output=True, text=True,
                                timeout=1800).stdout
        rows[threads] = json.loads(output.split("RESULT ", 1)[1])
    first = next(iter(rows.values()))
    print(f"load average {os.getloadavg()[0]:.2f}; batch {args.batch}: {first['ids']:,} ids, "
          f"{first['distinct_rows']:,} distinct rows; vocabularies capped at "
          f"{args.vocabulary_cap:,}; median of {args.calls} calls\n")
    print("| kernel | threads | wall ms | CPU ms | M ids/s | M ids/s per thread | "
          "M rows/s | M rows/s per thread |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in first["kernels"]:
        for threads, result in rows.items():
            wall, cpu = result["kernels"][name]
            per_ids = result["ids"] / wall / 1e3
            per_rows = result["distinct_rows"] / wall / 1e3
            update = name.startswith("fused")
            ids_cells = "| |" if update else f"{per_ids:.1f} | {per_ids / threads:.1f} |"
            rows_cells = (f"{per_rows:.1f} | {per_rows / threads:.1f} |" if update else "| |")
            print(f"| {name} | {threads} | {wall:.2f} | {cpu:.2f} | {ids_cells} {rows_cells}")


if __name__ == "__main__":
    main()
