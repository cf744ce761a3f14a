"""How far the kernels are from this machine's memory limit (issue 8, item 2).

Builds bench/memory_limit.cc (g++, the library's float flags) and runs its probes with the
Criteo-like workload's sizes: all 26 tables' rows as one table (vocabularies capped at
--vocabulary-cap), the batch's distinct rows and ids, and one activation row per (sample,
feature). The probes are the kernels' memory traffic with the least work around it (see the .cc
file). Their sums give a floor for each kernel, one thread:

  forward lookup     forward probe
  fused SGD          rows probe (table) + gradients probe
  fused Adagrad      rows probe (table + slot) + gradients probe

Then, in the same run, bench/bench_kernels.py at one thread times the kernels on the same
workload, and the table gives kernel / floor. Both bench_kernels and the "same rows" probes repeat
one batch; the "fresh rows" probes draw new rows every call, as training does.

Usage: python bench/memory_limit.py [--vocabulary-cap 4000000] [--calls 30] [--skip-kernels]
"""
import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The floats are computed as the library computes them (setup.py): no FMA contraction, and
# sqrt without errno so the Adagrad probe vectorizes as the kernel does.
FLAGS = ["-std=c++17", "-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno"]
# Kernel rows of bench_kernels -> the probes whose sum is its floor.
FLOORS = {
    "forward lookup": ["forward"],
    "fused SGD update": ["rows, SGD (table)", "gradients"],
    "fused Adagrad update": ["rows, Adagrad (table + slot)", "gradients"],
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocabulary-cap", type=int, default=4_000_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--skip-kernels", action="store_true",
                        help="run the probes only (no bench_kernels.py)")
    return parser.parse_args()


def workload_sizes(args):
    vocab = [min(v, args.vocabulary_cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    batch = CriteoLikeWorkload(vocabulary_sizes=vocab).batch(args.batch)
    return {"table_rows": sum(vocab),
            "distinct": sum(len(np.unique(x)) for x in batch.ids),   # one table per feature
            "ids": sum(len(x) for x in batch.ids),
            "activation_rows": args.batch * len(vocab)}


def run_probes(sizes, args):
    with tempfile.TemporaryDirectory() as tmp:
        binary = os.path.join(tmp, "memory_limit")
        subprocess.run(["g++", *FLAGS, os.path.join(HERE, "memory_limit.cc"), "-o", binary],
                       check=True)
        output = subprocess.run(
            [binary, str(sizes["table_rows"]), str(sizes["distinct"]), str(sizes["ids"]),
             str(sizes["activation_rows"]), str(args.dim), str(args.calls)],
            check=True, capture_output=True, text=True, timeout=1800).stdout
    probes = {}
    for line in output.splitlines()[1:]:
        name, mode, ms = line.split("\t")
        probes[(name, mode)] = float(ms)
    return probes


def run_kernels(args):
    """{kernel row name: wall ms} from bench_kernels.py at one thread."""
    output = subprocess.run(
        [sys.executable, os.path.join(HERE, "bench_kernels.py"), "--threads", "1", "--calls",
         str(args.calls), "--batch", str(args.batch), "--dim", str(args.dim),
         "--vocabulary-cap", str(args.vocabulary_cap)],
        check=True, capture_output=True, text=True, timeout=3600).stdout
    kernels = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 4 and cells[2] == "1":
            kernels[cells[1]] = float(cells[3])
    return kernels


def main():
    args = parse_args()
    sizes = workload_sizes(args)
    probes = run_probes(sizes, args)
    print(f"load average {os.getloadavg()[0]:.2f}; one table of {sizes['table_rows']:,} rows "
          f"(vocabularies capped at {args.vocabulary_cap:,}), {sizes['distinct']:,} distinct "
          f"rows, {sizes['ids']:,} ids, {sizes['activation_rows']:,} activation rows, dim "
          f"{args.dim}; median of {args.calls} calls, one thread\n")
    print("| probe | same rows ms | fresh rows ms |\n|---|---:|---:|")
    for name in dict.fromkeys(n for n, _ in probes):
        print(f"| {name} | {probes[(name, 'same')]:.2f} | {probes[(name, 'fresh')]:.2f} |")
    if args.skip_kernels:
        return
    kernels = run_kernels(args)
    print("\n| kernel (bench_kernels, 1 thread) | ms | floor, same rows | kernel / floor | "
          "floor, fresh rows |\n|---|---:|---:|---:|---:|")
    for kernel, parts in FLOORS.items():
        for name in (kernel, kernel + ", per-feature gradients"):
            if name not in kernels:
                continue
            same = sum(probes[(p, "same")] for p in parts)
            fresh = sum(probes[(p, "fresh")] for p in parts)
            print(f"| {name} | {kernels[name]:.2f} | {same:.2f} | {kernels[name] / same:.2f}x | "
                  f"{fresh:.2f} |")


if __name__ == "__main__":
    main()
