"""Property tests: forward lookup, every fused optimizer (functional and in-place forms) and the
layout stacker against the numpy/python references in tests/reference (docs/layout.md#table-layout, docs/preprocessing.md#csr-wrapped-coo-buffers, docs/lookup.md#forward-lookup)."""
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tests.reference import layout as ref_layout  # noqa: E402
from tests.reference import lookup as ref  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.tables.layout import LayoutStacker  # noqa: E402
from tf_sc_embedding.ops.fused_update import fused_update_function  # noqa: E402

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])
FWD_RTOL = 1e-5
UPD_RTOL, UPD_ATOL = 1e-5, 1e-6


# ------------------------------------------------------------------------------------------------
# Random CSR cases
# ------------------------------------------------------------------------------------------------

@st.composite
def csr_cases(draw):
    """Structure from hypothesis, bulk data from a seeded numpy generator (fast, reproducible)."""
    sc_arg = draw(st.sampled_from([1, 2, 4, -1]))  # -1 means the default of 4
    num_sc = ref.resolve_sc(sc_arg)
    num_replica = draw(st.sampled_from([1, 2, 4]))
    num_shards = num_sc * num_replica
    case = dict(
        sc_arg=sc_arg, num_sc=num_sc, num_replica=num_replica, num_shards=num_shards,
        num_minibatches=draw(st.integers(1, 3)),
        rows_per_shard=draw(st.integers(1, 6)),
        dim=draw(st.integers(1, 9)),
        samples_per_sc=draw(st.integers(1, 4)),
        max_per_segment=draw(st.integers(0, 6)),
        empty_fraction=draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
        # Heavy duplicates: tokens from a small prefix of the shard.
        token_range=draw(st.integers(1, 6)),
        pad_inside=draw(st.booleans()),
        sorted_segments=draw(st.sampled_from([True, True, False])),
        extra_ids=draw(st.integers(0, 24)),
        extra_row_pointers=draw(st.integers(0, 16)),
        seed=draw(st.integers(0, 2 ** 32 - 1)),
    )
    rng = np.random.default_rng(case["seed"])
    token_range = min(case["token_range"], case["rows_per_shard"])
    segments = {}
    for s in range(num_sc):
        for b in range(case["num_minibatches"]):
            for p in range(num_shards):
                if rng.random() < case["empty_fraction"]:
                    continue
                n = int(rng.integers(0, case["max_per_segment"] + 1))
                entries = []
                for _ in range(n):
                    sample = int(rng.integers(0, case["samples_per_sc"]))
                    token = int(rng.integers(0, token_range))
                    gain = float(rng.choice([1.0, 0.0, -0.5, rng.normal(), rng.uniform(0, 2)]))
                    if case["pad_inside"] and rng.random() < 0.1:
                        # Padding inside the valid range of a segment is ignored (docs/lookup.md#reading-the-csr-buffers).
                        if rng.random() < 0.5:
                            sample = ref.PAD
                        else:
                            token = ref.PAD
                    entries.append((sample, token, gain))
                if case["sorted_segments"]:
                    entries.sort(key=lambda e: e[1])
                segments[(s, b, p)] = entries
    block = ref.round_up(num_shards, ref.XLA_PAD)
    rp, sa, to, ga = ref.pack_csr(
        segments, num_sc, case["num_minibatches"], num_shards,
        row_pointer_capacity=num_sc * case["num_minibatches"] * block + case["extra_row_pointers"],
        ids_capacity=sum(len(v) + 8 for v in segments.values()) + case["extra_ids"], rng=rng)
    case.update(row_pointers=rp, sample_ids=sa, token_ids=to, gains=ga,
                input_size=num_sc * case["samples_per_sc"],
                table_rows=num_shards * case["rows_per_shard"], rng=rng)
    return case


def _table(case, scale=1.0):
    return (case["rng"].normal(size=(case["table_rows"], case["dim"])) * scale).astype(np.float32)


def _touched(case):
    return ref.touched_rows(case["row_pointers"], case["sample_ids"], case["token_ids"],
                            case["num_minibatches"], case["num_sc"], case["num_shards"],
                            case["rows_per_shard"])


