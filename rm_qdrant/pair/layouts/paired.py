"""Two collections: the old model's points in ``old_collection``, the new model's in
``new_collection``. A migrated point is written to new, then deleted from old
(:class:`Paired`) or kept there marked and hidden for a rollback (:class:`PairedKeepOld`).

A user's write goes to new whole, keeping what it does not give from the copy the point
serves from; then the point leaves old, or (keep-old) is written to old too, hidden as
migrated points are (see :mod:`~rm_qdrant.pair.layouts.paired_writes`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import (
    ERROR,
    MIGRATED,
    MOVING,
    ORIGIN,
    ORIGIN_MIGRATE,
    SETTLED,
    Settlement,
    new_payload,
    settle,
    user_payload,
)
from rm_qdrant.errors import MigrationError
from rm_qdrant.pair.bypass import drop_orphans
from rm_qdrant.pair.confirm import having_vector
from rm_qdrant.pair.layouts.base import Claimed, DropPlan, EmbedLate, Layout, check_alias, check_all_moved
from rm_qdrant.pair.layouts.paired_writes import PairedWrites
from rm_qdrant.pair.outcome import BatchResult, Encoded, Prepared, record_failures
from rm_qdrant.pair.record import PairRecord, clear_bookkeeping, save_pair, save_unless_changed
from rm_qdrant.store import Record, Store, Where
from rm_qdrant.store.points import every_id
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)
#: Seconds between a batch's write to new and its removal from old where the store
#: takes DualIndex's two searches concurrently: longer than any skew between them.
REMOVAL_GRACE = 1.0
_OURS = Where(must={ORIGIN: ORIGIN_MIGRATE})
#: A copy of ours that no settle confirmed yet: where old's point is gone, a user deleted it. A
#: settled copy whose old point is gone was moved by another claimant (two may claim one point:
#: a search's promotion and a migration batch), and stays.
_UNSETTLED = Where(must={ORIGIN: ORIGIN_MIGRATE}, empty=(SETTLED,))
_MARKED = Where(not_empty=(MOVING,))  # an old copy a batch or a DualIndex write is moving
#: Rounds of bringing a batch's copies up to date with old (each needs a new update to land).
_CATCH_UP = 3


class Paired(PairedWrites, Layout):
    """Two collections; a migrated point leaves old."""

    rolls_back = False
    copies_payload = True

    def in_both(self, store: Store, where: Where | None = None) -> list[PointId]:
        """Points that serve from old and are already in new: a migration step cut short
        between its write to new and its removal from old. Search serves them once (from
        new) and the next ``rmq migrate`` finishes the step; counts must not take them twice.

        Only points marked ``rmq_moving`` can be in both, so this reads a few batches at most.
        With ``where``, only the points whose old copy matches it.
        """
        pair = self.pair
        if pair.state != "backfilling" or not store.has_collection(pair.old_collection):
            return []
        marking = self.old_where() & Where(not_empty=(MOVING,)) & (where or Where())
        marked = every_id(store, pair.old_collection, marking)
        found = store.retrieve(pair.new_collection, marked, with_payload=False) if marked else []
        return [r.id for r in found]

    def carried(self, store: Store) -> dict[str, OtherVector]:
        """The other vectors of the new collection that old has too, alike."""
        pair = self.pair
        new = store.collection(pair.new_collection, pair.vector).extra
        if not new or not store.has_collection(pair.old_collection):
            return {o.name: o for o in new}
        old = set(store.collection(pair.old_collection, pair.vector).extra)
        return {o.name: o for o in new if o in old}

    def migration_carries(self, store: Store) -> tuple[str, ...]:
        return tuple(self.carried(store))

    # -- the migration -------------------------------------------------------------

    def claim(self, store: Store, batch: list[PointId], others: tuple[str, ...]) -> Claimed:
        present = store.retrieve(self.pair.old_collection, batch, others=others)
        return Claimed(present, self.ids_in_new(store, [r.id for r in present]), None)

    def settle(self, store: Store, prepared: Prepared, encoded: Encoded, dim: int) -> BatchResult:
        """Insert-only write to new (a fresher write by a user wins), read back from new and old,
        bring copies that fell behind old up to date, retire the confirmed points from old,
        record the failures (see migrate.py)."""
        pair = self.pair
        written = encoded.ids
        if written:
            store.mark(pair.old_collection, written, {MOVING: 1})  # see in_both
            self._copy(store, prepared, written, encoded.vectors, [prepared.payloads[i] for i in written])
            log.debug("acknowledged %s", written)
        acknowledged = time.monotonic()
        batch = written + prepared.already_in_new
        shapes, in_new, in_old = self._confirm(store, prepared, batch, dim)
        outcome = settle(batch, in_new=shapes, still_in_old=in_old, dim=dim)
        outcome, rewritten = self._rewritten(store, outcome, in_old)
        if self._behind(outcome.remove_from_old, in_new, in_old):
            outcome = self._catch_up(store, prepared, outcome, in_new, in_old, dim)
            acknowledged = time.monotonic()
        if outcome.delete_from_new:  # only where the copy is still ours and unsettled: see Settlement
            store.delete(pair.new_collection, outcome.delete_from_new, where=_UNSETTLED)
        if store.capabilities.concurrent_search:  # see REMOVAL_GRACE
            time.sleep(max(0.0, acknowledged + REMOVAL_GRACE - time.monotonic()))
        if outcome.remove_from_old:  # before old's copy goes: another claimant must not delete it
            store.mark(pair.new_collection, outcome.remove_from_old, {SETTLED: 1}, where=_OURS)
        self.retire(store, outcome.remove_from_old)
        failed = prepared.failed + encoded.failed
        record_failures(store, pair.old_collection, failed)
        if len(outcome.unconfirmed) > rewritten:
            log.warning(
                "%d written points were not found in new; they stay in old",
                len(outcome.unconfirmed) - rewritten,
            )
        removed = set(outcome.remove_from_old)
        return BatchResult(
            moved=sum(i in removed for i in written),
            repaired=sum(i in removed for i in prepared.already_in_new),
            failed=failed,
            gone=prepared.gone + len(batch) - len(in_old),
            unconfirmed=len(outcome.unconfirmed),
            failed_again=sum(prepared.payloads[i].get(ERROR) is not None for i, _ in failed),
            rewritten=rewritten,
        )

    def _rewritten(
        self, store: Store, outcome: Settlement, in_old: dict[PointId, dict]
    ) -> tuple[Settlement, int]:
        """``outcome`` less the points rewritten in old by a writer that bypasses rm-qdrant since
        the batch marked them ``rmq_moving`` (a plain upsert replaced the mark; rm-qdrant's own
        writers keep ``rmq_moving`` or set ``rmq_migrated``): old's copy is the newer, so the
        migration's copy goes (only while it is still ours) and the point stays in old, to
        migrate again (see bypass.py); and how many there were."""
        ids = [i for i in outcome.remove_from_old if not {MOVING, MIGRATED} & set(in_old[i])]
        if not ids:
            return outcome, 0
        store.delete(self.pair.new_collection, ids, where=_OURS)
        log.warning(
            "%d points were rewritten in %r by a writer that bypasses rm-qdrant while they migrated; "
            "they stay in old and migrate again",
            len(ids),
            self.pair.old_collection,
        )
        return _replace(outcome, ids, Settlement([], [], ids)), len(ids)

    def _copy(
        self,
        store: Store,
        prepared: Prepared,
        ids: list[PointId],
        vectors: np.ndarray,
        old: list[dict[str, Any]],
    ) -> None:
        """Write the migration's copies of ``ids`` to new, insert-only, from their old payloads."""
        others = [prepared.others.get(i, {}) for i in ids] if prepared.others else None
        payloads = [new_payload(body) for body in old]
        vector = self.pair.vector
        store.upsert(
            self.pair.new_collection, ids, vectors, payloads, insert_only=True, vector=vector, others=others
        )

    def _confirm(
        self, store: Store, prepared: Prepared, batch: list[PointId], dim: int
    ) -> tuple[dict[PointId, tuple[int, dict[str, Any]]], dict[PointId, Record], dict[PointId, dict]]:
        """What :func:`settle` needs of ``batch`` (each copy's vector size and payload, old's
        payloads), and the copies read whole from new: only where a copy may differ from old,
        that is the points old changed since the batch read them, and those an earlier run
        copied. The others' copies were made from the payload old still has, so new is only
        asked which of them have the vector (a count, see confirm.py). A point gone from old
        passes as our copy: the settlement deletes it from new only while it is ours (``_OURS``)."""
        pair, earlier = self.pair, set(prepared.already_in_new)
        in_old = {r.id: r.payload for r in store.retrieve(pair.old_collection, batch)}
        unsure = [
            i
            for i in batch
            if i in earlier or (i in in_old and user_payload(in_old[i]) != user_payload(prepared.payloads[i]))
        ]
        in_new = self._read_new(store, unsure)
        shapes = _shapes(in_new)
        ours = (0, {ORIGIN: ORIGIN_MIGRATE})
        shapes.update((i, ours) for i in batch if i not in in_old and i not in in_new)
        sure = [i for i in batch if i in in_old and i not in in_new and i not in earlier]
        landed = having_vector(store, pair.new_collection, sure, pair.vector)
        shapes.update((i, (dim, ours[1])) for i in landed)
        return shapes, in_new, in_old

    def _read_back(
        self, store: Store, ids: list[PointId]
    ) -> tuple[dict[PointId, Record], dict[PointId, dict]]:
        """The points of ``ids`` in new (with their vectors) and their payloads in old."""
        in_old = store.retrieve(self.pair.old_collection, ids)
        return self._read_new(store, ids), {r.id: r.payload for r in in_old}

    def _read_new(self, store: Store, ids: list[PointId]) -> dict[PointId, Record]:
        pair = self.pair
        new = store.retrieve(pair.new_collection, ids, with_vectors=True, vector=pair.vector) if ids else []
        return {r.id: r for r in new}

    @staticmethod
    def _behind(
        ids: list[PointId], in_new: dict[PointId, Record], in_old: dict[PointId, dict]
    ) -> list[PointId]:
        """Of ``ids`` (in both), the migration's copies whose user payload is not old's: a user's
        ``set_payload`` landed in old after the batch read it (it writes old, then new)."""
        return [
            i
            for i in ids
            if i in in_new
            and in_new[i].payload.get(ORIGIN) == ORIGIN_MIGRATE
            and user_payload(in_new[i].payload) != user_payload(in_old[i])
        ]

    def _catch_up(
        self,
        store: Store,
        prepared: Prepared,
        outcome: Settlement,
        in_new: dict[PointId, Record],
        in_old: dict[PointId, dict],
        dim: int,
    ) -> Settlement:
        """Replace the copies that fell behind old with copies of old's payload, and settle them
        again, until none is behind (``_CATCH_UP`` rounds; then they stay in old for a later run).

        The store has no conditional payload write, so a copy is replaced by a delete that
        holds only while it is still ours (``_OURS``) and an insert-only write: a user's upsert
        landing at any moment wins. A copy whose image changed (its uri field) is not written
        again: its vector is the previous image's, so the point stays in old and the next run
        embeds it. The point serves from old meanwhile; a user's delete meanwhile is seen by the
        read that follows, which settles it as any batch (the copy goes)."""
        pair, behind = self.pair, self._behind(outcome.remove_from_old, in_new, in_old)
        for _ in range(_CATCH_UP):
            if not behind:
                return outcome
            store.delete(pair.new_collection, behind, where=_OURS)
            same = [i for i in behind if pair.uri_rule.same_image(i, in_new[i].payload, in_old[i])]
            if same:
                vectors = np.stack([np.asarray(in_new[i].vector) for i in same])
                self._copy(store, prepared, same, vectors, [in_old[i] for i in same])
            new_now, old_now = self._read_back(store, behind)
            again = settle(behind, in_new=_shapes(new_now), still_in_old=old_now, dim=dim)
            outcome = _replace(outcome, behind, again)
            in_new, in_old = {**in_new, **new_now}, {**in_old, **old_now}
            behind = self._behind(again.remove_from_old, in_new, in_old)
        if behind:
            log.warning(
                "%d points kept changing in old while their batch settled; they stay in old", len(behind)
            )
            store.delete(pair.new_collection, behind, where=_OURS)
            outcome = _replace(outcome, behind, Settlement([], [], behind))
        return outcome

    def retire(self, store: Store, ids: list[PointId]) -> None:
        """Take migrated points out of old's search: only the copies still marked ``rmq_moving``,
        in the same operation, so a plain upsert that landed since the batch read old back (a
        writer that bypasses rm-qdrant) stays, a stale copy's newer version (see bypass.py)."""
        store.delete(self.pair.old_collection, ids, where=_MARKED)

    # -- cutover, rollback, drop ---------------------------------------------------

    def finalize(self, store: Store, alias: str | None, drop_old: bool, embed_late: EmbedLate) -> PairRecord:
        """Record the cutover (state ``finalizing``), then point the alias at new."""
        pair = self.pair
        if pair.state == "finalizing":
            return self._complete_finalize(store, pair)
        if pair.state != "backfilling":
            raise MigrationError(f"pair {pair.name!r} is already {pair.state}")
        drop_orphans(store, pair)  # --keep-old: migrated points a writer deleted from old (bypass.py)
        check_all_moved(store, pair, self.old_where())
        self.check_finalize(store, alias, drop_old)
        starting = replace(
            pair, state="finalizing", alias=alias or pair.alias or pair.name, drop_old=drop_old
        )
        save_unless_changed(store, pair, starting, "finalize")
        return self._complete_finalize(store, starting)

    def check_finalize(self, store: Store, alias: str | None, drop_old: bool) -> None:
        name = alias or self.pair.alias or self.pair.name
        if name != self.pair.old_collection or not drop_old:
            check_alias(store, name)

    @staticmethod
    def _complete_finalize(store: Store, pair: PairRecord) -> PairRecord:
        name = pair.alias or pair.name
        if pair.drop_old and name == pair.old_collection and store.has_collection(pair.old_collection):
            # The application keeps its collection name: it becomes an alias of new. Queries
            # by that name fail between the drop and the alias (a moment); DualIndex is unaffected.
            store.delete_collection(pair.old_collection)
        if store.alias(name) != pair.new_collection:  # a resumed cutover may have moved it already
            store.set_alias(check_alias(store, name), pair.new_collection)
        if pair.drop_old and store.has_collection(pair.old_collection):
            store.delete_collection(pair.old_collection)
        clear_bookkeeping(store, pair)  # the team's collections, as its own code will read them
        updated = replace(pair, state="finalized")
        save_pair(store, updated)
        log.info("finalized %s: alias %s -> %s", pair.name, name, pair.new_collection)
        return updated

    def plan_drop(self, store: Store) -> DropPlan:
        pair = self.pair
        has_new = store.has_collection(pair.new_collection)
        in_new = store.count(pair.new_collection) if has_new else 0
        only_new = in_new - (self.kept_count(store) if in_new else 0)  # a user's writes are in new only
        return DropPlan(
            has_new, in_new, only_new, f"points live in {pair.new_collection!r} only", "both collections stay"
        )

    def delete_new(self, store: Store) -> bool:
        if store.has_collection(self.pair.new_collection):
            if store.count(self.pair.new_collection):
                return False
            store.delete_collection(self.pair.new_collection)
        return True

    def finalized_text(self, record: PairRecord, dropped: bool) -> str:
        text = f"pair {record.name!r} finalized: alias {record.alias!r} -> {record.new_collection}"
        return text + (f"; dropped {record.old_collection}" if dropped else "")

    def rolled_back_text(self, record: PairRecord) -> str:
        return f"pair {record.name!r} rolled back: alias {record.alias!r} -> {record.old_collection}"


