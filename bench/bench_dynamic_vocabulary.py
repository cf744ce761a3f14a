"""Open-vocabulary tables through the class (issue 34, item 6): the training step with every table
dynamic against the same step with fixed vocabularies, on the same batches in the same rounds.

Workload: bench_api.py's Criteo-like batches (26 features, one table each, vocabularies capped at
--cap, dim 32, batch 4096, weighted ragged ids, combiner sum, fused Adagrad, a dense logistic
loss), one replica (or --replicas R of MirroredStrategy in one process, each taking 1/R of every
batch). The dynamic run feeds every id through a fixed 64-bit permutation (an odd
multiplier, then an xor), so its int64 keys have the fixed run's distinct counts and
frequencies; each dynamic table holds as many rows as the fixed one. Before timing, --warm-steps
steps admit the keys, so the timed steps meet mostly known keys plus the new ones each batch
brings, as a long run does.

Reported: median wall and CPU (process) time per step, interleaved and back to back
(bench_api.py explains both), and dynamic / fixed from the wall medians.

With --peer-python (a virtual environment with tensorflow-cpu 2.16.2 and
tensorflow-recommenders-addons 0.8.1, never this project's), the same permuted-key batches also
train TFRA's dynamic_embedding (bench/peers/tfra_dynamic_embedding.py, in that environment, after
ours, the same warm-up and step count back to back): its step, and the resident memory its
tables add per key held, beside the bytes of values and Adagrad slots each key carries.

Usage: python bench/bench_dynamic_vocabulary.py [--cap 1000000] [--rounds 30] [--threshold 1]
       [--replicas 1] [--peer-python /path/to/tfra-venv/bin/python]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_sc_embedding as sce  # noqa: E402
from bench_api import (add_workload_arguments, back_to_back, batch_pool,  # noqa: E402
                       capped_vocabulary, dataset_over, dense_head, interleaved, iterator_over,
                       replica_training_step, training_step, use_threads)

E = tf.tpu.experimental.embedding
MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)   # odd: a bijection of the 64-bit integers
MASK = np.uint64(0x5DEECE66D2F1B3A7)


def permuted_keys(ids):
    """int64 keys of int ids through a fixed 64-bit permutation (negative keys included)."""
    with np.errstate(over="ignore"):
        return ((ids.astype(np.uint64) * MULTIPLIER) ^ MASK).view(np.int64)


def as_keys(pool):
    """The pool with every ragged id tensor's values replaced by their permuted keys."""
    result = []
    for ids, weights, labels in pool:
        keyed = {name: r.with_flat_values(tf.constant(permuted_keys(r.flat_values.numpy())))
                 for name, r in ids.items()}
        result.append((keyed, weights, labels))
    return result


def save_pool(path, pool, head, dim):
    """The batch pool as the peer script reads it (.npz)."""
    arrays = {"batches": len(pool), "features": len(pool[0][0]), "dim": dim,
              "head": head.numpy()}
    for b, (ids, weights, labels) in enumerate(pool):
        for f in range(len(ids)):
            name = f"f{f}"
            arrays[f"values_{b}_{f}"] = ids[name].flat_values.numpy()
            arrays[f"splits_{b}_{f}"] = ids[name].row_splits.numpy()
            arrays[f"weights_{b}_{f}"] = weights[name].flat_values.numpy()
        arrays[f"labels_{b}"] = labels.numpy()
    np.savez(path, **arrays)


