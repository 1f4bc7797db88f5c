"""The backfill's recorded progress: each migrating process writes, beside the pair's record,
how many points it moved in each bucket of recent wall-clock time, so that ``rmq status`` (and
the metrics) tell the same pace and ETA from any process, after restarts too.

One point per process and run in ``rmq_meta`` (kind ``progress``): processes never write the
same point, so shards need no lock. A process writes at most every :data:`WRITE_EVERY` seconds
and once when it ends; points that stopped recording a day ago are removed when a run starts.

A text pair's run also records how many of the documents it moved were cut at the model's
``max_length`` (and that length): ``rmq status`` shows the sum over every run of the backfill, so
those points are kept past the day, until the pair is dropped or made again.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rm_qdrant.core.pace import WINDOW_SECONDS, Pace, Worker, add, pace
from rm_qdrant.pair.record import META_COLLECTION, _put
from rm_qdrant.store import Record, Store, Where

log = logging.getLogger(__name__)

KIND = "progress"
WRITE_EVERY = 2.0
FORGET_AFTER = 86_400.0
#: A run between two batches (a long batch, ``--rate``, ``rmq pause``) still writes this often, so
#: ``rmq status`` counts it as migrating now and its pace takes the time that passed.
HEARTBEAT = 30.0


class ProgressRecorder:
    """Records the points one migration run moved (thread-safe: its workers share it).

    Example:
        >>> recorder = ProgressRecorder(store, "photos")  # doctest: +SKIP
        >>> recorder.moved(1000)  # doctest: +SKIP
        >>> recorder.close()  # doctest: +SKIP
    """

    def __init__(self, store: Store, name: str, *, max_length: int | None = None) -> None:
        """``max_length``: a text pair's run, the tokens its model reads (its cut documents are
        counted); None for an image pair's."""
        self.store, self.name, self.max_length = store, name, max_length
        self._truncated = 0
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.started = time.time()
        self._buckets: dict[int, int] = {}
        self._first: tuple[float, int] | None = None
        self._written = 0.0
        self._lock = threading.Lock()
        _forget(store, name, before=self.started - FORGET_AFTER)
        self._write(self.started)  # a run that starts paused (or slow) shows as running at once
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="rmq-progress", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT / 3):
            with self._lock:
                now = time.time()
                if now - self._written < HEARTBEAT or self._stop.is_set():
                    continue
                try:
                    self._write(now)
                except Exception as exc:  # noqa: BLE001 - a missed beat must not end the run
                    log.warning("pair %r: cannot record this run's progress: %s", self.name, exc)

    def moved(self, points: int, *, truncated: int = 0) -> None:
        """Count ``points`` moved now (``truncated`` of them texts cut at ``max_length``); written
        to the store at most every :data:`WRITE_EVERY` s."""
        with self._lock:
            now = time.time()
            self._truncated += truncated
            if self._first is None and points:
                self._first = (now, points)
            self._buckets = add(self._buckets, now, points)
            if now - self._written >= WRITE_EVERY:
                self._write(now)

    def close(self) -> None:
        """Write what is not written yet, and that this run ended."""
        self._stop.set()
        self._beat.join()
        with self._lock:
            self._write(time.time(), ended=True)

    def _write(self, now: float, *, ended: bool = False) -> None:
        payload = {
            "kind": KIND,
            "name": self.name,
            "worker": self.worker,
            "started": self.started,
            "updated": now,
            "ended": ended,
            "first": self._first[0] if self._first else None,
            "first_moved": self._first[1] if self._first else 0,
            "buckets": {str(k): n for k, n in self._buckets.items()},
        }
        if self.max_length is not None:
            payload.update(truncated=self._truncated, max_length=self.max_length)
        _put(self.store, KIND, f"{self.name}/{self.worker}", payload)
        self._written = now


