"""Retrieval metrics with the ml-fct/openBCT protocol (pure numpy).

Every test image is a query; the rest of the set is the gallery (the query itself
is excluded); a gallery item is relevant when it shares the query's label. mAP is
over the full ranking; CMC top-1 is whether the nearest item is relevant. Work is
chunked over queries so a 10,000 × 10,000 evaluation stays within a few hundred MB.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

#: The backfill fractions of the evaluation protocol: t = 0, 0.1, ..., 1.
FRACTIONS = tuple(i / 10 for i in range(11))
#: Threads that score query chunks at once.
WORKERS = min(8, os.cpu_count() or 1)
#: Query × gallery cells held at once over all threads (each cell costs ~20 bytes of work arrays).
CELLS = 20_000_000


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
    """AP (or AP@k) and top-1 hit of each query row of ``dist`` (the query itself excluded).

    Sorts the relevant and the irrelevant distances of each row apart: the i-th
    nearest relevant item (1-based) ranks at i plus the irrelevant items no farther
    than it, so a tie counts against the query (top-1 too). Overwrites ``dist``.
    """
    at = np.arange(len(rows))
    dist[at, rows] = np.inf
    relevant = labels[None, :] == labels[rows][:, None]
    relevant[at, rows] = False
    n_rel = relevant.sum(axis=1)
    near_relevant = np.sort(np.where(relevant, dist, np.inf), axis=1)
    near_other = np.sort(np.where(relevant, np.inf, dist), axis=1)
    top = near_relevant[:, 0] < near_other[:, 0]
    ap = np.zeros(len(rows))
    for i, m in enumerate(n_rel):
        if not m:
            continue
        hits = np.arange(1, m + 1)
        ranks = hits + np.searchsorted(near_other[i], near_relevant[i, :m], side="right")
        if k is None:
            ap[i] = (hits / ranks).mean()
        else:
            kept = ranks <= k
            ap[i] = (hits[kept] / ranks[kept]).sum() / min(m, k)
    return ap, top


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
    workers: int = WORKERS,
    old_distance: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Retrieval:
    """Quality of a distance-rank-merged system at one backfill state.

    Gallery item j is served from new when ``migrated[j]`` (distance between the
    query's new vector and its new vector), else from old (query's old-side vector,
    ``rev`` or the old model's, against its old vector). Ranking the whole gallery by
    these cosine distances is what merging each collection's top-k by distance returns.
    Chunks of at most ``chunk`` queries are scored on ``workers`` threads (numpy
    sorts release the GIL), sized so all threads together hold about ``CELLS``
    query × gallery cells (a few hundred MB, whatever the gallery size). ``old_distance``
    maps old-side distances before the merge (the calibrated naive merge).
    """
    n = len(labels)
    chunk = max(1, min(chunk, CELLS // max(1, n * workers)))
    labels = np.asarray(labels)
    migrated = np.asarray(migrated, dtype=bool)
    qn, qo = (unit(q) if q is not None else None for q in (query_new, query_old))
    gn, go = (unit(g) if g is not None else None for g in (gallery_new, gallery_old))

    def score(start: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(start, min(start + chunk, n))
        dist = np.empty((len(rows), n), dtype=np.float32)
        if migrated.any():
            dist[:, migrated] = 1.0 - qn[rows] @ gn[migrated].T  # type: ignore[index]
        if (~migrated).any():
            old_side = 1.0 - qo[rows] @ go[~migrated].T  # type: ignore[index]
            dist[:, ~migrated] = old_side if old_distance is None else old_distance(old_side)
        return _scores(dist, labels, rows, k)

    starts = range(0, n, chunk)
    if workers > 1 and len(starts) > 1:
        with ThreadPoolExecutor(min(workers, len(starts))) as pool:
            parts = list(pool.map(score, starts))
    else:
        parts = [score(start) for start in starts]
    hits = np.concatenate([top for _, top in parts])
    return Retrieval(float(np.concatenate([ap for ap, _ in parts]).mean()), float(hits.mean()), hits)


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
