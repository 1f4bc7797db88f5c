"""Moving a pair's gallery to the new model: :func:`migrate` (``rmq migrate``) and :func:`optimize`."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from rm_qdrant.core.ordering import check_order
from rm_qdrant.core.planning import parse_shard
from rm_qdrant.errors import CollectionNotFound, ConfigError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.migration.ray_engine import RayOptions, import_ray
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.monitoring import observing, start_metrics
from rm_qdrant.pair.outcome import BatchResult, MigrationReport
from rm_qdrant.pair.record import load_pair
from rm_qdrant.pair.upkeep import optimize_collections, optimizes
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.store import Store
from rm_qdrant.store.base import resolve

#: The keyword options :func:`migrate` takes besides its own (``MigrateOptions``' fields).
MIGRATE_OPTIONS = tuple(f.name for f in dataclasses.fields(MigrateOptions))


def migrate(
    store: Store,
    name: str,
    *,
    workers: int = 1,
    encoder: OnnxEncoder | str | None = None,
    on_batch: Callable[[BatchResult], None] | None = None,
    stop: threading.Event | None = None,
    metrics_port: int | None = None,
    metrics_host: str | None = None,
    engine: str | RayOptions = "local",
    on_pause: Callable[[bool], None] | None = None,
    **options: Any,
) -> MigrationReport:
    """Move the gallery of pair ``name`` to the new model: what ``rmq migrate --name NAME`` does.

    The run ranks the gallery in backfill order once (the ``demand`` order: at every run without
    ``shard``, in the demand of that moment), then moves batches until the plan is
    done (``until``, ``limit``), ``stop`` is set (the batch in flight is settled first), or
    more than ``max_failure_share`` of a batch fails. All state is in the store, so a run
    stopped or killed at any moment is resumed by calling this again.

    Args:
        store: the store holding the pair (:func:`rm_qdrant.open_store`).
        name: the pair's name.
        workers: threads moving disjoint shares of the gallery (with the embedded store, the
            one process that opens it; against a server, ``shard=(i, n)`` splits the work
            across processes instead).
        encoder: the pair's new model, as a path or a loaded :class:`OnnxEncoder` (default:
            the file the pair recorded).
        on_batch: called with each settled batch (from a worker thread), for progress.
        stop: set it (from another thread, a signal handler, or ``on_batch``) to stop after
            the batch in flight; the report then says ``stopped_early``.
        metrics_port: serve the run's Prometheus metrics on this port (1 to 65535) while it runs
            (see docs/guides/operations.md#metrics); the port is bound before anything is read
            or written, and released when this returns. None: no metrics.
        metrics_host: the address they are served on (default ``0.0.0.0``, every interface, so
            that Prometheus can scrape a pod; ``127.0.0.1`` keeps them local).
        engine: ``"local"`` (threads of this process), or ``"ray"`` / a
            :class:`~rm_qdrant.migration.ray_engine.RayOptions` (cluster address, encoder actors,
            GPUs per encoder, decode tasks): images are fetched, decoded and encoded on Ray, the
            store is written from this process. Inside a Ray job (``ray.init`` called), its
            connection is used and left open; otherwise a local Ray is started for the run.
        on_pause: told ``True`` when the run starts waiting because :func:`pause` holds the pair,
            ``False`` when :func:`resume` lets it go on.
        **options: the fields of :class:`~rm_qdrant.migration.migrate.MigrateOptions`:
            ``batch``, ``until``, ``limit``, ``order``, ``seed``, ``shard`` (``(i, n)`` or
            ``"i/n"``), ``retry_failed``, ``max_failure_share``, ``fetch_workers``, ``source``
            (a :class:`~rm_qdrant.sources.SourceConfig`), ``optimize_every`` (seconds between
            index builds on the embedded store while the run goes on; None: at the end only),
            ``rate`` (at most this many points a second on average, all workers together).

    Returns:
        What the run did: points planned, moved, repaired, failed, gone meanwhile, seconds.

    Raises:
        ConfigError: an unknown option or a bad value, or an encoder that is not the pair's; a
            metrics port outside 1..65535, in use or not allowed (nothing was read or written).
        MigrationError: the pair is not backfilling, or too much of a batch failed (that batch
            is settled first).

    Example:
        An orchestrator task (Airflow, Prefect, a cron job) that moves the gallery a tenth
        at a time and stops cleanly when the scheduler cancels it::

            import threading
            import rm_qdrant

            def backfill_step(step: int, cancelled: threading.Event) -> dict:
                store = rm_qdrant.open_store("http://qdrant:6333")
                try:
                    report = rm_qdrant.migrate(
                        store,
                        "photos",
                        until=step / 10,
                        batch=1000,
                        stop=cancelled,
                        on_batch=lambda b: print(f"moved {b.moved}, failed {len(b.failed)}"),
                    )
                finally:
                    store.close()
                if report.failed:
                    print(f"{report.failed} points failed: see 'rmq failures --name photos'")
                return {"moved": report.moved, "stopped_early": report.stopped_early}
    """
    settings = _options(options)
    _check(workers, int, "workers", low=1)
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ConfigError(f"stop is a threading.Event (or None), not {type(stop).__name__}")
    for hook, what in (
        (on_batch, "on_batch is a function of one BatchResult"),
        (on_pause, "on_pause is a function of one bool"),
    ):
        if hook is not None and not callable(hook):
            raise ConfigError(f"{what} (or None), not {type(hook).__name__}")
    ray = _engine(engine)
    server = start_metrics(metrics_port, metrics_host)  # first: a port in use changes nothing
    with server or contextlib.nullcontext(), DualIndex.open(store, name, encoder=encoder) as index:
        observed = observing(server, store, name, on_batch)
        return run_migration(
            index, settings, workers=workers, stop=stop, on_batch=observed, ray=ray, on_pause=on_pause
        )


def _engine(engine: object) -> RayOptions | None:
    if isinstance(engine, RayOptions):
        import_ray()
        return engine
    if engine == "ray":
        import_ray()
        return RayOptions()
    if engine == "local":
        return None
    raise ConfigError(f"engine is 'local', 'ray' or a RayOptions, not {engine!r}")


def optimize(store: Store, name: str) -> list[str]:
    """Build the search indexes of pair ``name``'s collections (or of the collection ``name``)
    now, where the store builds them only when asked; the collections it covered.

    The embedded store (qdrant-edge) has no background optimizer: points written or changed
    since its last optimisation are searched by a scan, so after writes of your own through
    :class:`DualIndex` (``upsert``, ``set_payload``, ``delete``) search gets slower until this
    runs. ``rmq migrate`` calls it for you at the end of a run and every
    ``optimize_every`` seconds while it runs. A Qdrant server (and qdrant-client's local mode)
    optimises by itself: there this does nothing and returns ``[]``.

    It costs about as much as building the index of the points written since the last call
    (``benchmarks/search_during_migration.py``), and holds the collection's writes meanwhile:
    call it after a burst of writes, not after each one.

    Raises:
        CollectionNotFound: no pair and no collection (or alias) of that name.

    Example:
        >>> index.upsert(ids, images)  # doctest: +SKIP
        >>> rm_qdrant.optimize(store, "photos")  # doctest: +SKIP
        ['photos-old', 'photos-new']
    """
    try:
        pair = load_pair(store, name)
        names = [c for c in (pair.old_collection, pair.new_collection) if store.has_collection(c)]
    except CollectionNotFound:
        collection = resolve(store, name)
        if not store.has_collection(collection):
            raise CollectionNotFound(f"no pair and no collection named {name!r}") from None
        names = [collection]
    if not optimizes(store):
        return []
    names = list(dict.fromkeys(names))
    optimize_collections(store, names)
    return names


#: The numeric options: name, type (float takes an int too), lowest value. Ranges beyond the
#: lowest (``until`` <= 1, a share <= 1) are the migration's own checks.
_TYPES = (
    ("batch", int, 1),
    ("limit", int, 0),
    ("seed", int, 0),
    ("fetch_workers", int, 1),
    ("until", float, 0),
    ("max_failure_share", float, 0),
    ("optimize_every", float, 0),
    ("rate", float, 0),
)


def _check(value: Any, kind: type, name: str, *, low: float) -> None:
    kinds = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ConfigError(f"{name} must be {'a number' if kind is float else 'an integer'}, got {value!r}")
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value!r}")


def _options(options: dict[str, Any]) -> MigrateOptions:
    """``MigrateOptions`` from keyword options, each name and the order and shard checked."""
    unknown = sorted(set(options) - set(MIGRATE_OPTIONS))
    if unknown:
        many = "s" if len(unknown) > 1 else ""
        raise ConfigError(
            f"unknown migrate option{many} {', '.join(map(repr, unknown))}: the options are "
            f"{', '.join(MIGRATE_OPTIONS)}, workers, encoder, engine, on_batch, on_pause, stop, "
            "metrics_port and metrics_host"
        )
    for key, kind, low in _TYPES:
        if options.get(key) is not None:
            _check(options[key], kind, key, low=low)
    if "retry_failed" in options and not isinstance(options["retry_failed"], bool):
        raise ConfigError(f"retry_failed is True or False, got {options['retry_failed']!r}")
    if options.get("order") is not None:
        options["order"] = check_order(str(options["order"]))
    if isinstance(options.get("shard"), str):
        options["shard"] = parse_shard(options["shard"])
    return MigrateOptions(**options)
