"""Keeping the embedded store's HNSW indexes built while a backfill writes.

qdrant-edge has no background optimizer: points written (or whose payload changed) since
the last ``optimize`` are searched by a scan, so a live backfill would serve from a shard
slower than any published figure. A server optimises by itself; there this is a no-op.

A migration optimises the collections it writes after a batch once ``every`` seconds have
passed since the last optimisation, and at the end of the run. The interval also stretches
to ``1 / MAX_SHARE`` times the last optimisation's cost, so optimising never takes more than
about a tenth of the run, however large the collection.

How the default was chosen (``benchmarks/search_during_migration.py``, 20,000 CIFAR-10
points, 2 shared cores): qdrant-edge 0.9 holds Python's GIL while it builds, so a build
stalls every thread of the process, searches included (2.4-2.8 s for a paired run's new
collection, 10-16 s for a single-collection one, whose every point changed); a build below
the shard's indexing threshold does almost nothing; and search while a migration runs was
slower (p50 2.4-2.6 ms against 0.5-0.6 ms after) whatever the interval, from sharing the
cores with the migration, not from unindexed points. Building every 5 s halved the
migration's rate for no gain in search. So builds are rare: every 30 s at most, and never
more than a tenth of the run, which still bounds the unindexed points of a long backfill
(a 1M-point run would otherwise search whatever it wrote by a scan until it ends).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from rm_qdrant.store import Store

log = logging.getLogger(__name__)
#: Seconds between optimisations while a migration runs (``MigrateOptions.optimize_every``).
OPTIMIZE_EVERY = 30.0
#: Most of a run's time the optimisations may take: the interval stretches to keep under it.
MAX_SHARE = 0.1


def optimizes(store: Store) -> bool:
    """Whether ``store`` builds its indexes only when asked (the embedded store does)."""
    return store.capabilities.optimizes


def optimize_collections(store: Store, names: Sequence[str]) -> float:
    """Build the indexes of ``names`` now where the store needs it; the seconds it took
    (0 on a store that optimises by itself: a Qdrant server, qdrant-client's local mode)."""
    if not optimizes(store):
        return 0.0
    started = time.perf_counter()
    for name in dict.fromkeys(names):  # one collection named twice (single collection): once
        store.optimize(name)  # type: ignore[attr-defined]
    spent = time.perf_counter() - started
    log.debug("optimized %s in %.2f s", ", ".join(names), spent)
    return spent


class IndexUpkeep:
    """Paces the optimisations of one migration run (shared by its workers; thread-safe).

    Args:
        store: the pair's store.
        collections: the collections the run writes.
        every: seconds between optimisations while the run goes on; None: only at the end.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        store: Store,
        collections: Sequence[str],
        *,
        every: float | None = OPTIMIZE_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.collections = list(collections)
        self.every = every
        self.clock = clock
        self.active = optimizes(store)
        self.seconds = 0.0  # spent optimising so far
        self.runs = 0
        self._last_cost = 0.0
        self._since = clock()
        self._dirty = False
        self._lock = threading.Lock()

    def written(self) -> None:
        """A batch was written: optimise if the interval has passed."""
        if not self.active:
            return
        with self._lock:
            self._dirty = True
            if self.every is None:
                return
            interval = max(self.every, self._last_cost / MAX_SHARE)
            if self.clock() - self._since >= interval:
                self._optimize()

    def finish(self) -> None:
        """The run is over: optimise what it wrote since the last optimisation."""
        with self._lock:
            if self.active and self._dirty:
                self._optimize()

    def _optimize(self) -> None:
        started = self.clock()
        optimize_collections(self.store, self.collections)
        self._since = self.clock()
        self._last_cost = self._since - started
        self.seconds += self._last_cost
        self.runs += 1
        self._dirty = False
