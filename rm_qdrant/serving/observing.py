"""What a :class:`~rm_qdrant.serving.dual.DualIndex` tells a search observer (its ``metrics=``,
a :class:`~rm_qdrant.monitoring.SearchMetrics`): each search's seconds in all and on each side,
and the side each hit of the merged list came from.

A search is one call of a search method (``search``, ``search_batch``, ``search_vectors``,
``search_vectors_batch``, and their awaitable twins): the outermost call is timed, so
``search`` (which encodes the query, then calls ``search_vectors_batch``) is one search whose
seconds include encoding the query. An index without an observer does none of this.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from rm_qdrant.core.merge import Hit
from rm_qdrant.errors import ConfigError

T = TypeVar("T")


class SearchObserver(Protocol):
    """Told of each search a DualIndex made (:class:`~rm_qdrant.monitoring.SearchMetrics`)."""

    def searched(
        self, pair: str, seconds: float, sides: Mapping[str, float], hits: Mapping[str, int]
    ) -> None:
        """One search of ``pair``: its ``seconds`` in all; the seconds of the store's searches of
        each side it searched apart (``old``, ``new``; none where one query searched both);
        the hits of the lists it returned, by the side each came from."""


class Timing:
    """One search under way: the seconds each side's store searches took, summed (a search may
    ask a side again, for a tie at the end of its list)."""

    __slots__ = ("sides",)

    def __init__(self) -> None:
        self.sides: dict[str, float] = {}

    def add(self, side: str, seconds: float) -> None:
        self.sides[side] = self.sides.get(side, 0.0) + seconds


def timed(timing: Timing | None, side: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, its seconds added to ``timing``'s ``side`` (None: just the call)."""
    if timing is None:
        return call(*args, **kwargs)
    started = time.perf_counter()
    try:
        return call(*args, **kwargs)
    finally:
        timing.add(side, time.perf_counter() - started)


class Watch:
    """A DualIndex's observer and the search each thread has under way."""

    def __init__(self, observer: SearchObserver) -> None:
        if not callable(getattr(observer, "searched", None)):
            raise ConfigError(
                f"metrics is a SearchMetrics (or an object with its searched method), "
                f"not {type(observer).__name__}"
            )
        self.observer = observer
        self._local = threading.local()

    def current(self) -> Timing | None:
        """The search this thread has under way, if any."""
        return getattr(self._local, "timing", None)

    def around(self, pair: str, call: Callable[[], T], *, batch: bool) -> T:
        """``call()``, observed as one search unless it runs inside another (its caller's)."""
        if self.current() is not None:
            return call()
        timing = self._local.timing = Timing()
        started = time.perf_counter()
        try:
            result = call()
        finally:
            self._local.timing = None
        seconds = time.perf_counter() - started
        rows: Sequence[Sequence[Hit]] = result if batch else [result]  # type: ignore[assignment]
        hits = {"old": 0, "new": 0}
        for row in rows:
            for hit in row:
                hits[hit.source] += 1
        self.observer.searched(pair, seconds, timing.sides, hits)
        return result


def observed(*, batch: bool) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A DualIndex search method, observed when the index has metrics (``batch``: it returns a
    list of hit lists, one per query)."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> T:
            watch: Watch | None = self._watch
            if watch is None:
                return method(self, *args, **kwargs)
            return watch.around(self.pair.name, lambda: method(self, *args, **kwargs), batch=batch)

        return call

    return wrap
