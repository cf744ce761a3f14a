"""Numpy reference of the SparseCore lookup and fused-update math, written from the spec.

* docs/preprocessing.md#csr-wrapped-coo-buffers / docs/lookup.md#reading-the-csr-buffers: segment semantics of the CSR-wrapped COO buffers and how entries address table and
  activation rows (`csr_segments`, `csr_entries`), plus a packer in the format of docs/preprocessing.md#csr-wrapped-coo-buffers (`pack_csr`) used by the
  tests to build buffers.
* docs/lookup.md#forward-lookup: forward sparse-dense matmul with optional quantization (`sparse_dense_matmul`).
* docs/optimizers.md#gradient-accumulation / docs/optimizers.md#per-row-formulas: fused gradient + optimizer update (`fused_update`), with each optimizer's per-row
  math evaluated in float32 in exactly the order the spec writes it.

Everything is float32: every scalar is converted with np.float32 before it takes part in
arithmetic, so numpy never promotes to float64. `pow` is the C library's float32 `powf` (what a
float32 `pow` means in C/C++), falling back to a correctly-rounded-from-float64 pow when libm is
not loadable.

The summation order of duplicates is fixed: for every shard p, the entries of the segments
(source SC s, minibatch b) are concatenated in (s, b) order, stable-sorted by token, and each
row's gradient is accumulated from 0 in that order.
"""
import ctypes
import ctypes.util
import math

import numpy as np

PAD = 2147483647          # kXlaPadValue: int32 padding of the id buffers
PAD_GAIN = np.float32(PAD)  # float(PAD) = 2147483648.0 in the gain buffer
XLA_PAD = 8               # segment / row-pointer block alignment
DEFAULT_SC_PER_DEVICE = 4

f32 = np.float32


def round_up(x, m):
    return (x + m - 1) // m * m


def resolve_sc(num_sparsecores_per_device):
    """num_sparsecores_per_device = -1 means the default of 4 SparseCores."""
    return DEFAULT_SC_PER_DEVICE if num_sparsecores_per_device == -1 else num_sparsecores_per_device


# --------------------------------------------------------------------------------------------
# float32 pow
# --------------------------------------------------------------------------------------------

def _load_powf():
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = libm.powf
        fn.restype = ctypes.c_float
        fn.argtypes = [ctypes.c_float, ctypes.c_float]
        return fn
    except (OSError, AttributeError):  # pragma: no cover - depends on the platform
        return None


_POWF = _load_powf()


def powf(base, exponent):
    """Elementwise float32 pow(base, exponent); `exponent` is a float32 scalar."""
    base = np.asarray(base, dtype=np.float32)
    exponent = f32(exponent)
    if _POWF is None:  # pragma: no cover
        return np.power(base.astype(np.float64), np.float64(exponent)).astype(np.float32)
    out = np.empty(base.shape, dtype=np.float32)
    flat_in, flat_out = base.reshape(-1), out.reshape(-1)
    e = float(exponent)
    for i in range(flat_in.size):
        flat_out[i] = _POWF(float(flat_in[i]), e)
    return out


# --------------------------------------------------------------------------------------------
# CSR segments (docs/preprocessing.md#csr-wrapped-coo-buffers segment semantics, docs/lookup.md#reading-the-csr-buffers)
# --------------------------------------------------------------------------------------------

def csr_segments(row_pointers, num_sc, num_minibatches, num_shards):
    """Yields (s, b, p, begin, end) for every segment, in flat row-pointer order.

    Segment (s, b, p) has flat index k = (s * NMB + b) * RoundUp(P, 8) + p; its valid entries are
    [RoundUp(row_pointers[k - 1], 8), row_pointers[k]) with start 0 for k = 0.
    """
    block = round_up(num_shards, XLA_PAD)
    rp = [int(x) for x in np.asarray(row_pointers).reshape(-1)]
    for s in range(num_sc):
        for b in range(num_minibatches):
            for p in range(num_shards):
                k = (s * num_minibatches + b) * block + p
                begin = 0 if k == 0 else round_up(rp[k - 1], XLA_PAD)
                yield s, b, p, begin, rp[k]


