"""Reference of the weighted gather + segment sum of the all-to-all exchange
(tf_sc_embedding/ops/segment_sum.py, docs/multi_worker.md#exchange), entry by entry in float32."""
import numpy as np


def gathered_segment_sum(rows, positions, gains, segment_ids, num_segments):
    """out[segment_ids[i]] += gains[i] * rows[positions[i]], entries in order, from zero."""
    rows = np.asarray(rows, np.float32)
    out = np.zeros((num_segments, rows.shape[1]), np.float32)
    for p, g, s in zip(positions, np.asarray(gains, np.float32), segment_ids):
        out[s] += g * rows[p]    # float32 product, rounded, then a float32 add
    return out
