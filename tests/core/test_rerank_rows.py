"""The re-rank on a distance matrix (forecasts, fit's guard, benchmarks) orders each row as the
served re-rank (:func:`rm_qdrant.core.rerank.reranked`) orders a hit list."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.guard import rank_guard
from rm_qdrant.core.merge import Hit
from rm_qdrant.core.rerank import Rescored, reranked
from rm_qdrant.core.rerank_rows import reranked_rows, sample_depth


def test_a_matrix_row_is_reranked_as_the_served_hit_list_is():
    rng = np.random.default_rng(1)
    merged, rescored = rng.random((6, 30)), rng.random((6, 30))
    migrated = rng.random(30) < 0.4
    rescored[:, migrated] = merged[:, migrated]  # new's hits already have the new model's distance
    rows = np.arange(6)
    out = reranked_rows(merged, rescored, 8, rows)
    for i in rows:
        hits = [
            Hit(j, 0.0, float(merged[i, j]), "new" if migrated[j] else "old") for j in range(30) if j != i
        ]
        hits.sort(key=lambda h: (h.distance, h.id))
        found = {h.id: Rescored("embedded", float(rescored[i, h.id])) for h in hits if h.source == "old"}
        served = [h.id for h in reranked(hits, 8, found, "cosine")]
        assert np.argsort(out[i], kind="stable")[:29].tolist() == served


def test_a_rerank_over_every_item_is_the_new_models_ranking_at_any_merge():
    rng = np.random.default_rng(2)
    merged, rescored = rng.random((4, 12)), rng.random((4, 12))
    out = reranked_rows(merged, rescored, 11)
    own = rescored.copy()
    np.fill_diagonal(own, np.inf)
    assert (np.argsort(out, axis=1)[:, :11] == np.argsort(own, axis=1)[:, :11]).all()


@pytest.mark.parametrize(
    ("k", "sample", "gallery", "depth"), [(100, 2000, 10000, 20), (1, 50, 10**6, 1), (500, 40, 40, 39)]
)
def test_a_gallerys_k_is_the_same_share_of_a_sample(k, sample, gallery, depth):
    assert sample_depth(k, sample, gallery) == depth


def test_the_guard_weighs_both_sides_with_the_rerank():
    """A ψ that scatters the old half fails the guard on the plain merges; re-ranked over every
    item, both sides serve the new model's ranking (the graph's new output is the backbone's), and
    the graph is not below the naive merge at any t."""
    rng = np.random.default_rng(3)
    n = 60
    base = rng.normal(size=(n, 8))
    old = base[:, :4] + 0.3 * rng.normal(size=(n, 4))
    rev = rng.normal(size=(n, 4))  # a ψ that finds nothing
    order, queries = rng.permutation(n), np.arange(0, n, 3)
    plain = rank_guard(old, base, base, rev, order=order, queries=queries, k=5)
    full = rank_guard(old, base, base, rev, order=order, queries=queries, k=5, rerank=n - 1)
    assert not plain.passed
    assert full.passed and full.naive == pytest.approx(full.fitted)
    assert full.naive[0] == pytest.approx(full.naive[-1])  # the new model's ranking from t = 0
