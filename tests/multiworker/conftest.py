"""Fixtures shared by the multi-worker tests: reference runs and a saved checkpoint, each made
once per pytest process and reused by every test that needs the same one (the tests share one
xdist group, so one pytest process runs them all)."""
import pytest

from tests.multiworker.cluster import check_ok, run_cluster, run_single


@pytest.fixture(scope="session")
def single_runs(tmp_path_factory):
    """run(replicas, extra): the output folder of a one-process reference run, made once per
    pytest process and shared by every test that compares with the same run (a run is deterministic: the
    same arguments give the same bits). The tests share one xdist group, so one pytest process
    runs them all."""
    root = tmp_path_factory.mktemp("single_runs")
    done = {}

    def run(replicas, extra=()):
        key = (replicas, tuple(extra))
        if key not in done:
            done[key] = run_single(root, f"run_{len(done)}", replicas, extra)
        return done[key]
    return run


@pytest.fixture(scope="session")
def saved_by_two_workers(tmp_path_factory):
    """saved(extra): (output folder, checkpoint path) of 2 workers that trained 2 steps and
    saved (the chief's path is the real one), made once per pytest process for the tests that restore
    it; none of them writes to it."""
    done = {}

    def saved(extra=()):
        key = tuple(extra)
        if key not in done:
            root = tmp_path_factory.mktemp("saved")
            first, codes = run_cluster(root, "first", 2,
                                       list(extra) + ["--steps", "2", "--save",
                                                      str(root / "ckpt" / "c")])
            check_ok(first, codes)
            done[key] = first, (first / "checkpoint_path").read_text()
        return done[key]
    return saved
