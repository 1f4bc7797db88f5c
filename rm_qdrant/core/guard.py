"""The label-free guard on a fitted graph: never below the naive merge on what both models agree on.

Without labels, the only reference for "similar" is the models themselves. The new
model's own neighbours are blind where the two models disagree (an open-class
gallery): a ψ can match more of them than the old model does while losing the
neighbours the old model served correctly, and so start below the old model. The
guard scores against the neighbours *both* models agree on: for each query, the
items in the old model's top-K and in the new model's top-K (K =
:data:`CONSENSUS_FACTOR` × k) over the same gallery. Neither model's quirks are
rewarded, and a ψ that scatters the old side loses them.

At each backfill fraction t, the merged top-k of the naive merge (calibrated where the
pair is) and of the fitted graph are scored by the share of those agreed neighbours
they find (recall@k, out of at most k). The fitted graph passes when at every t it is
not below the naive merge by more than :data:`GUARD_TOLERANCE`. At t = 0 the naive
merge is exactly the old model (a calibration maps old distances monotonically, so the
old side's order is unchanged), so that check is also "not below the old model".

Pure numpy; no label is read, and no setting was chosen by looking at labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.forecast import OldDistance, merged_distances, top_k
from rm_qdrant.core.metrics import FRACTIONS, migrated_at
from rm_qdrant.core.spaces import distance_matrix

#: Recall@k the fitted graph may lose against the naive merge at any t: the issue's goal
#: is t = 0 no worse than Old by 0.5 mAP points, and rmq probe's dip tolerance is the same
#: 0.005; a wider one would let through the 4.5-point loss the guard is for.
GUARD_TOLERANCE = 0.005
#: K = this × k: the depth in each model's ranking an agreed neighbour may sit at. At k it
#: would mostly keep what the models already rank alike; a few times k reaches the items
#: one model ranks high and the other merely near.
CONSENSUS_FACTOR = 3


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's evidence on one holdout: agreed-neighbour recall@k per t, and the decision."""

    fractions: tuple[float, ...]
    naive: tuple[float, ...]  # the naive merge's share of the agreed neighbours found, per t
    fitted: tuple[float, ...]  # the fitted graph's
    queries: int  # queries with one or more agreed neighbours (the others are not scored)
    tolerance: float = GUARD_TOLERANCE

    @property
    def margins(self) -> tuple[float, ...]:
        """fitted − naive at each t."""
        return tuple(f - n for f, n in zip(self.fitted, self.naive, strict=True))

    @property
    def worst(self) -> int:
        """Index of the t where fitted − naive is lowest (the first such)."""
        return int(np.argmin(self.margins)) if self.margins else 0

    @property
    def passed(self) -> bool:
        return self.queries > 0 and min(self.margins) >= -self.tolerance

    def reason(self) -> str:
        """One clause naming the deciding t and the two numbers."""
        if self.queries == 0:
            return "the two models share no neighbours on the holdout, so there is no label-free evidence"
        i = self.worst
        below = "below" if not self.passed else "within tolerance of" if self.margins[i] < 0 else "not below"
        start = f"; at t = 0 {self.fitted[0]:.3f} against the old model's {self.naive[0]:.3f}" if i else ""
        return (
            f"at t = {self.fractions[i]:g} the fitted graph finds {self.fitted[i]:.3f} of the neighbours "
            f"both models agree on, {below} the naive merge's {self.naive[i]:.3f} "
            f"(tolerance {self.tolerance:g}{start})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "fractions": list(self.fractions),
            "naive": list(self.naive),
            "fitted": list(self.fitted),
            "queries": self.queries,
            "tolerance": self.tolerance,
            "min_margin": min(self.margins) if self.margins else None,
            "worst_t": self.fractions[self.worst] if self.fractions else None,
            "passed": self.passed,
        }


def agreed_neighbours(
    old: np.ndarray, base: np.ndarray, k: int, *, factor: int = CONSENSUS_FACTOR, metric: str = "cosine"
) -> np.ndarray:
    """(n, n) booleans: j is among query i's top-(factor·k) under the old model *and* under the new."""
    depth = factor * k
    mask = np.zeros((len(old), len(old)), dtype=bool)
    rows = np.arange(len(old))[:, None]
    both = np.zeros_like(mask)
    mask[rows, top_k(distance_matrix(old, old, metric), depth)] = True
    both[rows, top_k(distance_matrix(base, base, metric), depth)] = True
    return mask & both


def agreed_recall(distances: np.ndarray, agreed: np.ndarray, k: int) -> tuple[float, int]:
    """Mean share of each query's agreed neighbours in its top-k (out of at most k), over the
    queries that have any; and how many those are."""
    counts = agreed.sum(axis=1)
    scored = counts > 0
    if not scored.any():
        return 0.0, 0
    found = top_k(distances, k)
    hits = np.take_along_axis(agreed, found, axis=1).sum(axis=1)
    share = hits[scored] / np.minimum(found.shape[1], counts[scored])
    return float(share.mean()), int(scored.sum())


def guard(
    old: np.ndarray,
    base: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray,
    *,
    order: np.ndarray,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "cosine",
    naive_distance: OldDistance | None = None,
    tolerance: float = GUARD_TOLERANCE,
) -> GuardVerdict:
    """The naive merge of the plain new model (``base``) against a fitted encoder (``new``, ``rev``)
    on the neighbours both models agree on, backfilled in ``order``.

    Args:
        old: the holdout's stored old vectors (n, d_old).
        base: the plain new model's embeddings of the same images (n, d_new).
        new, rev: the fitted graph's outputs for them, as served.
        order: the holdout indices in migration order.
        k: the neighbours served; the agreed ones are looked for down to CONSENSUS_FACTOR × k.
        naive_distance: a calibrated pair's map of old distances (the naive merge only).

    Raises:
        ValueError: fewer than two items, or arrays of different lengths.
    """
    n = len(old)
    if n < 2 or any(len(a) != n for a in (base, new, rev, order)):
        raise ValueError(f"the guard needs two or more items and one row each; got {n} old")
    agreed = agreed_neighbours(old, base, k, metric=metric)
    naive, fitted, queries = [], [], 0
    for t in fractions:
        migrated = migrated_at(order, t)
        for curve, (q_new, q_old, gallery, mapped) in (
            (naive, (base, old, base, naive_distance)),
            (fitted, (new, rev, new, None)),
        ):
            d = merged_distances(q_new, q_old, gallery, old, migrated, mapped, metric)
            score, queries = agreed_recall(d, agreed, k)
            curve.append(score)
    return GuardVerdict(tuple(fractions), tuple(naive), tuple(fitted), queries, tolerance)
