"""Streaming reader of click logs in the public Criteo format (display-ads challenge, Terabyte).

One sample per line, 40 tab-separated fields:

    label <TAB> I1 ... I13 <TAB> C1 ... C26

* ``label``: 0 or 1 (click).
* ``I1``-``I13``: integer counts, possibly negative (a few columns use -1/-2 as markers).
* ``C1``-``C26``: categorical values, each a hashed token written as 8 hexadecimal digits.

Any field except the label may be empty. Files are read line by line through `tf.data`
(`TextLineDataset`), plain or gzip-compressed, so a file is never loaded whole.

Preprocessing (`parse_lines`, vectorised over a batch of lines):

* **Integer features.** Empty -> 0; then ``log(1 + max(x, 0))`` (negative markers become 0), as
  the DLRM reference pipelines do. The result is the float32 ``dense`` input [batch, 13].
* **Categorical features.** A value is hashed into its table: ``1 + fingerprint(value) mod
  (V - 1)`` with `tf.strings.to_hash_bucket_fast`, where V is the table's vocabulary size.
  **Row 0 of every table is reserved for the empty (missing) value**, so "missing" has its own
  learned embedding and never collides with a real token. Each sample has exactly one id per
  feature; the ids come out as ragged [batch, None] int32 tensors (row length 1), the same
  structure as the built-in synthetic data.
  With ``raw_keys=True`` the values are kept as they are instead: ragged [batch, None]
  ``tf.string`` keys for open-vocabulary tables (``dynamic_vocabularies``,
  docs/dynamic_vocabulary.md), the empty (missing) value being a key like any other.
* **Label.** float32 [batch, 1].

Held-out data (`CriteoFiles.datasets`): either separate files (``eval_patterns``) or, without
them, a deterministic hash split of the training files: a line is held out when
``fingerprint(line) mod 1000 < 1000 * eval_fraction``. The split depends only on the line's bytes,
so it is the same on every run, for any file order and any batch size, and a training line is
never evaluated on.

To score raw rows with the serving export, hash the categorical strings the same way
(`hash_categorical`) and pass the resulting ids.
"""
import glob
import gzip
import os

import tensorflow as tf

NUM_INTEGER_FEATURES = 13
NUM_CATEGORICAL_FEATURES = 26
FEATURE_NAMES = tuple(f"C{i + 1}" for i in range(NUM_CATEGORICAL_FEATURES))
DENSE_NAMES = tuple(f"I{i + 1}" for i in range(NUM_INTEGER_FEATURES))
MISSING_ID = 0          # reserved row of every table for an empty categorical field
_SPLIT_BUCKETS = 1000   # resolution of the hash-based held-out split
_GZIP_MAGIC = b"\x1f\x8b"


