"""Forecast a backfill's quality curve on a sample, without labels (pure numpy).

Each sample item is a query against the rest of the sample. The reference is the
new model's exhaustive top-k over the sample: the ranking the pair serves once the
backfill is done. At each fraction t, a share t of the sample has migrated (new
vectors) and the rest holds old vectors; a query's merged top-k is compared with
its reference top-k by recall@k and nDCG@k (binary relevance: in the reference
top-k or not). With labels, mAP and top-1 over the sample are added.

A query mode says what a query uses against the old half: ``naive``, the old
model's vector of the same image (the stored old vector); ``rm``, the encoder's
``rev`` output.

Distances are the collection's metric (:mod:`rm_qdrant.core.spaces`): under dot or
Euclid the vectors' norms, and so each model's scale, are part of the merge. Each
curve also records, at every t, the old side's share of the merged top-k: a side whose
share of the top k is far below its share of the gallery is crowded out
(:meth:`ModeForecast.crowded`), whatever recall says.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from rm_qdrant.core.metrics import FRACTIONS, _scores, area, migrated_at
from rm_qdrant.core.rerank_rows import reranked_rows
from rm_qdrant.core.spaces import distance_matrix

#: A map of old-side distances before the merge (the calibrated naive merge).
OldDistance = Callable[[np.ndarray], np.ndarray]

#: How far (recall@k) a curve may fall below its start before it counts as a dip.
DIP_TOLERANCE = 0.005
#: Query × sample cells a forecast (or the guard) holds at once: its work arrays cost tens of
#: bytes a cell, so a 20,000-point holdout takes about a hundred MB, not the 15-20 GB of whole
#: (n, n) matrices, whatever the sample size.
ROW_CELLS = 2_000_000
#: A side is crowded out of the merged top k when its share there is below this part of its
#: share of the gallery...
CROWDED_RATIO = 0.25
#: ...while it holds at least this share of the gallery (below it, a few hits are noise).
CROWDED_MIN_SHARE = 0.2


@dataclass(frozen=True)
class Crowding:
    """A side that (almost) never reaches the merged top k at fraction ``t``."""

    t: float
    side: str  # old | new
    gallery: float  # its share of the gallery
    top_k: float  # its share of the merged top k


@dataclass(frozen=True)
class ModeForecast:
    """One query mode's forecast curve."""

    mode: str  # naive | rm
    fractions: tuple[float, ...]
    recall: tuple[float, ...]  # recall@k against the new model's neighbours
    ndcg: tuple[float, ...]
    maps: tuple[float, ...] | None = None  # with labels
    top1s: tuple[float, ...] | None = None
    old_share: tuple[float, ...] | None = None  # the old side's share of the merged top k, per t
    old_gallery: tuple[float, ...] | None = None  # the old side's share of the gallery, per t
    #: With labels, each query's AP per t (same query rows in every curve of one forecast): the
    #: per-query differences that :func:`rm_qdrant.core.advice.labelled_gaps` reads.
    query_maps: tuple[np.ndarray, ...] | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def area(self) -> float:
        """Area under recall@k over t (1.0 would be the new model from the start)."""
        return area(self.recall, self.fractions)

    def dips(self, tolerance: float = DIP_TOLERANCE) -> list[float]:
        """The fractions t > 0 where recall@k is below its value at t = 0 (negative flips)."""
        return [
            t
            for t, r in zip(self.fractions[1:], self.recall[1:], strict=True)
            if r < self.recall[0] - tolerance
        ]

    def crowded(self) -> list[Crowding]:
        """Where one side's share of the merged top k is below CROWDED_RATIO of its gallery share
        (a share of CROWDED_MIN_SHARE or more): the merge is decided by the models' scales."""
        if self.old_share is None or self.old_gallery is None:
            return []
        return [
            c
            for t, top, gallery in zip(self.fractions, self.old_share, self.old_gallery, strict=True)
            for c in crowding(t, top, gallery)
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "fractions": list(self.fractions),
            "recall": list(self.recall),
            "ndcg": list(self.ndcg),
            "area": self.area,
            "dips_at": self.dips(),
            **({"old_share_top_k": list(self.old_share)} if self.old_share is not None else {}),
            **({"old_share_gallery": list(self.old_gallery)} if self.old_gallery is not None else {}),
            "crowded_out": [dataclasses.asdict(c) for c in self.crowded()],
            **({"map": list(self.maps), "top1": list(self.top1s or ())} if self.maps is not None else {}),
        }