def csr_entries(row_pointers, sample_ids, token_ids, gains, num_sc, num_minibatches, num_shards):
    """Valid entries (s, b, p, sample, token, gain) in segment order; PAD entries are skipped."""
    sample_ids = np.asarray(sample_ids).reshape(-1)
    token_ids = np.asarray(token_ids).reshape(-1)
    gains = np.asarray(gains, dtype=np.float32).reshape(-1)
    out = []
    for s, b, p, begin, end in csr_segments(row_pointers, num_sc, num_minibatches, num_shards):
        for i in range(begin, end):
            sample, token = int(sample_ids[i]), int(token_ids[i])
            if sample == PAD or token == PAD:
                continue
            out.append((s, b, p, sample, token, gains[i]))
    return out


def pack_csr(segments, num_sc, num_minibatches, num_shards, ids_capacity=None,
             row_pointer_capacity=None, tail_fill=None, rng=None):
    """Packs per-segment entries into CSR-wrapped COO buffers as docs/preprocessing.md#csr-wrapped-coo-buffers step 3 does.

    `segments[(s, b, p)]` is a list of (sample, token, gain); missing keys are empty segments.
    Returns (row_pointers int32, sample_ids int32, token_ids int32, gains float32). Buffers are
    extended to the given capacities; the tail (beyond the used prefix, which TF leaves
    uninitialized) is filled with `tail_fill` or, if None, with random garbage from `rng` (zeros
    when no rng).
    """
    block = round_up(num_shards, XLA_PAD)
    row_pointers, samples, tokens, gains = [], [], [], []
    for s in range(num_sc):
        for b in range(num_minibatches):
            for p in range(num_shards):
                for sample, token, gain in segments.get((s, b, p), ()):
                    samples.append(sample)
                    tokens.append(token)
                    gains.append(gain)
                row_pointers.append(len(tokens))
                pad = round_up(len(tokens), XLA_PAD) - len(tokens)
                samples += [PAD] * pad
                tokens += [PAD] * pad
                gains += [float(PAD_GAIN)] * pad
            row_pointers += [len(tokens)] * (block - num_shards)
    n_rp, n_ids = len(row_pointers), len(tokens)
    rp_cap = max(n_rp, row_pointer_capacity or 0)
    ids_cap = max(n_ids, ids_capacity or 0)

    def tail(n, dtype, low, high):
        if tail_fill is not None:
            return np.full(n, tail_fill, dtype)
        if rng is None:
            return np.zeros(n, dtype)
        if dtype == np.float32:
            return rng.uniform(low, high, n).astype(np.float32)
        return rng.integers(low, high, n).astype(dtype)

    rp = np.concatenate([np.asarray(row_pointers, np.int32), tail(rp_cap - n_rp, np.int32, -5, 1000)])
    sa = np.concatenate([np.asarray(samples, np.int32), tail(ids_cap - n_ids, np.int32, -5, 1000)])
    to = np.concatenate([np.asarray(tokens, np.int32), tail(ids_cap - n_ids, np.int32, -5, 1000)])
    ga = np.concatenate([np.asarray(gains, np.float32), tail(ids_cap - n_ids, np.float32, -1e3, 1e3)])
    return rp, sa, to, ga


# --------------------------------------------------------------------------------------------
# Forward (docs/lookup.md#forward-lookup)
# --------------------------------------------------------------------------------------------

def quantize(values, low, high, num_buckets):
    """docs/lookup.md#forward-lookup: v <- min(max(v, low), high); quantum = (high - low) / (num_buckets - 1);
    v <- floor((v - low) / quantum + 0.5) * quantum + low. float32 throughout."""
    v = np.asarray(values, dtype=np.float32)
    low, high = f32(low), f32(high)
    quantum = (high - low) / f32(num_buckets - 1)
    v = np.minimum(np.maximum(v, low), high)
    return (np.floor((v - low) / quantum + f32(0.5)) * quantum + low).astype(np.float32)