# ------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------

@st.composite
def quantization_configs(draw):
    if draw(st.booleans()):
        return 0.0, 0.0, 0
    low = draw(st.floats(-2.0, 1.0, width=32))
    high = float(np.float32(low + draw(st.floats(0.01, 3.0))))
    if not np.float32(low) < np.float32(high):
        return 0.0, 0.0, 0
    return float(low), float(high), draw(st.integers(2, 17))


@settings(max_examples=500, **SETTINGS)
@given(case=csr_cases(), quant=quantization_configs())
def test_forward_matches_reference(case, quant):
    table = _table(case, scale=2.0)
    args = (case["row_pointers"], case["sample_ids"], case["token_ids"], case["gains"])
    kwargs = dict(num_minibatches_per_physical_sparse_core=np.int32(case["num_minibatches"]),
                  input_size=case["input_size"], quantization_config_low=quant[0],
                  quantization_config_high=quant[1], quantization_config_num_buckets=quant[2],
                  table_name="fwd", num_sparsecores_per_device=case["sc_arg"],
                  num_replica=case["num_replica"])
    expected = ref.sparse_dense_matmul(
        *args, table, case["num_minibatches"], case["input_size"], *quant,
        num_sparsecores_per_device=case["sc_arg"], num_replica=case["num_replica"])
    table_before = table.copy()
    got = ops.xla_sparse_dense_matmul_with_csr_input(*args, embedding_table=table, **kwargs)
    assert got.shape == (case["input_size"], case["dim"])
    assert got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=FWD_RTOL, atol=1e-6)
    np.testing.assert_array_equal(table, table_before)
    # The resource-variable form reads the variable in place and gives the same bits.
    var = tf.Variable(table)
    got_var = ops.xla_sparse_dense_matmul_with_csr_input(*args, embedding_table=var, **kwargs)
    np.testing.assert_array_equal(got_var.numpy(), got.numpy())
    np.testing.assert_array_equal(var.numpy(), table_before)


# ------------------------------------------------------------------------------------------------
# Fused updates
# ------------------------------------------------------------------------------------------------

# Ranges of every float hyperparameter the op library declares (by op attribute name). A new
# optimizer/hyperparameter in OPTIMIZERS without an entry here fails the test loudly.
FLOAT_HYPER_STRATEGIES = {
    "exponent": st.sampled_from([2.0, 1.0, 3.0, 0.5, 4.0, 2.5]),
    "beta1": st.sampled_from([0.0, 0.9, 0.5, 0.99, 0.1]),
    "beta2": st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.0]),
    "epsilon": st.sampled_from([1e-10, 1e-7, 1e-3, 0.1, 1.0]),
    "beta": st.sampled_from([0.0, 0.1, 1.0, 0.5]),
    "learning_rate_power": st.sampled_from([-0.5, -0.5, -1.0, -0.25, -0.75, 0.0]),
    "l1_regularization_strength": st.sampled_from([0.0, 0.0, 0.01, 0.1, 1.0]),
    "l2_regularization_strength": st.sampled_from([0.0, 0.01, 0.1, 1.0]),
}


def _slot_init(name, rng, shape):
    """Initial slot values valid for the optimizer math (accumulators > 0, velocity >= 0)."""
    if name == "accumulator":
        return rng.uniform(0.05, 3.0, shape).astype(np.float32)
    if name == "velocity":
        return rng.uniform(0.0, 2.0, shape).astype(np.float32)
    return rng.normal(size=shape).astype(np.float32)


@st.composite
def optimizer_settings(draw, definition, dim):
    hypers = {}
    for name, kind in definition.hyperparameters:
        if kind == "bool":
            hypers[name] = draw(st.booleans())
        elif kind == "row_width":   # the embedding's columns: all of the row, or fewer (padding)
            hypers[name] = draw(st.integers(1, dim))
        else:
            assert name in FLOAT_HYPER_STRATEGIES, f"no test range for hyperparameter {name}"
            hypers[name] = draw(FLOAT_HYPER_STRATEGIES[name])
    lr = draw(st.sampled_from([0.01, 0.1, 0.5, 1.0, 0.003]))
    clip = draw(st.sampled_from([None, None, (-0.5, 0.5), (-math.inf, 0.3), (-0.2, math.inf),
                                 (0.25, 0.25)]))
    return hypers, lr, clip


