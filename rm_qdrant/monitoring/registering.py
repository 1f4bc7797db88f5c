"""Registering a set of metrics in a registry all at once, or none of them."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector


def register_all(registry: CollectorRegistry, collectors: Sequence[Collector]) -> None:
    """Register every one of ``collectors`` in ``registry``; if one clashes with a metric the
    registry has (an application's own of the same name), none stays registered.

    Raises:
        ValueError: prometheus_client's "Duplicated timeseries in CollectorRegistry".
    """
    done: list[Collector] = []
    try:
        for collector in collectors:
            registry.register(collector)
            done.append(collector)
    except ValueError:
        for collector in done:
            registry.unregister(collector)
        raise
