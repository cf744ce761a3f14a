"""Serving export: stock-op SavedModel loaded in a process without tf_sc_embedding."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.checkpoint import ckpt_lib
from tests.devices import require_replicas
from tf_sc_embedding.saving import serving
from tf_sc_embedding.saving import serving_rows

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("optimizer", ["adagrad",
                                       pytest.param("row_wise_adagrad", marks=pytest.mark.slow)])
def test_serving_export_matches_training_activations_without_the_op_library(tmp_path, optimizer):
    require_replicas(2)
    strategy, embedding = ckpt_lib.make_embedding(2, True, optimizer)
    trainer = ckpt_lib.Trainer(strategy, embedding)
    trainer.run(range(3))
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir)

    # Training-time activations of the next batch (computed from the tables before its update).
    inputs = _flat_inputs(3)
    expected_weighted = trainer.run([3])
    assert any(np.diff(inputs["f_user_row_splits"]) == 0), "want an empty sample in the batch"
    out = _serve_without_the_library(tmp_path, export_dir, inputs)
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


def _flat_inputs(step):
    """The serving signatures' flat inputs for global batch `step`."""
    ids, weights = ckpt_lib.global_batch(step)
    inputs = {}
    for feature in ckpt_lib.FEATURES:
        inputs[f"{feature}_ids"] = ids[feature].values.numpy()
        inputs[f"{feature}_row_splits"] = ids[feature].row_splits.numpy()
        inputs[f"{feature}_weights"] = weights[feature].values.numpy()
    return inputs


def _serve_without_the_library(tmp_path, export_dir, inputs):
    """Runs serving_worker.py on `inputs` in a process that cannot import tf_sc_embedding."""
    np.savez(tmp_path / "inputs.npz", **inputs)
    out_path = str(tmp_path / "out.npz")
    code = ("import sys, runpy; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    subprocess.run([sys.executable, "-c", code, os.path.join(HERE, "serving_worker.py"),
                    export_dir, str(tmp_path / "inputs.npz"), out_path], check=True, timeout=300,
                   cwd=str(tmp_path), env={k: v for k, v in os.environ.items()
                                           if k != "PYTHONPATH"})
    with np.load(out_path) as f:
        return {k: f[k] for k in f.files}


def test_int8_export_is_within_half_a_step_per_row_and_smaller(tmp_path):
    strategy, embedding = ckpt_lib.make_embedding(1, True)
    ckpt_lib.Trainer(strategy, embedding).run(range(2))
    float_dir, int8_dir = str(tmp_path / "float32"), str(tmp_path / "int8")
    embedding.export_serving(float_dir)
    embedding.export_serving(int8_dir, quantize="int8")
    inputs = _flat_inputs(7)
    out = _serve_without_the_library(tmp_path, int8_dir, inputs)
    assert not {op for op in out["op_types"].tolist() if op.startswith("Sce")}
    trained = embedding.logical_tables()
    for feature, table in ckpt_lib.FEATURES.items():
        assert out[f"codes/{table}"].dtype == np.int8
        values, served = trained[table], out[f"table/{table}"]
        half_step = (values.max(axis=1, keepdims=True) - values.min(axis=1, keepdims=True)) / 510
        assert np.all(np.abs(served - values) <= half_step * (1 + 1e-4) + 1e-7), table
        assert np.any(served != values)
        # The lookup reads exactly the dequantized rows.
        expected = serving.combine(tf.constant(served), inputs[f"{feature}_ids"],
                                   inputs[f"{feature}_row_splits"],
                                   inputs[f"{feature}_weights"], ckpt_lib.COMBINER[table])
        np.testing.assert_allclose(out[f"weighted/{feature}"], expected.numpy(), rtol=1e-6,
                                   atol=1e-7)

    def variables_bytes(path):
        return sum(os.path.getsize(os.path.join(root, name))
                   for root, _, names in os.walk(os.path.join(path, "variables")) for name in names)
    # dims 10, 16 and 8 here: (dim + 8) / (4 dim) of the float32 bytes (0.45, 0.38, 0.5), plus
    # the files' own overhead.
    assert variables_bytes(int8_dir) < 0.6 * variables_bytes(float_dir)


def test_int8_export_rejects_an_unknown_quantization_before_reading_tables(tmp_path):
    _, embedding = ckpt_lib.make_embedding(1, True)
    with pytest.raises(ValueError, match=r"quantize must be one of"):
        embedding.export_serving(str(tmp_path / "x"), quantize="int4")
    assert not os.path.exists(tmp_path / "x")


def test_quantize_int8_rows():
    """Constant rows read back exactly; the largest error is half a step; NaN names the table;
    empty tables and rows of width 0 work."""
    rows = np.array([[0.5, 0.5, 0.5], [-1.0, 0.0, 2.0], [1e-3, -1e-3, 0.0]], np.float32)
    codes, scales, offsets = serving_rows.quantize_int8(rows)
    back = codes.astype(np.float32) * scales + offsets
    assert codes.dtype == np.int8 and scales.shape == offsets.shape == (3, 1)
    np.testing.assert_array_equal(back[0], rows[0])
    assert codes[1].min() == -128 and codes[1].max() == 127
    for r in (1, 2):
        step = (rows[r].max() - rows[r].min()) / 255
        assert np.all(np.abs(back[r] - rows[r]) <= step / 2 * (1 + 1e-5)), r
    with pytest.raises(ValueError, match="table 'video'.*NaN or Inf"):
        serving_rows.quantize_int8(np.array([[0.0, np.nan]], np.float32), "video")
    for shape in [(0, 4), (3, 0)]:
        codes, scales, offsets = serving_rows.quantize_int8(np.zeros(shape, np.float32))
        assert codes.shape == shape and scales.shape == offsets.shape == (shape[0], 1)


