"""``rmq model``: describe a team's own ONNX encoder so rm-qdrant can serve it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from rm_qdrant.cli.common import SEED, Group, decode_option, emit, json_option, open_cli_store
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.inputspec import INTERPOLATIONS, ORIENTATIONS
from rm_qdrant.core.modelinfo import parse_floats
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.sources import SourceConfig

if (
    TYPE_CHECKING
):  # rm_qdrant.models.stamp imports onnx: loaded when a model command runs, not for every rmq call
    from rm_qdrant.models.stamp import StampReport
    from rm_qdrant.operations.verify import Fidelity


@click.group(name="model", cls=Group)
def model() -> None:
    """Describe ONNX encoders: the rm_qdrant metadata entry any graph needs."""


@model.command(name="stamp")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Where the stamped graph goes.")
@click.option(
    "--output",
    "outputs",
    multiple=True,
    required=True,
    metavar="ROLE=GRAPH_OUTPUT",
    help="A role (embedding, new, rev, scores) and the graph output that plays it (repeatable).",
)
@click.option("--input-size", required=True, type=int, help="Input height = width.")
@click.option("--resize", type=int, help="Shorter side before the centre crop (torchvision Resize(N)).")
@click.option("--crop", type=int, help="Centre crop side, equal to --input-size (torchvision CenterCrop(N)).")
@click.option(
    "--input-layout", type=click.Choice(["NCHW", "NHWC"]), help="[default: from the input's shape, else NCHW]"
)
@click.option("--input-dtype", type=click.Choice(["float32", "uint8"]), help="[default: the input's type]")
@click.option("--mean", help="Per-channel mean for float32 input, e.g. 0.485,0.456,0.406 [default: none].")
@click.option("--std", help="Per-channel std for float32 input, e.g. 0.229,0.224,0.225 [default: none].")
@click.option(
    "--channel-order",
    type=click.Choice(["RGB", "BGR"]),
    default="RGB",
    show_default=True,
    help="Channel order the graph expects; --mean and --std are in this order.",
)
@click.option(
    "--interpolation",
    type=click.Choice(INTERPOLATIONS),
    default="bilinear",
    show_default=True,
    help="Pillow's filter for every resize (Image.Resampling.<NAME>; antialiased when shrinking, "
    "except nearest): as the team's pipeline resizes, e.g. torchvision Resize(..., interpolation=BICUBIC).",
)
@click.option(
    "--orientation",
    type=click.Choice(ORIENTATIONS),
    default="ignore",
    show_default=True,
    help="The EXIF orientation tag: ignore it (as Image.open and torchvision's default loader do) or "
    "turn each photo as it says (exif: the team's pipeline calls ImageOps.exif_transpose).",
)
@click.option(
    "--distance",
    type=click.Choice(["cosine", "dot", "euclid", "manhattan"]),
    help="The only distance its vectors serve [default: any: the collection's own].",
)
@click.option(
    "--scale",
    type=click.Choice(["unit", "raw"]),
    help="unit: it L2-normalises its vectors (checked); raw: their norms carry meaning "
    "(Euclid, dot) [default: not stated].",
)
@click.option("--name", help="Model name [default: the file's stem].")
@json_option
def stamp_command(
    source: str,
    out: str,
    outputs: tuple[str, ...],
    input_size: int,
    resize: int | None,
    crop: int | None,
    input_layout: str | None,
    input_dtype: str | None,
    mean: str | None,
    std: str | None,
    channel_order: str,
    interpolation: str,
    orientation: str,
    distance: str | None,
    scale: str | None,
    name: str | None,
    as_json: bool,
) -> None:
    """Add the rm_qdrant metadata entry to SOURCE, an ONNX graph; nothing else in it changes.

    Roles map to the graph's own outputs (nothing is renamed), e.g.
    --output embedding=image_embeds. Output dimensions come from the graph's static
    shapes, or from one run on a zero input.
    """
    from rm_qdrant.models.stamp import parse_output_roles, stamp_model

    report = stamp_model(
        source,
        out,
        outputs=parse_output_roles(outputs),
        size=input_size,
        layout=input_layout,
        dtype=input_dtype,
        resize=resize,
        crop=crop,
        mean=parse_floats(mean, "--mean"),
        std=parse_floats(std, "--std"),
        channel_order=channel_order,
        interpolation=interpolation,
        orientation=orientation,
        distance=distance,
        scale=scale,
        name=name,
    )
    emit(_as_dict(report), as_json, _as_text(report))


def _as_dict(report: StampReport) -> dict[str, object]:
    info = report.info
    return {
        "source": str(report.source),
        "out": str(report.out),
        "replaced": report.replaced,
        "name": info.name,
        "distance": info.distance,
        "scale": info.scale,
        "outputs": {
            role: {"graph_output": info.output_names[role], "dim": dim, "from": report.dims_from[role]}
            for role, dim in info.outputs.items()
        },
        "input": {"name": report.input_name, **dataclasses.asdict(info.input)},
    }


def _as_text(report: StampReport) -> str:
    info = report.info
    facts = [info.name, f"{info.distance} distance" if info.distance else "any distance"]
    facts += [f"{info.scale} vectors"] if info.scale else []
    lines = [f"stamped {report.source} -> {report.out} ({', '.join(facts)})"]
    if report.replaced:
        lines.append(f"  replaced the rm_qdrant entry {report.source} already had")
    for role, dim in info.outputs.items():
        lines.append(f"  {role:9} -> {info.output_names[role]}: {dim}-d ({report.dims_from[role]})")
    lines.append(f"  input     {report.input_name}: {info.input.describe()}")
    return "\n".join(lines)


@model.command(name="check")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("--collection", required=True, help="A collection whose vectors this model should reproduce.")
@click.option("--vector", help="Its vector name, if it has named vectors [default: its only vector].")
@click.option("--sample", default=200, show_default=True, type=click.IntRange(min=1), help="Points compared.")
@click.option("--uri-field", default="uri", show_default=True, help="Payload field with each image's URI.")
@click.option("--uri-template", help="Or build the URI from payload fields, e.g. 's3://bucket/{sku}.jpg'.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the sample.")
@decode_option(
    "fast: also re-encode the same images decoded fast, and print how close they come to the stored "
    "vectors and to the exact-decoded ones [default: as the pair over the collection records, else exact].",
)
@source_options
@json_option
@click.pass_context
def check_command(
    ctx: click.Context,
    model_path: str,
    collection: str,
    vector: str | None,
    sample: int,
    uri_field: str,
    uri_template: str | None,
    seed: int,
    decode: str | None,
    source: SourceConfig,
    as_json: bool,
) -> None:
    """Re-encode stored points' images with MODEL and compare with the vectors stored for them.

    The comparison is the collection's own metric: cosine >= 0.999 for a cosine
    collection; for Euclid, Manhattan and dot, the vectors themselves (relative error
    <= 0.045), so a model that L2-normalises raw vectors fails. A wrong resize, crop,
    interpolation, normalisation, channel order or scale shows here, before anything moves. The
    norms of both sides are reported. Exits 1 when they do not match.

    With --decode fast the same images are also decoded fast: the fast vectors against the
    stored ones and against the exact-decoded ones (min and median, in the collection's
    metric) say what fast decoding costs on these images. The exact-decoded vectors still
    decide the exit status: fast decoding is the team's choice (rmq init/switch-encoder --decode).
    """
    from rm_qdrant.operations.verify import (
        SAME_OUTPUT,
        SAME_VECTOR,
        Fidelity,
        agreement,
        fidelity,
        recorded_decode,
    )

    store = open_cli_store(ctx)
    recorded = None
    if decode is None:
        decode, recorded = recorded_decode(store, collection)
    measure = fidelity if decode == "fast" else agreement
    measured = measure(
        store,
        collection,
        OnnxEncoder(model_path),  # decodes exact; fidelity decodes fast too
        vector=vector,
        rule=UriRule(uri_field, uri_template),
        sample=sample,
        seed=seed,
        source=source,
    )
    fast = measured if isinstance(measured, Fidelity) else None
    found = measured.exact if isinstance(measured, Fidelity) else measured
    reason = found.mismatch()
    data = {
        **dataclasses.asdict(found),
        "matches": reason is None,
        "threshold": SAME_OUTPUT,
        "max_relative_error": SAME_VECTOR,
        "decode": decode,
        "decode_from_pair": recorded,
        "fast": None if fast is None else _fast_dict(fast),
    }
    text = (
        f"{model_path} against {found.checked} stored vectors of {collection!r} ({found.metric}): "
        f"{found.describe()}"
        + (f"; {found.unreadable} images unreadable (first: {found.first_error})" if found.unreadable else "")
    )
    if fast is not None:
        text += "\n" + _fast_text(fast, recorded)
    emit(data, as_json, text)
    if reason is not None:
        raise ConfigError(
            f"the model does not reproduce the stored vectors ({reason}): check "
            + (
                "that the graph gives its raw vectors (not L2-normalised), and "
                if found.metric != "cosine"
                else ""
            )
            + "--resize/--crop, --interpolation, --orientation, --mean/--std, --channel-order and "
            "--input-size of 'rmq model stamp'"
        )


def _fast_dict(fast: Fidelity) -> dict[str, object]:
    return {
        "checked": fast.fast.checked,
        "against_stored": dataclasses.asdict(fast.fast),
        "against_exact": dataclasses.asdict(fast.fast_vs_exact),
    }


def _fast_text(fast: Fidelity, pair: str | None) -> str:
    """The fidelity of fast decoding, in the collection's metric (a similarity: cosine; and the
    relative error where norms matter), on the images both decodings read."""
    by = f" (as pair {pair!r} records)" if pair else ""
    return (
        f"decoded fast{by}, {fast.fast.checked} images:\n"
        f"  fast against the stored vectors:        {fast.fast.describe()}\n"
        f"  fast against the exact-decoded vectors: {fast.fast_vs_exact.describe()}\n"
        "  (the exact-decoded vectors above decide whether the model matches; whether fast is close enough "
        "is yours: rmq probe --decode fast forecasts serving with it)"
    )
