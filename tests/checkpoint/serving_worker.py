"""Loads a serving SavedModel in a plain TensorFlow process (never imports tf_sc_embedding).

  python serving_worker.py <export_dir> <inputs.npz> <out.npz>
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402


def main(export_dir, inputs_path, out_path):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    op_types = set()
    for meta in proto.meta_graphs:
        op_types.update(n.op for n in meta.graph_def.node)
        for function in meta.graph_def.library.function:
            op_types.update(n.op for n in function.node_def)
    loaded = tf.saved_model.load(export_dir)
    with np.load(inputs_path) as f:
        inputs = {k: tf.constant(f[k]) for k in f.files}
    plain = {k: v for k, v in inputs.items() if not k.endswith("_weights")}
    out = {}
    for k, v in loaded.signatures["serving_default"](**plain).items():
        out[f"default/{k}"] = v.numpy()
    for k, v in loaded.signatures["serving_weighted"](**inputs).items():
        out[f"weighted/{k}"] = v.numpy()
    names = sorted({k[:-len("_ids")] for k in inputs if k.endswith("_ids")})
    ragged = {n: tf.RaggedTensor.from_row_splits(inputs[f"{n}_ids"], inputs[f"{n}_row_splits"])
              for n in names}
    weights = {n: tf.RaggedTensor.from_row_splits(inputs[f"{n}_weights"],
                                                  inputs[f"{n}_row_splits"]) for n in names}
    for k, v in loaded.lookup_weighted(ragged, weights).items():
        out[f"function/{k}"] = v.numpy()
    for name, table in loaded.tables.items():
        if hasattr(table, "codes"):   # an int8 export: the rows as its lookup reads them
            out[f"table/{name}"] = (table.codes.numpy().astype(np.float32) *
                                    table.scales.numpy() + table.offsets.numpy())
            out[f"codes/{name}"] = table.codes.numpy()
        else:
            out[f"table/{name}"] = table.numpy()
    assert "tf_sc_embedding" not in sys.modules, "tf_sc_embedding was imported"
    out["op_types"] = np.array(sorted(op_types))
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
