"""``rmq fit``'s training side: which loss runs, the split, Procrustes heads, and the holdout check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rm_qdrant.core.forecast import compare_fitted, holdout_split
from rm_qdrant_train.fit import FitSettings, fit_heads, resolve_loss
from rm_qdrant_train.heads import Heads, procrustes_heads
from rm_qdrant_train.holdout import better, holdout_forecast


def clusters(n=240, d_new=12, d_old=8, classes=6, seed=0):
    """Paired embeddings of the same items: class centres plus noise, each model its own space."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centres_new, centres_old = rng.normal(size=(classes, d_new)), rng.normal(size=(classes, d_old))
    new = centres_new[y] + 0.3 * rng.normal(size=(n, d_new))
    old = centres_old[y] + 0.6 * rng.normal(size=(n, d_old))  # the old model separates classes worse
    return new.astype(np.float32), old.astype(np.float32), y


def test_auto_is_mcl_with_labels_and_label_free_without():
    assert resolve_loss("auto", True) == "mcl" and resolve_loss("auto", False) == "label-free"
    with pytest.raises(ValueError, match="needs labels"):
        resolve_loss("mcl", False)
    with pytest.raises(ValueError, match="unknown loss"):
        resolve_loss("mse", False)


def test_split_holds_out_a_seeded_share_and_never_overlaps():
    train, held = holdout_split(100, 0.1, seed=3)
    assert len(held) == 10 and len(train) == 90 and not set(train) & set(held)
    assert np.array_equal(held, holdout_split(100, 0.1, seed=3)[1]) and not np.array_equal(
        held, holdout_split(100, 0.1, 4)[1]
    )
    with pytest.raises(ValueError, match="too few"):
        holdout_split(3, 0.5, seed=0)


def test_procrustes_heads_recover_a_rotation_of_the_new_space():
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(200, 8)).astype(np.float32)
    rotation, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    old = (phi @ rotation).astype(np.float32)
    heads = procrustes_heads(torch.from_numpy(phi), torch.from_numpy(old))
    with torch.no_grad():
        new, rev = heads(torch.from_numpy(phi))
    cos = torch.nn.functional.cosine_similarity(rev, torch.from_numpy(old), dim=1)
    assert torch.equal(new, torch.from_numpy(phi)) and float(cos.min()) > 0.999


def test_the_holdout_scores_both_curves_against_the_plain_new_models_neighbours():
    new, old, _ = clusters()
    order = np.random.default_rng(0).permutation(len(old))
    naive, same = compare_fitted(old, new, new, old, order=order, k=5)
    assert same.recall == naive.recall  # the fitted graph with ρ = identity and ψ(x) = old(x) is naive
    scrambled = np.random.default_rng(1).normal(size=new.shape).astype(np.float32)
    _, drifted = compare_fitted(old, new, scrambled, old, order=order, k=5)
    assert drifted.recall[-1] < 0.3 < naive.recall[-1] == 1.0  # a ρ that drifts is not rewarded


@pytest.mark.parametrize("loss", ["mcl"])
def test_trained_heads_beat_the_naive_merge_on_held_out_pairs(loss):
    new, old, y = clusters()
    train, held = holdout_split(len(new), 0.25, seed=0)
    labels = [str(v) for v in y]
    settings = FitSettings(loss=loss, steps=150, batch=64, lr=3e-3)
    heads = fit_heads(new[train], old[train], [labels[i] for i in train] if loss == "mcl" else None, settings)
    assert isinstance(heads, Heads) and heads.learn_rho == (loss == "mcl")
    forecasts = holdout_forecast(
        heads, new[held], old[held], [labels[i] for i in held] if loss == "mcl" else None, k=5
    )
    ok, measure = better(forecasts)
    assert ok, measure
    assert ("mAP" in measure) == (loss == "mcl")


def test_an_untrained_psi_is_found_worse_than_naive():
    new, old, _ = clusters()
    train, held = holdout_split(len(new), 0.25, seed=0)
    heads = fit_heads(new[train], old[train], None, FitSettings(loss="rqt", steps=1, lr=1e-9))
    ok, measure = better(holdout_forecast(heads, new[held], old[held], None, k=5))
    assert not ok and "recall" in measure


