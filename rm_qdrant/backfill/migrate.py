"""The online backfill: move gallery points from the old collection to the new one.

Each batch goes through three stages that overlap (a bounded pipeline): while
the encoder embeds batch k on the calling thread, a thread pool fetches and
decodes the images of batch k+1, and a writer thread settles batch k-1. A batch
is settled in this order, which keeps DESIGN.md's invariants:

1. insert-only upsert into new (waited), with the other named vectors the point has in
   old: a fresher write by a user always wins;
2. read back from new (ids present, vectors of the right size) and from old;
3. retire the confirmed points from old (delete, or mark in keep-old mode);
   delete a migrated copy whose point a user deleted meanwhile;
4. record fetch/decode failures on the old points, which stay searchable.

All state lives in Qdrant: the ranks of the backfill order and the failures are
payload fields of the old points, the order's name is in the pair record, and
what is done is simply what is no longer (or no longer unmarked) in old. A run
killed at any moment is resumed by running it again.

In one collection the new vectors are written to the points that still lack one and still
carry the token the batch put on them before reading their payloads: a user's rewrite of a
point (old vector only, a new image, say) replaces the token too, so no vector of the previous
image lands, and the next run embeds the point from its new image.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rm_qdrant.backfill.dual import DualIndex
from rm_qdrant.backfill.loading import load_batch
from rm_qdrant.backfill.outcome import (
    BatchResult,
    Gallery,
    MigrateOptions,
    MigrationReport,
    record_failures,
    unusable_rows,
)
from rm_qdrant.backfill.pair import PairRecord, active_where, ids_in_new
from rm_qdrant.backfill.ranking import plan, prepare_order, unranked
from rm_qdrant.backfill.writes import carried
from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import (
    BATCH,
    ERROR,
    MIGRATED,
    MOVING,
    ORIGIN,
    ORIGIN_MIGRATE,
    chunks,
    new_payload,
    over_failure_limit,
    settle,
)
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.sources import ImageSource
from rm_qdrant.store import Where

log = logging.getLogger(__name__)
#: Seconds between a batch's write to new and its removal from old where the store
#: takes DualIndex's two searches concurrently: longer than any skew between them.
REMOVAL_GRACE = 1.0


@dataclass(frozen=True)
class _Encoded:
    ids: list[PointId]  # encoded to storable vectors, in row order
    vectors: np.ndarray
    failed: list[tuple[PointId, str]]  # the encoder's output was unusable


@dataclass(frozen=True)
class _Prepared:
    ids: list[PointId]  # still in old, in plan order
    payloads: dict[PointId, dict[str, Any]]
    already_in_new: list[PointId]
    loaded: list[PointId]  # whose images were read, in the order of ``pixels``
    pixels: np.ndarray
    failed: list[tuple[PointId, str]]
    gone: int
    token: str | None  # one collection: the batch's token (see BATCH)
    others: dict[PointId, dict[str, Any]]  # two collections: each point's other vectors, if any


class Migrator:
    """Runs one migration over a DualIndex's pair with its encoder.

    Example:
        >>> index = DualIndex.open(store, "photos")  # doctest: +SKIP
        >>> report = Migrator(index, MigrateOptions(batch=1000, until=0.5)).run()  # doctest: +SKIP
    """

    def __init__(self, index: Gallery, options: MigrateOptions, *, finishing: bool = False) -> None:
        """``finishing``: the cutover of a single-collection pair embeds the points written
        without the new vector since it counted them (see cutover.py), in state ``finalizing``."""
        name, state = index.pair.name, index.pair.state
        if state == "finalizing" and not (finishing and index.pair.single):
            raise MigrationError(
                f"a cutover of pair {name!r} is under way: 'rmq finalize --name {name}' completes it"
            )
        if state == "dropping":
            raise MigrationError(f"pair {name!r} is being dropped: 'rmq drop-pair {name}' finishes it")
        if state not in ("backfilling", "finalizing"):
            raise MigrationError(f"pair {name!r} is {state}: nothing to migrate")
        if index.encoder is None:
            raise MigrationError("a migration needs the pair's encoder")
        if not 0.0 <= options.max_failure_share <= 1.0:
            raise MigrationError(f"max failure share must be in [0, 1], got {options.max_failure_share}")
        self.index = index
        self.store = index.store
        self.options = options
        self.encoder = index.encoder
        self.output = index.encoder.info.gallery_output()
        self.dim = index.store.collection(index.pair.new_collection, index.pair.new_using).dim
        # Two collections: the other vectors a point takes to new (one collection: they stay put).
        self.carried = () if index.pair.single else tuple(carried(index.store, index.pair))

    @property
    def pair(self) -> PairRecord:
        return self.index.pair

    def ensure_order(self) -> None:
        """Rank the old points if the order is new, changed, half-written, or some points lack a rank."""
        wanted = self.options.order or self.pair.order or "random"
        if wanted == self.pair.order and self.pair.order_ready and unranked(self.store, self.pair) == 0:
            return
        if self.options.shard is not None:
            raise MigrationError(
                f"the {wanted} order is not prepared for every point; run 'rmq migrate --prepare' "
                "(without --shard) before starting sharded workers"
            )
        self.index.pair = prepare_order(self.store, self.pair, wanted, seed=self.options.seed)

    def run(
        self,
        *,
        ids: list[PointId] | None = None,
        stop: threading.Event | None = None,
        on_batch: Callable[[BatchResult], None] | None = None,
    ) -> MigrationReport:
        """Migrate until the plan is done, ``stop`` is set, or too much of a batch fails.

        Args:
            ids: the plan, if already made (:func:`plan`); made here otherwise.
            stop: set it (from a signal handler, say) to stop after the current batch.
            on_batch: called with each settled batch.

        Raises:
            MigrationError: more than ``max_failure_share`` of a batch failed (that
                batch is settled first: its good points are moved, its failures recorded).
        """
        started = time.perf_counter()
        if ids is None:
            self.ensure_order()
            ids = plan(self.store, self.pair, self.options)
        report = MigrationReport(planned=len(ids))
        batches = list(chunks(ids, self.options.batch))
        halt = stop or threading.Event()  # set: fetches not yet begun give up at once
        with (
            ImageSource(self.options.source, stop=halt) as source,
            ThreadPoolExecutor(self.options.fetch_workers, "rmq-fetch") as fetch,
            ThreadPoolExecutor(1, "rmq-prepare") as prepare,
            ThreadPoolExecutor(1, "rmq-write") as write,
        ):
            queue = iter(batches)

            def next_batch() -> Future[_Prepared] | None:
                batch = next(queue, None)
                return None if batch is None else prepare.submit(self._prepare, batch, source, fetch)

            upcoming, pending_write = next_batch(), None
            try:
                while upcoming is not None:
                    prepared = None if halt.is_set() else upcoming.result()
                    if prepared is None or halt.is_set():  # its fetches may have given up: drop it
                        report.stopped_early = True
                        upcoming.cancel()
                        break
                    upcoming = next_batch()  # fetched and decoded while this one is encoded
                    encoded = self._encode(prepared)
                    if pending_write is not None:
                        self._collect(pending_write.result(), report, on_batch)
                    pending_write = write.submit(self._settle, prepared, encoded)
                if pending_write is not None:
                    self._collect(pending_write.result(), report, on_batch)
            except BaseException:
                halt.set()  # the fetch threads wind down fast instead of finishing the batch
                raise
        report.seconds = time.perf_counter() - started
        return report

    def _collect(
        self,
        result: BatchResult,
        report: MigrationReport,
        on_batch: Callable[[BatchResult], None] | None,
    ) -> None:
        report.add(result)
        if on_batch is not None:
            on_batch(result)
        attempted = result.moved + result.repaired + len(result.failed)
        # Points failing again (--retry-failed) say nothing new about the source: only fresh
        # failures count towards stopping, so a retry can get past the old ones.
        fresh = len(result.failed) - result.failed_again
        if over_failure_limit(fresh, attempted - result.failed_again, self.options.max_failure_share):
            reason = result.failed[0][1]
            raise MigrationError(
                f"{len(result.failed)} of {attempted} points in a batch failed (first: {reason}); "
                "stopping: fix the source, then rerun with --retry-failed (or raise --max-failures)"
            )

    def _prepare(self, batch: Sequence[PointId], source: ImageSource, fetch: ThreadPoolExecutor) -> _Prepared:
        pair, token = self.pair, None
        if pair.single:  # before the read: a rewrite from here on removes it (see the module's doc)
            token = uuid.uuid4().hex
            self.store.mark(pair.old_collection, batch, {BATCH: token})
        # One collection: the same read says which points have the new vector already.
        present = self.store.retrieve(
            pair.old_collection,
            list(batch),
            with_vectors=pair.single,
            vector=pair.new_using,
            others=self.carried,
        )
        payloads = {r.id: r.payload for r in present}
        ids = [i for i in batch if i in payloads]  # a user may have deleted some meanwhile
        if pair.single:
            done = {r.id for r in present if r.vector is not None}
        else:
            done = ids_in_new(self.store, pair, ids)
        todo = [i for i in ids if i not in done]
        points = [(i, payloads[i]) for i in todo]
        loaded = load_batch(
            self.encoder, source, pair.uri_rule, points, fetch, workers=self.options.fetch_workers
        )
        already = [i for i in ids if i in done]
        return _Prepared(
            ids,
            payloads,
            already,
            [todo[row] for row in loaded.rows],
            loaded.pixels,
            [(todo[row], reason) for row, reason in loaded.failed],
            len(batch) - len(ids),
            token,
            {r.id: r.others for r in present} if self.carried else {},
        )

    def _encode(self, prepared: _Prepared) -> _Encoded:
        if not prepared.loaded:
            return _Encoded([], np.zeros((0, self.dim), dtype=np.float32), [])
        ids = prepared.loaded
        vectors = self.encoder.run_pixels(prepared.pixels, [self.output])[self.output]
        log.debug("encoded %s", ids)
        bad = unusable_rows(vectors, self.pair.distance)
        if not bad.any():
            return _Encoded(ids, vectors, [])
        reason = "the encoder returned NaN, infinity or a zero vector for this image"
        failed = [(i, reason) for i, b in zip(ids, bad.tolist(), strict=True) if b]
        return _Encoded([i for i, b in zip(ids, bad.tolist(), strict=True) if not b], vectors[~bad], failed)

    def _settle(self, prepared: _Prepared, encoded: _Encoded) -> BatchResult:
        if self.pair.single:
            return self._settle_single(prepared, encoded)
        pair, store = self.pair, self.store
        written = encoded.ids
        if written:
            payloads = [new_payload(prepared.payloads[i]) for i in written]
            store.mark(pair.old_collection, written, {MOVING: 1})  # see status.in_both
            others = [prepared.others[i] for i in written] if self.carried else None
            store.upsert(
                pair.new_collection,
                written,
                encoded.vectors,
                payloads,
                insert_only=True,
                vector=pair.vector,
                others=others,
            )
            log.debug("acknowledged %s", written)
        acknowledged = time.monotonic()
        batch = written + prepared.already_in_new
        in_new = {
            r.id: (0 if r.vector is None else len(r.vector), r.payload)
            for r in store.retrieve(pair.new_collection, batch, with_vectors=True, vector=pair.vector)
        }
        still_in_old = {r.id for r in store.retrieve(pair.old_collection, batch, with_payload=False)}
        outcome = settle(batch, in_new=in_new, still_in_old=still_in_old, dim=self.dim)
        if outcome.delete_from_new:  # only where the copy is still ours: see Settlement
            store.delete(pair.new_collection, outcome.delete_from_new, where=_OURS)
        if store.concurrent_search:  # see REMOVAL_GRACE
            time.sleep(max(0.0, acknowledged + REMOVAL_GRACE - time.monotonic()))
        if pair.keep_old:
            store.mark(pair.old_collection, outcome.remove_from_old, {MIGRATED: 1, ERROR: None, MOVING: None})
        else:
            store.delete(pair.old_collection, outcome.remove_from_old)
        failed = prepared.failed + encoded.failed
        record_failures(store, pair.old_collection, failed)
        if outcome.unconfirmed:
            log.warning("%d written points were not found in new; they stay in old", len(outcome.unconfirmed))
        removed = set(outcome.remove_from_old)
        return BatchResult(
            moved=sum(i in removed for i in written),
            repaired=sum(i in removed for i in prepared.already_in_new),
            failed=failed,
            gone=prepared.gone + len(batch) - len(still_in_old),
            unconfirmed=len(outcome.unconfirmed),
            failed_again=sum(prepared.payloads[i].get(ERROR) is not None for i, _ in failed),
        )

    def _settle_single(self, prepared: _Prepared, encoded: _Encoded) -> BatchResult:
        """One collection: add the new vector where the point still lacks it and still has the
        batch's token (a user's write wins; a deleted point stays deleted), read back, record failures."""
        pair, store = self.pair, self.store
        written = encoded.ids
        if written:
            ours = active_where(pair) & Where(must={BATCH: prepared.token})
            store.set_vectors(
                pair.old_collection, written, encoded.vectors, vector=pair.new_using, where=ours
            )
            log.debug("acknowledged %s", written)
        back = store.retrieve(pair.old_collection, written, with_vectors=True, vector=pair.new_using)
        confirmed = {r.id: r.payload for r in back if r.vector is not None and len(r.vector) == self.dim}
        # A rewrite that copied the payload it read (token included) and changed the image
        # passes the condition: the vector is the previous image's, so it goes again. (A write
        # without the token is the user's own: the conditional write did not touch it.)
        stale = [
            i
            for i, now in confirmed.items()
            if now.get(BATCH) == prepared.token and not pair.uri_rule.same_image(i, prepared.payloads[i], now)
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


_OURS = Where(must={ORIGIN: ORIGIN_MIGRATE})


def run_migration(
    index: DualIndex,
    options: MigrateOptions,
    *,
    workers: int = 1,
    stop: threading.Event | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> MigrationReport:
    """What ``rmq migrate`` does: rank the gallery once, plan, then run ``workers`` shards.

    With ``workers > 1`` the shards run as threads of this process (the embedded
    store admits one process); against a server, ``options.shard`` lets separate
    processes or machines share the work instead.

    Raises:
        ConfigError: ``workers`` is below 1, or combined with ``options.shard``.
        MigrationError: see :meth:`Migrator.run`.
    """
    if workers < 1 or (workers > 1 and options.shard is not None):
        raise ConfigError("use --workers N (threads) or --shard i/n (processes), not both; N >= 1")
    Migrator(index, options).ensure_order()
    skipped = 0
    if not options.retry_failed:
        skipped = index.store.count(
            index.pair.old_collection, active_where(index.pair) & Where(not_empty=(ERROR,))
        )
    shards = [options] if workers == 1 else [replace(options, shard=(i, workers)) for i in range(workers)]
    migrators = [Migrator(index, shard) for shard in shards]
    plans = [plan(index.store, index.pair, m.options) for m in migrators]
    if on_plan is not None:
        on_plan(sum(map(len, plans)))
    lock = threading.Lock()

    def report_batch(result: BatchResult) -> None:
        if on_batch is not None:
            with lock:
                on_batch(result)

    halt = stop or threading.Event()

    def work(migrator: Migrator, ids: list[PointId]) -> MigrationReport:
        try:
            return migrator.run(ids=ids, stop=halt, on_batch=report_batch)
        except BaseException:
            halt.set()  # one worker's failure stops the others after their batch
            raise

    started = time.perf_counter()
    with ThreadPoolExecutor(len(migrators), "rmq-worker") as pool:
        futures = [pool.submit(work, m, p) for m, p in zip(migrators, plans, strict=True)]
        reports = [f.result() for f in futures]
    total = MigrationReport(seconds=time.perf_counter() - started, skipped_failed=skipped)
    for part in reports:
        total.merge(part)
    return total
