"""The re-rank's reads: the new model embeds the old hits of a merged list from their source.

:class:`Reranker` belongs to one :class:`~rm_qdrant.serving.dual.DualIndex`. For a batch of
queries it gathers the old hits among each list's first K, takes what the cache holds, reads
(fetch and decode, in parallel threads) up to the budget of the others within the deadline,
embeds what was read in one pass of the new model, and re-orders each list
(:func:`~rm_qdrant.core.rerank.reranked`). Items are read under the pair's source rules (its
``rmq init`` source settings: root, schemes, private addresses, sizes), as the migration reads
them. The vectors computed are kept in a bounded cache keyed by point id and the item's
identity (its URI, or its text), so a point rewritten with another image is embedded again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rm_qdrant.core.merge import Hit, PointId
from rm_qdrant.core.rerank import Rerank, Rescored, new_distances, reranked
from rm_qdrant.core.uris import InlineText
from rm_qdrant.errors import SourceError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.outcome import unusable_rows
from rm_qdrant.pair.reading import read_item
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import ImageSource, SourceConfig

log = logging.getLogger(__name__)
#: Threads fetching one index's re-rank items over the network (they wait), and reading local
#: files and payload texts (short; never queued behind a slow network source).
NETWORK_READERS, LOCAL_READERS = 8, 2
#: Longest a re-rank's network fetch may take, in all, with no retry: a slow source holds a
#: reader thread this long at most, past any deadline worth giving a search (the pair's own
#: timeout, if shorter, holds).
FETCH_TIMEOUT = 2.0
#: Memory the cache of new-model vectors may take by default.
CACHE_BYTES = 64 * 1024 * 1024

Key = tuple[PointId, str]


def identity(uri: Any) -> str:
    """What names an item for the cache: its URI, or a hash of an inline text."""
    if isinstance(uri, InlineText):
        text = uri.value if isinstance(uri.value, str) else repr(uri.value)
        return "text:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"uri:{uri}"


class VectorCache:
    """New-model vectors by (point id, item identity), least recently used first out, at most
    ``max_bytes`` of vectors (thread-safe)."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[Key, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Key) -> np.ndarray | None:
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
            return row

    def put(self, key: Key, row: np.ndarray) -> None:
        with self._lock:
            old = self._rows.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            if row.nbytes > self.max_bytes:
                return
            self._rows[key] = row
            self._bytes += row.nbytes
            while self._bytes > self.max_bytes:
                _, gone = self._rows.popitem(last=False)
                self._bytes -= gone.nbytes

    def __len__(self) -> int:
        return len(self._rows)


@dataclass
class _Candidate:
    """One old hit to re-score: where its item is, and what became of it."""

    id: PointId
    payload: dict[str, Any]
    uri: Any = None
    key: Key | None = None
    result: Rescored | None = None
    vector: np.ndarray | None = None


Promote = Callable[[list[tuple[PointId, dict[str, Any], np.ndarray]]], None]


