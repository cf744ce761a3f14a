"""MultiWorkerMirroredStrategy with real worker processes on 127.0.0.1 (tests/multiworker): the
slow suite's cluster tests (test_two_workers.py is the default run's smoke test).

Each test compares the logical tables and slots each worker reads (a collective read) with a
single-process MirroredStrategy run over the same number of replicas (cluster.py).
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.multiworker.cluster import (RTOL, ATOL, WORKER, _env, assert_dynamic_states_equal,
                                       assert_tables_close, check_ok, dynamic_state, free_ports,
                                       kill_one_of_two_mid_training, run_cluster, table_digests,
                                       tables, wait_all)
from tf_sc_embedding.tables.dynamic_tables import value_part

# Under pytest-xdist (scripts/test.sh) these tests run one after another on one pytest worker:
# each starts a cluster of its own, and their free ports are picked before the servers bind them.
pytestmark = [pytest.mark.xdist_group("multiworker"), pytest.mark.slow]


def test_replicated_table_over_workers_trains_like_sharded(tmp_path, single_runs):
    """'small' held whole by each of 2 workers (sparse allreduce) + 'big' sharded: the same
    numbers as all tables sharded in one process."""
    out, codes = run_cluster(tmp_path, "cluster", 2, ["--replicate", "small"])
    check_ok(out, codes)
    reference = tables(single_runs(2))
    for i in range(2):
        mine = tables(out, i)
        assert_tables_close(mine, reference)
        held = {k: int(v) for k, v in mine.items() if k.startswith("shard_rows/")}
        # The replicated table's variable holds all of its (padded) rows on each worker.
        assert held[f"shard_rows/small/parameters/replica_{i}:0"] >= 37, held


def test_row_wise_adagrad_over_workers_trains_like_one_process(tmp_path, single_runs):
    """Row-wise Adagrad over 2 workers, 'big' sharded and 'small' replicated: tables and the
    [vocabulary_size, 1] accumulators (read across workers) as in one process."""
    extra = ["--optimizer", "row_wise_adagrad"]
    out, codes = run_cluster(tmp_path, "cluster", 2, extra + ["--replicate", "small"])
    check_ok(out, codes)
    reference = tables(single_runs(2, extra))
    assert reference["big/accumulators"].shape == (1000, 1)
    for i in range(2):
        assert_tables_close(tables(out, i), reference)


def test_bfloat16_tables_over_workers_equal_one_process_bit_for_bit(tmp_path, single_runs):
    """16-bit rows round with bits of (table, logical row, column, step): 2 workers (one table
    replicated) give the bfloat16 tables of one process with 2 replicas (every table sharded)
    exactly."""
    extra = ["--table-dtype", "bfloat16"]
    out, codes = run_cluster(tmp_path, "cluster", 2, extra + ["--replicate", "small"])
    check_ok(out, codes)
    reference = tables(single_runs(2, extra))
    for i in range(2):
        mine = tables(out, i)
        for key in ("big/parameters", "small/parameters"):
            np.testing.assert_array_equal(mine[key], reference[key], err_msg=key)


def test_16_bit_wire_over_workers_equals_one_process_bit_for_bit(tmp_path, single_runs):
    """wire_precision="16bit" rounds to nearest even at the sender: 2 workers hold the bits of one
    process with 2 replicas, which differ from the float32 wire's."""
    extra = ["--exchange", "all_to_all", "--wire-precision", "16bit"]
    out, codes = run_cluster(tmp_path, "cluster", 2, extra)
    check_ok(out, codes)
    reference = table_digests(tables(single_runs(2, extra)))
    assert reference != table_digests(tables(single_runs(2, ["--exchange", "all_to_all"])))
    for i in range(2):
        assert table_digests(tables(out, i)) == reference, f"worker {i}"


