"""``rmq plan``: time a sample on this machine and plan the rest of the backfill; writes nothing."""

from __future__ import annotations

from typing import Any

import click

from rm_qdrant.api.planning import plan
from rm_qdrant.cli.common import (
    SEED,
    FiniteFloat,
    Steps,
    emit,
    json_option,
    open_cli_store,
    pair_name,
    quiet,
)
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.capacity import DEFAULT_M
from rm_qdrant.pair.outcome import MAX_WORKERS
from rm_qdrant.sources import SourceConfig

_WHOLE = click.IntRange(1, MAX_WORKERS)


@click.command(name="plan")
@pair_name
@click.option(
    "--sample", "size", default=64, show_default=True, type=click.IntRange(min=1), help="Points to time."
)
@click.option("--workers", default=1, show_default=True, type=_WHOLE, help="rmq migrate --workers to plan.")
@click.option(
    "--fetch-workers",
    type=_WHOLE,
    help="Fetch threads per worker (per Ray decode task) [default: as rmq migrate picks them].",
)
@click.option("--encoders", type=_WHOLE, help="Plan the Ray engine with this many encoder actors.")
@click.option("--decoders", type=_WHOLE, help="Ray decode tasks at once [default with --encoders: 2].")
@click.option(
    "--gpus",
    type=click.IntRange(0, 4096),
    help="GPUs encoding [default: 1 where ONNX Runtime encodes on CUDA here, else 0].",
)
@click.option(
    "--gpu-rate",
    type=FiniteFloat(min=0, min_open=True),
    help="Points a second one GPU embeds, as your team measured it (needed with --gpus where no "
    "CUDA provider runs here to measure it).",
)
@click.option(
    "--cores",
    type=click.IntRange(1, 1_000_000),
    help="CPU cores decoding (and a CPU encode) share [default: this machine's].",
)
@click.option(
    "--batch",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="rmq migrate --batch (a server: a paired run waits 1 s a batch).",
)
@click.option("--until", type=FiniteFloat(0, 1), help="Plan only up to this fraction of the gallery in new.")
@click.option(
    "--hnsw-m",
    default=DEFAULT_M,
    show_default=True,
    type=click.IntRange(2, 10_000),
    help="The collections' HNSW m (the index's storage).",
)
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the samples.")
@source_options
@click.option("--encoder", type=click.Path(), help="Override the encoder path the pair recorded.")
@click.option("--no-forecast", is_flag=True, help="Leave out rmq probe's forecast of the served quality.")
@click.option(
    "--probe-sample",
    default=500,
    show_default=True,
    type=click.IntRange(min=2),
    help="Points the forecast re-embeds.",
)
@json_option
@click.pass_context
def plan_command(
    ctx: click.Context,
    name: str,
    size: int,
    workers: int,
    fetch_workers: int | None,
    encoders: int | None,
    decoders: int | None,
    gpus: int | None,
    gpu_rate: float | None,
    cores: int | None,
    batch: int,
    until: float | None,
    hnsw_m: int,
    seed: int,
    source: SourceConfig,
    encoder: str | None,
    no_forecast: bool,
    probe_sample: int,
    as_json: bool,
) -> None:
    """Time a sample of the gallery on this machine (fetch, decode, encode, write) and plan the rest.

    Prints each stage's time a point and capacity at the --workers, --encoders and --gpus given,
    the bottleneck and the time for the points left, the storage they add, and rmq probe's
    forecast of the served quality. Writes nothing: the write is timed in a scratch store.
    """
    store = open_cli_store(ctx)
    with Steps(hidden=as_json or quiet(ctx)) as steps:
        report = plan(
            store,
            name,
            sample=size,
            workers=workers,
            fetch_workers=fetch_workers,
            encoders=encoders,
            decoders=decoders,
            gpus=gpus,
            gpu_rate=gpu_rate,
            cores=cores,
            batch=batch,
            until=until,
            hnsw_m=hnsw_m,
            seed=seed,
            source=source,
            encoder=encoder,
            forecast=not no_forecast,
            probe_sample=probe_sample,
            on_step=steps,
        )
    data = report.as_dict()
    emit(data, as_json, plan_text(data))


def plan_text(data: dict[str, Any]) -> str:
    """The plan as ``rmq plan`` prints it (from its ``--json`` data)."""
    store = "a server" if data["server"] else "the embedded store"
    lines = [
        f"plan for pair {data['pair']} ({data['layout']}, {store}): {data['left']:,} point(s) left to "
        f"migrate, {data['in_new']:,} in new" + _failed(data),
    ]
    if data["sample"] is None:
        return "\n".join([*lines, *data["notes"]])
    if data["until"] is not None:
        lines.append(f"--until {data['until']:g}: {data['points']:,} of them planned")
    lines += [*_sample_lines(data), "", *_stage_lines(data), "", *_storage_lines(data), ""]
    lines.append(_forecast_line(data))
    return "\n".join([*lines, "", "what the figures assume:", *(f"- {n}" for n in data["notes"])])


