"""Class overhead (issue 8, item 1): each phase through `TPUEmbeddingV2` against the same work done
with the op library alone, interleaved in one process, on the Criteo-like workload (26 tables,
dim 32, batch 4096, weighted ragged ids, combiner sum, fused Adagrad, 1 replica, no strategy).

Phases, each its own `tf.function`:
  class enqueue       `embedding.enqueue(ids, weights)`
  class lookup        `embedding.embedding_lookup(ids, weights)` (enqueue + dequeue)
  class step          embedding_lookup + `apply_gradients` of fixed activation gradients
  ops preprocessing   per table: convert_to_coo -> minibatch splits -> CSR (bench_ops.py)
  ops forward         per table: the lookup kernel on the prepared CSR
  ops forward+update  per table: lookup + fused Adagrad on the prepared CSR
  call only           a tf.function taking the same ragged dicts that runs no op: what passing
                      52 RaggedTensors into a tf.function costs in Python, before any op
  next only           a tf.function that only takes the next batch from the iterator: the input
                      pipeline's share of the next(iterator)-fed class phases
  class kernels       the kernels the class runs on its stacked tables (ids to splits; CSR
                      + lookup; + fused Adagrad), fed with inputs computed beforehand: the class
                      minus its own graph (input adaptation, unstacking, gradient stacking)
"Sum of the ops" for a step is preprocessing + forward+update. Every round runs every function
once, in turn, so load from other jobs hits all of them alike; the table gives the median and the
interquartile range over the rounds.

Usage: python bench/bench_class_overhead.py [--rounds 30] [--vocabulary-cap 4000000]
       [--op-counts] [--trace DIR]
"""
import argparse
import collections
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tf_sc_embedding as sce  # noqa: E402
from tf_sc_embedding.tables.table_storage import PARAMETERS  # noqa: E402
from bench_ops import LEARNING_RATE, OurPipeline  # noqa: E402
from common import ragged_features  # noqa: E402
from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: E402

E = tf.tpu.experimental.embedding


# The class's phases, taking the batch as arguments or with next(iterator) inside.
ARGUMENT_FED = {"enqueue": "class enqueue", "lookup": "class lookup (enqueue + dequeue)",
                "step": "class step (lookup + apply_gradients)"}
ITERATOR_FED = {phase: f"class {phase}, next(iterator)" for phase in ARGUMENT_FED}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--vocabulary-cap", type=int, default=4_000_000)
    parser.add_argument("--combiner", default="sum")
    parser.add_argument("--skip-ops", action="store_true", help="time the class only")
    parser.add_argument("--op-counts", action="store_true",
                        help="print the op types of each class phase's traced graph")
    parser.add_argument("--trace", help="write a TF profiler trace of 3 class steps here")
    return parser.parse_args()


