#!/usr/bin/env python3
"""Run FBGEMM's CPU TBE (SplitTableBatchedEmbeddingBagsCodegen) with
EXACT_ROWWISE_ADAGRAD for one forward/backward step on inputs from a .npz file.

Written for this project to compare its row-wise Adagrad with FBGEMM's. It runs only in a
virtual environment with torch and fbgemm_gpu (CPU), outside this project's dependencies (see
bench/compare_fbgemm_row_wise_adagrad.py, which drives it). The self-test compares FBGEMM with a
float64 numpy formula, including FBGEMM's handling of mean pooling with per-sample weights (its
CPU backward leaves out the 1/L factor there, so compare sum pooling). Usage:
    python fbgemm_row_wise_adagrad.py IN.npz OUT.npz
    python fbgemm_row_wise_adagrad.py --selftest [--seed N]

IN.npz:
    weights             float32 [T, R, D]   initial tables (same R, D for all)
    accumulators        float32 [T, R]      initial row-wise Adagrad state
    indices             int64   [nnz]
    offsets             int64   [T*B + 1]   table-major bags (bag t*B + b)
    per_sample_weights  float32 [nnz]       optional (absent -> None)
    grad_output         float32 [B, T*D]    d(loss)/d(pooled output)
    learning_rate, eps  scalars
    pooling             "sum" | "mean"

OUT.npz:
    weights       float32 [T, R, D]  after the update
    accumulators  float32 [T, R]     after the update
    forward       float32 [B, T*D]   pooled forward output (before the update)
"""

import argparse
import sys

import numpy as np


def _scalar(x):
    a = np.asarray(x)
    return a.item() if a.ndim == 0 else a.reshape(-1)[0].item()


