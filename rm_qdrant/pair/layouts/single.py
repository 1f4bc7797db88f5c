"""One collection (``old_collection`` and ``new_collection`` are the same): the old model's
vector is ``pair.vector``, the new model's ``pair.new_using``. A migrated point gains the
new vector and keeps the old one until the cutover, so a rollback is always possible while
backfilling; old serves the points that lack the new vector, new those that have it.

A user's write with a payload writes each point whole, in one store operation (the vectors
given, the other vectors the point has, the payload), so a process killed at any moment leaves
the point as it was or as written; one that keeps the payload sets the vectors, then removes
the old vector where none was given. The search is one query that merges both vectors' hits
(two searches where the store cannot).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import BATCH, ERROR
from rm_qdrant.errors import ConfigError, MigrationError, StoreError
from rm_qdrant.pair.confirm import all_have_vector, having_vector
from rm_qdrant.pair.layouts.base import (
    Claimed,
    DropPlan,
    EmbedLate,
    Layout,
    Write,
    check_all_moved,
)
from rm_qdrant.pair.outcome import BatchResult, Encoded, Prepared, record_failures
from rm_qdrant.pair.record import PairRecord, clear_bookkeeping, save_pair, save_unless_changed
from rm_qdrant.store import Store, Where
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)


class OneCollection(Layout):
    """The single-collection layout."""

    one_query = True
    old_overlaps = True

    def old_where(self) -> Where:
        return Where(lacks_vector=(self.pair.new_using,))

    def new_where(self) -> Where:
        return Where(has_vector=(self.pair.new_using,))

    @property
    def keeps_writes_in_old(self) -> bool:
        return self.pair.state == "backfilling"

    @property
    def arrow(self) -> str:
        pair = self.pair
        return f"{pair.old_collection}: vector {pair.vector!r} -> {pair.new_using!r}"

    @property
    def created(self) -> str:
        return self.arrow

    @property
    def new_half(self) -> str:
        return f"vector {self.pair.new_using!r}"

    @property
    def old_place(self) -> str:
        return f"{self.pair.old_collection} (vector {self.pair.vector!r})"

    @property
    def new_place(self) -> str:
        return f"{self.pair.new_collection} (vector {self.pair.new_using!r})"

    @property
    def new_model_key(self) -> str:
        return f"{self.pair.new_collection}/{self.pair.new_using}"

    @property
    def index_vector(self) -> str | None:
        return self.pair.vector

    @property
    def managed(self) -> dict[str, str]:
        return {self.pair.vector: "the old model's vector", self.pair.new_using: "the new model's vector"}

    def finishing_migration(self) -> bool:
        return True

    # -- counts and reads ---------------------------------------------------------

    def ids_in_new(self, store: Store, ids: list[PointId]) -> set[PointId]:
        """Which of ``ids`` have the new vector."""
        return having_vector(store, self.pair.new_collection, ids, self.pair.new_using)

    def stored_points(self, store: Store) -> int:
        return store.count(self.pair.old_collection)

    def old_dim(self, store: Store) -> int | None:
        pair = self.pair
        if pair.vector not in store.collection(pair.old_collection, pair.new_using).vectors:
            return None
        return store.collection(pair.old_collection, pair.vector).dim

    def has_new_vector(self, store: Store) -> bool:
        pair = self.pair
        return store.has_collection(pair.old_collection) and pair.new_using in self._vectors(store)

    def _vectors(self, store: Store) -> Mapping[str, Any]:
        return store.collection(self.pair.old_collection, self.pair.vector).vectors

    def carried(self, store: Store) -> dict[str, OtherVector]:
        """Every vector but the old and new model's (they stay put when a point migrates)."""
        spec = store.collection(self.pair.new_collection, self.pair.new_using)
        return {o.name: o for o in spec.extra if o.name != self.pair.vector}

    # -- a user's writes -----------------------------------------------------------

    def _write(self, store: Store, write: Write, known: Mapping[str, OtherVector]) -> None:
        """A point whose payload is given is written whole, in one operation (the vectors given,
        the other vectors it has, the payload): killed before it, the point is as it was; after,
        as written. A point whose payload is kept gets its vectors set in one operation, then
        loses its old vector where the write has none (killed between the two, it serves the
        new vector and keeps the old one of the same image)."""
        pair, ids = self.pair, write.ids
        name = pair.new_collection
        old_kept = self._old_vector_kept(store, write)  # refused here: nothing written yet
        extras = write.others or [{} for _ in ids]
        if write.old_vectors is not None:
            extras = [
                {**e, pair.vector: row} for e, row in zip(extras, write.old_vectors.tolist(), strict=True)
            ]
        absent = [n for n in known if any(n not in e for e in extras)]  # other vectors a point keeps
        found = {r.id: r for r in store.retrieve(name, ids, with_payload=False, others=absent)}
        keep = [k for k, i in enumerate(ids) if write.bodies[k] is None and i in found]
        whole = [k for k in range(len(ids)) if write.bodies[k] is not None or ids[k] not in found]
        if whole:
            others = [{**(found[ids[k]].others if ids[k] in found else {}), **extras[k]} for k in whole]
            store.upsert(
                name,
                [ids[k] for k in whole],
                write.vectors[whole],
                [write.bodies[k] or {} for k in whole],
                vector=pair.new_using,
                others=others if any(others) else None,
            )
        if keep:
            kept_ids = [ids[k] for k in keep]
            others = _pick(extras, keep, {})
            store.set_vectors(name, kept_ids, write.vectors[keep], vector=pair.new_using, others=others)
            if old_kept and write.old_vectors is None:  # the previous image's must not stay
                self._drop_old(store, kept_ids)

    def _old_vector_kept(self, store: Store, write: Write) -> bool:
        """Whether the collection still has the old vector. A write that carries old vectors
        after a cutover dropped it (a DualIndex opened before ``finalize --drop-old``) is
        refused before anything is written."""
        pair = self.pair
        there = self._has_old(store)
        if write.old_vectors is not None and not there:
            raise MigrationError(
                f"pair {pair.name!r} was finalized and its old vector {pair.vector!r} dropped: nothing "
                "was written; refresh() the DualIndex (it then writes the new vector alone)"
            )
        return there

    def _has_old(self, store: Store) -> bool:
        return self.pair.vector in store.collection(self.pair.new_collection, self.pair.new_using).vectors

    def _drop_old(self, store: Store, ids: list[PointId]) -> None:
        pair = self.pair
        try:
            store.delete(pair.new_collection, ids, vectors=(pair.vector,))
        except StoreError:
            if self._has_old(store):
                raise
            # a cutover dropped the vector since the check: nothing left to remove

    def delete(self, store: Store, ids: list[PointId], old_there: bool) -> None:
        store.delete(self.pair.new_collection, ids)

    # -- the migration -------------------------------------------------------------

    def claim(self, store: Store, batch: list[PointId], others: tuple[str, ...]) -> Claimed:
        """Put the batch's token on its points before reading their payloads (a rewrite from
        here on removes it: see migrate.py); a count says which have the new vector (read only if some do)."""
        pair, token = self.pair, uuid.uuid4().hex
        store.mark(pair.old_collection, batch, {BATCH: token})
        present = store.retrieve(pair.old_collection, batch)
        done = having_vector(store, pair.old_collection, [r.id for r in present], pair.new_using)
        return Claimed(present, done, token)

    def settle(self, store: Store, prepared: Prepared, encoded: Encoded, dim: int) -> BatchResult:
        """Add the new vector where the point still lacks it and still has the batch's token (a
        user's write wins; a deleted point stays deleted), read back, record failures."""
        pair = self.pair
        written = encoded.ids
        if written:
            ours = self.old_where() & Where(must={BATCH: prepared.token})
            store.set_vectors(
                pair.old_collection, written, encoded.vectors, vector=pair.new_using, where=ours
            )
            log.debug("acknowledged %s", written)
        back = store.retrieve(pair.old_collection, written)  # a count confirms the vectors; if short:
        confirmed = {r.id: r.payload for r in back}
        if not all_have_vector(store, pair.old_collection, list(confirmed), pair.new_using):
            back = store.retrieve(pair.old_collection, written, with_vectors=True, vector=pair.new_using)
            confirmed = {r.id: r.payload for r in back if r.vector is not None and len(r.vector) == dim}
        # A rewrite that copied the payload it read (token included) and changed the image
        # passes the condition: the vector is the previous image's, so it goes again. (A write
        # without the token is the user's own: the conditional write did not touch it.)
        rule = pair.uri_rule
        stale = [
            i
            for i, now in confirmed.items()
            if now.get(BATCH) == prepared.token and not rule.same_image(i, prepared.payloads[i], now)
        ]
        if stale:
            store.delete(pair.old_collection, stale, vectors=(pair.new_using,))
            for i in stale:
                del confirmed[i]
        retried = [i for i, payload in confirmed.items() if payload.get(ERROR) is not None]
        if retried:
            store.mark(pair.old_collection, retried, {ERROR: None})
        failed = prepared.failed + encoded.failed
        record_failures(store, pair.old_collection, failed)
        unconfirmed = len(back) - len(confirmed)  # rewritten meanwhile without the new vector
        if unconfirmed:
            log.warning("%d points were rewritten meanwhile without the new vector", unconfirmed)
        return BatchResult(
            moved=len(confirmed),
            repaired=0,
            failed=failed,
            gone=prepared.gone + len(written) - len(back),
            unconfirmed=unconfirmed,
            failed_again=sum(prepared.payloads[i].get(ERROR) is not None for i, _ in failed),
        )

    def shard_where(self, store: Store, shard: tuple[int, int], buckets: Where) -> Where:
        """Qdrant's own slices of the ids, where the store takes them, else ``buckets``."""
        sliced = Where(slice=shard)
        try:
            store.count(self.pair.old_collection, sliced)
            return sliced
        except StoreError as exc:
            log.info("slices refused (%s): sharding by rank buckets", exc)
        return buckets

    # -- cutover, rollback, drop ---------------------------------------------------

    def finalize(self, store: Store, alias: str | None, drop_old: bool, embed_late: EmbedLate) -> PairRecord:
        """Serve the new vector alone; ``drop_old`` deletes the old vector, now or, on a finalized
        pair, later. The application then searches ``using`` the new vector.

        Code that still writes only the old vector may rewrite or add a point after the count
        that lets the cutover start: such points lack the new vector, and lose every vector when
        the old one is dropped. ``embed_late`` embeds them with the new model before the drop (a
        point that cannot be stops the cutover with its old vector kept), again after it (from
        then on such a write is refused: the old vector no longer exists), and once more after
        the ``finalized`` record, so that one written at any moment before the record is served.
        Run again on a finalized pair, it embeds the points that lack the new vector (killed
        before that last pass, or written later by old code), or says the pair is finalized."""
        self.check_finalize(store, alias, drop_old)
        pair = self.pair
        if pair.state == "finalized" and not (drop_old and not pair.drop_old):
            if self._embed_after_record(store, replace(pair, state="finalizing"), embed_late):
                return pair
            raise MigrationError(f"pair {pair.name!r} is already finalized")
        if pair.state == "finalized":
            pair = replace(pair, state="finalizing", drop_old=True)
        elif pair.state not in ("backfilling", "finalizing"):
            raise MigrationError(f"pair {pair.name!r} is already {pair.state}")
        if pair.state == "backfilling":
            check_all_moved(store, pair, self.old_where())
            pair = replace(pair, state="finalizing", drop_old=drop_old)
        # recorded first: a run killed from here on is completed by a rerun
        save_unless_changed(store, self.pair, pair, "finalize")
        embed_late(pair)
        if pair.drop_old and self._has_old(store):
            store.drop_vector(pair.old_collection, pair.vector)
            embed_late(pair)
        clear_bookkeeping(store, pair)
        updated = replace(pair, state="finalized")
        save_pair(store, updated)
        self._embed_after_record(store, pair, embed_late)
        log.info("finalized %s: %s serves vector %s", pair.name, pair.old_collection, pair.new_using)
        return updated

    def _embed_after_record(self, store: Store, pair: PairRecord, embed_late: EmbedLate) -> bool:
        """Embed the points written without the new vector by old code up to the ``finalized``
        record, which the passes before it could not see (``pair``: the record as it was
        finalizing). A point that cannot be embedded puts the pair back to ``finalizing``, so
        that nothing reads as done and a rerun completes it. Returns whether there were any."""
        if not store.count(pair.old_collection, self.old_where()):
            return False
        try:
            embed_late(pair)
        except MigrationError:
            save_pair(store, pair)
            raise
        clear_bookkeeping(store, pair)
        return True

    def check_finalize(self, store: Store, alias: str | None, drop_old: bool) -> None:
        if alias is not None:
            pair = self.pair
            raise ConfigError(
                f"pair {pair.name!r} is one collection: there is no alias to move; the application searches "
                f"{pair.old_collection!r} using the vector {pair.new_using!r} from now on"
            )

    def check_rollback(self, alias: str | None) -> None:
        super().check_rollback(alias)
        pair = self.pair
        if pair.state != "backfilling":
            raise MigrationError(f"pair {pair.name!r} is {pair.state}: the old vector no longer serves")
        if alias is not None:
            raise ConfigError(
                f"pair {pair.name!r} is one collection: there is no alias to move (drop --alias)"
            )

    def rollback_alias(self, alias: str | None) -> str | None:
        return None

    def plan_drop(self, store: Store) -> DropPlan:
        pair = self.pair
        has_new = self.has_new_vector(store)
        in_new = self.count_new(store) if has_new else 0
        only_new = store.count(pair.old_collection, Where(lacks_vector=(pair.vector,))) if in_new else 0
        return DropPlan(
            has_new,
            in_new,
            only_new,
            f"points of {pair.old_collection!r} hold only the new vector {pair.new_using!r}",
            "the collection and both vectors stay",
        )

    def delete_new(self, store: Store) -> bool:
        if self.has_new_vector(store):
            if self.count_new(store):  # written to since the drop began: keep it
                return False
            store.drop_vector(self.pair.old_collection, self.pair.new_using)
        return True

    def vector_copies(self) -> list[tuple[str, str, Where]]:
        return [(self.pair.new_collection, self.pair.new_using, self.new_where())]

    def finalized_text(self, record: PairRecord, dropped: bool) -> str:
        text = (
            f"pair {record.name!r} finalized: {record.old_collection!r} serves vector {record.new_using!r} "
            f"(search it with using={record.new_using!r})"
        )
        return text + (
            f"; dropped vector {record.vector!r}" if record.drop_old else f"; vector {record.vector!r} kept"
        )

    def rolled_back_text(self, record: PairRecord) -> str:
        serves = f"{record.old_collection!r} serves vector {record.vector!r} again"
        return f"pair {record.name!r} rolled back: {serves}"


def _pick(rows: list[Any], picked: list[int], nothing: Any) -> list[Any] | None:
    """The rows ``picked``, or None where each is ``nothing`` (the plain write: nothing to carry)."""
    chosen = [rows[k] for k in picked]
    return None if all(row == nothing for row in chosen) else chosen
