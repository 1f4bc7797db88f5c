"""The label-free guard (rm_qdrant.core.guard) on constructed embeddings: it refuses a ψ that the
new model's own neighbours reward while it scatters the old model's, and accepts ψ = identity."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant.core.forecast import compare_fitted
from rm_qdrant.core.guard import calibration_refusal, guard

N, CLASSES, K = 200, 10, 10


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _open_class_pair() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Old and new embeddings whose classes agree on the first half of the points; on the second
    half the new model puts each point in the next class. Old vectors carry a small one-hot tail
    (one dimension per point) through which a ψ can rank the old side in any order it likes."""
    rng = np.random.default_rng(0)
    c_old = np.arange(N) % CLASSES
    c_new = np.where(np.arange(N) < N // 2, c_old, (c_old + 1) % CLASSES)
    centres = _unit(rng.normal(size=(CLASSES, 32)))
    old_feat = _unit(centres[c_old] + 0.3 * rng.normal(size=(N, 32)) / np.sqrt(32))
    base = _unit(centres[c_new] + 0.3 * rng.normal(size=(N, 32)) / np.sqrt(32))
    old = np.hstack([old_feat, 0.05 * np.eye(N)])
    return old, base, c_new


def _psi_ranking(scores: np.ndarray, old: np.ndarray) -> np.ndarray:
    """rev vectors whose cosine to old vector j orders the old side by ``scores[:, j]`` (high first)."""
    return np.hstack(
        [np.zeros((len(scores), old.shape[1] - len(scores))), scores - scores.min(axis=1, keepdims=True)]
    )


def test_guard_refuses_a_psi_that_matches_new_neighbours_but_scatters_the_old_ones() -> None:
    old, base, _ = _open_class_pair()
    sim_new = base @ base.T
    sim_old = old[:, :32] @ old[:, :32].T
    depth = 3 * K
    ranks_new = np.argsort(np.argsort(-sim_new, axis=1), axis=1)
    ranks_old = np.argsort(np.argsort(-sim_old, axis=1), axis=1)
    agreed = (ranks_new <= depth) & (ranks_old <= depth)
    # ψ: the new model's order on the old side, where the models agree on a query's class; on the
    # other half, the same order with the neighbours both models agree on pushed to the bottom.
    scores = sim_new.copy()
    disagreeing = np.arange(N) >= N // 2
    scores[disagreeing] -= 10.0 * agreed[disagreeing]
    rev = _psi_ranking(scores, old)
    order = np.random.default_rng(1).permutation(N)

    # The old evidence, recall@k against the new model's own top k, at the two ends (in between
    # this constructed ψ's tiny cosines are crowded out, which is beside the point here).
    naive, fitted = compare_fitted(old, base, base, rev, order=order, k=K, fractions=(0.0, 1.0))
    assert fitted.recall[0] > naive.recall[0] + 0.2 and fitted.area > naive.area  # it was accepted

    verdict = guard(old, base, base, rev, order=order, k=K)
    assert not verdict.passed
    assert verdict.fitted[0] < verdict.naive[0] - verdict.tolerances[0]  # it starts below the old model
    worst = verdict.worst
    reason = verdict.reason()
    assert f"at t = {verdict.fractions[worst]:g} " in reason
    assert f"{verdict.fitted[worst]:.3f}" in reason and f"{verdict.naive[worst]:.3f}" in reason


def test_guard_accepts_psi_identity_on_a_compatible_pair() -> None:
    rng = np.random.default_rng(2)
    centres = _unit(rng.normal(size=(CLASSES, 32)))
    emb = _unit(centres[np.arange(N) % CLASSES] + 0.3 * rng.normal(size=(N, 32)))
    verdict = guard(emb, emb, emb, emb, order=rng.permutation(N), k=K)
    assert verdict.passed and verdict.queries == N
    assert min(verdict.margins) == 0.0 and min(verdict.tolerances) > 0


def _compatible_pair() -> tuple[np.ndarray, np.ndarray]:
    """Two models that see the same classes, each with its own noise."""
    rng = np.random.default_rng(3)
    centres = _unit(rng.normal(size=(CLASSES, 32)))
    classes = np.arange(N) % CLASSES
    old = _unit(centres[classes] + 0.3 * rng.normal(size=(N, 32)))
    return old, _unit(centres[classes] + 0.3 * rng.normal(size=(N, 32)))


def test_guard_judges_a_calibration_of_old_distances_against_the_plain_merge() -> None:
    old, base = _compatible_pair()
    order = np.random.default_rng(4).permutation(N)
    same = guard(old, base, base, old, order=order, k=K, fitted_distance=lambda d: d, subject="the map")
    assert same.passed and max(map(abs, same.margins)) == 0.0
    # A map that pushes every old hit behind the new ones: early in the backfill the merged top k
    # is the few migrated points, far from most queries in both models' eyes.
    crowding = guard(
        old, base, base, old, order=order, k=K, fitted_distance=lambda d: d + 2.0, subject="the map"
    )
    assert not crowding.passed and crowding.margins[0] == 0.0  # at t = 0 every hit is old: same order
    assert 0 < crowding.fractions[crowding.worst] < 1
    assert crowding.reason().startswith(f"at t = {crowding.fractions[crowding.worst]:g} the map's hits")


def test_rmq_calibrate_keeps_a_map_only_when_it_forecasts_better_and_the_guard_passes() -> None:
    old, base = _compatible_pair()
    order = np.random.default_rng(4).permutation(N)
    passed = guard(old, base, base, old, order=order, k=K, fitted_distance=lambda d: d)
    refused = guard(old, base, base, old, order=order, k=K, fitted_distance=lambda d: d + 2.0)
    assert calibration_refusal(0.6, 0.5, passed) == ""
    assert calibration_refusal(0.5, 0.5, passed) == "it forecasts no better than the plain merge"
    assert calibration_refusal(0.4, 0.5, refused) == "it forecasts no better than the plain merge"
    assert calibration_refusal(0.6, 0.5, refused) == f"the guard refuses it: {refused.reason()}"
    assert calibration_refusal(0.6, 0.5, passed, 0.55) == ""  # better than the map in use too
    assert (
        calibration_refusal(0.6, 0.5, passed, 0.6)
        == "it forecasts no better than the map in use (area 0.600)"
    )


def _brute_map(d: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each query's AP over the rest by the distances ``d`` (n, n); a tie ranks the relevant item last."""
    aps = np.zeros(len(d))
    for i, row in enumerate(d):
        others = [j for j in range(len(d)) if j != i]
        relevant = [j for j in others if labels[j] == labels[i]]
        if not relevant:
            continue
        precisions = []
        for hit, j in enumerate(sorted(relevant, key=lambda j: row[j]), start=1):
            ahead = sum(1 for o in others if o not in relevant and row[o] <= row[j])  # a tie counts against
            precisions.append(hit / (hit + ahead))
        aps[i] = np.mean(precisions)
    return aps


@pytest.mark.parametrize("metric", ["cosine", "dot", "euclid"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_labelled_guard_is_the_mean_ap_of_each_merge_at_every_t(metric, seed) -> None:
    from rm_qdrant.core.guard import labelled_guard
    from rm_qdrant.core.metrics import migrated_at
    from rm_qdrant.core.spaces import distance_matrix

    rng = np.random.default_rng(seed)
    n, fractions = 24, (0.0, 0.5, 1.0)
    labels = rng.integers(0, 4, n)
    old, base = rng.normal(size=(n, 5)) * 3, rng.normal(size=(n, 7))
    new, rev = rng.normal(size=(n, 7)), rng.normal(size=(n, 5))
    order = rng.permutation(n)
    verdict = labelled_guard(
        old, base, new, rev, list(labels), order=order, fractions=fractions, metric=metric
    )
    for i, t in enumerate(fractions):
        m = migrated_at(order, t)
        for query_new, query_old, gallery_new, got in (
            (base, old, base, verdict.naive),
            (new, rev, new, verdict.fitted),
        ):
            d = np.empty((n, n))
            d[:, m] = distance_matrix(query_new, gallery_new[m], metric)
            d[:, ~m] = distance_matrix(query_old, old[~m], metric)
            assert got[i] == pytest.approx(_brute_map(d, labels).mean(), abs=1e-6)
    assert verdict.measure == "mAP" and verdict.queries == n


def test_labels_refuse_a_psi_the_label_free_guard_cannot_see_is_wrong() -> None:
    """The open-class pair: the labels are the old model's classes on every point; ψ = the new
    model's order, which puts half the points in the next class. The labels refuse it at t = 0
    and name the measure; ψ = the old model's own order passes."""
    from rm_qdrant.core.guard import labelled_guard

    old, base, _ = _open_class_pair()
    labels = list(np.arange(N) % CLASSES)
    order = np.random.default_rng(1).permutation(N)
    imitating = _psi_ranking(base @ base.T, old)
    verdict = labelled_guard(old, base, base, imitating, labels, order=order)
    assert not verdict.passed and verdict.fractions[verdict.worst] == 0.0
    assert "mAP over the held-out points (payload labels)" in verdict.reason()
    assert verdict.as_dict()["measure"].startswith("mAP")
    assert labelled_guard(old, base, base, old, labels, order=order).passed  # the naive merge itself


@pytest.mark.parametrize("metric", ["cosine", "dot", "euclid"])
def test_the_rank_guard_scores_each_hit_by_the_new_models_log_rank_over_the_whole_gallery(metric) -> None:
    """Held-out queries against every item: the score of a merge's top k is the mean of
    1 − log(1 + r) / log n, r the new model's rank of the hit among the other items."""
    from rm_qdrant.core.guard import rank_guard
    from rm_qdrant.core.metrics import migrated_at
    from rm_qdrant.core.spaces import distance_matrix

    rng = np.random.default_rng(3)
    n, k, fractions = 40, 4, (0.0, 0.5, 1.0)
    old, base = rng.normal(size=(n, 5)), rng.normal(size=(n, 6))
    new, rev = rng.normal(size=(n, 6)), rng.normal(size=(n, 5))
    order, queries = rng.permutation(n), np.array([3, 17, 18, 39])
    verdict = rank_guard(
        old, base, new, rev, order=order, queries=queries, k=k, fractions=fractions, metric=metric
    )
    for i, t in enumerate(fractions):
        m = migrated_at(order, t)
        for q_new, q_old, g_new, got in ((base, old, base, verdict.naive), (new, rev, new, verdict.fitted)):
            scores = []
            for q in queries:
                d = np.empty(n)
                d[m] = distance_matrix(q_new[q : q + 1], g_new[m], metric)[0]
                d[~m] = distance_matrix(q_old[q : q + 1], old[~m], metric)[0]
                d[q] = np.inf
                own = distance_matrix(base[q : q + 1], base, metric)[0]
                own[q] = np.inf
                rank = {j: r for r, j in enumerate(np.argsort(own, kind="stable"))}
                scores.append(
                    np.mean([1 - np.log1p(rank[j]) / np.log(n) for j in np.argsort(d, kind="stable")[:k]])
                )
            assert got[i] == pytest.approx(np.mean(scores), abs=1e-6)
    assert verdict.queries == len(queries) and verdict.measure == "rank"


def test_the_rank_guard_passes_the_naive_merge_and_refuses_a_random_psi() -> None:
    from rm_qdrant.core.guard import rank_guard

    old, base, _ = _open_class_pair()
    order, queries = np.random.default_rng(1).permutation(N), np.arange(0, N, 5)
    same = rank_guard(old, base, base, old, order=order, queries=queries, k=K)
    assert same.passed and same.margins == pytest.approx([0.0] * len(same.margins))
    noise = np.random.default_rng(2).normal(size=old.shape)
    refused = rank_guard(old, base, base, noise, order=order, queries=queries, k=K)
    assert not refused.passed and refused.fractions[refused.worst] == 0.0
    assert "by the new model's ranks" in refused.reason()
