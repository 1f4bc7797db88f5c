"""Cheap confirmations for a migration's read-backs: which points of a batch have a vector,
asked as a count (a fraction of a microsecond a point) instead of reading each vector back
(a list of floats and an array per point, of which only the length was used).

Qdrant keeps every named vector at its configured size, so a point that has the vector has
it at the right size: the count says all a read-back of the vectors said.
"""

from __future__ import annotations

from collections.abc import Sequence

from rm_qdrant.core.merge import PointId
from rm_qdrant.store import Store, Where
from rm_qdrant.store.filters import with_ids


def _among(ids: Sequence[PointId], vector: str) -> Where:
    return with_ids(ids) & Where(has_vector=(vector,))


def all_have_vector(store: Store, collection: str, ids: Sequence[PointId], vector: str) -> bool:
    """Whether every point of ``ids`` has ``vector`` (one count; ids that do not exist count as
    lacking it)."""
    return not ids or store.count(collection, _among(ids, vector)) == len(set(ids))


def having_vector(store: Store, collection: str, ids: Sequence[PointId], vector: str) -> set[PointId]:
    """The points of ``ids`` that have ``vector``: one count, and a read of their ids only
    when some do and some do not."""
    having = store.count(collection, _among(ids, vector)) if ids else 0
    if having in (0, len(set(ids))):
        return set(ids) if having else set()
    page, _ = store.scroll(collection, limit=len(ids), where=_among(ids, vector), with_payload=False)
    return {r.id for r in page}
