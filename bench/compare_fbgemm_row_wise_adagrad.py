"""Row-wise Adagrad through `TPUEmbeddingV2` against FBGEMM's CPU `EXACT_ROWWISE_ADAGRAD`, on
the same batches, step after step.

FBGEMM is never a dependency of this project: it runs in its own virtual environment (torch CPU
and fbgemm-gpu-cpu), given with --peer-python, through bench/peers/fbgemm_row_wise_adagrad.py,
which reads a batch and a state from a .npz file and writes the state after one
forward/backward step. This script trains the same tables with the same batches here, feeds
FBGEMM each step's starting state from its own previous step, and prints, per step, the largest
differences of the forward activations, the tables and the accumulators.

Workload: T tables of R rows and width D, sum pooling of 1 to 5 weighted ids per bag drawn
from a skewed distribution (ids repeat inside bags and across the batch), a random output
gradient. Both sides use float32; they sum the same terms in different orders. A --dim that is
not a multiple of 8 (FBGEMM needs a multiple of 4) makes our tables padded wider than dim, so the
comparison also covers the mean over the embedding's columns only.

    python bench/compare_fbgemm_row_wise_adagrad.py --peer-python /path/to/fbgemm-venv/bin/python
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tf_sc_embedding as sce  # noqa: E402

E = tf.tpu.experimental.embedding
PEER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers",
                           "fbgemm_row_wise_adagrad.py")


def steps_data(rng, tables, rows, dim, batch, steps):
    """Per step: (per table (ids per bag, weights per bag), output gradient [batch, tables, dim])."""
    out = []
    for _ in range(steps):
        bags = []
        for _ in range(tables):
            lengths = rng.integers(1, 6, batch)
            ids = [np.minimum(rng.zipf(1.3, n) - 1, rows - 1).astype(np.int64) for n in lengths]
            weights = [rng.uniform(0.25, 2.0, n).astype(np.float32) for n in lengths]
            bags.append((ids, weights))
        out.append((bags, 0.1 * rng.standard_normal((batch, tables, dim)).astype(np.float32)))
    return out


def ours(initial, accumulator, data, dim, lr, eps):
    tables, rows = initial.shape[:2]
    batch = len(data[0][0][0][0])
    configs = [E.TableConfig(vocabulary_size=rows, dim=dim, name=f"t{t}", combiner="sum",
                             initializer=tf.constant_initializer(initial[t]))
               for t in range(tables)]
    features = {f"f{t}": E.FeatureConfig(table=configs[t]) for t in range(tables)}
    embedding = sce.TPUEmbeddingV2(features, sce.RowWiseAdagrad(
        learning_rate=lr, initial_accumulator_value=accumulator, epsilon=eps))
    embedding.build(per_replica_batch_size=batch)
    results = []
    for bags, grad in data:
        ids = {f"f{t}": tf.ragged.constant(bags[t][0], dtype=tf.int64) for t in range(tables)}
        weights = {f"f{t}": tf.ragged.constant(bags[t][1], dtype=tf.float32)
                   for t in range(tables)}
        activations, preserved = embedding(ids, weights)
        embedding.apply_gradients({f"f{t}": tf.constant(grad[:, t]) for t in range(tables)},
                                  preserved)
        results.append((np.concatenate([activations[f"f{t}"].numpy() for t in range(tables)],
                                       axis=1),
                        np.stack([embedding.tables.read(f"t{t}") for t in range(tables)]),
                        np.stack([embedding.tables.read(f"t{t}", "accumulators")[:, 0]
                                  for t in range(tables)])))
    return results


def fbgemm(peer_python, initial, accumulator, data, lr, eps):
    tables, rows = initial.shape[:2]
    weights = initial.copy()
    accumulators = np.full((tables, rows), accumulator, np.float32)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for bags, grad in data:
            batch = len(bags[0][0])
            lengths = [len(bag) for t in range(tables) for bag in bags[t][0]]   # table-major
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            indices = np.concatenate([bag for t in range(tables) for bag in bags[t][0]])
            sample_weights = np.concatenate([w for t in range(tables) for w in bags[t][1]])
            np.savez(os.path.join(tmp, "in.npz"), weights=weights, accumulators=accumulators,
                     indices=indices, offsets=offsets, per_sample_weights=sample_weights,
                     grad_output=grad.reshape(batch, -1), learning_rate=np.float32(lr),
                     eps=np.float32(eps), pooling=np.array("sum"))
            subprocess.run([peer_python, PEER_SCRIPT, os.path.join(tmp, "in.npz"),
                            os.path.join(tmp, "out.npz")], check=True, timeout=600)
            with np.load(os.path.join(tmp, "out.npz")) as out:
                weights, accumulators = out["weights"], out["accumulators"]
                results.append((out["forward"], weights.copy(), accumulators.copy()))
    return results


def relative(a, b, scale):
    """The largest difference, relative to the largest magnitude of `scale` (nan if 0)."""
    largest = float(np.max(np.abs(scale)))
    return float(np.max(np.abs(a - b))) / largest if largest > 0 else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer-python", required=True,
                        help="python of a virtual environment with torch and fbgemm-gpu-cpu")
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--epsilon", type=float, default=1e-8)
    parser.add_argument("--initial-accumulator", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    initial = rng.uniform(-0.5, 0.5, (args.tables, args.rows, args.dim)).astype(np.float32)
    data = steps_data(rng, args.tables, args.rows, args.dim, args.batch, args.steps)
    mine = ours(initial, args.initial_accumulator, data, args.dim, args.learning_rate,
                args.epsilon)
    theirs = fbgemm(args.peer_python, initial, args.initial_accumulator, data,
                    args.learning_rate, args.epsilon)
    print(f"{args.tables} tables x {args.rows} rows x dim {args.dim}, batch {args.batch}, "
          f"sum of 1-5 weighted ids per bag, lr {args.learning_rate}, eps {args.epsilon}, "
          f"initial accumulator {args.initial_accumulator}")
    print("Differences relative to the largest value (forward, accumulators) or to the largest "
          "change of a table entry since the start (tables):")
    print("step | forward | tables (max abs) | accumulators | rows moved")
    for step, ((f1, w1, a1), (f2, w2, a2)) in enumerate(zip(mine, theirs)):
        moved = int(np.sum(np.any(w2 != initial, axis=2)))
        print(f"{step} | {relative(f1, f2, f2):.2e} | {relative(w1, w2, w2 - initial):.2e} "
              f"({np.max(np.abs(w1 - w2)):.2e}) | {relative(a1, a2, a2):.2e} | {moved}")


if __name__ == "__main__":
    main()
