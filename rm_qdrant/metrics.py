"""Retrieval metrics with the ml-fct/openBCT protocol (pure numpy).

Every test image is a query; the rest of the set is the gallery (the query itself
is excluded); a gallery item is relevant when it shares the query's label. mAP is
over the full ranking; CMC top-1 is whether the nearest item is relevant. Work is
chunked over queries so a 10,000 × 10,000 evaluation stays within a few hundred MB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Retrieval:
    """mAP and CMC top-1 of one system, over all queries."""

    map: float
    top1: float


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _scores(dist: np.ndarray, labels: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """AP and top-1 hit of each query row of ``dist`` (self excluded via +inf)."""
    dist = dist.copy()
    dist[np.arange(len(rows)), rows] = np.inf
    order = np.argsort(dist, axis=1, kind="stable")[:, :-1]  # drop the query itself (last)
    relevant = labels[order] == labels[rows][:, None]
    hits = np.cumsum(relevant, axis=1)
    ranks = np.arange(1, relevant.shape[1] + 1)
    n_rel = relevant.sum(axis=1)
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
        ap, top = _scores(dist, labels, rows)
        aps.append(ap)
        tops.append(top)
    return Retrieval(float(np.concatenate(aps).mean()), float(np.concatenate(tops).mean()))


def retrieval(query: np.ndarray, gallery: np.ndarray, labels: np.ndarray) -> Retrieval:
    """A single system: queries and gallery embedded in one space."""
    return backfill_retrieval(query, None, gallery, None, labels, np.ones(len(labels), dtype=bool))
