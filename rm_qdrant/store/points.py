"""Points between a backend and rm-qdrant: records read back, scored hits, writes that skip
points deleted meanwhile, and every id a filter matches. Shared by both stores."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId, higher_is_closer
from rm_qdrant.store.base import MergedQuery, Record, ScoredRecord, Store, Where
from rm_qdrant.store.ids import normalize_id, normalize_ids
from rm_qdrant.store.vectors import SparseVector, read_vector


def present_ids(store: Store, name: str, ids: Sequence[PointId]) -> set[PointId]:
    """Which of ``ids`` the collection ``name`` holds (one retrieve, no payload)."""
    if not ids:
        return set()
    return {r.id for r in store.retrieve(name, list(ids), with_payload=False)}


def every_id(store: Store, name: str, where: Where | None = None, *, page: int = 10_000) -> list[PointId]:
    """The ids of every point of ``name`` that ``where`` matches, read a page at a time."""
    ids: list[PointId] = []
    offset: PointId | None = None
    while True:
        records, offset = store.scroll(name, limit=page, offset=offset, where=where, with_payload=False)
        ids += [r.id for r in records]
        if offset is None:
            return ids


def wanted(with_vectors: bool, vector: str, others: Sequence[str] = ()) -> Any:
    """What to ask a backend for: a named vector by name (a point without it then comes back
    without it), the unnamed one with the rest (it cannot be named alone)."""
    names = ([vector] if with_vectors else []) + list(others)
    if not names:
        return False
    return True if "" in names else names


def record_from(point: Any, with_vectors: bool, vector: str = "", others: Sequence[str] = ()) -> Record:
    """A backend's point (anything with ``id``, ``payload``, ``vector``) as a :class:`Record`.

    Named vectors come back as a mapping; the record keeps the one named ``vector``
    (None when the point lacks it) and, in ``others``, those of ``others`` the point has.
    """
    raw = point.vector if with_vectors or others else None
    extra: dict[str, Any] = {}
    if others and isinstance(raw, Mapping):
        extra = {name: read_vector(raw[name]) for name in others if raw.get(name) is not None}
    if isinstance(raw, Mapping):
        raw = raw.get(vector)
    array = None if raw is None or not with_vectors else np.asarray(raw, dtype=np.float32)
    return Record(normalize_id(point.id), dict(point.payload or {}), array, extra)


def records_from(
    points: Sequence[Any], with_vectors: bool, vector: str = "", others: Sequence[str] = ()
) -> list[Record]:
    """:func:`record_from` of each point, the batch at once: without vectors no per-point array,
    and the asked vector's rows stacked into one array (each record holds a row of it)."""
    if others:
        return [record_from(p, with_vectors, vector, others) for p in points]
    ids = normalize_ids([p.id for p in points])  # one pass for the batch, not a call per id
    if not with_vectors:
        return [Record(i, dict(p.payload or {})) for i, p in zip(ids, points, strict=True)]
    raws = [p.vector for p in points]
    raws = [r.get(vector) if isinstance(r, Mapping) else r for r in raws]
    present = [r for r in raws if r is not None]
    if len({len(r) for r in present}) > 1:  # multivectors of several rows: one array each
        rows: Any = (np.asarray(r, dtype=np.float32) for r in present)
    else:
        rows = iter(np.asarray(present, dtype=np.float32)) if present else iter(())
    return [
        Record(i, dict(p.payload or {}), None if r is None else next(rows))
        for i, p, r in zip(ids, points, raws, strict=True)
    ]


def scored_from(point: Any) -> ScoredRecord:
    """A backend's scored point as a :class:`ScoredRecord`."""
    return ScoredRecord(normalize_id(point.id), float(point.score), dict(point.payload or {}))


def merged_from(point: Any, query: MergedQuery) -> ScoredRecord:
    """A backend's point from a merged search: the formula's value back to the raw score, and
    whether it came from the new vector (asked for with the hit, so present only then)."""
    vectors = point.vector if isinstance(point.vector, Mapping) else {}
    score = higher_is_closer(query.distance) * float(point.score)
    return ScoredRecord(normalize_id(point.id), score, dict(point.payload or {}), query.new_vector in vectors)


def is_missing_point(exc: BaseException) -> bool:
    """Whether a backend error says a point id does not exist."""
    return "no point with id" in str(exc).lower()


def write_skipping_missing(
    write: Callable[[list[Any]], None], rows: list[Any], missing: Callable[[BaseException], bool]
) -> None:
    """``write(rows)`` at once; if a point was deleted meanwhile (``missing`` says so of the
    error), once per row, skipping the missing ones. A batch write that failed on one id may
    have written the rows before it, so ``write`` must be harmless to repeat (a conditional
    write, or the same values written twice)."""
    if not rows:
        return
    try:
        write(rows)
    except Exception as exc:
        if not missing(exc):
            raise
        for row in rows:
            try:
                write([row])
            except Exception as one:
                if not missing(one):
                    raise


def point_vectors(
    vector: str,
    rows: list[Any],
    others: Sequence[Mapping[str, Any]] | None,
    sparse: Callable[[SparseVector], Any],
    *,
    named: bool = True,
) -> list[Any]:
    """Each row's vectors as a backend takes them: ``{vector: row, **others}`` (``sparse`` turns a
    :class:`SparseVector` into the backend's own), or the bare row for the only vector of a
    single-vector collection (``named`` False, no others)."""
    if others is None:
        return [{vector: row} for row in rows] if named else rows
    return [
        {vector: row, **{k: sparse(v) if isinstance(v, SparseVector) else v for k, v in extra.items()}}
        for row, extra in zip(rows, others, strict=True)
    ]
