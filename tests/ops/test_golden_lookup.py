"""Golden tests with hand-computed numbers: docs/optimizers.md#per-row-formulas per-row optimizer formulas, docs/optimizers.md#gradient-accumulation duplicate
handling, docs/lookup.md#forward-lookup quantization, the docs/layout.md#stacking layout table, the docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform/docs/preprocessing.md#csr-wrapped-coo-buffers/docs/lookup.md#unstacking-activations-and-stacking-gradients worked example end to end."""
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.reference import layout as ref_layout  # noqa: E402
from tests.reference import lookup as ref  # noqa: E402

from tf_sc_embedding import ops  # noqa: E402
from tf_sc_embedding.tables.layout import LayoutStacker  # noqa: E402
from tf_sc_embedding.ops.fused_update import fused_update_function  # noqa: E402

RTOL = 1e-6


def _csr_one_shard(entries):
    """One SparseCore, one replica (one shard), one minibatch; entries = [(sample, token, gain)]."""
    return ref.pack_csr({(0, 0, 0): sorted(entries, key=lambda e: e[1])}, 1, 1, 1)


def _update(name, entries, grads, lr, table, slots, hypers=None, clip=None, in_place=False):
    """Runs one fused step on a single-shard table; returns numpy (table, [slots])."""
    rp, sa, to, ga = _csr_one_shard(entries)
    kwargs = dict(hypers or {})
    if clip is not None:
        kwargs.update(clip_weight_min=clip[0], clip_weight_max=clip[1])
    table = np.asarray(table, np.float32)
    slots = [np.asarray(s, np.float32) for s in slots]
    fn = fused_update_function(name)
    args = (rp, sa, to, ga, np.asarray(grads, np.float32), np.float32(lr))
    if in_place:
        variables = [tf.Variable(x) for x in [table] + slots]
        assert fn(*args, *variables, 1, **kwargs, table_name="golden",
                  num_sparsecores_per_device=1) is None
        out = [v.numpy() for v in variables]
    else:
        out = fn(*args, table, *slots, 1, **kwargs, table_name="golden",
                 num_sparsecores_per_device=1)
        out = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
    # The numpy reference agrees with the hand-computed numbers too.
    ref_t, ref_s = ref.fused_update(name, rp, sa, to, ga, grads, lr, table, slots, 1, hypers,
                                    *(clip or (-math.inf, math.inf)),
                                    num_sparsecores_per_device=1)
    for got, exp in zip(out, [ref_t] + ref_s):
        np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-7)
    return out[0], out[1:]


@pytest.fixture(params=[False, True], ids=["functional", "in_place"])
def in_place(request):
    return request.param


# ------------------------------------------------------------------------------------------------
# SGD (docs/optimizers.md#per-row-formulas) and duplicate handling (docs/optimizers.md#gradient-accumulation)
# ------------------------------------------------------------------------------------------------

SGD_TABLE = [[9.0, 9.0], [1.0, -2.0], [7.0, 7.0], [0.5, 0.5]]
# Row 1 is referenced twice (samples 0 and 1, gains 1 and 0.5), row 3 once (sample 1, gain 2).
SGD_ENTRIES = [(0, 1, 1.0), (1, 1, 0.5), (1, 3, 2.0)]
SGD_GRADS = [[2.0, 4.0], [4.0, -8.0]]


def test_sgd_sums_duplicates_then_steps_once(in_place):
    # G[1] = 1*[2,4] + 0.5*[4,-8] = [4, 0]; G[3] = 2*[4,-8] = [8,-16]; lr = 0.25.
    table, slots = _update("sgd", SGD_ENTRIES, SGD_GRADS, 0.25, SGD_TABLE, [], in_place=in_place)
    assert slots == []
    np.testing.assert_array_equal(table, [[9, 9], [0, -2], [7, 7], [-1.5, 4.5]])


def test_sgd_weight_clipping(in_place):
    table, _ = _update("sgd", SGD_ENTRIES, SGD_GRADS, 0.25, SGD_TABLE, [], clip=(-1.0, 1.0),
                       in_place=in_place)
    # Untouched rows are not clipped (9 and 7 stay); touched rows are.
    np.testing.assert_array_equal(table, [[9, 9], [0, -1], [7, 7], [-1, 1]])