def _run_update(fn, case, definition, grads, lr, table, slots, hypers, clip):
    kwargs = dict(hypers)
    if clip is not None:
        kwargs.update(clip_weight_min=clip[0], clip_weight_max=clip[1])
    args = [case["row_pointers"], case["sample_ids"], case["token_ids"], case["gains"], grads,
            np.float32(lr)]
    return fn(*args, table, *slots, np.int32(case["num_minibatches"]), **kwargs,
              table_name="tbl_" + definition.name, num_sparsecores_per_device=case["sc_arg"],
              num_replica=case["num_replica"])


def _check_update(name, case, opt):
    definition = ops.OPTIMIZERS[name]
    fn = fused_update_function(name)
    hypers, lr, clip = opt
    rng = case["rng"]
    table = _table(case)
    slots = [_slot_init(s, rng, (table.shape[0], definition.slot_width(s, table.shape[1])))
             for s in definition.slots]
    grads = rng.normal(size=(case["input_size"], case["dim"])).astype(np.float32)
    originals = [table.copy()] + [s.copy() for s in slots]
    clip_min, clip_max = clip if clip is not None else (-math.inf, math.inf)

    # Two consecutive steps (the second with new gradients) through each form.
    grads2 = rng.normal(size=grads.shape).astype(np.float32)
    exp_t, exp_s = ref.fused_update(name, case["row_pointers"], case["sample_ids"],
                                    case["token_ids"], case["gains"], grads, lr, table, slots,
                                    case["num_minibatches"], hypers, clip_min, clip_max,
                                    case["sc_arg"], case["num_replica"])
    exp2_t, exp2_s = ref.fused_update(name, case["row_pointers"], case["sample_ids"],
                                      case["token_ids"], case["gains"], grads2, lr, exp_t, exp_s,
                                      case["num_minibatches"], hypers, clip_min, clip_max,
                                      case["sc_arg"], case["num_replica"])

    # Functional form (tensors in, new tensors out; inputs untouched).
    in_tensors = [tf.constant(x) for x in [table] + slots]
    out1 = _run_update(fn, case, definition, grads, lr, in_tensors[0], in_tensors[1:], hypers,
                       clip)
    out1 = [o.numpy() for o in (out1 if isinstance(out1, (list, tuple)) else [out1])]
    assert len(out1) == 1 + len(definition.slots)
    for t, orig in zip(in_tensors, originals):
        np.testing.assert_array_equal(t.numpy(), orig)
    for x, orig in zip([table] + slots, originals):
        np.testing.assert_array_equal(x, orig)
    out2 = _run_update(fn, case, definition, grads2, lr, out1[0], out1[1:], hypers, clip)
    out2 = [o.numpy() for o in (out2 if isinstance(out2, (list, tuple)) else [out2])]

    # In-place form on resource variables.
    variables = [tf.Variable(x) for x in [table] + slots]
    result = _run_update(fn, case, definition, grads, lr, variables[0], variables[1:], hypers,
                         clip)
    assert result is None
    in_place1 = [v.numpy() for v in variables]
    _run_update(fn, case, definition, grads2, lr, variables[0], variables[1:], hypers, clip)
    in_place2 = [v.numpy() for v in variables]

    names = ["embedding_table"] + list(definition.slots)
    for step, (got_f, got_i, exp) in enumerate([(out1, in_place1, [exp_t] + exp_s),
                                                (out2, in_place2, [exp2_t] + exp2_s)], 1):
        for n, f, i, e in zip(names, got_f, got_i, exp):
            # Functional and in-place forms are bit-for-bit identical.
            np.testing.assert_array_equal(f, i, err_msg=f"step {step} {n}: functional vs in-place")
            np.testing.assert_allclose(f, e, rtol=UPD_RTOL, atol=UPD_ATOL,
                                       err_msg=f"step {step} {n} vs reference")
    # Rows not referenced are unchanged bit for bit, in the table and in every slot.
    untouched = np.setdiff1d(np.arange(case["table_rows"]), _touched(case))
    for n, f, orig in zip(names, out2, originals):
        np.testing.assert_array_equal(f[untouched].view(np.uint32), orig[untouched].view(np.uint32),
                                      err_msg=f"untouched rows of {n} changed")


