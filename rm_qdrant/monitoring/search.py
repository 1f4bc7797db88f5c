"""Search metrics of a :class:`~rm_qdrant.serving.dual.DualIndex`, in a registry the application
owns (the one its own metrics are served from)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from rm_qdrant.errors import ConfigError
from rm_qdrant.monitoring.registering import register_all

#: Upper bounds of the search histogram, in seconds: from an embedded store's fraction of a
#: millisecond to a loaded server's seconds.
SEARCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: ``rmq_search_seconds``' sides: each collection's store searches, and the whole search.
SIDES = ("old", "new", "total")


@dataclass(frozen=True)
class _Series:
    """One pair's series (made at its first search, then looked up)."""

    searches: Any
    seconds: dict[str, Any]
    hits: dict[str, Any]


class SearchMetrics:
    """What each search of a DualIndex took and returned, as Prometheus metrics in ``registry``:
    pass it as ``DualIndex.open(store, name, metrics=...)`` (``AsyncDualIndex.open`` too).

    ``rmq_searches_total{pair}`` counts searches (one per call: a batch of queries is one);
    ``rmq_search_seconds{pair,side}`` is a histogram of their seconds, ``side="total"`` the
    whole call (encoding the query included), ``old`` and ``new`` the store's searches of each
    collection (a single-collection pair whose store searches both vectors in one query has
    ``total`` alone); ``rmq_search_hits_total{pair,side}`` counts the hits returned by the side
    they came from, so ``old / (old + new)`` is the share of the merged top k still served by
    the old model. One SearchMetrics serves every index of a process (each pair its label).

    Raises:
        ConfigError: ``registry`` already has metrics of these names (make one SearchMetrics a
            registry, and share it).

    Example:
        >>> from prometheus_client import CollectorRegistry, start_http_server  # doctest: +SKIP
        >>> registry = CollectorRegistry()  # doctest: +SKIP
        >>> metrics = SearchMetrics(registry)  # doctest: +SKIP
        >>> index = DualIndex.open(store, "photos", metrics=metrics)  # doctest: +SKIP
        >>> start_http_server(9108, registry=registry)  # doctest: +SKIP
    """

    def __init__(self, registry: CollectorRegistry, *, buckets: tuple[float, ...] = SEARCH_BUCKETS) -> None:
        if not isinstance(registry, CollectorRegistry):
            raise ConfigError(
                f"registry is a prometheus_client CollectorRegistry, not {type(registry).__name__}"
            )
        self._searches = Counter(
            "rmq_searches", "Searches of the pair (one per call).", ["pair"], registry=None
        )
        try:
            self._seconds = Histogram(
                "rmq_search_seconds",
                "Seconds a search took: total, and the store's searches of each side (old, new).",
                ["pair", "side"],
                registry=None,
                buckets=buckets,
            )
        except (TypeError, ValueError) as exc:  # prometheus_client: "Buckets not in sorted order", ...
            raise ConfigError(
                f"buckets are two or more upper bounds in seconds, increasing, got {buckets!r}: {exc}"
            ) from exc
        self._hits = Counter(
            "rmq_search_hits",
            "Hits returned, by the side of the pair they came from (old, new).",
            ["pair", "side"],
            registry=None,
        )
        try:
            register_all(registry, (self._searches, self._seconds, self._hits))
        except ValueError as exc:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
            raise ConfigError(
                f"a registry takes one SearchMetrics (share it between indexes): {exc}"
            ) from exc
        self._series: dict[str, _Series] = {}

    def searched(
        self, pair: str, seconds: float, sides: Mapping[str, float], hits: Mapping[str, int]
    ) -> None:
        """One search of ``pair`` (see :class:`~rm_qdrant.serving.observing.SearchObserver`)."""
        series = self._series.get(pair) or self._add(pair)
        series.searches.inc()
        series.seconds["total"].observe(seconds)
        for side, spent in sides.items():
            series.seconds[side].observe(spent)
        for side, count in hits.items():
            if count:
                series.hits[side].inc(count)

    def _add(self, pair: str) -> _Series:
        series = _Series(
            self._searches.labels(pair),
            {side: self._seconds.labels(pair, side) for side in SIDES},
            {side: self._hits.labels(pair, side) for side in ("old", "new")},
        )
        self._series[pair] = series  # two threads at once make the same series: labels() is idempotent
        return series