def test_sgd_two_features_sharing_ids():
    # TF v3 test: two samples looking up the same id give delta = -lr * (g1 + g2).
    table, _ = _update("sgd", [(0, 0, 1.0), (1, 0, 1.0)], [[0.5], [1.5]], 0.1, [[1.0]], [])
    np.testing.assert_allclose(table, [[1.0 - 0.1 * (0.5 + 1.5)]], rtol=RTOL)


# ------------------------------------------------------------------------------------------------
# Adagrad
# ------------------------------------------------------------------------------------------------

def test_adagrad(in_place):
    # a' = a + g*g = [1+9, 3+1] = [10, 4]; W' = W - lr*g/sqrt(a').
    table, (acc,) = _update("adagrad", [(0, 0, 1.0)], [[3.0, 1.0]], 0.5,
                            [[1.0, -2.0], [5.0, 5.0]], [[[1.0, 3.0], [0.1, 0.1]]],
                            in_place=in_place)
    np.testing.assert_allclose(table[0], [1 - 0.5 * 3 / math.sqrt(10), -2 - 0.5 * 1 / 2],
                               rtol=RTOL)
    np.testing.assert_array_equal(acc[0], [10, 4])
    np.testing.assert_array_equal(table[1], [5, 5])
    np.testing.assert_array_equal(acc[1], np.float32([0.1, 0.1]))


def test_adagrad_clip_applies_to_table_only():
    table, (acc,) = _update("adagrad", [(0, 0, 1.0)], [[3.0, 1.0]], 0.5, [[1.0, -2.0]],
                            [[[1.0, 3.0]]], clip=(-2.0, 0.5))
    np.testing.assert_array_equal(table[0], [0.5, -2.0])   # 0.5257 -> 0.5, -2.25 -> -2
    np.testing.assert_array_equal(acc[0], [10, 4])          # slots are never clipped


# ------------------------------------------------------------------------------------------------
# AdagradMomentum
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nesterov", [True, False])
def test_adagrad_momentum_beta2_not_one(nesterov, in_place):
    # a = 1, g = +-2, beta2 = 0.5: a' = 0.5*1 + 0.5*4 = 2.5; (a' + eps)^(-1/k) = 4^-0.5 = 0.5;
    # g_hat = +-1; m' = 0.9*0.3 + g_hat = 1.27 / -0.73.
    hypers = dict(use_nesterov=nesterov, exponent=2.0, beta1=0.9, beta2=0.5, epsilon=1.5)
    table, (acc, mom) = _update("adagrad_momentum", [(0, 0, 1.0)], [[2.0, -2.0]], 0.1,
                                [[1.0, 1.0]], [[[1.0, 1.0]], [[0.3, 0.3]]], hypers,
                                in_place=in_place)
    np.testing.assert_allclose(acc[0], [2.5, 2.5], rtol=RTOL)
    np.testing.assert_allclose(mom[0], [1.27, -0.73], rtol=RTOL)
    if nesterov:  # W' = W - lr * (beta1 * m' + g_hat)
        expected = [1 - 0.1 * (0.9 * 1.27 + 1), 1 - 0.1 * (0.9 * -0.73 - 1)]  # 0.7857, 1.1657
    else:         # W' = W - lr * m'
        expected = [1 - 0.1 * 1.27, 1 - 0.1 * -0.73]
    np.testing.assert_allclose(table[0], expected, rtol=RTOL)


def test_adagrad_momentum_beta2_one_and_exponent_three():
    # beta2 == 1: a' = a + g*g = 1 + 4 = 5; (5 + 3)^(-1/3) = 0.5; g_hat = 1; m' = 0.5*0.2 + 1.
    hypers = dict(use_nesterov=False, exponent=3.0, beta1=0.5, beta2=1.0, epsilon=3.0)
    table, (acc, mom) = _update("adagrad_momentum", [(0, 0, 1.0)], [[2.0]], 1.0, [[0.0]],
                                [[[1.0]], [[0.2]]], hypers)
    np.testing.assert_allclose(acc, [[5.0]], rtol=RTOL)
    np.testing.assert_allclose(mom, [[1.1]], rtol=RTOL)
    np.testing.assert_allclose(table, [[-1.1]], rtol=RTOL)