def expand_paths(patterns):
    """Files named by `patterns` (paths or glob patterns), in the given order; globs sorted.

    Raises FileNotFoundError when a pattern matches nothing.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    files = []
    for pattern in patterns:
        pattern = os.fspath(pattern)
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
            [pattern] if os.path.isfile(pattern) else [])
        if not matches:
            raise FileNotFoundError(f"no Criteo data file matches {pattern!r}")
        files.extend(matches)
    return files


def compression_type(path):
    """"GZIP" for a gzip file (by its .gz/.gzip extension or its magic bytes), else ""."""
    if path.endswith((".gz", ".gzip")):
        return "GZIP"
    with open(path, "rb") as f:
        return "GZIP" if f.read(2) == _GZIP_MAGIC else ""


def line_dataset(patterns):
    """A `tf.data.Dataset` of the lines (tf.string) of all files, file after file."""
    files = expand_paths(patterns)
    dataset = None
    for path in files:
        lines = tf.data.TextLineDataset(path, compression_type=compression_type(path))
        dataset = lines if dataset is None else dataset.concatenate(lines)
    return dataset


def hash_categorical(values, vocabulary_size):
    """Table ids (int32) of categorical strings: MISSING_ID for "", else 1 + hash mod (V - 1)."""
    if vocabulary_size < 2:
        raise ValueError(f"a vocabulary needs at least 2 rows (one reserved), got "
                         f"{vocabulary_size}")
    values = tf.convert_to_tensor(values, tf.string)
    hashed = 1 + tf.strings.to_hash_bucket_fast(values, vocabulary_size - 1)
    return tf.cast(tf.where(tf.equal(values, ""), tf.constant(MISSING_ID, tf.int64), hashed),
                   tf.int32)


def transform_integers(values):
    """log(1 + max(x, 0)) of integer features (float32); missing values arrive here as 0."""
    return tf.math.log1p(tf.maximum(tf.cast(values, tf.float32), 0.0))


def parse_lines(lines, vocabulary_sizes, raw_keys=False):
    """Parses a 1-D batch of lines into ({"dense", "ids"}, labels); see the module docstring.

    Returns ``({"dense": float32 [n, 13], "ids": {C1..C26: ragged int32 [n, None]}},
    labels float32 [n, 1])`` (with raw_keys, the ids are the values as ragged tf.string keys).
    A line without exactly 40 fields is an InvalidArgumentError.
    """
    if len(vocabulary_sizes) != NUM_CATEGORICAL_FEATURES:
        raise ValueError(f"need {NUM_CATEGORICAL_FEATURES} vocabulary sizes, got "
                         f"{len(vocabulary_sizes)}")
    # Integers are parsed as float64 (exact for every count below 2^53, and tolerant of values
    # beyond int32); empty fields take the default.
    defaults = ([[0.0]] + [tf.constant([0.0], tf.float64)] * NUM_INTEGER_FEATURES +
                [[""]] * NUM_CATEGORICAL_FEATURES)
    columns = tf.io.decode_csv(lines, defaults, field_delim="\t", use_quote_delim=False)
    labels = tf.reshape(tf.cast(columns[0], tf.float32), [-1, 1])
    dense = transform_integers(tf.stack(columns[1:1 + NUM_INTEGER_FEATURES], axis=1))
    # Every line has exactly one value per categorical feature, so all 26 ragged tensors share
    # one row partition [0, 1, ..., n] and are valid by construction: building them unvalidated
    # keeps the parsing graph small (26 x ~60 assertion ops otherwise, traced per dataset).
    row_splits = tf.range(tf.size(labels, out_type=tf.int64) + 1, dtype=tf.int64)
    ids = {}
    for name, column, vocabulary in zip(FEATURE_NAMES, columns[1 + NUM_INTEGER_FEATURES:],
                                        vocabulary_sizes):
        ids[name] = tf.RaggedTensor.from_row_splits(
            column if raw_keys else hash_categorical(column, vocabulary), row_splits,
            validate=False)
    return {"dense": dense, "ids": ids}, labels


def _held_out(line, eval_fraction):
    bucket = tf.strings.to_hash_bucket_fast(line, _SPLIT_BUCKETS)
    return bucket < int(round(eval_fraction * _SPLIT_BUCKETS))


class CriteoFiles:
    """Criteo-format files as training and held-out `tf.data` pipelines for the DLRM job.

    Args:
      patterns: training files (paths or globs; plain or gzip).
      vocabulary_sizes: rows of the 26 tables (categorical values are hashed into them).
      eval_patterns: optional held-out files; without them a hash split of `patterns` holds out
        `eval_fraction` of the lines.
      raw_keys: keep the categorical values as string keys (open-vocabulary tables, which then
        hold `vocabulary_sizes` rows) instead of hashing them into the tables.
    Attributes `feature_names`, `dense_names` and `vocabulary_sizes` describe the model inputs
    (the same names as the built-in synthetic data).
    """

    def __init__(self, patterns, vocabulary_sizes, eval_patterns=None, eval_fraction=0.1,
                 raw_keys=False):
        self.vocabulary_sizes = tuple(int(v) for v in vocabulary_sizes)
        self.raw_keys = bool(raw_keys)
        self.feature_names = FEATURE_NAMES
        self.dense_names = DENSE_NAMES
        self.files = expand_paths(patterns)
        self.eval_files = expand_paths(eval_patterns) if eval_patterns else None
        if not self.eval_files and not 0 < eval_fraction < 1:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        self.eval_fraction = eval_fraction

    def _batched(self, lines, batch_size):
        sizes, raw_keys = self.vocabulary_sizes, self.raw_keys
        return (lines.batch(batch_size, drop_remainder=True)
                .map(lambda batch: parse_lines(batch, sizes, raw_keys),
                     num_parallel_calls=tf.data.AUTOTUNE))

    def datasets(self, batch_size, repeat_train=True, shuffle_buffer=0, seed=0):
        """(train, held_out) datasets of full batches ({"dense", "ids"}, labels).

        `train` repeats (epochs over the files) when `repeat_train`; lines are shuffled in a
        buffer of `shuffle_buffer` lines when it is positive. `held_out` is finite.
        """
        train_lines = line_dataset(self.files)
        if self.eval_files:
            eval_lines = line_dataset(self.eval_files)
        else:
            fraction = self.eval_fraction
            eval_lines = train_lines.filter(lambda line: _held_out(line, fraction))
            train_lines = train_lines.filter(
                lambda line: tf.logical_not(_held_out(line, fraction)))
        if shuffle_buffer > 0:
            train_lines = train_lines.shuffle(shuffle_buffer, seed=seed)
        if repeat_train:
            train_lines = train_lines.repeat()
        return (self._batched(train_lines, batch_size).prefetch(4),
                self._batched(eval_lines, batch_size).prefetch(4))


def write_lines(path, rows):
    """Writes rows (sequences of 40 field strings) as a Criteo file; gzip when path ends .gz."""
    text = "".join("\t".join(str(field) for field in row) + "\n" for row in rows)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        f.write(text)