def _update_test(name, examples):
    definition = ops.OPTIMIZERS[name]

    @settings(max_examples=examples, **SETTINGS)
    @given(data=st.data())
    def test(data):
        case = data.draw(csr_cases())
        _check_update(name, case, data.draw(optimizer_settings(definition, case["dim"])))

    return test


test_sgd_matches_reference = _update_test("sgd", 300)
test_adagrad_matches_reference = _update_test("adagrad", 300)
test_row_wise_adagrad_matches_reference = _update_test("row_wise_adagrad", 300)
test_adagrad_momentum_matches_reference = _update_test("adagrad_momentum", 300)
test_adam_matches_reference = _update_test("adam", 300)
test_ftrl_matches_reference = _update_test("ftrl", 300)


def test_every_optimizer_is_covered():
    covered = {"sgd", "adagrad", "row_wise_adagrad", "adagrad_momentum", "adam", "ftrl"}
    assert set(ops.OPTIMIZERS) == covered
    for name, definition in ops.OPTIMIZERS.items():
        assert set(definition.slots) <= {"accumulator", "momenta", "velocity", "linear"}, name
        assert ref.OPTIMIZER_STEPS[name] is not None


# ------------------------------------------------------------------------------------------------
# Layout stacker
# ------------------------------------------------------------------------------------------------

LAYOUT_FIELDS = ("table_name", "stacked_table_name", "num_sparse_cores", "num_partitions",
                 "height", "width", "padded_height", "padded_width",
                 "sparse_core_shard_row_offset", "sparse_core_shard_rotation",
                 "total_rows_per_sparse_core_shard", "per_sparse_core_batch_size", "num_features")


@st.composite
def stacker_cases(draw):
    num_partitions = draw(st.sampled_from([1, 2, 4]))
    sparse_cores = draw(st.sampled_from([1, 2, 4]))
    disable = draw(st.sampled_from([False, False, False, True]))
    limits = {}
    if draw(st.booleans()):
        limits["activation_mem_bytes_limit"] = draw(st.sampled_from(
            [0, 512, 1024, 4096, 2 * 1024 * 1024]))
    if draw(st.booleans()):
        limits["variable_shard_bytes_limit"] = draw(st.sampled_from(
            [0, 4096, 16384, 65536, 2 * 1024 * 1024 * 1024]))
    n = draw(st.integers(1, 10))
    names = draw(st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=n, max_size=n,
                          unique=True))
    tables = []
    for name in names:
        tables.append(dict(
            name=name, height=draw(st.integers(1, 400)), width=draw(st.integers(1, 40)),
            group=draw(st.sampled_from(["g0", "g1", "_xxtpuv3internal_abc", ""])),
            output_samples=draw(st.sampled_from([0, 4, 8, 16, 64, 128, 256])),
            num_features=draw(st.integers(0, 3))))
    return num_partitions, sparse_cores, disable, limits, tables


def _layout_tuple(layout):
    return tuple(getattr(layout, f) for f in LAYOUT_FIELDS)


