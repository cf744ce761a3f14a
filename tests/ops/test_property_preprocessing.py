"""Property tests: every preprocessing op against the numpy reference on random inputs.

Covers ragged / sparse / dense input, scalar and per-id weights (including zero and negative
weights), empty samples, heavy duplicates (tiny id ranges), num_sc_per_chip in {1, 2, 4, 8},
num_replica in {1, 2, 4}, all combiners, random stacking transforms, and chains of ops
(coo -> minibatch splits -> CSR; list -> sort -> CSR-wrapped) compared end to end, both with the
reference chain (bit-exact) and with a direct, order-free computation of what the buffers mean.

The number of examples per test is SCE_PREPROCESSING_EXAMPLES (default 300).
"""
import collections
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tf_sc_embedding import ops

from tests.reference import preprocessing as ref  # noqa: E402

PROPERTY = settings(
    max_examples=int(os.environ.get("SCE_PREPROCESSING_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

COMBINERS = st.sampled_from(["sum", "mean", "sqrtn"])
# Magnitudes stay >= 2^-10 so no product is subnormal: TensorFlow runs kernels with denormals
# flushed to zero, numpy does not.
WEIGHT = st.one_of(st.sampled_from([1.0, 0.5, 2.0, 3.0, 0.1, 0.0, -1.0]),
                   st.builds(lambda sign, x: sign * x, st.sampled_from([-1.0, 1.0]),
                             st.floats(2.0 ** -10, 4, width=32)))
POSITIVE_WEIGHT = st.one_of(st.sampled_from([1.0, 0.5, 2.0, 3.0]),
                            st.floats(0.25, 4, width=32))
# Small vocabularies make duplicates (adjacent and not) frequent.
VOCAB = st.sampled_from([1, 2, 3, 5, 8, 17, 64, 100, 1000])


def assert_same(got, want, what=""):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want, err_msg=what)


def numpy_all(tensors):
    return [t.numpy() for t in tensors]


Feature = collections.namedtuple("Feature", "form index values weights lengths")


@st.composite
def features(draw, sample_count, vocab, max_len=4, weight=WEIGHT,
             forms=("ragged", "sparse", "dense")):
    """One feature's ids for `sample_count` samples in one of the three input forms."""
    form = draw(st.sampled_from(forms))
    if form == "dense":
        lengths = [0 if draw(st.integers(0, 9)) == 0 else 1] * sample_count
    else:
        lengths = draw(st.lists(st.integers(0, max_len), min_size=sample_count,
                                max_size=sample_count))
    n = sum(lengths)
    values = np.array(draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n)), np.int32)
    if draw(st.booleans()):
        weights = np.float32(draw(weight))
    else:
        weights = np.array(draw(st.lists(weight, min_size=n, max_size=n)), np.float32)
    if form == "dense":
        index = np.zeros([0], np.int32)
    elif form == "ragged":
        index = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    else:
        index = np.array([[r, j] for r, k in enumerate(lengths) for j in range(k)],
                         np.int32).reshape(-1, 2)
    return Feature(form, index, values, weights, lengths)


@st.composite
def big_features(draw, sample_count, vocab, max_len=40):
    """Like `features` but long (drawn with numpy from a seed): exercises the radix-sort paths,
    which the op only takes for 64 or more ids."""
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    form = draw(st.sampled_from(["ragged", "sparse"]))
    lengths = rng.integers(0, max_len + 1, sample_count).tolist()
    n = sum(lengths)
    span = min(vocab, draw(st.sampled_from([3, 40, 2 ** 31 - 1])))
    values = rng.integers(0, span, n).astype(np.int32)
    weights = rng.choice(np.float32([0.5, 1, 2, 3]), n) if draw(st.booleans()) else np.float32(1)
    if form == "ragged":
        index = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    else:
        index = np.array([[r, j] for r, k in enumerate(lengths) for j in range(k)],
                         np.int32).reshape(-1, 2)
    return Feature(form, index, values, weights, lengths)


def direct_weights(feature, combiner):
    """{(sample, id): combined weight} summed over all tokens, order-free (float64)."""
    rows = np.repeat(np.arange(len(feature.lengths)), feature.lengths)
    w = np.broadcast_to(feature.weights, feature.values.shape).astype(np.float64)
    totals = collections.defaultdict(float)
    for r, x in zip(rows, w):
        totals[r] += x if combiner == "mean" else x * x
    out = collections.defaultdict(float)
    for r, c, x in zip(rows, feature.values, w):
        scale = 1.0
        if combiner == "mean":
            scale = 1 / totals[r]
        elif combiner == "sqrtn":
            scale = 1 / np.sqrt(totals[r])
        out[(int(r), int(c))] += x * scale
    return out