def test_all_gather_exchange_over_workers_trains_like_all_to_all(tmp_path, single_runs):
    """exchange="all_gather" (what "auto" picks when SparseCore limits are set) over 2 worker
    processes: the tables of one process's all-to-all run, up to the order of float32 sums."""
    out, codes = run_cluster(tmp_path, "cluster", 2, ["--exchange", "all_gather"])
    check_ok(out, codes)
    reference = tables(single_runs(2))
    for i in range(2):
        assert_tables_close(tables(out, i), reference)


@pytest.mark.parametrize("replicate", ["", "small"],
                         ids=["sharded", "replicated"])
def test_pipelined_workers_train_like_one_pipelined_process(tmp_path, replicate, single_runs):
    """Pipelining over 2 workers (each keeps its own replica's update; reading the tables at the
    end applies it) gives the tables of one pipelined process with 2 replicas, which differ
    from sequential training's."""
    extra = ["--pipelining", "--replicate", replicate]
    out, codes = run_cluster(tmp_path, "cluster", 2, extra)
    check_ok(out, codes)
    reference = tables(single_runs(2, extra))
    sequential = tables(single_runs(2, ["--replicate", replicate]))
    for i in range(2):
        assert_tables_close(tables(out, i), reference)
    assert any(not np.allclose(reference[k], sequential[k], rtol=RTOL, atol=ATOL)
               for k in reference if not k.startswith("shard_rows/"))


@pytest.mark.parametrize("extra", [(), ("--dynamic",)],
                         ids=["fixed", "dynamic"])
def test_prefetching_workers_train_bit_for_bit_like_pipelined_workers(tmp_path, extra):
    """Two workers whose steps prefetch the next batch's lookup (next_features) end with the
    tables of two pipelined workers that do not, bit for bit. With an open vocabulary its whole
    logical state too: the last step's prefetch, never consumed, counted nothing."""
    out, codes = run_cluster(tmp_path, "prefetching", 2,
                             ["--pipelining", "--prefetch", *extra])
    check_ok(out, codes)
    plain, codes = run_cluster(tmp_path, "pipelined", 2, ["--pipelining", *extra])
    check_ok(plain, codes)
    for i in range(2):
        want = tables(plain, i)
        for k, value in tables(out, i).items():
            np.testing.assert_array_equal(value, want[k], err_msg=f"worker {i}: {k}")
        if extra:
            assert_dynamic_states_equal(dynamic_state(out, i), dynamic_state(plain, i))


@pytest.mark.parametrize("replicate", ["", "small"],
                         ids=["sharded", "replicated"])
def test_non_finite_gradient_on_one_worker_fails_the_step_everywhere_and_writes_nothing(
        tmp_path, replicate, single_runs):
    """Worker 1's gradient of feature 'c' is NaN at step 1: both workers fail that step naming
    the feature, no table changes anywhere, and steps 0 and 2 give the tables of a run without
    step 1."""
    common = ["--steps", "3", "--replicate", replicate]
    out, codes = run_cluster(tmp_path, "cluster", 2,
                             common + ["--nan-step", "1", "--nan-replica", "1"])
    check_ok(out, codes)
    reference = tables(single_runs(2, ["--steps", "3", "--skip-step", "1"]))
    for i in range(2):
        errors = json.loads((out / f"errors_{i}.json").read_text())
        assert len(errors) == 1 and "feature 'c' (table 'small')" in errors[0], errors
        assert_tables_close(tables(out, i), reference)


def test_online_limits_are_agreed_over_workers_and_logged(tmp_path):
    """Limits start at 1 and each worker measures only its own batches: the adapted limits are
    the maxima over both workers, identical on both, and each worker logs its raises, the last
    one of each limit naming its final value."""
    out, codes = run_cluster(tmp_path, "cluster", 2, ["--steps", "3", "--adapt-limits"])
    check_ok(out, codes)
    reports = [json.loads((out / f"stats_{i}.json").read_text()) for i in range(2)]
    limits = reports[0]["limits"]
    assert limits == reports[1]["limits"] and set(limits) == {"big", "small"}
    for table, values in limits.items():
        for key, value in values.items():
            assert value == max(1, *(r["stats"][table][key] for r in reports)), (table, key)
    for i in range(2):
        log = (out / f"log_{i}.txt").read_text()
        last = {}
        for m in re.finditer(r"table '(\w+)': (\w+) raised online from (\d+) to (\d+)", log):
            last[(m.group(1), m.group(2))] = int(m.group(4))
        assert last == {(t, k): v for t, values in limits.items() for k, v in values.items()
                        if v > 1}, log[-3000:]
        assert last, log[-3000:]


