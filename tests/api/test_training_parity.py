"""Training parity of `TPUEmbeddingV2` with the numpy and dense TensorFlow references
(parity_helpers.py) over optimizer x combiner x input kind x weights x replicas.

The default run covers a pairwise-complete subset of the cross product; the full cross product is
marked `slow` (`pytest -m slow`).
"""
import itertools

import pytest

from tests.api.parity_helpers import COMBINERS, KINDS, OPTIMIZERS, REPLICAS, run_parity


def _pairwise_subset():
    """A small set of (optimizer, combiner, kind, weighted, replicas) covering every pair of
    values of any two parameters at least once (greedy covering array)."""
    domains = [tuple(OPTIMIZERS), COMBINERS, KINDS, (False, True), REPLICAS]
    uncovered = {(i, a, j, b) for i, j in itertools.combinations(range(len(domains)), 2)
                 for a in domains[i] for b in domains[j]}
    chosen = []
    candidates = list(itertools.product(*domains))
    while uncovered:
        def gain(c):
            return sum((i, c[i], j, c[j]) in uncovered
                       for i, j in itertools.combinations(range(len(c)), 2))
        best = max(candidates, key=gain)  # first maximum: deterministic
        chosen.append(best)
        uncovered -= {(i, best[i], j, best[j])
                      for i, j in itertools.combinations(range(len(best)), 2)}
    return chosen


DEFAULT_CASES = _pairwise_subset()
ALL_CASES = [c for c in itertools.product(tuple(OPTIMIZERS), COMBINERS, KINDS, (False, True),
                                          REPLICAS) if c not in DEFAULT_CASES]


def _case_id(case):
    o, c, k, w, r = case
    return f"{o}-{c}-{k}-{'weighted' if w else 'unweighted'}-replicas_{r}"


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=_case_id)
def test_parity(case):
    run_parity(*case)


@pytest.mark.slow
@pytest.mark.parametrize("case", ALL_CASES, ids=_case_id)
def test_parity_full_cross_product(case):
    run_parity(*case)