def sparse_dense_matmul(row_pointers, sample_ids, token_ids, gains, table, num_minibatches,
                        input_size, quantization_config_low=0.0, quantization_config_high=0.0,
                        quantization_config_num_buckets=0, num_sparsecores_per_device=-1,
                        num_replica=1):
    """A[s * B_sc + sample] = sum over valid entries of gain * Q(W[p * R + token]) (docs/lookup.md#reading-the-csr-buffers, docs/lookup.md#forward-lookup).

    Entries are accumulated into each activation row in segment order (s, b, p, position).
    """
    table = np.asarray(table, dtype=np.float32)
    num_sc = resolve_sc(num_sparsecores_per_device)
    num_shards = num_sc * num_replica
    rows_per_shard = table.shape[0] // num_shards
    samples_per_sc = input_size // num_sc
    out = np.zeros((input_size, table.shape[1]), dtype=np.float32)
    for s, b, p, sample, token, gain in csr_entries(row_pointers, sample_ids, token_ids, gains,
                                                     num_sc, int(num_minibatches), num_shards):
        row = table[p * rows_per_shard + token]
        if quantization_config_num_buckets:
            row = quantize(row, quantization_config_low, quantization_config_high,
                           quantization_config_num_buckets)
        r = s * samples_per_sc + sample
        out[r] = out[r] + f32(gain) * row
    return out


def feature_major_row(natural_row, samples_per_sc, num_sc, feature_rows_per_sc):
    """Where SparseCore-major activation row `natural_row` (sc * samples_per_sc + sample, one
    source replica) lives in feature-major order (docs/lookup.md#activation-row-order): feature
    f's rows of SparseCore 0, 1, ..., then feature f + 1's."""
    sc, sample = divmod(natural_row, samples_per_sc)
    start = 0
    for f, rows in enumerate(feature_rows_per_sc):
        if sample < start + rows:
            return start * num_sc + sc * rows + (sample - start)
        start += rows
    raise ValueError("feature_rows_per_sc must cover every sample")


def group_lookup_entries(row_pointers, sample_ids, token_ids, gains, num_minibatches, input_size,
                         table_rows, num_sparsecores_per_device=-1, num_replica=1,
                         feature_rows_per_sc=()):
    """(activation_row_begin, entry_rows, entry_gains) of docs/lookup.md#grouping-at-enqueue:
    each activation row's valid entries (table row p * R + token, gain) in segment order, rows in
    feature-major order when feature_rows_per_sc is given. One source replica, all shards."""
    num_sc = resolve_sc(num_sparsecores_per_device)
    num_shards = num_sc * num_replica
    rows_per_shard = table_rows // num_shards
    samples_per_sc = input_size // num_sc
    by_row = [[] for _ in range(input_size)]
    for s, b, p, sample, token, gain in csr_entries(row_pointers, sample_ids, token_ids, gains,
                                                     num_sc, int(num_minibatches), num_shards):
        a = s * samples_per_sc + sample
        if feature_rows_per_sc:
            a = feature_major_row(a, samples_per_sc, num_sc, feature_rows_per_sc)
        by_row[a].append((p * rows_per_shard + token, gain))
    row_begin = np.cumsum([0] + [len(e) for e in by_row]).astype(np.int32)
    flat = [e for entries in by_row for e in entries]
    return (row_begin, np.asarray([r for r, _ in flat], np.int32).reshape(-1),
            np.asarray([g for _, g in flat], np.float32).reshape(-1))


def sparse_dense_matmul_grouped(row_begin, rows, gains, table):
    """A[a] = sum of gain * W[row] over activation row a's grouped entries, in their order."""
    table = np.asarray(table, dtype=np.float32)
    out = np.zeros((len(row_begin) - 1, table.shape[1]), dtype=np.float32)
    for a in range(len(row_begin) - 1):
        for k in range(row_begin[a], row_begin[a + 1]):
            out[a] = out[a] + f32(gains[k]) * table[rows[k]]
    return out


# --------------------------------------------------------------------------------------------
# Per-row optimizer math (docs/optimizers.md#per-row-formulas). Each step takes float32 arrays (one row) and returns the new
# table row and the new slot rows, in the op's slot order (docs/optimizers.md#fused-backward-pass tuple orders).
# --------------------------------------------------------------------------------------------