def expect_failure_or_compare(run_op, run_ref):
    """Runs the reference; if it says the op must fail, checks InvalidArgument, else returns both."""
    try:
        want = run_ref()
    except ref.OpMustFail as e:
        event("must fail: " + re.sub(r"\d+", "N", str(e)))
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_op()
        return None, None
    return run_op(), want


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#coo-conversion ConvertToCooTensor


@PROPERTY
@given(st.data())
def test_convert_to_coo_tensor(data):
    sample_count = data.draw(st.integers(1, 12))
    vocab = data.draw(VOCAB)
    f = data.draw(features(sample_count, vocab))
    combiner = data.draw(COMBINERS)
    vocabulary_size = data.draw(st.sampled_from([-1, vocab]))
    got = numpy_all(ops.convert_to_coo_tensor(
        f.index, f.values, f.weights, sample_count=sample_count, combiner=combiner,
        vocabulary_size=vocabulary_size, table_name="t", feature_name="f"))
    want = ref.convert_to_coo_tensor(f.index, f.values, f.weights, sample_count, combiner)
    for name, g, w in zip(("row_ids", "col_ids", "gains"), got, want):
        assert_same(g, w, name)


@PROPERTY
@given(st.data())
def test_ragged_sparse_and_dense_agree(data):
    """The same ids give the same COO entries whichever form they come in."""
    sample_count = data.draw(st.integers(1, 10))
    f = data.draw(features(sample_count, data.draw(VOCAB), forms=("ragged",)))
    combiner = data.draw(COMBINERS)
    indices = np.array([[r, j] for r, k in enumerate(f.lengths) for j in range(k)],
                       np.int32).reshape(-1, 2)
    ragged = numpy_all(ops.convert_to_coo_tensor(f.index, f.values, f.weights,
                                                 sample_count=sample_count, combiner=combiner))
    sparse = numpy_all(ops.convert_to_coo_tensor(indices, f.values, f.weights,
                                                 sample_count=sample_count, combiner=combiner))
    for a, b in zip(ragged, sparse):
        assert_same(a, b)
    if all(k == 1 for k in f.lengths):
        dense = numpy_all(ops.convert_to_coo_tensor(np.zeros([0], np.int32), f.values, f.weights,
                                                    sample_count=sample_count, combiner=combiner))
        for a, b in zip(ragged, dense):
            assert_same(a, b)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform ConvertToListOfSparseCoreCooTensors

Stacking = collections.namedtuple(
    "Stacking", "num_sc_per_chip num_replica sample_count row_offset col_offset col_shift "
                "stacked_table_sample_count")


@st.composite
def stackings(draw):
    S = draw(st.sampled_from([1, 2, 4, 8]))
    C = draw(st.sampled_from([1, 2, 4]))
    sample_count = S * draw(st.integers(1, 3))
    row_offset = S * draw(st.integers(0, 3))
    stacked = row_offset + sample_count + S * draw(st.integers(0, 2))
    return Stacking(S, C, sample_count, row_offset, S * C * draw(st.integers(0, 20)),
                    draw(st.integers(0, 3 * S * C)), stacked)


def list_attrs(t, combiner):
    return dict(sample_count=t.sample_count, num_sc_per_chip=t.num_sc_per_chip,
                row_offset=t.row_offset, col_offset=t.col_offset, col_shift=t.col_shift,
                num_sc_shards=t.num_sc_per_chip * t.num_replica,
                stacked_table_sample_count=t.stacked_table_sample_count, combiner=combiner)


@PROPERTY
@given(st.data())
def test_convert_to_list_of_sparse_core_coo_tensors(data):
    t = data.draw(stackings())
    f = data.draw(features(t.sample_count, data.draw(VOCAB)))
    combiner = data.draw(COMBINERS)
    attrs = list_attrs(t, combiner)
    got = ops.convert_to_list_of_sparse_core_coo_tensors(f.index, f.values, f.weights, **attrs)
    want = ref.convert_to_list_of_sparse_core_coo_tensors(f.index, f.values, f.weights, **attrs)
    for name, got_list, want_list in zip(("row_ids", "col_ids", "gains"), got, want):
        assert len(got_list) == t.num_sc_per_chip
        for i, (g, w) in enumerate(zip(got_list, want_list)):
            assert_same(g.numpy(), w, f"{name}[{i}]")


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#sort-dedup-and-bucket SortListOfSparseCoreCooTensors and docs/preprocessing.md#id-statistics GetStats on arbitrary per-feature lists


