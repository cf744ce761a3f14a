"""Two worker processes on 127.0.0.1, in the default test run: the smoke test of the
multi-worker path (the rest of tests/multiworker runs with the slow tests). Several all-to-all
steps must give recorded bits, in one process and on every worker, and each worker must hold
only its own replica's shards."""
import json
import os

import pytest

from tf_sc_embedding.collectives import freed_memory

from tests.multiworker.cluster import check_ok, run_cluster, table_digests, tables

pytestmark = pytest.mark.xdist_group("multiworker")


# Every logical table and slot after EXCHANGE_STEPS steps of the all-to-all exchange, as a
# digest per array (table_digests), at 2 and 4 replicas: one process and every worker of a
# cluster hold exactly these bits. A change to the exchange (routing, packing, combining, the
# owner's update) that alters one bit of the tables fails the test. Recorded with the exchange of
# 4d09853; a change meant to alter the numbers must say why in its commit and record new ones.
EXCHANGE_STEPS = ["--steps", "6", "--exchange", "all_to_all"]
# TensorFlow's collectives here; tests/multiworker/test_oneccl.py checks oneCCL against the same
# digests.
TENSORFLOW_TRANSPORT = ["--transport", "tensorflow"]
EXCHANGE_DIGESTS = {
    2: {"big/accumulators": "1d9de5e4ae649ff9", "big/parameters": "50707157b8b90420",
        "small/accumulators": "a945144bf44c4ef8", "small/parameters": "782934bf2f2dd7d5"},
    4: {"big/accumulators": "e7c3532d28d9e80a", "big/parameters": "f0cc1e80fd4f664d",
        "small/accumulators": "9c30831d0e2f475e", "small/parameters": "b29bbf94d6714558"},
}


# What a worker of this environment sets (the user's variables or another C library: nothing).
EXPECTED_MALLOC = freed_memory.planned(os.environ, freed_memory.glibc_malloc())


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_the_exchange_keeps_every_bit_of_the_tables(tmp_path, workers, single_runs):
    """Several all-to-all steps give the recorded bits, in one process and over workers."""
    single = table_digests(tables(single_runs(workers, EXCHANGE_STEPS)))
    assert single == EXCHANGE_DIGESTS[workers]
    out, codes = run_cluster(tmp_path, "cluster", workers, EXCHANGE_STEPS + TENSORFLOW_TRANSPORT)
    check_ok(out, codes)
    full_rows = sum(int(v) for k, v in tables(single_runs(workers, EXCHANGE_STEPS)).items()
                    if k.startswith("shard_rows/") and "/parameters/" in k)
    for i in range(workers):
        mine = tables(out, i)
        assert table_digests(mine) == single, f"worker {i}"
        # Placement: each worker holds the variables of its own replica only (1/workers).
        held = {k: int(v) for k, v in mine.items() if k.startswith("shard_rows/")}
        assert all(f"replica_{i}:" in k for k in held), held
        assert sum(v for k, v in held.items() if "/parameters/" in k) * workers == full_rows
        # Joining the job fixed malloc's thresholds (collectives/freed_memory.py).
        malloc = json.loads((out / f"stats_{i}.json").read_text())["malloc"]
        assert malloc == EXPECTED_MALLOC, malloc
