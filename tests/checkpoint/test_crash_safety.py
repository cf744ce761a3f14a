"""A process killed (SIGKILL) while writing a checkpoint leaves the previous one restorable."""
import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = 1_200_000      # x 64 floats, parameters + Adagrad slot: ~600 MB written per checkpoint


@pytest.mark.slow   # writes about 600 MB
def test_kill_during_save_keeps_previous_checkpoint(tmp_path):
    directory = str(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "tests.checkpoint.worker", "crash", directory,
                              str(ROWS)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        for line in child.stdout:
            if line.startswith("SAVING"):
                break
        else:
            raise AssertionError(f"the worker exited before saving (code {child.wait()})")
        # Kill as soon as the second checkpoint's files start to appear.
        deadline = time.time() + 60
        while not glob.glob(os.path.join(directory, "ckpt-2*")) and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    leftovers = glob.glob(os.path.join(directory, "ckpt-2*"))
    assert leftovers, "the kill did not happen during the save"
    assert not os.path.exists(os.path.join(directory, "ckpt-2.index")), \
        "the save finished before the kill; the test did not exercise a partial write"

    # The previous checkpoint is the latest one and restores fully.
    E = tf.tpu.experimental.embedding
    table = E.TableConfig(vocabulary_size=ROWS, dim=64, name="big",
                          initializer=tf.zeros_initializer())
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.Adagrad(0.1))
    step = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(embedding=embedding, step=step),
                                         directory, max_to_keep=3)
    assert manager.latest_checkpoint.endswith("ckpt-1")
    status = manager.checkpoint.restore(manager.latest_checkpoint)
    embedding.build(per_replica_batch_size=8)
    status.assert_consumed()
    assert int(step.numpy()) == 1
    with np.load(os.path.join(directory, "state1.npz")) as expected:
        got = embedding.logical_tables(include_slots=True)["big"]
        np.testing.assert_array_equal(got["parameters"], expected["big/parameters"])
        np.testing.assert_array_equal(got["accumulators"], expected["big/accumulators"])
        del got

    # Saving again over the debris works, and numbering goes on.
    path = manager.save()
    assert path.endswith("ckpt-2")
    tf.train.Checkpoint(embedding=embedding, step=step).restore(path).assert_consumed()
