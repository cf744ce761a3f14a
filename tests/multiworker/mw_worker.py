"""One process of a multi-worker (or single-process) training run, for tests/multiworker.

Every process builds the same TPUEmbeddingV2 (two stacked tables, Adagrad), trains `--steps`
steps on batches that depend only on (step, global replica id), optionally saves or restores a
checkpoint, and writes every logical table and slot (a collective read) to `--out`/tables_<i>.npz.

Modes: `--workers W --index i --ports p0,p1,...` runs worker i of a MultiWorkerMirroredStrategy
cluster on 127.0.0.1; `--replicas R` without --workers runs one process with MirroredStrategy
over R logical CPUs (R=1: no strategy).
"""
import argparse
import json
import os
import sys
import time

PER_REPLICA_BATCH = 8


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--ports", default="")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--first-step", type=int, default=0)
    p.add_argument("--exchange", default="auto")
    p.add_argument("--save", default="")
    p.add_argument("--restore", default="")
    p.add_argument("--restore-after-build", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--sleep-per-step", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=20.0)
    p.add_argument("--replicate", default="", help="comma-separated tables to replicate")
    p.add_argument("--nan-step", type=int, default=-1,
                   help="at this step, one replica's gradient of feature 'c' is NaN")
    p.add_argument("--nan-replica", type=int, default=0)
    p.add_argument("--skip-step", type=int, default=-1, help="a step not run at all")
    p.add_argument("--adapt-limits", action="store_true",
                   help="adapt_sparse_core_limits=True, with C++ warnings shown (the raises)")
    p.add_argument("--optimizer", choices=("adagrad", "row_wise_adagrad"), default="adagrad",
                   help="the tables' optimizer (row-wise Adagrad: one accumulator per row)")
    p.add_argument("--table-dtype", default="float32", help="the tables' storage dtype")
    p.add_argument("--wire-precision", default="float32",
                   help="EmbeddingOptions.wire_precision (16bit: float16 rows, bfloat16 "
                        "gradients between replicas)")
    # TensorFlow's collectives unless a test asks for oneCCL (test_oneccl.py): the cluster tests
    # of the exchanges' semantics do not depend on the transport, and a rank of oneCCL's has
    # been seen to crash, rarely, while its communicator forms (open, issue 60).
    p.add_argument("--transport", default="tensorflow",
                   help="EmbeddingOptions.exchange_transport (auto, oneccl or tensorflow)")
    p.add_argument("--dense-allreduce", action="store_true",
                   help="every step also all-reduces a dense value over the replicas with "
                        "tf.distribute (TensorFlow's own collective) between lookup and update")
    p.add_argument("--pipelining", action="store_true",
                   help="pipeline_execution_with_tensor_core=True")
    p.add_argument("--dynamic", action="store_true",
                   help="table 'small' is an open vocabulary of int64 keys (threshold 2, rows "
                        "given back after 3 unseen steps); its logical state goes to "
                        "dynamic_<i>.npz")
    p.add_argument("--identity", action="store_true",
                   help="with --dynamic: threshold 1, no eviction and exactly 37 rows for the "
                        "37 possible keys (the maps lend each other rows), the conditions under "
                        "which the open vocabulary equals the fixed table trained on the keys' "
                        "ids")
    p.add_argument("--checkpoint-at", type=int, default=-1,
                   help="also save a checkpoint after this step (to --out/early)")
    p.add_argument("--delta-at", default="",
                   help="comma-separated steps after which every worker writes its part of a "
                        "delta with optimizer state into --out/deltas (delta tracking on)")
    p.add_argument("--serving-at", type=int, default=-1,
                   help="export a serving model after this step (--out/serving_early, the chief's) "
                        "and at the end (--out/serving_late)")
    p.add_argument("--apply-deltas", default="",
                   help="a folder of deltas applied in order after the restore (tracking on)")
    p.add_argument("--prefetch", action="store_true",
                   help="with --pipelining: every step also looks up the next step's batch "
                        "(next_features), the first one prefetched before the loop")
    return p.parse_args()


def main():
    args = parse()
    if args.workers:
        ports = args.ports.split(",")
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": args.index}})
    if args.adapt_limits:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not args.workers and args.replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.collectives import freed_memory  # pylint: disable=import-outside-toplevel

    if args.workers:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif args.replicas > 1:
        strategy = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(args.replicas)])
    else:
        strategy = tf.distribute.get_strategy()

    E = tf.tpu.experimental.embedding
    big = E.TableConfig(vocabulary_size=1000, dim=8, name="big", combiner="sum",
                        initializer=tf.constant_initializer(0.01))
    # 37 rows for ids 0..36: with --identity the open vocabulary has room for every key and no
    # more, so maps whose share is too small borrow rows across workers.
    small = E.TableConfig(vocabulary_size=37, dim=4, name="small",
                          combiner="mean",
                          initializer=tf.constant_initializer(-0.02))
    features = {"a": E.FeatureConfig(table=big), "b": E.FeatureConfig(table=big),
                "c": E.FeatureConfig(table=small)}
    with strategy.scope():
        optimizer = (E.Adagrad(learning_rate=0.1) if args.optimizer == "adagrad" else
                     sce.RowWiseAdagrad(learning_rate=0.1, initial_accumulator_value=0.1))
        embedding = sce.TPUEmbeddingV2(features, optimizer=optimizer,
                                       table_dtypes={"big": args.table_dtype,
                                                     "small": args.table_dtype},
                                       exchange=args.exchange,
                                       wire_precision=args.wire_precision,
                                       exchange_transport=args.transport,
                                       collective_timeout_seconds=args.timeout,
                                       replication_threshold_bytes=0,
                                       adapt_sparse_core_limits=args.adapt_limits,
                                       pipeline_execution_with_tensor_core=args.pipelining,
                                       sparse_core_embedding_config=(
                                           E.SparseCoreEmbeddingConfig(
                                               disable_table_stacking=True,
                                               max_ids_per_table={"big": 1, "small": 1},
                                               max_unique_ids_per_table={"big": 1, "small": 1})
                                           if args.adapt_limits else None),
                                       table_placement={t: "replicated"
                                                        for t in args.replicate.split(",") if t},
                                       dynamic_vocabularies={"small": sce.DynamicVocabulary(
                                           admission_threshold=1 if args.identity else 2,
                                           steps_to_live=None if args.identity else 3)}
                                       if args.dynamic else None,
                                       delta_tracking=bool(args.delta_at or args.apply_deltas))
    checkpoint = tf.train.Checkpoint(embedding=embedding)
    if args.restore and not args.restore_after_build:
        checkpoint.restore(args.restore)
    embedding.build(per_replica_batch_size=PER_REPLICA_BATCH)
    if args.restore and args.restore_after_build:
        checkpoint.restore(args.restore)
    if args.apply_deltas:
        from tf_sc_embedding.deltas import delta_format  # pylint: disable=import-outside-toplevel
        for _, _, path in delta_format.list_deltas(args.apply_deltas):
            embedding.apply_delta(path)

    def export_serving(name):
        """Every worker exports (reading the tables is a collective); the chief's is kept."""
        embedding.export_serving(os.path.join(args.out, name if args.index == 0 else
                                              f"tmp_{name}_{args.index}"))

    def save(path_or_chief, name):
        """Saves a checkpoint (the chief to `path_or_chief`, the others to scratch paths) and
        records its path in --out/<name>_path."""
        path = path_or_chief if args.index == 0 else os.path.join(
            args.out, f"tmp_{name}_{args.index}")
        saved = checkpoint.save(path)
        if args.index == 0:
            with open(os.path.join(args.out, f"{name}_path"), "w") as f:
                f.write(saved)

    def batch(step, replica):
        """The ragged ids of one replica at one step (the same in any topology)."""
        out = {}
        for i, (name, vocab) in enumerate([("a", 1000), ("b", 1000), ("c", 37)]):
            seed = tf.stack([step * 7 + i, replica])
            lengths = tf.random.stateless_uniform([PER_REPLICA_BATCH], seed, 0, 4, tf.int32)
            hot = tf.random.stateless_uniform([PER_REPLICA_BATCH * 3], seed + 1, 0, 40, tf.int32)
            ids = tf.where(hot % 5 == 0, vocab - 1 - hot, hot % vocab)
            if args.dynamic and name == "c":   # arbitrary int64 keys for the open vocabulary
                ids = tf.cast(ids, tf.int64) * 1000003 - 17
            out[name] = tf.RaggedTensor.from_row_lengths(ids[:tf.reduce_sum(lengths)], lengths)
        return out

    @tf.function
    def train_step(step):
        def replica_step():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            if args.prefetch:
                activations, preserved = embedding(batch(step, replica),
                                                   next_features=batch(step + 1, replica))
            else:
                activations, preserved = embedding(batch(step, replica))
            gradients = tf.nest.map_structure(
                lambda a: 0.5 * a + 0.25 * tf.cast(replica + 1, tf.float32), activations)
            poisoned = tf.logical_and(tf.equal(step, args.nan_step),
                                      tf.equal(replica, args.nan_replica))
            gradients["c"] = tf.where(poisoned, float("nan"), gradients["c"])
            total = tf.add_n([tf.reduce_sum(a) for a in activations.values()])
            if args.dense_allreduce:   # a dense model's all-reduce inside the embedding's step
                total = tf.distribute.get_replica_context().all_reduce("sum", total)
                gradients = {k: g + 0.0 * total for k, g in gradients.items()}
            embedding.apply_gradients(gradients, preserved)
            return total
        return strategy.run(replica_step)

    @tf.function
    def prefetch_first(step):
        return strategy.run(lambda: embedding.prefetch(batch(
            step, tf.distribute.get_replica_context().replica_id_in_sync_group)))

    if args.prefetch:
        prefetch_first(tf.constant(args.first_step))
    errors = []
    for step in range(args.first_step, args.first_step + args.steps):
        if step == args.skip_step:
            continue
        try:
            train_step(tf.constant(step))
        except tf.errors.InvalidArgumentError as e:
            if step != args.nan_step:
                raise
            errors.append(e.message)
        print("step", step, flush=True)
        if step == args.checkpoint_at:
            save(os.path.join(args.out, "early", "ckpt"), "early")
        if step == args.serving_at:
            export_serving("serving_early")
        if str(step) in args.delta_at.split(","):
            embedding.export_delta(os.path.join(args.out, "deltas"), include_optimizer_state=True)
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)
    os.makedirs(args.out, exist_ok=True)
    if args.save:
        save(args.save, "checkpoint")
    if args.serving_at >= 0:
        export_serving("serving_late")
    tables = embedding.logical_tables(include_slots=True)
    flat = {f"{t}/{k}": v for t, kinds in tables.items() for k, v in kinds.items()}
    shards = {f"shard_rows/{v.name}": np.array(v.shape[0])
              for v in embedding.storage.local_variables()}
    np.savez(os.path.join(args.out, f"tables_{args.index}.npz"), **flat, **shards)
    if args.dynamic:   # the whole logical state, read from every worker's maps (a collective)
        state = embedding.dynamic_tables.logical_state("small")
        state["unadmitted_ids"] = np.array(sum(embedding.counters().unadmitted_ids.values()))
        np.savez(os.path.join(args.out, f"dynamic_{args.index}.npz"), **state)
    with open(os.path.join(args.out, f"bytes_{args.index}.json"), "w") as f:
        json.dump(embedding.counters().collective_bytes_sent, f)
    with open(os.path.join(args.out, f"errors_{args.index}.json"), "w") as f:
        json.dump(errors, f)
    with open(os.path.join(args.out, f"stats_{args.index}.json"), "w") as f:
        json.dump({"stats": embedding.sparse_core_stats, "limits": embedding.sparse_core_limits,
                   "malloc": freed_memory.applied()}, f)
    print("done", args.index, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
