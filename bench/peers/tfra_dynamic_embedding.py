"""TFRA's dynamic_embedding on the batches of bench/bench_dynamic_vocabulary.py (the peer side).

Runs in its own virtual environment (tensorflow-cpu 2.16.2 and tensorflow-recommenders-addons
0.8.1), never in this project's: bench_dynamic_vocabulary.py --peer-python starts it with a .npz
of the batch pool and reads one JSON line back.

The step is what a TFRA user writes in TensorFlow 2: one `de.get_variable` per table (int64
keys, dim columns, the same uniform initializer range), looked up inside `tf.function` through
`de.shadow_ops.ShadowVariable` (unique keys, gather, weighted segment sum: the sum combiner), the
same logistic loss on a fixed dense head, and `tf.compat.v1.train.AdagradOptimizer` wrapped in
`de.DynamicEmbeddingOptimizer` (TFRA rejects Keras 3 optimizers). Each step reads its batch with
`next(iterator)` inside the function, as ours does.

    PEER_PYTHON bench/peers/tfra_dynamic_embedding.py POOL.npz --warm-steps 16 --steps 30

Prints {"step_ms": median wall, "cpu_ms": median process CPU, "keys": keys held,
"rss_bytes_per_key": resident memory added per key inserted between the end of the first step
(the function traced, the runtime warm) and the end of the warm-up}.
"""
import argparse
import json
import os
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_recommenders_addons import dynamic_embedding as de  # noqa: E402


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pool")
    parser.add_argument("--warm-steps", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    data = np.load(args.pool)
    batches, features, dim = int(data["batches"]), int(data["features"]), int(data["dim"])
    head = tf.constant(data["head"])
    elements = []
    for b in range(batches):
        elements.append(tuple(
            [tuple((data[f"values_{b}_{f}"], data[f"splits_{b}_{f}"], data[f"weights_{b}_{f}"])
                   for f in range(features)), data[f"labels_{b}"]]))
    dataset = tf.data.Dataset.from_tensors(elements[0])
    for element in elements[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(element))
    iterator = iter(dataset.repeat())

    tables = [de.get_variable(f"t{f}", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                              initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05))
              for f in range(features)]
    shadows = [de.shadow_ops.ShadowVariable(t, name=f"shadow_{f}", distribute_strategy=None)
               for f, t in enumerate(tables)]
    optimizer = de.DynamicEmbeddingOptimizer(
        tf.compat.v1.train.AdagradOptimizer(0.05, initial_accumulator_value=0.1))

    @tf.function
    def step():
        ids, labels = next(iterator)
        with tf.GradientTape() as tape:
            activations = []
            for f, (values, splits, weights) in enumerate(ids):
                unique, index = tf.unique(values)
                rows = de.shadow_ops.embedding_lookup(shadows[f], unique)
                segments = tf.ragged.row_splits_to_segment_ids(splits)
                activations.append(tf.math.unsorted_segment_sum(
                    tf.gather(rows, index) * weights[:, None], segments,
                    tf.shape(splits)[0] - 1))
            logits = tf.matmul(tf.concat(activations, 1), head)[:, 0]
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        gradients = tape.gradient(loss, shadows)
        optimizer.apply_gradients(zip(gradients, shadows))
        return loss

    def held():
        return int(sum(int(t.size().numpy()) for t in tables))

    step().numpy()
    first_keys, first_rss = held(), rss_bytes()
    for _ in range(args.warm_steps - 1):
        step().numpy()
    keys = held()
    grown = rss_bytes() - first_rss
    wall, cpu = [], []
    for _ in range(args.steps):
        w, c = time.perf_counter(), time.process_time()
        step().numpy()
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    print(json.dumps({"step_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu),
                      "keys": keys, "rss_bytes_per_key": grown / max(keys - first_keys, 1)}))


if __name__ == "__main__":
    main()