def test_adagrad_momentum_clip():
    hypers = dict(use_nesterov=True, exponent=2.0, beta1=0.9, beta2=0.5, epsilon=1.5)
    table, (acc, mom) = _update("adagrad_momentum", [(0, 0, 1.0)], [[2.0, -2.0]], 0.1,
                                [[1.0, 1.0]], [[[1.0, 1.0]], [[0.3, 0.3]]], hypers,
                                clip=(0.8, 1.1))
    np.testing.assert_allclose(table[0], [0.8, 1.1], rtol=RTOL)
    np.testing.assert_allclose(mom[0], [1.27, -0.73], rtol=RTOL)


# ------------------------------------------------------------------------------------------------
# Adam (no bias correction)
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sum_inside_sqrt", [True, False])
def test_adam(sum_inside_sqrt, in_place):
    # Row 0: m = 0.5, v = 1, g = 2: m' = 0.5*0.5 + 0.5*2 = 1.25; v' = 0.75*1 + 0.25*4 = 1.75.
    # Row 1 is referenced with gain 0 (G = 0): m and v decay, W still moves.
    # Row 2 is not referenced: unchanged.
    hypers = dict(use_sum_inside_sqrt=sum_inside_sqrt, beta1=0.5, beta2=0.75, epsilon=0.5)
    table, (m, v) = _update("adam", [(0, 0, 1.0), (0, 1, 0.0)], [[2.0]], 0.1,
                            [[1.0], [1.0], [3.0]], [[[0.5], [0.5], [0.5]], [[1.0], [1.0], [1.0]]],
                            hypers, in_place=in_place)
    np.testing.assert_allclose(m[:, 0], [1.25, 0.25, 0.5], rtol=RTOL)
    np.testing.assert_allclose(v[:, 0], [1.75, 0.75, 1.0], rtol=RTOL)
    if sum_inside_sqrt:  # W' = W - lr*m' / sqrt(v' + eps^2)
        expected = [1 - 0.1 * 1.25 / math.sqrt(1.75 + 0.25), 1 - 0.1 * 0.25 / math.sqrt(1.0), 3.0]
    else:                # W' = W - lr*m' / (sqrt(v') + eps)
        expected = [1 - 0.1 * 1.25 / (math.sqrt(1.75) + 0.5),
                    1 - 0.1 * 0.25 / (math.sqrt(0.75) + 0.5), 3.0]
    np.testing.assert_allclose(table[:, 0], expected, rtol=RTOL)


def test_adam_clip():
    hypers = dict(use_sum_inside_sqrt=True, beta1=0.5, beta2=0.75, epsilon=0.5)
    table, (m, v) = _update("adam", [(0, 0, 1.0)], [[2.0, -2.0]], 0.1, [[1.0, 1.0]],
                            [[[0.5, 0.5]], [[1.0, 1.0]]], hypers, clip=(0.95, 1.0))
    # Unclipped: [0.9116, 1 + 0.25*0.1/sqrt(2) = 1.0177]
    np.testing.assert_allclose(table[0], [0.95, 1.0], rtol=RTOL)
    np.testing.assert_allclose(m[0], [1.25, -0.75], rtol=RTOL)


# ------------------------------------------------------------------------------------------------
# FTRL
# ------------------------------------------------------------------------------------------------

# Column 0: a = 5, g = 2, W = 1, lin = 0.2 -> a' = 9, P_old = sqrt(5), P_new = 3,
#           delta = 3 - sqrt(5) = 0.7639320225.
# Column 1: a = 5, g = 0, W = 1, lin = 0.1 -> a' = 5, delta = 0, so lin' = 0.1, inside [-l1, l1]
#           (and inside [-lr*l1, lr*l1]) -> W' = 0.
FTRL_ARGS = dict(entries=[(0, 0, 1.0)], grads=[[2.0, 0.0]], lr=0.5, table=[[1.0, 1.0]],
                 slots=[[[5.0, 5.0]], [[0.2, 0.1]]])
DELTA = 3 - math.sqrt(5)


def _ftrl(multiply, l1, l2=0.25, beta=0.1, power=-0.5, clip=None, in_place=False, **overrides):
    args = dict(FTRL_ARGS, **overrides)
    hypers = dict(multiply_linear_by_learning_rate=multiply, beta=beta, learning_rate_power=power,
                  l1_regularization_strength=l1, l2_regularization_strength=l2)
    return _update("ftrl", args["entries"], args["grads"], args["lr"], args["table"],
                   args["slots"], hypers, clip=clip, in_place=in_place)


