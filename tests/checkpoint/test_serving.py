"""Serving export: stock-op SavedModel loaded in a process without tf_sc_embedding."""
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.checkpoint import ckpt_lib
from tests.devices import require_replicas
from tf_sc_embedding import serving

HERE = os.path.dirname(os.path.abspath(__file__))


def test_serving_export_matches_training_activations_without_the_op_library(tmp_path):
    require_replicas(2)
    strategy, embedding = ckpt_lib.make_embedding(2, True)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    trainer.run(range(3))
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir)

    # Training-time activations of the next batch (computed from the tables before its update).
    ids, weights = ckpt_lib.global_batch(3)
    expected_weighted = trainer.run([3])
    inputs = {}
    for feature in ckpt_lib.FEATURES:
        inputs[f"{feature}_ids"] = ids[feature].values.numpy()
        inputs[f"{feature}_row_splits"] = ids[feature].row_splits.numpy()
        inputs[f"{feature}_weights"] = weights[feature].values.numpy()
    assert any(np.diff(inputs["f_user_row_splits"]) == 0), "want an empty sample in the batch"
    np.savez(tmp_path / "inputs.npz", **inputs)
    out_path = str(tmp_path / "out.npz")
    code = ("import sys, runpy; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    subprocess.run([sys.executable, "-c", code, os.path.join(HERE, "serving_worker.py"),
                    export_dir, str(tmp_path / "inputs.npz"), out_path], check=True, timeout=300,
                   cwd=str(tmp_path), env={k: v for k, v in os.environ.items()
                                           if k != "PYTHONPATH"})
    with np.load(out_path) as f:
        out = {k: f[k] for k in f.files}
    op_types = set(out["op_types"].tolist())
    assert not {op for op in op_types if op.startswith("Sce")}, op_types
    assert {"ResourceGather", "UnsortedSegmentSum"} & op_types
    for feature in ckpt_lib.FEATURES:
        np.testing.assert_allclose(out[f"weighted/{feature}"], expected_weighted[feature],
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[f"function/{feature}"], expected_weighted[feature],
                                   rtol=1e-5, atol=1e-6)
    # Unweighted signature against the stock-op lookup of the logical tables (the lookup the
    # library itself would do is covered by the weighted comparison above).
    # Tables in the SavedModel are the logical tables at export time.
    for feature, table in ckpt_lib.FEATURES.items():
        assert out[f"table/{table}"].shape == (ckpt_lib.VOCAB[table], ckpt_lib.DIM[table])
        rows = tf.RaggedTensor.from_row_splits(inputs[f"{feature}_ids"],
                                               inputs[f"{feature}_row_splits"])
        lookup = tf.gather(out[f"table/{table}"], rows)
        reduce = {"sum": tf.reduce_sum, "mean": tf.reduce_mean,
                  "sqrtn": lambda x, axis: tf.reduce_sum(x, axis) / tf.sqrt(
                      tf.cast(rows.row_lengths(), tf.float32))[:, None]}[ckpt_lib.COMBINER[table]]
        want = np.nan_to_num(reduce(lookup, axis=1).numpy())
        np.testing.assert_allclose(out[f"default/{feature}"], want, rtol=1e-5, atol=1e-6)


def test_unweighted_training_activations_match_serving_module():
    _, embedding = ckpt_lib.make_embedding(1, True)
    ids, _ = ckpt_lib.global_batch(0, with_weights=False)
    activations, _ = embedding(ids)
    module = serving.serving_module(embedding)
    got = module.lookup(ids)
    for feature in ckpt_lib.FEATURES:
        np.testing.assert_allclose(got[feature].numpy(), activations[feature].numpy(),
                                   rtol=1e-5, atol=1e-6)
