"""Randomized fuzzer of the delta reader (docs/deltas.md): damaged deltas never crash the process,
never fail with anything but the reader's errors, and never write part of an update.

A small embedding (a fixed table and an open vocabulary of string keys, delta tracking on) trains
a few steps after a checkpoint and a serving export, and writes a delta with optimizer state. Each case copies the delta twice,
damages it (a file truncated, bytes flipped, a file removed, chain.txt edited, a manifest field
set to a hostile value, or an array replaced by one of another dtype or shape, the manifest's
sha256 and the done marker rewritten to match so that the damage reaches the checks behind
them) and applies it:

* to the embedding (restored to the checkpoint): it must succeed or raise DeltaError / ValueError,
  and a failure must leave every table, slot and key as they were;
* to the serving model: it must succeed or raise a tf.errors.OpError, and a failure must leave
  its tables and its position as they were.

Cases are deterministic functions of (seed, index). Usage:
    python fuzz/delta_fuzzer.py [--seconds T | --cases N] [--seed S]
Exit status: 0 when every case behaved, 1 otherwise (the case is printed).
"""
import argparse
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_sc_embedding as sce  # noqa: E402
from tf_sc_embedding.deltas import delta_format as fmt  # noqa: E402

E = tf.tpu.experimental.embedding
HOSTILE = [None, -1, 0, 1, 2**31, 2**62, 2**63 - 1, -2**63, 1.5, "x", "", [], {}, True, "a" * 300]


def make_embedding():
    fixed = E.TableConfig(vocabulary_size=64, dim=4, name="fixed", combiner="sum")
    words = E.TableConfig(vocabulary_size=16, dim=4, name="words", combiner="mean")
    return sce.TPUEmbeddingV2(
        {"f": E.FeatureConfig(table=fixed, name="f"), "w": E.FeatureConfig(table=words, name="w")},
        E.Adagrad(0.1), delta_tracking=True, dynamic_vocabularies={"words": sce.DynamicVocabulary(
            tf.string, admission_threshold=2, steps_to_live=2, pending_capacity=64)})