def test_dynamic_tables_serve_with_a_stock_hash_table(tmp_path):
    """Open-vocabulary tables export their held keys' rows and a stock hash table; the SavedModel
    answers in a process without the library, unknown keys reading zeros, the sum-combined
    feature bit for bit as the trained embedding looks it up."""
    from tests.api.test_dynamic_vocabulary import ids_tensor  # noqa: PLC0415
    import tf_sc_embedding as sce  # noqa: PLC0415
    E = tf.tpu.experimental.embedding
    words = E.TableConfig(vocabulary_size=32, dim=4, name="words", combiner="sum",
                          initializer=tf.initializers.RandomUniform(-0.5, 0.5))
    items = E.TableConfig(vocabulary_size=32, dim=8, name="items", combiner="mean",
                          initializer=tf.initializers.RandomUniform(-0.5, 0.5))
    embedding = sce.TPUEmbeddingV2(
        {"f1": E.FeatureConfig(table=words, name="f1"),
         "f2": E.FeatureConfig(table=items, name="f2")}, optimizer=E.Adagrad(0.1),
        dynamic_vocabularies={"words": sce.DynamicVocabulary(tf.string, admission_threshold=2),
                              "items": sce.DynamicVocabulary(tf.int64, admission_threshold=2)})
    rng = np.random.default_rng(3)
    word_keys = [b"w%d" % i for i in range(10)]
    item_keys = [-(1 << 62) + 7 * i for i in range(10)]
    batches = [{"f1": [list(rng.choice(word_keys, 2)) for _ in range(8)],
                "f2": [[int(k) for k in rng.choice(item_keys, 3)] for _ in range(8)]}
               for _ in range(4)]
    for batch in batches:   # string and int64 features in one step
        step_features = {"f1": ids_tensor(batch["f1"], "ragged", tf.string),
                         "f2": ids_tensor(batch["f2"], "ragged", tf.int64)}
        activations, preserved = embedding(step_features)
        embedding.apply_gradients(activations, preserved)
    export_dir = str(tmp_path / "serving")
    embedding.export_serving(export_dir)
    # Held keys, keys never seen (read zeros) and an empty sample; no key twice, so the lookup
    # below admits nothing.
    held_words = list(embedding.export_dynamic_table("words")[0])
    held_items = [int(k) for k in embedding.export_dynamic_table("items")[0]]
    assert held_words and held_items
    query = {"f1": [held_words[:2], [b"never"], [], held_words[2:3], [b"new", held_words[3]],
                    held_words[4:5], [], [b"x"]],
             "f2": [held_items[:3], [12345], [], held_items[3:4], [9, held_items[4]], [], [1],
                    held_items[5:6]]}
    ragged = {"f1": tf.ragged.constant(query["f1"], tf.string),
              "f2": tf.ragged.constant(query["f2"], tf.int64)}
    want = embedding.embedding_lookup(ragged)[0]
    inputs = {}
    for name, r in ragged.items():
        values = r.values.numpy()
        inputs[f"{name}_ids"] = values.astype("S") if name == "f1" else values
        inputs[f"{name}_row_splits"] = r.row_splits.numpy()
        inputs[f"{name}_weights"] = np.ones(len(values), np.float32)
    out = _serve_without_the_library(tmp_path, export_dir, inputs)
    assert not {op for op in out["op_types"].tolist() if op.startswith("Sce")}
    np.testing.assert_array_equal(out["default/f1"], want["f1"].numpy())
    np.testing.assert_allclose(out["default/f2"], want["f2"].numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out["default/f1"][[1, 2, 6, 7]], 0.0)
    keys, values = embedding.export_dynamic_table("words")
    np.testing.assert_array_equal(out["table/words"][:len(keys)], values)
    np.testing.assert_array_equal(out["table/words"][len(keys):], 0.0)   # free rows, zero row


def test_an_empty_dynamic_table_exports():
    """A dynamic table holding no key yet serves zeros for every key."""
    import tf_sc_embedding as sce  # noqa: PLC0415
    E = tf.tpu.experimental.embedding
    table = E.TableConfig(vocabulary_size=8, dim=4, name="words")
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table, name="f")}, E.SGD(0.1),
                                   dynamic_vocabularies={"words": sce.DynamicVocabulary(
                                       tf.string, admission_threshold=5)})
    embedding.build(per_replica_batch_size=4)
    module = serving.serving_module(embedding)
    out = module.lookup({"f": tf.ragged.constant([[b"a"], [b""], [], [b"b", b"c"]], tf.string)})
    np.testing.assert_array_equal(out["f"].numpy(), np.zeros([4, 4], np.float32))
