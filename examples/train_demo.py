"""Train embedding tables with tf_sc_embedding's TPUEmbeddingV2 on the built-in data.

A custom training loop in the TPUEmbeddingV2 style: each step looks up 26 Criteo-like features
(ragged, Zipf-distributed ids), feeds the activations to a small dense model, and applies the
fused per-table Adagrad update. Labels come from a hidden "teacher" table per feature, so the
held-out log loss falls as the tables learn. Runs under MirroredStrategy with --replicas > 1,
and under MultiWorkerMirroredStrategy with --workers (one process per worker, each started with
the same --workers list and its own --task-index; the tables are sharded over the workers).

Batches come from a tf.data pipeline per worker (`distribute_datasets_from_function`): each worker
makes only its own replicas' share of the global batch, in the background, and the step takes it
with next() inside the tf.function, so a step runs no Python (docs/training_loop.md).
With --checkpoint-dir, saves at the end following TensorFlow's multi-worker convention (every
worker saves, the chief to the real directory) and resumes from the latest checkpoint there.
"""
import argparse
import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

E = tf.tpu.experimental.embedding


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps")
    parser.add_argument("--batch", type=int, default=1024, help="global batch size")
    parser.add_argument("--dim", type=int, default=8, help="embedding dimension")
    parser.add_argument("--replicas", type=int, default=1, help="logical CPU replicas")
    parser.add_argument("--workers", default="",
                        help="comma-separated host:port of every worker (MultiWorkerMirrored)")
    parser.add_argument("--task-index", type=int, default=0, help="this worker's index")
    parser.add_argument("--checkpoint-dir", default="", help="save here at the end; resume")
    parser.add_argument("--learning-rate", type=float, default=0.2)
    parser.add_argument("--vocabulary-scale", type=float, default=0.001,
                        help="fraction of the Criteo-like vocabulary sizes to use")
    parser.add_argument("--wire-precision", choices=("float32", "16bit"), default="float32",
                        help="what the exchanges send between replicas: exact float32, or "
                             "float16 rows and bfloat16 gradients")
    parser.add_argument("--seed", type=int, default=0, help="seed of the teacher and the data")
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="held-out batches (of --batch samples) for the log loss and AUC")
    return parser.parse_args()