def test_ftrl_l1_not_multiplied_by_lr(in_place):
    table, (acc, lin) = _ftrl(False, l1=0.3, in_place=in_place)
    lin0 = 0.2 + 2 - DELTA * 1 / 0.5                    # 0.672135955
    np.testing.assert_allclose(lin[0], [lin0, 0.1], rtol=RTOL)
    np.testing.assert_allclose(acc[0], [9.0, 5.0], rtol=RTOL)
    denominator = (3 + 0.1) / 0.5 + 2 * 0.25           # 6.7
    np.testing.assert_allclose(table[0, 0], (0.3 - lin0) / denominator, rtol=RTOL)  # -0.0555427
    assert table[0, 1] == 0.0


def test_ftrl_l1_multiplied_by_lr(in_place):
    table, (acc, lin) = _ftrl(True, l1=0.3, in_place=in_place)
    lin0 = 0.2 + 0.5 * 2 - DELTA * 1                    # 0.4360679775
    np.testing.assert_allclose(lin[0], [lin0, 0.1], rtol=RTOL)
    denominator = 3 + 2 * 0.5 * 0.25 + 0.1             # 3.35
    np.testing.assert_allclose(table[0, 0], (0.5 * 0.3 - lin0) / denominator, rtol=RTOL)
    assert table[0, 1] == 0.0


@pytest.mark.parametrize("multiply", [False, True])
def test_ftrl_no_l1(multiply):
    table, (acc, lin) = _ftrl(multiply, l1=0.0)
    if multiply:
        lin0, denominator = 0.2 + 0.5 * 2 - DELTA, 3 + 2 * 0.5 * 0.25 + 0.1
        lin1, d1 = 0.1, math.sqrt(5) + 2 * 0.5 * 0.25 + 0.1
    else:
        lin0, denominator = 0.2 + 2 - DELTA / 0.5, (3 + 0.1) / 0.5 + 2 * 0.25
        lin1, d1 = 0.1, (math.sqrt(5) + 0.1) / 0.5 + 2 * 0.25
    np.testing.assert_allclose(lin[0], [lin0, lin1], rtol=RTOL)
    np.testing.assert_allclose(table[0], [-lin0 / denominator, -lin1 / d1], rtol=RTOL)


def test_ftrl_learning_rate_power_minus_one():
    # P = a^1: a = 1, g = 1 -> a' = 2, delta = 1; lin' = 0 + 1 - 1*0.5/1 = 0.5; D = 2; W' = -0.25.
    table, (acc, lin) = _ftrl(False, l1=0.0, l2=0.0, beta=0.0, power=-1.0, entries=[(0, 0, 1.0)],
                              grads=[[1.0]], lr=1.0, table=[[0.5]], slots=[[[1.0]], [[0.0]]])
    np.testing.assert_allclose([acc[0, 0], lin[0, 0], table[0, 0]], [2.0, 0.5, -0.25], rtol=RTOL)


def test_ftrl_clip():
    table, (acc, lin) = _ftrl(False, l1=0.3, clip=(-0.01, 0.5))
    np.testing.assert_allclose(table[0], [-0.01, 0.0], rtol=RTOL)
    np.testing.assert_allclose(lin[0, 0], 0.2 + 2 - DELTA / 0.5, rtol=RTOL)


# ------------------------------------------------------------------------------------------------
# Forward and quantization (docs/lookup.md#forward-lookup)
# ------------------------------------------------------------------------------------------------

def test_quantization_formula():
    # low = -1, high = 1, 5 buckets -> quantum 0.5; round half up after clipping.
    values = np.float32([-3.0, -0.8, -0.2, 0.3, 0.74, 0.76, 2.0, 0.25])
    expected = np.float32([-1.0, -1.0, 0.0, 0.5, 0.5, 1.0, 1.0, 0.5])
    np.testing.assert_array_equal(ref.quantize(values, -1.0, 1.0, 5), expected)
    table = values.reshape(1, 8)
    rp, sa, to, ga = _csr_one_shard([(0, 0, 2.0)])
    got = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, table, 1, 1, -1.0, 1.0, 5,
                                                     "q", num_sparsecores_per_device=1)
    np.testing.assert_array_equal(got.numpy(), 2 * expected.reshape(1, 8))


