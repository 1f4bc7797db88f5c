"""Point ids in the one form both backends agree on."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import InvalidPointId

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_CANONICAL_UUID = re.compile(_UUID)
#: Canonical UUIDs joined by newlines: a batch of them checked in one regex pass.
_CANONICAL_UUIDS = re.compile(rf"{_UUID}(?:\n{_UUID})*")
#: One past the largest integer id: Qdrant's ids are unsigned 64-bit (qdrant-client's local
#: mode stored 2**64 where the embedded store refused it; both refuse it here).
ID_END = 2**64


def normalize_id(point_id: object) -> PointId:
    """Return a point id in the one form both backends agree on.

    Qdrant ids are unsigned integers or UUIDs; UUIDs are returned as their
    canonical lower-case string whatever form they came in.
    """
    if type(point_id) is int and 0 <= point_id < ID_END:  # the hot path: what a backend returns
        return point_id
    if isinstance(point_id, bool):
        raise InvalidPointId(f"invalid point id {point_id!r}: ids are unsigned integers or UUIDs")
    if isinstance(point_id, (int, np.integer)):
        if not 0 <= point_id < ID_END:
            raise InvalidPointId(
                f"invalid point id {point_id}: ids are unsigned 64-bit integers (0 to 2**64 - 1) or UUIDs"
            )
        return int(point_id)
    if isinstance(point_id, uuid.UUID):
        return str(point_id)
    if isinstance(point_id, str):
        if _CANONICAL_UUID.fullmatch(point_id):  # already canonical: the hot path of a migration
            return point_id
        try:
            return str(uuid.UUID(point_id))
        except ValueError:
            shown = f"{point_id[:40]!r}..." if len(point_id) > 40 else repr(point_id)
            raise InvalidPointId(f"invalid point id {shown}: ids are unsigned integers or UUIDs") from None
    shown = f"{type(point_id).__name__} {point_id!r:.40}"
    raise InvalidPointId(f"invalid point id ({shown}): ids are unsigned integers or UUIDs")


def normalize_ids(ids: Iterable[object]) -> list[PointId]:
    """:func:`normalize_id` of each id; a batch of plain non-negative ints or of canonical UUID
    strings (the usual cases) is checked in one pass instead of one call per id."""
    listed = list(ids)
    if not listed:
        return []
    kinds = set(map(type, listed))
    if kinds == {int} and min(listed) >= 0 and max(listed) < ID_END:  # type: ignore[type-var]
        return listed  # type: ignore[return-value]
    if kinds == {str}:
        joined = "\n".join(listed)  # type: ignore[arg-type]
        # As long as n UUIDs and their n - 1 newlines: no id holds a newline of its own.
        if len(joined) == 37 * len(listed) - 1 and _CANONICAL_UUIDS.fullmatch(joined):
            return listed  # type: ignore[return-value]
    if kinds == {uuid.UUID}:  # what qdrant-edge returns for UUID ids
        return [str(i) for i in listed]
    return [normalize_id(i) for i in listed]
