"""Click-through data with real signal: Criteo-like ids and dense features labelled by a teacher.

`TeacherLabelledData` draws the 26 categorical features of the Criteo-like workload
(`criteo_like.py`: Zipf-distributed multi-hot ids, optionally with scaled-down vocabularies) plus 13
dense features, and labels every sample with a hidden "teacher" model over the *same* ids:

* every (feature, id) has its own random teacher embedding ``t_f[id]`` in R^k and a bias ``b_f[id]``;
  a sample's feature vector ``e_f`` is the mean of its ids' embeddings (``beta_f`` likewise);
* the teacher's logit is a nonlinear combination: first-order terms ``sum_f beta_f``, all pairwise
  interactions ``sum_{f<g} <e_f, e_g>``, and a one-hidden-layer tanh network of the dense features;
  each part is scaled to a fixed spread and an offset gives a positive rate of about 25%;
* the label is Bernoulli(sigmoid(logit)).

A DLRM-style student (embedding tables + MLPs + dot interactions) can represent every term, but only
by learning the tables: with frozen random tables only the dense term and whatever a network can
extract from fixed random codes are available. `oracle_logits` gives the teacher's logits, so the
best achievable AUC on a split can be reported next to the student's.
Everything is seeded and reproducible; the train and test splits never share a batch index.
"""
import dataclasses

import numpy as np

from tf_sc_embedding.data.criteo_like import CRITEO_LIKE_VOCABULARY_SIZES, CriteoLikeWorkload

NUM_DENSE_FEATURES = 13
FEATURE_NAMES = tuple(f"C{i + 1}" for i in range(len(CRITEO_LIKE_VOCABULARY_SIZES)))
DENSE_NAMES = tuple(f"I{i + 1}" for i in range(NUM_DENSE_FEATURES))

# Spread (standard deviation) of each part of the teacher's logit.
_FIRST_ORDER_STD = 1.2
_PAIRWISE_STD = 1.6
_DENSE_STD = 1.0
_TEST_INDEX_BASE = 1 << 40   # batch indices of the test split (the train split counts from 0)


@dataclasses.dataclass
class LabelledSplit:
    """Samples in ragged form (numpy): per feature row_splits [n+1] and ids; dense [n, 13]."""
    row_splits: list
    ids: list
    dense: np.ndarray
    labels: np.ndarray
    logits: np.ndarray     # the teacher's logits (for the oracle AUC)

    def __len__(self):
        return len(self.labels)


def scaled_vocabulary_sizes(scale):
    """The Criteo-like vocabulary sizes times `scale` (at least 3 rows each)."""
    return tuple(max(3, int(v * scale)) for v in CRITEO_LIKE_VOCABULARY_SIZES)


