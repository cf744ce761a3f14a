"""The op-level fuzzer (fuzz/op_fuzzer.py) runs cases through TensorFlow in child processes and
records deaths and hangs: a short clean run finds nothing, and injected aborts / hangs are recorded
with the case and the signal, and the run continues with the next case."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZER = os.path.join(ROOT, "fuzz", "op_fuzzer.py")


def _fuzz(tmp_path, *args, selftest=None, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if selftest:
        env["SCE_OP_FUZZ_SELFTEST"] = selftest
    crash_dir = tmp_path / "crashes"
    proc = subprocess.run([sys.executable, FUZZER, "--crash-dir", str(crash_dir), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    summary = json.loads((crash_dir / "summary.json").read_text())
    return proc, summary, crash_dir


@pytest.mark.slow   # scripts/sanitize_and_fuzz.sh runs a campaign in CI as well
def test_short_campaign_has_no_crashes(tmp_path):
    proc, summary, _ = _fuzz(tmp_path, "--cases", "60", "--seed", "11")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["cases"] == 60 and summary["crashes"] == 0, summary
    assert summary["outcomes"].get("ok", 0) > 0 and summary["outcomes"].get("InvalidArgumentError")


@pytest.mark.slow
def test_abort_and_hang_are_recorded_and_the_run_continues(tmp_path):
    proc, summary, crash_dir = _fuzz(tmp_path, "--cases", "6", "--seed", "3", "--timeout", "5",
                                     selftest="abort:2")
    assert proc.returncode == 1
    assert summary["cases"] == 6 and summary["crashes"] == 1, summary
    record = json.loads((crash_dir / "crash-seed3-case2.json").read_text())
    assert record["kind"] == "death" and record["signal"] == "SIGABRT"
    assert record["case"]["op"] and "--replay 2" in record["replay"]

    proc, summary, crash_dir = _fuzz(tmp_path, "--cases", "4", "--seed", "3", "--timeout", "5",
                                     selftest="hang:1")
    assert proc.returncode == 1
    assert summary["cases"] == 4 and summary["crashes"] == 1, summary
    assert json.loads((crash_dir / "crash-seed3-case1.json").read_text())["kind"] == "hang"
