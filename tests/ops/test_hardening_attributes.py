"""Issue 10, items 1, 2 and 8: huge or impossible attribute values through the Python op wrappers.

Each case used to kill or fool the process (out-of-bounds reads, SIGFPE, SIGSEGV, hangs,
TensorShape CHECK-failures, multi-GiB allocations, silently truncated ids). Now each must raise
tf.errors.InvalidArgumentError naming the table (or succeed, for the few cases whose only problem
was undefined behaviour or an allocation). The cases run in ONE child process with a timeout, so a
regression shows up as a failed test naming the case instead of killing pytest; every case runs
eagerly (kernels) and inside a tf.function (shape functions at trace time, then the kernel).

Run the cases directly (from the repository root):
    python -m tests.ops.test_hardening_attributes [case ...]
"""
import functools
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLE = "hard_table"
FEATURE = "hard_feature"
CHILD_TIMEOUT_SECONDS = 240


# ------------------------------------------------------------------------------------------------
# The cases (run in the child). Each builds the op call from small valid inputs plus one bad value.
# ------------------------------------------------------------------------------------------------

def _np():
    import numpy as np  # noqa: PLC0415
    return np


def _csr_inputs(S=2, num_replica=1, rows_per_shard=4, samples_per_sc=2, dim=3):
    """Valid CSR buffers for S SparseCores x num_replica shards, one minibatch, a few ids."""
    np = _np()
    P = S * num_replica
    block = -(-P // 8) * 8
    row_pointers, samples, tokens, gains = [], [], [], []
    for s in range(S):
        for p in range(block):
            if p < P:
                samples += [s % samples_per_sc]
                tokens += [p % rows_per_shard]
                gains += [1.0]
                while len(tokens) % 8:
                    samples.append(2**31 - 1)
                    tokens.append(2**31 - 1)
                    gains.append(float(2**31 - 1))
            row_pointers.append(len(tokens))
    rng = np.random.default_rng(0)
    return dict(
        row_pointers=np.int32(row_pointers), sorted_sample_ids=np.int32(samples),
        sorted_token_ids=np.int32(tokens), sorted_gains=np.float32(gains),
        table=rng.normal(size=(P * rows_per_shard, dim)).astype(np.float32),
        grads=rng.normal(size=(S * samples_per_sc, dim)).astype(np.float32),
        input_size=S * samples_per_sc, S=S)


def _lookup(**attrs):
    from tf_sc_embedding import ops  # noqa: PLC0415
    d = _csr_inputs()
    kwargs = dict(num_sparsecores_per_device=d["S"])
    kwargs.update(attrs)
    input_size = kwargs.pop("input_size", d["input_size"])
    return ops.xla_sparse_dense_matmul_with_csr_input(
        d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"],
        d["table"], _np().int32(1), input_size, 0.0, 0.0, 0, TABLE, **kwargs)


def _lookup_quantized(low, high):
    from tf_sc_embedding import ops  # noqa: PLC0415
    d = _csr_inputs()
    return ops.xla_sparse_dense_matmul_with_csr_input(
        d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"],
        d["table"], _np().int32(1), d["input_size"], low, high, 4, TABLE,
        num_sparsecores_per_device=d["S"])


def _lookup_empty():
    """No ids, no activation rows: used to memset(nullptr, 0, 0) and offset null pointers."""
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    return ops.xla_sparse_dense_matmul_with_csr_input(
        np.int32([0] * 8), np.zeros([0], np.int32), np.zeros([0], np.int32),
        np.zeros([0], np.float32), np.zeros([4, 0], np.float32), np.int32(1), 0, 0.0, 0.0, 0,
        TABLE, num_sparsecores_per_device=1)


def _update(**attrs):
    from tf_sc_embedding import ops  # noqa: PLC0415
    d = _csr_inputs()
    kwargs = dict(num_sparsecores_per_device=d["S"])
    kwargs.update(attrs)
    acc = _np().full(d["table"].shape, 0.5, _np().float32)
    return ops.xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input(
        d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"],
        d["grads"], _np().float32(0.1), d["table"], acc, _np().int32(1), TABLE, **kwargs)


def _coo(sample_count, combiner, index, values, weights):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    return ops.convert_to_coo_tensor(
        np.asarray(index, np.int32).reshape(-1, 2) if len(index) else np.zeros([0], np.int32),
        np.int32(values), np.float32(weights), sample_count=sample_count, combiner=combiner,
        table_name=TABLE, feature_name=FEATURE)


def _to_list(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(sample_count=4, num_sc_per_chip=2, row_offset=0, col_offset=0, col_shift=0,
                num_sc_shards=4, stacked_table_sample_count=4, combiner="sum")
    args.update(overrides)
    return ops.convert_to_list_of_sparse_core_coo_tensors(
        np.int32([0, 1, 2, 3, 4]), np.int32([1, 2, 3, 7]), np.float32(1.0),
        table_name=TABLE, feature_name=FEATURE, **args)


def _stacked_coo(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(sample_counts=[4], row_offsets=[0], col_offsets=[0], col_shifts=[0],
                vocabulary_sizes=[8], num_sc_per_chip=2, num_sc_shards=4,
                stacked_table_sample_count=4)
    args.update(overrides)
    return ops.preprocessing.convert_features_to_stacked_coo_tensor(
        [np.int32([0, 1, 2, 3, 4])], [np.int32([1, 2, 3, 7])], [np.float32(1.0)],
        combiners=["sum"], table_names=[TABLE], feature_names=[FEATURE], **args)


def _stacked_splits(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(sample_counts=[4], row_offsets=[0], col_offsets=[0], col_shifts=[0],
                vocabulary_sizes=[8], num_sc_per_chip=2, num_sc_shards=4,
                stacked_table_sample_count=4, num_replica=2, table_vocab_size=8,
                max_ids_per_partition=8, max_unique_ids_per_partition=8)
    args.update(overrides)
    return ops.preprocessing.convert_features_to_minibatch_splits(
        [np.int32([0, 1, 2, 3, 4])], [np.int32([1, 2, 3, 7])], [np.float32(1.0)],
        combiners=["sum"], table_names=[TABLE], feature_names=[FEATURE], table_name=TABLE,
        **args)


def _sort(stats=False, **overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(row_ids_list=[np.int32([0, 1, 1])], col_ids_list=[np.int32([0, 4, 8])],
                gains_list=[np.float32([1, 1, 1])], sample_count_list=[2], col_offset_list=[0],
                num_replica=1, table_vocab_size=64, feature_width=8, num_sc_per_chip=4,
                table_name=TABLE)
    args.update(overrides)
    if stats:
        return ops.get_stats_from_list_of_sparse_core_coo_tensors(**args)
    return ops.sort_list_of_sparse_core_coo_tensors(
        max_ids_per_sparse_core=256, max_unique_ids_per_sparse_core=256, **args)


def _splits(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(sample_count=4, num_replica=1, table_vocab_size=64, feature_width=8,
                num_sc_per_chip=2, table_name=TABLE, mini_batch_splits="",
                max_ids_per_partition=8, max_unique_ids_per_partition=8)
    args.update(overrides)
    return ops.get_minibatch_splits_with_physical_replica(
        ["key"], np.int32([0, 0, 1, 2]), np.int32([1, 5, 9, 3]), np.float32([1, 1, 1, 1]),
        **args)


def _csr_wrapped(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    S = 2
    args = dict(sorted_row_ids_list=[np.int32([0, 1, 0])] * S,
                sorted_col_ids_list=[np.int32([0, 1, 2])] * S,
                sorted_gains_list=[np.float32([1, 1, 1])] * S,
                id_counts_list=[np.int32([0, 2, 3])] * S, splits=np.int64(0),
                sample_count_per_sc=4, num_replica=1, max_minibatches_per_sc=1,
                max_ids_per_chip_per_sample=8, table_vocab_size=64, feature_width=8,
                table_name=TABLE, allow_id_dropping=False)
    args.update(overrides)
    return ops.convert_to_sparse_core_csr_wrapped_coo_tensor(**args)


def _minibatches_in_csr(**overrides):
    from tf_sc_embedding import ops  # noqa: PLC0415
    np = _np()
    args = dict(sample_count=4, num_replica=1, max_minibatches_per_sc=1,
                max_ids_per_chip_per_sample=8, table_vocab_size=64, feature_width=8,
                num_sc_per_chip=2, table_name=TABLE, mini_batch_in_csr="")
    args.update(overrides)
    counts = np.zeros(2 * 2 * 64 + 1, np.int32)
    counts[1:] = 1
    counts[200:] = 2
    return ops.get_minibatches_in_csr_with_physical_replica(
        ["key"], np.int32([0, 2]), np.int32([0, 1]), np.float32([1, 1]), np.int64(0), counts,
        **args)


def _stacker(num_partitions=1, sparse_cores=4, height=100, width=8):
    from tf_sc_embedding import _core  # noqa: PLC0415
    stacker = _core.LayoutStacker(num_partitions, sparse_cores)
    stacker.add_table(TABLE, height, width, "g", 8, 1)
    return stacker.get_layouts()


I64 = 2**63 - 1
# name -> (call, expected): "invalid" = InvalidArgumentError (ValueError for the pybind stacker),
# "ok" = must succeed.
CASES = {
    # The unmodified helpers are valid (so "invalid" below is about the one bad value).
    "baseline_lookup": (_lookup, "ok"),
    "baseline_update": (_update, "ok"),
    "baseline_list": (_to_list, "ok"),
    "baseline_sort": (_sort, "ok"),
    "baseline_stats": (lambda: _sort(stats=True), "ok"),
    "baseline_splits": (_splits, "ok"),
    "baseline_csr_wrapped": (_csr_wrapped, "ok"),
    "baseline_csr": (_minibatches_in_csr, "ok"),
    "stacker_baseline": (_stacker, "ok"),
    # Lookup / fused update attributes (csr_view)
    "lookup_num_sc_2^32": (lambda: _lookup(num_sparsecores_per_device=2**32), "invalid"),
    "lookup_num_sc_2^62": (lambda: _lookup(num_sparsecores_per_device=2**62), "invalid"),
    "lookup_num_replica_2^40": (lambda: _lookup(num_replica=2**40), "invalid"),
    "lookup_num_replica_2^62": (lambda: _lookup(num_replica=2**62), "invalid"),
    "lookup_source_replicas_2^62": (lambda: _lookup(num_source_replicas=2**62), "invalid"),
    "lookup_first_local_shard_max": (lambda: _lookup(first_local_shard=I64), "invalid"),
    "lookup_num_local_shards_max": (lambda: _lookup(num_local_shards=I64), "invalid"),
    "lookup_input_size_2^62": (lambda: _lookup(input_size=2**62), "invalid"),
    "lookup_input_size_2^31": (lambda: _lookup(input_size=2**31), "invalid"),
    "lookup_input_size_2^28x": (lambda: _lookup(input_size=2**28), "invalid"),
    "lookup_quantization_inf": (lambda: _lookup_quantized(-float("inf"), float("inf")), "invalid"),
    "lookup_quantization_huge_range": (lambda: _lookup_quantized(-3e38, 3e38), "invalid"),
    "lookup_empty": (_lookup_empty, "ok"),
    "update_num_sc_2^62": (lambda: _update(num_sparsecores_per_device=2**62), "invalid"),
    "update_num_replica_2^40": (lambda: _update(num_replica=2**40), "invalid"),
    "update_source_replicas_2^40": (lambda: _update(num_source_replicas=2**40), "invalid"),
    # COO conversion (coo.cc)
    "coo_mean_sample_count_2^31-1": (
        lambda: _coo(2**31 - 1, "mean", [[0, 0], [5, 0]], [1, 2], [1.0, 3.0]), "ok"),
    "coo_sqrtn_sample_count_2^31-1_no_ids": (
        lambda: _coo(2**31 - 1, "sqrtn", [], [], 1.0), "ok"),
    "list_num_sc_per_chip_2^20": (lambda: _to_list(num_sc_per_chip=2**20), "invalid"),
    "list_row_offset_2^33": (
        lambda: _to_list(row_offset=2**33, stacked_table_sample_count=2**34), "invalid"),
    "list_row_offset_max": (lambda: _to_list(row_offset=I64 - 3), "invalid"),
    "list_col_offset_max": (lambda: _to_list(col_offset=I64), "invalid"),
    "list_col_offset_2^31": (lambda: _to_list(col_offset=2**31), "invalid"),
    "list_col_shift_max": (lambda: _to_list(col_shift=I64), "invalid"),
    "list_num_sc_shards_2^62": (lambda: _to_list(num_sc_shards=2**62), "invalid"),
    "list_stacked_sample_count_2^62": (
        lambda: _to_list(stacked_table_sample_count=2**62), "invalid"),
    # The multi-feature conversion (stacked_coo.cc); values beyond int64 are caught in Python.
    "stacked_coo_ok": (lambda: _stacked_coo(), "ok"),
    "stacked_coo_sample_count_2^63+4": (
        lambda: _stacked_coo(stacked_table_sample_count=2**63 + 4), "invalid"),
    "stacked_coo_col_offsets_2^64": (lambda: _stacked_coo(col_offsets=[2**64]), "invalid"),
    "stacked_coo_row_offset_max": (lambda: _stacked_coo(row_offsets=[I64]), "invalid"),
    # The one-op splits of a stacked table (stacked_splits.cc)
    "stacked_splits_ok": (lambda: _stacked_splits(), "ok"),
    "stacked_splits_vocab_max": (lambda: _stacked_splits(table_vocab_size=I64), "ok"),
    "stacked_splits_limits_max": (
        lambda: _stacked_splits(max_ids_per_partition=I64, max_unique_ids_per_partition=I64),
        "ok"),
    "stacked_splits_num_replica_2^40": (lambda: _stacked_splits(num_replica=2**40), "invalid"),
    "stacked_splits_division_level_2^40": (
        lambda: _stacked_splits(max_division_level=2**40), "invalid"),
    "stacked_splits_sample_count_2^62": (
        lambda: _stacked_splits(stacked_table_sample_count=2**62), "invalid"),
    "stacked_splits_vocab_2^64": (lambda: _stacked_splits(table_vocab_size=2**64), "invalid"),
    "stacked_splits_col_offset_2^31": (lambda: _stacked_splits(col_offsets=[2**31]), "invalid"),
    # Sort / stats (sort_list.cc)
    "sort_num_replica_2^40": (lambda: _sort(num_replica=2**40), "invalid"),
    "sort_num_replica_2^62": (lambda: _sort(num_replica=2**62), "invalid"),
    "sort_num_sc_per_chip_2^20": (lambda: _sort(num_sc_per_chip=2**20), "invalid"),
    "stats_num_replica_2^62": (lambda: _sort(stats=True, num_replica=2**62), "invalid"),
    "stats_num_sc_per_chip_2^32": (lambda: _sort(stats=True, num_sc_per_chip=2**32), "invalid"),
    # Minibatch splits (minibatch_splits.cc)
    "splits_num_replica_2^40": (lambda: _splits(num_replica=2**40), "invalid"),
    "splits_num_sc_per_chip_2^20": (
        lambda: _splits(num_sc_per_chip=2**20, sample_count=2**20), "invalid"),
    "splits_num_replica_2^60": (lambda: _splits(num_replica=2**60), "invalid"),
    "splits_sample_count_2^62": (lambda: _splits(sample_count=2**62), "invalid"),
    "splits_vocab_max": (lambda: _splits(table_vocab_size=I64), "ok"),
    "splits_division_level_2^40": (lambda: _splits(max_division_level=2**40), "invalid"),
    # CSR packing (csr.cc) and the static output shapes
    "csr_wrapped_max_minibatches_2^58": (
        lambda: _csr_wrapped(max_minibatches_per_sc=2**58), "invalid"),
    "csr_wrapped_max_ids_2^60+1": (
        lambda: _csr_wrapped(max_ids_per_chip_per_sample=2**60 + 1), "invalid"),
    "csr_wrapped_max_ids_2^28": (
        lambda: _csr_wrapped(max_ids_per_chip_per_sample=2**28), "invalid"),
    "csr_wrapped_num_replica_2^40": (lambda: _csr_wrapped(num_replica=2**40), "invalid"),
    "csr_wrapped_sample_count_2^62": (lambda: _csr_wrapped(sample_count_per_sc=2**62), "invalid"),
    "csr_wrapped_trimmed_max_ids_2^60+1": (
        lambda: _csr_wrapped(max_ids_per_chip_per_sample=2**60 + 1, trim_to_size=True),
        "invalid"),
    "csr_max_minibatches_2^58": (
        lambda: _minibatches_in_csr(max_minibatches_per_sc=2**58), "invalid"),
    "csr_max_ids_2^60+1": (
        lambda: _minibatches_in_csr(max_ids_per_chip_per_sample=2**60 + 1), "invalid"),
    "csr_num_replica_2^40": (lambda: _minibatches_in_csr(num_replica=2**40), "invalid"),
    "csr_num_sc_per_chip_2^20": (
        lambda: _minibatches_in_csr(num_sc_per_chip=2**20, sample_count=2**20), "invalid"),
    "csr_sample_count_max": (
        lambda: _minibatches_in_csr(sample_count=2**62), "invalid"),
    "csr_trimmed_max_minibatches_2^58": (
        lambda: _minibatches_in_csr(max_minibatches_per_sc=2**58, trim_to_size=True), "invalid"),
    # Layout stacker (layout.cc, pybind: ValueError)
    "stacker_sparse_cores_2^61": (lambda: _stacker(sparse_cores=2**61), "invalid"),
    "stacker_partitions_2^62": (lambda: _stacker(num_partitions=2**62), "invalid"),
    "stacker_vocabulary_max": (lambda: _stacker(height=I64), "invalid"),
    "stacker_width_max": (lambda: _stacker(width=I64), "invalid"),
}


def _run_case(name, graph):
    """Returns (outcome, message): outcome is 'ok', 'invalid' or 'other:<type>'."""
    import tensorflow as tf  # noqa: PLC0415
    call, _ = CASES[name]
    try:
        if graph:
            out = tf.function(call)()
        else:
            out = call()
        if out is not None:
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)
        return "ok", ""
    except tf.errors.InvalidArgumentError as e:
        return "invalid", e.message
    except ValueError as e:
        # Shape functions fail at trace time (ValueError from graph construction); the pybind
        # stacker reports with ValueError.
        return "invalid", str(e)
    except Exception as e:  # noqa: BLE001
        return f"other:{type(e).__name__}", str(e)[:500]


def _child_main(names):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415, F401
    for name in names:
        for graph in (False, True):
            if name.startswith("stacker") and graph:
                continue
            outcome, message = _run_case(name, graph)
            print(json.dumps({"case": name, "graph": graph, "outcome": outcome,
                              "message": message[:4000]}), flush=True)


# ------------------------------------------------------------------------------------------------
# The tests (parent): one child runs every case; each case is one test.
# ------------------------------------------------------------------------------------------------

# One pytest process runs every case (in the whole suite, pytest-xdist keeps a group on one
# process), and the child that runs them all starts once per process: cached, since xdist may tear
# a module's fixtures down between batches of its tests.
pytestmark = pytest.mark.xdist_group("hardening_attributes")


@pytest.fixture(scope="module")
def results():
    return _child_results()


@functools.lru_cache(maxsize=None)
def _child_results():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.ops.test_hardening_attributes", *CASES],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_SECONDS,
                              env=env, cwd=ROOT)
        stdout, returncode, stderr = proc.stdout, proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        returncode, stderr = "timeout", ""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            found[(record["case"], record["graph"])] = record
    return found, returncode, stderr[-3000:]


@pytest.mark.parametrize("name", list(CASES))
def test_attribute_case(results, name):
    found, returncode, stderr = results
    expected = CASES[name][1]
    for graph in (False, True):
        if name.startswith("stacker") and graph:
            continue
        record = found.get((name, graph))
        assert record is not None, (
            f"case {name} (graph={graph}) did not report: the child process ended with "
            f"{returncode} (negative = killed by that signal, 'timeout' = hang)\n{stderr}")
        assert record["outcome"] == expected, record
        if expected == "invalid" and not name.startswith("stacker"):
            assert f"'{TABLE}'" in record["message"], record
        if expected == "invalid" and "garbage" in record["message"]:
            pytest.fail(record)


if __name__ == "__main__":
    _child_main(sys.argv[1:] or list(CASES))
