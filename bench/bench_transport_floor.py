"""What TensorFlow's collectives alone cost a worker per step, carrying the bytes of the sharded
exchange: the floor under the multi-worker step (issue 32).

A step of the all-to-all exchange (docs/multi_worker.md#exchange) runs four all-to-alls between
the workers: the id counts, the unique ids, the rows the owners send back and the gradients of
those rows. This benchmark runs only those four, with no embedding code at all: worker processes
on 127.0.0.1 (free ports, each under a timeout) under MultiWorkerMirroredStrategy call a
`tf.function` whose only work is the four chained `CollectiveAllToAllV2` ops (the op the library
uses), sized so that a worker sends --sent-mb megabytes per step, the figure
`bench/bench_multiworker.py` prints for the real step. Each of the W - 1 peers then receives n
int32 ids and n rows and n gradient rows of --dim float32 from each worker, with
n = sent / ((W - 1) * (4 + 8 * dim)). It reports the median wall time and CPU time (all threads of
the process) per step of each worker.

What is measured is the part of a multi-worker step that no library kernel can remove, because
TensorFlow's gRPC transport of collectives is the only one `tf.distribute` has between CPU
workers. With one core per worker (--pin, the weak-scaling set-up of BENCHMARKS.md) that CPU is
spent on the same core as the step's own work, so it bounds the attainable weak-scaling
efficiency from above (BENCHMARKS.md, "Weak scaling").

Usage: python bench/bench_transport_floor.py --sent-mb 6.8 [--workers 2] [--dim 32]
       [--steps 30] [--pin] [--bfc]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from common import free_loopback_ports, loopback_tf_config, wait_or_kill


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sent-mb", type=float, required=True,
                        help="megabytes a worker sends per step (bench_multiworker.py's figure)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--pin", action="store_true",
                        help="pin worker i to core i mod cores, as bench_multiworker.py --pin")
    parser.add_argument("--bfc", action="store_true",
                        help="TF_CPU_ALLOCATOR_USE_BFC=true in the workers (TensorFlow's pooling "
                             "CPU allocator)")
    parser.add_argument("--index", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    return parser.parse_args()


def bytes_per_id(dim):
    """What one id costs a sender: the id (int32), its row and its gradient row (dim float32)."""
    return 4 + 8 * dim


def ids_per_peer(sent_bytes, workers, dim):
    """n: the unique ids a worker sends each peer per step so that they add up to `sent_bytes`."""
    return max(1, round(sent_bytes / ((workers - 1) * bytes_per_id(dim))))


def worker(args):
    if args.pin:   # before TensorFlow sizes its thread pools from the affinity
        os.sched_setaffinity(0, {args.index % os.cpu_count()})
    ports = args.ports.split(",")
    os.environ["TF_CONFIG"] = loopback_tf_config(ports, args.index)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding import private_tf  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.collectives import freed_memory  # pylint: disable=import-outside-toplevel
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    freed_memory.keep_freed_memory()   # as every worker of the library's multi-worker jobs
    workers = len(ports)
    n = ids_per_peer(args.sent_mb * 1e6, workers, args.dim)
    # Inputs made once: the step measures the transport, not the making of its buffers.
    # Shaped [workers, ...] like the library's all-to-all buffers: block p goes to worker p.
    counts = tf.fill([workers, 1], tf.constant(n, tf.int32))
    ids = tf.reshape(tf.range(workers * n, dtype=tf.int32), [workers, n])
    rows = tf.random.stateless_uniform([workers, n, args.dim], seed=[args.index, 1])
    gradients = tf.random.stateless_uniform([workers, n, args.dim], seed=[args.index, 2])
    instance = [100]

    def next_instance():
        instance[0] += 1
        return instance[0]

    def all_to_all(value, token):
        # A fresh instance key on every call, as the library's collectives take (their sizes
        # change from step to step, and TensorFlow caches an instance's shape by its key): each
        # call then also pays the resolution of a new instance.
        return tf.raw_ops.CollectiveAllToAllV2(
            input=value, group_size=workers, group_key=11,
            instance_key=private_tf.call_time_int32(next_instance), ordering_token=[token],
            communication_hint="ring", timeout_seconds=60)

    token = tf.Variable(0.0)   # orders the four launches, as the library's ordering token does

    def exchange():
        outputs = []
        handle = token.handle
        for value in (counts, ids, rows, gradients):
            outputs.append(all_to_all(value, handle))
        return [tf.shape(o)[1] for o in outputs]

    step = tf.function(lambda: strategy.run(exchange))
    for _ in range(args.warmup):
        step()
    wall, cpu = [], []
    for _ in range(args.steps):
        w, c = time.perf_counter(), time.process_time()
        tf.nest.map_structure(lambda t: t.numpy(), strategy.experimental_local_results(step()))
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    sent = (workers - 1) * (4 + n * bytes_per_id(args.dim))   # 4: the count
    with open(args.out, "w") as f:
        json.dump({"wall_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu),
                   "sent_bytes": sent, "ids_per_peer": n}, f)
    return 0


def main():
    args = parse_args()
    if args.index >= 0:
        return worker(args)
    if args.workers < 2:
        sys.exit("--workers must be at least 2 (one worker has nothing to exchange)")
    ports = ",".join(str(p) for p in free_loopback_ports(args.workers))
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if args.bfc:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"w{i}.json") for i in range(args.workers)]
        command = [sys.executable, os.path.abspath(__file__), "--ports", ports,
                   "--sent-mb", str(args.sent_mb), "--dim", str(args.dim),
                   "--steps", str(args.steps), "--warmup", str(args.warmup)]
        command += ["--pin"] * args.pin
        processes = [subprocess.Popen(command + ["--index", str(i), "--out", outs[i]], env=env,
                                      start_new_session=True)
                     for i in range(args.workers)]
        codes = wait_or_kill(processes, args.timeout)
        if any(codes):
            sys.exit(f"a worker failed: exit codes {codes}")
        results = []
        for out in outs:
            with open(out) as f:
                results.append(json.load(f))
    wall = statistics.mean(r["wall_ms"] for r in results)
    cpu = statistics.mean(r["cpu_ms"] for r in results)
    print(f"{args.workers} workers, collectives alone ({'pinned' if args.pin else 'unpinned'}"
          f"{', BFC' if args.bfc else ''}): {results[0]['sent_bytes'] / 1e6:.2f} MB sent per "
          f"worker per step ({results[0]['ids_per_peer']} ids per peer), step {wall:.1f} ms, "
          f"CPU {cpu:.1f} ms per worker per step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