def main():
    args = parse_args()
    if args.workers:
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": args.workers.split(",")},
            "task": {"type": "worker", "index": args.task_index}})
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        args.replicas = strategy.num_replicas_in_sync
    elif args.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    else:
        strategy = tf.distribute.get_strategy()

    import tf_sc_embedding as sce  # after the logical devices are configured
    from tf_sc_embedding.data import CriteoLikeWorkload

    vocab = [max(3, int(v * args.vocabulary_scale)) for v in CriteoLikeWorkload().vocabulary_sizes]
    workload = CriteoLikeWorkload(vocabulary_sizes=vocab, seed=1 + args.seed)
    rng = np.random.default_rng(args.seed)
    teacher = [rng.normal(0, 1.0, size=v).astype(np.float32) for v in vocab]
    per_replica = args.batch // args.replicas
    num_features = len(vocab)

    with strategy.scope():
        tables = [E.TableConfig(vocabulary_size=v, dim=args.dim, combiner="mean", name=f"t{i}",
                                initializer=tf.zeros_initializer()) for i, v in enumerate(vocab)]
        features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
        # exchange_transport="auto": oneCCL between workers when `pip install .[oneccl]` put it
        # there, else TensorFlow's collectives (docs/multi_worker.md#transports).
        embedding = sce.TPUEmbeddingV2(features, E.Adagrad(learning_rate=args.learning_rate),
                                       wire_precision=args.wire_precision)
        embedding.build(per_replica_batch_size=per_replica)
    checkpoint = tf.train.Checkpoint(embedding=embedding)
    if args.checkpoint_dir and tf.train.latest_checkpoint(args.checkpoint_dir):
        checkpoint.restore(tf.train.latest_checkpoint(args.checkpoint_dir))
        print(f"restored {tf.train.latest_checkpoint(args.checkpoint_dir)}")
    readout = tf.ones([len(vocab) * args.dim, 1]) / args.dim

    def labelled_arrays(index, size):
        """Batch `index` of `size` samples as numpy: per feature (ids, row splits), and labels
        drawn from the teacher."""
        batch = workload.batch(size, index=index)
        logit = sum(np.add.reduceat(teacher[i][batch.ids[i]], batch.row_splits[i][:-1]) /
                    np.diff(batch.row_splits[i]) for i in range(num_features))
        draws = np.random.default_rng([index, 1, args.seed]).random(size)
        labels = (draws < 1 / (1 + np.exp(-logit))).astype(np.float32)
        return tuple(zip(batch.ids, batch.row_splits)), labels

    def as_ragged(arrays, labels):
        return ({f"f{i}": tf.RaggedTensor.from_row_splits(ids, splits, validate=False)
                 for i, (ids, splits) in enumerate(arrays)}, labels)

    def labelled_batch(index, size):
        return as_ragged(*labelled_arrays(index, size))

    signature = (tuple((tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32))
                       for _ in range(num_features)), tf.TensorSpec([None], tf.float32))

    def training_data(context):
        """This input pipeline's batches, one per local replica and step: pipeline p of P makes
        the per-replica batches (n * P + p) * L + j (L local replicas), in a background thread
        (numpy arrays made ragged by a graph map)."""
        size = context.get_per_replica_batch_size(args.batch)
        local = args.replicas // context.num_input_pipelines

        def batches():
            for n in range(args.steps):
                for j in range(local):
                    yield labelled_arrays(
                        (n * context.num_input_pipelines + context.input_pipeline_id) * local + j,
                        size)
        dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
        return dataset.map(as_ragged).prefetch(2)

    def distribute(ids, labels):
        def per_replica_value(ctx):
            lo = ctx.replica_id_in_sync_group * per_replica
            return ({k: v[lo:lo + per_replica] for k, v in ids.items()},
                    labels[lo:lo + per_replica])
        if args.replicas == 1:
            return ids, labels
        return strategy.experimental_distribute_values_from_function(per_replica_value)

    def loss_of(activations, labels):
        logits = tf.matmul(tf.concat([activations[f"f{i}"] for i in range(len(vocab))], 1),
                           readout)[:, 0]
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))

    @tf.function
    def train_step(iterator):
        def step(ids, labels):
            activations, preserved = embedding(ids)
            with tf.GradientTape() as tape:
                tape.watch(activations)
                loss = loss_of(activations, labels)
            embedding.apply_gradients(tape.gradient(loss, activations), preserved)
            return loss
        losses = strategy.run(step, args=next(iterator))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    @tf.function
    def eval_step(inputs):
        def logits_and_labels(ids, labels):
            logits = tf.matmul(tf.concat([embedding(ids)[0][f"f{i}"] for i in range(len(vocab))],
                                         1), readout)[:, 0]
            return logits, labels
        logits, labels = strategy.run(logits_and_labels, args=inputs)
        return strategy.gather(logits, axis=0), strategy.gather(labels, axis=0)

    held_out = [distribute(*labelled_batch(10**6 + b, args.batch))
                for b in range(args.eval_batches)]

    def evaluate():
        """Held-out log loss and AUC over every held-out batch (all replicas' samples)."""
        logits, labels = (np.concatenate(parts) for parts in
                          zip(*[[t.numpy() for t in eval_step(b)] for b in held_out]))
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)).numpy()
        auc = tf.keras.metrics.AUC(num_thresholds=10001)
        auc.update_state(labels, tf.sigmoid(logits))
        return f"log loss {loss:.4f}, AUC {auc.result().numpy():.4f}"

    print(f"held-out before training: {evaluate()}")
    iterator = iter(strategy.distribute_datasets_from_function(training_data))
    start = time.time()
    timed_from = None
    for n in range(args.steps):
        if n == 1:   # step 0 traces the function
            timed_from = time.time()
        loss = train_step(iterator)
        if n % 25 == 0 or n == args.steps - 1:
            print(f"step {n:4d}  training log loss {loss.numpy():.4f}")
    print(f"held-out after {args.steps} steps: {evaluate()} ({time.time() - start:.1f}s)")
    if timed_from is not None and args.steps > 1:
        seconds = time.time() - timed_from
        print(f"{(args.steps - 1) * args.batch / seconds:,.0f} samples/s in all after the first "
              f"step ({args.replicas} replica(s), global batch {args.batch})")
    if args.checkpoint_dir:
        # Every worker saves (the embedding gathers each table from all workers); only the
        # chief's files are kept.
        chief = args.task_index == 0
        directory = args.checkpoint_dir if chief else tempfile.mkdtemp()
        path = checkpoint.save(os.path.join(directory, "ckpt"))
        if chief:
            print(f"saved {path}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