def test_checkpoint_from_two_workers_restores_anywhere(tmp_path, single_runs,
                                                     saved_by_two_workers):
    # 2 workers train 2 steps and save (chief's path is the real one) ...
    first, path = saved_by_two_workers()
    # ... the uninterrupted reference trains 4 steps on 2 replicas in one process ...
    uninterrupted = tables(single_runs(2, ["--steps", "4"]))
    after_two = tables(single_runs(2, ["--steps", "2"]))
    assert_tables_close(tables(first, 0), after_two)
    # ... restoring into one process (before build) and continuing gives the same tables ...
    resumed = single_runs(2, ["--restore", path, "--steps", "2",
                                                    "--first-step", "2"])
    assert_tables_close(tables(resumed), uninterrupted)
    # ... and so does restoring into 2 workers after build (each reads only its rows).
    out, codes = run_cluster(tmp_path, "resumed_2", 2, ["--restore", path, "--restore-after-build",
                                                        "--steps", "2", "--first-step", "2"])
    check_ok(out, codes)
    for i in range(2):
        assert_tables_close(tables(out, i), uninterrupted)


def test_checkpoint_from_two_workers_restores_into_four(tmp_path, single_runs,
                                                       saved_by_two_workers):
    first, path = saved_by_two_workers()
    out, codes = run_cluster(tmp_path, "four", 4, ["--restore", path, "--steps", "0"])
    check_ok(out, codes)
    for i in range(4):
        assert_tables_close(tables(out, i), tables(first, 0))
    # Training continues on 4 workers like one process of 4 replicas restored from the same file.
    resumed = ["--restore", path, "--steps", "2", "--first-step", "2"]
    out, codes = run_cluster(tmp_path, "four_resumed", 4, resumed)
    check_ok(out, codes)
    reference = tables(single_runs(4, resumed))
    assert any(not np.allclose(reference[k], tables(first, 0)[k]) for k in reference
               if not k.startswith("shard_rows/"))                  # the two steps changed it
    for i in range(4):
        assert_tables_close(tables(out, i), reference)


def test_dynamic_table_over_workers_is_one_process_table_and_restores_anywhere(tmp_path,
                                                                              single_runs):
    """An open vocabulary over 2 workers: each worker's maps hold the keys it owns, and every
    worker reads the whole logical state (and counters), bit for bit that of one process with 2
    replicas; the chief's checkpoint restores into one process or 2 workers and training goes on
    exactly like an uninterrupted run."""
    dynamic = ["--dynamic", "--exchange", "all_to_all"]
    first, codes = run_cluster(tmp_path, "first", 2,
                               dynamic + ["--steps", "2", "--save", str(tmp_path / "ckpt" / "c")])
    check_ok(first, codes)
    path = (first / "checkpoint_path").read_text()
    single = single_runs(2, dynamic + ["--steps", "2"])
    assert len(dynamic_state(single)["keys"]) > 0
    for i in range(2):
        assert_dynamic_states_equal(dynamic_state(first, i), dynamic_state(single))
        assert table_digests(tables(first, i)) == table_digests(tables(single))
    uninterrupted = single_runs(2, dynamic + ["--steps", "4"])
    resumed = ["--restore", path, "--steps", "2", "--first-step", "2"]
    one = single_runs(2, dynamic + resumed)
    assert_dynamic_states_equal(dynamic_state(one), dynamic_state(uninterrupted), False)
    out, codes = run_cluster(tmp_path, "resumed_two", 2,
                             dynamic + resumed + ["--restore-after-build"])
    check_ok(out, codes)
    for i in range(2):
        assert_dynamic_states_equal(dynamic_state(out, i), dynamic_state(uninterrupted), False)
        assert table_digests(tables(out, i)) == table_digests(tables(uninterrupted))


