"""How DualIndex searches a pair: each side searched for one hit more than the list keeps,
the two merged by distance with equal distances in id order, a tie at a list's end searched
again (a mixin of :class:`~rm_qdrant.serving.dual.DualIndex`)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from rm_qdrant.core.calibration import Calibration
from rm_qdrant.core.merge import Hit, Source, merge, settled
from rm_qdrant.core.planning import INTERNAL_FIELDS, user_payload
from rm_qdrant.errors import ConfigError, DimensionMismatch, Unsupported
from rm_qdrant.serving.observing import Watch, timed
from rm_qdrant.serving.search_options import (
    SearchOptions,
    with_late_copies,
    without_copies,
    without_stale,
)
from rm_qdrant.store import ScoredRecord, Where
from rm_qdrant.store.base import MergedQuery, as_floats
from rm_qdrant.store.params import old_side_params

if TYPE_CHECKING:
    from rm_qdrant.pair.layouts import Layout
    from rm_qdrant.pair.record import PairRecord
    from rm_qdrant.store import Store

log = logging.getLogger(__name__)


class PairSearch:
    """The search across the pair's two sides (a mixin of DualIndex, which sets these)."""

    store: Store
    pair: PairRecord
    layout: Layout
    exact: bool
    hnsw_ef: int | None
    _new_dim: int
    _old_dim: int | None
    _two_queries: bool
    _pool: ThreadPoolExecutor | None
    _to_distance: tuple[float, float]
    _watch: Watch | None

    def _search(
        self,
        new_vectors: np.ndarray | None,
        old_vectors: np.ndarray | None,
        limit: int,
        filter: Where | None,
        opts: SearchOptions,
    ) -> list[list[Hit]]:
        """Each row's first ``limit`` merged hits, equal distances in id order (:func:`rank_key`).

        A store's search cut at n keeps which of several points tied at the cut it likes, and
        may keep others for another n: each side is asked for one hit more than the list keeps,
        and a row is asked again for twice as many while :func:`settled` finds that a side's
        answer ends in a tie with the list's last hit (a point that ties may be left out). No
        tie at the end (the usual case): one search a side, one hit longer; a page that ends
        inside a group of T points at one distance reads them all (about 2T hits a side).
        With the HNSW index (``exact=False``) pages are as consistent as its answers for
        different limits are; exact search, or a collection under the full-scan threshold,
        gives the reference's pages.
        """
        new_q, old_q, rows = self._queries(new_vectors, old_vectors)
        if limit == 0:  # no hit asked for (qdrant-client refuses a search for none)
            return [[] for _ in range(rows)]
        merged: list[list[Hit]] = [[] for _ in range(rows)]
        todo, asked, bound = list(range(rows)), limit + 1, opts.bound(self.pair.distance)
        while todo:
            new_rows, old_rows = (q if q is None or len(todo) == rows else q[todo] for q in (new_q, old_q))
            found, one_query = self._search_once(new_rows, old_rows, asked, filter, opts)
            left = []
            for row, (old, new) in zip(todo, found, strict=True):
                merged[row] = merge(old, new, limit)
                if not settled([old + new] if one_query else [old, new], asked, merged[row], limit, bound):
                    left.append(row)
            todo, asked = left, asked * 2
        return merged

    def _queries(
        self, new_vectors: np.ndarray | None, old_vectors: np.ndarray | None
    ) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        """The query matrices of the sides the pair serves (None: not searched), and their rows."""
        pair = self.pair
        new_q = self._check(new_vectors, self._new_dim, "new") if pair.serves_new else None
        old_q = self._check(old_vectors, self._old_dim, "old") if pair.serves_old else None
        if new_q is not None and old_q is not None and len(new_q) != len(old_q):
            raise ConfigError(f"{len(new_q)} new query vectors but {len(old_q)} old ones")
        rows = len(new_q) if new_q is not None else len(old_q) if old_q is not None else 0
        return new_q, old_q, rows

    def _search_once(
        self,
        new_q: np.ndarray | None,
        old_q: np.ndarray | None,
        limit: int,
        filter: Where | None,
        opts: SearchOptions,
    ) -> tuple[list[tuple[list[Hit], list[Hit]]], bool]:
        """Each row's hits from old and from new, each side searched for ``limit``; and whether
        the two came from one merged query (``limit`` in all) rather than two searches."""
        pair = self.pair
        rows = len(new_q) if new_q is not None else len(old_q) if old_q is not None else 0
        params = opts.params(self.exact, self.hnsw_ef)
        request = {"search_params": params, "timeout": opts.timeout, "consistency": opts.consistency}
        if new_q is not None and old_q is not None and not self._two_queries and pair.old_distance is None:
            try:
                query = MergedQuery(pair.vector, pair.new_using, pair.distance, limit, filter, **request)
                results = self.store.merged_search(pair.old_collection, old_q, new_q, query)
                rows_hits = [[self._hit(r, "new" if r.in_new else "old") for r in row] for row in results]
                return [_by_side(hits) for hits in rows_hits], True
            except Unsupported as exc:
                log.warning("%s; searching the two vectors one after the other", exc)
                self._two_queries = True
        args: dict[str, Any] = {"limit": limit, "filter": filter, **request}
        old_args = {**args, "filter": self.layout.old_filter(filter), "vector": pair.vector}
        if self.layout.one_query and self.store.capabilities.filtered_recall:
            old_args["search_params"] = old_side_params(params)  # as the merged query's old prefetch
        new_args = {**args, "vector": pair.new_using}
        old_name, new_name = self.pair.old_collection, self.pair.new_collection
        timing = None if self._watch is None else self._watch.current()
        # A migrating point is written to new before it leaves old, so searching old
        # first and new second can see it twice (merge keeps one), never zero times.
        # Searches sent together to a server have no order; the migration then waits
        # REMOVAL_GRACE seconds between the two writes instead (see migrate.py).
        pending = None
        if self._pool is not None and new_q is not None and old_q is not None:
            pending = self._pool.submit(timed, timing, "old", self.store.search, old_name, old_q, **old_args)
        old_raw: list[list[ScoredRecord]] | None = None
        if pending is None and old_q is not None:
            old_raw = timed(timing, "old", self.store.search, old_name, old_q, **old_args)
            if new_q is not None:  # before new's search: a copy found now is there for it too
                old_raw, _ = without_copies(self.store, pair, old_raw, old_q, old_args)
        new_raw = None
        if new_q is not None:
            new_raw = timed(timing, "new", self.store.search, new_name, new_q, **new_args)
        if pending is not None and new_raw is not None:
            old_raw, dropped = without_copies(self.store, pair, pending.result(), old_q, old_args)
            new_raw = with_late_copies(self.store, pair, new_raw, dropped, new_q, new_args)
        if new_raw is not None and old_q is not None and not self.layout.one_query:  # see bypass.py
            new_raw = without_stale(self.store, pair, new_raw, new_q, new_args)
        sides = zip(self._hits(old_raw, "old", rows), self._hits(new_raw, "new", rows), strict=True)
        return list(sides), False

    def _check(self, vectors: np.ndarray | None, dim: int | None, side: str) -> np.ndarray:
        if vectors is None or dim is None:
            raise ConfigError(f"pair {self.pair.name!r} is {self.pair.state}: it needs {side} query vectors")
        array = as_floats(vectors, f"{side} vectors")
        if array.ndim == 1:
            array = array.reshape(1, -1)
        if array.ndim != 2 or array.shape[1] != dim:
            raise DimensionMismatch(f"{side} collection takes {dim}-d queries, got shape {array.shape}")
        return array

    def _hits(self, results: list[list[ScoredRecord]] | None, source: Source, rows: int) -> list[list[Hit]]:
        if results is None:
            return [[] for _ in range(rows)]
        scale = self.pair.old_distance if source == "old" else None
        return [[self._hit(r, source, scale) for r in hits] for hits in results]

    def _hit(self, record: ScoredRecord, source: Source, scale: Calibration | None = None) -> Hit:
        at, slope = self._to_distance  # score_to_distance, without its per-hit checks
        d = at + slope * record.score if scale is None else float(scale(np.array(at + slope * record.score)))
        p = record.payload
        return Hit(
            record.id, record.score, d, source, p if p.keys().isdisjoint(INTERNAL_FIELDS) else user_payload(p)
        )


def _by_side(hits: list[Hit]) -> tuple[list[Hit], list[Hit]]:
    """A merged query's hits as (old's, new's)."""
    return [h for h in hits if h.source == "old"], [h for h in hits if h.source == "new"]
