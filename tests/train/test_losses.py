"""The contrastive losses against a slow, loop-based reading of the formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rm_qdrant_train.losses import contrastive_loss, cosine_distances, harder_half, rqt_loss


def dist(a, b):
    return 1.0 - float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def pick(candidates, hard, farthest):
    """candidates: list of (distance, j). The harder half (rounded up) when mining."""
    if not hard:
        return candidates
    ordered = sorted(candidates, key=lambda c: -c[0] if farthest else c[0])
    return ordered[: math.ceil(len(candidates) / 2)]


def reference(name, rev, old, new, labels, tau, hard):
    n = len(labels)
    back_terms, new_terms = [], []
    for i in range(n):
        back_p = pick([(dist(rev[i], old[j]), j) for j in range(n) if labels[j] == labels[i]], hard, True)
        back_n = pick([(dist(rev[i], old[j]), j) for j in range(n) if labels[j] != labels[i]], hard, False)
        new_p = pick(
            [(dist(new[i], new[j]), j) for j in range(n) if labels[j] == labels[i] and j != i], hard, True
        )
        new_n = pick([(dist(new[i], new[j]), j) for j in range(n) if labels[j] != labels[i]], hard, False)
        s = lambda pairs: sum(math.exp(-d / tau) for d, _ in pairs)  # noqa: E731
        cross_negs = s(new_n) if name == "mcl" else 0.0
        if back_p:
            back_terms.append(-math.log(s(back_p) / (s(back_p) + s(back_n) + cross_negs)))
        if new_p and name in ("cl-m", "mcl"):
            extra = s(back_n) if name == "mcl" else 0.0
            new_terms.append(-math.log(s(new_p) / (s(new_p) + s(new_n) + extra)))
    total = sum(back_terms) / len(back_terms)
    if new_terms:
        total += sum(new_terms) / len(new_terms)
    return total


@pytest.mark.parametrize("name", ["cl-s", "cl-m", "mcl"])
@pytest.mark.parametrize("hard", [False, True])
def test_losses_match_the_formulas(name, hard):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=14)
    labels[0] = 9  # a class with a single member: no within-system positive for anchor 0
    rev, old = rng.normal(size=(14, 5)), rng.normal(size=(14, 5))
    new = rng.normal(size=(14, 7))
    got = contrastive_loss(
        name,
        *(torch.tensor(a, dtype=torch.float64) for a in (rev, old, new)),
        torch.tensor(labels),
        temperature=0.3,
        hard_mining=hard,
    )
    assert got.item() == pytest.approx(reference(name, rev, old, new, labels, 0.3, hard), abs=1e-5)


def test_hard_mining_keeps_exactly_the_harder_halves():
    dist_matrix = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.3], [0.2, 0.8, 0.4, 0.6, 0.0]])
    mask = torch.tensor([[True, True, True, False, True], [False, True, True, True, False]])
    far = harder_half(dist_matrix, mask, largest=True)
    near = harder_half(dist_matrix, mask, largest=False)
    assert far.tolist() == [[False, True, True, False, False], [False, True, False, True, False]]
    assert near.tolist() == [[True, False, False, False, True], [False, False, True, True, False]]


def test_rqt_and_distances():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    assert rqt_loss(a, a).item() == pytest.approx(0.0, abs=1e-6)
    assert rqt_loss(a, -a).item() == pytest.approx(2.0)
    assert rqt_loss(a, torch.zeros(2, 2), metric="l2").item() == pytest.approx(1.5)
    assert cosine_distances(a, a).diag().abs().max().item() < 1e-6
    with pytest.raises(ValueError):
        contrastive_loss("triplet", a, a, a, torch.tensor([0, 1]))
