"""Served evaluation: the paper's metrics measured through the live pair (DualIndex over Qdrant).

Queries are labelled images (an ImageFolder), or a text pair's judged queries (a JSONL file:
:mod:`~rm_qdrant.evaluation.queries`, each with a label or the ids of its relevant points); the
gallery is whatever the pair serves, each point labelled by its payload ``label``. A query
that is itself in the gallery (the same ``uri``; a text query's ``id``) is left out of its own
ranking, as in the offline protocol. Both kinds are scored by one function,
:func:`ranked_precision`.
Between fractions the pair is migrated with ``--until``, in the pair's backfill order.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.merge import Hit, PointId
from rm_qdrant.core.metrics import Retrieval
from rm_qdrant.core.paths import integer_text, payload_value
from rm_qdrant.core.rerank import RESCORED, Rerank
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.queries import TextQuery
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.indexing import ImageItem
from rm_qdrant.pair.layouts import active_where, count_new, ids_in_new
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Where

log = logging.getLogger(__name__)

#: What ``rmq eval`` measures with: labelled images, or a text pair's judged queries.
Query = ImageItem | TextQuery


@dataclass(frozen=True)
class ServedPoint:
    """Quality at one backfill state, as served."""

    t: float  # the fraction asked for
    fraction: float  # the fraction actually in new
    map: float
    top1: float
    #: Old hits among the re-rank's first K that kept their merged distance (late, over budget,
    #: unreadable), over all queries; 0 without a re-rank.
    missed: int = 0


def _label_counts(index: DualIndex, labels: set[str]) -> dict[str, int]:
    """Gallery points per query label. A label is compared as text (a folder name), so a payload
    label 3 counts for the folder "3", as ``rmq probe`` reads it; true/false labels never match."""
    store, pair = index.store, index.pair
    counts = {}
    for label in labels:
        counts[label] = 0
        number = integer_text(label)
        forms: list[str | int] = [label] + ([number] if number is not None else [])
        for form in forms:
            where = Where(must={pair.label_field: form})
            old = store.count(pair.old_collection, active_where(pair) & where) if pair.serves_old else 0
            counts[label] += old + (count_new(store, pair, where) if pair.serves_new else 0)
    return counts


def label_text(value: Any) -> str | None:
    """A payload label as the query folders name it: its text (an integer 3 is "3"); None for
    no label or a true/false one."""
    return None if value is None or isinstance(value, bool) else str(value)


def image_key(uri: Any, root: Path | None = None) -> Any:
    """What identifies an image across the gallery and the queries: a local path resolved
    (relative ones under the pair's ``root``, as the migration reads them), else the URI."""
    if not isinstance(uri, str) or "://" in uri or not uri:
        return uri
    path = Path(uri)
    if not path.is_absolute() and root is not None:
        path = Path(root) / path
    return os.path.realpath(path)


def ranked_precision(flags: np.ndarray, relevant: int, k: int | None) -> tuple[float, bool]:
    """AP (or AP@k) of one ranking, given which of its hits are relevant (in rank order, the query
    itself already left out) and how many relevant points the gallery holds; and whether the
    first hit is relevant. Every query kind is scored by this one function."""
    denominator = min(relevant, k) if k is not None else relevant
    if denominator == 0 or len(flags) == 0:
        return 0.0, bool(len(flags) and flags[0])
    precision = np.cumsum(flags) / np.arange(1, len(flags) + 1)
    return float((precision * flags).sum() / denominator), bool(flags[0])


def average_precision(
    hits: Sequence[Hit],
    label: str,
    relevant: int,
    *,
    skip_uri: str,
    k: int | None,
    label_field: str = "label",
    uri_of: Callable[[Hit], Any] = lambda h: h.payload.get("uri"),
) -> tuple[float, bool]:
    """AP (or AP@k) of one served ranking, and whether its first hit is relevant.

    ``relevant`` counts the gallery items with the query's label, the query itself excluded
    (the hit whose image, ``uri_of(hit)``, is ``skip_uri``).
    """
    ranked = [h for h in hits if uri_of(h) != skip_uri][:k]
    flags = np.array([label_text(payload_value(h.payload, label_field)) == label for h in ranked], dtype=bool)
    return ranked_precision(flags, relevant, k)


def served_retrieval(
    index: DualIndex,
    queries: Sequence[Query],
    *,
    k: int | None = None,
    batch: int = 64,
    root: Path | None = None,
    rerank: Rerank | None = None,
) -> Retrieval:
    """mAP (or mAP@k) and top-1 of the pair as it serves now, over ``queries``: labelled images
    (:class:`ImageItem`) or a text pair's judged queries (:class:`TextQuery`).

    ``rerank``: each query's merged first K re-scored by the new model (read from their source,
    each query within its own deadline, as one search of the pair); None: the plain merge.

    A query nothing in the gallery is relevant to is left out (with a warning): its AP would be
    0 whatever the pair serves. ``root`` resolves the gallery's relative image paths, so that a
    query that is itself in the gallery is recognised and left out of its own ranking.

    Raises:
        ConfigError: an image query has no label, or no query has a relevant gallery point.
    """
    return served_counts(index, queries, k=k, batch=batch, root=root, rerank=rerank)[0]


def served_counts(
    index: DualIndex,
    queries: Sequence[Query],
    *,
    k: int | None = None,
    batch: int = 64,
    root: Path | None = None,
    rerank: Rerank | None = None,
) -> tuple[Retrieval, int]:
    """:func:`served_retrieval`, and the old hits among a re-rank's first K that kept their merged
    distance (late, over budget, unreadable), over all queries (0 without a re-rank)."""
    text = bool(queries) and isinstance(queries[0], TextQuery)
    judge: Judge = TextJudge(index, queries) if text else ImageJudge(index, queries, root)  # type: ignore[arg-type]
    served = index.status()
    limit = (k or served.old_count + served.new_count) + 1  # one more: the query itself may come back
    aps, tops, missed = [], [], 0
    for start in range(0, len(judge.scored), batch):
        chunk = judge.scored[start : start + batch]
        found = _search(index, [judge.term(q) for q in chunk], limit, rerank)
        for query, hits in zip(chunk, found, strict=True):
            ap, top = ranked_precision(*judge.flags(query, hits, k), k)
            aps.append(ap)
            tops.append(top)
            missed += sum(1 for h in hits if h.rerank is not None and h.rerank not in RESCORED)
    hits_array = np.array(tops, dtype=bool)
    return Retrieval(float(np.mean(aps)), float(hits_array.mean()), hits_array), missed


def _search(index: DualIndex, terms: list[Any], limit: int, rerank: Rerank | None) -> list[list[Hit]]:
    """The served lists of a batch of queries: encoded in one pass; with a re-rank, searched one
    by one, so that each query has its own deadline and fetch budget, as a served search has."""
    if rerank is None:
        return index.search_batch(terms, limit=limit, rerank=None)
    new, old = index.query_vectors(terms)
    return [
        index.search_vectors_batch(new[i : i + 1], old[i : i + 1], limit=limit, rerank=rerank)[0]
        for i in range(len(terms))
    ]


def left_out(counts: Mapping[str, int], what: str, field: str, *, refuse: bool = True) -> None:
    """Warn of the queries whose label no gallery point carries (``refuse``: an error when none
    has one)."""
    absent = sorted(label for label, n in counts.items() if n == 0)
    if refuse and len(absent) == len(counts):
        raise ConfigError(
            f"no gallery point has a query's label in its payload field {field!r} "
            f"(query labels: {', '.join(sorted(counts)[:5])}...; compared as text)"
        )
    if absent:
        log.warning(
            "no gallery point is labelled %s: those %s are left out of mAP and top-1",
            ", ".join(repr(a) for a in absent[:5])
            + (f" and {len(absent) - 5} more" if len(absent) > 5 else ""),
            what,
        )


class ImageJudge:
    """Labelled image queries: relevant are the gallery points of the query's label; a query that
    is itself in the gallery (the same image) is left out of its own ranking."""

    def __init__(self, index: DualIndex, queries: Sequence[ImageItem], root: Path | None) -> None:
        if any(q.label is None for q in queries):
            raise ConfigError("served evaluation needs labelled queries: QUERIES/<label>/<image>")
        self.index, self.root, self.field = index, root, index.pair.label_field
        self.counts = _label_counts(index, {q.label for q in queries if q.label is not None})
        left_out(self.counts, "queries", self.field)
        self.scored = [q for q in queries if self.counts[q.label or ""]]
        self._keys: dict[str, Any] = {}  # a path is resolved once a call, not once a hit (37 us each)

    def term(self, query: ImageItem) -> Any:
        return query.uri

    def uri_of(self, hit: Hit) -> Any:
        uri = self.index.pair.uri_rule.find(hit.id, hit.payload)
        if not isinstance(uri, str):
            return uri
        if uri not in self._keys:
            self._keys[uri] = image_key(uri, self.root)
        return self._keys[uri]

    def flags(self, query: ImageItem, hits: Sequence[Hit], k: int | None) -> tuple[np.ndarray, int]:
        label, itself = query.label or "", image_key(query.uri)
        in_gallery = any(self.uri_of(h) == itself for h in hits) or _in_gallery(self.index, query)
        ranked = [h for h in hits if self.uri_of(h) != itself][:k]
        return _same_label(ranked, label, self.field), self.counts[label] - in_gallery


class TextJudge:
    """A text pair's judged queries (:mod:`~rm_qdrant.evaluation.queries`): relevant are the
    gallery points of the query's label, or the points it lists; a query that names its own
    gallery point (``id``) is left out of its own ranking."""

    def __init__(self, index: DualIndex, queries: Sequence[TextQuery]) -> None:
        if not all(isinstance(q, TextQuery) for q in queries):
            raise ConfigError("the queries are all text (TextQuery) or all images (ImageItem), not both")
        self.field = index.pair.label_field
        labels = {q.label for q in queries if q.label is not None}
        self.counts = _label_counts(index, labels) if labels else {}
        listed = {i for q in queries for i in (q.relevant or ())}
        listed |= {q.id for q in queries if q.id is not None}
        self.gallery = _served(index, sorted(listed, key=str))  # id -> payload, of those the pair serves
        self.count = {q: self._relevant(q) for q in queries}
        if labels:  # those of judged ids may still be scored: refused below if none is
            left_out(self.counts, "queries", self.field, refuse=False)
        self.scored = [q for q in queries if self.count[q]]
        unjudged = sum(1 for q in queries if q.relevant is not None and not self.count[q])
        if not self.scored:
            raise ConfigError(
                "no query has a relevant point in the gallery: no gallery point has a query's label in "
                f"its payload field {self.field!r} (compared as text), nor one of the ids it lists"
            )
        if unjudged:
            log.warning("%d queries list no id the gallery holds: left out of mAP and top-1", unjudged)

    def _relevant(self, query: TextQuery) -> int:
        """The gallery points relevant to ``query``, itself left out."""
        own = self.gallery.get(query.id) if query.id is not None else None
        if query.relevant is not None:
            return sum(1 for i in query.relevant if i in self.gallery and i != query.id)
        itself = own is not None and label_text(payload_value(own, self.field)) == query.label
        return self.counts.get(query.label or "", 0) - itself

    def term(self, query: TextQuery) -> str:
        return query.text

    def flags(self, query: TextQuery, hits: Sequence[Hit], k: int | None) -> tuple[np.ndarray, int]:
        ranked = [h for h in hits if query.id is None or h.id != query.id][:k]
        if query.relevant is not None:
            flags = np.array([h.id in query.relevant for h in ranked], dtype=bool)
        else:
            flags = _same_label(ranked, query.label or "", self.field)
        return flags, self.count[query]


Judge = ImageJudge | TextJudge


def _same_label(hits: Sequence[Hit], label: str, field: str) -> np.ndarray:
    return np.array([label_text(payload_value(h.payload, field)) == label for h in hits], dtype=bool)


def _served(index: DualIndex, ids: list[PointId]) -> dict[PointId, dict[str, Any]]:
    """The payloads of the points of ``ids`` the pair serves (from old, else new)."""
    pair, store, found = index.pair, index.store, {}
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000]
        if pair.serves_old:
            found.update({r.id: r.payload for r in store.retrieve(pair.old_collection, part)})
        rest = [i for i in part if i not in found]
        if rest and pair.serves_new:
            found.update({r.id: r.payload for r in store.retrieve(pair.new_collection, rest)})
    return found


def _in_gallery(index: DualIndex, query: ImageItem) -> bool:
    pair, store = index.pair, index.store
    found = bool(ids_in_new(store, pair, [query.point_id])) if pair.serves_new else False
    if not found and pair.serves_old:
        found = bool(store.retrieve(pair.old_collection, [query.point_id], with_payload=False))
    return found


def evaluate_served(
    index: DualIndex,
    queries: Sequence[Query],
    fractions: Sequence[float],
    *,
    options: MigrateOptions | None = None,
    k: int | None = None,
    rerank: Rerank | None = None,
    on_point: Callable[[ServedPoint], None] | None = None,
) -> list[ServedPoint]:
    """Migrate to each fraction in turn (ascending) and measure what the pair serves there
    (``rerank``: each search re-ranked so, as :func:`served_retrieval` says)."""
    base = options or MigrateOptions()
    points = []
    for t in sorted(fractions):
        run_migration(index, dataclasses.replace(base, until=t))
        r, missed = served_counts(index, queries, k=k, root=base.source.root, rerank=rerank)
        point = ServedPoint(t, index.progress(), r.map, r.top1, missed)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points
