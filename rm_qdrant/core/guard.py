"""The label-free guard on a fitted graph: its hits must be as near as the naive merge's in both models' eyes.

Without labels, the only judges of "similar" are the two models. The new model's own
top k is blind where they disagree (an open-class gallery): a ψ can match more of it than
the old model does while scattering what the old model found, and start below the old
model. Overlaps of top-K lists (the neighbours both models agree on) fail the other way:
they only reward items both models rank in their top K, so a ψ that finds other members
of a large class (outside both top K, and right) scores below the old model however good
it is. Measured on the digits pairs (``benchmarks/guard_check.py``), a top-3k overlap
refused the graphs that start 18 and 27 mAP points above Old.

So each hit is judged by where *both* models rank it: for query i and hit j, the share
of the gallery that each model ranks behind j, the smaller of the two (its *support*: a
hit one model places far away has little; one in a model's top 3k counts as fully
supported by it). A ranking's score is its top k's mean support, averaged over queries.
Neither model wins by construction (the old model's own neighbours are judged by the new
model, and the other way round), and a ψ whose hits either model places far away loses.

At each backfill fraction t, the naive merge (calibrated where the pair is) and the fitted
graph are scored on the same queries. The fitted graph passes when at every t its score is
not below the naive merge's by more than the tolerance at that t: two standard errors of
the per-query difference (a real tie is refused about one time in 40 at one t), and at
least :data:`GUARD_MIN_TOLERANCE`. At t = 0 the naive merge is exactly the old model (a
calibration maps old distances monotonically), so that check is "not below the old model".

``rmq calibrate`` asks the same of a calibration (``fitted_distance``): the calibrated merge
against the plain one, which the forecast alone let through on open-class pairs.

Pure numpy; no label is read, and no setting was chosen by looking at labels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.core.forecast import (
    ModeForecast,
    OldDistance,
    compare_fitted,
    label_codes,
    merged_distances,
    query_chunks,
    top_k,
)
from rm_qdrant.core.metrics import FRACTIONS, migrated_at
from rm_qdrant.core.rerank_rows import reranked_rows
from rm_qdrant.core.spaces import distance_matrix

#: The smallest tolerance (support, 0 to 1) at any t: a share of the gallery small enough that
#: a hit moved by it is one neighbour nearer or farther in a gallery of a few hundred.
GUARD_MIN_TOLERANCE = 0.002
#: Standard errors of the per-query difference a fitted graph may fall below the naive merge.
GUARD_STANDARD_ERRORS = 2.0
#: Items in a model's top (this × k) count as fully supported by it: a model's own top k would
#: otherwise outscore other members of a class larger than k, which a good ψ finds instead (on
#: the digits test images, ~52 a class, the good graphs started below Old without it).
SUPPORT_DEPTH = 3


MEASURES = {
    "support": "support: the top k's mean share of the held-out points both models rank behind a hit",
    "mAP": "mAP of the held-out points, by their payload labels",
    "rank": "1 - log(1 + the new model's rank of a hit) / log(n), held-out queries against all n",
}


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's evidence on one holdout: mean support of the top k per t, and the decision."""

    fractions: tuple[float, ...]
    naive: tuple[float, ...]  # the naive merge's mean support, per t (0 to 1, higher is nearer)
    fitted: tuple[float, ...]  # the fitted graph's
    tolerances: tuple[float, ...]  # how far fitted may fall below naive, per t
    queries: int
    subject: str = "the fitted graph"  # what was judged, for reason()
    baseline: str = "the naive merge"  # what it was judged against
    measure: str = "support"  # support (label-free) or mAP (payload labels)

    @property
    def margins(self) -> tuple[float, ...]:
        """fitted − naive at each t."""
        return tuple(f - n for f, n in zip(self.fitted, self.naive, strict=True))

    @property
    def worst(self) -> int:
        """Index of the deciding t: the first where fitted falls below naive beyond the tolerance,
        else where fitted − naive is lowest."""
        below = [i for i, (m, tol) in enumerate(zip(self.margins, self.tolerances, strict=True)) if m < -tol]
        return below[0] if below else int(np.argmin(self.margins)) if self.margins else 0

    @property
    def passed(self) -> bool:
        return self.queries > 0 and all(
            m >= -tol for m, tol in zip(self.margins, self.tolerances, strict=True)
        )

    def reason(self) -> str:
        """One clause naming the deciding t and the two numbers."""
        i = self.worst
        below = "below" if not self.passed else "within tolerance of" if self.margins[i] < 0 else "not below"
        same_start = self.fitted[0] == self.naive[0]  # a calibration cannot change t = 0
        start = f"; at t = 0 {self.fitted[0]:.3f} against the old model's {self.naive[0]:.3f}"
        what = {
            "support": "hits have support {:.3f} "
            "(the share of the held-out points both models rank behind them)",
            "mAP": "mAP over the held-out points (payload labels) is {:.3f}",
            "rank": "hits score {:.3f} by the new model's ranks (1 - log(1 + rank) / log n, "
            "held-out queries against the whole sample)",
        }[self.measure]
        return (
            f"at t = {self.fractions[i]:g} {self.subject}'s {what.format(self.fitted[i])}, {below} "
            f"{self.baseline}'s {self.naive[i]:.3f} (tolerance {self.tolerances[i]:.3f}"
            f"{start if i and not same_start else ''})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "measure": MEASURES[self.measure],
            "judged": self.subject,
            "against": self.baseline,
            "fractions": list(self.fractions),
            "naive": list(self.naive),
            "fitted": list(self.fitted),
            "tolerances": list(self.tolerances),
            "queries": self.queries,
            "min_margin": min(self.margins) if self.margins else None,
            "min_margin_t": self.fractions[int(np.argmin(self.margins))] if self.margins else None,
            "worst_t": self.fractions[self.worst] if self.fractions else None,
            "passed": self.passed,
        }


