"""A pair's layout as one object: :func:`layout_of` gives the :class:`Layout` that every
command and :class:`~rm_qdrant.serving.dual.DualIndex` asks where the gallery's halves are
and how to act on them, instead of reading the record's ``layout`` and ``keep_old`` fields.

- :class:`Paired`: two collections; a migrated point leaves old.
- :class:`PairedKeepOld`: two collections; a migrated point stays in old, hidden, for a rollback.
- :class:`OneCollection`: one collection; a migrated point gains the new model's vector.
"""

from __future__ import annotations

from rm_qdrant.core.merge import PointId
from rm_qdrant.pair.layouts.base import Claimed, DropPlan, EmbedLate, Layout, Write
from rm_qdrant.pair.layouts.paired import REMOVAL_GRACE, Paired, PairedKeepOld
from rm_qdrant.pair.layouts.single import OneCollection
from rm_qdrant.pair.record import SINGLE, PairRecord
from rm_qdrant.store import Store, Where

__all__ = [
    "REMOVAL_GRACE",
    "Claimed",
    "DropPlan",
    "EmbedLate",
    "Layout",
    "OneCollection",
    "Paired",
    "PairedKeepOld",
    "Write",
    "active_where",
    "count_new",
    "ids_in_new",
    "layout_of",
    "new_where",
]


def layout_of(pair: PairRecord) -> Layout:
    """The layout object of ``pair`` (the record's ``layout`` and ``keep_old`` are read here only)."""
    if pair.layout == SINGLE:
        return OneCollection(pair)
    return PairedKeepOld(pair) if pair.keep_old else Paired(pair)


def active_where(pair: PairRecord) -> Where:
    """The old points that still serve from old."""
    return layout_of(pair).old_where()


def new_where(pair: PairRecord) -> Where:
    """The points of ``pair.new_collection`` that serve from new."""
    return layout_of(pair).new_where()


def count_new(store: Store, pair: PairRecord, where: Where | None = None) -> int:
    """How many points serve from new (that also match ``where``)."""
    return layout_of(pair).count_new(store, where)


def ids_in_new(store: Store, pair: PairRecord, ids: list[PointId]) -> set[PointId]:
    """Which of ``ids`` are in new (in one collection: have the new vector)."""
    return layout_of(pair).ids_in_new(store, ids)
