"""Served evaluation: the paper's metrics measured through the live pair (DualIndex over Qdrant).

Queries are labelled images (an ImageFolder); the gallery is whatever the pair
serves, each point labelled by its payload ``label``. A query that is itself in the
gallery (same ``uri``) is left out of its own ranking, as in the offline protocol.
Between fractions the pair is migrated with ``--until``, in the pair's backfill order.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rm_qdrant.core.merge import Hit
from rm_qdrant.core.metrics import Retrieval
from rm_qdrant.core.paths import integer_text, payload_value
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.indexing import ImageItem
from rm_qdrant.pair.layouts import active_where, count_new, ids_in_new
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Where

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedPoint:
    """Quality at one backfill state, as served."""

    t: float  # the fraction asked for
    fraction: float  # the fraction actually in new
    map: float
    top1: float


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
    denominator = min(relevant, k) if k is not None else relevant
    if denominator == 0 or len(flags) == 0:
        return 0.0, bool(len(flags) and flags[0])
    precision = np.cumsum(flags) / np.arange(1, len(flags) + 1)
    return float((precision * flags).sum() / denominator), bool(flags[0])


def served_retrieval(
    index: DualIndex,
    queries: Sequence[ImageItem],
    *,
    k: int | None = None,
    batch: int = 64,
    root: Path | None = None,
) -> Retrieval:
    """mAP (or mAP@k) and top-1 of the pair as it serves now, over ``queries``.

    A query whose label no gallery point carries is left out (with a warning): its AP would be
    0 whatever the pair serves. ``root`` resolves the gallery's relative image paths, so that a
    query that is itself in the gallery is recognised and left out of its own ranking.

    Raises:
        ConfigError: a query has no label, or no query's label is in the gallery.
    """
    if any(q.label is None for q in queries):
        raise ConfigError("served evaluation needs labelled queries: QUERIES/<label>/<image>")
    pair = index.pair
    counts = _label_counts(index, {q.label for q in queries if q.label is not None})
    absent = sorted(label for label, n in counts.items() if n == 0)
    if len(absent) == len(counts):
        raise ConfigError(
            f"no gallery point has a query's label in its payload field {pair.label_field!r} "
            f"(query labels: {', '.join(sorted(counts)[:5])}...; compared as text)"
        )
    if absent:
        log.warning(
            "no gallery point is labelled %s: those queries are left out of mAP and top-1",
            ", ".join(repr(a) for a in absent[:5])
            + (f" and {len(absent) - 5} more" if len(absent) > 5 else ""),
        )
    scored = [q for q in queries if counts[q.label or ""]]

    keys: dict[str, Any] = {}  # a path is resolved once a call, not once a hit (37 us each)

    def uri_of(hit: Hit) -> Any:
        uri = pair.uri_rule.find(hit.id, hit.payload)
        if not isinstance(uri, str):
            return uri
        if uri not in keys:
            keys[uri] = image_key(uri, root)
        return keys[uri]

    served = index.status()
    gallery = served.old_count + served.new_count
    limit = (k or gallery) + 1  # one more: the query itself may come back
    aps, tops = [], []
    for start in range(0, len(scored), batch):
        chunk = scored[start : start + batch]
        for query, hits in zip(chunk, index.search_batch([q.uri for q in chunk], limit=limit), strict=True):
            label, itself = query.label or "", image_key(query.uri)
            in_gallery = any(uri_of(h) == itself for h in hits) or _in_gallery(index, query)
            ap, top = average_precision(
                hits,
                label,
                counts[label] - in_gallery,
                skip_uri=itself,
                k=k,
                label_field=pair.label_field,
                uri_of=uri_of,
            )
            aps.append(ap)
            tops.append(top)
    hits_array = np.array(tops, dtype=bool)
    return Retrieval(float(np.mean(aps)), float(hits_array.mean()), hits_array)


def _in_gallery(index: DualIndex, query: ImageItem) -> bool:
    pair, store = index.pair, index.store
    found = bool(ids_in_new(store, pair, [query.point_id])) if pair.serves_new else False
    if not found and pair.serves_old:
        found = bool(store.retrieve(pair.old_collection, [query.point_id], with_payload=False))
    return found


def evaluate_served(
    index: DualIndex,
    queries: Sequence[ImageItem],
    fractions: Sequence[float],
    *,
    options: MigrateOptions | None = None,
    k: int | None = None,
    on_point: Callable[[ServedPoint], None] | None = None,
) -> list[ServedPoint]:
    """Migrate to each fraction in turn (ascending) and measure what the pair serves there."""
    base = options or MigrateOptions()
    points = []
    for t in sorted(fractions):
        run_migration(index, dataclasses.replace(base, until=t))
        r = served_retrieval(index, queries, k=k, root=base.source.root)
        point = ServedPoint(t, index.progress(), r.map, r.top1)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points