@pytest.mark.parametrize("pipelining", [(), ("--pipelining",)],
                         ids=["sequential", "pipelined"])
def test_dynamic_table_over_two_workers_equals_a_fixed_table_bit_for_bit(tmp_path, pipelining):
    """Identity with a fixed vocabulary over 2 workers: threshold 1, no eviction, as many rows
    as possible keys (the maps lend each other rows across workers) and one initial value for
    every row. The open vocabulary's keys are the fixed run's ids
    through an injective map (id * 1000003 - 17, mw_worker.py), so each key's values and slots
    must equal, bit for bit, the fixed table's row of its id, and the other table is untouched
    by the difference (both runs pipelined, or neither)."""
    common = ["--exchange", "all_to_all", "--steps", "3", *pipelining]
    dynamic, codes = run_cluster(tmp_path, "dynamic", 2, common + ["--dynamic", "--identity"])
    check_ok(dynamic, codes)
    fixed, codes = run_cluster(tmp_path, "fixed", 2, common)
    check_ok(fixed, codes)
    for i in range(2):
        state, want = dynamic_state(dynamic, i), tables(fixed, i)
        keys = state["keys"]
        assert 0 < len(keys) <= 37 and state["unadmitted_ids"] == 0
        ids = (keys + 17) // 1000003
        np.testing.assert_array_equal(ids * 1000003 - 17, keys)
        kinds = [k.split("/", 1)[1] for k in want if k.startswith("small/")]
        assert len(kinds) == 2   # the values and Adagrad's accumulators
        for kind in kinds:
            np.testing.assert_array_equal(state[value_part(kind)], want[f"small/{kind}"][ids],
                                          err_msg=kind)
        got = tables(dynamic, i)
        for name in want:
            if name.startswith("big/"):
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("extra", [(), ("--dynamic",)],
                         ids=["fixed", "dynamic"])
def test_killed_worker_fails_the_others_and_a_restart_resumes(tmp_path, extra, single_runs,
                                                              saved_by_two_workers):
    extra = list(extra)
    _, path = saved_by_two_workers(extra)
    # Training resumes; worker 1 is killed mid-training; worker 0 must fail, not hang (on
    # TensorFlow's collectives; test_oneccl.py kills a worker on oneCCL).
    code, waited, survivor, _ = kill_one_of_two_mid_training(tmp_path / "killed", [
        "--restore", path, "--steps", "1000", "--first-step", "2", "--sleep-per-step", "0.05",
        "--timeout", "15", "--transport", "tensorflow"] + extra)
    assert code != 0 and waited < 90
    # ... with the error of a collective that lost its peer, not some unrelated failure.
    assert re.search(r"Collective ops is aborted|DeadlineExceeded|UnavailableError|"
                     r"Connection reset", survivor), survivor[-3000:]
    # Restarting both workers from the last checkpoint ends where an uninterrupted run ends.
    out, codes = run_cluster(tmp_path, "restarted", 2, extra + ["--restore", path, "--steps", "2",
                                                                "--first-step", "2"])
    check_ok(out, codes)
    single = single_runs(2, extra + ["--steps", "4"])
    for i in range(2):
        assert_tables_close(tables(out, i), tables(single))
        if extra:
            assert_dynamic_states_equal(dynamic_state(out, i), dynamic_state(single), False)


KERAS_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_mwms_worker.py")