def test_label_free_pseudo_pairs_follow_the_clusterings_and_read_no_label(monkeypatch):
    from rm_qdrant_train import label_free

    codes = torch.tensor([[0, 0], [0, 0], [0, 1], [1, 2]])  # rows 0-1 always together, 0-2 half the time
    cross, within, negative = label_free.consensus_masks(codes)
    assert within[0, 1] and within[0, 2] and not within[0, 0] and cross[0, 0]
    assert negative[0, 3] and negative[2, 3] and not negative[0, 2]
    monkeypatch.setattr(label_free, "STEPS", 20)
    new, old, _ = clusters(n=120)
    heads = fit_heads(new, old, None, FitSettings(loss="label-free"))
    assert not heads.learn_rho  # ρ the identity: the finished backfill serves the team's own new model


def test_labels_choose_among_label_free_candidates_and_refuse_one_below_naive():
    """Where the holdout has labels, a candidate they refuse is never chosen, however good its
    label-free evidence, and the best area under the held-out mAP wins among the rest."""
    from rm_qdrant.core.guard import judged
    from rm_qdrant_train.label_free import Candidate, choose

    fractions = (0.0, 0.5, 1.0)

    def verdict(naive, fitted, measure="support"):
        a, b = np.array(naive, float)[:, None], np.array(fitted, float)[:, None]
        noise = np.array([[0.0, 0.001, -0.001]])  # three queries: a tiny spread, so a tiny tolerance
        return judged(fractions, a + noise, b + noise, measure=measure)

    passing = verdict([0.5, 0.6, 0.7], [0.6, 0.65, 0.7])
    imitates = Candidate(
        "procrustes", 0.9, 0.6, False, passing, verdict([0.5, 0.6, 0.7], [0.4, 0.6, 0.7], "mAP")
    )
    modest = Candidate(
        "clusters 4-8", 0.7, 0.6, False, passing, verdict([0.5, 0.6, 0.7], [0.55, 0.62, 0.7], "mAP")
    )
    better = Candidate(
        "clusters 8-16", 0.65, 0.6, False, passing, verdict([0.5, 0.6, 0.7], [0.6, 0.66, 0.7], "mAP")
    )
    assert not imitates.eligible and modest.eligible and better.eligible
    index, why = choose([imitates, modest, better])
    assert index == 2 and "held-out mAP" in why
    without_labels = [
        Candidate(c.recipe, c.area, c.naive_area, c.dips, c.verdict) for c in (imitates, modest, better)
    ]
    assert choose(without_labels)[0] == 0  # the label-free evidence alone picks the imitator


def test_when_the_labels_refuse_every_candidate_the_best_by_the_labels_is_named_and_why():
    from rm_qdrant.core.guard import judged
    from rm_qdrant_train.label_free import Candidate, choose

    fractions = (0.0, 1.0)
    spread = np.array([[0.0, 0.001, -0.001]])

    def verdict(naive, fitted, measure="support"):
        return judged(
            fractions, np.array(naive)[:, None] + spread, np.array(fitted)[:, None] + spread, measure=measure
        )

    passing = verdict([0.5, 0.7], [0.6, 0.7])
    worse = Candidate("procrustes", 0.9, 0.6, False, passing, verdict([0.5, 0.7], [0.1, 0.7], "mAP"))
    less_worse = Candidate("clusters 4-8", 0.7, 0.6, False, passing, verdict([0.5, 0.7], [0.3, 0.7], "mAP"))
    index, why = choose([worse, less_worse])
    assert index == 1 and "the labels refuse every candidate" in why


def test_the_labelled_forecast_of_a_calibrated_pair_is_against_the_calibrated_merge():
    """compare_fitted's naive curve as a calibrated pair serves it: the labelled area that decides
    is the calibrated merge's, like the labelled guard's."""
    new, old, y = clusters()
    order = np.random.default_rng(0).permutation(len(old))
    squash = lambda d: np.sqrt(np.clip(d, 0, None)) * 3.0  # noqa: E731 — a monotone map that moves old hits
    plain, _ = compare_fitted(old, new, new, old, order=order, labels=list(y), k=5)
    mapped, _ = compare_fitted(old, new, new, old, order=order, labels=list(y), k=5, naive_distance=squash)
    assert plain.maps != mapped.maps and plain.maps[0] == pytest.approx(mapped.maps[0])  # t = 0: all old