def test_quantization_is_applied_per_row_before_combining():
    # Two rows of 0.3 each quantize to 0.5 -> sum 1.0 (quantizing the sum 0.6 would give 0.5).
    table = np.float32([[0.3], [0.3]])
    rp, sa, to, ga = _csr_one_shard([(0, 0, 1.0), (0, 1, 1.0)])
    got = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, table, 1, 1, -1.0, 1.0, 5,
                                                     "q", num_sparsecores_per_device=1)
    np.testing.assert_array_equal(got.numpy(), [[1.0]])
    plain = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, table, 1, 1, 0.0, 0.0, 0,
                                                       "q", num_sparsecores_per_device=1)
    np.testing.assert_allclose(plain.numpy(), [[0.6]], rtol=RTOL)


def test_forward_empty_samples_are_zero_and_padding_ignored():
    # 2 SCs x 1 replica; SC1 has no entries. Trailing PAD tokens inside a segment are ignored.
    segments = {(0, 0, 1): [(1, 0, 2.0), (1, ref.PAD, 5.0)]}
    rp, sa, to, ga = ref.pack_csr(segments, 2, 1, 2)
    table = np.float32([[1, 1], [2, 2], [3, 4], [5, 6]])  # shard 1 = rows 2, 3
    got = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, table, 1, 4, 0.0, 0.0, 0,
                                                     "t", num_sparsecores_per_device=2)
    np.testing.assert_array_equal(got.numpy(), [[0, 0], [6, 8], [0, 0], [0, 0]])


def test_default_sparse_cores_is_four():
    segments = {(3, 0, 3): [(0, 1, 1.0)]}
    rp, sa, to, ga = ref.pack_csr(segments, 4, 1, 4)
    table = np.arange(16, dtype=np.float32).reshape(8, 2)
    got = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, table, 1, 4, 0.0, 0.0, 0,
                                                     "t")
    np.testing.assert_array_equal(got.numpy(), [[0, 0], [0, 0], [0, 0], table[3 * 2 + 1]])


# ------------------------------------------------------------------------------------------------
# Layout (docs/layout.md#stacking, docs/layout.md#rounding-rows-and-columns) and the docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform/docs/preprocessing.md#sort-dedup-and-bucket/docs/preprocessing.md#csr-wrapped-coo-buffers/docs/lookup.md#unstacking-activations-and-stacking-gradients worked example
# ------------------------------------------------------------------------------------------------

def test_layout_table_of_spec_2_4():
    stacker = LayoutStacker(2, 4)
    for name, height in [("b", 100), ("a", 33), ("c", 70)]:
        stacker.add_table(name, height, 16, "g1", 8)
    stacker.add_table("d", 20, 12, "g0", 8)
    stacker.add_table("e", 64, 16, "g1", 8)
    layouts = stacker.get_layouts()
    assert [t.table_name for t in layouts] == ["d", "b", "a", "c", "e"]
    d = layouts[0]
    assert (d.stacked_table_name, d.padded_width, d.padded_height,
            d.sparse_core_shard_row_offset, d.sparse_core_shard_rotation,
            d.total_rows_per_sparse_core_shard) == ("d", 16, 64, 0, 0, 8)
    rows = [(t.table_name, t.padded_height, t.sparse_core_shard_row_offset,
             t.sparse_core_shard_rotation, t.total_rows_per_sparse_core_shard, t.stacked_table_name,
             t.num_sparse_cores, t.num_partitions) for t in layouts[1:]]
    assert rows == [("b", 128, 0, 0, 48, "b_a_c_e", 8, 2), ("a", 64, 16, 4, 48, "b_a_c_e", 8, 2),
                    ("c", 128, 24, 0, 48, "b_a_c_e", 8, 2), ("e", 64, 40, 4, 48, "b_a_c_e", 8, 2)]
    assert [(t.height, t.width, t.padded_width) for t in layouts[1:]] == [
        (100, 16, 16), (33, 16, 16), (70, 16, 16), (64, 16, 16)]


