"""Retrieval metrics with the ml-fct/openBCT protocol (pure numpy).

Every test image is a query; the rest of the set is the gallery (the query itself
is excluded); a gallery item is relevant when it shares the query's label. mAP is
over the full ranking; CMC top-1 is whether the nearest item is relevant. Work is
chunked over queries so a 10,000 × 10,000 evaluation stays within a few hundred MB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: The backfill fractions of the evaluation protocol: t = 0, 0.1, ..., 1.
FRACTIONS = tuple(i / 10 for i in range(11))


@dataclass(frozen=True)
class Retrieval:
    """mAP (or mAP@k) and CMC top-1 of one system, over all queries.

    ``hits`` holds each query's top-1 correctness (for negative flips).
    """

    map: float
    top1: float
    hits: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False, compare=False)


@dataclass(frozen=True)
class Curve:
    """mAP_t and top-1_t over the backfill fractions, and the negative flips along the way."""

    fractions: tuple[float, ...]
    maps: tuple[float, ...]
    top1s: tuple[float, ...]
    flips: int  # queries right at t = 0... under the old system and wrong at some t

    @property
    def auc_map(self) -> float:
        return area(self.maps, self.fractions)

    @property
    def auc_cmc(self) -> float:
        return area(self.top1s, self.fractions)

    def monotone(self, tolerance: float = 1e-4) -> bool:
        """Whether mAP_t never falls as t grows (beyond ``tolerance``)."""
        return all(b >= a - tolerance for a, b in zip(self.maps, self.maps[1:], strict=False))


def area(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """Trapezoid area under ``values`` over ``fractions``."""
    v, t = np.asarray(values, dtype=np.float64), np.asarray(fractions, dtype=np.float64)
    return float(((v[1:] + v[:-1]) / 2 * np.diff(t)).sum())


def gain(auc: float, auc_old: float, auc_new: float) -> float:
    """(AUC_method − AUC_old) / (AUC_new − AUC_old): 0 is the old system, 1 the new one."""
    if auc_new == auc_old:
        raise ValueError("Gain is undefined when the old and new systems score the same")
    return (auc - auc_old) / (auc_new - auc_old)


def migrated_at(order: np.ndarray, t: float) -> np.ndarray:
    """The mask of gallery items migrated at fraction ``t`` when they move in ``order``."""
    mask = np.zeros(len(order), dtype=bool)
    mask[np.asarray(order)[: round(t * len(order))]] = True
    return mask


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _scores(
    dist: np.ndarray, labels: np.ndarray, rows: np.ndarray, k: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """AP (or AP@k) and top-1 hit of each query row of ``dist`` (the query itself excluded)."""
    dist = dist.copy()
    dist[np.arange(len(rows)), rows] = np.inf
    order = np.argsort(dist, axis=1, kind="stable")[:, :-1]  # drop the query itself (last)
    relevant = labels[order] == labels[rows][:, None]
    n_rel = relevant.sum(axis=1)
    if k is not None:
        relevant, n_rel = relevant[:, :k], np.minimum(n_rel, k)
    hits = np.cumsum(relevant, axis=1)
    ranks = np.arange(1, relevant.shape[1] + 1)
    ap = np.where(n_rel > 0, (relevant * hits / ranks).sum(axis=1) / np.maximum(n_rel, 1), 0.0)
    return ap, relevant[:, 0]


def backfill_retrieval(
    query_new: np.ndarray | None,
    query_old: np.ndarray | None,
    gallery_new: np.ndarray | None,
    gallery_old: np.ndarray | None,
    labels: np.ndarray,
    migrated: np.ndarray,
    *,
    k: int | None = None,
    chunk: int = 1000,
) -> Retrieval:
    """Quality of a distance-rank-merged system at one backfill state.

    Gallery item j is served from new when ``migrated[j]`` (distance between the
    query's new vector and its new vector), else from old (query's old-side vector,
    ``rev`` or the old model's, against its old vector). Ranking the whole gallery by
    these cosine distances is what merging each collection's top-k by distance returns.
    """
    n = len(labels)
    migrated = np.asarray(migrated, dtype=bool)
    qn, qo = (unit(q) if q is not None else None for q in (query_new, query_old))
    gn, go = (unit(g) if g is not None else None for g in (gallery_new, gallery_old))
    aps, tops = [], []
    for start in range(0, n, chunk):
        rows = np.arange(start, min(start + chunk, n))
        dist = np.empty((len(rows), n), dtype=np.float32)
        if migrated.any():
            dist[:, migrated] = 1.0 - qn[rows] @ gn[migrated].T  # type: ignore[index]
        if (~migrated).any():
            dist[:, ~migrated] = 1.0 - qo[rows] @ go[~migrated].T  # type: ignore[index]
        ap, top = _scores(dist, labels, rows, k)
        aps.append(ap)
        tops.append(top)
    hits = np.concatenate(tops)
    return Retrieval(float(np.concatenate(aps).mean()), float(hits.mean()), hits)


def retrieval(
    query: np.ndarray, gallery: np.ndarray, labels: np.ndarray, *, k: int | None = None
) -> Retrieval:
    """A single system: queries and gallery embedded in one space."""
    return backfill_retrieval(query, None, gallery, None, labels, np.ones(len(labels), dtype=bool), k=k)


def backfill_curve(
    query_new: np.ndarray,
    query_old: np.ndarray,
    gallery_new: np.ndarray,
    gallery_old: np.ndarray,
    labels: np.ndarray,
    order: np.ndarray,
    *,
    old_hits: np.ndarray,
    fractions: Sequence[float] = FRACTIONS,
    k: int | None = None,
) -> Curve:
    """mAP_t and top-1_t of a merged system as the gallery migrates in ``order``.

    ``old_hits`` is each query's top-1 correctness under the old system (old/old):
    a negative flip is a query right there and wrong at some t.
    """
    maps, tops, flipped = [], [], np.zeros(len(labels), dtype=bool)
    for t in fractions:
        r = backfill_retrieval(
            query_new, query_old, gallery_new, gallery_old, labels, migrated_at(order, t), k=k
        )
        maps.append(r.map)
        tops.append(r.top1)
        flipped |= old_hits & ~r.hits
    return Curve(tuple(fractions), tuple(maps), tuple(tops), int(flipped.sum()))
