"""Memory of the tables per optimizer and row dtype: bytes per row of parameters plus slots, and the peak RSS of
`build()`, of training steps and of a checkpoint save, through `TPUEmbeddingV2`.

Workload: the 26 Criteo-like tables capped at --cap rows each, dim 32, batch 4096, weighted
ragged ids, 1 replica. Each optimizer runs in a fresh child process:

  bytes per row     (parameters + slots of every stacked table variable) / logical rows, so the
                    layout's padding rows and columns count against the user's rows
  build peak        highest RSS while `build()` creates and initializes the variables
  step peak         highest RSS over --calls training steps (after two warm-up steps)
  save peak         highest RSS while `tf.train.Checkpoint.save` writes the tables
  RSS is sampled every millisecond (bench_memory.PeakSampler).

    python bench/bench_table_memory.py [--cap 4000000] [--optimizers adagrad,row_wise_adagrad:bfloat16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_memory import PeakSampler, rss_bytes  # noqa: E402

# optimizer[:table dtype]
CONFIGS = ("adagrad", "row_wise_adagrad", "row_wise_adagrad:bfloat16", "row_wise_adagrad:float16")
OPTIMIZERS = ("adagrad", "row_wise_adagrad")
MB = 2 ** 20


def make_optimizer(name):
    import tensorflow as tf  # noqa: PLC0415
    import tf_sc_embedding as sce  # noqa: PLC0415
    if name == "adagrad":
        return tf.tpu.experimental.embedding.Adagrad(learning_rate=0.05)
    if name == "row_wise_adagrad":
        return sce.RowWiseAdagrad(learning_rate=0.05)
    raise ValueError(f"unknown optimizer {name!r}; known: {OPTIMIZERS}")


def child(config, cap, calls, batch_size):
    name, _, dtype = config.partition(":")
    dtype = dtype or "float32"
    import tensorflow as tf  # noqa: PLC0415
    import tf_sc_embedding as sce  # noqa: PLC0415
    from common import ragged_features  # noqa: PLC0415
    from tf_sc_embedding.data import CriteoLikeWorkload  # noqa: PLC0415

    E = tf.tpu.experimental.embedding
    vocab = [min(v, cap) for v in CriteoLikeWorkload().vocabulary_sizes]
    ids, weights = ragged_features(CriteoLikeWorkload(vocabulary_sizes=vocab).batch(batch_size))
    gradients = {f"f{i}": tf.random.stateless_normal([batch_size, 32], seed=[7, i])
                 for i in range(len(vocab))}
    tables = [E.TableConfig(vocabulary_size=v, dim=32, name=f"t{i}", combiner="sum",
                            initializer=tf.initializers.RandomUniform(-0.05, 0.05, seed=i))
              for i, v in enumerate(vocab)]
    embedding = sce.TPUEmbeddingV2({f"f{i}": E.FeatureConfig(table=t)
                                    for i, t in enumerate(tables)}, make_optimizer(name),
                                   table_dtypes={t.name: dtype for t in tables})
    before_build = rss_bytes()
    with PeakSampler() as build:
        embedding.build(per_replica_batch_size=batch_size)
    variables = embedding.storage.local_variables()
    stored = sum(v.shape.num_elements() * v.dtype.size for v in variables)

    @tf.function
    def step(ids, weights, gradients):
        _, preserved = embedding.embedding_lookup(ids, weights)
        embedding.apply_gradients(gradients, preserved)

    step(ids, weights, gradients)
    step(ids, weights, gradients)
    with PeakSampler() as steps:
        for _ in range(calls):
            step(ids, weights, gradients)
    with tempfile.TemporaryDirectory() as tmp:
        before_save = rss_bytes()
        with PeakSampler() as save:
            tf.train.Checkpoint(embedding=embedding).save(os.path.join(tmp, "ckpt"))
    return {"optimizer": config, "rows": sum(vocab), "bytes_per_row": stored / sum(vocab),
            "stored_mb": stored / MB, "before_build_mb": before_build / MB,
            "build_peak_mb": build.peak / MB, "step_peak_mb": steps.peak / MB,
            "before_save_mb": before_save / MB, "save_peak_mb": save.peak / MB}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=4_000_000)
    parser.add_argument("--optimizers", default=",".join(CONFIGS),
                        help="optimizer[:table dtype], comma-separated")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--child", metavar="OPTIMIZER")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.cap, args.calls, args.batch)))
        return
    rows = []
    for name in args.optimizers.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", name, "--cap", str(args.cap),
                              "--calls", str(args.calls), "--batch", str(args.batch)],
                             capture_output=True, text=True, timeout=3600, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    print(f"\n26 tables capped at {args.cap:,} rows ({rows[0]['rows']:,} rows), dim 32\n")
    print("| optimizer | bytes per row (tables + slots) | tables + slots MB | RSS before build "
          "MB | build peak MB | step peak MB | RSS before save MB | save peak MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['optimizer']} | {r['bytes_per_row']:.1f} | {r['stored_mb']:.0f} | "
              f"{r['before_build_mb']:.0f} | {r['build_peak_mb']:.0f} | {r['step_peak_mb']:.0f} | "
              f"{r['before_save_mb']:.0f} | {r['save_peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