def clip(w, clip_min, clip_max):
    """Applied to the new table row only, never to slots."""
    return np.minimum(np.maximum(w, f32(clip_min)), f32(clip_max)).astype(np.float32)


def sgd_step(g, w, slots, lr, hp, clip_min, clip_max):
    lr = f32(lr)
    return clip(w - lr * g, clip_min, clip_max), []


def adagrad_step(g, w, slots, lr, hp, clip_min, clip_max):
    (a,) = slots
    lr = f32(lr)
    a_new = a + g * g
    w_new = clip(w - lr * g / np.sqrt(a_new), clip_min, clip_max)
    return w_new, [a_new]


def row_wise_adagrad_step(g, w, slots, lr, hp, clip_min, clip_max):
    """FBGEMM's exact row-wise Adagrad: one accumulator per row (slot row of shape [1]), grown by
    the mean squared gradient over the first `embedding_dim` columns (the row's embedding; the
    rest is padding), summed in column order in float32."""
    (a,) = slots
    lr = f32(lr)
    dim = int(hp.get("embedding_dim") or g.shape[0])
    sum_of_squares = f32(0.0)
    for x in np.asarray(g, np.float32)[:dim]:
        sum_of_squares = f32(sum_of_squares + f32(x * x))
    a_new = (a + sum_of_squares / f32(dim)).astype(np.float32)
    multiplier = lr / (np.sqrt(a_new) + f32(hp["epsilon"]))
    w_new = clip(w - multiplier * g, clip_min, clip_max)
    return w_new, [a_new]


def adagrad_momentum_step(g, w, slots, lr, hp, clip_min, clip_max):
    a, m = slots
    lr = f32(lr)
    beta1, beta2, epsilon = f32(hp["beta1"]), f32(hp["beta2"]), f32(hp["epsilon"])
    if beta2 == f32(1.0):
        a_new = a + g * g
    else:
        a_new = beta2 * a + (f32(1.0) - beta2) * g * g
    neg_inv_k = -(f32(1.0) / f32(hp["exponent"]))  # 1/k in float32 on the host, then negated
    g_hat = powf(a_new + epsilon, neg_inv_k) * g
    m_new = beta1 * m + g_hat
    if hp["use_nesterov"]:
        w_new = w - lr * (beta1 * m_new + g_hat)
    else:
        w_new = w - lr * m_new
    return clip(w_new, clip_min, clip_max), [a_new, m_new]


def adam_step(g, w, slots, lr, hp, clip_min, clip_max):
    m, v = slots
    lr = f32(lr)
    beta1, beta2, epsilon = f32(hp["beta1"]), f32(hp["beta2"]), f32(hp["epsilon"])
    m_new = beta1 * m + (f32(1.0) - beta1) * g
    v_new = beta2 * v + (f32(1.0) - beta2) * g * g
    if hp["use_sum_inside_sqrt"]:
        e1, e2 = epsilon * epsilon, f32(0.0)
    else:
        e1, e2 = f32(0.0), epsilon
    w_new = w - lr * m_new / (np.sqrt(v_new + e1) + e2)
    return clip(w_new, clip_min, clip_max), [m_new, v_new]


def ftrl_step(g, w, slots, lr, hp, clip_min, clip_max):
    a, lin = slots
    lr = f32(lr)
    beta = f32(hp["beta"])
    neg_p = -f32(hp["learning_rate_power"])
    l1 = f32(hp["l1_regularization_strength"])
    l2 = f32(hp["l2_regularization_strength"])
    a_new = a + g * g
    p_old = powf(a, neg_p)
    p_new = powf(a_new, neg_p)
    delta = p_new - p_old
    if hp["multiply_linear_by_learning_rate"]:
        lin_new = lin + lr * g - delta * w
        if l1 == f32(0.0):
            numerator = -lin_new
        else:
            bound = lr * l1
            numerator = np.minimum(np.maximum(lin_new, -bound), bound) - lin_new
        denominator = p_new + f32(2.0) * lr * l2 + beta
    else:
        lin_new = lin + g - delta * w / lr
        if l1 == f32(0.0):
            numerator = -lin_new
        else:
            numerator = np.minimum(np.maximum(lin_new, -l1), l1) - lin_new
        denominator = (p_new + beta) / lr + f32(2.0) * l2
    return clip(numerator / denominator, clip_min, clip_max), [a_new, lin_new]


