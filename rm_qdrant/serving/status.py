"""What ``rmq status`` reports about a pair: sizes, progress, failures, models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR
from rm_qdrant.errors import SourceError
from rm_qdrant.pair.bypass import stale_copies
from rm_qdrant.pair.control import paused_since
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.progress import recorded_pace, recorded_truncation
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import shown
from rm_qdrant.store import Store, Where

SAMPLE = 5


def in_both(store: Store, pair: PairRecord) -> list[PointId]:
    """Points that serve from old and are already in new (see :meth:`Paired.in_both`); counts
    must not take them twice."""
    return layout_of(pair).in_both(store)


@dataclass(frozen=True)
class PairStatus:
    """A pair's state as ``rmq status`` shows it.

    Attributes:
        old_count: points that serve from old only (migrated-but-kept points, and points
            caught in both collections by an interrupted step, excluded).
        kept_count: keep-old mode: migrated points kept in old for a rollback.
        failed: old points whose last migration attempt failed.
        failure_sample: up to five of them as (id, uri, reason).
        new_model: the plain new model the pair records (New for ``rmq eval`` and ``rmq probe``).
        stale_copies: migrated points a writer that bypasses rm-qdrant rewrote in old since:
            they serve from old, and the next ``rmq migrate`` drops their copies in new (see
            bypass.py). The migrated points such a writer deleted from a --keep-old pair's old
            collection are not counted here: finding them reads every migrated id (about 1 s
            per 50,000); ``rmq migrate`` and ``rmq finalize`` find and delete them.
        decode: how the pair decodes its images, ``exact`` or ``fast`` (:attr:`PairRecord.decode`).
        paused_since: when ``rmq pause`` held the pair's migrations (seconds since the epoch; 0
            when the flag's time cannot be read); None when it is not paused, or no longer
            backfilling (a flag left from before the cutover holds nothing).
        points_per_second: the backfill's pace over the last ten minutes, every process that
            migrates it together, from the progress they recorded (None: nothing moved then).
        eta_seconds: ``remaining`` at that pace (None: no pace; see :mod:`rm_qdrant.core.pace`).
        pace_seconds: the time that pace was measured over (ten minutes, or since the earliest
            of those processes started).
        migrating_now: processes that recorded progress in the last two minutes.
        truncated: a text pair's documents whose text its migrations cut at the model's
            ``max_length`` (as the tokenizer cuts it), every run together; None for an image pair
            (and a text pair before its first run).
        truncated_at: the ``max_length`` of those runs, in tokens (one, unless ``rmq
            switch-encoder`` changed the model's window meanwhile).
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
    old_place: str = ""
    new_place: str = ""
    new_model: str | None = None
    stale_copies: int = 0
    decode: str = "exact"
    paused_since: float | None = None
    points_per_second: float | None = None
    eta_seconds: float | None = None
    pace_seconds: float = 0.0
    migrating_now: int = 0
    truncated: int | None = None
    truncated_at: list[int] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        """Points still to migrate: in old, without a recorded failure (0 once it is over)."""
        return max(0, self.old_count - self.failed) if self.state == "backfilling" else 0

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
    layout = layout_of(pair)
    has_old = store.has_collection(pair.old_collection) and not layout.old_ended()
    active = layout.old_where() if pair.state == "backfilling" else Where()  # after a rollback: all
    old_count = store.count(pair.old_collection, active) - len(layout.in_both(store)) if has_old else 0
    failed_where = active & Where(not_empty=(ERROR,))
    failed = store.count(pair.old_collection, failed_where) if has_old else 0
    sample = []
    if failed:
        page, _ = store.scroll(pair.old_collection, limit=SAMPLE, where=failed_where)
        sample = [(r.id, shown(_uri(pair, r.id, r.payload)), str(r.payload.get(ERROR))) for r in page]
    kept = layout.kept_count(store) if has_old and pair.state == "backfilling" else 0
    stale = len(stale_copies(store, pair, layout.old_where()))  # served from old, not new
    new_count = layout.count_new(store) - stale if store.has_collection(pair.new_collection) else 0
    remaining = max(0, old_count - failed) if pair.state == "backfilling" else 0
    pace = recorded_pace(store, pair.name, remaining)
    cut = recorded_truncation(store, pair.name)
    return PairStatus(
        name=pair.name,
        mode=pair.mode,
        state=pair.state,
        old_collection=pair.old_collection,
        new_collection=pair.new_collection,
        old_count=old_count,
        new_count=new_count,
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
        old_place=layout.old_place,
        new_place=layout.new_place,
        new_model=f"{pair.new_model.name} ({pair.new_model.fingerprint})" if pair.new_model else None,
        stale_copies=stale,
        decode=pair.decode,
        paused_since=paused_since(store, pair.name) if pair.state == "backfilling" else None,
        points_per_second=pace.points_per_second,
        eta_seconds=pace.eta_seconds if pair.state == "backfilling" else None,
        pace_seconds=pace.window_seconds,
        migrating_now=pace.running,
        truncated=cut.documents if cut is not None else None,
        truncated_at=list(cut.max_lengths) if cut is not None else [],
    )
