"""The Criteo click-log reader (tf_sc_embedding.data.criteo_files): parsing of hand-written rows,
plain and gzip files, globs, and the hash-based held-out split."""
import gzip
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_sc_embedding.data import criteo_files  # noqa: E402
from tf_sc_embedding.data.criteo_files import (  # noqa: E402
    FEATURE_NAMES, MISSING_ID, NUM_CATEGORICAL_FEATURES, CriteoFiles, parse_lines)


def row(label, integers, categoricals):
    return [str(label)] + [str(x) for x in integers] + list(categoricals)


INTEGERS = ["5", "", "-2", "0", "1", "99", "", "", "3", "7", "", "1000000", "2"]
CATEGORICALS = ["68fd1e64", "", "a8cd5504"] + [f"{i:08x}" for i in range(3, 24)] + ["", ""]
assert len(CATEGORICALS) == NUM_CATEGORICAL_FEATURES


def test_parses_a_hand_written_row():
    line = "\t".join(row(1, INTEGERS, CATEGORICALS))
    # Vocabulary of 2 rows: row 0 is reserved for "", every non-empty value hashes to row 1.
    sizes = [2] * NUM_CATEGORICAL_FEATURES
    features, labels = parse_lines(tf.constant([line, line.replace("1\t5\t", "0\t\t", 1)]),
                                   sizes)
    np.testing.assert_array_equal(labels.numpy(), [[1.0], [0.0]])
    expected = [math.log(1 + max(float(x or 0), 0)) for x in INTEGERS]
    assert expected[:4] == [math.log(6), 0.0, 0.0, 0.0]
    np.testing.assert_allclose(features["dense"].numpy()[0], expected, rtol=1e-6)
    assert features["dense"].numpy()[1, 0] == 0.0          # the empty I1 of the second line
    for name, value in zip(FEATURE_NAMES, CATEGORICALS):
        ids = features["ids"][name]
        assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
        assert ids.to_list() == [[0 if value == "" else 1]] * 2, name


def test_hashes_into_the_vocabulary_with_a_reserved_missing_row():
    values = tf.constant(["68fd1e64", "", "a8cd5504", "68fd1e64"])
    ids = criteo_files.hash_categorical(values, 1000).numpy()
    expected = 1 + tf.strings.to_hash_bucket_fast(values, 999).numpy()
    assert ids[1] == MISSING_ID == 0
    assert ids[0] == ids[3] == expected[0] and ids[2] == expected[2]
    assert all(1 <= i < 1000 for i in ids[[0, 2, 3]])
    with pytest.raises(ValueError):
        criteo_files.hash_categorical(values, 1)


def test_rejects_a_line_with_missing_fields():
    with pytest.raises(tf.errors.InvalidArgumentError):
        parse_lines(tf.constant(["1\t2\t3"]), [10] * NUM_CATEGORICAL_FEATURES)


def _rows(n, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        integers = ["" if rng.random() < 0.2 else str(rng.integers(-2, 500)) for _ in range(13)]
        cats = ["" if rng.random() < 0.2 else f"{rng.integers(0, 50):08x}" for _ in range(26)]
        rows.append(row(int(rng.random() < 0.3), integers, cats))
    return rows


def test_files_globs_gzip_and_the_held_out_split(tmp_path):
    plain, zipped = str(tmp_path / "day_0"), str(tmp_path / "day_1.gz")
    criteo_files.write_lines(plain, _rows(150, 0))
    criteo_files.write_lines(zipped, _rows(130, 1))
    hidden_gzip = str(tmp_path / "day_2")                 # gzip without the extension
    with open(zipped, "rb") as src, open(hidden_gzip, "wb") as dst:
        dst.write(src.read())
    assert criteo_files.compression_type(plain) == ""
    assert criteo_files.compression_type(zipped) == "GZIP"
    assert criteo_files.compression_type(hidden_gzip) == "GZIP"
    assert criteo_files.expand_paths([plain, str(tmp_path / "*.gz")]) == [plain, zipped]
    with pytest.raises(FileNotFoundError):
        criteo_files.expand_paths([str(tmp_path / "nothing*")])

    lines = [x.numpy() for x in criteo_files.line_dataset([plain, zipped, hidden_gzip])]
    assert len(lines) == 410
    with gzip.open(zipped, "rb") as f:
        assert lines[150:280] == f.read().splitlines()

    data = CriteoFiles([plain, zipped], [64] * 26, eval_fraction=0.25)
    train, held_out = data.datasets(batch_size=8, repeat_train=False)
    train_labels = sum(int(y.shape[0]) for _, y in train)
    held_labels = sum(int(y.shape[0]) for _, y in held_out)
    # Full batches only; every line goes to exactly one side, about a quarter held out.
    assert train_labels % 8 == 0 and held_labels % 8 == 0
    assert 280 - 16 < train_labels + held_labels <= 280
    assert 30 < held_labels < 110
    features, labels = next(iter(train))
    assert features["dense"].shape == (8, 13) and labels.shape == (8, 1)
    assert features["ids"]["C26"].shape[0] == 8

    # A shuffle buffer reorders the training lines but keeps every one of them.
    shuffled, _ = data.datasets(batch_size=8, repeat_train=False, shuffle_buffer=64, seed=1)
    ordered = np.concatenate([f["dense"].numpy() for f, _ in train])
    mixed = np.concatenate([f["dense"].numpy() for f, _ in shuffled])
    every_line, _ = data.datasets(batch_size=1, repeat_train=False)
    # (rounded: log1p of a batch may differ from that of a single value in the last bit)
    every_row = {tuple(row) for f, _ in every_line for row in np.round(f["dense"].numpy(), 4)}
    assert len(mixed) == len(ordered) and not np.array_equal(mixed, ordered)
    assert {tuple(row) for row in np.round(mixed, 4)} <= every_row

    # Separate held-out files instead of the split.
    data = CriteoFiles([plain], [64] * 26, eval_patterns=[str(tmp_path / "*.gz")])
    train, held_out = data.datasets(batch_size=10, repeat_train=False)
    assert sum(int(y.shape[0]) for _, y in train) == 150
    assert sum(int(y.shape[0]) for _, y in held_out) == 130