@settings(max_examples=400, **SETTINGS)
@given(stacker_cases())
def test_layout_stacker_matches_reference(case):
    num_partitions, sparse_cores, disable, limits, tables = case
    stacker = LayoutStacker(num_partitions, sparse_cores, disable, **limits)
    reference = ref_layout.ReferenceStacker(num_partitions, sparse_cores, disable, **limits)
    for t in tables:
        stacker.add_table(t["name"], t["height"], t["width"], t["group"], t["output_samples"],
                          t["num_features"])
        reference.add_table(t["name"], t["height"], t["width"], t["group"], t["output_samples"],
                            t["num_features"])
    got = [_layout_tuple(layout) for layout in stacker.get_layouts()]
    expected = [_layout_tuple(layout) for layout in reference.get_layouts()]
    assert got == expected

    # docs/layout.md#mod-sharding: inside every stack, the padded rows of all member tables map one-to-one onto the
    # stacked variable, and the host col id agrees with the shard / row-in-shard mapping.
    stacks = {}
    for layout in reference.get_layouts():
        stacks.setdefault(layout.stacked_table_name, []).append(layout)
    n = num_partitions * sparse_cores
    for members in stacks.values():
        R = members[0].total_rows_per_sparse_core_shard
        seen = np.zeros(n * R, dtype=np.int64)
        for layout in members:
            for r in range(layout.padded_height):
                st_ = ref_layout.logical_to_storage(r, layout)
                seen[st_.stacked_row] += 1
                c = ref_layout.col_id(r, layout)
                assert c % n == st_.shard and c // n == st_.row_in_shard
                assert st_.partition * sparse_cores * R + st_.row_in_partition == st_.stacked_row
        assert (seen == 1).all()


@settings(max_examples=100, **SETTINGS)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]), st.integers(1, 4),
       st.integers(0, 2 ** 32 - 1))
def test_layout_roundtrip_and_lookup_of_logical_rows(num_partitions, sparse_cores, num_tables,
                                                     seed):
    """Tables stacked by the C++ stacker, sharded with docs/layout.md#mod-sharding, are read back by the lookup op as the
    logical rows (docs/lookup.md#forward-lookup 'logical equivalent'), and docs/layout.md#mod-sharding unshuffling inverts the sharding."""
    rng = np.random.default_rng(seed)
    stacker = LayoutStacker(num_partitions, sparse_cores)
    tables = {}
    for i in range(num_tables):
        name = f"t{i}"
        tables[name] = rng.normal(size=(int(rng.integers(1, 70)), int(rng.integers(1, 8)))).astype(
            np.float32)
        stacker.add_table(name, tables[name].shape[0], 8, "g", 16)  # same padded width
    layouts = stacker.get_layouts()
    assert len({t.stacked_table_name for t in layouts}) == 1
    n = num_partitions * sparse_cores
    stacked = ref_layout.shard_tables(tables, layouts)
    for layout in layouts:
        back = ref_layout.unshuffle_from_sc_to_cpu(
            stacked, n, layout.sparse_core_shard_row_offset, layout.padded_height // n,
            layout.sparse_core_shard_rotation)
        t = tables[layout.table_name]
        np.testing.assert_array_equal(back[:t.shape[0], :t.shape[1]], t)
        assert not back[t.shape[0]:].any() and not back[:, t.shape[1]:].any()

    # One chip's batch: samples spread over the chip's SCs, ids of random tables.
    samples_per_sc = 3
    input_size = sparse_cores * samples_per_sc
    by_name = {layout.table_name: layout for layout in layouts}
    expected = np.zeros((input_size, 8), np.float32)
    segments = {}
    for sample in range(input_size):
        for _ in range(int(rng.integers(0, 4))):
            name = f"t{int(rng.integers(0, num_tables))}"
            r = int(rng.integers(0, tables[name].shape[0]))
            gain = float(rng.uniform(-1, 1))
            storage = ref_layout.logical_to_storage(r, by_name[name])
            s, local = divmod(sample, samples_per_sc)
            segments.setdefault((s, 0, storage.shard), []).append(
                (local, storage.row_in_shard, gain))
            expected[sample, :tables[name].shape[1]] += np.float32(gain) * tables[name][r]
    for key in segments:
        segments[key].sort(key=lambda e: e[1])
    rp, sa, to, ga = ref.pack_csr(segments, sparse_cores, 1, n)
    got = ops.xla_sparse_dense_matmul_with_csr_input(
        rp, sa, to, ga, stacked, 1, input_size, 0.0, 0.0, 0, "stack",
        num_sparsecores_per_device=sparse_cores, num_replica=num_partitions)
    np.testing.assert_allclose(got.numpy(), expected, rtol=FWD_RTOL, atol=1e-5)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
