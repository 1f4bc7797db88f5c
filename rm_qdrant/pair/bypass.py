"""Writers that bypass rm-qdrant: a team's own job that keeps writing the old collection by name
with plain qdrant-client while a paired pair backfills.

rm-qdrant's own writers leave a mark on every old copy they make or keep: the ranking gives
each point ``rmq_rank``; a migration batch and a DualIndex write mark the old copy
``rmq_moving`` before they write new, and a --keep-old pair marks the copies it keeps
``rmq_migrated``. A plain upsert replaces the whole payload, marks included. Hence the rules:

- **stale copy** (both paired layouts): an old copy that serves (not hidden), carries neither
  ``rmq_moving`` nor ``rmq_rank``, and whose id new holds too was written by such a writer
  after the copy in new: old's is the newer. It is served from old (search, retrieve, count:
  :func:`stale_among`, search_options.py, pair_points.py) and the next ``rmq migrate`` drops
  the new copy (:func:`drop_stale`) and migrates the point again. A migration's or a DualIndex
  write's own in-flight states always carry ``rmq_moving`` (or ``rmq_migrated``), so they are
  never taken for one.
- **orphaned copy** (--keep-old only): a migration's copy in new (``rmq_origin``) whose hidden
  old copy is gone was deleted by such a writer: the next ``rmq migrate`` (and ``rmq finalize``)
  deletes it from new too (:func:`drop_orphans`), only while it is still the migration's copy.
- **not seen**: without --keep-old old keeps nothing of a migrated point, so a plain delete or
  ``set_payload`` of it finds nothing to change; with --keep-old, a plain ``set_payload`` merges
  into the hidden copy and keeps its mark. ``rmq init`` says so (:func:`unseen_writes`). The
  single-collection layout sees every such write at once (a point is one point).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import MIGRATED, MOVING, ORIGIN, ORIGIN_MIGRATE, RANK, STALE, chunks
from rm_qdrant.pair.record import SINGLE
from rm_qdrant.store import Where
from rm_qdrant.store.filters import with_ids
from rm_qdrant.store.points import every_id, present_ids

if TYPE_CHECKING:
    from rm_qdrant.pair.record import PairRecord
    from rm_qdrant.store import Store

log = logging.getLogger(__name__)
_CHUNK = 2_000
_OURS = Where(must={ORIGIN: ORIGIN_MIGRATE})


@dataclass(frozen=True)
class Swept:
    """What a sweep found and did: stale new copies dropped (their points serve from old and
    migrate again), orphaned new copies deleted (--keep-old)."""

    stale: list[PointId]
    deleted: list[PointId]


def _watched(pair: PairRecord) -> bool:
    """Whether the pair's layout can hold a writer's stale copy: two collections, backfilling."""
    return pair.layout != SINGLE and pair.state == "backfilling"


def _unmarked(serving: Where) -> Where:
    """Old copies that serve and carry no mark of rm-qdrant's writers."""
    return serving & Where(empty=(MOVING, RANK))


def stale_copies(store: Store, pair: PairRecord, serving: Where, where: Where | None = None) -> list[PointId]:
    """The ids whose old copy is unmarked and serves (``serving``: the layout's ``old_where``;
    ``where``: only those whose old copy matches it too) and which new holds too.

    Reads the smaller side's ids: the unmarked old copies (once the gallery is ranked, only what
    a writer added or rewrote since), or new's ids (before the first ranking, when no old copy
    has a rank yet)."""
    if not _watched(pair) or not store.has_collection(pair.old_collection):
        return []
    old, new = pair.old_collection, pair.new_collection
    candidates = _unmarked(serving) & (where or Where())
    in_new = store.count(new)
    if not in_new:
        return []
    if store.count(old, candidates) <= in_new:
        ids = every_id(store, old, candidates)
        return [i for part in chunks(ids, _CHUNK) for i in present_ids(store, new, part)]
    found: list[PointId] = []
    for part in chunks(every_id(store, new), _CHUNK):
        found += every_id(store, old, candidates & with_ids(part))
    return found


def unmarked(payload: Mapping[str, Any]) -> bool:
    """Whether an old copy's payload carries no mark of rm-qdrant's writers (a --keep-old pair's
    hidden copies carry ``rmq_migrated``: an unmarked copy serves in either paired layout)."""
    return not {MOVING, RANK, MIGRATED} & payload.keys()