def run_fbgemm(weights, accumulators, indices, offsets, per_sample_weights,
               grad_output, learning_rate, eps, pooling):
    """Returns (new_weights [T,R,D], new_acc [T,R], forward [B,T*D]) as numpy."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    weights = np.ascontiguousarray(weights, dtype=np.float32)
    accumulators = np.ascontiguousarray(accumulators, dtype=np.float32)
    T, R, D = weights.shape
    assert accumulators.shape == (T, R), (accumulators.shape, (T, R))
    assert D % 4 == 0, "FBGEMM TBE requires embedding_dim % 4 == 0"
    offsets = np.asarray(offsets, dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    assert (len(offsets) - 1) % T == 0, "offsets must have T*B+1 entries"
    B = (len(offsets) - 1) // T
    grad_output = np.ascontiguousarray(grad_output, dtype=np.float32)
    assert grad_output.shape == (B, T * D), (grad_output.shape, (B, T * D))

    pooling = str(pooling).lower()
    pooling_mode = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[pooling]

    emb = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(R, D, EmbeddingLocation.HOST, ComputeDevice.CPU)
                         for _ in range(T)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=float(learning_rate),
        eps=float(eps),
        weight_decay=0.0,
        pooling_mode=pooling_mode,
        weights_precision=SparseType.FP32,
        output_dtype=SparseType.FP32,
        device=torch.device("cpu"),
    )

    # Load the initial state into the module (views into weights_host /
    # momentum1_host, so copy_ writes through).
    w_views = emb.split_embedding_weights()
    states = emb.split_optimizer_states()
    assert len(w_views) == T and len(states) == T
    for t in range(T):
        assert tuple(w_views[t].shape) == (R, D), w_views[t].shape
        acc_view = states[t][0]
        assert tuple(acc_view.shape) == (R,), acc_view.shape
        assert acc_view.dtype == torch.float32, acc_view.dtype
        w_views[t].copy_(torch.from_numpy(weights[t]))
        acc_view.copy_(torch.from_numpy(accumulators[t]))
    # The views alias the flat buffers: weights_host [T*R*D], momentum1_host
    # [T*R] (table t at offset t*R*D / t*R).  Make sure the copies landed.
    assert torch.equal(emb.weights_host.detach(),
                       torch.from_numpy(weights.reshape(-1)))
    assert torch.equal(emb.momentum1_host.detach(),
                       torch.from_numpy(accumulators.reshape(-1)))

    psw = None
    if per_sample_weights is not None:
        psw = torch.from_numpy(np.ascontiguousarray(per_sample_weights,
                                                    dtype=np.float32))
        assert psw.numel() == indices.size

    out = emb(
        indices=torch.from_numpy(indices),
        offsets=torch.from_numpy(offsets),
        per_sample_weights=psw,
    )
    assert tuple(out.shape) == (B, T * D), out.shape
    fwd = out.detach().clone().numpy()
    out.backward(torch.from_numpy(grad_output))  # fused optimizer step

    new_w = np.stack([v.detach().clone().numpy()
                      for v in emb.split_embedding_weights()])
    new_acc = np.stack([s[0].detach().clone().numpy()
                        for s in emb.split_optimizer_states()])
    return new_w, new_acc, fwd


def numpy_reference(weights, accumulators, indices, offsets, per_sample_weights,
                    grad_output, learning_rate, eps, pooling,
                    fbgemm_mean_psw_quirk=False):
    """Documented FBGEMM row-wise Adagrad, in float64:
    g[r] = sum over occurrences of row r of (psw * scale * grad_output slice)
    acc[r] += mean_d g[r,d]^2 ;  w[r] -= lr * g[r] / (sqrt(acc[r]) + eps)
    (only rows that appear in `indices` are touched).

    fbgemm_mean_psw_quirk=True reproduces FBGEMM's CPU backward for MEAN pooling
    with per_sample_weights: the forward divides by the bag length, but the
    backward does NOT (it uses psw only, like SUM; see the
    "MEAN pooling will not work with indice_weights!" note in FBGEMM's
    embedding_backward_split_cpu_template.cpp)."""
    W = weights.astype(np.float64)
    acc = accumulators.astype(np.float64).copy()
    T, R, D = W.shape
    B = (len(offsets) - 1) // T
    go = grad_output.astype(np.float64)
    fwd = np.zeros((B, T * D))
    grads = [dict() for _ in range(T)]
    for t in range(T):
        for b in range(B):
            s, e = int(offsets[t * B + b]), int(offsets[t * B + b + 1])
            L = e - s
            scale = 1.0 / L if (pooling == "mean" and L > 0) else 1.0
            gscale = scale
            if fbgemm_mean_psw_quirk and per_sample_weights is not None:
                gscale = 1.0
            g_out = go[b, t * D:(t + 1) * D]
            for i in range(s, e):
                r = int(indices[i])
                wi = 1.0 if per_sample_weights is None else float(per_sample_weights[i])
                fwd[b, t * D:(t + 1) * D] += scale * wi * W[t, r]
                grads[t][r] = grads[t].get(r, 0.0) + gscale * wi * g_out
    newW = W.copy()
    for t in range(T):
        for r, g in grads[t].items():
            acc[t, r] += np.mean(g * g)
            newW[t, r] -= learning_rate * g / (np.sqrt(acc[t, r]) + eps)
    return newW, acc, fwd


def _max_rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def make_random_inputs(rng, T=2, R=50, D=8, B=16, with_psw=True, pooling="sum"):
    lengths = rng.integers(0, 6, size=T * B)          # includes empty bags
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    nnz = int(offsets[-1])
    # draw ids from a small hot set so that ids repeat within and across bags
    hot = rng.choice(R, size=12, replace=False)
    indices = np.where(rng.random(nnz) < 0.7,
                       rng.choice(hot, size=nnz),
                       rng.integers(0, R, size=nnz)).astype(np.int64)
    inp = dict(
        weights=rng.standard_normal((T, R, D)).astype(np.float32),
        accumulators=(rng.random((T, R)) * 0.5).astype(np.float32),
        indices=indices,
        offsets=offsets,
        grad_output=rng.standard_normal((B, T * D)).astype(np.float32),
        learning_rate=np.float32(0.05),
        eps=np.float32(1e-8),
        pooling=np.array(pooling),
    )
    if with_psw:
        inp["per_sample_weights"] = rng.uniform(0.2, 2.0, size=nnz).astype(np.float32)
    return inp


def run_from_dict(d):
    return run_fbgemm(
        d["weights"], d["accumulators"], d["indices"], d["offsets"],
        d["per_sample_weights"] if "per_sample_weights" in d else None,
        d["grad_output"], _scalar(d["learning_rate"]), _scalar(d["eps"]),
        str(_scalar(d["pooling"])).lower(),
    )


def selftest(seed):
    rng = np.random.default_rng(seed)
    worst = 0.0
    for pooling in ("sum", "mean"):
        for with_psw in (True, False):
            inp = make_random_inputs(rng, with_psw=with_psw, pooling=pooling)
            psw = inp.get("per_sample_weights")
            ids = inp["indices"]
            n_rep = int(np.sum(np.bincount(ids) > 1))
            try:
                w, a, f = run_from_dict(inp)
            except Exception as ex:  # report, keep going
                print(f"[{pooling:4s} psw={with_psw!s:5s}] FBGEMM raised: "
                      f"{type(ex).__name__}: {ex}".splitlines()[0])
                continue
            ref_args = (inp["weights"], inp["accumulators"], ids, inp["offsets"],
                        psw, inp["grad_output"], float(inp["learning_rate"]),
                        float(inp["eps"]), pooling)
            quirk = pooling == "mean" and with_psw
            if quirk:
                tw, ta, _ = numpy_reference(*ref_args)
                print(f"[{pooling:4s} psw={with_psw!s:5s}] vs TRUE gradient of the "
                      f"mean-pooled forward: weights={_max_rel(w, tw):.3e} "
                      f"accumulators={_max_rel(a, ta):.3e}  (FBGEMM CPU backward "
                      f"skips the 1/L factor when per_sample_weights are given)")
            rw, ra, rf = numpy_reference(*ref_args, fbgemm_mean_psw_quirk=quirk)
            touched = np.zeros(inp["accumulators"].shape, bool)
            B = inp["grad_output"].shape[0]
            for t in range(w.shape[0]):
                s, e = inp["offsets"][t * B], inp["offsets"][(t + 1) * B]
                touched[t, ids[s:e]] = True
            untouched_same = (np.array_equal(w[~touched], inp["weights"][~touched])
                              and np.array_equal(a[~touched], inp["accumulators"][~touched]))
            dw, da, df = _max_rel(w, rw), _max_rel(a, ra), _max_rel(f, rf)
            # relative size of the update itself, to show the check is not vacuous
            upd = np.max(np.abs(rw - inp["weights"]))
            worst = max(worst, dw, da, df)
            tag = " (ref w/ no-1/L quirk)" if quirk else ""
            print(f"[{pooling:4s} psw={with_psw!s:5s}]{tag} nnz={ids.size} "
                  f"rows_repeated={n_rep} max|dw|={upd:.3g}  max rel diff: "
                  f"weights={dw:.3e} accumulators={da:.3e} forward={df:.3e} | max abs "
                  f"diff: weights={np.max(np.abs(w - rw)):.3e} "
                  f"accumulators={np.max(np.abs(a - ra)):.3e} "
                  f"untouched_rows_unchanged={untouched_same}")
    print(f"SELFTEST max relative difference FBGEMM vs numpy: {worst:.3e}")
    return worst


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inp", nargs="?")
    p.add_argument("out", nargs="?")
    p.add_argument("--selftest", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.selftest:
        worst = selftest(args.seed)
        return 0 if worst < 1e-4 else 1
    if not (args.inp and args.out):
        p.error("need IN.npz OUT.npz (or --selftest)")
    with np.load(args.inp, allow_pickle=False) as z:
        d = {k: z[k] for k in z.files}
    if ("per_sample_weights" in d
            and str(_scalar(d["pooling"])).lower() == "mean"):
        print("WARNING: FBGEMM CPU backward ignores the 1/L mean scaling when "
              "per_sample_weights are given (forward applies it).",
              file=sys.stderr)
    w, a, f = run_from_dict(d)
    np.savez(args.out, weights=w, accumulators=a, forward=f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
