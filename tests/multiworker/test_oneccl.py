"""The oneCCL transport over real worker processes on 127.0.0.1 (skipped without the extra).

oneCCL and TensorFlow's collectives only move bytes, so with a float32 wire (and with the 16-bit
wire, whose rounding happens before the transport) every worker must end with exactly the bits
TensorFlow's collectives give: the recorded digests of test_two_workers.py, or a run with
`--transport tensorflow`. A killed worker must fail the survivor within seconds, with an error
naming the transport and the peer, and a restart from the checkpoint must continue exactly.
"""
import re

import pytest

from tf_sc_embedding.collectives import shared_memory

from tests.multiworker.cluster import (assert_dynamic_states_equal, assert_tables_close,
                                       check_ok, dynamic_state, kill_one_of_two_mid_training,
                                       run_cluster, table_digests, tables)
from tests.multiworker.test_two_workers import EXCHANGE_DIGESTS, EXCHANGE_STEPS

pytestmark = [pytest.mark.oneccl, pytest.mark.xdist_group("multiworker")]
ONECCL = ["--transport", "oneccl"]


@pytest.mark.parametrize("workers", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_oneccl_gives_the_recorded_bits_of_tensorflows_collectives(tmp_path, workers):
    before = set(shared_memory.stale_regions())
    out, codes = run_cluster(tmp_path, "oneccl", workers, EXCHANGE_STEPS + ONECCL)
    check_ok(out, codes)
    for i in range(workers):
        assert table_digests(tables(out, i)) == EXCHANGE_DIGESTS[workers], f"worker {i}"
    # The workers removed their shared-memory regions at exit (shared_memory.py).
    assert set(shared_memory.stale_regions()) - before == set()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["--dynamic"],
    ["--wire-precision", "16bit", "--pipelining", "--prefetch", "--dense-allreduce"],
    ["--exchange", "all_gather", "--replicate", "small"],
], ids=["dynamic", "16bit_pipelined_prefetch_dense_allreduce", "all_gather_replicated"])
def test_oneccl_and_tensorflow_give_the_same_bits(tmp_path, extra):
    """Open vocabularies; the 16-bit wire with pipelining, prefetching and a dense all-reduce of
    TensorFlow's in the same step (no deadlock between the transports); the all-gather exchange
    (its all-sums) and replicated tables."""
    runs = {}
    for transport in ("tensorflow", "oneccl"):
        out, codes = run_cluster(tmp_path, transport, 2,
                                 extra + ["--steps", "5", "--transport", transport])
        check_ok(out, codes)
        runs[transport] = out
    for i in range(2):
        assert table_digests(tables(runs["oneccl"], i)) == \
            table_digests(tables(runs["tensorflow"], i)), f"worker {i}"
        if "--dynamic" in extra:
            assert_dynamic_states_equal(dynamic_state(runs["oneccl"], i),
                                        dynamic_state(runs["tensorflow"], i))


@pytest.mark.slow
def test_a_killed_worker_fails_the_survivor_naming_the_peer_and_a_restart_resumes(
        tmp_path, saved_by_two_workers, single_runs):
    _, path = saved_by_two_workers(ONECCL)
    # The default collective timeout (60 s): the peer probe must fail the step long before it.
    code, waited, survivor, ports = kill_one_of_two_mid_training(tmp_path / "killed", [
        "--restore", path, "--steps", "1000", "--first-step", "2", "--sleep-per-step", "0.05",
        "--timeout", "60"] + ONECCL, wait=50)
    assert code != 0
    assert re.search(rf"oneCCL transport: .*peer rank 1 \(127\.0\.0\.1:{ports[1]}\) "
                     r"stopped answering", survivor), survivor[-3000:]
    assert waited < 30, f"the survivor failed after {waited:.0f} s"
    # The killed worker could not remove its shared-memory region; the next job does.
    left = set(shared_memory.stale_regions())
    assert left, "the killed worker left no shared-memory region (is the test on shm?)"
    out, codes = run_cluster(tmp_path, "restarted", 2, ONECCL + ["--restore", path, "--steps", "2",
                                                                "--first-step", "2"])
    check_ok(out, codes)
    assert not left & set(shared_memory.stale_regions()), "the restarted job left them"
    single = single_runs(2, ["--steps", "4"])
    for i in range(2):
        assert_tables_close(tables(out, i), tables(single))


@pytest.mark.slow
def test_a_failed_initialization_is_an_error_on_every_worker(tmp_path, monkeypatch):
    """libfabric cannot start (an unknown provider, set by the user): forming the communicator
    fails on both workers with an error naming the transport, instead of hanging."""
    monkeypatch.setenv("FI_PROVIDER", "no_such_provider")
    out, codes = run_cluster(tmp_path, "broken", 2, ONECCL + ["--steps", "2"], timeout=120)
    for i in range(2):
        log = (out / f"log_{i}.txt").read_text()
        assert codes[i] != 0, log[-3000:]
        assert re.search(rf"oneCCL transport: communicator '\S+' of 2 ranks \(this is rank {i}\) "
                         r"could not form", log), log[-3000:]