@st.composite
def sort_inputs(draw):
    S = draw(st.sampled_from([1, 2, 4, 8]))
    C = draw(st.sampled_from([1, 2, 4]))
    P = S * C
    num_features = draw(st.integers(1, 4))
    offsets = draw(st.lists(st.sampled_from([0, 0, 4 * P, 9 * P]), min_size=num_features,
                            max_size=num_features))
    sample_counts = draw(st.lists(st.integers(1, 4), min_size=num_features,
                                  max_size=num_features))
    batch = sum(sample_counts)
    sorted_rows = draw(st.booleans())  # what the list op produces; unsorted is allowed too
    # Mostly short lists drawn element by element; sometimes long ones with ids up to 2^31 - 1
    # (drawn with numpy from a seed) for the radix-sort path the op takes from 64 ids on.
    big = draw(st.integers(0, 4)) == 0
    span = draw(st.sampled_from([3, 50, 3000, 2 ** 31 - 1 - 9 * P] if big else
                                [2, 5, 3 * P, 30]))  # ids per member table
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    rows, cols, gains = [], [], []
    for f in range(num_features):
        if big:
            n = int(rng.integers(0, 200))
            r = rng.integers(0, 2 * batch + 1, n).tolist()
            c = rng.integers(0, span, n)
            g = rng.choice(np.float32([0.5, 1, 2, -1, 0.1]), n)
        else:
            n = draw(st.integers(0, 12))
            r = draw(st.lists(st.integers(0, 2 * batch), min_size=n, max_size=n))
            c = draw(st.lists(st.integers(0, span - 1), min_size=n, max_size=n))
            g = draw(st.lists(WEIGHT, min_size=n, max_size=n))
        rows.append(np.array(sorted(r) if sorted_rows else r, np.int32))
        cols.append(np.array(c, np.int32) + offsets[f])
        gains.append(np.array(g, np.float32))
    return dict(row_ids_list=rows, col_ids_list=cols, gains_list=gains,
                sample_count_list=sample_counts, col_offset_list=offsets, num_replica=C,
                num_sc_per_chip=S)


@PROPERTY
@given(sort_inputs(), st.sampled_from([1, 2, 3, 5, 256] + [1 << 20] * 3),
       st.sampled_from([1, 2, 4, 256] + [1 << 20] * 3))
def test_sort_list_of_sparse_core_coo_tensors(inputs, max_ids, max_uniques):
    event(f"64+ ids in a member table: {max(map(len, inputs['col_ids_list'])) >= 64}")
    got, want = expect_failure_or_compare(
        lambda: numpy_all(ops.sort_list_of_sparse_core_coo_tensors(
            table_vocab_size=1000, feature_width=8, max_ids_per_sparse_core=max_ids,
            max_unique_ids_per_sparse_core=max_uniques, table_name="t", **inputs)),
        lambda: ref.sort_list_of_sparse_core_coo_tensors(
            max_ids_per_sparse_core=max_ids, max_unique_ids_per_sparse_core=max_uniques,
            **inputs))
    if got is None:
        return
    for name, g, w in zip(("sorted_row_ids", "sorted_col_ids", "sorted_gains", "id_counts"),
                          got, want):
        assert_same(g, w, name)


@PROPERTY
@given(sort_inputs())
def test_get_stats_from_list_of_sparse_core_coo_tensors(inputs):
    got = ops.get_stats_from_list_of_sparse_core_coo_tensors(
        table_vocab_size=1000, feature_width=8, table_name="t", **inputs)
    want = ref.get_stats_from_list_of_sparse_core_coo_tensors(**inputs)
    assert tuple(int(x) for x in got) == want
    # The limits in the sort op are inclusive: exactly the stats pass, one less fails.
    max_ids, max_uniques = want
    if max_ids > 0:
        ops.sort_list_of_sparse_core_coo_tensors(
            table_vocab_size=1000, feature_width=8, max_ids_per_sparse_core=max_ids,
            max_unique_ids_per_sparse_core=max_uniques, table_name="t", **inputs)
    if max_ids > 1:
        with pytest.raises(tf.errors.InvalidArgumentError, match="ids"):
            ops.sort_list_of_sparse_core_coo_tensors(
                table_vocab_size=1000, feature_width=8, max_ids_per_sparse_core=max_ids - 1,
                max_unique_ids_per_sparse_core=256, table_name="t", **inputs)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#csr-wrapped-coo-buffers ConvertToSparseCoreCsrWrappedCooTensor on arbitrary sorted lists / id_counts


