"""AsyncDualIndex: :class:`~rm_qdrant.serving.dual.DualIndex` for asyncio applications."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Store

T = TypeVar("T")
P = ParamSpec("P")


def _off_loop(method: Callable[Concatenate[DualIndex, P], T]) -> Callable[..., Awaitable[T]]:
    """An awaitable method that runs ``method`` of the wrapped DualIndex on a worker thread."""

    async def call(self: AsyncDualIndex, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closed:
            raise ConfigError("this AsyncDualIndex is closed: open another one")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(method, self.index, *args, **kwargs))

    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = f"Awaitable :meth:`DualIndex.{method.__name__}`.\n\n{method.__doc__ or ''}"
    return call


class AsyncDualIndex:
    """The serving object for an asyncio service: each call is awaited, and the blocking work
    (decoding and encoding the query, the store's searches and writes) runs on worker threads,
    so the event loop goes on serving other requests meanwhile.

    Every method takes the arguments of the :class:`DualIndex` method of the same name and
    returns what it returns. ``workers`` threads run calls side by side (default: 4 against a
    Qdrant server, whose client sends concurrent requests; 1 for the embedded store and
    qdrant-client's local mode, which run one call at a time anyway). A call cancelled while
    it runs finishes in its thread; only its result is dropped.

    Example:
        >>> from rm_qdrant import AsyncDualIndex, open_store
        >>> async def handler(image_bytes):  # doctest: +SKIP
        ...     index = await AsyncDualIndex.open(open_store("http://qdrant:6333"), "photos")
        ...     return await index.search(image_bytes, limit=10, score_threshold=0.3)
    """

    def __init__(self, index: DualIndex, *, workers: int | None = None) -> None:
        if workers is None:
            workers = 4 if index.store.capabilities.concurrent_search else 1
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
        self.index = index
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rmq-async")

    @classmethod
    async def open(
        cls, store: Store, name: str, *, workers: int | None = None, **options: Any
    ) -> AsyncDualIndex:
        """Open pair ``name`` as :meth:`DualIndex.open` does (``options`` are its), off the loop."""
        index = await asyncio.to_thread(functools.partial(DualIndex.open, store, name, **options))
        return cls(index, workers=workers)

    @property
    def pair(self) -> PairRecord:
        """The pair record as the index last read it."""
        return self.index.pair

    search = _off_loop(DualIndex.search)
    search_batch = _off_loop(DualIndex.search_batch)
    search_vectors = _off_loop(DualIndex.search_vectors)
    search_vectors_batch = _off_loop(DualIndex.search_vectors_batch)
    query_vectors = _off_loop(DualIndex.query_vectors)
    add = _off_loop(DualIndex.add)
    upsert = _off_loop(DualIndex.upsert)
    upsert_vectors = _off_loop(DualIndex.upsert_vectors)
    delete = _off_loop(DualIndex.delete)
    set_payload = _off_loop(DualIndex.set_payload)
    retrieve = _off_loop(DualIndex.retrieve)
    count = _off_loop(DualIndex.count)
    refresh = _off_loop(DualIndex.refresh)
    status = _off_loop(DualIndex.status)
    progress = _off_loop(DualIndex.progress)

    async def close(self) -> None:
        """Wait for the calls in flight, then stop the worker threads (the store stays open)."""
        self._closed = True
        await asyncio.to_thread(self._pool.shutdown, wait=True)
        self.index.close()

    async def __aenter__(self) -> AsyncDualIndex:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
