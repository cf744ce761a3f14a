"""Randomized op-level fuzzer: calls every tf_sc_embedding op through its Python wrapper (eagerly
and inside tf.function) with random attributes and inputs, in child processes, and records every
case that kills the child (signal, abort, sanitizer report) or hangs it.

Cases are deterministic functions of (seed, index), so a recorded crash replays with
    python fuzz/op_fuzzer.py --seed S --replay INDEX
A child runs many cases in a row (importing TensorFlow once) and announces each before running it;
when the child dies or a case exceeds --timeout seconds, the announced case is recorded to
--crash-dir (a JSON file with the case, the signal / exit code and the child's stderr tail) and a
new child continues with the next case.

Usage: python fuzz/op_fuzzer.py [--cases N | --seconds T] [--seed S] [--timeout SECONDS]
                                [--crash-dir DIR] [--replay INDEX]
Exit status: 0 when no case crashed or hung, 1 otherwise.
"""
import argparse
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
I32 = 2**31 - 1
I64 = 2**63 - 1
PAD = 2**31 - 1
OPS = ("coo", "list_of_coo", "sort", "stats", "splits", "csr_wrapped", "minibatches_in_csr",
       "lookup", "grouped_lookup", "update", "update_in_place", "stacker", "finite_check", "raise_limits", "stacked_coo",
       "stacked_splits", "gathered_segment_sum", "replica_chunks",
       "id_routing", "owner_csr", "key_row_map", "key_hashes", "assign_rows")
OPTIMIZERS = ("sgd", "adagrad", "adagrad_momentum", "adam", "ftrl")


# ------------------------------------------------------------------------------------------------
# Case generation (pure Python, no TensorFlow): a case is a JSON-serialisable dict.
# ------------------------------------------------------------------------------------------------

def attr(rng, small_max=8, minimum=None):
    """An integer attribute: mostly small, sometimes a power of two, an extreme or anything."""
    choice = rng.random()
    if choice < 0.70:
        value = rng.randint(-1, small_max)
    elif choice < 0.82:
        value = 2 ** rng.randint(0, 62)
    elif choice < 0.94:
        value = rng.choice([I64, -I64 - 1, I32, 2**31, 2**32, 2**60 + 1, 2**33, -1, 0])
    else:
        value = rng.randint(-I64 - 1, I64)
    if minimum is not None and value < minimum and rng.random() < 0.8:
        value = minimum  # mostly respect the op-def minimum so the kernel is reached
    return value


LIVE_MAPS = []  # the key-to-row map of the case being run (see run_case)
NOISE = {"value": 0.15}  # per-element probability of an out-of-range value (set per case)


def int_list(rng, n, small_max=16):
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(rng.randint(0, small_max) if r >= NOISE["value"] else
                   rng.choice([PAD, -1, -2**31, I32 - 1, rng.randint(-2**31, I32)]))
    return out


def sorted_list(rng, n, step=3):
    value, out = 0, []
    for _ in range(n):
        value += rng.randint(0, step)
        out.append(value if rng.random() >= NOISE["value"] / 3 else rng.randint(-2**31, I32))
    return out


def float_list(rng, n):
    return [rng.choice([float("nan"), float("inf"), -float("inf"), 3e38])
            if rng.random() < NOISE["value"] / 3 else rng.uniform(-2, 2) for _ in range(n)]


