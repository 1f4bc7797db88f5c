"""What every layout answers: where a pair's old and new halves live and how each is
filtered, counted, written, migrated, cut over, rolled back and dropped.

A :class:`~rm_qdrant.pair.record.PairRecord` is the stored record; its layout object
(:func:`rm_qdrant.pair.layouts.layout_of`) is how the code acts on it. The commands and
:class:`~rm_qdrant.serving.dual.DualIndex` ask the layout instead of reading the record's
``layout`` and ``keep_old`` fields. The filters and descriptions need no store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.pair.outcome import BatchResult, Encoded, Prepared, waiting_refusal
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.store import Filter, Record, Store, Where
from rm_qdrant.store.filters import as_where
from rm_qdrant.store.points import present_ids
from rm_qdrant.store.vectors import OtherVector

log = logging.getLogger(__name__)

#: Embeds, with the new model, the points of a single-collection pair that lack the new
#: vector (the cutover's late writes); given by the caller, which owns the migration.
EmbedLate = Callable[[PairRecord], None]


@dataclass(frozen=True)
class Write:
    """One checked user write: the new model's vectors, and what goes with them.

    Attributes:
        bodies: each point's payload (rm-qdrant's fields removed), or None: keep the point's.
        old_vectors: the old model's vectors, where they go to old (None: they do not).
        others: each point's other vectors given (name -> value), or None: none given.
        old_there: the old vectors still exist (not dropped by a cutover).
    """

    ids: list[PointId]
    vectors: np.ndarray
    bodies: list[dict[str, Any] | None]
    old_vectors: np.ndarray | None
    others: list[dict[str, Any]] | None
    old_there: bool


@dataclass(frozen=True)
class Claimed:
    """A batch as a migration first reads it: the points still there, which are done already,
    and the token a single-collection batch put on them."""

    present: list[Record]
    done: set[PointId]
    token: str | None


@dataclass(frozen=True)
class DropPlan:
    """What dropping a pair finds: whether the new half exists, its points, those only it holds."""

    has_new: bool
    in_new: int
    only_new: int
    where: str  # for the refusal: where the points that would be stranded are
    stays: str  # for the refusal: what --force keeps


class Layout:
    """One pair's layout. Subclasses: :class:`~rm_qdrant.pair.layouts.paired.Paired`,
    :class:`~rm_qdrant.pair.layouts.paired.PairedKeepOld`,
    :class:`~rm_qdrant.pair.layouts.single.OneCollection`."""

    #: The search is one merged query (both vectors in one collection), not two searches.
    one_query = False
    #: While backfilling, old also holds points that serve from new (hidden by ``old_where``).
    old_overlaps = False
    #: Old keeps every point until the cutover, so the old model can serve the gallery again.
    rolls_back = True
    #: A migrated point's payload is written anew, as a copy in new (the two-collection layouts).
    copies_payload = False

    def __init__(self, pair: PairRecord) -> None:
        self.pair = pair

    # -- where the halves are, as filters (no store) ---------------------------------

    def old_where(self) -> Where:
        """The points of ``old_collection`` that still serve from old."""
        return Where()

    def new_where(self) -> Where:
        """The points of ``new_collection`` that serve from new."""
        return Where()

    def old_filter(self, filter: Filter | None) -> Filter | None:
        """The filter a search of old takes: points also served from new are left out."""
        if self.pair.state == "backfilling" and self.old_overlaps:
            return (as_where(filter) or Where()) & self.old_where()
        return filter

    @property
    def keeps_writes_in_old(self) -> bool:
        """Whether a user's write goes to old too (by the old model), for a rollback to serve."""
        return False

    @property
    def arrow(self) -> str:
        """Where the gallery moves, for messages: ``old -> new``, or ``C: vector OLD -> NEW``."""
        return f"{self.pair.old_collection} -> {self.pair.new_collection}"

    @property
    def created(self) -> str:
        """What ``rmq init`` made, for its message."""
        vector = f" (vector {self.pair.vector!r})" if self.pair.vector else ""
        return self.arrow + vector

    @property
    def new_half(self) -> str:
        """The new half as ``rmq drop-pair`` names it."""
        return repr(self.pair.new_collection)

    @property
    def old_place(self) -> str:
        """The old half, for messages."""
        return self.pair.old_collection

    @property
    def new_place(self) -> str:
        """The new half, for messages."""
        return self.pair.new_collection

    @property
    def new_model_key(self) -> str:
        """Where the pair's store remembers the model of the new vectors."""
        return self.pair.new_collection

    @property
    def index_vector(self) -> str | None:
        """The vector ``rmq index --name`` fills in the old collection (None: its only one)."""
        return None

    @property
    def managed(self) -> dict[str, str]:
        """The vectors rm-qdrant writes itself (name -> what it is), which a user's
        ``other_vectors`` may not give."""
        return {self.pair.vector: "the models' own vector (the old model's in old, the new one's in new)"}

    def old_ended(self) -> bool:
        """Whether the old half no longer serves or counts (a cutover has begun or is done: what
        old still holds, kept copies or a finalized pair's kept collection, is not the gallery's)."""
        return self.pair.state in ("finalizing", "finalized")

    def finishing_migration(self) -> bool:
        """Whether a migration may run during the cutover (to embed late writes)."""
        return False

    # -- counts and reads ---------------------------------------------------------

    def count_new(self, store: Store, where: Where | None = None) -> int:
        """How many points serve from new (that also match ``where``)."""
        return store.count(self.pair.new_collection, self.new_where() & (where or Where()))

    def ids_in_new(self, store: Store, ids: list[PointId]) -> set[PointId]:
        """Which of ``ids`` are in new."""
        return present_ids(store, self.pair.new_collection, ids)

    def stored_points(self, store: Store) -> int:
        """Every point the pair's collection(s) hold (what a copy of the pair reads)."""
        return store.count(self.pair.old_collection) + store.count(self.pair.new_collection)

    def old_dim(self, store: Store) -> int | None:
        """The old vectors' size, or None once they are gone (finalized and dropped)."""
        pair = self.pair
        if not (pair.serves_old or store.has_collection(pair.old_collection)):
            return None
        return store.collection(pair.old_collection, pair.vector).dim

    def in_both(self, store: Store, where: Where | None = None) -> list[PointId]:
        """Points that serve from old and are already in new (an interrupted migration step);
        with ``where``, those whose old copy matches it."""
        return []

    def kept_count(self, store: Store) -> int:
        """Migrated points kept in old for a rollback."""
        return 0

    def carried(self, store: Store) -> dict[str, OtherVector]:
        """The other vectors of the pair's points, by name (neither model's)."""
        raise NotImplementedError

    def migration_carries(self, store: Store) -> tuple[str, ...]:
        """The other vectors a migrated point takes along (none where they stay put)."""
        return ()

    # -- a user's writes -----------------------------------------------------------

    def write(self, store: Store, write: Write, known: Mapping[str, OtherVector]) -> None:
        """Apply a user's write (see :meth:`DualIndex.upsert_vectors`)."""
        self._write(store, write, known)
        if write.old_there and write.old_vectors is None and self.keeps_writes_in_old:
            log.warning(
                "pair %r: %d points written without their old vectors live in new only: a rollback "
                "will not serve them (pass old_vectors=, or use upsert with images)",
                self.pair.name,
                len(write.ids),
            )

    def _write(self, store: Store, write: Write, known: Mapping[str, OtherVector]) -> None:
        raise NotImplementedError

    def delete(self, store: Store, ids: list[PointId], old_there: bool) -> None:
        """Remove points from the gallery, from both halves."""
        if old_there:
            store.delete(self.pair.old_collection, ids)
        store.delete(self.pair.new_collection, ids)

    # -- the migration -------------------------------------------------------------

    def claim(self, store: Store, batch: list[PointId], others: tuple[str, ...]) -> Claimed:
        """Read a batch before its images are fetched."""
        raise NotImplementedError

    def settle(self, store: Store, prepared: Prepared, encoded: Encoded, dim: int) -> BatchResult:
        """Write a batch's new vectors, read them back and retire what is confirmed."""
        raise NotImplementedError

    def shard_where(self, store: Store, shard: tuple[int, int], buckets: Where) -> Where:
        """A migration worker's share of the old points (``buckets``: by rank buckets)."""
        return buckets

    # -- cutover, rollback, drop ---------------------------------------------------

    def finalize(self, store: Store, alias: str | None, drop_old: bool, embed_late: EmbedLate) -> PairRecord:
        """Serve the new half alone (see :func:`rm_qdrant.operations.cutover.finalize`)."""
        raise NotImplementedError

    def check_finalize(self, store: Store, alias: str | None, drop_old: bool) -> None:
        """Refuse a cutover whose ``alias`` / ``drop_old`` can never serve, before anything is
        changed (``finalize --drop-failed`` deletes the failed points first)."""
        raise NotImplementedError

    def check_rollback(self, alias: str | None) -> None:
        """Refuse a rollback this layout cannot serve."""
        if not self.rolls_back:
            raise MigrationError(
                f"pair {self.pair.name!r} removed migrated points from old (not --keep-old): "
                "the old model cannot serve the whole gallery again"
            )
        if self.pair.state == "rolled_back":
            raise MigrationError(f"pair {self.pair.name!r} is already rolled back")

    def rollback_alias(self, alias: str | None) -> str | None:
        """The alias a rollback points at old (None: there is none to move)."""
        return alias or self.pair.alias or self.pair.name

    def plan_drop(self, store: Store) -> DropPlan:
        """What dropping the pair would leave (see :mod:`rm_qdrant.operations.drop`)."""
        raise NotImplementedError

    def delete_new(self, store: Store) -> bool:
        """Delete the new half; False (and nothing deleted) if it now holds points."""
        raise NotImplementedError

    def vector_copies(self) -> list[tuple[str, str, Where]]:
        """What a copy of the pair's collections (each with its old vector) misses: (collection,
        vector, which points) to copy too (one collection: the new vectors)."""
        return []

    # -- messages ------------------------------------------------------------------

    def finalized_text(self, record: PairRecord, dropped: bool) -> str:
        """What ``rmq finalize`` says."""
        raise NotImplementedError

    def rolled_back_text(self, record: PairRecord) -> str:
        """What ``rmq rollback`` says."""
        raise NotImplementedError


def check_alias(store: Store, alias: str) -> str:
    """``alias``, if no collection has that name."""
    if store.has_collection(alias):
        raise ConfigError(
            f"cannot use {alias!r} as the serving alias: a collection has that name "
            "(choose --alias, or --drop-old to free the old collection's name)"
        )
    return alias


def check_all_moved(store: Store, pair: PairRecord, active: Where) -> None:
    """Refuse a cutover while points still serve from old (``active``)."""
    remaining = store.count(pair.old_collection, active)
    if remaining:
        failed = store.count(pair.old_collection, active & Where(not_empty=(ERROR,)))
        raise MigrationError(waiting_refusal(pair, remaining, failed))
