"""Promotion: the vectors a re-rank embedded are written to new, so points users see migrate first.

A re-ranked search (``promote=True``) hands :class:`Promoter` the old hits it embedded, each with
the payload it read the item's URI from. A background thread writes them in batches through
the migration's own protocol, step for step as a migration batch (see migrator.py):

1. claim the batch (:func:`~rm_qdrant.pair.claiming.claim_batch`): read the points still in old,
   which are in new already, and (one collection) put the batch's token on them;
2. keep the points whose claimed payload names the item that was embedded
   (:meth:`UriRule.same_image`): a point rewritten since the search is left to the migration;
3. settle (:meth:`Layout.settle`): insert-only write to new (a user's fresher write wins), read
   back, retire the confirmed points from old.

So a promotion racing ``rmq migrate``, a cutover, a rollback or an application's write keeps the
guarantees a migration batch keeps against them. The pair record is read again before each batch:
a pair no longer backfilling, or paused (``rmq pause``), gets no promotion (the vectors are
dropped; the migration embeds those points later). The queue is bounded: when searches find more
than the writer keeps up with, the excess is dropped and counted, never waited for.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import RmqError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.claiming import claim_batch
from rm_qdrant.pair.control import is_paused
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.outcome import BatchResult, Encoded
from rm_qdrant.pair.record import load_pair
from rm_qdrant.store import Store

log = logging.getLogger(__name__)
#: Points one promotion batch writes at most.
BATCH = 256
#: Points waiting to be promoted at most; more are dropped (the migration embeds them later).
QUEUE = 10_000
#: Seconds the writer thread waits for more work before it ends (the next offer starts another).
IDLE = 5.0

Offer = tuple[PointId, dict[str, Any], np.ndarray]


@dataclass
class PromotionCounts:
    """What a promoter did: points written to new, left alone (rewritten since, in new already,
    gone), dropped unwritten (queue full, pair paused or no longer backfilling), and batches."""

    promoted: int = 0
    skipped: int = 0
    dropped: int = 0
    batches: int = 0


def promote_batch(
    store: Store, name: str, encoder: OnnxEncoder, offers: Sequence[Offer]
) -> BatchResult | None:
    """Write one batch of embedded points to new through the migration's claim/settle protocol;
    None where the pair is no longer backfilling, or is paused."""
    pair = load_pair(store, name)
    if pair.state != "backfilling" or is_paused(store, name):
        return None
    layout = layout_of(pair)
    dim = store.collection(pair.new_collection, pair.new_using).dim
    given: dict[PointId, Offer] = {}
    for offer in offers:
        given[offer[0]] = offer
    claimed = claim_batch(layout, store, list(given), layout.migration_carries(store))
    rule = pair.uri_rule
    rows = [
        row
        for row, (point_id, payload) in enumerate(claimed.todo)
        if rule.same_image(point_id, given[point_id][1], payload) and len(given[point_id][2]) == dim
    ]
    ids = [claimed.todo[row][0] for row in rows]
    vectors = np.stack([given[i][2] for i in ids]) if ids else np.zeros((0, dim), np.float32)
    prepared = claimed.prepared(_Rows(rows, encoder.blank(0)))
    return layout.settle(store, prepared, Encoded(ids, vectors, []), dim)


@dataclass
class _Rows:
    """The claimed rows whose vectors the search computed (``LoadedRows``: nothing was read)."""

    rows: list[int]
    pixels: np.ndarray
    truncated: tuple[int, ...] = ()
    failed: tuple[tuple[int, str], ...] = ()
    seconds: dict[str, float] = field(default_factory=dict)
    retries: int = 0


class Promoter:
    """Writes the offered points to new on a background thread (see the module's docstring)."""

    def __init__(self, store: Store, name: str, encoder: OnnxEncoder) -> None:
        self.store, self.name, self.encoder = store, name, encoder
        self.counts = PromotionCounts()
        self._queue: queue.Queue[Offer] = queue.Queue(QUEUE)
        self._closing = threading.Event()
        self._idle = threading.Condition()
        self._pending = 0
        self._queued: set[PointId] = set()  # offered, not yet written or left alone
        self._thread: threading.Thread | None = None  # runs while there is work (see _run)

    def offer(self, offers: Sequence[Offer]) -> None:
        """Queue points to promote (never blocks: a full queue drops them, counted); a point
        queued or being written already is not queued again; after :meth:`close`, dropped."""
        if self._closing.is_set():
            with self._idle:
                self.counts.dropped += len(offers)
            return
        for item in offers:
            with self._idle:
                if item[0] in self._queued:
                    continue
                self._queued.add(item[0])
                self._pending += 1
            try:
                self._queue.put_nowait(item)
            except queue.Full:
                with self._idle:
                    self._queued.discard(item[0])
                    self._pending -= 1
                    self.counts.dropped += 1
        with self._idle:  # after the puts: a writer that found the queue empty has ended
            if self._thread is None and not self._closing.is_set():
                self._thread = threading.Thread(target=self._run, name="rmq-promote", daemon=True)
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every point offered so far was written or left alone; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        """Write batches until the queue stays empty for :data:`IDLE` seconds (or the promoter
        closes with nothing left): an index that stops promoting keeps no thread."""
        idle = 0.0
        while True:
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                idle += 0.1
                with self._idle:
                    if self._queue.empty() and (self._closing.is_set() or idle >= IDLE):
                        self._thread = None
                        return
                continue
            idle = 0.0
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._write(batch)

    def _write(self, batch: list[Offer]) -> None:
        try:
            result = promote_batch(self.store, self.name, self.encoder, batch)
        except (RmqError, OSError, RuntimeError, ValueError) as exc:  # a search's side job: log, go on
            log.warning("promoting %d points of pair %r failed: %s", len(batch), self.name, exc)
            result = None
        except Exception:
            log.exception("promoting %d points of pair %r failed", len(batch), self.name)
            result = None
        with self._idle:
            if result is None:
                self.counts.dropped += len(batch)
            else:
                self.counts.batches += 1
                self.counts.promoted += result.moved
                self.counts.skipped += len(batch) - result.moved
            self._pending -= len(batch)
            self._queued.difference_update(item[0] for item in batch)
            self._idle.notify_all()

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued (up to ``timeout`` seconds), then stop the thread; later offers
        are dropped."""
        with self._idle:
            self._closing.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