OPTIMIZER_STEPS = {
    "sgd": sgd_step,
    "adagrad": adagrad_step,
    "row_wise_adagrad": row_wise_adagrad_step,
    "adagrad_momentum": adagrad_momentum_step,
    "adam": adam_step,
    "ftrl": ftrl_step,
}


# --------------------------------------------------------------------------------------------
# Fused update (docs/optimizers.md#gradient-accumulation)
# --------------------------------------------------------------------------------------------

def accumulate_gradients(row_pointers, sample_ids, token_ids, gains, activation_gradients,
                         num_minibatches, num_shards, num_sc, rows_per_shard):
    """{stacked row: summed gradient} for every referenced row.

    Per shard p: entries of segments (s, b, p) in (s, b) order, stable-sorted by token, summed
    from 0 in that order.
    """
    grads = np.asarray(activation_gradients, dtype=np.float32)
    samples_per_sc = grads.shape[0] // num_sc
    per_shard = {p: [] for p in range(num_shards)}
    for s, b, p, sample, token, gain in csr_entries(row_pointers, sample_ids, token_ids, gains,
                                                     num_sc, num_minibatches, num_shards):
        per_shard[p].append((token, s * samples_per_sc + sample, gain))
    sums = {}
    for p in range(num_shards):
        for token, act_row, gain in sorted(per_shard[p], key=lambda e: e[0]):  # stable
            row = p * rows_per_shard + token
            acc = sums.get(row)
            if acc is None:
                acc = np.zeros(grads.shape[1], dtype=np.float32)
            sums[row] = acc + f32(gain) * grads[act_row]
    return sums


def fused_update(optimizer, row_pointers, sample_ids, token_ids, gains, activation_gradients,
                 learning_rate, embedding_table, slots, num_minibatches, hyperparameters=None,
                 clip_weight_min=-math.inf, clip_weight_max=math.inf,
                 num_sparsecores_per_device=-1, num_replica=1):
    """Returns (new_table, [new_slots...]); untouched rows are copied bit for bit.

    `optimizer` is a key of OPTIMIZER_STEPS; `slots` are in the op's slot order;
    `hyperparameters` maps the op attribute names to values.
    """
    step = OPTIMIZER_STEPS[optimizer]
    hp = dict(hyperparameters or {})
    table = np.array(embedding_table, dtype=np.float32, copy=True)
    slots = [np.array(s, dtype=np.float32, copy=True) for s in slots]
    num_sc = resolve_sc(num_sparsecores_per_device)
    num_shards = num_sc * num_replica
    rows_per_shard = table.shape[0] // num_shards
    lr = f32(np.asarray(learning_rate, dtype=np.float32).reshape(-1)[0])
    sums = accumulate_gradients(row_pointers, sample_ids, token_ids, gains, activation_gradients,
                                int(num_minibatches), num_shards, num_sc, rows_per_shard)
    for row, g in sums.items():
        w_new, slot_rows = step(g, table[row].copy(), [s[row].copy() for s in slots], lr, hp,
                                clip_weight_min, clip_weight_max)
        table[row] = w_new
        for s, new in zip(slots, slot_rows):
            s[row] = new
    return table, slots


def touched_rows(row_pointers, sample_ids, token_ids, num_minibatches, num_sc, num_shards,
                 rows_per_shard):
    """Sorted stacked-table rows referenced by at least one valid entry."""
    gains = np.zeros(np.asarray(token_ids).shape, np.float32)
    rows = {p * rows_per_shard + token
            for _, _, p, _, token, _ in csr_entries(row_pointers, sample_ids, token_ids, gains,
                                                    num_sc, num_minibatches, num_shards)}
    return sorted(rows)
