"""What one small collective launch costs between worker processes on loopback.

The all-to-all exchange runs a handful of collectives per step, one after another (they share an
ordering token). Each crosses the TensorFlow runtime and gRPC whatever its size, so the number of
launches matters next to the bytes. This measures the marginal cost of one launch: worker
processes on 127.0.0.1 (free ports, each under a timeout) under MultiWorkerMirroredStrategy run a
`tf.function` with 1 and with K chained all-gathers of two int32 (as `CollectiveGatherV2`, the op
the library's collectives use), and report (time with K - time with 1) / (K - 1), wall and CPU of
the process, medians over --calls calls.

Usage: python bench/bench_collective_launch.py [--workers 2] [--chain 11] [--calls 100]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

from common import free_loopback_ports, loopback_tf_config, wait_or_kill


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chain", type=int, default=11, help="collectives in the long chain")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--index", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    return parser.parse_args()


def worker(args):
    ports = args.ports.split(",")
    os.environ["TF_CONFIG"] = loopback_tf_config(ports, args.index)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = len(ports)
    next_key = [1000]

    def chain(length):
        x = tf.constant([args.index, 1], tf.int32)
        for _ in range(length):
            next_key[0] += 1
            x = tf.raw_ops.CollectiveGatherV2(
                input=x[:2], group_size=workers, group_key=7, instance_key=next_key[0],
                ordering_token=[], communication_hint="ring", timeout_seconds=60)
        return x

    medians = {}
    for length in (1, args.chain):
        fn = tf.function(lambda length=length: strategy.run(lambda: chain(length)))
        for _ in range(5):
            fn()
        wall, cpu = [], []
        for _ in range(args.calls):
            w, c = time.perf_counter(), time.process_time()
            strategy.experimental_local_results(fn())[0].numpy()
            wall.append((time.perf_counter() - w) * 1e3)
            cpu.append((time.process_time() - c) * 1e3)
        medians[length] = (statistics.median(wall), statistics.median(cpu))
    if args.index == 0:
        (w1, c1), (wk, ck) = medians[1], medians[args.chain]
        k = args.chain - 1
        print(f"{workers} workers: one more collective launch costs {(wk - w1) / k:.3f} ms wall, "
              f"{(ck - c1) / k:.3f} ms CPU of worker 0 (1 launch: {w1:.2f} ms wall / {c1:.2f} ms "
              f"CPU per call; {args.chain}: {wk:.2f} / {ck:.2f})", flush=True)
    return 0


def main():
    args = parse_args()
    if args.index >= 0:
        return worker(args)
    ports = ",".join(str(p) for p in free_loopback_ports(args.workers))
    command = [sys.executable, os.path.abspath(__file__), "--ports", ports,
               "--chain", str(args.chain), "--calls", str(args.calls)]
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    processes = [subprocess.Popen(command + ["--index", str(i)], env=env, start_new_session=True)
                 for i in range(args.workers)]
    codes = wait_or_kill(processes, args.timeout)
    return max(abs(c) for c in codes)


if __name__ == "__main__":
    sys.exit(main())