@st.composite
def csr_wrapped_inputs(draw):
    S = draw(st.sampled_from([1, 2, 4, 8]))
    C = draw(st.sampled_from([1, 2, 4]))
    P = S * C
    L = draw(st.sampled_from([0, 1, 2, 3, 6]))
    D = 2 ** L
    minibatching = draw(st.booleans())
    counts_per_sc = P * D if minibatching else P
    rows, cols, gains, id_counts = [], [], [], []
    for _ in range(S):
        step = st.sampled_from([0] * 6 + [1, 1, 3] if minibatching else [0, 0, 0, 1, 2, 5, 9])
        steps = draw(st.lists(step, min_size=counts_per_sc, max_size=counts_per_sc))
        counts = np.concatenate([[0], np.cumsum(steps)]).astype(np.int32)
        n = int(counts[-1]) + draw(st.integers(0, 2))
        rows.append(np.array(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)),
                             np.int32))
        cols.append(np.array(draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)),
                             np.int32))
        gains.append(np.array(draw(st.lists(WEIGHT, min_size=n, max_size=n)), np.float32))
        id_counts.append(counts)
    bits = set()
    if D > 1:
        bits = draw(st.sets(st.integers(0, D - 2), min_size=min(D - 1, draw(st.sampled_from([0, 1, 1, 2]))),
                            max_size=4))
    mask = sum(1 << k for k in bits)
    # splits may have any shape; all elements are ORed.
    pieces = draw(st.integers(1, 3))
    splits = np.array([mask if i == 0 else mask & draw(st.integers(0, 2 ** 62))
                       for i in range(pieces)], np.int64)
    return dict(sorted_row_ids_list=rows, sorted_col_ids_list=cols, sorted_gains_list=gains,
                id_counts_list=id_counts, splits=splits, num_replica=C, max_division_level=L,
                sample_count_per_sc=draw(st.integers(1, 4)),
                max_minibatches_per_sc=draw(st.sampled_from([8, 8, 1, 2, 3])),
                # The id buffer must hold a multiple of 8 ids; 1 and 3 mostly do not.
                max_ids_per_chip_per_sample=draw(st.sampled_from([8, 8, 16, 64, 1, 3])),
                allow_id_dropping=draw(st.booleans()))


def csr_dict(result, last="num_minibatches_per_sc"):
    d = {k: np.asarray(v) for k, v in result._asdict().items()}
    d["num_minibatches"] = d.pop(last)
    d["num_dropped_ids"] = np.asarray(result.num_dropped_ids)
    return d


def run_csr(op, last="num_minibatches_per_sc", **kwargs):
    """Runs a CSR op with TensorFlow's static buffer sizes and again with trim_to_size: the trimmed
    buffers must be exactly the unpadded prefixes. Returns the full-size outputs."""
    full = csr_dict(op(**kwargs), last)
    trimmed = csr_dict(op(trim_to_size=True, **kwargs), last)
    sizes = {"row_pointers": "row_pointers_unpadded_size"}
    for key in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
        size = int(full[sizes.get(key, "ids_unpadded_size")])
        assert_same(trimmed[key], full[key][:size], "trimmed " + key)
    for key in ("row_pointers_unpadded_size", "ids_unpadded_size", "num_minibatches",
                "num_dropped_ids"):
        assert int(trimmed[key]) == int(full[key]), "trimmed " + key
    return full


def assert_csr_equal(got, want):
    event(f"minibatches: {want['num_minibatches']}")
    event(f"ids dropped: {want['num_dropped_ids'] > 0}")
    for key in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
        assert_same(got[key], want[key], key)
    for key in ("row_pointers_unpadded_size", "ids_unpadded_size", "num_minibatches",
                "num_dropped_ids"):
        assert int(got[key]) == want[key], key


@PROPERTY
@given(csr_wrapped_inputs())
def test_convert_to_sparse_core_csr_wrapped_coo_tensor(inputs):
    S = len(inputs["sorted_row_ids_list"])
    got, want = expect_failure_or_compare(
        lambda: run_csr(ops.convert_to_sparse_core_csr_wrapped_coo_tensor,
                        table_vocab_size=1000, feature_width=8, table_name="t", **inputs),
        lambda: ref.convert_to_sparse_core_csr_wrapped_coo_tensor(num_sc_per_chip=S, **inputs))
    if got is not None:
        assert_csr_equal(got, want)


# ------------------------------------------------------------------------------------------------
# docs/preprocessing.md#minibatching / docs/preprocessing.md#csr-buffers-with-minibatches legacy minibatching: coo -> splits -> CSR


