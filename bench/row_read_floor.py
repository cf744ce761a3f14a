"""The floor under the forward lookup with 16-bit rows (issue 33, item 5): how much faster than
float32 rows a lookup of bfloat16 rows can be on this machine, measured on the class's CSR of one
batch of the 26-table workload (vocabularies capped at 4M, dim 32, batch 4096).

Builds bench/row_read_floor_main.cc with cc/core (the library's compiler flags, as
bench/kernel_ab.py builds its libraries) and runs it on the CSR that kernel_ab.py's
dump_criteo_csrs writes. Per round, each with float32 and with bfloat16 rows: the library's
lookup; the same sums on entries grouped by sample beforehand (the lookup without its
dtype-independent grouping; same bits, checked); only the reads of the rows' cache lines; and the
last two with rows drawn uniformly from the whole table (reads that miss the caches). It prints
medians and float32 / bfloat16 ratios (above 1: bfloat16 faster). row_read_floor_main.cc says
what each line measures.

Usage: python bench/row_read_floor.py [--rounds 100] [--threads 1 2]
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from kernel_ab import FLAGS, core_sources, dump_criteo_csrs, run_harness  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="thread counts, each a run (the class runs the lookup on 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runner = os.path.join(tmp, "row_read_floor_main")
        subprocess.run(["g++", *FLAGS, f"-I{ROOT}", os.path.join(HERE, "row_read_floor_main.cc"),
                        *core_sources(ROOT), "-o", runner, "-lpthread"], check=True)
        dump = os.path.join(tmp, "criteo.csr")
        dump_criteo_csrs(dump)
        for threads in args.threads:
            run_harness([runner, dump, str(args.rounds), str(threads)])


if __name__ == "__main__":
    main()