class PairedKeepOld(Paired):
    """Two collections; a migrated point stays in old, marked and hidden, so a rollback serves
    the whole gallery with the old model at once."""

    old_overlaps = True
    rolls_back = True

    def old_where(self) -> Where:
        return Where(must_not={MIGRATED: 1})

    def serves_from_old(self, payload: Mapping[str, Any]) -> bool:
        return payload.get(MIGRATED) != 1

    @property
    def keeps_writes_in_old(self) -> bool:
        return self.pair.state == "backfilling"

    def kept_count(self, store: Store) -> int:
        return store.count(self.pair.old_collection, Where(must={MIGRATED: 1}))

    def retire(self, store: Store, ids: list[PointId]) -> None:
        retired = {MIGRATED: 1, ERROR: None, MOVING: None}
        store.mark(self.pair.old_collection, ids, retired, where=_MARKED)  # see Paired.retire


def _shapes(in_new: dict[PointId, Record]) -> dict[PointId, tuple[int, dict[str, Any]]]:
    """What :func:`~rm_qdrant.core.planning.settle` reads of new: each copy's vector size and payload."""
    return {i: (0 if r.vector is None else len(r.vector), r.payload) for i, r in in_new.items()}


def _replace(outcome: Settlement, ids: list[PointId], again: Settlement) -> Settlement:
    """``outcome`` with the fate of ``ids`` replaced by ``again``'s."""
    redone = set(ids)
    return Settlement(
        [i for i in outcome.remove_from_old if i not in redone] + again.remove_from_old,
        outcome.delete_from_new + again.delete_from_new,
        outcome.unconfirmed + again.unconfirmed,
    )
