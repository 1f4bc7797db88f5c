"""The migration's metrics (``rmq migrate --metrics-port``, ``migrate(metrics_port=...)``).

Two kinds of figure, every one labelled with the pair (one value a process):

- what this process did, observed batch by batch on the run's ``on_batch`` path (a few counter
  increments: the run never waits for a scrape): points moved and failed, fetches retried, and
  the seconds each batch spent in each stage (:data:`~rm_qdrant.pair.outcome.STAGES`);
- the pair as every process sees it (gallery, migrated, remaining, failed, state, paused, pace
  and ETA), read from the store on a scrape, at most every :data:`REFRESH_SECONDS`: reading
  them costs several counts, and against a server the other shards' progress shows here too.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from rm_qdrant.errors import ConfigError
from rm_qdrant.monitoring.registering import register_all
from rm_qdrant.pair.outcome import STAGES, BatchResult
from rm_qdrant.pair.record import load_pair
from rm_qdrant.serving.status import pair_status
from rm_qdrant.store import Store

log = logging.getLogger(__name__)

#: Seconds between two reads of the pair's figures from the store (scrapes in between get the last).
REFRESH_SECONDS = 15.0
#: Upper bounds of the batch-stage histogram, in seconds: from a small batch of light local files
#: to a large batch over a slow network.
BATCH_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    600.0,
)
#: The states of a pair (:attr:`~rm_qdrant.pair.record.PairRecord.state`): ``rmq_pair_state``'s labels.
PAIR_STATES = ("backfilling", "finalizing", "finalized", "rolled_back", "dropping")


@dataclass(frozen=True)
class PairFigures:
    """A pair's figures as a scrape shows them (see :func:`read_figures`).

    Attributes:
        gallery: points served, from old (migrated or not, failed included) and from new.
        migrated: points served from new.
        remaining: points still to migrate: in old, without a recorded failure.
        failed: points in old whose last migration attempt failed.
        state: the pair's state.
        paused: whether ``rmq pause`` holds its migrations.
        points_per_second: the recent pace of every process together (None: not known yet).
        eta_seconds: ``remaining`` at that pace (None: not known).
    """

    gallery: int
    migrated: int
    remaining: int
    failed: int
    state: str
    paused: bool
    points_per_second: float | None
    eta_seconds: float | None


def read_figures(store: Store, name: str) -> PairFigures:
    """Pair ``name``'s figures, read now: its record as any process last wrote it, the counts
    and the pace :func:`~rm_qdrant.serving.status.pair_status` reads (``rmq status``'s)."""
    status = pair_status(store, load_pair(store, name))
    return PairFigures(
        gallery=status.old_count + status.new_count,
        migrated=status.new_count,
        remaining=status.remaining,
        failed=status.failed,
        state=status.state,
        paused=status.paused_since is not None,
        points_per_second=status.points_per_second,
        eta_seconds=status.eta_seconds,
    )


#: The gauges of :class:`PairFigures`: name, help, the field (None: not known, no sample).
_GAUGES = (
    ("rmq_gallery_points", "Points in the gallery: served from old plus served from new.", "gallery"),
    ("rmq_migrated_points", "Points served from the new collection.", "migrated"),
    ("rmq_remaining_points", "Points still to migrate (in old, no recorded failure).", "remaining"),
    ("rmq_failed_points", "Points whose last migration attempt failed (served from old).", "failed"),
    (
        "rmq_migrate_points_per_second",
        "Points moved per second lately, every process migrating the pair together.",
        "points_per_second",
    ),
    ("rmq_migrate_eta_seconds", "Seconds until the remaining points are moved at that pace.", "eta_seconds"),
    ("rmq_migrate_paused", "1 while rmq pause holds the pair's migrations, else 0.", "paused"),
)


class PairCollector:
    """The pair's figures as gauges, read by ``read`` on a scrape at most every ``every`` seconds;
    a read that fails is logged and the last figures are served (or none yet)."""

    def __init__(self, pair: str, read: Callable[[], PairFigures] | None, every: float) -> None:
        self.pair, self.read, self.every = pair, read, every
        self._lock = threading.Lock()  # two scrapes at once read the store once
        self._figures: PairFigures | None = None
        self._read_at: float | None = None

    def describe(self) -> list[Metric]:
        """The families, without samples: registering the collector reads nothing."""
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self.figures()))

    def figures(self) -> PairFigures | None:
        """The figures, read again if the last read is ``every`` seconds old."""
        if self.read is None:
            return None
        with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at >= self.every:
                self._read_at = now
                try:
                    self._figures = self.read()
                except Exception as exc:  # noqa: BLE001 - one figure's fault must not blank the whole scrape
                    # one line a refresh (every 15 s while the store is unreachable); -vv: the traceback
                    log.warning("cannot read the figures of pair %r for its metrics: %s", self.pair, exc)
                    log.debug("the read that failed", exc_info=True)
            return self._figures

    def _families(self, figures: PairFigures | None) -> list[Metric]:
        families: list[Metric] = []
        for name, text, field in _GAUGES:
            family = GaugeMetricFamily(name, text, labels=["pair"])
            value = None if figures is None else getattr(figures, field)
            if value is not None:
                family.add_metric([self.pair], float(value))
            families.append(family)
        state = GaugeMetricFamily(
            "rmq_pair_state", "1 for the pair's state, 0 for the other states.", labels=["pair", "state"]
        )
        if figures is not None:
            known = PAIR_STATES if figures.state in PAIR_STATES else (*PAIR_STATES, figures.state)
            for name in known:
                state.add_metric([self.pair, name], 1.0 if name == figures.state else 0.0)
        return [*families, state]


