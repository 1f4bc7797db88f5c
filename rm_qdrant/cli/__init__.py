"""``rmq``: the command line, one thin function per command over the library."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import click
from PIL import Image

from rm_qdrant.backfill.dual import DualIndex
from rm_qdrant.backfill.indexing import index_images, scan_image_folder
from rm_qdrant.backfill.pair import PairRecord, create_pair, load_pair
from rm_qdrant.backfill.status import pair_status
from rm_qdrant.cli.common import Group, emit, json_option, name_option, open_cli_store, store_location
from rm_qdrant.cli.migrate import eval_command, finalize_command, migrate, rollback_command
from rm_qdrant.cli.model import model
from rm_qdrant.cli.pairs import drop_pair_command, pairs_command, switch_encoder_command
from rm_qdrant.cli.probe import probe_command, status_estimate
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, SourceError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.sources import shown


def _parse_filter(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    parsed: dict[str, Any] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"bad --filter {item!r}: expected FIELD=VALUE")
        parsed[key] = int(value) if value.lstrip("-").isdigit() else value
    return parsed or None


@click.group(cls=Group)
@click.option(
    "--qdrant",
    envvar="RMQ_QDRANT",
    default="./rmq-data",
    show_default=True,
    help="Embedded store folder, ':memory:', or a server URL (http(s)://host:6333).",
)
@click.option("--api-key", envvar="QDRANT_API_KEY", default=None, help="Qdrant server API key.")
@click.option("-v", "--verbose", count=True, help="Log progress (-v) or every batch's ids (-vv).")
@click.pass_context
def cli(ctx: click.Context, qdrant: str, api_key: str | None, verbose: int) -> None:
    """Online backfilling for Qdrant: serve the new embedding model while the gallery migrates."""
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    for chatty in ("httpx", "httpcore"):  # they log whole URLs, credentials included
        logging.getLogger(chatty).setLevel(logging.WARNING)
    # rm-qdrant refuses oversized images itself (--max-pixels), with the point's id and reason.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    ctx.obj = {"qdrant": qdrant, "api_key": api_key, "store": None}


@cli.command()
@name_option
@click.option("--old-collection", required=True, help="The collection the old model filled (as it is).")
@click.option("--old-vector", help="Its vector name, if it has named vectors [default: its only vector].")
@click.option("--encoder", required=True, type=click.Path(), help="New model graph (.onnx).")
@click.option(
    "--old-encoder", type=click.Path(), help="Old model graph: the naive mode's, and what a rollback serves."
)
@click.option("--new-collection", help="Name of the new collection [default: NAME-new].")
@click.option(
    "--mode",
    type=click.Choice(["rm", "naive"]),
    help="Query mode [default: rm if the encoder has a 'rev' output].",
)
@click.option(
    "--keep-old",
    is_flag=True,
    help="Keep migrated points in old (hidden) so 'rmq rollback' works (needs --old-encoder).",
)
@click.option("--uri-field", default="uri", show_default=True, help="Payload field with each image's URI.")
@click.option(
    "--uri-template",
    help="Or build the URI from payload fields, e.g. 's3://bucket/{sku}.jpg' ({id}: the id).",
)
@click.option("--label-field", default="label", show_default=True, help="Payload field with class labels.")
@json_option
@click.pass_context
def init(
    ctx: click.Context,
    name: str,
    old_collection: str,
    old_vector: str | None,
    encoder: str,
    old_encoder: str | None,
    new_collection: str | None,
    mode: str | None,
    keep_old: bool,
    uri_field: str,
    uri_template: str | None,
    label_field: str,
    as_json: bool,
) -> None:
    """Create the new collection (mirroring the old one's schema) and the pair record."""
    if (
        uri_template is not None
        and ctx.get_parameter_source("uri_field") != click.core.ParameterSource.DEFAULT
    ):
        raise ConfigError("give --uri-field or --uri-template, not both")
    record = create_pair(
        open_cli_store(ctx),
        name,
        old_collection=old_collection,
        encoder=OnnxEncoder(encoder),
        old_encoder=OnnxEncoder(old_encoder) if old_encoder else None,
        new_collection=new_collection,
        mode=mode,  # type: ignore[arg-type]
        keep_old=keep_old,
        old_vector=old_vector,
        uri=UriRule(uri_field, uri_template),
        label_field=label_field,
    )
    vector = f" (vector {record.vector!r})" if record.vector else ""
    text = (
        f"pair {record.name!r} ({record.mode}): {record.old_collection} -> {record.new_collection}{vector}; "
        f"images from {record.uri_rule.describe()}"
    )
    emit(dataclasses.asdict(record), as_json, text)


@cli.command()
@click.option("--name", help="Index into this pair's old collection.")
@click.option("--collection", help="Index into this collection (created if missing).")
@click.option("--data", required=True, type=click.Path(), help="Image folder: DATA/<label>/<image>.")
@click.option(
    "--encoder", required=True, type=click.Path(), help="The model that fills the collection (.onnx)."
)
@click.option("--batch", default=256, show_default=True, type=click.IntRange(min=1), help="Images per batch.")
@json_option
@click.pass_context
def index(
    ctx: click.Context,
    name: str | None,
    collection: str | None,
    data: str,
    encoder: str,
    batch: int,
    as_json: bool,
) -> None:
    """Load an image folder into a collection (reproduces an existing deployment)."""
    if (name is None) == (collection is None):
        raise ConfigError("give exactly one of --name and --collection")
    store = open_cli_store(ctx, create=True)
    target = collection or load_pair(store, name or "").old_collection
    items = scan_image_folder(data)
    model = OnnxEncoder(encoder)
    with click.progressbar(length=len(items), label=f"indexing into {target}", hidden=as_json) as bar:
        report = index_images(store, target, model, items, batch_size=batch, on_batch=bar.update)
    summary = {"collection": target, "indexed": report.indexed, "failed": report.failed}
    text = f"indexed {report.indexed} images into {target!r}"
    if report.failed:
        text += f"; skipped {len(report.failed)} unreadable, first: {report.failed[0][1]}"
    emit(summary, as_json, text)


@cli.command()
@name_option
@click.argument("image", type=click.Path())
@click.option("--limit", default=10, show_default=True, type=click.IntRange(min=1), help="Number of hits.")
@click.option("--filter", "filters", multiple=True, help="Payload filter FIELD=VALUE (repeatable).")
@click.option("--exact", is_flag=True, help="Exact search instead of the HNSW index.")
@click.option("--hnsw-ef", type=click.IntRange(min=1), help="HNSW search breadth [default: Qdrant's].")
@click.option("--encoder", type=click.Path(), help="Override the encoder path the pair recorded.")
@click.option("--old-encoder", type=click.Path(), help="Override the old encoder path.")
@json_option
@click.pass_context
def search(
    ctx: click.Context,
    name: str,
    image: str,
    limit: int,
    filters: tuple[str, ...],
    exact: bool,
    hnsw_ef: int | None,
    encoder: str | None,
    old_encoder: str | None,
    as_json: bool,
) -> None:
    """Search the pair with one image; hits from both collections, merged by distance."""
    opened = DualIndex.open(
        open_cli_store(ctx), name, encoder=encoder, old_encoder=old_encoder, exact=exact, hnsw_ef=hnsw_ef
    )
    with opened as dual:
        hits = dual.search(image, limit=limit, filter=_parse_filter(filters))
        pair = dual.pair
    rows = [dataclasses.asdict(h) for h in hits]
    lines = [f"{'#':>3}  {'distance':>8}  {'source':6}  {pair.label_field[:10]:10}  id / image"]
    for rank, hit in enumerate(hits, 1):
        try:
            where = shown(pair.uri_rule.uri(hit.id, hit.payload))
        except SourceError:
            where = "-"
        lines.append(
            f"{rank:>3}  {hit.distance:8.4f}  {hit.source:6}  "
            f"{str(hit.payload.get(pair.label_field, '')):10}  {hit.id}  {where}"
        )
    emit(rows, as_json, "\n".join(lines))


@cli.command()
@name_option
@json_option
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """Both collections' sizes, the fraction migrated, the query mode and the models."""
    store = open_cli_store(ctx)
    pair = load_pair(store, name)
    state = pair_status(store, pair)
    estimate = status_estimate(store, pair, store_location(ctx))
    data = {**dataclasses.asdict(state), "fraction": state.fraction, "estimate": estimate}
    rolled_back = state.state == "rolled_back"
    text = "\n".join(
        [
            f"pair          {state.name} ({state.mode}, {state.state})",
            f"old           {state.old_collection}: {state.old_count} points"
            + (
                f" (+{state.kept_count} migrated, kept for rollback)"
                if state.keep_old and not rolled_back
                else ""
            )
            + (" (all served, by the old model)" if rolled_back else ""),
            f"new           {state.new_collection}: {state.new_count} points"
            + (" (not served since the rollback)" if rolled_back else ""),
            f"migrated      {state.fraction:.1%} (order: {_order(pair)})",
            f"failed        {state.failed}",
            *(f"  {pid}  {reason}" for pid, _, reason in state.failure_sample),
            f"encoder       {state.encoder}",
            f"old encoder   {state.old_encoder or '-'}",
            f"alias         {state.alias or '-'}",
            f"estimate      {_estimate_line(estimate)}",
        ]
    )
    emit(data, as_json, text)


def _order(pair: PairRecord) -> str:
    if pair.order is None:
        return "not prepared"
    return pair.order if pair.order_ready else f"{pair.order}, ranks half-written: the next run ranks again"


def _estimate_line(e: dict[str, Any] | None) -> str:
    if e is None:
        return "- (run rmq probe for a label-free quality estimate)"
    k = e["k"]
    return (
        f"{e['mode']}: recall@{k} {e[f'recall@{k}']:.3f} now, {e[f'recall@{k}_start']:.3f} at the start "
        f"(label-free, {e['sample']}-point probe sample, {e['sample_migrated']:.0%} of it migrated)"
        + ("  BELOW THE START: the merge is dipping" if e["below_start"] else "")
    )


class _TrainGroup(click.Group):
    """``rmq train``: the training commands, imported (with torch) only when used."""

    def _real(self) -> click.Group:
        try:
            from train.cli import train as real
        except ModuleNotFoundError as exc:
            raise _needs_torch(exc) from exc
        return real

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self._real().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._real().get_command(ctx, name)


def _needs_torch(exc: ModuleNotFoundError) -> click.ClickException:
    if exc.name in ("torch", "yaml", "onnx"):
        return click.ClickException(
            f"this needs {exc.name}: pip install -e '.[train,export]' (pins the CPU build, torch==2.13.0)"
        )
    raise exc


@cli.command(name="export")
@click.option("--new", "new", type=click.Path(exists=True), help="New backbone checkpoint (PyTorch).")
@click.option("--new-onnx", type=click.Path(exists=True), help="Or: the team's own ONNX backbone.")
@click.option(
    "--output-name",
    help="With --new-onnx: the output that holds the embedding [default: its 'embedding' role].",
)
# Gone: a backbone describes itself with 'rmq model stamp'. Kept hidden to say so instead of "no such option".
@click.option("--input-size", hidden=True)
@click.option("--input-layout", hidden=True)
@click.option("--input-dtype", hidden=True)
@click.option("--heads", type=click.Path(exists=True), help="Trained ρ/ψ heads checkpoint.")
@click.option("--out", type=click.Path(), help="Where the two-output graph goes.")
@click.option("--old", type=click.Path(exists=True), help="Old backbone checkpoint, for --out-old.")
@click.option("--out-old", type=click.Path(), help="Where the old model's graph goes (RM_naive, rmq index).")
@click.option("--no-scores", is_flag=True, help="Leave out the old classifier's 'scores' output.")
@json_option
def export_command(
    new: str | None,
    new_onnx: str | None,
    output_name: str | None,
    input_size: str | None,
    input_layout: str | None,
    input_dtype: str | None,
    heads: str | None,
    out: str | None,
    old: str | None,
    out_old: str | None,
    no_scores: bool,
    as_json: bool,
) -> None:
    """Export φ_new+ρ+ψ as one ONNX graph (outputs new, rev) and/or the old model, checked against PyTorch."""
    try:
        from exporters.compose import attach_heads
        from exporters.serving import ExportError, export_old, export_serving
    except ModuleNotFoundError as exc:
        raise _needs_torch(exc) from exc
    if (input_size, input_layout, input_dtype) != (None, None, None):
        raise ConfigError(
            "--input-size/--input-layout/--input-dtype are gone: describe the backbone with "
            "'rmq model stamp' (size, resize/crop, layout, dtype, mean/std), then export the stamped graph"
        )
    done = {}
    try:
        if (new or new_onnx) and not (heads and out):
            raise ConfigError("--new/--new-onnx need --heads and --out")
        if new and new_onnx:
            raise ConfigError("give --new or --new-onnx, not both")
        if new:
            done["model"] = export_serving(new, heads, out)  # type: ignore[arg-type]
        elif new_onnx:
            done["model"] = attach_heads(new_onnx, heads, out, output_name=output_name)  # type: ignore[arg-type]
        if old or out_old:
            if not (old and out_old):
                raise ConfigError("--old and --out-old go together")
            done["old"] = export_old(old, out_old, scores=not no_scores)
        if not done:
            raise ConfigError(
                "nothing to export: give --new/--new-onnx with --heads and --out, or --old with --out-old"
            )
    except (ExportError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    report = {k: {"path": str(p), "max_abs_diff": d} for k, (p, d) in done.items()}
    emit(
        report,
        as_json,
        "\n".join(
            f"wrote {r['path']} (ONNX Runtime vs PyTorch: {r['max_abs_diff']:.1e})" for r in report.values()
        ),
    )


@cli.command()
@click.option(
    "--out",
    default="rmq-demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the demo's files go.",
)
@click.option(
    "--data",
    type=click.Path(exists=True, file_okay=False),
    help="An ImageFolder with train/ and test/ [default: scikit-learn's digits].",
)
@click.option("--epochs", default=12, show_default=True, type=click.IntRange(min=1), help="Backbone epochs.")
@json_option
def demo(out: str, data: str | None, epochs: int, as_json: bool) -> None:
    """Train old and new models, serve both collections, and watch quality climb as the gallery migrates."""
    import time
    from pathlib import Path

    try:
        from train.demo import run_demo, summary
    except ModuleNotFoundError as exc:
        raise _needs_torch(exc) from exc
    started = time.perf_counter()
    if not as_json:
        click.echo("training the old model (first half of the classes), the new one (all) and ψ/ρ (MCL)...")

    def show(row: Any) -> None:
        if not as_json:
            if row.t == 0:
                click.echo(f"\n{'t':>4}  {'RM_naive mAP':>12} {'top-1':>6}   {'RM mAP':>7} {'top-1':>6}")
            click.echo(
                f"{row.t:4.1f}  {100 * row.naive_map:12.1f} {100 * row.naive_top1:6.1f}   "
                f"{100 * row.rm_map:7.1f} {100 * row.rm_top1:6.1f}"
            )

    rows = run_demo(Path(out), data=Path(data) if data else None, epochs=epochs, on_row=show)
    areas = summary(rows)
    report = {**areas, "seconds": time.perf_counter() - started, "out": str(Path(out).resolve())}
    auc = f"RM_naive {100 * areas['auc_map_naive']:.1f}, RM {100 * areas['auc_map_rm']:.1f}"
    plotted = ", the plot curves.png" if (Path(out) / "curves.png").is_file() else ""
    text = (
        f"\narea under mAP_t: {auc}\nmodels, ONNX graphs, the Qdrant store{plotted} are in {report['out']}"
        f"; took {report['seconds']:.0f} s"
    )
    emit({**report, "rows": [vars(r) for r in rows]} if as_json else report, as_json, text)


cli.add_command(
    _TrainGroup(name="train", help="Train backbones, heads, adapters and baselines (needs PyTorch).")
)
cli.add_command(migrate)
cli.add_command(eval_command)
cli.add_command(probe_command)
cli.add_command(finalize_command)
cli.add_command(rollback_command)
cli.add_command(model)
cli.add_command(pairs_command)
cli.add_command(drop_pair_command)
cli.add_command(switch_encoder_command)


def main() -> None:
    """Entry point of the ``rmq`` script."""
    cli(prog_name="rmq")
