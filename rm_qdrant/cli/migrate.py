"""``rmq migrate``: the backfill command (``rmq finalize`` and ``rmq rollback`` are in cutover.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click

from rm_qdrant.cli.common import (
    SEED,
    FiniteFloat,
    Progress,
    emit,
    json_option,
    name_option,
    open_cli_store,
    plain,
    quiet,
)
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.ordering import ORDERS, check_order
from rm_qdrant.core.planning import parse_shard
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.loading import preflight
from rm_qdrant.migration.migrate import MigrateOptions, MigrationReport, check_workers, run_migration
from rm_qdrant.migration.ranking import budget, order_ready
from rm_qdrant.migration.ray_engine import RayOptions, import_ray
from rm_qdrant.monitoring import observing, start_metrics
from rm_qdrant.pair.upkeep import OPTIMIZE_EVERY
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store


@contextlib.contextmanager
def stop_on_signals(echo: bool) -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set the event (the run stops after its batch); a second one interrupts."""
    stop = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        if echo:
            click.echo("\nstopping after the current batch (again to interrupt)", err=True)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def plan_summary(store: Store, index: DualIndex, options: MigrateOptions) -> dict[str, Any]:
    """What a run would do, without writing anything."""
    pair = index.pair
    start = budget(store, pair, options)
    order = options.order or pair.order or "random"
    return {
        "pair": pair.name,
        "order": order,
        "order_ready": order_ready(store, pair, order, sharded=options.shard is not None),
        "old_points": start.old_only,
        "new_points": start.new,
        "would_move_at_most": start.moves,
        "batches": -(-start.moves // options.batch),
        "batch": options.batch,
        "shard": options.shard,
        "retry_failed": options.retry_failed,
    }


def _seconds_or_end(value: str) -> float | None:
    """``--optimize-every``: seconds (a finite number >= 0), or ``end`` (None)."""
    if value.strip().lower() == "end":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (0 <= seconds < float("inf")):
        raise ConfigError(f"--optimize-every takes seconds (a number >= 0) or 'end', got {value!r}")
    return seconds


def _ray_options(
    engine: str,
    address: str | None,
    encoders: int | None,
    gpus: float | None,
    decoders: int | None,
) -> RayOptions | None:
    """``--engine ray``'s settings (None: the local engine, which takes none of them)."""
    given = {
        "--ray-address": address,
        "--encoders": encoders,
        "--gpus-per-encoder": gpus,
        "--decoders": decoders,
    }
    if engine == "local":
        named = [flag for flag, value in given.items() if value is not None]
        if named:
            raise ConfigError(f"{', '.join(named)}: only with --engine ray")
        return None
    import_ray()
    return RayOptions(address, encoders or 1, gpus or 0.0, decoders or 2)


def _bypassed(report: MigrationReport) -> str:
    """What writers that bypass rm-qdrant did (see backfill/bypass.py), and why points the run
    took stay in old; empty if nothing."""
    text = ""
    if report.stale_dropped or report.writer_deleted:
        text += (
            f"\nwriters that bypass rm-qdrant: {report.stale_dropped} migrated points rewritten in old "
            f"(stale copies dropped from new, {report.remigrated} migrated again, the rest serve from "
            f"old), {report.writer_deleted} migrated points deleted from old (deleted from new too)"
        )
    if report.unconfirmed:
        text += (
            f"\n{report.unconfirmed} points stay in old for the next run: their copy in new could not be "
            f"confirmed ({report.rewritten} of them rewritten in old meanwhile by a writer that "
            "bypasses rm-qdrant, the others rewritten meanwhile or their image changed)"
        )
    return text


def _summary(report: MigrationReport, name: str) -> str:
    rate = report.moved / report.seconds if report.seconds else 0.0
    text = (
        f"moved {report.moved} points in {report.seconds:.1f} s ({rate:,.0f} points/s); "
        f"repaired {report.repaired}, failed {report.failed}, gone meanwhile {report.gone}"
    )
    if report.failure_sample:
        text += f"\nfirst failure: {report.failure_sample[0][1]}"
    text += _bypassed(report)
    if report.skipped_failed:
        text += (
            f"\n{report.skipped_failed} points that failed before were not tried again (rmq failures "
            f"--name {name} lists them): fix their source and rerun with --retry-failed, or cut over "
            f"without them (rmq finalize --name {name} --drop-failed)"
        )
    if report.stopped_early:
        text += "\nstopped early: run the same command again to continue"
    return text


def _paused_line(name: str) -> Callable[[bool], None]:
    def tell(paused: bool) -> None:
        if paused:
            click.echo(
                f"paused by rmq pause: waiting for 'rmq resume {plain(name)}' (Ctrl-C stops)", err=True
            )
        else:
            click.echo("resumed", err=True)

    return tell


@click.command()
@name_option
@click.option(
    "--batch", default=10_000, show_default=True, type=click.IntRange(min=1), help="Points per batch."
)
@click.option("--until", type=FiniteFloat(0, 1), help="Stop once this fraction of the gallery is in new.")
@click.option("--limit", type=click.IntRange(min=0), help="Move at most this many points in this run.")
@click.option("--order", help=f"Backfill order: {', '.join(ORDERS)} [default: the pair's, else random].")
@click.option(
    "--seed", default=0, show_default=True, type=SEED, help="Seed of the random and k-means orders."
)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1), help="Worker threads.")
@click.option("--shard", help="This process's share, i/n (with other processes on a server).")
@click.option("--retry-failed", is_flag=True, help="Also try points whose last attempt failed.")
@click.option(
    "--max-failures",
    default=0.5,
    show_default=True,
    type=FiniteFloat(0, 1),
    help="Stop when more than this share of a batch fails.",
)
@source_options
@click.option(
    "--fetch-workers",
    type=click.IntRange(min=1),
    help="Threads fetching and decoding images [default: by source: for local files 2, or 1 once "
    "a batch shows them light to decode; 8 when images come over the network].",
)
@click.option(
    "--optimize-every",
    default=str(OPTIMIZE_EVERY),
    show_default=True,
    metavar="SECONDS|end",
    help="Embedded store: build the search indexes of what the run wrote every this many seconds "
    "(0: after each batch) and at its end; 'end': only at the end.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve the run's Prometheus metrics on this port while it runs (docs/guides/operations.md#metrics).",
)
@click.option(
    "--metrics-host",
    help="With --metrics-port: the address to serve them on [default: 0.0.0.0, every interface, so "
    "that Prometheus can scrape a pod; 127.0.0.1 keeps them local].",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Where images are fetched, decoded and encoded: threads of this process, or a Ray "
    "cluster (pip install 'rm-qdrant[ray]'); the store is written from this process either way.",
)
@click.option(
    "--ray-address",
    help="With --engine ray: the cluster (auto, ray://HOST:10001) [default: $RAY_ADDRESS if set, "
    "else a local Ray started for the run].",
)
@click.option(
    "--encoders",
    type=click.IntRange(min=1),
    help="With --engine ray: encoder actors, one ONNX Runtime session each [default: 1].",
)
@click.option(
    "--gpus-per-encoder",
    type=FiniteFloat(0, 1_000_000),
    help="With --engine ray: GPUs each encoder actor takes (CUDA provider) [default: 0, the CPU].",
)
@click.option(
    "--decoders",
    type=click.IntRange(min=1),
    help="With --engine ray: fetch-and-decode tasks at once, a CPU each [default: 2].",
)
@click.option(
    "--rate",
    type=FiniteFloat(min=0, min_open=True),
    help="At most this many points a second on average, every worker of this run together "
    "[default: as fast as it goes]. Each --shard process has its own: give each rate/n.",
)
@click.option("--prepare", is_flag=True, help="Rank the gallery in backfill order, then exit.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--encoder", type=click.Path(), help="Override the encoder path the pair recorded.")
@json_option
@click.pass_context
def migrate(
    ctx: click.Context,
    name: str,
    batch: int,
    until: float | None,
    limit: int | None,
    order: str | None,
    seed: int,
    workers: int,
    shard: str | None,
    retry_failed: bool,
    max_failures: float,
    source: SourceConfig,
    fetch_workers: int | None,
    optimize_every: str,
    metrics_port: int | None,
    metrics_host: str | None,
    engine: str,
    ray_address: str | None,
    encoders: int | None,
    gpus_per_encoder: float | None,
    decoders: int | None,
    rate: float | None,
    prepare: bool,
    dry_run: bool,
    encoder: str | None,
    as_json: bool,
) -> None:
    """Move gallery points from the old collection to the new one, in backfill order."""
    ray = _ray_options(engine, ray_address, encoders, gpus_per_encoder, decoders)
    server = start_metrics(metrics_port, metrics_host)  # before the store: a port in use changes nothing
    if server is not None:
        ctx.with_resource(server)  # closed, and the port released, when the command ends
        if not (as_json or quiet(ctx)):
            click.echo(f"serving metrics on {server.url}", err=True)
    store = open_cli_store(ctx)
    options = MigrateOptions(
        batch=batch,
        until=until,
        limit=limit,
        order=check_order(order) if order else None,
        seed=seed,
        shard=parse_shard(shard) if shard else None,
        retry_failed=retry_failed,
        max_failure_share=max_failures,
        fetch_workers=fetch_workers,
        source=source,
        optimize_every=_seconds_or_end(optimize_every),
        rate=rate,
    )
    check_workers(workers, options)  # before --dry-run too: it plans what the run would do
    index = DualIndex.open(store, name, encoder=encoder)
    if dry_run:
        planned = plan_summary(store, index, options)
        emit(planned, as_json, "\n".join(f"{k:20} {v}" for k, v in planned.items()))
        return
    if prepare:
        options = dataclasses.replace(options, limit=0)
    # Ray prints what its raylet reports (a task retried, an actor lost) on the driver's stdout:
    # it goes to stderr with rmq's own messages, and stdout holds the report alone (--json).
    ray_prints = contextlib.redirect_stdout(sys.stderr) if ray is not None else contextlib.nullcontext()
    with stop_on_signals(echo=not as_json) as stop, ray_prints:
        sharded = options.shard is not None
        ranks = index.pair.state == "backfilling" and not order_ready(
            store, index.pair, options.order, sharded=sharded
        )
        if ranks:  # before the ranking pass, not each run (other states: the run says why it cannot)
            preflight(store, index.pair, index.encoder, source, retry_failed=retry_failed, stop=stop)
        with Progress(f"migrating {name}", hidden=as_json or prepare or quiet(ctx)) as bar:
            report = run_migration(
                index,
                options,
                workers=workers,
                stop=stop,
                on_batch=observing(server, store, name, lambda r: bar.advance(r.points, done=r.moved)),
                on_plan=bar.start,
                ray=ray,
                on_pause=None if as_json or quiet(ctx) else _paused_line(name),
            )
    if prepare:
        emit(
            {"pair": name, "order": index.pair.order}, as_json, f"ranked {name!r} in {index.pair.order} order"
        )
    else:
        emit(dataclasses.asdict(report), as_json, _summary(report, name))