def test_layout_disable_stacking_and_strict_activation_limit():
    stacker = LayoutStacker(1, 1, disable_table_stacking=True)
    stacker.add_table("x", 8, 8, "g", 4)
    stacker.add_table("y", 8, 8, "g", 4)
    assert [t.stacked_table_name for t in stacker.get_layouts()] == ["x", "y"]
    # activation bytes = 4 * 8 * 32 = 1024 per table; a sum equal to the limit is rejected.
    for limit, expected in [(2048, ["x", "y"]), (2049, ["x_y", "x_y"]), (0, ["x_y", "x_y"])]:
        stacker = LayoutStacker(1, 1, activation_mem_bytes_limit=limit)
        stacker.add_table("x", 8, 8, "g", 32)
        stacker.add_table("y", 8, 8, "g", 32)
        assert [t.stacked_table_name for t in stacker.get_layouts()] == expected, limit
    # variable shard bytes = 4 * 8 * 8 / 1 = 256 per table.
    for limit, expected in [(512, ["x", "y"]), (513, ["x_y", "x_y"])]:
        stacker = LayoutStacker(1, 1, variable_shard_bytes_limit=limit)
        stacker.add_table("x", 8, 8, "g", 32)
        stacker.add_table("y", 8, 8, "g", 32)
        assert [t.stacked_table_name for t in stacker.get_layouts()] == expected, limit


