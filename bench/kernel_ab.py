"""A/B timing of the core kernels of two source trees, in one process (issue 8, item 2).

On the 2-vCPU VMs this project is measured on, two runs of one build differ by 20-30% from one
minute to the next, which hides any kernel change smaller than that when builds are compared in
separate runs. This script builds `cc/core` of two trees (for instance a `git worktree` of the base
commit and the working tree) into two shared libraries with the library's compiler flags
(setup.py), loads both into one process and alternates their calls on the same CSR (by default
the one the class builds for a batch of the benchmark workload, see --workload;
bench/kernel_ab_main.cc): A then B, B then A, and so on. It prints both medians, B/A, and in how
many rounds B was faster. The forward lookup's outputs of the two builds must be bit-identical.
The updates read their gradients in the CSR's order (one buffer), or with `--gradients
per-feature` as the class passes them with one replica (one buffer per feature, feature-major).

`--kernel A:B` runs kernel A in build A and kernel B in build B, for instance
`--a . --kernel adagrad:adagrad-bf16` times float32 against bfloat16 rows in this tree.

Usage: python bench/kernel_ab.py --a /path/to/base/tree [--b .] [--kernel KERNEL[:KERNEL]]
                                 [--gradients csr|per-feature] [--calls 300] [--repeats 2]
KERNEL: forward, adagrad, sgd, forward-bf16 (bfloat16 rows) or adagrad-bf16.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The library's float flags (setup.py): no FMA contraction, sqrt without errno. No -march: the
# kernels pick their instruction set at run time, as in the built library.
FLAGS = ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fvisibility=hidden"]


KERNELS = ("forward", "adagrad", "sgd", "forward-bf16", "adagrad-bf16")


def kernel_pair(text):
    """`text` if it names one kernel or two as A:B (both lookups or both updates)."""
    names = text.split(":")
    if len(names) > 2 or any(n not in KERNELS for n in names):
        raise argparse.ArgumentTypeError(f"{text!r}: kernels are {', '.join(KERNELS)}")
    if len({n.startswith("forward") for n in names}) > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a lookup cannot be timed against an update")
    return text


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="source tree of build A (the base)")
    parser.add_argument("--b", default=ROOT, help="source tree of build B (default: this one)")
    parser.add_argument("--kernel", type=kernel_pair, default="forward",
                        help="one kernel for both builds, or A:B (see the module docstring)")
    parser.add_argument("--gradients", choices=["csr", "per-feature"], default="csr",
                        help="the updates' gradients: one buffer in the CSR's order, or one per "
                             "feature as TPUEmbeddingV2.apply_gradients passes them with one replica")
    parser.add_argument("--calls", type=int, default=300, help="rounds (one call of each build)")
    parser.add_argument("--repeats", type=int, default=2, help="runs, each a fresh process")
    parser.add_argument("--workload", choices=["criteo", "synthetic"], default="criteo",
                        help="criteo: the CSR buffers TPUEmbeddingV2 builds for one batch of the "
                             "26-table workload (vocabularies capped at 4M), every stacked table; "
                             "synthetic: one stacked table drawn in C++ (no TensorFlow needed)")
    return parser.parse_args()


def dump_criteo_csrs(path, batch=4096, dim=32, cap=4_000_000):
    """Writes the stacked tables' CSR buffers of one workload batch, as the class builds them, for
    kernel_ab_main: int64 table count, then per table int64 S, minibatches, input_size,
    table_rows, dim, row pointer count, id count, the int32 row pointers, sample ids and token
    ids and float gains, then an int64 count and each feature's samples per SparseCore, in
    feature order (count 0 when the table cannot be read feature-major), then an int64 count and
    each member table's first row in a shard and its shard rotation (what the 16-bit update's
    rounding bits need to find a row's logical row)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from bench_class_overhead import ClassKernelsAlone, class_functions  # pylint: disable=import-outside-toplevel
    from common import ragged_features  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.collectives import replica_group as collectives  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.preprocessing import enqueue
    from tf_sc_embedding.exchanges import all_gather as sharded_lookup  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.data import CriteoLikeWorkload  # pylint: disable=import-outside-toplevel
    vocab = [min(v, cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    data = CriteoLikeWorkload(vocabulary_sizes=vocab).batch(batch)
    ids, weights = ragged_features(data)
    gradients = {f"f{i}": tf.zeros([batch, dim]) for i in range(len(vocab))}
    embedding = class_functions(vocab, dim, batch, "sum")[0]
    # The class's feature order is tf.nest's (sorted names), as in bench_kernels.
    kernels = ClassKernelsAlone(embedding, tf.nest.flatten(ids), tf.nest.flatten(weights),
                                gradients)
    layout, view = kernels.layout, collectives.ReplicaView(embedding.replica_group)
    with open(path, "wb") as out:
        out.write(np.int64(len(layout.stacked_tables)).tobytes())
        for name, stacked in layout.stacked_tables.items():
            csr = kernels.preprocessed[name].csr
            arrays = [csr.row_pointers.numpy().astype(np.int32),
                      csr.sorted_sample_ids.numpy().astype(np.int32),
                      csr.sorted_token_ids.numpy().astype(np.int32),
                      csr.sorted_gains.numpy().astype(np.float32)]
            header = [layout.sparse_cores_per_replica, int(csr.num_minibatches.numpy()),
                      stacked.sample_count, stacked.total_rows, stacked.padded_width,
                      arrays[0].size, arrays[1].size]
            out.write(np.asarray(header, np.int64).tobytes())
            for array in arrays:
                out.write(array.tobytes())
            feature_rows = enqueue.feature_major_rows(layout, stacked) or []
            out.write(np.asarray([len(feature_rows), *feature_rows], np.int64).tobytes())
            members = [(t.layout.sparse_core_shard_row_offset, t.layout.sparse_core_shard_rotation)
                       for t in stacked.tables]
            out.write(np.asarray([len(members), *np.ravel(members)], np.int64).tobytes())


def core_sources(tree):
    core = os.path.join(tree, "cc", "core")
    return sorted(os.path.join(core, f) for f in os.listdir(core) if f.endswith(".cc"))


def build_library(tree, out):
    """cc/core of `tree` and this tree's kernel_ab_build.cc, as one shared library."""
    subprocess.run(["g++", *FLAGS, "-fPIC", "-shared", f"-I{tree}",
                    os.path.join(HERE, "kernel_ab_build.cc"), *core_sources(tree), "-o", out,
                    "-lpthread"], check=True)


def run_harness(command):
    """Runs a C++ harness, prints what it prints, and exits with its status when it fails."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        sys.exit(result.returncode)


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        libraries = [os.path.join(tmp, "a.so"), os.path.join(tmp, "b.so")]
        for tree, out in zip([args.a, args.b], libraries):
            build_library(os.path.abspath(tree), out)
        runner = os.path.join(tmp, "kernel_ab_main")
        # The runner validates its synthetic CSR with this tree's core (the libraries keep their
        # own copies hidden, so each build runs its own code).
        subprocess.run(["g++", "-std=c++17", "-O2", f"-I{ROOT}",
                        os.path.join(HERE, "kernel_ab_main.cc"), *core_sources(ROOT), "-o", runner,
                        "-ldl", "-lpthread"], check=True)
        workload = []
        if args.workload == "criteo":
            workload = [os.path.join(tmp, "criteo.csr")]
            dump_criteo_csrs(workload[0])
        print(f"A = {os.path.abspath(args.a)}\nB = {os.path.abspath(args.b)}")
        for _ in range(args.repeats):
            run_harness([runner, *libraries, args.kernel, str(args.calls), args.gradients,
                         *workload])


if __name__ == "__main__":
    main()