def csr_buffers(rng, S, P, samples_per_sc, rows_per_shard, minibatches=1):
    """Mostly valid CSR-wrapped buffers (then randomly damaged)."""
    block = -(-P // 8) * 8
    row_pointers, samples, tokens, gains = [], [], [], []
    for _s in range(S):
        for _b in range(minibatches):
            for p in range(block):
                if p < P:
                    for _ in range(rng.randint(0, 3)):
                        samples.append(rng.randint(0, max(samples_per_sc - 1, 0)))
                        tokens.append(rng.randint(0, max(rows_per_shard - 1, 0)))
                        gains.append(rng.uniform(-1, 1))
                    while len(tokens) % 8:
                        samples.append(PAD)
                        tokens.append(PAD)
                        gains.append(float(PAD))
                row_pointers.append(len(tokens))
    if rng.random() < 2 * NOISE["value"]:  # damage
        target = rng.choice([row_pointers, samples, tokens])
        if target:
            target[rng.randrange(len(target))] = rng.choice(
                [-1, PAD, I32 - 1, rng.randint(-2**31, I32), 10**6])
    if rng.random() < NOISE["value"] / 2 and tokens:
        tokens.pop()
    return dict(row_pointers=row_pointers, samples=samples, tokens=tokens, gains=gains)


class _Attrs:
    """Attribute values for one case. In "valid" cases every attribute takes its known-good value
    except (usually) one, which is drawn at random; in "random" cases all are drawn at random."""

    def __init__(self, rng):
        self.rng = rng
        self.mode = rng.choice(["valid", "valid", "valid", "random"])
        self.mutate_probability = 0.0 if rng.random() < 0.25 else 0.3

    def __call__(self, good, small_max=8, minimum=None):
        if self.mode == "valid" and self.rng.random() >= self.mutate_probability:
            return good
        return attr(self.rng, small_max, minimum)

    def choice(self, good, options):
        """`good` in valid cases (unless mutated), else one of `options`."""
        if self.mode == "valid" and self.rng.random() >= self.mutate_probability:
            return good
        return self.rng.choice(options)


def make_case(seed, index):
    rng = random.Random(seed * 1_000_003 + index)
    op = rng.choice(OPS)
    case = {"op": op, "graph": rng.random() < 0.3}
    a = _Attrs(rng)
    NOISE["value"] = 0.005 if a.mode == "valid" else 0.15
    case["mode"] = a.mode
    if op in ("coo", "list_of_coo"):
        sample_count = a(4, 8, minimum=1)
        form = rng.choice(["dense", "ragged", "sparse", "sparse_bad"])
        n = rng.randint(0, 12)
        values = int_list(rng, n, 20)
        if form == "dense":
            index = []
        elif form == "ragged":
            index = [0] + sorted(rng.randint(0, n) for _ in range(max(min(sample_count, 8), 1) - 1)) + [n]
            if rng.random() < 0.2:
                index = sorted_list(rng, rng.randint(1, 9))
        else:
            rows = sorted_list(rng, n, 1)
            index = [[r, 0] for r in rows] if form == "sparse" else [[r] for r in rows]
        case.update(index=index, values=values,
                    weights=(float_list(rng, n) if rng.random() < 0.7 else rng.uniform(-1, 2)),
                    sample_count=sample_count, combiner=rng.choice(["sum", "mean", "sqrtn"]),
                    vocabulary_size=a(32, 32))
        if op == "list_of_coo":
            case.update(num_sc_per_chip=a(2, 4, minimum=1), row_offset=a(0, 8, 0),
                        col_offset=a(0, 64, 0), col_shift=a(0, 4, 0),
                        num_sc_shards=a(4, 8, 1), stacked_table_sample_count=a(sample_count, 16, 1))
    elif op in ("sort", "stats"):
        features = rng.randint(1, 3)
        lists = []
        for _ in range(features):
            n = rng.randint(0, 10)
            lists.append(dict(rows=sorted_list(rng, n, 1) if rng.random() < 0.8 else int_list(rng, n),
                              cols=int_list(rng, n if rng.random() < 0.9 else n + 1, 64),
                              gains=float_list(rng, n)))
        case.update(lists=lists,
                    sample_count_list=[a.choice(2, [2, 4, 0, -3, I32]) for _ in range(features)],
                    col_offset_list=[a.choice(8 * k, [0, 8, 64, I32]) for k in range(features)],
                    num_replica=a(1, 2, 1), num_sc_per_chip=a(4, 4, 1),
                    max_ids=a(256, 32, 1), max_uniques=a(256, 32, 1))
    elif op == "splits":
        n = rng.randint(0, 16)
        case.update(rows=sorted_list(rng, n, 1), cols=int_list(rng, n, 64),
                    gains=float_list(rng, n), sample_count=a(16, 8, 1),
                    num_replica=a(1, 2, 1), num_sc_per_chip=a(2, 4, 1),
                    table_vocab_size=a(65, 64, 1), max_ids=a(8, 8, 1),
                    max_uniques=a(8, 8, 1), max_division_level=a.choice(6, [0, 1, 3, 6, 7, -1]))
    elif op in ("csr_wrapped", "minibatches_in_csr"):
        S = rng.choice([1, 2, 4])
        P = S * rng.choice([1, 2])
        level = a.choice(6, [0, 2, 6, 6, 7])
        D = 2 ** min(max(level, 0), 6)
        per_sc_counts = a.choice(None, [P + 1, P * D + 1, S * P * D + 1, 1, 3])
        n = rng.randint(0, 10)
        if per_sc_counts is None:
            per_sc_counts = (P + 1 if rng.random() < 0.5 else P * D + 1) if op == "csr_wrapped" \
                else S * P * D + 1
        case.update(S=S, num_replica=a(P // S, 2, 1),
                    rows=int_list(rng, n, 4), cols=int_list(rng, n, 8), gains=float_list(rng, n),
                    counts=sorted_list(rng, per_sc_counts, 1),
                    splits=a.choice(rng.choice([0, 1, 5]), [0, 1, 5, 2**62, -1,
                                                             rng.randint(-2**63, I64)]),
                    sample_count=a(8, 8, 1), max_minibatches=a(64, 4, 1),
                    max_ids=a(8, 8, 1), max_division_level=level,
                    allow_id_dropping=rng.random() < 0.5, trim_to_size=rng.random() < 0.5)
    elif op in ("lookup", "grouped_lookup", "update", "update_in_place"):
        S = rng.choice([1, 2, 4])
        R = rng.choice([1, 2])
        samples_per_sc = rng.choice([0, 1, 2, 4])
        rows_per_shard = rng.choice([0, 1, 4])
        dim = rng.choice([0, 1, 3])
        minibatches = rng.choice([1, 1, 2])
        case.update(csr=csr_buffers(rng, S, S * R, samples_per_sc, rows_per_shard,
                                    minibatches=minibatches),
                    num_minibatches=a.choice(minibatches, [1, 1, 2, 0, -1, I32]),
                    table_rows=a.choice(S * R * rows_per_shard, list(range(10))),
                    dim=dim, input_size=a(S * samples_per_sc, 8),
                    attrs={k: attr(rng, 4) for k in ("num_sparsecores_per_device", "num_replica",
                                                     "num_source_replicas", "first_local_shard",
                                                     "num_local_shards") if a.mode == "random" or rng.random() < 0.1},
                    num_sc=S, num_replica_base=R,
                    optimizer=rng.choice(OPTIMIZERS), non_finite=rng.choice(["error", "skip"]),
                    grad_nan=rng.random() < 0.2, alias=rng.random() < 3 * NOISE["value"],
                    quantization=a.choice(rng.choice([(0.0, 0.0, 0), (-1.0, 1.0, 4)]),
                                          [(0.0, 0.0, 0), (-1.0, 1.0, 4),
                                           (-float("inf"), float("inf"), 3), (1.0, 1.0, 2)]),
                    # The lookup's feature-major order: none, a valid cut of the samples per
                    # SparseCore, or sizes that are negative, too many or overflow.
                    feature_rows=rng.choice([
                        [], [], [samples_per_sc], [1, max(samples_per_sc - 1, 0)],
                        [a(2, 4, 0) for _ in range(rng.randint(1, 3))],
                        [-1, samples_per_sc + 1], [2**62, 2**62, 2**62]]),
                    # The in-place update's gradients per feature (docs/optimizers.md#gradient-order):
                    # cut at the feature sizes, or at sizes off by one row.
                    grad_parts=rng.choice([None, None, "exact", "shifted"]),
                    # The grouped lookup's grouping: as grouped, or with one value replaced
                    # (which buffer, where, by what).
                    regroup=rng.choice([None, None, (rng.randint(0, 2), rng.randint(0, 64),
                                                     rng.choice([-1, 0, 1, 2**31 - 1, -2**31]))]))
    elif op == "finite_check":
        n = rng.randint(0, 4)
        case.update(flags=int_list(rng, n + a.choice(0, [0, 1, -1]), 2),
                    flag_rank=a.choice(1, [0, 1, 2]), names=n,
                    values=[float_list(rng, rng.randint(0, 3)) for _ in range(rng.randint(0, 2))])
    elif op in ("stacked_coo", "stacked_splits"):
        n = rng.randint(1, 3)
        sc = a(4, 4, 1)
        per = []
        offset = 0
        for _ in range(n):
            samples = a(4, 8, 1)
            values = int_list(rng, rng.randint(0, 10), 20)
            splits = [0] + sorted(rng.randint(0, len(values)) for _ in range(max(min(samples, 8), 1) - 1)) + [len(values)]
            per.append(dict(splits=splits if rng.random() < 0.9 else int_list(rng, 3),
                            values=values, weights=float_list(rng, len(values)),
                            sample_count=samples, row_offset=a.choice(offset, [0, -1, I32, 2**40]),
                            col_offset=a(0, 64, 0), col_shift=a(0, 4, 0), vocab=a(32, 32),
                            combiner=rng.choice(["sum", "mean", "sqrtn", "max"])))
            offset += max(samples, 0)
        case.update(features=per, sc=sc, shards=a(8, 8, 1), stacked=a.choice(offset, [offset, 0, 4, I32]),
                    short_list=rng.random() < 3 * NOISE["value"])
        if op == "stacked_splits":
            case.update(replicas=a(2, 4, 1), vocab=a(128, 512, 1), max_ids=a(64, 16, 1),
                        max_uniques=a(64, 16, 1), level=a(6, 7, 0))
    elif op == "raise_limits":
        tables = rng.randint(0, 3)
        rows = tables + a.choice(0, [0, 1, -1]) if tables else a.choice(0, [0, 1])
        case.update(tables=tables, limits=[[attr(rng, 300) for _ in range(2)]
                                           for _ in range(max(rows, 0))],
                    observed=[[attr(rng, 300) for _ in range(2)] for _ in range(max(rows, 0))])
    elif op == "key_row_map":
        def capacity():
            value = a(rng.randint(1, 12), 24)
            # Valid capacities above 2^16 would allocate up to 6 GiB: only the bound is probed.
            return 2**28 + 1 if 2**16 < value <= 2**28 else value
        universe = [rng.randint(-I64 - 1, I64) for _ in range(rng.randint(1, 12))]
        case.update(capacity=capacity(), threshold=a(rng.randint(1, 3), 3),
                    ttl=a(rng.randint(0, 3), 3), pending=capacity(), rank=a.choice(1, [0, 2]),
                    steps=[[a(i, 2**31 + 5, -1) if rng.random() < 0.2 else i,
                            [rng.choice(universe) for _ in range(rng.randint(0, 12))]]
                           for i in range(rng.randint(1, 5))],
                    state=[int_list(rng, rng.randint(0, 6), 2**40) for _ in range(5)],
                    last_step=attr(rng, 6), strings=rng.random() < 0.3,
                    # rows to number after the import: the last step's (often no longer given:
                    # an error), or arbitrary ones of any rank
                    number=rng.choice([None, "last", "last", "any"]),
                    number_rows=int_list(rng, rng.randint(0, 6), 30),
                    number_rank=a.choice(1, [0, 2]))
        if rng.random() < 0.5:  # a consistent state (unless mutated), so an import can succeed
            keys = sorted(set(case["state"][0]))
            case["state"] = [keys, [rng.randint(0, 3) for _ in keys], [], [], []]
            case["last_step"] = a(3, 6)
    elif op == "key_hashes":
        width = a(rng.randint(0, 6), 8)
        # Valid widths above 2^16 would allocate gigabytes: only the overflow bound is probed.
        width = 2**62 if 2**16 < width < 2**62 else width
        case.update(keys=[rng.randint(-I64 - 1, I64) for _ in range(rng.randint(0, 12))],
                    rank=a.choice(1, [0, 2]), shards=a(rng.randint(1, 8), 8), width=width,
                    seed=attr(rng, 100),
                    distribution=a.choice(rng.choice(["uniform", "normal", "truncated_normal"]),
                                          ["lognormal", ""]),
                    low=rng.choice([0.0, -1.5, 1e30, float("nan"), float("inf")]),
                    high=rng.choice([1.0, 0.25, -1e30, float("nan")]))
    elif op == "assign_rows":
        # The variable is small (its size is no argument of the op); rows and widths are probed.
        height, width, n = min(max(a(5, 9, 0), 0), 64), min(max(a(3, 6, 0), 0), 64), \
            rng.randint(0, 6)
        case.update(height=height, width=width, rows=int_list(rng, n, max(height, 1)),
                    values=[float_list(rng, min(max(a(width, 8, 0), 0), 70))
                            for _ in range(n + a.choice(0, [0, 1]))],
                    dtype=rng.choice(["float32", "bfloat16", "float16", "float64"]))
    elif op == "gathered_segment_sum":
        num_rows, width, n = a(6, 12, 0), rng.randint(0, 9), rng.randint(0, 12)
        case.update(rows=[float_list(rng, width) for _ in range(max(min(num_rows, 64), 0))],
                    width=width, positions=int_list(rng, n, max(num_rows - 1, 0)),
                    gains=float_list(rng, n + a.choice(0, [0, 1, -1])),
                    segments=int_list(rng, n, 20), num_segments=a(21, 40),
                    rows_rank=a.choice(2, [1, 2, 3]))
    elif op == "replica_chunks":
        replicas, tables = a(2, 4, 1), rng.randint(1, 3)
        widths = [a(rng.choice([1, 4]), 8, 1) for _ in range(tables)]
        columns = tables + a.choice(0, [0, 1])   # one column too many: a mismatch
        counts = [int_list(rng, columns, 3) for _ in range(max(min(replicas, 6), 0))]
        case.update(counts=counts, widths=widths, chunk=a(12, 64), ids=rng.random() < 0.5,
                    rows_off_by=a.choice(0, [0, 1, -1]), buffer_off_by=a.choice(0, [0, 1, -1]),
                    index_off_by=a.choice(0, [0, 1, -1]), multiples=[a(2, 4, 0) for _ in widths])
    elif op == "id_routing":
        n = rng.randint(0, 40)
        # Sample rows for the partition statistics: sorted in [0, 4 * 10) when valid, then
        # perhaps one too many / few, unsorted or noisy; rows_per_sparse_core 0 skips them.
        row_ids = sorted(rng.randint(0, 39) for _ in range(n + a.choice(0, [0, 1, -1])))
        if rng.random() < NOISE["value"]:
            rng.shuffle(row_ids)
        row_ids = [r if rng.random() >= NOISE["value"] / 4 else int_list(rng, 1, 63)[0]
                   for r in row_ids]
        case.update(replicas=a(2, 4, 1), sparse_cores=a(4, 4, 1), rows_per_shard=a(8, 16, 1),
                    ids=int_list(rng, n, 63), rank=a.choice(1, [0, 1, 2]),
                    row_ids=row_ids, rows_per_sparse_core=a.choice(10, [0, 0, 1, 10, a(10, 16, 0)]),
                    row_rank=a.choice(1, [0, 1, 2]))
    elif op == "owner_csr":
        case.update(replicas=a(2, 4, 1), sparse_cores=a(4, 4, 1), rows_per_shard=a(8, 16, 1),
                    replica_id=a(1, 4, 0), rows=int_list(rng, rng.randint(0, 40), 31))
    elif op == "stacker":
        case.update(num_partitions=a(2, 4), sparse_cores=a(4, 4),
                    tables=[(a(100, 1000), a(8, 64), a(16, 32)) for _ in
                            range(rng.randint(1, 4))])
    return case


# ------------------------------------------------------------------------------------------------
# Case execution (in the child).
# ------------------------------------------------------------------------------------------------

LAST_MESSAGE = {"text": ""}


def run_case(case):
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tf_sc_embedding import _core, ops  # noqa: PLC0415
    from tf_sc_embedding.ops.fused_update import fused_update_function  # noqa: PLC0415

    i32 = lambda x: np.asarray(x, np.int64).astype(np.int32)  # noqa: E731 (wraps like a tensor)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    op = case["op"]
    T = "fuzz_table"

    def call():
        if op in ("coo", "list_of_coo"):
            index = case["index"]
            index = i32(index) if index else np.zeros([0], np.int32)
            common = dict(sample_count=case["sample_count"], combiner=case["combiner"],
                          vocabulary_size=case["vocabulary_size"], table_name=T, feature_name="f")
            if op == "coo":
                return ops.convert_to_coo_tensor(index, i32(case["values"]), f32(case["weights"]),
                                                 **common)
            return ops.convert_to_list_of_sparse_core_coo_tensors(
                index, i32(case["values"]), f32(case["weights"]),
                num_sc_per_chip=case["num_sc_per_chip"], row_offset=case["row_offset"],
                col_offset=case["col_offset"], col_shift=case["col_shift"],
                num_sc_shards=case["num_sc_shards"],
                stacked_table_sample_count=case["stacked_table_sample_count"], **common)
        if op in ("sort", "stats"):
            args = dict(row_ids_list=[i32(x["rows"]) for x in case["lists"]],
                        col_ids_list=[i32(x["cols"]) for x in case["lists"]],
                        gains_list=[f32(x["gains"]) for x in case["lists"]],
                        sample_count_list=case["sample_count_list"],
                        col_offset_list=case["col_offset_list"], num_replica=case["num_replica"],
                        table_vocab_size=64, feature_width=8,
                        num_sc_per_chip=case["num_sc_per_chip"], table_name=T)
            if op == "stats":
                return ops.get_stats_from_list_of_sparse_core_coo_tensors(**args)
            return ops.sort_list_of_sparse_core_coo_tensors(
                max_ids_per_sparse_core=case["max_ids"],
                max_unique_ids_per_sparse_core=case["max_uniques"], **args)
        if op == "splits":
            return ops.get_minibatch_splits_with_physical_replica(
                ["k"], i32(case["rows"]), i32(case["cols"]), f32(case["gains"]),
                sample_count=case["sample_count"], num_replica=case["num_replica"],
                table_vocab_size=case["table_vocab_size"], feature_width=8,
                num_sc_per_chip=case["num_sc_per_chip"], table_name=T, mini_batch_splits="",
                max_ids_per_partition=case["max_ids"],
                max_unique_ids_per_partition=case["max_uniques"],
                max_division_level=case["max_division_level"])
        if op == "csr_wrapped":
            S = case["S"]
            return ops.convert_to_sparse_core_csr_wrapped_coo_tensor(
                [i32(case["rows"])] * S, [i32(case["cols"])] * S, [f32(case["gains"])] * S,
                [i32(case["counts"])] * S, np.int64(case["splits"]),
                sample_count_per_sc=case["sample_count"], num_replica=case["num_replica"],
                max_minibatches_per_sc=case["max_minibatches"],
                max_ids_per_chip_per_sample=case["max_ids"], table_vocab_size=64,
                feature_width=8, table_name=T, allow_id_dropping=case["allow_id_dropping"],
                max_division_level=case["max_division_level"], trim_to_size=case["trim_to_size"])
        if op == "minibatches_in_csr":
            return ops.get_minibatches_in_csr_with_physical_replica(
                ["k"], i32(case["rows"]), i32(case["cols"]), f32(case["gains"]),
                np.int64(case["splits"]), i32(case["counts"]), sample_count=case["sample_count"],
                num_replica=case["num_replica"], max_minibatches_per_sc=case["max_minibatches"],
                max_ids_per_chip_per_sample=case["max_ids"], table_vocab_size=64,
                feature_width=8, num_sc_per_chip=case["S"], table_name=T,
                mini_batch_in_csr="", allow_id_dropping=case["allow_id_dropping"],
                max_division_level=case["max_division_level"], trim_to_size=case["trim_to_size"])
        if op in ("lookup", "grouped_lookup", "update", "update_in_place"):
            csr = case["csr"]
            rng = np.random.default_rng(0)
            table = rng.normal(size=(case["table_rows"], case["dim"])).astype(np.float32)
            attrs = dict(num_sparsecores_per_device=case["num_sc"], num_replica=case["num_replica_base"])
            attrs.update(case["attrs"])
            buffers = (i32(csr["row_pointers"]), i32(csr["samples"]), i32(csr["tokens"]),
                       f32(csr["gains"]))
            minibatches = np.int64(case["num_minibatches"]).astype(np.int32)
            if op == "grouped_lookup":
                grouping = list(ops.group_lookup_entries(
                    *buffers, minibatches, case["input_size"], case["table_rows"], T,
                    feature_rows_per_sc=case["feature_rows"], **attrs))
                if case.get("regroup"):   # (eager or traced: the call may run in a tf.function)
                    which, where, value = case["regroup"]
                    t = grouping[which]
                    n = tf.size(t)
                    hit = tf.equal(tf.range(n), tf.math.floormod(where, tf.maximum(n, 1)))
                    grouping[which] = tf.where(hit, tf.cast(value, t.dtype), t)
                return ops.sparse_dense_matmul_grouped(*grouping, table, T)
            if op == "lookup":
                q = case["quantization"]
                return ops.xla_sparse_dense_matmul_with_csr_input(
                    *buffers, table, minibatches, case["input_size"], q[0], q[1], q[2], T,
                    feature_rows_per_sc=case["feature_rows"], **attrs)
            rows = max(case["input_size"], 0) if case["input_size"] < 4096 else 3
            grads = rng.normal(size=(rows, case["dim"])).astype(np.float32)
            if case["grad_nan"] and grads.size:
                grads.flat[0] = np.nan
            definition = ops.OPTIMIZERS[case["optimizer"]]
            hypers = {h: (False if kind == "bool" else 0.5) for h, kind in definition.hyperparameters}
            slots = [np.full(table.shape, 0.5, np.float32) for _ in definition.slots]
            extra = {}
            if op == "update_in_place" and case["grad_parts"] and case["feature_rows"]:
                sources = case["num_sc"] * case["num_replica_base"]
                cuts = [max(min(sources * r, len(grads)), 0) for r in case["feature_rows"]]
                if case["grad_parts"] == "shifted":
                    cuts[0] += 1
                grads = np.split(grads, np.minimum(np.cumsum(cuts)[:-1], len(grads)))
            if op == "update_in_place" and case["feature_rows"]:
                extra["feature_rows_per_sc"] = case["feature_rows"]
            if op == "update_in_place":
                variables = [tf.Variable(x) for x in [table] + slots]
                if case["alias"] and len(variables) > 1:
                    variables[1] = variables[0]
                table, slots = variables[0], variables[1:]
            return fused_update_function(case["optimizer"])(
                *buffers, grads, np.float32(0.1), table, *slots, minibatches, table_name=T,
                non_finite_gradients=case["non_finite"], return_num_skipped_rows=True,
                **hypers, **attrs, **extra)
        if op == "finite_check":
            from tf_sc_embedding.ops import gradient_check  # noqa: PLC0415
            flags = i32(case["flags"])
            if case["flag_rank"] != 1:
                flags = flags.reshape([1] * case["flag_rank"]) if flags.size == 1 else \
                    flags.reshape([flags.size, 1])
            names = [f"f{i}" for i in range(case["names"])]
            return gradient_check.require_finite_gradients(
                flags, [f32(v) for v in case["values"]], names, [T] * len(names))
        if op in ("stacked_coo", "stacked_splits"):
            fs = case["features"]
            lists = dict(sample_counts=[f["sample_count"] for f in fs],
                         row_offsets=[f["row_offset"] for f in fs],
                         col_offsets=[f["col_offset"] for f in fs],
                         col_shifts=[f["col_shift"] for f in fs],
                         vocabulary_sizes=[f["vocab"] for f in fs],
                         combiners=[f["combiner"] for f in fs], table_names=[T] * len(fs),
                         feature_names=[f"f{i}" for i in range(len(fs))])
            if case["short_list"]:
                lists["col_offsets"] = lists["col_offsets"][:-1]
            inputs = ([i32(f["splits"]) for f in fs], [i32(f["values"]) for f in fs],
                      [f32(f["weights"]) for f in fs])
            stacking = dict(num_sc_per_chip=case["sc"], num_sc_shards=case["shards"],
                            stacked_table_sample_count=case["stacked"])
            if op == "stacked_splits":
                return ops.preprocessing.convert_features_to_minibatch_splits(
                    *inputs, **stacking, **lists, num_replica=case["replicas"],
                    table_vocab_size=case["vocab"], table_name=T,
                    max_ids_per_partition=case["max_ids"],
                    max_unique_ids_per_partition=case["max_uniques"],
                    max_division_level=case["level"])
            return ops.preprocessing.convert_features_to_stacked_coo_tensor(
                *inputs, **stacking, **lists)
        if op == "raise_limits":
            from tf_sc_embedding.ops.online_limits import raise_sparse_core_limits  # noqa
            shape = [len(case["limits"]), 2]
            limits = tf.Variable(i32(case["limits"]).reshape(shape))
            return raise_sparse_core_limits(limits, i32(case["observed"]).reshape(shape),
                                            [f"t{k}" for k in range(case["tables"])])
        if op == "key_row_map":
            from tf_sc_embedding.ops import key_row_map  # noqa: PLC0415
            strings = case.get("strings", False)
            m = key_row_map.KeyRowMap(T, case["capacity"], case["threshold"], case["ttl"],
                                      case["pending"], key_dtype=tf.string if strings else tf.int64)
            # A traced function only captures the handle; the map lives as long as its object.
            LIVE_MAPS[:] = [m]
            outputs = []
            for step, keys in case["steps"]:
                keys = np.array([str(k).encode() for k in keys] if strings else keys,
                                object if strings else np.int64)
                if case["rank"] != 1:
                    keys = keys.reshape([1] * case["rank"]) if keys.size == 1 else \
                        keys.reshape([-1, 1])
                outputs.append(tuple(m.map_step(keys, np.int64(step))))
            keys, last_seen, pending_keys, counts, pending_seen = case["state"]
            last_seen, pending_keys, counts, pending_seen = (
                np.array(last_seen, np.int64).astype(np.int32), np.array(pending_keys, np.int64),
                np.array(counts, np.int64).astype(np.int32),
                np.array(pending_seen, np.int64).astype(np.int32))
            if strings:
                m.import_state(key_row_map.StringKeyRowMapState(
                    np.int64(case["last_step"]), np.array([str(k).encode() for k in keys],
                                                          object), None, None, last_seen,
                    pending_keys, counts, pending_seen))
            else:
                m.import_state(key_row_map.KeyRowMapState(
                    np.int64(case["last_step"]), np.array(keys, np.int64), None, last_seen,
                    pending_keys, counts, pending_seen))
            if case.get("number"):   # last: it fails often
                rows = (outputs[-1][0] if case["number"] == "last" and outputs
                        else np.array(case["number_rows"], np.int64).astype(np.int32))
                if case["number_rank"] == 0:
                    rows = tf.reshape(tf.concat([tf.reshape(rows, [-1]), [0]], 0)[0], [])
                elif case["number_rank"] == 2:
                    rows = tf.reshape(rows, [-1, 1])
                outputs.append(tuple(m.number_rows(rows)))
            return outputs, tuple(m.export())
        if op == "key_hashes":
            from tf_sc_embedding.ops import key_row_map  # noqa: PLC0415
            keys = np.array(case["keys"], np.int64)
            if case["rank"] != 1:
                keys = keys.reshape([1] * case["rank"]) if keys.size == 1 else \
                    keys.reshape([-1, 1])
            return (key_row_map.key_owner_shards(keys, case["shards"]),
                    key_row_map.keyed_random_rows(keys, case["seed"], case["width"],
                                                  case["distribution"], case["low"],
                                                  case["high"]),
                    tuple(key_row_map.group_keys_by_owner(keys, case["shards"])),
                    key_row_map.repeat_indices(np.clip(keys, -3, 7).astype(np.int32)))
        if op == "assign_rows":
            from tf_sc_embedding.ops.assign_rows import assign_rows  # noqa: PLC0415
            variable = tf.Variable(tf.zeros([case["height"], case["width"]], case["dtype"]))
            widths = {len(v) for v in case["values"]}
            values = (f32(case["values"]) if len(widths) == 1 else
                      np.zeros([len(case["values"]), 1], np.float32))
            values = values.reshape([len(case["values"]), -1]) if values.size else \
                np.zeros([len(case["values"]), 0], np.float32)
            assign_rows(variable, i32(case["rows"]), values, T)
            return variable.read_value()
        if op == "gathered_segment_sum":
            from tf_sc_embedding.ops.segment_sum import gathered_segment_sum  # noqa: PLC0415
            rows = f32(case["rows"]).reshape([len(case["rows"]), case["width"]])
            if case["rows_rank"] != 2:
                rows = rows.reshape([-1] + [1] * (case["rows_rank"] - 1))
            from tf_sc_embedding.ops import segment_sum  # noqa: PLC0415
            stacked = gathered_segment_sum(rows, i32(case["positions"]), f32(case["gains"]),
                                           i32(case["segments"]),
                                           np.int64(case["num_segments"]).astype(np.int32),
                                           table_name=T)
            # The per-feature forms: 2 SparseCores, features of 3 and 7 rows each (segment ids up
            # to 20 stay inside the stacked rows only by chance).
            to_features = segment_sum.gathered_segment_sum_to_features(
                rows, i32(case["positions"]), f32(case["gains"]), i32(case["segments"]), 2,
                [3, 7], table_name=T)
            from_features = segment_sum.gathered_segment_sum_from_features(
                [np.ones([6, max(case["width"], 1)], np.float32),
                 np.ones([14, max(case["width"], 1)], np.float32)], i32(case["segments"]),
                f32(case["gains"]), i32(case["positions"]),
                np.int64(case["num_segments"]).astype(np.int32), 2, [3, 7], table_name=T)
            # Positions through row indices (fuzzed the same way): positions index the indices.
            # Last, as it fails more often than the calls above and would skip them.
            indexed = segment_sum.gathered_segment_sum_to_features(
                rows, i32(case["positions"]), f32(case["gains"]), i32(case["segments"]), 2,
                [3, 7], row_indices=i32(case["positions"]), table_name=T)
            return stacked, to_features, from_features, indexed
        if op == "replica_chunks":
            from tf_sc_embedding.ops import replica_chunks  # noqa: PLC0415
            counts = i32(case["counts"]).reshape([len(case["counts"]), -1]) if case["counts"] \
                else np.zeros([0, len(case["widths"])], np.int32)
            totals = counts.sum(axis=0) if counts.size else [0] * len(case["widths"])
            dtype = np.int32 if case["ids"] else np.float32
            # Values as large as the counts claim, within what the child can allocate (a larger
            # claim gets an empty tensor, which the op must reject).
            rows = [int(n) + case["rows_off_by"] for n in totals]
            values = [np.ones([r if 0 <= r <= 4096 else 0, min(max(w, 0), 64)], dtype)
                      for r, w in zip(rows, case["widths"])]
            chunk = np.int64(case["chunk"]).astype(np.int32)
            packed = replica_chunks.pack_replica_chunks(values, counts, chunk)
            size = counts.shape[0] * int(chunk) + case["buffer_off_by"]
            buffer = np.ones([size if 0 <= size <= 1 << 20 else 0], dtype)
            unpacked = replica_chunks.unpack_replica_chunks(
                buffer, counts, case["widths"], row_multiples=case["multiples"])
            # The gathered pack reads rows of params by index; an index one past the params, or
            # negative, must be rejected.
            params = [np.ones([v.shape[0] + 1, max(v.shape[1], 1)], np.float32) for v in values]
            indices = [np.full([v.shape[0]], {0: 0, 1: v.shape[0] + 1, -1: -1}.get(
                case["index_off_by"], 0), np.int32) for v in values]
            gathered = replica_chunks.pack_gathered_replica_chunks(params, indices, counts, chunk)
            return packed, unpacked, gathered
        if op == "id_routing":
            from tf_sc_embedding.ops.id_routing import route_ids_to_owners  # noqa: PLC0415
            ids = i32(case["ids"])
            if case["rank"] != 1:
                ids = ids.reshape([1] * case["rank"]) if ids.size == 1 else ids.reshape([-1, 1])
            row_ids = i32(case.get("row_ids", []))
            if case.get("row_rank", 1) != 1:
                row_ids = row_ids.reshape([1] * case["row_rank"]) if row_ids.size == 1 \
                    else row_ids.reshape([-1, 1])
            return tuple(route_ids_to_owners(
                ids, case["replicas"], case["sparse_cores"], case["rows_per_shard"],
                row_ids=row_ids, rows_per_sparse_core=case.get("rows_per_sparse_core", 0),
                table_name=T))
        if op == "owner_csr":
            from tf_sc_embedding.ops.owner_csr import owner_csr  # noqa: PLC0415
            return tuple(owner_csr(i32(case["rows"]), case["replicas"], case["sparse_cores"],
                                   case["rows_per_shard"], case["replica_id"], table_name=T))
        if op == "stacker":
            stacker = _core.LayoutStacker(case["num_partitions"], case["sparse_cores"])
            for k, (height, width, samples) in enumerate(case["tables"]):
                stacker.add_table(f"t{k}", height, width, "g", samples, 1)
            return [repr(t) for t in stacker.get_layouts()]
        raise AssertionError(op)

    def materialize(out):
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)

    try:
        if case["graph"] and op not in ("stacker", "update_in_place"):
            materialize(tf.function(call)())
        else:
            materialize(call())
        return "ok"
    except tf.errors.OpError as e:
        LAST_MESSAGE["text"] = e.message
        return type(e).__name__
    except (ValueError, TypeError, OverflowError) as e:
        LAST_MESSAGE["text"] = str(e)
        return type(e).__name__


def child_main(seed, start, stop):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # noqa: PLC0415, F401
    print("READY", flush=True)
    # Self-test of the crash recording: SCE_OP_FUZZ_SELFTEST="abort:I" or "hang:I" makes case I
    # abort the child or hang (tests/ops/test_hardening_fuzz.py).
    kind, _, at = os.environ.get("SCE_OP_FUZZ_SELFTEST", "").partition(":")
    for index in range(start, stop):
        print(f"START {index}", flush=True)
        if kind and int(at) == index:
            if kind == "abort":
                os.abort()
            time.sleep(3600)
        outcome = run_case(make_case(seed, index))
        print(f"END {index} {outcome}", flush=True)


# ------------------------------------------------------------------------------------------------
# The parent: schedules children, watches for deaths and hangs, records crashes.
# ------------------------------------------------------------------------------------------------

def _reader(stream, q):
    for line in stream:
        q.put(line.rstrip("\n"))
    q.put(None)


def fuzz(seed, num_cases, seconds, timeout, crash_dir, batch=400):
    os.makedirs(crash_dir, exist_ok=True)
    deadline = time.monotonic() + seconds if seconds else None
    outcomes, crashes, executed, index = {}, [], 0, 0
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    stderr_path = os.path.join(crash_dir, ".child_stderr")

    def more():
        return (num_cases is None or index < num_cases) and \
            (deadline is None or time.monotonic() < deadline)

    while more():
        stop = index + batch if num_cases is None else min(num_cases, index + batch)
        with open(stderr_path, "w") as stderr_file:
            child = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child", str(seed), str(index),
                 str(stop)], stdout=subprocess.PIPE, stderr=stderr_file, text=True, env=env,
                cwd=ROOT, start_new_session=True)
        lines = queue.Queue()
        threading.Thread(target=_reader, args=(child.stdout, lines), daemon=True).start()
        current, limit = None, time.monotonic() + 180  # startup: importing TensorFlow
        while True:
            if current is None and deadline is not None and time.monotonic() > deadline:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                break
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() < limit:
                    continue
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                if current is None:
                    raise RuntimeError("the fuzzing child did not start: " +
                                       open(stderr_path).read()[-2000:])
                crashes.append(_record(crash_dir, seed, current, "hang", None, stderr_path))
                executed, index = executed + 1, current + 1
                break
            if line is None:  # the child exited
                code = child.wait()
                if current is not None:
                    crashes.append(_record(crash_dir, seed, current, "death", code, stderr_path))
                    executed, index = executed + 1, current + 1
                elif code != 0:
                    raise RuntimeError(f"fuzzing child exited with {code} between cases: " +
                                       open(stderr_path).read()[-2000:])
                break
            if line.startswith("START "):
                current, limit = int(line.split()[1]), time.monotonic() + timeout
            elif line.startswith("END "):
                _, done, outcome = line.split(maxsplit=2)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                executed, index, current = executed + 1, int(done) + 1, None
    summary = {"seed": seed, "cases": executed, "crashes": len(crashes), "outcomes": outcomes,
               "crash_files": crashes}
    with open(os.path.join(crash_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _record(crash_dir, seed, index, kind, code, stderr_path):
    case = make_case(seed, index)
    name = os.path.join(crash_dir, f"crash-seed{seed}-case{index}.json")
    try:
        stderr_tail = open(stderr_path, errors="replace").read()[-6000:]
    except OSError:
        stderr_tail = ""
    signal_name = None
    if code is not None and code < 0:
        signal_name = signal.Signals(-code).name
    with open(name, "w") as f:
        json.dump({"seed": seed, "index": index, "kind": kind, "exit_code": code,
                   "signal": signal_name, "case": case, "stderr_tail": stderr_tail,
                   "replay": f"python fuzz/op_fuzzer.py --seed {seed} --replay {index}"},
                  f, indent=1)
    print(f"CRASH ({kind}, exit {code} {signal_name or ''}): case {index} -> {name}",
          file=sys.stderr)
    return name


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.path.insert(0, ROOT)
        child_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=None, help="number of cases (default 200 "
                        "unless --seconds is given)")
    parser.add_argument("--seconds", type=float, default=None, help="fuzz for this long instead")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--timeout", type=float, default=30.0, help="per-case timeout (hang)")
    parser.add_argument("--crash-dir", default=os.path.join(ROOT, "build", "fuzz", "op_crashes"))
    parser.add_argument("--replay", type=int, default=None, help="run one case in-process")
    parser.add_argument("--show", type=int, default=None, help="print one case")
    args = parser.parse_args()
    if args.show is not None:
        print(json.dumps(make_case(args.seed, args.show), indent=1))
        return 0
    if args.replay is not None:
        sys.path.insert(0, ROOT)
        case = make_case(args.seed, args.replay)
        print(json.dumps(case))
        print(run_case(case), LAST_MESSAGE["text"])
        return 0
    num_cases = args.cases if args.cases is not None or args.seconds else 200
    summary = fuzz(args.seed, num_cases, args.seconds, args.timeout, args.crash_dir)
    print(json.dumps({k: v for k, v in summary.items() if k != "crash_files"}))
    return 1 if summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