def stale_among(store: Store, pair: PairRecord, ids: Sequence[PointId]) -> set[PointId]:
    """Of ``ids`` (new's hits, say), those whose old copy is unmarked: new's copy is stale. One
    retrieve of old by id (a filtered scroll of the same ids costs a search about 8 times as
    much: benchmarks/bypass_cost.py)."""
    if not ids or not _watched(pair):
        return set()
    return {r.id for r in store.retrieve(pair.old_collection, list(ids)) if unmarked(r.payload)}


def drop_stale(store: Store, pair: PairRecord, serving: Where) -> list[PointId]:
    """Delete the stale new copies (see the module's docstring); returns the ids dropped.

    A DualIndex write that lands meanwhile must win: it marks old ``rmq_moving`` before it
    writes new, and its write to new replaces the copy's payload. So each copy is first marked
    with this sweep's token, old is read again, and only the copies whose old copy is still
    unmarked are deleted, and only while they still carry the token."""
    ids = stale_copies(store, pair, serving)
    if not ids:
        return []
    new, token = pair.new_collection, uuid.uuid4().hex
    store.mark(new, ids, {STALE: token})
    still = stale_among(store, pair, ids)
    if still:
        store.delete(new, sorted(still, key=str), where=Where(must={STALE: token}))
    spared = present_ids(store, new, list(still))  # a user's write replaced the copy meanwhile
    kept = [i for i in ids if i not in still or i in spared]
    if kept:
        store.mark(new, kept, {STALE: None})
    dropped = [i for i in ids if i in still and i not in spared]
    if dropped:
        log.warning(
            "pair %r: %d points were rewritten in %r by a writer that bypasses rm-qdrant after they "
            "migrated: their stale copies in %r were dropped; they serve from old and migrate again",
            pair.name,
            len(dropped),
            pair.old_collection,
            new,
        )
    return dropped


def orphaned_copies(store: Store, pair: PairRecord) -> list[PointId]:
    """--keep-old: the migration's copies in new whose hidden old copy is gone."""
    if not (_watched(pair) and pair.keep_old) or not store.has_collection(pair.old_collection):
        return []
    orphans: list[PointId] = []
    for part in chunks(every_id(store, pair.new_collection, _OURS), _CHUNK):
        there = present_ids(store, pair.old_collection, part)
        orphans += [i for i in part if i not in there]
    return orphans


def drop_orphans(store: Store, pair: PairRecord) -> list[PointId]:
    """--keep-old: delete the orphaned copies from new, each only while it is still the
    migration's copy (a user's write meanwhile wins); returns the ids deleted."""
    orphans = orphaned_copies(store, pair)
    if not orphans:
        return []
    store.delete(pair.new_collection, orphans, where=_OURS)
    left = present_ids(store, pair.new_collection, orphans)  # a user's write meanwhile: spared
    deleted = [i for i in orphans if i not in left]
    if deleted:
        log.warning(
            "pair %r: %d migrated points were deleted from %r by a writer that bypasses rm-qdrant: "
            "deleted from %r too",
            pair.name,
            len(deleted),
            pair.old_collection,
            pair.new_collection,
        )
    return deleted


def sweep(store: Store, pair: PairRecord, serving: Where) -> Swept:
    """Both repairs, before a run plans (see the module's docstring)."""
    return Swept(drop_stale(store, pair, serving), drop_orphans(store, pair))


def unseen_writes(pair: PairRecord) -> str | None:
    """What this layout cannot see of a writer that bypasses rm-qdrant (``rmq init``'s warning)."""
    if pair.layout == SINGLE:
        return None
    old = pair.old_collection
    if pair.keep_old:
        return (
            f"a plain qdrant-client set_payload on {old!r} of a point migrated (or migrating) is not "
            "seen: its new copy keeps the previous payload; write through DualIndex, or use --mode "
            "single-collection"
        )
    return (
        f"a plain qdrant-client delete or set_payload on {old!r} of a point migrated (or migrating) "
        "is not seen: old keeps nothing of it; write through DualIndex, or use --keep-old (sees "
        "deletes) or --mode single-collection (sees both)"
    )
