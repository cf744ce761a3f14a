"""Subprocess entry points of the checkpoint tests (a fresh process per call).

Run from the repository root as `python -m tests.checkpoint.worker <command> ...`:

  resume <ckpt_prefix> <replicas> <stacking 0/1> <first_step> <steps> <out.npz>
      restores the checkpoint into a fresh embedding (before build), saves the restored state to
      <out.npz>.restored.npz, trains `steps` more global steps and saves the state to <out.npz>.
  crash <dir> <rows>
      saves checkpoint 1 of a large table with CheckpointManager, writes <dir>/state1.npz, prints
      SAVING and starts saving checkpoint 2 (different values): the test kills it mid-save.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import devices  # noqa: E402
from tests.checkpoint import ckpt_lib  # noqa: E402


def resume(prefix, replicas, stacking, first_step, steps, out):
    devices.configure()
    strategy, embedding = ckpt_lib.make_embedding(int(replicas), bool(int(stacking)), build=False)
    status = tf.train.Checkpoint(embedding=embedding).restore(prefix)
    embedding.build(per_replica_batch_size=ckpt_lib.GLOBAL_BATCH // int(replicas))
    status.assert_consumed()
    ckpt_lib.save_state(out + ".restored.npz", embedding)
    first = int(first_step)
    ckpt_lib.Trainer(strategy, embedding).run(range(first, first + int(steps)))
    ckpt_lib.save_state(out, embedding)


def crash(directory, rows):
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel
    E = tf.tpu.experimental.embedding
    table = E.TableConfig(vocabulary_size=int(rows), dim=64, name="big",
                          initializer=tf.keras.initializers.RandomUniform(seed=7))
    embedding = sce.TPUEmbeddingV2({"f": E.FeatureConfig(table=table)}, E.Adagrad(0.1))
    embedding.build(per_replica_batch_size=8)
    step = tf.Variable(1, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(embedding=embedding, step=step),
                                         directory, max_to_keep=3)
    manager.save()
    np.savez(os.path.join(directory, "state1.npz"), **ckpt_lib.state(embedding))
    for kinds in embedding.variables.values():
        for sharded in kinds.values():
            for v in sharded.shards:
                v.assign_add(tf.ones_like(v))
    step.assign(2)
    print("SAVING", flush=True)
    manager.save()
    print("SAVED", flush=True)


if __name__ == "__main__":
    {"resume": resume, "crash": crash}[sys.argv[1]](*sys.argv[2:])
