"""The paper's losses for the reverse transform ψ and the new head ρ.

Notation, for a batch of images x_1..x_B with labels y:
``rev_i = ψ(ρ(φ_new(x_i)))`` (queries the old gallery), ``old_j = φ_old(x_j)`` (the
old gallery), ``new_i = ρ(φ_new(x_i))`` (queries and fills the new gallery).
Distances are cosine distances, ``d(a, b) = 1 − cos(a, b)``, and similarities
``s(a, b) = exp(−d(a, b) / τ)``. The paper writes s = exp(−d), that is τ = 1; τ is
exposed because a smaller one trains much better (see the training notes).

Positives of anchor i: same label. Across systems (rev_i against old_j) the
anchor's own old embedding is a positive; within one system (new_i against
new_j) the anchor itself is not. Negatives: other labels.

- ``rqt``: mean d(rev_i, old_i) (or the ℓ2 distance).
- ``cl-s``: supervised contrastive loss of the backward system {rev, old}:
  −log Σ_p s(rev_i, old_p) / (Σ_p s(rev_i, old_p) + Σ_n s(rev_i, old_n)).
- ``cl-m``: the same in each system separately: cl-s plus
  −log Σ_p s(new_i, new_p) / (Σ_p s(new_i, new_p) + Σ_n s(new_i, new_n)).
- ``mcl``: both systems jointly. Each system's positives compete with the
  negatives of *both* systems, because after a distance rank merge a new-gallery
  negative can outrank an old-gallery positive and the other way round:
  −log Σ_p s(rev_i, old_p) / (Σ_p s(rev_i, old_p) + Σ_n s(rev_i, old_n) + Σ_n s(new_i, new_n))
  −log Σ_p s(new_i, new_p) / (Σ_p s(new_i, new_p) + Σ_n s(new_i, new_n) + Σ_n s(rev_i, old_n)).

Hard mining (the paper's): per anchor and per system pair, only the harder half
of the positives (the farthest, rounded up) and of the negatives (the nearest,
rounded up) enter the sums. Anchors without a positive in a term are skipped;
each term is the mean over its anchors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LOSSES = ("rqt", "cl-s", "cl-m", "mcl")


def cosine_distances(a: Tensor, b: Tensor) -> Tensor:
    """(B, B) matrix of 1 − cos(a_i, b_j)."""
    return 1.0 - F.normalize(a, dim=1) @ F.normalize(b, dim=1).T


def harder_half(dist: Tensor, mask: Tensor, *, largest: bool) -> Tensor:
    """Per row, keep the ceil(k/2) entries of ``mask`` with the largest (or smallest) distance."""
    fill = float("-inf") if largest else float("inf")
    keyed = dist.masked_fill(~mask, fill)
    order = keyed.argsort(dim=1, descending=largest, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(dist.shape[1], device=dist.device).expand_as(order))
    keep = (mask.sum(dim=1, keepdim=True) + 1) // 2
    return mask & (rank < keep)


def _masks(labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    same = labels[:, None] == labels[None, :]
    eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
    return same, same & ~eye, ~same  # cross-system positives, within-system positives, negatives


def _term(pos_sim: Tensor, pos: Tensor, neg_parts: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Mean over anchors with a positive of −log(Σ_pos / (Σ_pos + Σ of every negative part))."""
    positive = (pos_sim * pos).sum(dim=1)
    negative = torch.stack([(sim * mask).sum(dim=1) for sim, mask in neg_parts]).sum(dim=0)
    valid = pos.any(dim=1)
    if not valid.any():
        return pos_sim.sum() * 0.0
    return -(torch.log(positive[valid]) - torch.log(positive[valid] + negative[valid])).mean()


def contrastive_loss(
    name: str,
    rev: Tensor,
    old: Tensor,
    new: Tensor,
    labels: Tensor,
    *,
    temperature: float = 0.1,
    hard_mining: bool = True,
) -> Tensor:
    """``cl-s``, ``cl-m`` or ``mcl`` for one batch (see the module docstring)."""
    cross_pos, within_pos, neg = _masks(labels)
    return masked_contrastive_loss(
        name, rev, old, new, (cross_pos, within_pos, neg), temperature=temperature, hard_mining=hard_mining
    )


def masked_contrastive_loss(
    name: str,
    rev: Tensor,
    old: Tensor,
    new: Tensor,
    masks: tuple[Tensor, Tensor, Tensor],
    *,
    temperature: float = 0.1,
    hard_mining: bool = True,
) -> Tensor:
    """:func:`contrastive_loss` with the pairs given as (B, B) masks instead of labels.

    ``masks`` is (cross-system positives, within-system positives, negatives); a pair in
    none of them is ignored (label-free training leaves uncertain pairs out this way).
    """
    if name not in ("cl-s", "cl-m", "mcl"):
        raise ValueError(f"unknown contrastive loss {name!r}; expected cl-s, cl-m or mcl")
    cross_pos, within_pos, neg = masks
    d_back, d_new = cosine_distances(rev, old), cosine_distances(new, new)
    back_pos, back_neg, new_pos, new_neg = cross_pos, neg, within_pos, neg
    if hard_mining:
        back_pos, back_neg = (
            harder_half(d_back, cross_pos, largest=True),
            harder_half(d_back, neg, largest=False),
        )
        new_pos, new_neg = (
            harder_half(d_new, within_pos, largest=True),
            harder_half(d_new, neg, largest=False),
        )
    s_back, s_new = torch.exp(-d_back / temperature), torch.exp(-d_new / temperature)
    if name == "cl-s":
        return _term(s_back, back_pos, [(s_back, back_neg)])
    if name == "cl-m":
        return _term(s_back, back_pos, [(s_back, back_neg)]) + _term(s_new, new_pos, [(s_new, new_neg)])
    return _term(s_back, back_pos, [(s_back, back_neg), (s_new, new_neg)]) + _term(
        s_new, new_pos, [(s_new, new_neg), (s_back, back_neg)]
    )


def rqt_loss(rev: Tensor, old: Tensor, *, metric: str = "cosine") -> Tensor:
    """Mean distance between each image's reverse-transformed and old embedding."""
    if metric == "cosine":
        return (1.0 - F.cosine_similarity(rev, old, dim=1)).mean()
    if metric == "l2":
        return (rev - old).norm(dim=1).mean()
    raise ValueError(f"unknown RQT metric {metric!r}; expected cosine or l2")
