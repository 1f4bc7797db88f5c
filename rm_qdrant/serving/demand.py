"""Search demand: how often searches returned each point from old, for ``rmq migrate --order
demand`` (the points users see migrate first).

The count is a payload field of the old point, ``rmq_demand``, beside the ranks: a search adds
its old hits to a dict in memory (:meth:`DemandLog.record`, no I/O), and a background thread adds
the dict to the payloads every few seconds (:meth:`DemandLog.flush`: one read of the counted
points that still serve from old, one payload merge). The merge leaves every other field as it
was, the migration's ``rmq_moving`` and ``rmq_batch`` marks included, and ``rmq_demand`` is one of
rm-qdrant's own fields: never shown in hits, never copied to new, cleared by the cutover and the
rollback.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Iterable, Mapping

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.ordering import demand_count
from rm_qdrant.core.planning import DEMAND
from rm_qdrant.errors import CollectionNotFound, ConfigError, InvalidPointId
from rm_qdrant.pair.layouts import active_where
from rm_qdrant.pair.record import PairRecord, load_pair
from rm_qdrant.store import Store
from rm_qdrant.store.filters import with_ids
from rm_qdrant.store.ids import normalize_id

log = logging.getLogger(__name__)


class DemandLog:
    """Counts the points searches returned from old; adds the counts to their ``rmq_demand``
    payload field.

    :meth:`record` takes a lock and updates a dict (about a microsecond for a query's hits);
    a daemon thread calls :meth:`flush` every ``flush_every`` seconds when something was
    counted. A failed flush is logged and its counts are kept for the next one; it never
    reaches a search. :meth:`close` stops the thread and flushes what is left.

    The flush reads each point's count, adds, and writes the sum. Two processes that flush the
    same point at the same moment (two serving replicas, say) can lose one's increments:
    ``rmq_demand`` is an ordering signal, not an exact tally. Counts for a pair that is no
    longer backfilling (finalized, rolled back, dropped) are dropped: nothing migrates any more.

    Example:
        >>> demand = DemandLog(store, load_pair(store, "photos"))  # doctest: +SKIP
        >>> demand.record([h.id for h in hits if h.source == "old"])  # doctest: +SKIP
        >>> demand.close()  # doctest: +SKIP
    """

    def __init__(self, store: Store, pair: PairRecord, *, flush_every: float = 5.0) -> None:
        """Start counting for ``pair`` (the flusher thread starts here).

        Raises:
            ConfigError: ``flush_every`` is not a finite number of seconds above 0.
        """
        if isinstance(flush_every, bool) or not isinstance(flush_every, (int, float)):
            raise ConfigError(f"flush_every is seconds above 0, got {flush_every!r}")
        if not 0 < flush_every < math.inf:
            raise ConfigError(f"flush_every is seconds above 0, got {flush_every!r}")
        self.store, self.pair, self.flush_every = store, pair, float(flush_every)
        self._counts: Counter[PointId] = Counter()
        self._lock = threading.Lock()  # the counts
        self._flushing = threading.Lock()  # one flush at a time: the thread's or a caller's
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"rmq-demand-{pair.name}", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Distinct points counted since the last flush."""
        with self._lock:
            return len(self._counts)

    def record(self, ids: Iterable[PointId]) -> None:
        """Count one search's hits from old (once each). No I/O; ignored once closed."""
        if self._closed.is_set():
            return
        with self._lock:
            self._counts.update(ids)

    def flush(self) -> int:
        """Add the counts so far to the points' ``rmq_demand``: one read of the counted points
        that still serve from old (a point migrated or deleted meanwhile is skipped), one
        payload merge.

        Returns:
            How many points were written.

        Raises:
            StoreError: the store refused the read or the write; the counts are kept for the
                next flush.
        """
        with self._flushing:
            with self._lock:
                taken, self._counts = self._counts, Counter()
            if not taken:
                return 0
            try:
                return self._add(taken)
            except Exception:
                with self._lock:
                    self._counts.update(taken)
                raise

    def close(self) -> None:
        """Stop the flusher thread and flush what is left (a failure is logged, not raised: the
        counts are an ordering signal, and a closing server has nothing to retry with)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        try:
            self.flush()
        except Exception:
            log.warning("demand of %d points not written on close", self.pending, exc_info=True)

    def __enter__(self) -> DemandLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._closed.wait(self.flush_every):
            if not self.pending:
                continue
            try:
                self.flush()
            except Exception:
                log.warning("demand flush failed; its counts wait for the next", exc_info=True)

    def _add(self, taken: Mapping[PointId, int]) -> int:
        pair = self._backfilling()
        if pair is None:
            return 0
        counts = _checked(taken)
        if not counts:
            return 0
        where = with_ids(list(counts)) & active_where(pair)
        page, _ = self.store.scroll(pair.old_collection, limit=len(counts), where=where)
        items = [(r.id, {DEMAND: demand_count(r.payload) + counts[r.id]}) for r in page if r.id in counts]
        return self.store.set_payload(pair.old_collection, items) if items else 0

    def _backfilling(self) -> PairRecord | None:
        """The pair as recorded now, if it still migrates (its layout and state as the record
        says: a cutover may have begun since this log started)."""
        try:
            pair = load_pair(self.store, self.pair.name)
        except CollectionNotFound:
            log.info("pair %r is gone: demand dropped", self.pair.name)
            return None
        if pair.state != "backfilling":
            log.info("pair %r is %s: demand dropped", pair.name, pair.state)
            return None
        self.pair = pair
        return pair


def _checked(taken: Mapping[PointId, int]) -> dict[PointId, int]:
    """The counts by each id's canonical form (as the store returns it); ids that cannot be a
    point's are dropped, with a log line, rather than fail every flush after them."""
    counts: dict[PointId, int] = {}
    for point_id, count in taken.items():
        try:
            key = normalize_id(point_id)
        except InvalidPointId:
            log.warning("demand for %r dropped: not a point id", point_id)
            continue
        counts[key] = counts.get(key, 0) + count
    return counts