def train(embedding, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        batch = {"f": tf.ragged.constant(rng.integers(0, 64, (8, 2)).tolist(), tf.int64),
                 "w": tf.ragged.constant([[b"k%d" % k for k in rng.integers(0, 24, 2)]
                                          for _ in range(8)], tf.string)}
        activations, preserved = embedding(batch)
        embedding.apply_gradients({k: tf.ones_like(a) for k, a in activations.items()},
                                  preserved)


def state_of(embedding):
    out = {f"{t}/{k}": v for t, kinds in embedding.logical_tables(include_slots=True).items()
           for k, v in kinds.items()}
    out.update({f"words/{k}": np.asarray(v)
                for k, v in embedding.dynamic_tables.logical_state("words").items()})
    out["position"] = embedding.deltas.position
    return out


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class Fixture:
    def __init__(self, directory):
        self.directory = directory
        embedding = make_embedding()
        train(embedding, 2, 0)
        self.checkpoint = tf.train.Checkpoint(embedding=embedding).save(
            os.path.join(directory, "ckpt"))
        serving_dir = os.path.join(directory, "serving")
        embedding.export_serving(serving_dir)
        train(embedding, 3, 1)
        self.recovery = embedding.export_delta(os.path.join(directory, "r"),
                                               include_optimizer_state=True)
        self.target = make_embedding()
        self.target.build(per_replica_batch_size=8)
        self.reset()
        # The serving model was exported before the delta, so the delta follows it (it
        # ignores the optimizer state the delta also carries).
        self.serving = tf.saved_model.load(serving_dir)

    def reset(self):
        tf.train.Checkpoint(embedding=self.target).restore(self.checkpoint)


def _rewrite(part_dir, name, data):
    """Writes file `name` of a part and makes the manifest and done marker vouch for it."""
    with open(os.path.join(part_dir, name), "wb") as f:
        f.write(data)
    manifest_path = os.path.join(part_dir, fmt.MANIFEST)
    with open(manifest_path) as f:
        manifest = json.load(f)
    if name != fmt.MANIFEST and name in manifest["files"]:
        manifest["files"][name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    text = json.dumps(manifest).encode() if name != fmt.MANIFEST else data
    with open(manifest_path, "wb") as f:
        f.write(text)
    with open(part_dir + ".done", "w") as f:
        f.write(hashlib.sha256(text).hexdigest())


def damage(delta, rng):
    """Damages a copy of a delta in place; returns a description."""
    (part,) = [d for d in os.listdir(delta) if not d.endswith(".done")]
    part_dir = os.path.join(delta, part)
    files = sorted(os.listdir(part_dir))
    name = rng.choice(files)
    path = os.path.join(part_dir, name)
    kind = rng.choice(["truncate", "flip", "remove", "chain", "manifest", "array"])
    if kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(rng.randrange(size) if size else 0)
        return f"truncate {name}"
    if kind == "flip":
        data = bytearray(open(path, "rb").read())
        for _ in range(rng.randint(1, 4)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        open(path, "wb").write(bytes(data))
        return f"flip {name}"
    if kind == "remove":
        target = rng.choice([path, part_dir + ".done"])
        os.remove(target)
        return f"remove {os.path.basename(target)}"
    if kind == "chain":
        lines = open(os.path.join(part_dir, fmt.CHAIN)).read().split("\n")
        i = rng.randrange(len(lines))
        words = lines[i].split(" ")
        words[rng.randrange(len(words))] = rng.choice(["0", "x", "-1", "99999999999", ""])
        lines[i] = " ".join(words)
        open(os.path.join(part_dir, fmt.CHAIN), "w").write("\n".join(lines))
        return f"chain line {i}"
    manifest = json.load(open(os.path.join(part_dir, fmt.MANIFEST)))
    if kind == "manifest":
        table = rng.choice(sorted(manifest["tables"]))
        where = rng.choice([manifest, manifest["tables"][table]])
        key = rng.choice(sorted(where))
        where[key] = rng.choice(HOSTILE)
        _rewrite(part_dir, fmt.MANIFEST, json.dumps(manifest).encode())
        return f"manifest {key}"
    arrays = [f for f in files if f.endswith(".npy")]
    name = rng.choice(arrays)
    length = rng.choice([0, 1, 3, 17, 1000])
    dtype = rng.choice([np.uint8, np.int64, np.float32, np.float16, np.uint16, np.int32])
    shape = rng.choice([(length,), (length, 4), (length, 3), (length, 1)])
    value = np.frombuffer(np.random.default_rng(rng.randrange(1 << 30)).bytes(
        int(np.prod(shape)) * np.dtype(dtype).itemsize), dtype).reshape(shape)
    buffer = io.BytesIO()
    np.save(buffer, value)
    _rewrite(part_dir, name, buffer.getvalue())
    return f"array {name} -> {np.dtype(dtype).name}{shape}"


OUTCOMES = {"applied": 0, "refused": 0}


def run_case(fixture, seed, index):
    rng = random.Random(f"{seed}/{index}")
    copy = tempfile.mkdtemp(dir=fixture.directory)
    problems = []
    for apply in ("embedding", "serving"):
        source = fixture.recovery
        delta = os.path.join(copy, apply, os.path.basename(source))
        shutil.copytree(source, delta)
        what = damage(delta, rng)
        if apply == "embedding":
            before = state_of(fixture.target)
            try:
                fixture.target.apply_delta(delta)
                OUTCOMES["applied"] += 1
                fixture.reset()
            except (fmt.DeltaError, ValueError):
                OUTCOMES["refused"] += 1
                if not same(state_of(fixture.target), before):
                    problems.append(f"{what}: the embedding changed although the delta failed")
            except Exception:   # pylint: disable=broad-except
                problems.append(f"{what}: unexpected {traceback.format_exc(limit=3)}")
        else:
            tables = {k: v.numpy() for k, v in fixture.serving.tables.items()}
            position = fixture.serving.delta_position.numpy()
            try:
                fixture.serving.apply_delta(delta)
                OUTCOMES["applied"] += 1
                fixture.serving.delta_position.assign(position)   # let later cases follow it
            except tf.errors.OpError:
                OUTCOMES["refused"] += 1
                changed = [k for k, v in fixture.serving.tables.items()
                           if not np.array_equal(v.numpy(), tables[k])]
                if changed or fixture.serving.delta_position.numpy() != position:
                    problems.append(f"{what}: the serving model changed although the delta "
                                    f"failed ({changed})")
            except Exception:   # pylint: disable=broad-except
                problems.append(f"{what}: unexpected {traceback.format_exc(limit=3)}")
    shutil.rmtree(copy, ignore_errors=True)
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cases", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="delta_fuzzer_")
    try:
        fixture = Fixture(directory)
        started, index, failed = time.time(), 0, 0
        while (index < args.cases) if args.cases else (time.time() - started < args.seconds):
            for problem in run_case(fixture, args.seed, index):
                print(f"case {index} (seed {args.seed}): {problem}", flush=True)
                failed += 1
            index += 1
        print(f"delta fuzzer: {index} cases ({OUTCOMES['applied']} damaged deltas applied, "
              f"{OUTCOMES['refused']} refused), {failed} problems")
        return 1 if failed else 0
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