class Reranker:
    """Re-scores merged hit lists with the new model (see the module's docstring)."""

    def __init__(
        self,
        pair: PairRecord,
        encoder: OnnxEncoder,
        source: SourceConfig,
        *,
        cache_bytes: int = CACHE_BYTES,
    ) -> None:
        self.pair = pair
        self.encoder = encoder
        self.output = encoder.info.gallery_output()
        self.cache = VectorCache(cache_bytes)
        self._stop = threading.Event()
        capped = replace(source, timeout=min(source.timeout, FETCH_TIMEOUT), retries=0)
        self.source = ImageSource(capped, stop=self._stop)
        self._network = ThreadPoolExecutor(NETWORK_READERS, "rmq-rerank-net")
        self._local = ThreadPoolExecutor(LOCAL_READERS, "rmq-rerank-local")
        self.reads = 0  # items read in all (for benchmarks and metrics)

    def rescore(
        self,
        rows: list[list[Hit]],
        queries: np.ndarray,
        options: Rerank,
        *,
        promote: Promote | None = None,
    ) -> list[list[Hit]]:
        """Each merged list with its first ``options.k`` re-ordered by the new model's distances
        to the row's query in ``queries`` (new-model query vectors, one row per list)."""
        deadline = time.monotonic() + options.deadline
        wanted: dict[PointId, _Candidate] = {}
        to_read: dict[PointId, _Candidate] = {}
        for hits in rows:
            budget = options.reads
            for hit in hits[: options.k]:
                if hit.source != "old":
                    continue
                got = wanted.get(hit.id) or self._candidate(hit)
                wanted[hit.id] = got
                if got.result is not None or hit.id in to_read:
                    continue
                if budget > 0:
                    to_read[hit.id] = got
                    budget -= 1
        self._read(list(to_read.values()), deadline)
        for got in wanted.values():
            if got.result is None:
                got.result = Rescored("over budget")
        rescored = []
        for hits, query in zip(rows, queries, strict=True):
            found = self._scored([wanted[h.id] for h in hits[: options.k] if h.id in wanted], query)
            rescored.append(reranked(hits, options.k, found, self.pair.distance))
        if promote is not None:  # cached ones too: one kept from a search while promotion was paused
            ready = [(c.id, c.payload, c.vector) for c in wanted.values() if c.vector is not None]
            if ready:
                promote(ready)  # type: ignore[arg-type]
        return rescored

    def _candidate(self, hit: Hit) -> _Candidate:
        got = _Candidate(hit.id, hit.payload)
        try:
            got.uri = self.pair.uri_rule.uri(hit.id, hit.payload)
        except SourceError as exc:
            got.result = Rescored("unreadable", error=str(exc))
            return got
        got.key = (hit.id, identity(got.uri))
        cached = self.cache.get(got.key)
        if cached is not None:
            got.vector, got.result = cached, Rescored("cached")
        return got

    def _read(self, todo: list[_Candidate], deadline: float) -> None:
        """Read and embed ``todo`` (closest first), waiting for the reads until ``deadline``."""
        if not todo:
            return
        jobs: dict[Future[Any], _Candidate] = {
            (self._local if self.source.is_local(c.uri) else self._network).submit(self._item, c): c
            for c in todo
        }
        done, late = wait(jobs, timeout=max(0.0, deadline - time.monotonic()))
        for job in late:
            job.cancel()  # not begun: never read; begun: its result is dropped
            jobs[job].result = Rescored("late")
        read = [(jobs[job], job.result()) for job in done]
        items = []
        for got, (item, error) in read:
            if item is None:
                got.result = Rescored("unreadable", error=error)
            else:
                items.append((got, item))
        self.reads += len(read)
        if items:
            self._embed(items)

    def _item(self, got: _Candidate) -> tuple[np.ndarray | None, str]:
        spent = [0.0, 0.0]
        item, error, _ = read_item(self.encoder, self.source, got.id, got.uri, spent)
        return item, error

    def _embed(self, items: list[tuple[_Candidate, np.ndarray]]) -> None:
        batch = self.encoder.blank(len(items))
        for row, (_, item) in enumerate(items):
            batch[row] = item
        try:
            vectors = self.encoder.run_pixels(batch, [self.output])[self.output]
        except Exception as exc:  # one bad batch must not fail the search: the hits keep their distances
            log.warning("the re-rank's embedding failed", exc_info=True)
            for got, _ in items:
                got.result = Rescored("unreadable", error=f"the new model failed: {type(exc).__name__}")
            return
        bad = unusable_rows(vectors, self.pair.distance)
        for (got, _), vector, unusable in zip(items, vectors, bad.tolist(), strict=True):
            if unusable:
                got.result = Rescored(
                    "unreadable", error="the new model returned NaN, infinity or a zero vector"
                )
                continue
            row = np.array(vector, dtype=np.float32)
            got.vector, got.result = row, Rescored("embedded")
            if got.key is not None:
                self.cache.put(got.key, row)

    def _scored(self, candidates: list[_Candidate], query: np.ndarray) -> dict[PointId, Rescored]:
        """What each of one query's candidates got: the new model's distance to ``query`` where it
        has a vector (all of them in one pass), else its state alone."""
        found = {got.id: got.result or Rescored("late") for got in candidates}
        with_vector = [got for got in candidates if got.vector is not None]
        if with_vector:
            rows = np.stack([got.vector for got in with_vector])
            distances = new_distances(query, rows, self.pair.distance).tolist()
            for got, distance in zip(with_vector, distances, strict=True):
                found[got.id] = Rescored(found[got.id].state, distance)
        return found

    def close(self) -> None:
        """Stop the reads: those not begun give up, the threads end."""
        self._stop.set()
        for pool in (self._network, self._local):
            pool.shutdown(wait=False, cancel_futures=True)
        self.source.close()
