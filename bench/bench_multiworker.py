"""Multi-worker benchmark: bytes sent per worker per step and step time, at 1, 2 and 4 worker
processes of MultiWorkerMirroredStrategy on 127.0.0.1, for the all-to-all exchange (default) and
the all-gather exchange, at a fixed per-worker batch, in the same run; then the projection of the
measured bytes to 8 and 64 workers.

Every worker runs `TPUEmbeddingV2` on the 26-feature Criteo-like workload (vocabularies capped at
--vocab-cap rows, dim --dim, weighted ragged ids, fused Adagrad). Bytes are counted by the
library at each collective call (`TPUEmbeddingV2.counters().collective_bytes_sent`, under the cost model
of docs/multi_worker.md#bytes-per-step). Step time is the median wall time of a step on worker 0
after --warmup steps; all workers share this machine's cores, so it mostly shows the extra work
and latency of more processes, not network time. The CPU time of a step (all threads of a worker
process, the median over steps, averaged over workers) is the steadier measure of the work a
worker does on a shared host.

With --dense, every step also trains a small dense model on the activations (an MLP
832-64-32-1 with a logistic loss, its gradients all-reduced over the replicas as a
MultiWorkerMirroredStrategy user does), and --modes compares, in the same run, sequential steps
(off), pipeline_execution_with_tensor_core=True (pipelined: the fused update runs during the next
step) and pipelining with the next batch's lookup prefetched beside the dense step (prefetch:
embedding(features, next_features=...), docs/pipelining.md#prefetching-the-next-lookup).

Usage: python bench/bench_multiworker.py [--workers 1,2,4] [--batch 1024] [--steps 10]
       [--feed arguments|iterator] [--pin] [--profile] [--dense] [--modes off,pipelined,prefetch]
       [--wire-precision float32|16bit] [--transport tensorflow|oneccl|oneccl-tcp|auto]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import free_loopback_ports, loopback_tf_config, wait_or_kill  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--exchanges", default="all_to_all,all_to_all_replicated,all_gather",
                        help="all_to_all: every table sharded (the library's default); "
                             "all_to_all_replicated: tables of at most 256 KiB replicated "
                             "(replication_threshold_bytes=262144); all_gather: the all-gather "
                             "exchange (all-gather of ids, all-reduce of activations, every "
                             "table sharded)")
    parser.add_argument("--batch", type=int, default=1024, help="per-worker batch")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--vocab-cap", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--role", default="driver", choices=["driver", "worker"])
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ports", default="")
    parser.add_argument("--exchange", default="all_to_all")
    parser.add_argument("--wire-precision", default="float32", choices=["float32", "16bit"],
                        help="EmbeddingOptions.wire_precision: 16bit sends rows as float16 and "
                             "gradients as bfloat16 (docs/multi_worker.md#wire-precision)")
    parser.add_argument("--transport", default="tensorflow",
                        choices=["tensorflow", "oneccl", "oneccl-tcp", "auto"],
                        help="EmbeddingOptions.exchange_transport; oneccl-tcp is oneCCL with "
                             "shared memory off (FI_PROVIDER=tcp, the path between hosts)")
    parser.add_argument("--out", default="")
    parser.add_argument("--pin", action="store_true",
                        help="pin worker i to core i mod cores (one worker per core, as on "
                             "separate hosts; with --workers 1 the same as taskset -c 0)")
    parser.add_argument("--profile", action="store_true",
                        help="trace worker 0's measured steps with tf.profiler and print where "
                             "its CPU goes by phase (bench/phase_profile.py); step times then "
                             "include the profiler's overhead")
    parser.add_argument("--feed", default="arguments", choices=["arguments", "iterator"],
                        help="arguments: the step function takes the batch's 52 ragged tensors "
                             "(TensorFlow's argument handling costs ~2-3 ms per call); iterator: "
                             "it takes them with next() from a tf.data iterator inside (the "
                             "README's recommendation)")
    parser.add_argument("--dense", action="store_true",
                        help="train a small dense model (MLP 832-64-32-1) on the activations")
    parser.add_argument("--modes", default="off",
                        help="comma-separated: off (sequential), pipelined "
                             "(pipeline_execution_with_tensor_core=True), prefetch (pipelined, "
                             "and the next batch's lookup runs beside the dense step)")
    parser.add_argument("--mode", default="off", choices=MODES)
    return parser.parse_args()


MODES = ("off", "pipelined", "prefetch")


# ------------------------------------------------------------------------------------ worker
class DenseModel:
    """A small dense model on the concatenated activations, trained by plain SGD with its
    gradients averaged over the replicas by the strategy's all-reduce (what a data-parallel
    MultiWorkerMirroredStrategy step does). Every worker holds its own copy, created outside the
    strategy's scope from the same seed and updated with the same averaged gradients."""

    def __init__(self, width, seed, hidden=(64, 32), learning_rate=0.05):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        sizes = (width,) + tuple(hidden) + (1,)
        init = tf.initializers.GlorotUniform(seed=seed)
        self.weights = [tf.Variable(init([a, b]), name=f"w{i}")
                        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]
        self.biases = [tf.Variable(tf.zeros([b]), name=f"b{i}") for i, b in enumerate(sizes[1:])]
        self.learning_rate = learning_rate

    def train(self, activations, label):
        """(loss, gradients of the activations) of one replica's batch; updates the model."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        variables = self.weights + self.biases
        with tf.GradientTape() as tape:
            tape.watch(activations)
            x = tf.concat(activations, axis=1)
            for i, (w, b) in enumerate(zip(self.weights, self.biases)):
                x = tf.matmul(x, w) + b
                if i + 1 < len(self.weights):
                    x = tf.nn.relu(x)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(label, x))
        gradients = tape.gradient(loss, list(activations) + variables)
        context = tf.distribute.get_replica_context()
        summed = context.all_reduce(tf.distribute.ReduceOp.MEAN, gradients[len(activations):])
        for v, g in zip(variables, summed):
            v.assign_sub(self.learning_rate * g)
        return loss, gradients[:len(activations)]


def worker(args):
    if args.pin:   # before TensorFlow sizes its thread pools from the affinity
        os.sched_setaffinity(0, {args.index % os.cpu_count()})
    ports = args.ports.split(",")
    os.environ["TF_CONFIG"] = loopback_tf_config(ports, args.index)
    if args.transport == "oneccl-tcp":
        os.environ["FI_PROVIDER"] = "tcp"
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.data import CriteoLikeWorkload  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.data.criteo_like import CRITEO_LIKE_VOCABULARY_SIZES  # pylint: disable=import-outside-toplevel
    from common import ragged_features  # pylint: disable=import-outside-toplevel

    E = tf.tpu.experimental.embedding
    workers = len(ports)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    vocab = [min(v, args.vocab_cap) for v in CRITEO_LIKE_VOCABULARY_SIZES]
    workload = CriteoLikeWorkload(vocab)
    tables = [E.TableConfig(vocabulary_size=v, dim=args.dim, name=f"t{i}", combiner="mean",
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    exchange = "all_gather" if args.exchange == "all_gather" else "all_to_all"
    threshold = ({"replication_threshold_bytes": 256 * 1024}
                 if args.exchange == "all_to_all_replicated" else {})
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, E.Adagrad(learning_rate=0.05),
                                       exchange=exchange, wire_precision=args.wire_precision,
                                       exchange_transport=args.transport.split("-")[0],
                                       pipeline_execution_with_tensor_core=args.mode != "off",
                                       **threshold)
    dense = DenseModel(len(features) * args.dim, seed=7) if args.dense else None
    replicated = sum(p == "replicated" for p in embedding.placement_plan.values())
    embedding.build(per_replica_batch_size=args.batch)

    total = args.warmup + args.steps
    batches = []
    for step in range(total + 1):   # one more: the last step's next batch
        b = workload.batch(args.batch, step * workers + args.index)
        ids, weights = ragged_features(b)
        batches.append((ids, weights))
    names = sorted(batches[0][0], key=lambda f: int(f[1:]))
    # Labels of the dense model: a fixed function of the ids, so there is something to learn.
    labels = [tf.cast(ids["f0"].row_lengths() % 2, tf.float32)[:, None] for ids, _ in batches]

    def replica_step(ids, weights, label, next_ids=None, next_weights=None):
        if args.mode == "prefetch":
            activations, preserved = embedding(ids, weights, next_features=next_ids,
                                               next_weights=next_weights)
        else:
            activations, preserved = embedding(ids, weights)
        flat = [activations[f] for f in names]
        if dense is None:
            gradients = [0.01 * a for a in flat]
            loss = tf.add_n([tf.reduce_sum(a) for a in flat])
        else:
            loss, gradients = dense.train(flat, label)
        embedding.apply_gradients(dict(zip(names, gradients)), preserved)
        return loss

    @tf.function
    def step_on_arguments(*inputs):
        return strategy.run(replica_step, args=inputs)

    @tf.function
    def step_on_iterator(iterator):
        element = next(iterator)
        inputs = element[0] + element[1] if args.mode == "prefetch" else element
        return strategy.run(replica_step, args=inputs)

    @tf.function
    def prefetch_first(ids, weights):
        return strategy.run(embedding.prefetch, args=(ids, weights))

    # One dataset of all the batches (a chain of concatenated one-batch datasets would cost each
    # next() a walk along the chain): per feature the ids and weights of every step as ragged
    # [steps, None] values and dense [steps, batch + 1] row splits, made ragged again by a map so
    # the batch dimension stays static. With prefetch, element k also holds batch k + 1.
    def columns(steps):
        return tuple((tf.ragged.stack([batches[k][0][f].values for k in steps]),
                      tf.ragged.stack([batches[k][1][f].values for k in steps]),
                      tf.stack([batches[k][0][f].row_splits for k in steps]))
                     for f in names), tf.stack([labels[k] for k in steps])

    def as_ragged(per_feature, label):
        ids, weights = {}, {}
        for f, (values, gains, splits) in zip(names, per_feature):
            ids[f] = tf.RaggedTensor.from_row_splits(values, splits, validate=False)
            weights[f] = tf.RaggedTensor.from_row_splits(gains, splits, validate=False)
        return ids, weights, label

    def one_batch_per_step(steps):
        return tf.data.Dataset.from_tensor_slices(columns(steps)).map(as_ragged)

    dataset = one_batch_per_step(range(total))
    if args.mode == "prefetch":
        upcoming = one_batch_per_step(range(1, total + 1)).map(lambda i, w, _: (i, w))
        dataset = tf.data.Dataset.zip(dataset, upcoming)   # (batch k, batch k + 1)
        prefetch_first(*batches[0])
    iterator = iter(dataset)

    times, cpu_times = [], []
    trace_dir = os.path.join(args.out, "trace") if args.profile and args.index == 0 else None
    for step in range(total):
        ids, weights = batches[step]
        inputs = (ids, weights, labels[step]) + (batches[step + 1] if args.mode == "prefetch"
                                                 else ())
        if step == args.warmup:
            embedding.replica_group.reset_bytes_sent()
            if trace_dir:
                tf.profiler.experimental.start(trace_dir)
        start, cpu_start = time.perf_counter(), time.process_time()
        result = (step_on_iterator(iterator) if args.feed == "iterator" else
                  step_on_arguments(*inputs))
        np.asarray(strategy.experimental_local_results(result)[0])
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
            cpu_times.append((time.process_time() - cpu_start) * 1e3)
    phases = None
    if trace_dir:
        tf.profiler.experimental.stop()
        from phase_profile import phase_breakdown  # pylint: disable=import-outside-toplevel
        phases = phase_breakdown(trace_dir, args.steps, statistics.median(cpu_times))
    counters = embedding.counters()
    sent = sum(counters.collective_bytes_sent.values())
    launches = sum(counters.collective_launches.values()) / len(counters.collective_launches)
    ids_per_step = statistics.mean(
        sum(int(x.values.shape[0]) for x in ids.values()) for ids, _ in batches[:total])
    with open(os.path.join(args.out, f"worker_{args.index}.json"), "w") as f:
        json.dump({"bytes_per_step": sent / args.steps, "step_ms": statistics.median(times),
                   "cpu_ms": statistics.median(cpu_times),
                   "collectives_per_step": launches / args.steps,
                   "ids_per_step": ids_per_step, "replicated_tables": replicated,
                   "phases": phases}, f)
    return 0


# ------------------------------------------------------------------------------------ driver
def run_cluster(args, workers, exchange, directory, mode="off"):
    ports = ",".join(str(p) for p in free_loopback_ports(workers))
    common = [sys.executable, os.path.abspath(__file__), "--role", "worker", "--ports", ports,
              "--exchange", exchange, "--out", directory, "--batch", str(args.batch),
              "--dim", str(args.dim), "--vocab-cap", str(args.vocab_cap),
              "--steps", str(args.steps), "--warmup", str(args.warmup), "--feed", args.feed,
              "--wire-precision", args.wire_precision, "--transport", args.transport]
    common += ["--pin"] * args.pin + ["--profile"] * args.profile + ["--dense"] * args.dense
    common += ["--mode", mode]
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")
    env.pop("TF_CONFIG", None)
    logs = [open(os.path.join(directory, f"log_{i}.txt"), "w") for i in range(workers)]
    processes = [subprocess.Popen(common + ["--index", str(i)], stdout=logs[i],
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
                 for i in range(workers)]
    try:
        codes = wait_or_kill(processes, args.timeout)
    finally:
        for log in logs:
            log.close()
    if any(codes):
        tail = open(os.path.join(directory, "log_0.txt")).read()[-2000:]
        raise RuntimeError(f"{workers} workers ({exchange}) failed: {codes}\n{tail}")
    results = [json.load(open(os.path.join(directory, f"worker_{i}.json")))
               for i in range(workers)]
    return {"bytes_per_step": statistics.mean(r["bytes_per_step"] for r in results),
            "step_ms": results[0]["step_ms"], "ids_per_step": results[0]["ids_per_step"],
            "cpu_ms": statistics.mean(r["cpu_ms"] for r in results),
            "collectives_per_step": results[0]["collectives_per_step"],
            "replicated_tables": results[0]["replicated_tables"], "phases": results[0]["phases"]}


def project(exchange, measured, target):
    """Bytes per worker per step at `target` workers, from the two largest measured points.

    all_to_all: a replica sends the (W-1)/W of its exchange payload P that other replicas own,
    plus small terms (counts, padding to the largest chunk, the replicated tables' all-gather)
    taken as linear in W: b(W) = P (W-1)/W + c W. all_gather: every term grows with W (the
    gathered buffers and the [W x batch] partial activations): b(W) linear in W.
    """
    (w1, b1), (w2, b2) = sorted(measured.items())[-2:]
    if exchange.startswith("all_to_all"):
        f1, f2 = (w1 - 1) / w1, (w2 - 1) / w2
        c = (b2 * f1 - b1 * f2) / (w2 * f1 - w1 * f2)
        payload = (b1 - c * w1) / f1
        return payload * (target - 1) / target + c * target
    slope = (b2 - b1) / (w2 - w1)
    return b2 + slope * (target - w2)


def main():
    args = parse_args()
    if args.role == "worker":
        return worker(args)
    counts = [int(w) for w in args.workers.split(",")]
    exchanges = args.exchanges.split(",")
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (one of {MODES})")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in counts:
            for exchange in exchanges:
                if workers == 1 and exchange != exchanges[0]:
                    continue   # one replica: no exchange at all
                for mode in modes:
                    directory = os.path.join(tmp, f"{exchange}_{workers}_{mode}")
                    os.makedirs(directory)
                    r = run_cluster(args, workers, exchange, directory, mode)
                    results[(exchange, workers, mode)] = r
                    label = exchange if len(modes) == 1 and not args.dense else (
                        f"{exchange} ({'pipelining ' + mode if mode != 'off' else 'sequential'}"
                        f"{', dense MLP' if args.dense else ''})")
                    if workers > 1:
                        label += f" over {args.transport}"
                    print(f"{workers} worker(s), {label}: {r['bytes_per_step'] / 1e6:.2f} MB "
                          f"sent per worker per step, step {r['step_ms']:.1f} ms, CPU "
                          f"{r['cpu_ms']:.1f} ms per worker per step, "
                          f"{r['collectives_per_step']:g} collectives per step", flush=True)
                    for phase, ms in r["phases"] or ():
                        print(f"    worker 0, CPU ms per step: {ms:6.1f}  {phase}", flush=True)
    if len(modes) > 1:
        for (exchange, workers, mode), r in sorted(results.items()):
            base = results.get((exchange, workers, modes[0]))
            if mode != modes[0] and base:
                print(f"{workers} worker(s), {exchange}: step time {mode} / {modes[0]}: "
                      f"{r['step_ms']:.1f} / {base['step_ms']:.1f} ms = "
                      f"{r['step_ms'] / base['step_ms']:.2f}x")
    results = {(e, w): r for (e, w, m), r in results.items() if m == modes[0]}
    print(f"\n### Multi-worker exchange (per-worker batch {args.batch}, dim {args.dim}, "
          f"vocabularies capped at {args.vocab_cap:,}, ~{results[(exchanges[0], counts[0])]['ids_per_step']:,.0f} ids per worker per step)\n")
    print("| workers | exchange | replicated tables | MB sent per worker per step | "
          "step ms (worker 0, median) | CPU ms per worker per step (median) |")
    print("|---:|---|---:|---:|---:|---:|")
    for (exchange, workers), r in sorted(results.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"| {workers} | {exchange} | {r['replicated_tables']} | "
              f"{r['bytes_per_step'] / 1e6:.2f} | {r['step_ms']:.1f} | {r['cpu_ms']:.1f} |")
    multi = [w for w in counts if w > 1]
    if len(multi) >= 2:
        print("\n| projection from the measured points (see project()) | 8 workers | "
              "64 workers |")
        print("|---|---:|---:|")
        projected = {}
        for exchange in exchanges:
            measured = {w: results[(exchange, w)]["bytes_per_step"] for w in multi}
            projected[exchange] = (project(exchange, measured, 8),
                                   project(exchange, measured, 64))
            print(f"| {exchange}: MB per worker per step | {projected[exchange][0] / 1e6:.2f} | "
                  f"{projected[exchange][1] / 1e6:.2f} |")
        print()
        for exchange in exchanges:
            if exchange == "all_gather" or "all_gather" not in projected:
                continue
            ratio8 = projected["all_gather"][0] / projected[exchange][0]
            ratio64 = projected["all_gather"][1] / projected[exchange][1]
            print(f"all_gather / {exchange} bytes: {ratio8:.1f}x at 8 workers, "
                  f"{ratio64:.1f}x at 64 workers")
        lo, hi = multi[0], multi[-1]
        for exchange in exchanges:
            growth = (results[(exchange, hi)]["bytes_per_step"] /
                      results[(exchange, lo)]["bytes_per_step"])
            line = f"{exchange} bytes per worker, {hi} vs {lo} workers: {growth:.2f}x"
            if exchange.startswith("all_to_all"):
                # What a replica hands to the all-to-alls, its own chunk included.
                payload = growth * ((lo - 1) / lo) / ((hi - 1) / hi)
                line += f" (payload including the chunk a replica keeps: {payload:.2f}x)"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
