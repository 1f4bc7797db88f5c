"""How fast a backfill moves and when it ends, from what its processes recorded (pure).

Every process that migrates a pair records how many points it moved in each
:data:`BUCKET_SECONDS`-long bucket of wall-clock time (see :mod:`rm_qdrant.pair.progress`). The
pace is the points all of them moved in the last :data:`WINDOW_SECONDS`, over the time that
window spans since the earliest of them started: shards that run side by side add up, runs that
follow one another (a restart) do not. A pause, or no process running, lowers the pace as the
window slides; after a whole window without a moved point there is no pace, and no ETA.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

BUCKET_SECONDS = 10
WINDOW_SECONDS = 600
#: A process that recorded nothing for this long is not counted as running now.
RUNNING_SECONDS = 120


@dataclass(frozen=True)
class Worker:
    """What one migrating process recorded.

    Attributes:
        started: when its batches began (seconds since the epoch).
        updated: when it last recorded.
        buckets: points moved per bucket, keyed by the bucket's start (seconds since the epoch,
            a multiple of :data:`BUCKET_SECONDS`).
        ended: whether its run ended (it is not running, however recent ``updated`` is).
        first: when its first batch settled (None: none yet, or recorded before this field).
        first_moved: the points of that batch.
    """

    started: float
    updated: float
    buckets: Mapping[int, int]
    ended: bool = False
    first: float | None = None
    first_moved: int = 0


@dataclass(frozen=True)
class Pace:
    """The recent pace of a pair's backfill.

    Attributes:
        points_per_second: points moved per second over the window (None: nothing moved in it).
        eta_seconds: ``remaining`` over that pace (None: no pace; 0 when nothing remains).
        window_seconds: the time the pace was measured over.
        running: processes that recorded in the last :data:`RUNNING_SECONDS` and did not end.
    """

    points_per_second: float | None
    eta_seconds: float | None
    window_seconds: float
    running: int


def bucket_of(t: float) -> int:
    """The bucket ``t`` falls in.

    >>> bucket_of(1234.5)
    1230
    """
    return int(t // BUCKET_SECONDS) * BUCKET_SECONDS


def add(
    buckets: Mapping[int, int], t: float, moved: int, *, window: float = WINDOW_SECONDS
) -> dict[int, int]:
    """``buckets`` with ``moved`` points added at ``t``, less the buckets older than the window.

    >>> add({0: 5}, 12.0, 3, window=600)
    {0: 5, 10: 3}
    >>> add({0: 5}, 700.0, 3, window=600)
    {700: 3}
    """
    key = bucket_of(t)
    kept = {k: n for k, n in buckets.items() if k + BUCKET_SECONDS > t - window}
    kept[key] = kept.get(key, 0) + moved
    return kept


def pace(workers: Iterable[Worker], *, now: float, remaining: int, window: float = WINDOW_SECONDS) -> Pace:
    """The pace of every worker together over the last ``window`` seconds (up to the last write
    of those still running), and the ETA of ``remaining`` points at that pace.

    >>> w = Worker(started=0.0, updated=100.0, buckets={0: 400, 50: 600})
    >>> pace([w], now=100.0, remaining=500)
    Pace(points_per_second=10.0, eta_seconds=50.0, window_seconds=100.0, running=1)
    """
    workers = list(workers)
    live = [w for w in workers if not w.ended and now - w.updated <= RUNNING_SECONDS]
    # Running processes write every few seconds: the pace ends at their last write, not now, or
    # the points they moved since would be missing from a span that counts the time.
    end = max((w.updated for w in live), default=now)
    start = end - window
    moved, first = 0, math.inf
    for worker in workers:
        recent = sum(n for k, n in worker.buckets.items() if k + BUCKET_SECONDS > start)
        if not recent:
            continue
        began = worker.started
        if worker.first is not None and worker.first > start:
            # A run's first batch waits for the pipeline to fill (claim, fetch, decode, encode,
            # write one after another); later batches come one encode apart. The pace is taken
            # from the first batch on, without its points, or a young run reads slow.
            began, recent = worker.first, recent - worker.first_moved
        moved += recent
        first = min(first, began)
    span = end - max(start, first) if first < math.inf else window
    running = len(live)
    if moved <= 0 or span <= 0:
        return Pace(None, 0.0 if remaining <= 0 else None, span, running)
    rate = moved / span
    return Pace(rate, max(0, remaining) / rate, span, running)
