"""Delta exports over MultiWorkerMirroredStrategy workers (docs/deltas.md): each worker writes
the part of the rows and keys it holds; a checkpoint plus those deltas recovers, in one process
or on two workers, exactly the checkpoint saved after the last delta, and a serving model
exported before them answers, once they are applied, as the one exported after."""
import numpy as np
import pytest
import tensorflow as tf

from tests.multiworker.cluster import (assert_dynamic_states_equal, check_ok, dynamic_state,
                                       run_cluster, run_single, tables)
from tf_sc_embedding.deltas import delta_format as fmt

pytestmark = [pytest.mark.xdist_group("multiworker"), pytest.mark.slow]


def test_two_workers_write_one_delta_in_parts_that_recover_anywhere(tmp_path):
    common = ["--dynamic"]
    out, codes = run_cluster(tmp_path, "train", 2, common + [
        "--steps", "6", "--checkpoint-at", "1", "--serving-at", "1", "--delta-at", "3,5",
        "--save", str(tmp_path / "train" / "late" / "ckpt")])
    check_ok(out, codes)
    deltas = fmt.list_deltas(out / "deltas")
    assert [s for s, _, _ in deltas] == [1, 2]
    for _, _, path in deltas:
        parts = fmt.read_delta(path)
        assert [p.manifest["part"] for p in parts] == [0, 1]
        # Each worker sent only the rows it stores: the parts' ids do not overlap.
        ids = [fmt.decode_ids(p.array("big.ids.npy", np.uint8, (-1,)),
                              p.manifest["tables"]["big"]["count"]) for p in parts]
        assert len(ids[0]) and len(ids[1]) and not set(ids[0]) & set(ids[1])
    early = (out / "early_path").read_text()
    late = (out / "checkpoint_path").read_text()
    reference = run_single(tmp_path, "reference", 1, common + ["--restore", late, "--steps", "0"])
    recover = common + ["--restore", early, "--apply-deltas", str(out / "deltas"),
                        "--steps", "0"]
    one = run_single(tmp_path, "one_process", 1, recover)
    two, codes = run_cluster(tmp_path, "two_workers", 2, recover)
    check_ok(two, codes)
    want = {k: v for k, v in tables(reference).items() if not k.startswith("shard_rows/")}
    for got in (tables(one), tables(two, 0), tables(two, 1)):
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    for state in (dynamic_state(one), dynamic_state(two, 0), dynamic_state(two, 1)):
        assert_dynamic_states_equal(state, dynamic_state(reference), counters=False)

    # The serving model exported after step 1 takes both deltas, parts and all, and then answers
    # as the one exported at the end.
    live = tf.saved_model.load(str(out / "serving_early"))
    for _, _, path in deltas:
        live.apply_delta(path)
    final = tf.saved_model.load(str(out / "serving_late"))
    ids = tf.constant(np.arange(-40, 1000, dtype=np.int64) % 1000)
    keys = tf.constant(np.arange(0, 40, dtype=np.int64) * 1000003 - 17)   # mw_worker's keys
    splits = tf.constant([0, 500, 1040], tf.int64)
    inputs = {"a_ids": ids, "a_row_splits": splits, "b_ids": ids[::-1], "b_row_splits": splits,
              "c_ids": keys, "c_row_splits": tf.constant([0, 20, 40], tf.int64)}
    want = final.signatures["serving_default"](**inputs)
    got = live.signatures["serving_default"](**inputs)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
