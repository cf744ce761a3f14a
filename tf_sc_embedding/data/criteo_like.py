"""A seeded Criteo-like categorical workload: 26 features, Zipf-distributed multi-hot ids.

Vocabulary sizes follow the shape of the public Criteo display-ads feature cardinalities, capped at
4,000,000 rows (about 18.8M rows in all). Each sample holds 1-6 ids per feature (1 + Binomial(5,
0.4), mean 3), drawn from a Zipf law with exponent 1.05 over a fixed random permutation of the
vocabulary, each with a positive weight.
"""
import dataclasses

import numpy as np

CRITEO_LIKE_VOCABULARY_SIZES = (
    1460, 583, 4_000_000, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683, 4_000_000, 3_194,
    27, 14_992, 4_000_000, 10, 5_652, 2_173, 4, 4_000_000, 18, 15, 286_181, 105, 142_572)


@dataclasses.dataclass
class Batch:
    """One batch in ragged form: per feature, row_splits [B+1], ids [n] and weights [n]."""
    row_splits: list
    ids: list
    weights: list


class _ZipfSampler:
    """Inverse-CDF sampling of ranks with P(k) proportional to 1 / k^exponent."""

    def __init__(self, vocabulary_size, exponent, rng):
        ranks = np.arange(1, vocabulary_size + 1, dtype=np.float64)
        cdf = np.cumsum(ranks ** -exponent)
        self._cdf = cdf / cdf[-1]
        self._ids = rng.permutation(vocabulary_size).astype(np.int32)

    def sample(self, n, rng):
        ranks = np.searchsorted(self._cdf, rng.random(n), side="right")
        return self._ids[np.minimum(ranks, len(self._ids) - 1)]


class CriteoLikeWorkload:
    """Generates reproducible batches of the 26-feature workload."""

    def __init__(self, vocabulary_sizes=CRITEO_LIKE_VOCABULARY_SIZES, zipf_exponent=1.05,
                 max_ids_per_sample=6, seed=0):
        self.vocabulary_sizes = tuple(int(v) for v in vocabulary_sizes)
        self.max_ids_per_sample = max_ids_per_sample
        rng = np.random.default_rng(seed)
        self._samplers = [_ZipfSampler(v, zipf_exponent, rng) for v in self.vocabulary_sizes]
        self._seed = seed

    @property
    def num_features(self):
        return len(self.vocabulary_sizes)

    def batch(self, batch_size, index=0):
        """Batch number `index` (deterministic for a given seed)."""
        rng = np.random.default_rng([self._seed, index])
        row_splits, ids, weights = [], [], []
        for sampler in self._samplers:
            lengths = 1 + rng.binomial(self.max_ids_per_sample - 1, 0.4, size=batch_size)
            splits = np.zeros(batch_size + 1, dtype=np.int32)
            np.cumsum(lengths, out=splits[1:])
            n = int(splits[-1])
            row_splits.append(splits)
            ids.append(sampler.sample(n, rng))
            weights.append(rng.uniform(0.5, 1.5, size=n).astype(np.float32))
        return Batch(row_splits, ids, weights)
