"""One worker process of a Keras EmbeddingLayer model under MultiWorkerMirroredStrategy.

Mode "fit": model.fit must raise the layer's clear NotImplementedError (prints FIT_REJECTED).
Mode "ctl": a custom training loop (strategy.run + GradientTape + Keras optimizer) trains the
dense weights and the table, sharded over the workers (table_placement); writes the logical
tables to --out/keras_tables_<index>.npz and the model's weights with Keras (every worker saves,
the chief to --out/keras.weights.h5, the others to a temporary file they delete).
Mode "load": one process, no cluster: loads --out/keras.weights.h5 into the same model and
writes its logical tables to --out/keras_loaded.npz.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["fit", "ctl", "load"], required=True)
    p.add_argument("--ports", default="")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--out", default="")
    args = p.parse_args()
    if args.ports:
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{q}" for q in args.ports.split(",")]},
            "task": {"type": "worker", "index": args.index}})
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import keras  # pylint: disable=import-outside-toplevel
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel

    E = tf.tpu.experimental.embedding
    strategy = (tf.distribute.get_strategy() if args.mode == "load" else
                tf.distribute.MultiWorkerMirroredStrategy())
    replicas = strategy.num_replicas_in_sync
    table = E.TableConfig(vocabulary_size=64, dim=4, name="t",
                          initializer=tf.constant_initializer(0.1))
    features = {"f": E.FeatureConfig(table=table)}
    batch = 8 * replicas
    with strategy.scope():
        # Sharded is the default; named so the test states the placement it covers.
        layer = sce.EmbeddingLayer(features, optimizer=E.SGD(learning_rate=0.5), batch_size=batch,
                                   table_placement={"t": "sharded"})
        ids = keras.Input(shape=(), batch_size=batch // replicas, dtype="int32", name="f")
        out = keras.layers.Dense(1, kernel_initializer="ones")(layer({"f": ids})["f"])
        model = keras.Model({"f": ids}, out)
        optimizer = keras.optimizers.SGD(0.1)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, size=(batch * 4,)).astype(np.int32)
    y = rng.random(batch * 4).astype(np.float32)
    if args.mode == "load":
        model.load_weights(os.path.join(args.out, "keras.weights.h5"))
        np.savez(os.path.join(args.out, "keras_loaded.npz"), **layer.embedding.logical_tables())
        print("LOAD_DONE", flush=True)
        return 0
    if args.mode == "fit":
        model.compile(optimizer="sgd", loss="mse")
        try:
            model.fit({"f": x}, y, batch_size=batch, epochs=1, verbose=0)
        except NotImplementedError as e:
            print("FIT_REJECTED", str(e), flush=True)
            return 0
        print("FIT_NOT_REJECTED", flush=True)
        return 1

    @tf.function
    def step(xs, ys):
        def replica_step(xs, ys):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model({"f": xs}, training=True)[:, 0] - ys) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return strategy.run(replica_step, args=(xs, ys))

    per = batch // replicas
    for s in range(4):
        def value(ctx, s=s, arr=x):
            r = ctx.replica_id_in_sync_group
            return tf.constant(arr[s * batch + r * per: s * batch + (r + 1) * per])

        def label(ctx, s=s, arr=y):
            r = ctx.replica_id_in_sync_group
            return tf.constant(arr[s * batch + r * per: s * batch + (r + 1) * per])
        step(strategy.experimental_distribute_values_from_function(value),
             strategy.experimental_distribute_values_from_function(label))
    assert layer.embedding.placement_plan == {"t": "sharded"}, layer.embedding.placement_plan
    tables = layer.embedding.logical_tables()
    np.savez(os.path.join(args.out, f"keras_tables_{args.index}.npz"), **tables)
    # Keras weight files under MWMS: every worker writes (each table is gathered from all
    # workers during the save); only the chief's file is kept.
    directory = args.out if args.index == 0 else tempfile.mkdtemp()
    model.save_weights(os.path.join(directory, "keras.weights.h5"))
    if args.index != 0:
        shutil.rmtree(directory)
    print("CTL_DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