def test_keras_fit_under_multi_worker_is_rejected_with_the_custom_loop_recipe(tmp_path):
    with open(tmp_path / "log.txt", "w") as log:
        process = subprocess.Popen([sys.executable, KERAS_WORKER, "--mode", "fit"], stdout=log,
                                   stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        codes = wait_all([process])
    text = (tmp_path / "log.txt").read_text()
    assert codes == [0] and "FIT_REJECTED" in text, text[-3000:]
    assert "custom training loop" in text


def test_keras_layer_custom_loop_under_two_workers_trains_complete_tables(tmp_path):
    """A table sharded over 2 workers, trained through the layer in a custom loop: both workers
    read the complete table, and the chief's Keras weight file restores it in one process."""
    ports = ",".join(str(p) for p in free_ports(2))
    logs = [open(tmp_path / f"log_{i}.txt", "w") for i in range(2)]
    processes = [subprocess.Popen([sys.executable, KERAS_WORKER, "--mode", "ctl", "--ports", ports,
                                   "--index", str(i), "--out", str(tmp_path)], stdout=logs[i],
                                  stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
                 for i in range(2)]
    codes = wait_all(processes)
    for log in logs:
        log.close()
    check_ok(tmp_path, codes)
    first = np.load(tmp_path / "keras_tables_0.npz")["t"]
    second = np.load(tmp_path / "keras_tables_1.npz")["t"]
    np.testing.assert_array_equal(first, second)
    rng = np.random.default_rng(0)
    touched = np.unique(rng.integers(0, 64, size=(16 * 4,)))
    # Rows looked up on either worker were trained (a splice would leave the other worker's rows
    # at their initial value 0.1); rows never looked up were not touched.
    assert np.all(np.abs(first[touched] - 0.1).max(axis=1) > 1e-4)
    untouched = np.setdiff1d(np.arange(64), touched)
    np.testing.assert_array_equal(first[untouched], np.full((len(untouched), 4), 0.1, np.float32))
    # The chief's Keras weight file holds the complete table: one process loads the same values.
    with open(tmp_path / "log_load.txt", "w") as log:
        codes = wait_all([subprocess.Popen(
            [sys.executable, KERAS_WORKER, "--mode", "load", "--out", str(tmp_path)], stdout=log,
            stderr=subprocess.STDOUT, env=_env(), start_new_session=True)])
    assert codes == [0], (tmp_path / "log_load.txt").read_text()[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "keras_loaded.npz")["t"], first)


def test_the_demo_trains_over_two_workers_and_resumes_from_the_chiefs_checkpoint(tmp_path):
    """examples/train_demo.py --workers (docs/multi_worker.md#launching): both workers train, the
    held-out loss falls, they agree on it, and a second run resumes from the chief's save."""
    demo = os.path.join(os.path.dirname(WORKER), "..", "..", "examples", "train_demo.py")

    def run(name):
        ports = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
        logs = [open(tmp_path / f"{name}_{i}.txt", "w") for i in range(2)]
        processes = [subprocess.Popen(
            [sys.executable, demo, "--workers", ports, "--task-index", str(i), "--steps", "30",
             "--batch", "512", "--checkpoint-dir", str(tmp_path / "ckpt")], stdout=logs[i],
            stderr=subprocess.STDOUT, env=_env(), start_new_session=True) for i in range(2)]
        codes = wait_all(processes)
        for log in logs:
            log.close()
        texts = [(tmp_path / f"{name}_{i}.txt").read_text() for i in range(2)]
        assert codes == [0, 0], texts[0][-3000:] + texts[1][-3000:]
        return texts

    first = run("first")
    losses = [[float(x) for x in re.findall(
        r"held-out (?:before training|after \d+ steps): log loss ([0-9.]+)", t)]
              for t in first]
    assert losses[0] == losses[1] and losses[0][1] < losses[0][0] - 0.005, losses
    assert re.search(r"held-out after 30 steps: log loss [0-9.]+, AUC 0\.[0-9]{4}", first[0])
    assert "2 replica(s)" in first[0] and "saved " in first[0]
    second = run("second")
    assert "restored " in second[0] and "restored " in second[1]
    resumed = float(re.search(r"held-out before training: log loss ([0-9.]+)", second[0])[1])
    assert abs(resumed - losses[0][1]) < 1e-6, (resumed, losses)