def test_layout_rotation_and_mapping_of_spec_5():
    stacker = LayoutStacker(2, 4)
    stacker.add_table("user", 33, 16, "g", 8)
    stacker.add_table("video", 100, 10, "g", 8)
    user, video = stacker.get_layouts()
    assert (user.padded_height, user.sparse_core_shard_row_offset,
            user.sparse_core_shard_rotation) == (64, 0, 0)
    assert (video.padded_height, video.padded_width, video.sparse_core_shard_row_offset,
            video.sparse_core_shard_rotation) == (128, 16, 8, 4)
    assert video.stacked_table_name == "user_video" and video.total_rows_per_sparse_core_shard == 24
    # docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform video col transform table: raw id -> (col', shard, row in shard).
    for raw, col, shard, row in [(3, 71, 7, 8), (10, 78, 6, 9), (99, 167, 7, 20), (0, 68, 4, 8),
                                 (17, 85, 5, 10), (8, 76, 4, 9)]:
        assert ref_layout.col_id(raw, video) == col
        storage = ref_layout.logical_to_storage(raw, video)
        assert (storage.shard, storage.row_in_shard) == (shard, row)
        assert storage.stacked_row == shard * 24 + row
        assert (storage.partition, storage.row_in_partition) == (shard // 4, (shard % 4) * 24 + row)


# docs/preprocessing.md#sort-dedup-and-bucket outputs of the worked example, per SC: (sorted_row_ids, sorted_col_ids, id_counts).
SPEC6 = [
    ([0, 1, 1, 3, 2, 3], [0, 4, 0, 9, 8, 8], [0, 2, 3, 3, 3, 3, 3, 4, 6]),
    ([1, 3], [0, 20], [0, 1, 1, 1, 1, 1, 1, 1, 2]),
    ([0, 2, 3], [1, 8, 10], [0, 0, 1, 1, 1, 2, 3, 3, 3]),
    ([0, 1, 3, 2], [0, 0, 9, 8], [0, 2, 2, 2, 2, 3, 3, 3, 4]),
]
SPEC8_ROW_POINTERS = [2, 9, 16, 16, 16, 16, 17, 26, 33, 40, 40, 40, 40, 40, 40, 41,
                      48, 49, 56, 56, 57, 65, 72, 72, 74, 80, 80, 80, 81, 88, 88, 89]
USER_IDS = [[0], [32, 1], [], [0], [9], [], [0], [0]]
VIDEO_IDS = [[3], [10, 3], [], [99], [0], [17], [3], [8]]


def _spec_example_csr():
    segments = {}
    for s, (rows, cols, counts) in enumerate(SPEC6):
        for p in range(8):
            segments[(s, 0, p)] = [(rows[i], cols[i], 1.0) for i in range(counts[p], counts[p + 1])]
    return ref.pack_csr(segments, 4, 1, 8, ids_capacity=128, tail_fill=0)


def _spec_example_tables(seed=0):
    rng = np.random.default_rng(seed)
    stacker = LayoutStacker(2, 4)
    stacker.add_table("user", 33, 16, "g", 8)
    stacker.add_table("video", 100, 10, "g", 8)
    tables = {"user": rng.normal(size=(33, 16)).astype(np.float32),
              "video": rng.normal(size=(100, 10)).astype(np.float32)}
    return tables, stacker.get_layouts()


def test_spec_worked_example_forward_end_to_end():
    rp, sa, to, ga = _spec_example_csr()
    np.testing.assert_array_equal(rp, SPEC8_ROW_POINTERS)  # the packer reproduces docs/preprocessing.md#csr-wrapped-coo-buffers
    # SC0 slots 24-25: replica 7, tokens [8, 8], samples [2, 3].
    assert list(to[24:26]) == [8, 8] and list(sa[24:26]) == [2, 3]
    assert ga[26] == np.float32(2147483648.0) and to[26] == ref.PAD
    tables, layouts = _spec_example_tables()
    stacked = ref_layout.shard_tables(tables, layouts)
    assert stacked.shape == (8 * 24, 16)
    act = ops.xla_sparse_dense_matmul_with_csr_input(rp, sa, to, ga, stacked, 1, 16, 0.0, 0.0, 0,
                                                     "user_video", num_sparsecores_per_device=4,
                                                     num_replica=2).numpy()
    for b in range(8):  # docs/lookup.md#unstacking-activations-and-stacking-gradients: f_user sample b <-> row (b//2)*4 + b%2; f_video row + 2.
        user = sum((tables["user"][i] for i in USER_IDS[b]), np.zeros(16, np.float32))
        video = sum((tables["video"][i] for i in VIDEO_IDS[b]), np.zeros(10, np.float32))
        np.testing.assert_allclose(act[(b // 2) * 4 + b % 2], user, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(act[(b // 2) * 4 + 2 + b % 2, :10], video, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(act[(b // 2) * 4 + 2 + b % 2, 10:], 0)
    # f_video sample 1 = V[10] + V[3]; f_user sample 1 = U[32] + U[1].
    np.testing.assert_allclose(act[3, :10], tables["video"][10] + tables["video"][3], rtol=1e-6)
    np.testing.assert_allclose(act[1], tables["user"][32] + tables["user"][1], rtol=1e-6)


def test_spec_worked_example_sgd_end_to_end(in_place):
    rp, sa, to, ga = _spec_example_csr()
    tables, layouts = _spec_example_tables(seed=1)
    stacked = ref_layout.shard_tables(tables, layouts)
    rng = np.random.default_rng(2)
    user_grads = rng.normal(size=(8, 16)).astype(np.float32)
    video_grads = rng.normal(size=(8, 10)).astype(np.float32)
    stacked_grads = np.zeros((16, 16), np.float32)  # docs/lookup.md#unstacking-activations-and-stacking-gradients gradient stacking
    for b in range(8):
        stacked_grads[(b // 2) * 4 + b % 2] = user_grads[b]
        stacked_grads[(b // 2) * 4 + 2 + b % 2, :10] = video_grads[b]
    lr = 0.5
    fn = ops.xla_sparse_dense_matmul_grad_with_sgd_and_csr_input
    if in_place:
        var = tf.Variable(stacked)
        fn(rp, sa, to, ga, stacked_grads, lr, var, 1, "user_video", num_sparsecores_per_device=4,
           num_replica=2)
        new = var.numpy()
    else:
        new = fn(rp, sa, to, ga, stacked_grads, lr, stacked, 1, "user_video",
                 num_sparsecores_per_device=4, num_replica=2).numpy()
    expected = {name: t.astype(np.float64).copy() for name, t in tables.items()}
    for b in range(8):
        for i in USER_IDS[b]:
            expected["user"][i] -= lr * user_grads[b]
        for i in VIDEO_IDS[b]:
            expected["video"][i] -= lr * video_grads[b]
    n = 8
    for layout in layouts:
        back = ref_layout.unshuffle_from_sc_to_cpu(new, n, layout.sparse_core_shard_row_offset,
                                                   layout.padded_height // n,
                                                   layout.sparse_core_shard_rotation)
        t = expected[layout.table_name]
        np.testing.assert_allclose(back[:t.shape[0], :t.shape[1]], t, rtol=1e-5, atol=1e-6)
        assert not back[t.shape[0]:].any()  # padding rows never referenced
    # E.g. video id 3 (shard 7, token 8) is referenced by video samples 0, 1 and 6.
    np.testing.assert_allclose(
        new[7 * 24 + 8, :10],
        tables["video"][3] - lr * (video_grads[0] + video_grads[1] + video_grads[6]), rtol=1e-5)