def class_functions(vocab, dim, batch, combiner, optimizer=None):
    tables = [E.TableConfig(vocabulary_size=v, dim=dim, name=f"t{i}", combiner=combiner,
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    features = {f"f{i}": E.FeatureConfig(table=t) for i, t in enumerate(tables)}
    embedding = sce.TPUEmbeddingV2(features, optimizer or E.Adagrad(learning_rate=LEARNING_RATE))
    embedding.build(per_replica_batch_size=batch)

    @tf.function
    def enqueue(ids, weights):
        return embedding.enqueue(ids, weights)

    @tf.function
    def lookup(ids, weights):
        return embedding.embedding_lookup(ids, weights)[0]

    @tf.function
    def step(ids, weights, gradients):
        _, preserved = embedding.embedding_lookup(ids, weights)
        embedding.apply_gradients(gradients, preserved)

    # The same phases taking the batch with next(iterator) inside (the README's recipe): no
    # per-call conversion of 52 ragged arguments.
    @tf.function
    def enqueue_next(iterator):
        return enqueue_fn(*next(iterator)[:2])

    @tf.function
    def lookup_next(iterator):
        return embedding.embedding_lookup(*next(iterator)[:2])[0]

    @tf.function
    def step_next(iterator):
        ids, weights, gradients = next(iterator)
        _, preserved = embedding.embedding_lookup(ids, weights)
        embedding.apply_gradients(gradients, preserved)

    def enqueue_fn(ids, weights):
        return embedding.enqueue(ids, weights)

    return embedding, enqueue, lookup, step, (enqueue_next, lookup_next, step_next)


class ClassKernelsAlone:
    """The kernels TPUEmbeddingV2 runs (stacked tables), fed with inputs computed beforehand, so
    the class's own graph around them (input adaptation, activation unstacking, gradient
    stacking) is left out. Uses the class's internals; benchmark only."""

    def __init__(self, embedding, flat_ids, flat_weights, gradients):
        from tf_sc_embedding.collectives import replica_group as collectives  # noqa: PLC0415
        from tf_sc_embedding.preprocessing import enqueue as enqueue_lib
        from tf_sc_embedding.optimizers import fused_update  # noqa: PLC0415
        from tf_sc_embedding.exchanges import all_gather as sharded_lookup  # noqa: PLC0415
        self.fused_update = fused_update
        self.embedding = embedding
        plan = embedding.plan
        self.layout = plan.sharded
        self.enqueue_lib, self.sharded_lookup, self.collectives = (
            enqueue_lib, sharded_lookup, collectives)
        self.inputs = [enqueue_lib.feature_as_id_input(i, w, "f")[:3]
                       for i, w in zip(flat_ids, flat_weights)]
        self.preprocessed = self.preprocess()
        by_path = dict(zip(embedding.feature_paths, tf.nest.flatten(gradients)))
        self.stacked_gradients = {
            name: enqueue_lib.stack_gradients(plan, stacked, by_path)
            for name, stacked in self.layout.stacked_tables.items()}

    @tf.function
    def preprocess(self):
        """What enqueue runs per stacked table: `splits`, then (one replica) the CSR packing;
        {stacked name: all_gather.PackedCsr}."""
        splits = self.splits()
        return {name: self.sharded_lookup.pack_one_replica(self.layout, stacked, splits[name],
                                                           None)
                for name, stacked in self.layout.stacked_tables.items()}

    @tf.function
    def splits(self):
        """The stacked tables' one-op preprocessing, ids to minibatch splits."""
        from tf_sc_embedding.ops import preprocessing  # noqa: PLC0415
        layout, result = self.layout, {}
        for name, stacked in layout.stacked_tables.items():
            index = [k for k, f in enumerate(layout.features)
                     if f.table.layout.stacked_table_name == name]
            fs = [layout.features[k] for k in index]
            splits = preprocessing.convert_features_to_minibatch_splits(
                [self.inputs[k][0] for k in index], [self.inputs[k][1] for k in index],
                [self.inputs[k][2] for k in index], [f.sample_count for f in fs],
                [f.sample_offset for f in fs], [f.table.col_offset for f in fs],
                [f.table.layout.sparse_core_shard_rotation for f in fs],
                [f.table.vocabulary_size for f in fs], [f.table.combiner for f in fs],
                [f.table.name for f in fs], [f.path for f in fs],
                layout.sparse_cores_per_replica, layout.num_sparse_cores, stacked.sample_count,
                num_replica=layout.num_replicas, table_vocab_size=stacked.total_rows,
                table_name=name, max_ids_per_partition=stacked.max_ids_per_partition,
                max_unique_ids_per_partition=stacked.max_unique_ids_per_partition)
            result[name] = self.enqueue_lib.PreprocessedTable(
                splits.sorted_row_ids, splits.sorted_col_ids, splits.sorted_gains,
                splits.splits, splits.id_counts)
        return result

    def _lookup(self, view, variables):
        activations, csrs = [], {}
        for name, stacked in self.layout.stacked_tables.items():
            csr = csrs[name] = self.preprocessed[name].csr
            activations.append(self.sharded_lookup.lookup(view, self.layout, stacked, csr,
                                                          variables[name][0]))
        return activations, csrs

    def _variables(self, view):
        """{stacked name: (parameters, [slots])}: this replica's variables (`variables`)."""
        result = {}
        for name, kinds in self.embedding.variables.items():
            slots = self.layout.stacked_tables[name].optimizer.slot_names
            result[name] = (kinds[PARAMETERS].shard(view.replica_id),
                            [kinds[slot].shard(view.replica_id) for slot in slots])
        return result

    @tf.function
    def forward(self):
        """The lookup per stacked table (what dequeue runs before unstacking)."""
        view = self.collectives.ReplicaView(self.embedding.replica_group)
        return self._lookup(view, self._variables(view))[0]

    @tf.function
    def forward_and_update(self):
        """The lookup and the fused Adagrad per stacked table."""
        view = self.collectives.ReplicaView(self.embedding.replica_group)
        variables = self._variables(view)
        activations, csrs = self._lookup(view, variables)
        with tf.control_dependencies(activations):
            for name, stacked in self.layout.stacked_tables.items():
                target = self.fused_update.UpdateTarget(
                    stacked, self.sharded_lookup.shard_arguments(self.layout, view.replica_id),
                    *variables[name], True,
                    self.embedding.replica_group.counter(view.replica_id,
                                                         self.collectives.UPDATE_STEPS))
                self.fused_update.run(target, self.sharded_lookup.update_inputs(
                    view, csrs[name], self.stacked_gradients[name]))
        return activations


def op_counts(concrete_function):
    return collections.Counter(op.type for op in concrete_function.graph.get_operations())


def main():
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    vocab = [min(v, args.vocabulary_cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    batch = CriteoLikeWorkload(vocabulary_sizes=vocab).batch(args.batch)
    n = len(vocab)
    ids, weights = ragged_features(batch)
    upstream = [tf.random.stateless_normal([args.batch, args.dim], seed=[7, i]) for i in range(n)]
    gradients = {f"f{i}": upstream[i] for i in range(n)}
    print(f"workload: {n} tables, {sum(vocab):,} rows (cap {args.vocabulary_cap:,}), dim "
          f"{args.dim}, batch {args.batch}, {sum(len(i) for i in batch.ids):,} ids, combiner "
          f"{args.combiner}, {args.threads} threads, {args.rounds} rounds")

    embedding, enqueue, lookup, step, fed = class_functions(vocab, args.dim, args.batch,
                                                            args.combiner)
    iterator = iter(tf.data.Dataset.from_tensors((ids, weights, gradients)).repeat())
    stacked = collections.Counter(layout.stacked_table_name
                                  for layout in embedding.embedding_layouts.values())
    print(f"{len(stacked)} stacked tables of {sorted(stacked.values())} tables")
    @tf.function
    def call_only(ids, weights):
        del ids, weights
        return tf.constant(0)

    @tf.function
    def next_only(iterator):
        ids, weights, gradients = next(iterator)
        return tf.add_n([tf.size(t) for t in tf.nest.flatten((ids, weights, gradients),
                                                              expand_composites=True)])

    functions = {
        "tf.function call with the class's ragged inputs, no ops": lambda: call_only(ids, weights),
        "tf.function taking next(iterator) only, no other op": lambda: next_only(iterator),
        ARGUMENT_FED["enqueue"]: lambda: enqueue(ids, weights),
        ARGUMENT_FED["lookup"]: lambda: lookup(ids, weights),
        ARGUMENT_FED["step"]: lambda: step(ids, weights, gradients),
        ITERATOR_FED["enqueue"]: lambda: fed[0](iterator),
        ITERATOR_FED["lookup"]: lambda: fed[1](iterator),
        ITERATOR_FED["step"]: lambda: fed[2](iterator),
    }
    if args.op_counts:
        for name, concrete in (("enqueue", enqueue.get_concrete_function(ids, weights)),
                               ("lookup", lookup.get_concrete_function(ids, weights)),
                               ("step", step.get_concrete_function(ids, weights, gradients))):
            counts = op_counts(concrete)
            print(f"{name}: {sum(counts.values())} ops: "
                  + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    from tf_sc_embedding.ops import preprocessing  # noqa: PLC0415
    with_kernels = not args.skip_ops and hasattr(preprocessing,
                                                 "convert_features_to_minibatch_splits")
    if with_kernels:   # a tree without the one-op preprocessing (an A/B base) lacks it
        kernels = ClassKernelsAlone(embedding, tf.nest.flatten(ids), tf.nest.flatten(weights),
                                    gradients)
        functions.update({
            "class kernels: ids to CSR buffers": kernels.preprocess,
            "class kernels: lookup": kernels.forward,
            "class kernels: lookup + fused Adagrad": kernels.forward_and_update,
        })
    if not args.skip_ops:
        # The op library without the class: one table per feature, as in bench/bench_ops.py.
        alone = OurPipeline(vocab, args.dim, args.batch, combiner=args.combiner,
                            max_ids_per_chip_per_sample=64, max_minibatches_per_sc=64)
        row_splits = [tf.constant(s) for s in batch.row_splits]
        flat_ids = [tf.constant(i) for i in batch.ids]
        flat_weights = [tf.constant(w) for w in batch.weights]
        csrs = alone.preprocess(row_splits, flat_ids, flat_weights)
        functions.update({
            "ops preprocessing (COO -> splits -> CSR)":
                lambda: alone.preprocess(row_splits, flat_ids, flat_weights),
            "ops forward": lambda: alone.forward(csrs),
            "ops forward + fused Adagrad": lambda: alone.forward_and_update(csrs, upstream),
        })
    for fn in functions.values():   # trace and warm up
        fn()
        fn()
    samples, cpu = collections.defaultdict(list), collections.defaultdict(list)
    for _ in range(args.rounds):
        for name, fn in functions.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()   # a tf.function call on CPU returns when its ops have run
            samples[name].append((time.perf_counter() - start) * 1e3)
            cpu[name].append((time.process_time() - start_cpu) * 1e3)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    print("\n| phase | median ms | interquartile range ms | min ms | median CPU ms (all threads) |"
          "\n|---|---:|---:|---:|---:|")
    for name, s in samples.items():
        q = statistics.quantiles(s, n=4)
        print(f"| {name} | {medians[name]:.1f} | {q[0]:.1f}-{q[2]:.1f} | {min(s):.1f} | "
              f"{statistics.median(cpu[name]):.1f} |")
    if with_kernels:
        k_pre = medians["class kernels: ids to CSR buffers"]
        k_fwd = medians["class kernels: lookup"]
        k_upd = medians["class kernels: lookup + fused Adagrad"]
        call = medians["tf.function call with the class's ragged inputs, no ops"]
        print("\nThe class against its own kernels (stacked tables, inputs computed beforehand; "
              f"the class's times include {call:.1f} ms of calling a tf.function with 52 ragged "
              "tensors, the kernels' do not):")
        kernels_ms = {"enqueue": k_pre, "lookup": k_pre + k_fwd, "step": k_pre + k_upd}
        for feed, names in (("arguments", ARGUMENT_FED), ("next(iterator)", ITERATOR_FED)):
            print(f"\nThe class fed with {feed}:\n\n"
                  "| phase | class ms | its kernels ms | class / kernels |\n|---|---:|---:|---:|")
            for phase, theirs in kernels_ms.items():
                ours = medians[names[phase]]
                print(f"| {phase} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
        pull = medians["tf.function taking next(iterator) only, no other op"]
        print(f"\nThe next(iterator)-fed class without the input pipeline's {pull:.1f} ms (a "
              "tf.function that only takes the next batch), against its kernels:\n\n"
              "| phase | class - next() ms | its kernels ms | ratio |\n|---|---:|---:|---:|")
        for phase, theirs in kernels_ms.items():
            ours = medians[ITERATOR_FED[phase]] - pull
            print(f"| {phase} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
    if not args.skip_ops:
        print("\nThe class against the per-table op pipeline of bench_ops.py:")
        pre = medians["ops preprocessing (COO -> splits -> CSR)"]
        fwd = medians["ops forward"]
        upd = medians["ops forward + fused Adagrad"]
        print("\n| phase | class ms | sum of the ops ms | class / ops |\n|---|---:|---:|---:|")
        for label, ours, theirs in (
                ("enqueue vs preprocessing", medians[ARGUMENT_FED["enqueue"]], pre),
                ("lookup vs preprocessing + forward",
                 medians[ARGUMENT_FED["lookup"]], pre + fwd),
                ("step vs preprocessing + forward + Adagrad",
                 medians[ARGUMENT_FED["step"]], pre + upd)):
            print(f"| {label} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")
    if args.trace:
        tf.profiler.experimental.start(args.trace)
        for _ in range(3):
            step(ids, weights, gradients)
        tf.profiler.experimental.stop()
        print(f"trace of 3 class steps written to {args.trace}")


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()
