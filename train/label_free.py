"""Label-free ψ for ``rmq fit``: MCL on consensus pseudo-labels, the cluster counts picked on a holdout.

No label is read anywhere, not even to choose a setting:

1. Spherical k-means of the new model's embeddings at each count of a ladder (e.g. 8, 16,
   32, 64). Two points are a positive pair when they share a cluster in at least half the
   clusterings, a negative pair when they share none, and ignored otherwise: the ladder
   brackets the unknown number of classes instead of guessing it.
2. ψ is trained with the paper's MCL (hard mining, τ = 0.1) on those pairs; ρ stays the
   identity, so the finished backfill serves exactly the team's new model and a running
   pair can switch to the fitted graph (``rmq switch-encoder``).
3. One ψ per ladder in :data:`LADDERS`, and Procrustes; each is judged on a held-out tenth
   of the training pairs: by the label-free forecast of ``rmq probe`` among those held-out pairs
   (recall@10 of the merged ranking against the new model's own top-10, area over t), and by the
   guard (:func:`rm_qdrant.core.guard.rank_guard`: each held-out pair queries all the pairs, as
   the graph will query the whole gallery, and its hits score by the new model's log rank; not
   below the naive merge at any t). A curve that dips below its start, or that the guard
   refuses, is dropped; the best area wins. When every candidate is dropped, the best area that
   does not dip wins (else Procrustes), and ``rmq fit``'s own guard on its holdout will say no.
   Until issue 39 the guard judged the holdout among itself: a gallery of hundreds of classes
   with a handful of images each left a query almost none of its class there, and Procrustes was
   kept 8.5 mAP points below the old model (``benchmarks/label_free_rules.py``).
4. Labels, where the payload has them, never train here but judge: a candidate whose held-out
   mAP falls below the naive merge's at any t is dropped, and the best mAP area wins.

Measured (CIFAR-10 and digits; ``benchmarks/fit_table.py``): see docs/guides/fit-calibrate.md
and docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rm_qdrant.core.forecast import holdout_split
from rm_qdrant.core.guard import GuardVerdict
from rm_qdrant.core.metrics import area
from rm_qdrant_train.heads import Heads, procrustes_heads, run_steps
from rm_qdrant_train.holdout import holdout_forecast, holdout_guard, holdout_labelled
from rm_qdrant_train.losses import masked_contrastive_loss

log = logging.getLogger(__name__)

#: Cluster-count ladders tried; the holdout forecast picks one.
LADDERS: tuple[tuple[int, ...], ...] = (
    (4, 8, 16, 32),
    (8, 16, 32, 64),
    (16, 32, 64, 128),
    (32, 64, 128, 256),
)
AGREE = 0.5  # share of the clusterings a positive pair must share a cluster in
STEPS = 1000  # Adam steps per ladder
BATCH = 256  # hard mining sorts B × B matrices: 256 keeps a step near 25 ms on two CPU cores
LR = 1e-3
HOLDOUT = 0.1
K = 10


def spherical_kmeans(x: Tensor, k: int, *, iterations: int = 30, seed: int = 0) -> Tensor:
    """Cluster ids of the rows of ``x`` by cosine k-means, seeded k-means++ style."""
    generator = torch.Generator().manual_seed(seed)
    x = F.normalize(x.float(), dim=1)
    k = max(1, min(k, len(x) // 2))
    first = int(torch.randint(len(x), (1,), generator=generator))
    chosen = [first]
    nearest = (1 - x @ x[first]).clamp_min(0)
    for _ in range(1, k):
        weights = nearest**2
        if not float(weights.sum()) > 0:  # every point on a chosen centre (identical images): any will do
            weights = torch.ones_like(weights)
        pick = int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
        chosen.append(pick)
        nearest = torch.minimum(nearest, (1 - x @ x[pick]).clamp_min(0))
    centres = x[chosen].clone()
    for _ in range(iterations):
        sums = torch.zeros_like(centres).index_add_(0, (x @ centres.T).argmax(1), x)
        empty = sums.norm(dim=1) == 0
        sums[empty] = centres[empty]
        centres = F.normalize(sums, dim=1)
    return (x @ centres.T).argmax(1)


def consensus_masks(codes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cluster ids (B, R) under R clusterings → MCL's masks: cross positives, within positives, negatives."""
    share = (codes[:, None, :] == codes[None, :, :]).float().mean(2)
    eye = torch.eye(len(codes), dtype=torch.bool)
    positive = share >= AGREE
    return positive | eye, positive & ~eye, (share == 0) & ~eye