class MigrationMetrics:
    """The metrics of one migration of ``pair``, registered in ``registry``: :meth:`observe` each
    settled batch; the pair's own figures come from ``read`` (:func:`read_figures`) on a scrape.

    Raises:
        ConfigError: ``registry`` already has metrics of these names.

    Example:
        >>> with MetricsServer(9108) as server:  # doctest: +SKIP
        ...     metrics = MigrationMetrics.of_pair(server.registry, store, "photos")
        ...     rm_qdrant.migrate(store, "photos", on_batch=metrics.observe)
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        pair: str,
        *,
        read: Callable[[], PairFigures] | None = None,
        every: float | None = None,
    ) -> None:
        """``every``: seconds between two reads of the pair's figures (None: :data:`REFRESH_SECONDS`)."""
        try:
            moved = Counter(
                "rmq_migrate_moved_points", "Points this process moved to new.", ["pair"], registry=None
            )
            failed = Counter(
                "rmq_migrate_failed_points",
                "Points whose migration failed in this process (recorded on the point, served from old).",
                ["pair"],
                registry=None,
            )
            retries = Counter(
                "rmq_migrate_retries",
                "Image fetches this process retried (timeouts, refused connections, 5xx, throttling).",
                ["pair"],
                registry=None,
            )
            seconds = Histogram(
                "rmq_migrate_batch_seconds",
                "Seconds a batch spent in each stage: fetch, decode, encode, write.",
                ["pair", "stage"],
                registry=None,
                buckets=BATCH_BUCKETS,
            )
            collector = PairCollector(pair, read, REFRESH_SECONDS if every is None else every)
            register_all(registry, (moved, failed, retries, seconds, collector))
        except ValueError as exc:  # prometheus_client: "Duplicated timeseries in CollectorRegistry"
            raise ConfigError(f"a registry takes one MigrationMetrics: {exc}") from exc
        self.pair = pair
        self._moved, self._failed, self._retries = (c.labels(pair) for c in (moved, failed, retries))
        self._stages = {stage: seconds.labels(pair, stage) for stage in STAGES}

    @classmethod
    def of_pair(cls, registry: CollectorRegistry, store: Store, name: str) -> MigrationMetrics:
        """Metrics of pair ``name`` whose figures are read from ``store``."""
        return cls(registry, name, read=functools.partial(read_figures, store, name))

    def observe(self, result: BatchResult) -> None:
        """Count a settled batch (on the run's thread: a few increments)."""
        self._moved.inc(result.moved)
        self._failed.inc(len(result.failed))
        self._retries.inc(result.retries)
        for stage, seconds in result.stages.items():
            histogram = self._stages.get(stage)
            if histogram is not None:
                histogram.observe(seconds)

    def chained(self, then: Callable[[BatchResult], None] | None) -> Callable[[BatchResult], None]:
        """An ``on_batch`` that observes a batch, then calls ``then`` (if any) with it."""
        if then is None:
            return self.observe

        def both(result: BatchResult) -> None:
            self.observe(result)
            then(result)

        return both