def workers(store: Store, name: str) -> list[Worker]:
    """What every process that migrated the pair recorded (records that cannot be read, edited by
    hand or written by another version, are left out with one warning; the next run removes them)."""
    read = [(r.payload, _worker(r.payload)) for r in _records(store, name)]
    unreadable = sum(worker is None for _, worker in read)
    if unreadable:
        log.warning(
            "pair %r: %d progress record(s) in %s not as rm-qdrant writes them, left out of the pace "
            "(the next rmq migrate removes them)",
            name,
            unreadable,
            META_COLLECTION,
        )
    return [worker for _, worker in read if worker is not None]


def _records(store: Store, name: str) -> list[Record]:
    if not store.has_collection(META_COLLECTION):
        return []
    where, found, offset = Where(must={"kind": KIND, "name": name}), [], None
    while True:
        page, offset = store.scroll(META_COLLECTION, limit=10_000, offset=offset, where=where)
        found += page
        if offset is None:
            return found


@dataclass(frozen=True)
class Truncation:
    """The documents a text pair's runs moved whose text was cut at the model's ``max_length``.

    Attributes:
        documents: their count, every run of the backfill together.
        max_lengths: the ``max_length`` of the runs, in tokens (one, unless ``rmq switch-encoder``
            changed the model's window meanwhile).
    """

    documents: int
    max_lengths: tuple[int, ...]


def recorded_truncation(store: Store, name: str) -> Truncation | None:
    """What the pair's runs recorded of the texts they cut (None: no run of a text pair recorded
    it, as for an image pair; a record not as rm-qdrant writes it is left out)."""
    counts = [_truncation(r.payload) for r in _records(store, name)]
    known = [c for c in counts if c is not None]
    if not known:
        return None
    return Truncation(sum(n for n, _ in known), tuple(sorted({length for _, length in known})))


def _truncation(payload: dict[str, Any]) -> tuple[int, int] | None:
    """A text run's (documents cut, max_length), or None."""
    count, length = payload.get("truncated"), payload.get("max_length")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (count, length)):
        return None
    return (count, length) if count >= 0 and length > 0 else None  # type: ignore[operator,return-value]


def _worker(payload: dict[str, Any]) -> Worker | None:
    """One process's record, or None where it is not as :class:`ProgressRecorder` writes it."""
    started, updated, buckets = payload.get("started"), payload.get("updated"), payload.get("buckets", {})
    if not (_time(started) and _time(updated) and isinstance(buckets, dict)):
        return None
    try:
        counts = {int(k): n for k, n in buckets.items()}
    except ValueError:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts.values()):
        return None
    first = payload.get("first")
    first_moved = payload.get("first_moved") or 0
    return Worker(
        started=float(started),
        updated=float(updated),
        ended=bool(payload.get("ended")),
        buckets=counts,
        first=float(first) if _time(first) else None,
        first_moved=first_moved if isinstance(first_moved, int) and not isinstance(first_moved, bool) else 0,
    )


def _time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def recorded_pace(store: Store, name: str, remaining: int, *, now: float | None = None) -> Pace:
    """The pair's pace over the last :data:`~rm_qdrant.core.pace.WINDOW_SECONDS`, every process
    together, and the ETA of ``remaining`` points at that pace."""
    return pace(workers(store, name), now=time.time() if now is None else now, remaining=remaining)


def forget_progress(store: Store, name: str) -> None:
    """Remove every progress point of the pair (``rmq drop-pair``)."""
    _forget(store, name, before=float("inf"), all_runs=True)


def _forget(store: Store, name: str, *, before: float, all_runs: bool = False) -> None:
    """Remove the pair's progress records last written before ``before``, and unreadable ones;
    a text run's record, which counts its cut documents, only with ``all_runs`` (the pair goes)."""
    old = [
        r.id
        for r in _records(store, name)
        if (w := _worker(r.payload)) is None
        or (w.updated < before and (all_runs or _truncation(r.payload) is None))
    ]
    if old:
        store.delete(META_COLLECTION, old)


__all__ = [
    "WINDOW_SECONDS",
    "Pace",
    "ProgressRecorder",
    "Truncation",
    "forget_progress",
    "recorded_pace",
    "recorded_truncation",
    "workers",
]