def support(
    old: np.ndarray, base: np.ndarray, k: int, *, metric: str = "cosine", rows: np.ndarray | None = None
) -> np.ndarray:
    """(len(rows), n): for query i (sample item ``rows[i]``, every item when None) and item j, the
    share of the other items that both the old model and the new model rank behind j (the smaller
    of the two shares; the query itself is 0). An item in a model's top SUPPORT_DEPTH × k counts
    as fully supported by it."""
    n, depth = len(old), SUPPORT_DEPTH * k
    rows = np.arange(n) if rows is None else rows
    at = np.arange(len(rows))
    shares = []
    for x in (old, base):
        d = distance_matrix(x[rows], x, metric)
        d[at, rows] = np.inf
        rank = np.argsort(np.argsort(d, axis=1, kind="stable"), axis=1, kind="stable")
        shares.append(np.clip(1.0 - (rank - depth) / max(1, n - 2 - depth), 0.0, 1.0))
    both = np.minimum(*shares)
    both[at, rows] = 0.0
    return both


def top_k_support(
    distances: np.ndarray, both: np.ndarray, k: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """Each query's mean support over its top k under ``distances`` (row i is item ``rows[i]``)."""
    return np.take_along_axis(both, top_k(distances, k, rows), axis=1).mean(axis=1)


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
    fitted_distance: OldDistance | None = None,
    subject: str = "the fitted graph",
    baseline: str = "the naive merge",
    rerank: int | None = None,
) -> GuardVerdict:
    """The naive merge of the plain new model (``base``) against a fitted encoder (``new``,
    ``rev``), backfilled in ``order``, by the support of their top k (module docstring);
    ``rerank``: both merges re-rank their first ``rerank`` by their own new model.

    Args:
        old: the holdout's stored old vectors (n, d_old).
        base: the plain new model's embeddings of the same images (n, d_new).
        new, rev: the fitted graph's outputs for them, as served.
        order: the holdout indices in migration order.
        k: the neighbours served.
        naive_distance: a calibrated pair's map of old distances (the naive merge only).
        fitted_distance: the judged merge's map of old-side distances: a calibration judged
            against the plain merge is ``guard(old, base, base, old, fitted_distance=map)``.
        subject, baseline: what is judged and against what, as :meth:`GuardVerdict.reason` names them.

    Raises:
        ValueError: fewer than three items, or arrays of different lengths.
    """
    n = len(old)
    if n < 3 or any(len(a) != n for a in (base, new, rev, order)):
        raise ValueError(f"the guard needs three or more items and one row each; got {n} old")
    a, b = merges_per_query(
        (old, base, new, rev),
        order=order,
        fractions=fractions,
        metric=metric,
        naive_distance=naive_distance,
        fitted_distance=fitted_distance,
        prepare=lambda rows: support(old, base, k, metric=metric, rows=rows),
        score=lambda d, rows, both: top_k_support(d, both, k, rows),
        rerank=rerank,
    )
    return judged(fractions, a, b, subject=subject, baseline=baseline)


