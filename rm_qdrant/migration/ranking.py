"""Ranking the gallery in backfill order, in Qdrant, and planning a run from the ranks.

The ranks are payload fields of the old points (``rmq_rank``, with a shard bucket
``rmq_bucket``), indexed so a run can ask Qdrant for the lowest-ranked points that
remain; the order's name is kept in the pair record.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.ordering import (
    DEMAND_ORDER,
    bucket,
    needs_payloads,
    needs_vectors,
    order_keys,
    ranks,
    shard_buckets,
)
from rm_qdrant.core.planning import BUCKET, ERROR, MIGRATED, MOVING, RANK, points_to_move
from rm_qdrant.pair.layouts import active_where, count_new, layout_of
from rm_qdrant.pair.outcome import MigrateOptions
from rm_qdrant.pair.record import PairRecord, load_pair, save_pair
from rm_qdrant.serving.status import in_both
from rm_qdrant.store import Store, Where

log = logging.getLogger(__name__)
_PAGE = 2_000
#: The payload indexes the ranking gives the old collection. rmq_moving too: status.in_both looks
#: for marked points on every status and run (a full payload scan without the index: 0.3-1.3 s at
#: 450,000 old points, 5 ms with it).
RANKING_INDEXES = {
    RANK: "integer",
    BUCKET: "integer",
    ERROR: "keyword",
    MIGRATED: "integer",
    MOVING: "integer",
}


def prepare_order(store: Store, pair: PairRecord, order: str, *, seed: int = 0) -> PairRecord:
    """Rank the old points in backfill order and record the order in the pair.

    Only points that still serve from old are ranked. Returns the updated record.
    """
    for name, kind in RANKING_INDEXES.items():
        store.create_index(pair.old_collection, name, kind)
    ids, payloads, vectors = read_all(
        store,
        pair.old_collection,
        active_where(pair),
        needs_vectors(order),
        vector=pair.vector,
        with_payloads=needs_payloads(order),
    )
    keys = order_keys(order, ids, payloads, vectors, seed=seed, label_field=pair.label_field)
    positions = ranks(keys)
    writing = replace(pair, order=order, order_seed=seed, order_ready=False)
    _save_order(store, writing)  # a kill while the ranks are written leaves a record that says so
    store.set_payload(
        pair.old_collection,
        [(i, {RANK: int(r), BUCKET: bucket(i)}) for i, r in zip(ids, positions.tolist(), strict=True)],
    )
    updated = replace(writing, order_ready=True)
    _save_order(store, updated)
    log.info("ranked %d old points in %s order", len(ids), order)
    return updated


def _save_order(store: Store, pair: PairRecord) -> None:
    """Record ``pair``'s order on the record as stored now: what another command changed since
    this run read it (``rmq switch-encoder --decode`` while a large gallery is ranked) stays."""
    current = load_pair(store, pair.name)
    save_pair(
        store, replace(current, order=pair.order, order_seed=pair.order_seed, order_ready=pair.order_ready)
    )


def read_all(
    store: Store,
    collection: str,
    where: Where,
    with_vectors: bool,
    *,
    vector: str = "",
    with_payloads: bool = True,
) -> tuple[list[PointId], list[dict[str, Any]], np.ndarray | None]:
    """Every point of ``collection`` that matches ``where``: ids, payloads, vectors (stacked).

    The whole collection is held in memory: about 0.65 KB a point for ids and small payloads,
    plus about twice the vector's size while the rows are stacked (benchmarks/scale.py).
    ``with_payloads=False`` keeps none of the payloads (the payload list comes back empty).
    """
    ids: list[PointId] = []
    payloads: list[dict[str, Any]] = []
    rows: list[np.ndarray] = []
    offset: PointId | None = None
    while True:
        page, offset = store.scroll(
            collection,
            limit=_PAGE,
            offset=offset,
            with_vectors=with_vectors,
            where=where,
            vector=vector,
            with_payload=with_payloads,
        )
        for record in page:
            ids.append(record.id)
            if with_payloads:
                payloads.append(record.payload)
            if with_vectors and record.vector is not None:
                rows.append(record.vector)
        if offset is None:
            break
    return ids, payloads, (np.stack(rows) if with_vectors and rows else None)


@dataclass(frozen=True)
class Budget:
    """Where a run starts: points only in old, points in new, how many it may move, and
    the points an interrupted step left in both collections (finished first, moving nothing new)."""

    old_only: int
    new: int
    moves: int
    repairs: list[PointId]


def budget(store: Store, pair: PairRecord, options: MigrateOptions) -> Budget:
    """What ``--until``/``--limit`` allow this run, counting a point in both collections once."""
    repairs = in_both(store, pair)
    old_only = store.count(pair.old_collection, active_where(pair)) - len(repairs)
    new = count_new(store, pair)
    moves = points_to_move(old_active=old_only, new=new, until=options.until, limit=options.limit)
    return Budget(old_only, new, moves, repairs)


def plan(
    store: Store, pair: PairRecord, options: MigrateOptions, first: Sequence[PointId] = ()
) -> list[PointId]:
    """The ids this run will attempt, in backfill order (the order must be prepared).

    Points left in both collections by an interrupted step come first (finishing
    them moves nothing new), then ``first`` (points whose stale copy a sweep dropped from new:
    see bypass.py), then up to the budget of ``--until``/``--limit`` more (``first`` included).
    """
    if options.limit == 0:
        return []
    start = budget(store, pair, options)
    repairs, old_only, moves = start.repairs, start.old_only, start.moves
    where = active_where(pair)
    first = [i for i in dict.fromkeys(first) if i not in set(repairs)]
    if options.shard is not None:
        owned = set(shard_buckets(*options.shard))
        repairs = [i for i in repairs if bucket(i) in owned]
        first = [i for i in first if bucket(i) in owned]
        where = where & layout_of(pair).shard_where(store, options.shard, Where(must={BUCKET: sorted(owned)}))
        if moves < old_only:  # --until/--limit: each worker takes its share, rounded up
            moves = -(-moves // options.shard[1])
    if not options.retry_failed:
        where = where & Where(empty=(ERROR,))
    if moves == 0:
        return repairs
    first = first[:moves]
    skip = set(repairs) | set(first)
    page, _ = store.scroll(
        pair.old_collection, limit=moves + len(skip), where=where, order_by=RANK, with_payload=False
    )
    return repairs + first + [r.id for r in page if r.id not in skip][: moves - len(first)]


def order_ready(store: Store, pair: PairRecord, wanted: str | None, *, sharded: bool = False) -> bool:
    """Whether the old points are ranked in ``wanted`` (None: the pair's order, else random)
    already, so a run needs no ranking pass first.

    The ``demand`` order is never ready for an unsharded run: searches add demand while the
    gallery serves, so each run ranks again at its start and moves the points in the demand of
    that moment. A ``sharded`` run (``--shard i/n``, which cannot rank) takes the ranks the last
    ``rmq migrate --prepare`` wrote, as with any order: rank again with ``--prepare`` to follow
    the demand."""
    wanted = wanted or pair.order or "random"
    if wanted == DEMAND_ORDER and not sharded:
        return False
    return wanted == pair.order and pair.order_ready and unranked(store, pair) == 0


def unranked(store: Store, pair: PairRecord) -> int:
    """Old points that serve from old but have no rank (added after the order was computed)."""
    return store.count(pair.old_collection, active_where(pair) & Where(empty=(RANK,)))
