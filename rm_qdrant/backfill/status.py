"""What ``rmq status`` reports about a pair: sizes, progress, failures, models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rm_qdrant.backfill.pair import PairRecord, active_where, count_new
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR, MIGRATED, MOVING
from rm_qdrant.errors import SourceError
from rm_qdrant.sources import shown
from rm_qdrant.store import Store, Where

SAMPLE = 5
_PAGE = 10_000


def in_both(store: Store, pair: PairRecord) -> list[PointId]:
    """Points that serve from old and are already in new: a migration step cut short
    between its write to new and its removal from old. Search serves them once (from
    new) and the next ``rmq migrate`` finishes the step; counts must not take them twice.

    Only points marked ``rmq_moving`` can be in both, so this reads a few batches at most.
    """
    if pair.state != "backfilling" or pair.single or not store.has_collection(pair.old_collection):
        return []  # (in one collection a point is in old or in new, never both)
    marked: list[PointId] = []
    offset: PointId | None = None
    where = active_where(pair) & Where(not_empty=(MOVING,))
    while True:
        page, offset = store.scroll(pair.old_collection, limit=_PAGE, offset=offset, where=where)
        marked += [r.id for r in page]
        if offset is None:
            break
    return [r.id for r in store.retrieve(pair.new_collection, marked)] if marked else []


@dataclass(frozen=True)
class PairStatus:
    """A pair's state as ``rmq status`` shows it.

    Attributes:
        old_count: points that serve from old only (migrated-but-kept points, and points
            caught in both collections by an interrupted step, excluded).
        kept_count: keep-old mode: migrated points kept in old for a rollback.
        failed: old points whose last migration attempt failed.
        failure_sample: up to five of them as (id, uri, reason).
    """

    name: str
    mode: str
    state: str
    old_collection: str
    new_collection: str
    old_count: int
    new_count: int
    encoder: str
    old_encoder: str | None
    keep_old: bool = False
    kept_count: int = 0
    order: str | None = None
    alias: str | None = None
    failed: int = 0
    failure_sample: list[tuple[PointId, str, str]] = field(default_factory=list)
    layout: str = "paired"
    old_vector: str = ""
    new_vector: str = ""

    @property
    def fraction(self) -> float:
        """Share of the gallery served from the new collection (0 for an empty gallery, and
        after a rollback, when the old collection serves every point)."""
        total = self.old_count + self.new_count
        return self.new_count / total if total and self.state != "rolled_back" else 0.0


def _uri(pair: PairRecord, point_id: PointId, payload: dict[str, Any]) -> object:
    try:
        return pair.uri_rule.uri(point_id, payload)
    except SourceError as exc:
        return f"({exc})"


def pair_status(store: Store, pair: PairRecord) -> PairStatus:
    """Both collections' sizes, the failures and the pair's models; needs no encoder."""
    # (once a single-collection pair is finalized, its old vectors serve no more)
    ended = ("finalizing", "finalized") if pair.single else ("finalizing",)
    has_old = store.has_collection(pair.old_collection) and pair.state not in ended
    active = active_where(pair) if pair.state == "backfilling" else Where()  # after a rollback: all
    old_count = store.count(pair.old_collection, active) - len(in_both(store, pair)) if has_old else 0
    failed_where = active & Where(not_empty=(ERROR,))
    failed = store.count(pair.old_collection, failed_where) if has_old else 0
    sample = []
    if failed:
        page, _ = store.scroll(pair.old_collection, limit=SAMPLE, where=failed_where)
        sample = [(r.id, shown(_uri(pair, r.id, r.payload)), str(r.payload.get(ERROR))) for r in page]
    keeping = has_old and pair.keep_old and pair.state == "backfilling"
    kept = store.count(pair.old_collection, Where(must={MIGRATED: 1})) if keeping else 0
    return PairStatus(
        name=pair.name,
        mode=pair.mode,
        state=pair.state,
        old_collection=pair.old_collection,
        new_collection=pair.new_collection,
        old_count=old_count,
        new_count=count_new(store, pair) if store.has_collection(pair.new_collection) else 0,
        encoder=f"{pair.encoder.name} ({pair.encoder.fingerprint})",
        old_encoder=f"{pair.old_encoder.name} ({pair.old_encoder.fingerprint})" if pair.old_encoder else None,
        keep_old=pair.keep_old,
        kept_count=kept,
        order=pair.order,
        alias=pair.alias,
        failed=failed,
        failure_sample=sample,
        layout=pair.layout,
        old_vector=pair.vector,
        new_vector=pair.new_using,
    )