def run_peer(python, pool, dim, args):
    """TFRA's step on the same batches, in its own environment: its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.npz")
        save_pool(path, pool, dense_head(len(pool[0][0]), dim), dim)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers",
                              "tfra_dynamic_embedding.py")
        out = subprocess.run([python, script, path, "--warm-steps", str(args.warm_steps),
                              "--steps", str(args.rounds), "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True, timeout=3600,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_function(vocab, dim, pool, dynamic=None, strategy=None):
    """(embedding, a function running one training step) on the pool's batches; with a
    strategy of R replicas, each replica takes 1/R of every batch."""
    strategy = strategy or tf.distribute.get_strategy()
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner="sum",
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    vocabularies = ({t.name: dynamic for t in tables} if dynamic is not None else {})
    with strategy.scope():
        embedding = sce.TPUEmbeddingV2(features, E.Adagrad(0.05, initial_accumulator_value=0.1),
                                       dynamic_vocabularies=vocabularies)
    head = dense_head(len(vocab), dim)
    names = [f"f{i}" for i in range(len(vocab))]

    if strategy.num_replicas_in_sync == 1:
        step = training_step(embedding, names, head)
        iterator = iterator_over(pool)
        return embedding, lambda: step(iterator).numpy()

    replica_step = replica_training_step(embedding, names, head)

    @tf.function
    def distributed_step(iterator):
        losses = strategy.run(replica_step, args=next(iterator))
        return strategy.reduce("SUM", losses, axis=None)

    # Replica r of a process takes the r-th of its consecutive elements: each batch's slices.
    replicas = strategy.num_replicas_in_sync
    share = int(pool[0][2].shape[0]) // replicas
    slices = [tf.nest.map_structure(lambda t, r=r: t[r * share:(r + 1) * share], element)
              for element in pool for r in range(replicas)]
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda context: dataset_over(slices)))
    return embedding, lambda: distributed_step(iterator).numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=1_000_000)
    add_workload_arguments(parser, rounds=30, batches=16)
    parser.add_argument("--warm-steps", type=int, default=16)
    parser.add_argument("--threshold", type=int, default=1)
    parser.add_argument("--peer-python", help="python of a TFRA virtual environment")
    parser.add_argument("--replicas", type=int, default=1,
                        help="a MirroredStrategy over this many logical CPUs (the batch is the "
                             "global one)")
    args = parser.parse_args()
    use_threads(args.threads)
    strategy = None
    if args.replicas > 1:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0],
            [tf.config.LogicalDeviceConfiguration()] * args.replicas)
        strategy = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(args.replicas)])
    vocab = capped_vocabulary(args.cap)
    pool = batch_pool(vocab, args.batch, args.batches)
    fixed, fixed_step = step_function(vocab, args.dim, pool, strategy=strategy)
    keyed = as_keys(pool)
    dynamic, dynamic_step = step_function(
        vocab, args.dim, keyed, sce.DynamicVocabulary(admission_threshold=args.threshold),
        strategy)
    for _ in range(args.warm_steps):
        fixed_step()
        dynamic_step()
    functions = {"fixed": fixed_step, "dynamic": dynamic_step}
    print(f"26 tables capped at {args.cap}, batch {args.batch}, dim {args.dim}, "
          f"{args.threads} threads, {args.replicas} replica(s), threshold {args.threshold}, "
          f"keys held: {sum(len(dynamic.export_dynamic_table(f't{i}')[0]) for i in range(26))}")
    for label, medians in (("interleaved", interleaved(functions, args.rounds)),
                           ("back to back", back_to_back(functions, args.rounds))):
        (fw, fc), (dw, dc) = medians["fixed"], medians["dynamic"]
        print(f"{label}: fixed step {fw:.1f} ms (CPU {fc:.1f}), dynamic step {dw:.1f} ms "
              f"(CPU {dc:.1f}): dynamic / fixed {dw / fw:.2f}x")
    print(f"unadmitted ids {sum(dynamic.counters().unadmitted_ids.values())}, refused keys "
          f"{sum(dynamic.counters().refused_keys.values())}")
    if args.peer_python:
        del fixed, fixed_step   # free the fixed tables before the peer runs
        peer = run_peer(args.peer_python, keyed, args.dim, args)
        payload = args.dim * 4 * 2   # values + Adagrad accumulators, float32
        print(f"TFRA dynamic_embedding (back to back): step {peer['step_ms']:.1f} ms (CPU "
              f"{peer['cpu_ms']:.1f}), {peer['keys']} keys; TFRA / our dynamic step "
              f"{peer['step_ms'] / dw:.2f}x; resident memory per key inserted "
              f"{peer['rss_bytes_per_key']:.0f} bytes, {payload} of them values and "
              f"accumulators (ours: the map's 16 bytes per key and 8 per row, values and "
              f"accumulators in rows allocated for the capacity)")


if __name__ == "__main__":
    main()
