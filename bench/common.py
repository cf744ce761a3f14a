"""Timing and process helpers shared by the benchmarks."""
import json
import os
import signal
import socket
import statistics
import time


def time_per_call(fn, iterations, warmup=2):
    """Median wall time of fn() in milliseconds (fn must block until its work is done)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def report(rows, title):
    """Prints a Markdown table of (name, ms, ratio-to-baseline) rows."""
    print(f"\n### {title}\n")
    print("| measurement | ms per batch | vs. tf_sc_embedding |")
    print("|---|---:|---:|")
    for name, ms, ratio in rows:
        ratio_text = "" if ratio is None else f"{ratio:.1f}x"
        print(f"| {name} | {ms:.1f} | {ratio_text} |")


def ragged_features(batch):
    """A CriteoLikeWorkload batch as the class takes it: ({"f<i>": ragged ids},
    {"f<i>": ragged weights}), feature i being the workload's table i."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    ids = {f"f{i}": tf.RaggedTensor.from_row_splits(x, s)
           for i, (x, s) in enumerate(zip(batch.ids, batch.row_splits))}
    weights = {f"f{i}": tf.RaggedTensor.from_row_splits(w, s)
               for i, (w, s) in enumerate(zip(batch.weights, batch.row_splits))}
    return ids, weights


def free_loopback_ports(n):
    """n TCP ports that are free on 127.0.0.1 (bound, read and released) for worker processes."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_or_kill(processes, timeout):
    """The exit codes of `processes` (started with start_new_session=True), waiting at most
    `timeout` seconds for all of them; whatever still runs then (or when waiting fails) is killed
    with its process group, so no worker outlives the benchmark."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def loopback_tf_config(ports, index):
    """TF_CONFIG (a JSON string) of worker `index` in a cluster of workers on 127.0.0.1:ports."""
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})