def crowding(t: float, old_share: float, old_gallery: float) -> list[Crowding]:
    """The sides crowded out at ``t``: a side holding ``g`` >= CROWDED_MIN_SHARE of the gallery and
    less than CROWDED_RATIO × ``g`` of the merged top k (``old_share``: the old side's share there)."""
    sides = (("old", old_gallery, old_share), ("new", 1.0 - old_gallery, 1.0 - old_share))
    return [
        Crowding(t, side, g, s) for side, g, s in sides if g >= CROWDED_MIN_SHARE and s < CROWDED_RATIO * g
    ]


def row_chunks(n: int) -> Iterator[np.ndarray]:
    """The query rows 0..n-1 in chunks of at most ``ROW_CELLS // n`` (each row meets n items)."""
    step = max(1, ROW_CELLS // max(1, n))
    for start in range(0, n, step):
        yield np.arange(start, min(start + step, n))


def query_chunks(queries: np.ndarray | None, n: int) -> Iterator[np.ndarray]:
    """:func:`row_chunks` over the query rows ``queries`` of a gallery of ``n`` items (every item
    when None): a holdout's queries judged against the whole sample."""
    if queries is None:
        yield from row_chunks(n)
        return
    for chunk in row_chunks(n):
        if chunk[0] >= len(queries):
            return
        yield queries[chunk[0] : chunk[-1] + 1]


def top_k(distances: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Indices of each row's ``k`` smallest distances, nearest first, the query itself excluded:
    row i is sample item ``rows[i]`` (``i`` when ``rows`` is None, a square matrix)."""
    d = distances.copy()
    at = np.arange(len(d))
    d[at, at if rows is None else rows] = np.inf
    k = min(k, d.shape[1] - 1)
    part = np.argpartition(d, k - 1, axis=1)[:, :k]
    order = np.argsort(np.take_along_axis(d, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def merged_distances(
    query_new: np.ndarray,
    query_old: np.ndarray,
    new: np.ndarray,
    old: np.ndarray,
    migrated: np.ndarray,
    old_distance: OldDistance | None = None,
    metric: str = "cosine",
) -> np.ndarray:
    """Distances (the collection's ``metric``) from each query to every sample item, as the
    merge sees them: migrated items from new, the rest from old (mapped by ``old_distance``)."""
    d = np.empty((len(query_new), len(new)), dtype=np.float32)
    d[:, migrated] = distance_matrix(query_new, new[migrated], metric)
    old_side = distance_matrix(query_old, old[~migrated], metric)
    d[:, ~migrated] = old_side if old_distance is None else old_distance(old_side)
    return d


def agreement(found: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Mean recall@k and nDCG@k of ``found`` (n, k) against ``reference`` (n, k)."""
    k = reference.shape[1]
    hit = (found[:, :, None] == reference[:, None, :]).any(axis=2)
    gains = 1.0 / np.log2(np.arange(2, k + 2))
    return float(hit.mean()), float((hit * gains).sum(axis=1).mean() / gains.sum())


def reference_top_k(
    new: np.ndarray, k: int, metric: str = "cosine", queries: np.ndarray | None = None
) -> np.ndarray:
    """The new model's own top-k over the sample, of each of ``queries`` (every item when None):
    what the pair serves once the backfill is done."""
    return np.concatenate(
        [top_k(distance_matrix(new[rows], new, metric), k, rows) for rows in query_chunks(queries, len(new))]
    )


def merged_agreement(
    new: np.ndarray,
    query_old: np.ndarray,
    old: np.ndarray,
    migrated: np.ndarray,
    reference: np.ndarray,
    old_distance: OldDistance | None = None,
    metric: str = "cosine",
) -> tuple[float, float]:
    """recall@k and nDCG@k of the merged top-k against ``reference`` (``migrated`` items served from new)."""
    found = merged_top_k(new, query_old, old, migrated, reference.shape[1], old_distance, metric)
    return agreement(found, reference)


def merged_top_k(
    new: np.ndarray,
    query_old: np.ndarray,
    old: np.ndarray,
    migrated: np.ndarray,
    k: int,
    old_distance: OldDistance | None = None,
    metric: str = "cosine",
) -> np.ndarray:
    """Each sample item's merged top k over the rest (``migrated`` items served from new)."""
    found = [
        top_k(merged_distances(new[rows], query_old[rows], new, old, migrated, old_distance, metric), k, rows)
        for rows in row_chunks(len(new))
    ]
    return np.concatenate(found)


def label_codes(labels: Sequence[object] | None) -> np.ndarray | None:
    """Labels as integers when every item has one, else None."""
    if labels is None or not all(label is not None for label in labels):
        return None
    return np.unique([str(label) for label in labels], return_inverse=True)[1]


@dataclass(frozen=True)
class _Backfill:
    """What every curve of one forecast shares: order, reference top-k, labels, fractions, metric."""

    order: np.ndarray
    reference: np.ndarray
    y: np.ndarray | None
    fractions: Sequence[float]
    metric: str = "cosine"
    queries: np.ndarray | None = None  # the items that query (None: every item)
    rerank: int | None = None  # the merged top K re-ranked by the new model (None: no re-rank)

    @classmethod
    def of(
        cls,
        old: np.ndarray,
        base: np.ndarray,
        *others: np.ndarray | None,
        order: np.ndarray,
        labels: Sequence[object] | None,
        k: int,
        fractions: Sequence[float],
        metric: str = "cosine",
        queries: np.ndarray | None = None,
        rerank: int | None = None,
    ) -> _Backfill:
        """Checked rows (two or more, one per item in every array); the reference is ``base``'s
        top-k of each query (``queries``: the items that query the rest, every item when None).

        Raises:
            ValueError: fewer than two items, or arrays of different lengths.
        """
        n = len(old)
        if n < 2 or any(a is not None and len(a) != n for a in (base, *others, order)):
            raise ValueError(f"a forecast needs two or more items and one row each; got {n} old")
        if rerank is not None and rerank < 1:
            raise ValueError(f"a re-rank takes k >= 1 items, got {rerank}")
        reference = reference_top_k(base, k, metric, queries)
        return cls(order, reference, label_codes(labels), fractions, metric, queries, rerank)

    def curve(
        self,
        mode: str,
        new: np.ndarray,
        query_old: np.ndarray,
        old: np.ndarray,
        old_distance: OldDistance | None = None,
    ) -> ModeForecast:
        """One query mode: ``new`` fills (and queries) the new side, ``query_old`` queries the old."""
        recall, ndcg, maps, tops, share, gallery, per_query = [], [], [], [], [], [], []
        k = self.reference.shape[1]
        for t in self.fractions:
            migrated = migrated_at(self.order, t)
            parts, aps, hits = [], [], []
            for rows in query_chunks(self.queries, len(old)):
                merged = merged_distances(
                    new[rows], query_old[rows], new, old, migrated, old_distance, self.metric
                )
                if self.rerank is not None:  # the new model re-scores the merged top K
                    rescored = distance_matrix(new[rows], new, self.metric)
                    merged = reranked_rows(merged, rescored, self.rerank, rows)
                parts.append(top_k(merged, k, rows))
                if self.y is not None:
                    ap, top = _scores(merged, self.y, rows, None)  # the whole ranking, the query left out
                    aps.append(ap)
                    hits.append(top)
            found = np.concatenate(parts)
            r, g = agreement(found, self.reference)
            recall.append(r)
            ndcg.append(g)
            share.append(float((~migrated)[found].mean()))
            gallery.append(float((~migrated).mean()))
            if self.y is not None:
                per_query.append(np.concatenate(aps))
                maps.append(float(per_query[-1].mean()))
                tops.append(float(np.concatenate(hits).mean()))
        labelled = self.y is not None
        return ModeForecast(
            mode,
            tuple(self.fractions),
            tuple(recall),
            tuple(ndcg),
            tuple(maps) if labelled else None,
            tuple(tops) if labelled else None,
            tuple(share),
            tuple(gallery),
            tuple(per_query) if labelled else None,
        )


def forecast(
    old: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray | None = None,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    naive_distance: OldDistance | None = None,
    metric: str = "cosine",
    rerank: int | None = None,
) -> list[ModeForecast]:
    """The naive mode's forecast, and the rm mode's when ``rev`` is given.

    ``naive_distance`` is a calibrated naive pair's map of old distances (naive mode only).

    Args:
        old: the sample's stored old vectors (n, d_old).
        new: the encoder's gallery output for the same images (n, d_new).
        rev: the encoder's ``rev`` output for them (n, d_old), or None.
        order: the sample indices in migration order.
        labels: one label per item (None where unknown), or None for no labels.
        k: the neighbours compared.
        metric: the collection's distance (cosine, dot, euclid, manhattan).
        rerank: re-rank each query's merged top ``rerank`` by the new model's distances (every
            old item among them read in time: :mod:`rm_qdrant.core.rerank_rows`); None: none.

    Raises:
        ValueError: fewer than two items, arrays of different lengths, or ``rerank`` below 1.
    """
    backfill = _Backfill.of(
        old, new, rev, order=order, labels=labels, k=k, fractions=fractions, metric=metric, rerank=rerank
    )
    curves = [backfill.curve("naive", new, old, old, naive_distance)]
    if rev is not None:
        curves.append(backfill.curve("rm", new, rev, old))
    return curves


def holdout_split(n: int, holdout: float, seed: int, *, k: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices to fit on and to hold out (at least 2 of each), from a seeded shuffle.

    Raises:
        ValueError: a sample too small to split, or a holdout too small to compare top-``k`` lists.
    """
    held = max(2, round(n * holdout))
    if n - held < 2:
        raise ValueError(f"{n} sampled points are too few to fit on and hold some out")
    if held <= 2 * k:
        needed = math.ceil((2 * k + 1) / holdout)
        raise ValueError(
            f"{n} sampled points leave {held} held out, too few to compare top-{k} lists: "
            f"--k {k} --holdout {holdout:g} needs {needed} or more (a larger --sample or gallery, "
            "a larger --holdout, or a smaller --k)"
        )
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def compare_fitted(
    old: np.ndarray,
    base: np.ndarray,
    new: np.ndarray,
    rev: np.ndarray,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "cosine",
    queries: np.ndarray | None = None,
    naive_distance: OldDistance | None = None,
    rerank: int | None = None,
) -> list[ModeForecast]:
    """The naive merge of the plain new model (``base``) beside a fitted encoder (``new``, ``rev``).

    Both curves are scored against ``base``'s own top-k, the team's new model: a fitted ρ
    that drifts away from the new model's neighbours is not rewarded for agreeing with itself.
    ``queries``: the items that query (a holdout), against every item (None: each against the rest).
    ``rerank``: both curves re-rank their merged top K by their own new model (the naive merge's
    by ``base``, the fitted one's by ``new``), as a pair serving ``rerank=K`` would.
    """
    backfill = _Backfill.of(
        old,
        base,
        new,
        rev,
        order=order,
        labels=labels,
        k=k,
        fractions=fractions,
        metric=metric,
        queries=queries,
        rerank=rerank,
    )
    naive = backfill.curve("naive", base, old, old, naive_distance)  # as a calibrated pair serves it
    return [naive, backfill.curve("fitted", new, rev, old)]


def compare_calibrated(
    old: np.ndarray,
    new: np.ndarray,
    calibration: OldDistance,
    *,
    order: np.ndarray,
    labels: Sequence[object] | None = None,
    k: int = 10,
    fractions: Sequence[float] = FRACTIONS,
    metric: str = "cosine",
    in_use: OldDistance | None = None,
) -> list[ModeForecast]:
    """The naive merge beside the calibrated one (old-side distances mapped by ``calibration``),
    and beside the pair's current map (``in_use``, mode "in use") where it has one."""
    backfill = _Backfill.of(old, new, order=order, labels=labels, k=k, fractions=fractions, metric=metric)
    curves = [
        backfill.curve("naive", new, old, old),
        backfill.curve("calibrated", new, old, old, calibration),
    ]
    return curves + ([backfill.curve("in use", new, old, old, in_use)] if in_use is not None else [])