def _failed(data: dict[str, Any]) -> str:
    failed = data["failed_skipped"]
    return f" ({failed:,} failed, skipped unless --retry-failed)" if failed else ""


def _sample_lines(data: dict[str, Any]) -> list[str]:
    sample, setup = data["sample"], data["setup"]
    text = f"sample: {sample['timed']} of {sample['drawn']} drawn points timed on this machine"
    if sample["unreadable"]:
        text += (
            f"; {sample['unreadable']} unreadable ({sample['unreadable_share']:.0%}: a migration records "
            f"them as failed; first: {sample['first_reason']})"
        )
    engine = (
        f"Ray engine, {setup['encoders']} encoder(s), {setup['decoders']} decode task(s)"
        if setup["engine"] == "ray"
        else "local engine"
    )
    run = (
        f"run: {engine}, {setup['workers']} worker(s), {setup['fetch_threads']} fetch thread(s), "
        f"{setup['cores']} core(s), {setup['gpus']} GPU(s); the encoder runs on "
        f"{setup['encoder_provider']} here"
    )
    return [text, run]


def _stage_lines(data: dict[str, Any]) -> list[str]:
    lines = [f"{'stage':8}{'ms/point':>10}{'points/s':>12}   set by"]
    for stage in data["stages"]:
        ms = "-" if stage["ms_per_point"] is None else f"{stage['ms_per_point']:.3f}"
        lines.append(f"{stage['name']:8}{ms:>10}{_rate(stage['points_per_s']):>12}   {stage['limit']}")
    lines.append(
        f"bottleneck: {data['bottleneck']} at {_rate(data['points_per_s'])} points/s: "
        f"{data['points']:,} point(s) in {duration(data['seconds'])}"
    )
    return lines


def _storage_lines(data: dict[str, Any]) -> list[str]:
    s = data["storage"]
    points = s["points"]
    lines = [
        f"storage for {points:,} point(s) (float32 vectors, HNSW links at m={s['hnsw_m']}, payload JSON; "
        "the store's own overheads come on top):",
        f"  new vectors      {points:,} x {s['new_dim']}-d x 4 B = {size(s['new_vectors_bytes'])}",
        f"  HNSW links       {size(s['hnsw_links_bytes'])}",
    ]
    if s["payload_copies_bytes"]:
        lines.append(
            f"  payload copies   {points:,} x {s['payload_copy_mean_bytes']:.0f} B (the sample's mean) = "
            f"{size(s['payload_copies_bytes'])}"
        )
    if s["carried_vectors_bytes"]:
        lines.append(f"  other vectors    {size(s['carried_vectors_bytes'])}")
    lines.append(f"  adds             {size(s['adds_bytes'])}; peak {size(s['peak_bytes'])} over today")
    lines.append(f"  {_frees(data['layout'], s)}")
    return lines


def _frees(layout: str, s: dict[str, Any]) -> str:
    if layout == "single-collection":
        return (
            f"frees            {size(s['frees_at_finalize_bytes'])} of old vectors and links at "
            "'rmq finalize --drop-old' (the old vector stays until then)"
        )
    if layout.endswith("--keep-old"):
        return (
            f"--keep-old       old keeps its {size(s['keep_old_holds_bytes'])} of these points for a "
            "rollback until 'rmq finalize --drop-old'"
        )
    return (
        f"frees            {size(s['frees_during_bytes'])} in old as the points leave it (a server frees it "
        f"as its optimizer vacuums old); --keep-old (chosen at rmq init) would keep it until finalize"
    )


def _forecast_line(data: dict[str, Any]) -> str:
    found = data["forecast"]
    if found is None:
        return f"forecast: {data['forecast_note']}"
    curves = "; ".join(
        f"{c['mode']} recall@{found['k']} {c['start']:.3f} -> {c['end']:.3f}, area {c['area']:.3f}, "
        + (f"dips at t = {', '.join(f'{t:g}' for t in c['dips_at'])}" if c["dips_at"] else "no dips")
        for c in found["curves"]
    )
    return (
        f"forecast (rmq probe on {found['sample']} point(s), order {found['order']}, kept nowhere): "
        f"{curves}\nrecommendation: {found['recommendation']}"
    )


def _rate(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:,.0f}"


def size(count: float) -> str:
    """Bytes as ``rmq`` shows them (B, KiB, MiB, GiB, TiB)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def duration(seconds: float | None) -> str:
    """Seconds as ``rmq`` shows a duration (s, min, h, days)."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} days"