@st.composite
def minibatching_setups(draw, weight=WEIGHT, heavy=False, big=False):
    """`heavy`: few partitions and many ids per sample, so most batches need minibatching.
    `big`: long samples (64+ ids per SparseCore, the radix-sort path) and large vocabularies."""
    few = heavy or big
    S = draw(st.sampled_from([1, 2] if few else [1, 2, 4, 8]))
    C = draw(st.sampled_from([1, 2] if few else [1, 2, 4]))
    sample_count = S * draw(st.integers(1, 4))
    if big:
        vocab = draw(st.sampled_from([64, 300, 100000, 2 ** 31 - 1]))
        f = draw(big_features(sample_count, vocab))
        limits = [8, 16, 256, 1 << 20]
    else:
        vocab = draw(st.sampled_from([64, 300] if heavy else [1, 5, 16, 64, 100, 300]))
        f = draw(features(sample_count, vocab, max_len=8, weight=weight,
                          forms=("ragged", "sparse") if heavy else ("ragged", "sparse", "dense")))
        limits = [2, 3, 4, 6] if heavy else [1, 2, 3, 4, 6, 256]
    return dict(
        feature=f, combiner=draw(COMBINERS), sample_count=sample_count, num_replica=C,
        num_sc_per_chip=S, table_vocab_size=vocab,
        max_division_level=draw(st.sampled_from([6] if few else [0, 1, 2, 3, 6, 6, 6])),
        max_ids_per_partition=draw(st.sampled_from([x for x in limits if x > 1])),
        max_unique_ids_per_partition=draw(st.sampled_from(limits)))


def run_coo(setup):
    f = setup["feature"]
    return numpy_all(ops.convert_to_coo_tensor(f.index, f.values, f.weights,
                                               sample_count=setup["sample_count"],
                                               combiner=setup["combiner"]))


SPLITS_KEYS = ("sorted_row_ids", "sorted_col_ids", "sorted_gains", "splits", "id_counts",
               "max_ids", "max_uniques")
SPLITS_ARGS = ("sample_count", "num_replica", "num_sc_per_chip", "table_vocab_size",
               "max_ids_per_partition", "max_unique_ids_per_partition", "max_division_level")


def run_splits(setup, rows, cols, gains):
    args = {k: setup[k] for k in SPLITS_ARGS}
    return expect_failure_or_compare(
        lambda: dict(zip(SPLITS_KEYS, numpy_all(ops.get_minibatch_splits_with_physical_replica(
            ["key"], rows, cols, gains, feature_width=8, table_name="t", mini_batch_splits="",
            **args)))),
        lambda: ref.get_minibatch_splits_with_physical_replica(rows, cols, gains, **args))


@PROPERTY
@given(st.one_of(minibatching_setups(), minibatching_setups(big=True)))
def test_get_minibatch_splits_with_physical_replica(setup):
    rows, cols, gains = run_coo(setup)
    per_sc = np.bincount(rows // (setup["sample_count"] // setup["num_sc_per_chip"]),
                         minlength=1)
    event(f"64+ ids on a SparseCore: {per_sc.max() >= 64}")
    got, want = run_splits(setup, rows, cols, gains)
    if got is None:
        return
    for key in ("sorted_row_ids", "sorted_col_ids", "sorted_gains", "id_counts"):
        assert_same(got[key], want[key], key)
    for key in ("splits", "max_ids", "max_uniques"):
        assert int(got[key]) == want[key], key
    L = setup["max_division_level"]
    event(f"minibatches: {len(ref.bits_to_bucket_splits(want['splits'], L)) + 1}")
    assert got["splits"].dtype == np.int64


