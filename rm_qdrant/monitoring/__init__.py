"""Prometheus metrics: a migration's (``rmq migrate --metrics-port``) and a DualIndex's searches
(:class:`SearchMetrics`). The names and labels are in docs/guides/operations.md#metrics."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from rm_qdrant.monitoring.migration import MigrationMetrics, PairFigures, read_figures
from rm_qdrant.monitoring.search import SearchMetrics
from rm_qdrant.monitoring.server import DEFAULT_HOST, MetricsServer, check_port, start_metrics
from rm_qdrant.pair.outcome import BatchResult
from rm_qdrant.store import Store

__all__ = [
    "DEFAULT_HOST",
    "MetricsServer",
    "MigrationMetrics",
    "PairFigures",
    "SearchMetrics",
    "check_port",
    "exported_metric_names",
    "observing",
    "read_figures",
    "start_metrics",
]


def observing(
    server: MetricsServer | None, store: Store, name: str, on_batch: Callable[[BatchResult], None] | None
) -> Callable[[BatchResult], None] | None:
    """The ``on_batch`` of a migration of pair ``name`` served on ``server``: each batch is
    observed by its :class:`MigrationMetrics`, then given to ``on_batch``. No server:
    ``on_batch`` as it is."""
    if server is None:
        return on_batch
    return MigrationMetrics.of_pair(server.registry, store, name).chained(on_batch)


def exported_metric_names() -> set[str]:
    """Every metric name rm-qdrant exports, as a dashboard queries it (a counter with its
    ``_total``; a histogram by its base name, whose series add ``_bucket``, ``_sum`` and
    ``_count``), read from the families a migration's and a search's metrics register."""
    registry = CollectorRegistry()
    MigrationMetrics(registry, "pair")
    SearchMetrics(registry)
    return {f"{m.name}_total" if m.type == "counter" else m.name for m in registry.collect()}