def train_consensus(phi: Tensor, old: Tensor, ladder: tuple[int, ...], *, seed: int) -> Heads:
    """ψ trained with MCL on the consensus pairs of ``ladder``'s clusterings (ρ the identity)."""
    torch.manual_seed(seed)
    codes = torch.stack([spherical_kmeans(phi, k, seed=seed + r) for r, k in enumerate(ladder)], 1)
    heads = Heads(phi.shape[1], old.shape[1], learn_rho=False)

    def step_loss(idx: Tensor) -> Tensor:
        new, rev = heads(phi[idx])
        return masked_contrastive_loss("mcl", rev, old[idx], new, consensus_masks(codes[idx]))

    run_steps(
        heads,
        step_loss,
        len(phi),
        steps=STEPS,
        batch=min(BATCH, len(phi)),
        lr=LR,
        seed=seed,
        what=f"label-free ψ, clusters {ladder}",
    )
    return heads.eval()


@dataclass(frozen=True)
class Candidate:
    """One label-free candidate's evidence on the recipe's own holdout."""

    recipe: str  # procrustes | clusters 8-16-32-64 ...
    area: float  # area under recall@K against the new model's own neighbours (-inf: diverged)
    naive_area: float
    dips: bool
    verdict: GuardVerdict | None  # None: diverged
    labelled: GuardVerdict | None = None  # by payload labels, where the sample has them

    @property
    def eligible(self) -> bool:
        """Neither dips nor diverged, and passes the labels where there are any (they win), else the guard."""
        judge = self.labelled if self.labelled is not None else self.verdict
        return not self.dips and self.verdict is not None and judge is not None and judge.passed

    @property
    def labelled_area(self) -> float:
        """Area under the held-out mAP (-inf without labels)."""
        return -math.inf if self.labelled is None else area(self.labelled.fitted, self.labelled.fractions)

    def line(self) -> str:
        """One line: the guard at t = 0, its lowest fitted − naive over t, and the area."""
        if self.verdict is None:
            return f"{self.recipe}: training diverged"
        v, low = self.verdict, int(np.argmin(self.verdict.margins))
        return (
            f"{self.recipe}: t=0 rank score {v.fitted[0]:.3f} (old model {v.naive[0]:.3f}), "
            f"min fitted-naive {v.margins[low]:+.3f} at t={v.fractions[low]:g}, "
            f"area {self.area:.3f} (naive {self.naive_area:.3f})"
            + ("; dips below its start" if self.dips else "")
            + ("; guard: no" if not v.passed else "")
            + (f"; labels: {self._labelled_clause()}" if self.labelled is not None else "")
        )

    def _labelled_clause(self) -> str:
        v = self.labelled
        assert v is not None
        low = int(np.argmin(v.margins))
        return (
            f"mAP area {self.labelled_area:.3f}, "
            f"min fitted-naive {v.margins[low]:+.3f} at t={v.fractions[low]:g}"
            + ("" if v.passed else " (below the naive merge: refused)")
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "area": None if math.isinf(self.area) else self.area,
            "naive_area": self.naive_area,
            "dips": self.dips,
            "guard": None if self.verdict is None else self.verdict.as_dict(),
            "labelled": None if self.labelled is None else self.labelled.as_dict(),
            "eligible": self.eligible,
        }


@dataclass(frozen=True)
class Selection:
    """Which label-free candidate won, and why, with every candidate's evidence."""

    winner: str
    why: str
    candidates: tuple[Candidate, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"winner": self.winner, "why": self.why, "candidates": [c.as_dict() for c in self.candidates]}


def ladder_name(ladder: tuple[int, ...]) -> str:
    return "clusters " + "-".join(map(str, ladder))


