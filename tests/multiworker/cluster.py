"""Running real TensorFlow worker processes on 127.0.0.1 for tests/multiworker, and reading what
they wrote.

Every process gets free loopback ports and a timeout: `wait_all` kills every process left when
it expires, so a test never hangs. `run_cluster` starts a MultiWorkerMirroredStrategy cluster of
mw_worker.py processes, `run_single` one process over the same number of replicas, whose tables
the parity suite (tests/api) checks against the numpy reference.
"""
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mw_worker.py")
PROCESS_TIMEOUT = 240
RTOL, ATOL = 1e-5, 1e-6


def free_ports(n):
    sockets = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _env():
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    env.pop("TF_CONFIG", None)
    return env


def start(args, log):
    return subprocess.Popen([sys.executable, WORKER] + args, stdout=log, stderr=subprocess.STDOUT,
                            env=_env(), start_new_session=True)


def wait_all(processes, timeout=PROCESS_TIMEOUT):
    """Return codes of every process; kills them all (and fails) if any outlives the timeout."""
    deadline = time.monotonic() + timeout
    codes = []
    try:
        for p in processes:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a worker did not finish within {timeout} s")
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return codes


def run_cluster(tmp_path, name, workers, extra=(), timeout=PROCESS_TIMEOUT):
    out = tmp_path / name
    out.mkdir()
    ports = ",".join(str(p) for p in free_ports(workers))
    logs = [open(out / f"log_{i}.txt", "w") for i in range(workers)]
    processes = [start(["--workers", str(workers), "--index", str(i), "--ports", ports,
                        "--out", str(out)] + list(extra), logs[i]) for i in range(workers)]
    codes = wait_all(processes, timeout)
    for log in logs:
        log.close()
    return out, codes


def run_single(tmp_path, name, replicas, extra=()):
    out = tmp_path / name
    out.mkdir()
    with open(out / "log_0.txt", "w") as log:
        codes = wait_all([start(["--replicas", str(replicas), "--out", str(out)] + list(extra),
                                log)])
    assert codes == [0], (out / "log_0.txt").read_text()[-3000:]
    return out


def tables(out, index=0):
    with np.load(out / f"tables_{index}.npz") as data:
        return {k: data[k] for k in data.files}


def assert_tables_close(actual, expected):
    keys = [k for k in expected if not k.startswith("shard_rows/")]
    assert keys and set(keys) <= set(actual)
    for k in keys:
        np.testing.assert_allclose(actual[k], expected[k], rtol=RTOL, atol=ATOL, err_msg=k)


def check_ok(out, codes):
    for i, code in enumerate(codes):
        assert code == 0, (out / f"log_{i}.txt").read_text()[-3000:]


def table_digests(arrays):
    """{name: the first 16 hex digits of the sha256 of its dtype, shape and bytes}."""
    digests = {}
    for name, value in sorted(arrays.items()):
        if name.startswith("shard_rows/"):
            continue
        value = np.ascontiguousarray(value)
        header = f"{value.dtype.str}{value.shape}".encode()
        digests[name] = hashlib.sha256(header + value.tobytes()).hexdigest()[:16]
    return digests


def dynamic_state(out, index=0):
    """The logical state of the open-vocabulary table 'small' (mw_worker.py --dynamic)."""
    with np.load(out / f"dynamic_{index}.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def assert_dynamic_states_equal(actual, expected, counters=True):
    """counters=False for a run restored from a checkpoint: the counters count the occurrences
    since the embedding was made (they are not part of the logical state)."""
    assert set(actual) == set(expected)
    for part in expected:
        if counters or part != "unadmitted_ids":
            np.testing.assert_array_equal(actual[part], expected[part], err_msg=part)


def kill_one_of_two_mid_training(out, args, wait=90):
    """Starts 2 workers (mw_worker.py `args`, which train long), kills worker 1 once both train,
    and waits at most `wait` s for worker 0 to end. Returns (worker 0's exit code, seconds it took
    after the kill, what it logged after the kill, the two ports); every process is gone after."""
    out.mkdir()
    ports = free_ports(2)
    logs = [open(out / f"log_{i}.txt", "w") for i in range(2)]
    common = ["--workers", "2", "--ports", ",".join(map(str, ports)), "--out", str(out)]
    processes = [start(common + ["--index", str(i)] + list(args), logs[i]) for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "log_1.txt").read_text().count("step"):
            if any(p.poll() is not None for p in processes):
                break
            time.sleep(0.5)
        time.sleep(3)
        logged_before_kill = len((out / "log_0.txt").read_text())
        os.killpg(processes[1].pid, signal.SIGKILL)
        started = time.monotonic()
        code = processes[0].wait(timeout=wait)
        return (code, time.monotonic() - started,
                (out / "log_0.txt").read_text()[logged_before_kill:], ports)
    finally:
        for p in processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
