"""Point operations across a pair, in qdrant-client's vocabulary: ``set_payload``, ``retrieve``
and ``count`` on :class:`~rm_qdrant.serving.dual.DualIndex`, for a service that does not know
where a point currently lives.

Each reads or writes the points as search serves them: the same sides (old, new) and the same
filters (a keep-old pair's hidden copies and a single collection's migrated points are not
served from old; a side serves only the points that have its vector).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from qdrant_client import models

from rm_qdrant.core.merge import PointId, Source
from rm_qdrant.core.planning import INTERNAL_FIELDS, user_payload
from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.bypass import stale_copies, unmarked
from rm_qdrant.pair.record import SINGLE
from rm_qdrant.serving.search_options import SearchOptions, selector
from rm_qdrant.store import Filter, Where
from rm_qdrant.store.bounds import check_payload
from rm_qdrant.store.filters import as_where, with_ids
from rm_qdrant.store.ids import normalize_id
from rm_qdrant.store.points import every_id

if TYPE_CHECKING:
    from rm_qdrant.pair.layouts import Layout
    from rm_qdrant.pair.record import PairRecord
    from rm_qdrant.store import Store


@dataclass(frozen=True)
class PairPoint:
    """One point as the pair serves it (:meth:`PairPoints.retrieve`).

    Attributes:
        id: the point's id.
        payload: its payload, without rm-qdrant's bookkeeping fields.
        source: ``"old"`` or ``"new"``: the side it serves from.
        vector: its vector as that side stores it (``with_vectors=True`` only).
    """

    id: PointId
    payload: dict[str, Any]
    source: Source
    vector: np.ndarray | None = None


@dataclass(frozen=True)
class _Side:
    """Where one half of the pair serves: its collection, its vector, the points it serves."""

    source: Source
    collection: str
    vector: str
    where: Where


class PairPoints:
    """``set_payload``, ``retrieve`` and ``count`` across the pair (a mixin of DualIndex)."""

    store: Store
    pair: PairRecord
    layout: Layout

    def set_payload(
        self,
        payload: Mapping[str, Any],
        points: Sequence[PointId] | Filter | models.PointIdsList | models.FilterSelector,
        *,
        key: str | None = None,
    ) -> None:
        """Merge ``payload`` into the payloads of ``points``, wherever each serves from.

        ``points`` is a list of ids or a filter (a qdrant-client ``models.Filter``, or a dict:
        see :data:`rm_qdrant.store.Filter`), which selects the points as search serves them.
        While a rollback is possible (a ``--keep-old`` pair, backfilling) the point's hidden
        copy in old is updated too, so a rollback serves the update. The write goes to old
        first, then new: a migration batch that read the point before the update finds it in
        old when it settles, and brings its copy in new up to date (see ``Paired.settle``); a
        user's write that keeps the payload meanwhile takes old's (see ``upsert_vectors``). Cut
        short between the two writes (the process killed), the update serves where the point
        serves from old, not yet where it serves from new: running it again finishes it.

        Args:
            payload: the fields to set (other fields stay as they are).
            points: ids, or a filter.
            key: qdrant-client's nested key: not supported, refused.

        Raises:
            ConfigError: a ``key``; a field rm-qdrant keeps its bookkeeping in (``rmq_*``);
                ``points`` that are neither ids nor a filter.

        Example:
            >>> index.set_payload({"in_stock": False}, [17, 42])  # doctest: +SKIP
            >>> index.set_payload({"sale": True}, {"label": "shoes"})  # doctest: +SKIP
        """
        if key is not None:
            raise ConfigError(
                f"set_payload(key={key!r}): a nested key is not supported; set the whole top-level field"
            )
        if not isinstance(payload, Mapping) or not all(isinstance(k, str) for k in payload):
            raise ConfigError(
                f"a payload is a mapping of field names to values, not {type(payload).__name__}"
            )
        payload = check_payload(payload)  # before anything is written
        ours = sorted(set(payload) & set(INTERNAL_FIELDS))
        if ours:
            raise ConfigError(
                f"set_payload: {', '.join(ours)} are rm-qdrant's own fields (rmq_*); rename them"
            )
        ids = self._selected(points)
        if not ids or not payload:
            return
        pair = self.pair
        places = []
        if pair.serves_old or self.layout.keeps_writes_in_old:
            places.append(pair.old_collection)
        if pair.serves_new:
            places.append(pair.new_collection)
        for name in dict.fromkeys(places):  # old first (see above); one collection: one write
            self.store.mark(name, ids, dict(payload))

    def retrieve(
        self,
        ids: Sequence[PointId],
        *,
        with_payload: bool | Sequence[str] = True,
        with_vectors: bool = False,
    ) -> list[PairPoint]:
        """The points of ``ids`` as the pair serves them, in the order given; ids the pair does
        not serve are skipped (as qdrant-client's ``retrieve``).

        A point serves from new once it is there (a point caught in both collections too),
        otherwise from old; a keep-old pair's hidden copies only after a rollback. A point whose
        old copy a writer that bypasses rm-qdrant rewrote after it migrated serves from old (its
        copy in new is stale: see bypass.py).

        Args:
            with_payload: True, False (empty payloads) or the field names to return.
            with_vectors: give each point its vector, as its side stores it.

        Example:
            >>> [(p.id, p.source) for p in index.retrieve([17, 42])]  # doctest: +SKIP
            [(17, 'new'), (42, 'old')]
        """
        SearchOptions(with_payload=with_payload, with_vectors=with_vectors)  # checks both
        wanted = list(dict.fromkeys(normalize_id(i) for i in id_list(ids)))
        found: dict[PointId, PairPoint] = {}
        has_id, kept, newer = with_ids(wanted), selector(with_payload), set()
        paired = self.pair.layout != SINGLE
        for side in self._sides() if wanted else []:  # old first: new's copy wins, unless stale
            records, _ = self.store.scroll(
                side.collection,
                limit=len(wanted),
                where=side.where & has_id,
                with_vectors=with_vectors,
                vector=side.vector,
                with_payload=with_payload is not False or (paired and side.source == "old"),
            )
            if paired and side.source == "old" and self.pair.state == "backfilling":
                newer = {r.id for r in records if unmarked(r.payload)}
            for r in records:
                if side.source == "new" and r.id in newer:
                    continue
                found[r.id] = PairPoint(r.id, kept(user_payload(r.payload)), side.source, r.vector)
        return [found[i] for i in wanted if i in found]

    def count(self, filter: Filter | None = None, *, exact: bool = True) -> int:
        """How many points the pair serves (that match ``filter``), each counted once.

        ``exact`` is accepted as qdrant-client's; the count is always exact. While a migration
        runs, a count may be off by the points of the batch it is settling at that moment.

        Example:
            >>> index.count({"label": "cat"})  # doctest: +SKIP
            1204
        """
        if not isinstance(exact, bool):
            raise ConfigError(f"exact is True or False, got {exact!r}")
        where = as_where(filter) or Where()
        sides = self._sides()
        total = sum(self.store.count(s.collection, s.where & where) for s in sides)
        # Before the first ranking every old point is unmarked: the check would read all of the
        # smaller side's ids each count, for points no migration moved yet; the run's sweep drops them.
        ranked = len(sides) == 2 and self.pair.order_ready
        stale = stale_copies(self.store, self.pair, sides[0].where) if ranked else []
        if stale:  # served from old: their copies in new do not count (see bypass.py)
            total -= self.store.count(self.pair.new_collection, sides[1].where & where & with_ids(stale))
        return total - len(self._served_twice(where))

    # -- where the pair serves ---------------------------------------------------------

    def _sides(self) -> list[_Side]:
        """The sides search reads, old first, each with the filter of the points it serves."""
        pair, sides = self.pair, []
        if pair.serves_old:
            hidden = as_where(self.layout.old_filter(None)) or Where()
            sides.append(_Side("old", pair.old_collection, pair.vector, hidden & _having(pair.vector)))
        if pair.serves_new:
            sides.append(_Side("new", pair.new_collection, pair.new_using, _having(pair.new_using)))
        return sides

    def _served_twice(self, where: Where) -> list[PointId]:
        """Points both sides hold (a paired migration step cut short) whose old copy matches
        ``where``: search serves such a point from new alone (see search_options.without_copies),
        so its old copy is not counted; its new copy is, where it matches."""
        sides = self._sides()
        if len(sides) < 2:
            return []
        return self.layout.in_both(self.store, sides[0].where & where)

    def _selected(self, points: Any) -> list[PointId]:
        """The ids ``set_payload`` writes: the ids given, or the served points a filter matches."""
        if isinstance(points, models.PointIdsList):
            points = points.points
        elif isinstance(points, models.FilterSelector):
            points = points.filter
        if isinstance(points, (models.Filter, Where, Mapping)):
            return self._matching(as_where(points) or Where())
        return list(dict.fromkeys(normalize_id(i) for i in id_list(points)))

    def _matching(self, where: Where) -> list[PointId]:
        """The served points ``where`` matches: a point in both (see _served_twice) by its new copy."""
        ids: dict[PointId, None] = {}
        moved = set(self._served_twice(Where()))
        for side in self._sides():
            found = every_id(self.store, side.collection, side.where & where)
            ids.update(dict.fromkeys(i for i in found if side.source == "new" or i not in moved))
        return list(ids)


def id_list(ids: Any) -> list[Any]:
    """``ids`` as a list, refused in one line where it is not a collection of ids."""
    if isinstance(ids, (models.Filter, models.FilterSelector, Where, Mapping)):  # iterable: its fields
        raise ConfigError(f"this call takes a list of point ids, not a filter ({type(ids).__name__})")
    if isinstance(ids, models.PointIdsList):
        return list(ids.points)
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise ConfigError(f"points are a list of ids or a filter, not {type(ids).__name__}")
    return list(ids)


def _having(vector: str) -> Where:
    """The points that have ``vector`` (every point has a collection's unnamed vector)."""
    return Where(has_vector=(vector,)) if vector else Where()
