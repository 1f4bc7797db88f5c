"""A user's writes to a two-collection pair (:class:`~rm_qdrant.pair.layouts.paired.Paired`).

A write goes to new whole; what it does not give (the payload, where ``payloads`` or a point's
entry is None; the other vectors it does not name) is the point's as it serves now. Then the
point leaves old or, --keep-old with the old model's vectors, its copy in old is replaced and
hidden, for a rollback.

Which copy a point serves from, for what a write keeps: new's where it is a user's write (no
``rmq_origin``) or where old no longer serves the point (gone; --keep-old: hidden); otherwise,
while old still serves it, old's. New then holds at most the migration's copy of a batch
under way, made from old's payload as the batch read it; ``set_payload`` writes old first, and
the batch brings its copy up to date with old before it retires the point (``Paired.settle``):
old's is never behind that copy, the copy may be behind old's. Old is read before new: a batch
that retires the point between the two reads brought its copy up to date first.

Every prefix of a write's store operations serves each point once, as it was or as written,
and the next ``migrate`` (or the write run again) finishes it (see :meth:`PairedWrites._write`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import MIGRATED, MOVING, ORIGIN, ORIGIN_MIGRATE, user_payload

if TYPE_CHECKING:
    from rm_qdrant.pair.layouts.base import Write
    from rm_qdrant.pair.record import PairRecord
    from rm_qdrant.store import Record, Store
    from rm_qdrant.store.vectors import OtherVector


class PairedWrites:
    """The user-write half of :class:`~rm_qdrant.pair.layouts.paired.Paired` (a mixin)."""

    pair: PairRecord

    def serves_from_old(self, payload: Mapping[str, Any]) -> bool:
        """Whether a point of old, with this payload, serves from old (while backfilling)."""
        return True

    def _write(self, store: Store, write: Write, known: Mapping[str, OtherVector]) -> None:
        """Write new whole, then retire old's copy. While backfilling, old's copy is marked
        ``rmq_moving`` first (see ``Paired.in_both``): a write cut short after new serves once,
        from new, and the next ``migrate`` retires old's copy. --keep-old with ``old_vectors``:
        see :meth:`_write_both`."""
        pair, ids = self.pair, write.ids
        bodies, others = self._completed(store, write, known)
        if write.old_vectors is not None:
            self._write_both(store, write, bodies, others)
            return
        if write.old_there and pair.state == "backfilling":
            store.mark(pair.old_collection, ids, {MOVING: 1})
        store.upsert(pair.new_collection, ids, write.vectors, bodies, vector=pair.vector, others=others)
        if write.old_there:
            store.delete(pair.old_collection, ids)

    def _write_both(
        self, store: Store, write: Write, bodies: list[dict[str, Any]], others: list[dict] | None
    ) -> None:
        """--keep-old, with the old model's vectors: old's copy first, served and marked
        ``rmq_moving``; then new; then old's copy hidden. Cut short after old, a point new has no
        copy of serves the write from old (by the old model), and the next ``migrate`` embeds it;
        one new has a copy of serves that copy once until the next ``migrate`` replaces a
        migration's copy (a user's stays until the write runs again). Cut short after new, the
        point serves the write once, from new, and the next ``migrate`` hides old's copy. From
        old's write on, a rollback serves the write. (New first, a write cut short after new
        left old's previous copy, which the next ``migrate`` hid and a rollback then served.)"""
        pair, ids = self.pair, write.ids
        marked = [{**body, MOVING: 1} for body in bodies]
        store.upsert(pair.old_collection, ids, write.old_vectors, marked, vector=pair.vector, others=others)
        store.upsert(pair.new_collection, ids, write.vectors, bodies, vector=pair.vector, others=others)
        store.mark(pair.old_collection, ids, {MIGRATED: 1, MOVING: None})

    def _completed(
        self, store: Store, write: Write, known: Mapping[str, OtherVector]
    ) -> tuple[list[dict[str, Any]], list[dict] | None]:
        """Each point's payload and other vectors to write: the write's, and where it gives none,
        the point's as it serves (see the module's docstring)."""
        ids, bodies, others = write.ids, write.bodies, write.others
        lacking = bool(known) and any(set(known) - set(row) for row in (others or [{}]))
        keep = any(body is None for body in bodies)
        found = self._serving(store, ids, list(known) if lacking else [], keep, write.old_there)
        if keep:
            kept = {i: user_payload(r.payload) for i, r in found.items()}
            bodies = [kept.get(i, {}) if body is None else body for i, body in zip(ids, bodies, strict=True)]
        if lacking:
            given = others or [{} for _ in ids]
            others = [
                {**(found[i].others if i in found else {}), **row} for i, row in zip(ids, given, strict=True)
            ]
        carry = others if others and any(others) else None
        return [body or {} for body in bodies], carry

    def _serving(
        self, store: Store, ids: list[PointId], names: list[str], payload: bool, old_there: bool
    ) -> dict[PointId, Record]:
        """The copies of ``ids`` that serve (see the module's docstring), with the other vectors
        ``names``; read only where the write keeps a payload or lacks other vectors."""
        if not names and not payload:
            return {}
        pair, in_old = self.pair, {}
        if old_there and pair.state == "backfilling":  # old first: see the module's docstring
            old = store.retrieve(pair.old_collection, ids, others=names)
            in_old = {r.id: r for r in old if self.serves_from_old(r.payload)}
        new = store.retrieve(pair.new_collection, ids, with_payload=payload or bool(in_old), others=names)
        users = {r.id: r for r in new if r.id not in in_old or r.payload.get(ORIGIN) != ORIGIN_MIGRATE}
        return {**in_old, **users}