@st.composite
def stacked_table_setups(draw):
    """Several features of one stacked table, each on its own member table (docs/layout.md): one
    after another in the stacked batch and, padded to the shards, in the stacked vocabulary."""
    S = draw(st.sampled_from([1, 2, 4]))
    C = draw(st.sampled_from([1, 2]))
    P = S * C
    big = draw(st.integers(0, 2)) == 0
    features_, attrs = [], collections.defaultdict(list)
    row_offset = col_offset = 0
    for f in range(draw(st.integers(1, 3))):
        sample_count = S * draw(st.integers(1, 3))
        vocab = draw(st.sampled_from([1, 5, 64, 300]))
        feature = draw(big_features(sample_count, vocab) if big else
                       features(sample_count, vocab, max_len=6))
        features_.append(feature)
        attrs["sample_counts"].append(sample_count)
        attrs["row_offsets"].append(row_offset)
        attrs["col_offsets"].append(col_offset)
        attrs["col_shifts"].append(draw(st.integers(0, P - 1)))
        attrs["vocabulary_sizes"].append(vocab)
        attrs["combiners"].append(draw(COMBINERS))
        attrs["table_names"].append(f"t{f}")
        attrs["feature_names"].append(f"f{f}")
        row_offset += sample_count
        col_offset += ref.round_up(vocab, P)
    limits = [2, 3, 8, 256, 1 << 20]
    return dict(
        features=features_, attrs=dict(attrs), num_sc_per_chip=S, num_replica=C,
        num_sc_shards=P, stacked_table_sample_count=row_offset,
        # Sometimes smaller than the stacked vocabulary: ids beyond it must fail.
        table_vocab_size=draw(st.sampled_from([col_offset, col_offset, max(col_offset // 2, 1)])),
        max_division_level=draw(st.sampled_from([0, 2, 6])),
        max_ids_per_partition=draw(st.sampled_from([x for x in limits if x > 2])),
        max_unique_ids_per_partition=draw(st.sampled_from(limits)))


@PROPERTY
@given(stacked_table_setups())
def test_convert_features_to_minibatch_splits(setup):
    """The one-op path of a stacked table against the reference chain (per-feature lists,
    concatenated SparseCore-major, then the splits), bit for bit, failing exactly when it does."""
    S, a = setup["num_sc_per_chip"], setup["attrs"]
    fs = setup["features"]
    lists = [ref.convert_to_list_of_sparse_core_coo_tensors(
        f.index, f.values, f.weights, sample_count=a["sample_counts"][k], num_sc_per_chip=S,
        row_offset=a["row_offsets"][k], col_offset=a["col_offsets"][k],
        col_shift=a["col_shifts"][k], num_sc_shards=setup["num_sc_shards"],
        stacked_table_sample_count=setup["stacked_table_sample_count"],
        combiner=a["combiners"][k]) for k, f in enumerate(fs)]
    rows, cols, gains = (np.concatenate([lst[j][i] for i in range(S) for lst in lists])
                         for j in range(3))
    split_args = dict(sample_count=setup["stacked_table_sample_count"],
                      num_replica=setup["num_replica"], num_sc_per_chip=S,
                      table_vocab_size=setup["table_vocab_size"],
                      max_ids_per_partition=setup["max_ids_per_partition"],
                      max_unique_ids_per_partition=setup["max_unique_ids_per_partition"],
                      max_division_level=setup["max_division_level"])

    def reference():
        if len(cols) and cols.max() >= setup["table_vocab_size"]:
            raise ref.OpMustFail("a stacked id beyond the stacked table")
        return ref.get_minibatch_splits_with_physical_replica(rows, cols, gains, **split_args)

    def run_op():
        return dict(zip(SPLITS_KEYS, numpy_all(ops.preprocessing.convert_features_to_minibatch_splits(
            [f.index for f in fs], [f.values for f in fs], [f.weights for f in fs], **a,
            num_sc_per_chip=S, num_sc_shards=setup["num_sc_shards"],
            stacked_table_sample_count=setup["stacked_table_sample_count"],
            num_replica=setup["num_replica"], table_vocab_size=setup["table_vocab_size"],
            table_name="stacked", max_ids_per_partition=setup["max_ids_per_partition"],
            max_unique_ids_per_partition=setup["max_unique_ids_per_partition"],
            max_division_level=setup["max_division_level"]))))

    got, want = expect_failure_or_compare(run_op, reference)
    if got is None:
        return
    event(f"ids: {'64+' if len(rows) >= 64 else 'few'}")
    for key in ("sorted_row_ids", "sorted_col_ids", "sorted_gains", "id_counts"):
        assert_same(got[key], want[key], key)
    for key in ("splits", "max_ids", "max_uniques"):
        assert int(got[key]) == want[key], key


def decode_csr(csr, num_sc, num_shards, num_minibatches):
    """(sc, minibatch, shard) -> list of (sample, token, gain), using row-pointer semantics."""
    row_pointers = csr["row_pointers"]
    block = ref.round_up(num_shards, 8)
    out = {}
    for s in range(num_sc):
        for b in range(num_minibatches):
            for p in range(num_shards):
                k = (s * num_minibatches + b) * block + p
                start = 0 if k == 0 else ref.round_up(int(row_pointers[k - 1]), 8)
                end = int(row_pointers[k])
                out[s, b, p] = list(zip(csr["sorted_sample_ids"][start:end],
                                        csr["sorted_token_ids"][start:end],
                                        csr["sorted_gains"][start:end]))
                assert (csr["sorted_token_ids"][end:ref.round_up(end, 8)] == ref.PAD).all()
    return out


@PROPERTY
@given(st.one_of(minibatching_setups(weight=POSITIVE_WEIGHT),
                 minibatching_setups(weight=POSITIVE_WEIGHT, heavy=True),
                 minibatching_setups(big=True)),
       st.sampled_from([64, 64, 8, 2, 1]),
       st.sampled_from([16, 64, 64, 8, 2, 1]), st.booleans())
def test_coo_to_minibatch_splits_to_csr_chain(setup, max_minibatches, per_sample, dropping):
    """coo -> splits -> minibatches in CSR, against the reference chain and against meaning."""
    rows, cols, gains = run_coo(setup)
    splits_out, _ = run_splits(setup, rows, cols, gains)
    if splits_out is None:
        return
    S, C = setup["num_sc_per_chip"], setup["num_replica"]
    P, L, B = S * C, setup["max_division_level"], setup["sample_count"]
    args = dict(sample_count=B, num_replica=C, num_sc_per_chip=S,
                max_minibatches_per_sc=max_minibatches, max_ids_per_chip_per_sample=per_sample,
                allow_id_dropping=dropping, max_division_level=L)
    # The splits of several hosts are ORed: pass the mask twice, in a [2] vector.
    splits = np.array([splits_out["splits"], 0], np.int64)
    got, want = expect_failure_or_compare(
        lambda: run_csr(
            ops.get_minibatches_in_csr_with_physical_replica,
            last="num_minibatches_per_physical_sparse_core", program_key=["key"],
            row_ids=splits_out["sorted_row_ids"], col_ids=splits_out["sorted_col_ids"],
            gains=splits_out["sorted_gains"], splits=splits, id_counts=splits_out["id_counts"],
            table_vocab_size=setup["table_vocab_size"], feature_width=8, table_name="t",
            mini_batch_in_csr="", **args),
        lambda: ref.get_minibatches_in_csr_with_physical_replica(
            splits_out["sorted_row_ids"], splits_out["sorted_col_ids"],
            splits_out["sorted_gains"], splits, splits_out["id_counts"], **args))
    if got is None:
        return
    assert_csr_equal(got, want)
    if int(got["num_dropped_ids"]) > 0:
        return
    # Meaning: every (SC, minibatch, shard) segment holds ids of its shard whose vocabulary
    # division lies in the minibatch, within the per-partition limits, and together the segments
    # hold every (sample, id) pair once with its combined weight.
    D = 2 ** L
    bounds = [0] + ref.bits_to_bucket_splits(int(splits_out["splits"]), L) + [D]
    division_size = -(-setup["table_vocab_size"] // D)
    B_sc = B // S
    decoded = collections.defaultdict(float)
    for (s, b, p), entries in decode_csr(got, S, P, len(bounds) - 1).items():
        ids = [int(token) * P + p for _, token, _ in entries]
        assert len(ids) <= setup["max_ids_per_partition"]
        assert len(set(ids)) <= setup["max_unique_ids_per_partition"]
        for (sample, _, gain), i in zip(entries, ids):
            assert bounds[b] <= min(i // division_size, D - 1) < bounds[b + 1]
            assert 0 <= sample < B_sc
            key = (s * B_sc + int(sample), i)
            assert key not in decoded, "duplicate (sample, id) pair"
            decoded[key] = float(gain)
    expected = direct_weights(setup["feature"], setup["combiner"])
    assert decoded.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(decoded[key], value, rtol=1e-5, err_msg=str(key))


# ------------------------------------------------------------------------------------------------
# TPUEmbeddingV2 path: list -> sort -> CSR-wrapped for a stacked table


@st.composite
def stacked_tables(draw):
    S = draw(st.sampled_from([1, 2, 4, 8]))
    C = draw(st.sampled_from([1, 2, 4]))
    P = S * C
    vocabs = draw(st.lists(st.sampled_from([1, 3, 7, 20, 50]), min_size=1, max_size=2))
    col_offsets, shifts, offset = [], [], 0
    for v in vocabs:  # each member table is padded to a multiple of P rows and mod-sharded
        col_offsets.append(offset * P)
        shifts.append(draw(st.integers(0, P - 1)))
        offset += -(-v // P)
    num_features = draw(st.integers(1, 3))
    table_of = draw(st.lists(st.integers(0, len(vocabs) - 1), min_size=num_features,
                             max_size=num_features))
    sample_counts = [S * draw(st.integers(1, 2)) for _ in range(num_features)]
    row_offsets = np.concatenate([[0], np.cumsum(sample_counts)[:-1]]).tolist()
    feats = [draw(features(sample_counts[f], vocabs[table_of[f]], max_len=3,
                           weight=POSITIVE_WEIGHT)) for f in range(num_features)]
    return dict(S=S, C=C, vocabs=vocabs, col_offsets=col_offsets, shifts=shifts,
                table_of=table_of, sample_counts=sample_counts, row_offsets=row_offsets,
                stacked=sum(sample_counts), features=feats, combiner=draw(COMBINERS))


@PROPERTY
@given(stacked_tables(), st.sampled_from([8, 16, 1, 2, 4]), st.booleans(), st.booleans())
def test_list_sort_csr_wrapped_chain(table, per_sample, dropping, small_limits):
    S, C = table["S"], table["C"]
    P = S * C
    lists = []  # per feature: (rows_list, cols_list, gains_list)
    for f, feat in enumerate(table["features"]):
        t = table["table_of"][f]
        attrs = dict(sample_count=table["sample_counts"][f], num_sc_per_chip=S,
                     row_offset=table["row_offsets"][f], col_offset=table["col_offsets"][t],
                     col_shift=table["shifts"][t], num_sc_shards=P,
                     stacked_table_sample_count=table["stacked"], combiner=table["combiner"])
        got = ops.convert_to_list_of_sparse_core_coo_tensors(
            feat.index, feat.values, feat.weights, vocabulary_size=table["vocabs"][t], **attrs)
        got = [[x.numpy() for x in group] for group in got]
        want = ref.convert_to_list_of_sparse_core_coo_tensors(feat.index, feat.values,
                                                              feat.weights, **attrs)
        for g_list, w_list in zip(got, want):
            for g, w in zip(g_list, w_list):
                assert_same(g, w)
        lists.append(got)

    sort_args = dict(sample_count_list=[b // S for b in table["sample_counts"]],
                     col_offset_list=[table["col_offsets"][t] for t in table["table_of"]],
                     num_replica=C, num_sc_per_chip=S)
    limit = 2 if small_limits else 1 << 20
    sorted_lists = []
    for i in range(S):
        inputs = dict(row_ids_list=[x[0][i] for x in lists], col_ids_list=[x[1][i] for x in lists],
                      gains_list=[x[2][i] for x in lists], **sort_args)
        got, want = expect_failure_or_compare(
            lambda: numpy_all(ops.sort_list_of_sparse_core_coo_tensors(
                table_vocab_size=1000, feature_width=8, max_ids_per_sparse_core=limit,
                max_unique_ids_per_sparse_core=limit, table_name="t", **inputs)),
            lambda: ref.sort_list_of_sparse_core_coo_tensors(
                max_ids_per_sparse_core=limit, max_unique_ids_per_sparse_core=limit, **inputs))
        if got is None:
            return
        for g, w in zip(got, want):
            assert_same(g, w)
        sorted_lists.append(got)

    B_stk_sc = table["stacked"] // S
    csr_args = dict(sorted_row_ids_list=[x[0] for x in sorted_lists],
                    sorted_col_ids_list=[x[1] for x in sorted_lists],
                    sorted_gains_list=[x[2] for x in sorted_lists],
                    id_counts_list=[x[3] for x in sorted_lists], splits=np.int64(0),
                    sample_count_per_sc=B_stk_sc, num_replica=C, max_minibatches_per_sc=1,
                    max_ids_per_chip_per_sample=per_sample, allow_id_dropping=dropping)
    got, want = expect_failure_or_compare(
        lambda: run_csr(ops.convert_to_sparse_core_csr_wrapped_coo_tensor,
                        table_vocab_size=1000, feature_width=8, table_name="t", **csr_args),
        lambda: ref.convert_to_sparse_core_csr_wrapped_coo_tensor(num_sc_per_chip=S, **csr_args))
    if got is None:
        return
    assert_csr_equal(got, want)
    if int(got["num_dropped_ids"]) > 0:
        return

    # Meaning: decode every entry back to (source SC, stacked-table sample, stacked col) and
    # compare with the combined weights computed directly from the raw features.
    decoded = {}
    for (s, _, p), entries in decode_csr(got, S, P, 1).items():
        for sample, token, gain in entries:
            assert 0 <= sample < B_stk_sc
            key = (s, int(sample), int(token) * P + p)
            assert key not in decoded, "duplicate (sample, id) pair"
            decoded[key] = float(gain)
    expected = collections.defaultdict(float)
    for f, feat in enumerate(table["features"]):
        t = table["table_of"][f]
        B_sc = table["sample_counts"][f] // S
        for (r, i), w in direct_weights(feat, table["combiner"]).items():
            col = ref.stacked_col(i, table["col_offsets"][t], table["shifts"][t], P)
            expected[(r // B_sc, table["row_offsets"][f] // S + r % B_sc, col)] += w
    assert decoded.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_allclose(decoded[key], value, rtol=1e-5, err_msg=str(key))


def test_trim_to_size_without_any_ids():
    """Regression: with no ids the trimmed id buffers are empty (null data) and the row pointers
    were left unwritten, because an empty id buffer was taken for a dry run."""
    empty = np.zeros(0, np.int32)
    result = ops.convert_to_sparse_core_csr_wrapped_coo_tensor(
        [empty] * 2, [empty] * 2, [np.zeros(0, np.float32)] * 2, [np.zeros(3, np.int32)] * 2,
        np.int64(0), sample_count_per_sc=1, num_replica=1, max_minibatches_per_sc=1,
        max_ids_per_chip_per_sample=8, table_vocab_size=8, feature_width=1, table_name="t",
        allow_id_dropping=False, trim_to_size=True)
    np.testing.assert_array_equal(result.row_pointers.numpy(), np.zeros(16, np.int32))
    assert result.sorted_token_ids.shape == (0,) and int(result.ids_unpadded_size) == 0
