"""Peak memory per step phase (issue 8, item 5), through `TPUEmbeddingV2`, at several vocabulary
caps of the Criteo-like workload (26 tables, dim 32, batch 4096, weighted ragged ids, fused
Adagrad, 1 replica).

Each (cap, phase) runs in a fresh child process: build the embedding (tables and slots
allocated), make the batch, call the phase twice to trace and warm it up, then sample the
process's resident set size every millisecond (/proc/self/statm) while calling it `--calls`
more times. Reported per phase:
  tables MB     parameters + slots of the stacked tables (what build allocated)
  after build   RSS once the tables exist, before any call
  first 2 calls RSS growth over the two tracing / warm-up calls (graph building, the working set
                of one call, which later calls reuse)
  before MB     RSS right before the sampled calls
  peak MB       the highest RSS sampled during them
  transient MB  peak - before: what a call allocates on top of what is already resident

A phase whose transient memory grew with the vocabulary would allocate something proportional to
table size; the transient should be flat across caps while "tables MB" grows.

Usage: python bench/bench_memory.py [--caps 1000000,4000000] [--calls 10]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PHASES = ("enqueue", "lookup", "step")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler:
    """Samples RSS every millisecond in a thread; `peak` is the highest value seen."""

    def __init__(self):
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def child(cap, phase, calls, batch_size):
    import tensorflow as tf  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_class_overhead import class_functions  # noqa: PLC0415
    from common import ragged_features  # noqa: PLC0415
    from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: PLC0415

    vocab = [min(v, cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    batch = CriteoLikeWorkload(vocabulary_sizes=vocab).batch(batch_size)
    ids, weights = ragged_features(batch)
    gradients = {f"f{i}": tf.random.stateless_normal([batch_size, 32], seed=[7, i])
                 for i in range(len(vocab))}
    embedding, enqueue, lookup, step = class_functions(vocab, 32, batch_size, "sum")
    built = rss_bytes()
    fn = {"enqueue": lambda: enqueue(ids, weights), "lookup": lambda: lookup(ids, weights),
          "step": lambda: step(ids, weights, gradients)}[phase]
    fn()
    fn()
    tables = sum(v.shape.num_elements() * 4 for v in embedding.storage.local_variables())
    before = rss_bytes()
    with PeakSampler() as sampler:
        for _ in range(calls):
            fn()
    return {"cap": cap, "phase": phase, "tables_mb": tables / 2**20, "built_mb": built / 2**20,
            "warmup_mb": (before - built) / 2**20, "before_mb": before / 2**20,
            "peak_mb": sampler.peak / 2**20, "transient_mb": (sampler.peak - before) / 2**20}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caps", default="1000000,4000000")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--child", nargs=2, metavar=("CAP", "PHASE"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args.calls, args.batch)))
        return
    rows = []
    for cap in [int(c) for c in args.caps.split(",")]:
        for phase in PHASES:
            out = subprocess.run([sys.executable, __file__, "--child", str(cap), phase,
                                  "--calls", str(args.calls), "--batch", str(args.batch)],
                                 capture_output=True, text=True, timeout=1800, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    print("\n| vocabulary cap | phase | tables + slots MB | RSS after build MB | first 2 calls "
          "MB | RSS before MB | peak RSS MB | transient MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['cap']:,} | {r['phase']} | {r['tables_mb']:.0f} | {r['built_mb']:.0f} | "
              f"{r['warmup_mb']:.0f} | {r['before_mb']:.0f} | {r['peak_mb']:.0f} | "
              f"{r['transient_mb']:.1f} |")


if __name__ == "__main__":
    main()