Merges = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def merges_per_query(
    merges: Merges,
    *,
    order: np.ndarray,
    fractions: Sequence[float],
    metric: str,
    prepare: Callable[[np.ndarray], Any],
    score: Callable[[np.ndarray, np.ndarray, Any], np.ndarray],
    queries: np.ndarray | None = None,
    naive_distance: OldDistance | None = None,
    fitted_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(len(fractions), queries) scores of the naive merge and of the judged one at every t:
    ``merges`` is (old, base, new, rev) over the gallery, ``queries`` the items that query (every
    item when None), ``prepare(rows)`` what ``score(distances, rows, prepared)`` needs per chunk.
    ``rerank``: each merge's first ``rerank`` re-ranked by its own new model (``base`` for the
    naive merge, ``new`` for the judged one), as a pair serving ``rerank=K`` orders them."""
    old, base, new, rev = merges
    n = len(old)
    masks = [migrated_at(order, t) for t in fractions]
    m = n if queries is None else len(queries)
    a, b = np.empty((len(masks), m)), np.empty((len(masks), m))  # per t, each query's score
    start = 0
    for rows in query_chunks(queries, n):  # bounded memory whatever the gallery's size
        at, start = slice(start, start + len(rows)), start + len(rows)
        prepared = prepare(rows)
        if rerank is not None:
            by_base, by_new = (
                distance_matrix(base[rows], base, metric),
                distance_matrix(new[rows], new, metric),
            )
        for i, migrated in enumerate(masks):
            naive_d = merged_distances(base[rows], old[rows], base, old, migrated, naive_distance, metric)
            fitted_d = merged_distances(new[rows], rev[rows], new, old, migrated, fitted_distance, metric)
            if rerank is not None:
                naive_d = reranked_rows(naive_d, by_base, rerank, rows)
                fitted_d = reranked_rows(fitted_d, by_new, rerank, rows)
            a[i, at] = score(naive_d, rows, prepared)
            b[i, at] = score(fitted_d, rows, prepared)
    return a, b


def judged(
    fractions: Sequence[float],
    naive: np.ndarray,
    fitted: np.ndarray,
    *,
    subject: str = "the fitted graph",
    baseline: str = "the naive merge",
    measure: str = "support",
) -> GuardVerdict:
    """The verdict on per-query values (len(fractions), n) of the naive merge and the judged one:
    at each t the means, and a tolerance of two standard errors of the per-query difference (at
    least :data:`GUARD_MIN_TOLERANCE`)."""
    n = naive.shape[1]
    means_a, means_b, tolerances = [], [], []
    for a_t, b_t in zip(naive, fitted, strict=True):
        means_a.append(float(a_t.mean()))
        means_b.append(float(b_t.mean()))
        error = float(np.std(b_t - a_t, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
        tolerances.append(max(GUARD_MIN_TOLERANCE, GUARD_STANDARD_ERRORS * error))
    return GuardVerdict(
        tuple(fractions), tuple(means_a), tuple(means_b), tuple(tolerances), n, subject, baseline, measure
    )


def _checked(merges: Merges, order: np.ndarray, queries: np.ndarray | None, what: str) -> None:
    n = len(merges[0])
    if n < 3 or any(len(a) != n for a in (*merges, order)):
        raise ValueError(f"{what} needs three or more items and one row each; got {n}")
    if queries is not None and (len(queries) < 2 or queries.min() < 0 or queries.max() >= n):
        raise ValueError(f"{what} needs two or more queries among the {n} items")


def labelled_guard(
    old: np.ndarray,
    base: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray,
    labels: Sequence[object],
    *,
    order: np.ndarray,
    queries: np.ndarray | None = None,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "cosine",
    naive_distance: OldDistance | None = None,
    subject: str = "the fitted graph",
    rerank: int | None = None,
) -> GuardVerdict:
    """:func:`guard` judged by the labels: each query's AP over the rest of the items (the
    query's own label relevant), the fitted merge against the naive one at every t. Where a team's
    payload carries labels they decide, whatever the label-free signals say (issue 39).
    ``queries``: the held-out items that query, against every item (None: each against the rest).

    Raises:
        ValueError: fewer than three items, arrays of different lengths, or an item without a label.
    """
    y = label_codes(labels)
    _checked((old, base, new, rev), order, queries, "the labelled guard")
    if y is None or len(y) != len(old):
        raise ValueError("the labelled guard needs one label per item")
    naive, fitted = compare_fitted(
        old,
        base,
        new,
        rev,
        order=order,
        labels=labels,
        k=1,  # the recall the forecast also gives is not what is judged
        fractions=fractions,
        metric=metric,
        queries=queries,
        naive_distance=naive_distance,
        rerank=rerank,
    )
    return labelled_verdict(naive, fitted, subject=subject)


def labelled_verdict(
    naive: ModeForecast, fitted: ModeForecast, *, subject: str = "the fitted graph"
) -> GuardVerdict:
    """The labelled guard's verdict from a labelled forecast's two curves (their per-query APs),
    so that a command which forecast the mAP already does not rank the queries again.

    Raises:
        ValueError: a curve without per-query APs (a forecast without labels).
    """
    if naive.query_maps is None or fitted.query_maps is None:
        raise ValueError("the labelled guard needs a forecast with labels")
    a, b = np.stack(naive.query_maps), np.stack(fitted.query_maps)
    return judged(naive.fractions, a, b, subject=subject, measure="mAP")


def rank_guard(
    old: np.ndarray,
    base: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray,
    *,
    order: np.ndarray,
    queries: np.ndarray,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "cosine",
    naive_distance: OldDistance | None = None,
    subject: str = "the fitted graph",
    rerank: int | None = None,
) -> GuardVerdict:
    """``rmq fit``'s label-free guard (issue 39): held-out ``queries`` search every item (the
    whole sample, as the graph will search the whole gallery); each hit of a merge's top k scores
    by where the new model ranks it among the n items, ``1 − log(1 + rank) / log n`` (1 for the
    new model's nearest, 0 for its farthest): recall at every depth at once, so neither a gallery
    of a few large classes (where the new model's exact top k is a small part of a class) nor one
    of hundreds of classes with a handful of images each (where the rest of a holdout holds almost
    none of a query's class) fools it. The fitted merge must not fall below the naive one at
    any t (two standard errors). Measured over many-class few-shot and digits pairs:
    ``benchmarks/label_free_rules.py``. ``rerank``: both merges re-rank their first ``rerank``
    by their own new model before their top k is scored (``rmq fit --rerank``).

    Raises:
        ValueError: fewer than three items or two queries, or arrays of different lengths.
    """
    merges = (old, base, new, rev)
    _checked(merges, order, queries, "the guard")
    scale = np.log(len(old))

    def ranks(rows: np.ndarray) -> np.ndarray:
        d = distance_matrix(base[rows], base, metric)
        d[np.arange(len(rows)), rows] = np.inf  # the query itself ranks last
        return np.argsort(np.argsort(d, axis=1, kind="stable"), axis=1, kind="stable")

    def score(d: np.ndarray, rows: np.ndarray, rank: np.ndarray) -> np.ndarray:
        return (1.0 - np.log1p(np.take_along_axis(rank, top_k(d, k, rows), axis=1)) / scale).mean(axis=1)

    a, b = merges_per_query(
        merges,
        order=order,
        queries=queries,
        fractions=fractions,
        metric=metric,
        naive_distance=naive_distance,
        prepare=ranks,
        score=score,
        rerank=rerank,
    )
    return judged(fractions, a, b, subject=subject, measure="rank")


def calibration_refusal(
    calibrated_area: float, plain_area: float, verdict: GuardVerdict, in_use_area: float | None = None
) -> str:
    """Why ``rmq calibrate`` keeps no map ("" when it keeps it): the map must forecast a larger
    area (recall against the new model's own neighbours) than the plain merge, and than the map
    the pair merges with now (``in_use_area``, where it has one: a refit must not swap a better
    map for a worse one), and pass the guard (its hits as near in both models' eyes as the plain
    merge's, at every t). The forecast alone kept maps that served below the plain merge where
    the two models disagree (open-class pairs, benchmarks/results/fit-summary.md)."""
    if not calibrated_area > plain_area:  # a tie is not worth a map
        return "it forecasts no better than the plain merge"
    if in_use_area is not None and not calibrated_area > in_use_area:
        return f"it forecasts no better than the map in use (area {in_use_area:.3f})"
    return "" if verdict.passed else f"the guard refuses it: {verdict.reason()}"
