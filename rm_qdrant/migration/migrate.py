"""``rmq migrate``: rank the gallery once, plan, then run the shards side by side (threads of
this process), each a :class:`~rm_qdrant.migration.migrator.Migrator`, or, with the Ray engine,
a :class:`~rm_qdrant.migration.ray_engine.RayMigrator` whose images are fetched, decoded and
encoded on Ray. How one batch moves is in migrator.py."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ERROR
from rm_qdrant.core.textspec import TextSpec
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.migration.gate import Gate
from rm_qdrant.migration.migrator import Migrator
from rm_qdrant.migration.ranking import plan
from rm_qdrant.migration.ray_engine import RayOptions, ray_migrators
from rm_qdrant.pair.bypass import Swept, sweep
from rm_qdrant.pair.layouts import REMOVAL_GRACE, layout_of
from rm_qdrant.pair.outcome import (
    MAX_WORKERS,
    BatchResult,
    MigrateOptions,
    MigrationReport,
)
from rm_qdrant.pair.progress import ProgressRecorder
from rm_qdrant.pair.upkeep import IndexUpkeep
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Where

log = logging.getLogger(__name__)
__all__ = ["REMOVAL_GRACE", "MigrateOptions", "Migrator", "run_migration"]


def check_workers(workers: int, options: MigrateOptions) -> None:
    """Refuse ``workers`` below 1 or above :data:`MAX_WORKERS`, above 1 with ``options.shard``,
    or ``options.fetch_workers`` outside 1..MAX_WORKERS (``rmq migrate --dry-run`` checks it as
    the run does).

    Raises:
        ConfigError: as :func:`run_migration` would.
    """
    for name, value in (("workers", workers), ("fetch_workers", options.fetch_workers)):
        if value is None and name == "fetch_workers":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{name} ({flag}) is a whole number from 1 to {MAX_WORKERS}, got {value!r}")
    if workers > 1 and options.shard is not None:
        raise ConfigError("use --workers N (threads) or --shard i/n (processes), not both; N >= 1")


def run_migration(
    index: DualIndex,
    options: MigrateOptions,
    *,
    workers: int = 1,
    stop: threading.Event | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    ray: RayOptions | None = None,
    on_pause: Callable[[bool], None] | None = None,
) -> MigrationReport:
    """What ``rmq migrate`` does: rank the gallery once, plan, then run ``workers`` shards.

    With ``workers > 1`` the shards run as threads of this process (the embedded
    store admits one process); against a server, ``options.shard`` lets separate
    processes or machines share the work instead. ``ray``: fetch, decode and encode on a Ray
    cluster (see ray_engine.py); the shards still write from this process.

    Before each batch a worker waits while ``rmq pause`` holds the pair (``on_pause`` is told
    ``True`` when the run starts waiting, ``False`` when it goes on) and while ``options.rate``
    is used up, all workers together (see gate.py). Each settled batch is recorded beside the
    pair's record, for the pace and ETA that ``rmq status`` shows (see progress.py).

    Raises:
        ConfigError: ``workers`` or ``options.fetch_workers`` is outside 1..MAX_WORKERS, or
            ``workers`` is above 1 with ``options.shard``, or ``options.rate`` is not above 0.
        MigrationError: see :meth:`Migrator.run`.
    """
    check_workers(workers, options)
    gate = Gate(index.store, index.pair.name, rate=options.rate, batch=options.batch, on_pause=on_pause)
    if options.optimize_every is not None and not options.optimize_every >= 0:
        raise ConfigError(f"optimize_every must be seconds >= 0 or None, got {options.optimize_every}")
    swept = Swept([], [])
    if index.pair.state == "backfilling":  # before the ranking: a writer's rewrite has no rank
        swept = sweep(index.store, index.pair, layout_of(index.pair).old_where())
    Migrator(index, options).ensure_order()
    skipped = 0
    if not options.retry_failed:
        skipped = index.store.count(
            index.pair.old_collection, layout_of(index.pair).old_where() & Where(not_empty=(ERROR,))
        )
    shards = [options] if workers == 1 else [replace(options, shard=(i, workers)) for i in range(workers)]
    pair = index.pair
    upkeep = IndexUpkeep(
        index.store, [pair.new_collection, pair.old_collection], every=options.optimize_every
    )
    migrators = [Migrator(index, shard, upkeep=upkeep, gate=gate) for shard in shards]
    plans = [plan(index.store, index.pair, m.options, swept.stale) for m in migrators]
    if on_plan is not None:
        on_plan(sum(map(len, plans)))
    halt = stop or threading.Event()
    with contextlib.ExitStack() as stack:
        if ray is not None and any(plans):  # nothing to move: no cluster to start
            on_ray = ray_migrators(stack, migrators, ray, halt)
            if on_ray is None:  # stopped while Ray started: nothing was claimed
                return MigrationReport(
                    planned=sum(map(len, plans)),
                    skipped_failed=skipped,
                    stopped_early=True,
                    stale_dropped=len(swept.stale),
                    writer_deleted=len(swept.deleted),
                )
            migrators = on_ray
        progress = ProgressRecorder(index.store, index.pair.name, max_length=_max_length(index))
        stack.callback(progress.close)
        report = _run_shards(migrators, plans, skipped, upkeep, halt, on_batch, progress)
    report.stale_dropped, report.writer_deleted = len(swept.stale), len(swept.deleted)
    report.remigrated = len(layout_of(index.pair).ids_in_new(index.store, swept.stale)) if swept.stale else 0
    return report


def _max_length(index: DualIndex) -> int | None:
    """The tokens a text pair's model reads (its run counts the documents it cut); None for images."""
    spec = index.encoder.info.input if index.encoder is not None else None
    return spec.max_length if isinstance(spec, TextSpec) else None


def _run_shards(
    migrators: list[Migrator],
    plans: list[list[PointId]],
    skipped: int,
    upkeep: IndexUpkeep,
    halt: threading.Event,
    on_batch: Callable[[BatchResult], None] | None,
    progress: ProgressRecorder,
) -> MigrationReport:
    """Run each migrator on its plan, side by side; one's failure stops the others."""
    lock = threading.Lock()

    def report_batch(result: BatchResult) -> None:
        progress.moved(result.moved + result.repaired, truncated=result.truncated)
        if on_batch is not None:
            with lock:
                on_batch(result)

    def work(migrator: Migrator, ids: list[PointId]) -> MigrationReport:
        try:
            return migrator.run(ids=ids, stop=halt, on_batch=report_batch)
        except BaseException:
            halt.set()  # one worker's failure stops the others after their batch
            raise

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(len(migrators), "rmq-worker") as pool:
            futures = [pool.submit(work, m, p) for m, p in zip(migrators, plans, strict=True)]
            reports = [f.result() for f in futures]
    except MigrationError:
        upkeep.finish()  # the batches settled before the stop serve from a built index too
        raise
    if not halt.is_set():  # a stop (Ctrl-C, SIGTERM) ends now: the next run, or optimize(), builds
        upkeep.finish()
    total = MigrationReport(
        seconds=time.perf_counter() - started, skipped_failed=skipped, optimize_seconds=upkeep.seconds
    )
    for part in reports:
        total.merge(part)
    return total
