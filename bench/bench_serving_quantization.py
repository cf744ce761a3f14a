"""The main job's serving export in float32 and in int8 (`quantize="int8"`): size on disk and
held-out AUC of each SavedModel.

Trains the main job (tf_sc_embedding.examples.dlrm, synthetic teacher-labelled Criteo-like data)
once, exports its serving model twice (float32 tables, then int8 rows with a per-row scale and
offset), loads each SavedModel back with `tf.saved_model.load`, predicts the held-out samples with
it and computes the AUC of its probabilities. The AUC of `model.evaluate` (Keras's binned AUC)
is printed beside them for reference.

    python bench/bench_serving_quantization.py [main job flags, e.g. --steps 300]
"""
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_sc_embedding.data.teacher import auc  # noqa: E402
from tf_sc_embedding.examples import dlrm  # noqa: E402


def directory_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def served_auc(export_dir, test, names):
    loaded = tf.saved_model.load(export_dir)
    probabilities, labels = [], []
    for inputs, label in test:
        ids = {n: tf.RaggedTensor.from_row_splits(tf.cast(inputs["ids"][n].values, tf.int64),
                                                  tf.cast(inputs["ids"][n].row_splits, tf.int64))
               for n in names}
        probabilities.append(loaded.predict(inputs["dense"], ids).numpy())
        labels.append(label.numpy().reshape(-1))
    return auc(np.concatenate(labels), np.concatenate(probabilities))


def main(argv=None):
    given = list(argv if argv is not None else sys.argv[1:])
    args = dlrm.parse_args((["--verbose", "0"] if "--verbose" not in given else []) + given +
                           ["--no-export"])
    if args.data:
        raise SystemExit("this benchmark uses the synthetic data (its held-out split)")
    results, model, (data, test_split) = dlrm.train_and_evaluate(args, export=False)
    test = dlrm.make_dataset(test_split, args.batch_size, data.feature_names)
    print(f"main job: {args.steps} steps x batch {args.batch_size}, dim {args.embedding_dim}, "
          f"tables: {args.optimizer}; Keras evaluate AUC {results['auc']:.5f}")
    print("| serving tables | variables on disk, MB | held-out AUC of the SavedModel |\n"
          "|---|---:|---:|")
    sizes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quantize in (None, "int8"):
            export_dir = os.path.join(tmp, str(quantize))
            dlrm.export_serving_model(model, export_dir, len(data.dense_names), quantize)
            sizes[quantize] = directory_bytes(os.path.join(export_dir, "variables"))
            value = served_auc(export_dir, test, data.feature_names)
            print(f"| {quantize or 'float32'} | {sizes[quantize] / 1e6:.1f} | {value:.5f} |")
    print(f"\nint8 / float32 size: {sizes['int8'] / sizes[None]:.3f}")


if __name__ == "__main__":
    main()