def evaluate(
    recipe: str,
    heads: Heads,
    phi: np.ndarray,
    old: np.ndarray,
    *,
    held: np.ndarray,
    seed: int,
    labels: Sequence[object] | None = None,
) -> Candidate:
    """A candidate's evidence, the ``held`` rows querying every row (a candidate whose training
    diverged counts as dipping); with ``labels`` (one per row), also its mAP against the naive
    merge's at every t."""
    try:
        naive, fitted = holdout_forecast(heads, phi[held], old[held], None, k=K, seed=seed)
        verdict = holdout_guard(heads, phi, old, held=held, k=K, seed=seed)
        labelled = None if labels is None else holdout_labelled(heads, phi, old, labels, held=held, seed=seed)
    except ValueError:
        return Candidate(recipe, -math.inf, math.nan, True, None)
    return Candidate(recipe, fitted.area, naive.area, bool(fitted.dips()), verdict, labelled)


def choose(candidates: list[Candidate]) -> tuple[int, str]:
    """The winning candidate's index and why: the best area among those that neither dip nor
    fail the guard; else the best that does not dip; else the first (Procrustes). Where the
    holdout has labels, the best area under its mAP among those the labels do not refuse."""
    if any(c.labelled is not None for c in candidates):
        for pool, why in (
            ([c for c in candidates if c.eligible], "that the labels pass"),
            (
                [c for c in candidates if c.labelled is not None and not c.dips],
                "that do not dip (the labels refuse every candidate)",
            ),
        ):
            if pool:
                best = max(pool, key=lambda c: c.labelled_area)
                return candidates.index(best), (
                    f"highest area under the held-out mAP ({best.labelled_area:.3f}, payload labels) of the "
                    f"{len(pool)} of {len(candidates)} {why}"
                )
    for pool, why in (
        ([c for c in candidates if c.eligible], "the guard passed"),
        ([c for c in candidates if not c.dips], "do not dip (none passed the guard)"),
    ):
        if pool:
            best = max(pool, key=lambda c: c.area)  # the first of equals: the order tried
            why = f"highest area ({best.area:.3f}) of the {len(pool)} of {len(candidates)} that {why}"
            return candidates.index(best), why
    return 0, f"every candidate dips or diverged: {candidates[0].recipe}, the closed form"


def train_candidates(phi: Tensor, target: Tensor, *, seed: int) -> list[tuple[str, Heads]]:
    """Every label-free candidate trained on the pairs (φ_new, stored old vector): Procrustes,
    then one ψ per ladder of :data:`LADDERS`, each named as :class:`Candidate` names it."""
    fitted = [("procrustes", procrustes_heads(phi, target))]
    return fitted + [
        (ladder_name(ladder), train_consensus(phi, target, ladder, seed=seed + i))
        for i, ladder in enumerate(LADDERS)
    ]


def fit_label_free(phi_new: Tensor, old: Tensor, *, seed: int = 0) -> Heads:
    """The best label-free heads for paired rows (φ_new, stored old vector): :func:`select_label_free`."""
    return select_label_free(phi_new, old, seed=seed)[0]


def select_label_free(
    phi_new: Tensor, old: Tensor, *, seed: int = 0, labels: Sequence[object] | None = None
) -> tuple[Heads, Selection]:
    """The best label-free heads for paired rows (φ_new, stored old vector), chosen as the module
    says, and the evidence they were chosen on. ``labels`` (one per row, from the payload) never
    train: they judge each candidate on the holdout, and refuse one whose mAP falls below the
    naive merge's at any t (issue 39)."""
    phi, target = phi_new.detach().float().contiguous(), old.detach().float().contiguous()
    if len(phi) * HOLDOUT < 3 * K:  # too few pairs to choose on: the middle ladder, on all of them
        log.info("label-free: %d pairs, too few to choose a ladder on; clusters %s", len(phi), LADDERS[1])
        why = f"{len(phi)} pairs are too few to hold some out and choose on (the middle ladder)"
        return train_consensus(phi, target, LADDERS[1], seed=seed), Selection(ladder_name(LADDERS[1]), why)
    train_idx, held_idx = holdout_split(len(phi), HOLDOUT, seed)
    tr = torch.from_numpy(train_idx)
    fitted = train_candidates(phi[tr], target[tr], seed=seed)
    # The held-out rows query all the rows: each its own class's members, as served (issue 39).
    every = (phi.numpy(), target.numpy())
    candidates = [
        evaluate(name, heads, *every, held=held_idx, seed=seed, labels=labels) for name, heads in fitted
    ]
    for candidate in candidates:
        log.info("label-free: %s", candidate.line())
    best, why = choose(candidates)
    return fitted[best][1], Selection(candidates[best].recipe, why, tuple(candidates))