class TeacherLabelledData:
    """Seeded Criteo-like samples with teacher labels; see the module docstring."""

    def __init__(self, vocabulary_scale=0.01, teacher_dim=4, seed=0, zipf_exponent=1.05,
                 max_ids_per_sample=6):
        self.vocabulary_sizes = scaled_vocabulary_sizes(vocabulary_scale)
        self.feature_names = FEATURE_NAMES
        self.dense_names = DENSE_NAMES
        self.teacher_dim = teacher_dim
        self._seed = seed
        self._workload = CriteoLikeWorkload(self.vocabulary_sizes, zipf_exponent=zipf_exponent,
                                            max_ids_per_sample=max_ids_per_sample, seed=seed)
        rng = np.random.default_rng([seed, 7])
        self._embeddings = [rng.normal(0, 1, (v, teacher_dim)).astype(np.float32)
                            for v in self.vocabulary_sizes]
        self._biases = [rng.normal(0, 1, v).astype(np.float32) for v in self.vocabulary_sizes]
        # Dense features: log-normal "counts" with a shared latent factor, fed to the models as
        # log1p (as DLRM does with Criteo's integer features).
        self._dense_mixing = rng.normal(0, 0.5, (NUM_DENSE_FEATURES, NUM_DENSE_FEATURES))
        self._dense_hidden = rng.normal(0, 1 / np.sqrt(NUM_DENSE_FEATURES),
                                        (NUM_DENSE_FEATURES, 8))
        self._dense_out = rng.normal(0, 1, 8)
        self._scales = None
        self._scales = self._calibrate()

    @property
    def num_features(self):
        return len(self.vocabulary_sizes)

    def _raw(self, num_samples, index):
        batch = self._workload.batch(num_samples, index=index)
        rng = np.random.default_rng([self._seed, 11, index])
        latent = rng.normal(0, 1, (num_samples, NUM_DENSE_FEATURES))
        counts = np.exp(latent @ self._dense_mixing + 1.0)
        dense = np.log1p(np.floor(counts)).astype(np.float32)
        return batch, dense, rng

    def _parts(self, batch, dense):
        """The three unscaled parts of the teacher's logit."""
        first = 0.0
        vectors = []
        for f in range(self.num_features):
            starts, ids = batch.row_splits[f][:-1], batch.ids[f]
            lengths = np.diff(batch.row_splits[f]).astype(np.float32)
            first = first + np.add.reduceat(self._biases[f][ids], starts) / lengths
            vectors.append(np.add.reduceat(self._embeddings[f][ids], starts) / lengths[:, None])
        total = np.sum(vectors, axis=0)
        # sum_{f<g} <e_f, e_g> = (|sum_f e_f|^2 - sum_f |e_f|^2) / 2
        pairwise = 0.5 * (np.sum(total * total, 1) - sum(np.sum(v * v, 1) for v in vectors))
        centered = (dense - 1.3) / 0.6
        dense_term = np.tanh(centered @ self._dense_hidden) @ self._dense_out
        return first, pairwise, dense_term

    def _calibrate(self):
        batch, dense, _ = self._raw(20000, index=(1 << 50))
        parts = self._parts(batch, dense)
        stds = (_FIRST_ORDER_STD, _PAIRWISE_STD, _DENSE_STD)
        scales = [(s / max(np.std(p), 1e-6), -np.mean(p)) for s, p in zip(stds, parts)]
        logits = sum(a * (p + b) for (a, b), p in zip(scales, parts))
        # Offset for a positive rate of about 25% (Criteo's is 26%).
        offsets = np.linspace(-5, 2, 701)
        rates = [np.mean(1 / (1 + np.exp(-(logits + o)))) for o in offsets]
        offset = offsets[int(np.argmin(np.abs(np.array(rates) - 0.25)))]
        return scales, float(offset)

    def _logits(self, batch, dense):
        scales, offset = self._scales
        parts = self._parts(batch, dense)
        return (sum(a * (p + b) for (a, b), p in zip(scales, parts)) + offset).astype(np.float32)

    def split(self, num_samples, index=0, test=False):
        """`num_samples` labelled samples; `index` picks an independent chunk of the split."""
        index = index + (_TEST_INDEX_BASE if test else 0)
        batch, dense, rng = self._raw(num_samples, index)
        logits = self._logits(batch, dense)
        labels = (rng.random(num_samples) < 1 / (1 + np.exp(-logits))).astype(np.float32)
        return LabelledSplit(batch.row_splits, batch.ids, dense, labels, logits)


def auc(labels, scores):
    """Area under the ROC curve (rank statistic, ties averaged), numpy only."""
    labels = np.asarray(labels, np.float64).reshape(-1)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), np.float64)
    # average ranks of ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts - 1) / 2.0 + 1
    ranks[order] = np.repeat(average, counts)
    positives = labels > 0.5
    n_pos, n_neg = positives.sum(), (~positives).sum()
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def log_loss(labels, probabilities, eps=1e-7):
    p = np.clip(np.asarray(probabilities, np.float64).reshape(-1), eps, 1 - eps)
    y = np.asarray(labels, np.float64).reshape(-1)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
