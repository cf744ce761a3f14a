"""Writes the main job's teacher-labelled data as Criteo-format click logs, for runs with --data.

Each sample becomes one line: the teacher's label, the 13 integer counts behind the dense
features, and per categorical feature its first id (empty when the sample has none) written as 8
hexadecimal digits of a fixed 32-bit mix of (feature, id), as the public logs write hashed
tokens. Distinct (feature, id) pairs give distinct tokens within a feature, so the hashed run
(ids hashed into the tables) and the raw-key run (--raw-keys, one row per admitted token) read
the same information.

Usage: python bench/write_teacher_criteo_files.py OUT_DIR [--train 400000] [--test 65536]
       [--vocabulary-scale 0.01] [--seed 0]
writes OUT_DIR/train.gz and OUT_DIR/test.gz.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_sc_embedding.data import criteo_files  # noqa: E402
from tf_sc_embedding.data.teacher import TeacherLabelledData  # noqa: E402


def token(feature, ids):
    """8-hex-digit tokens of ids of one feature (a bijection of 32-bit values per feature)."""
    mixed = (ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(feature * 40503 + 17))
    return [f"{int(v) & 0xFFFFFFFF:08x}" for v in mixed]


def rows_of(split):
    n = len(split)
    counts = np.rint(np.expm1(split.dense)).astype(np.int64)
    columns = []
    for f, (splits, ids) in enumerate(zip(split.row_splits, split.ids)):
        has = np.diff(splits) > 0
        first = np.where(has, ids[np.minimum(splits[:-1], len(ids) - 1)], 0)
        tokens = token(f, first)
        columns.append([t if h else "" for t, h in zip(tokens, has)])
    for i in range(n):
        yield ([str(int(split.labels[i]))] + [str(int(c)) for c in counts[i]] +
               [columns[f][i] for f in range(len(columns))])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=400_000)
    parser.add_argument("--test", type=int, default=65_536)
    parser.add_argument("--vocabulary-scale", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    data = TeacherLabelledData(vocabulary_scale=args.vocabulary_scale, seed=args.seed)
    for name, count, test in (("train.gz", args.train, False), ("test.gz", args.test, True)):
        criteo_files.write_lines(os.path.join(args.out_dir, name),
                                 list(rows_of(data.split(count, test=test))))
        print(f"wrote {count} lines to {os.path.join(args.out_dir, name)}")


if __name__ == "__main__":
    main()
