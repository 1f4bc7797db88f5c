"""``rmq model``: describe a team's own ONNX encoder (image or text) so rm-qdrant can serve it."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import click

from rm_qdrant.cli.common import Group, emit, json_option, plain
from rm_qdrant.cli.model_check import check_command
from rm_qdrant.core.inputspec import INTERPOLATIONS, ORIENTATIONS
from rm_qdrant.core.modelinfo import ModelInfo, parse_floats
from rm_qdrant.core.textspec import MAX_TOKENS, POOLINGS, TRUNCATIONS, TextSpec
from rm_qdrant.models.text import load_encoder

if (
    TYPE_CHECKING
):  # rm_qdrant.models.stamp imports onnx: loaded when a model command runs, not for every rmq call
    from rm_qdrant.models.stamp import StampReport
    from rm_qdrant.models.text_stamp import TextStampReport

#: Options that describe how images are prepared, and how texts are: one kind per stamp.
IMAGE_OPTIONS = (
    "input_size",
    "resize",
    "crop",
    "input_layout",
    "input_dtype",
    "mean",
    "std",
    "channel_order",
    "interpolation",
    "orientation",
)
TEXT_OPTIONS = ("max_length", "pooling", "normalize", "truncation", "query_prefix", "document_prefix")


@click.group(name="model", cls=Group)
def model() -> None:
    """Describe ONNX encoders: the rm_qdrant metadata entry any graph needs."""


def _text_options(command: Any) -> Any:
    """``--tokenizer`` and the options of a text stamp."""
    options = [
        click.option(
            "--tokenizer",
            type=click.Path(dir_okay=False),
            help="Text graph: the model's tokenizer.json or WordPiece vocab.txt, written into the graph "
            "(another tokenizer is another model).",
        ),
        click.option(
            "--max-length",
            type=click.IntRange(2, MAX_TOKENS),
            help="Text: tokens per text, special tokens included [default: the tokenizer.json's own "
            "truncation max_length; a vocab.txt, or a tokenizer.json without one, needs it].",
        ),
        click.option(
            "--pooling",
            type=click.Choice(POOLINGS),
            default="mean",
            show_default=True,
            help="Text: mean (token states averaged over the attention mask), cls (the first token's "
            "state) or output (the output is one vector a text already).",
        ),
        click.option(
            "--normalize/--no-normalize",
            default=True,
            show_default=True,
            help="Text: L2-normalise the pooled vectors.",
        ),
        click.option(
            "--truncation",
            type=click.Choice(TRUNCATIONS),
            default="right",
            show_default=True,
            help="Text: a longer text keeps its start (right) or its end (left).",
        ),
        click.option("--query-prefix", default="", help="Text: put before every query, e.g. 'query: '."),
        click.option(
            "--document-prefix", default="", help="Text: put before every document, e.g. 'passage: '."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


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
@click.option("--input-size", type=int, help="Image: input height = width (needed for an image graph).")
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
@_text_options
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
@click.pass_context
def stamp_command(
    ctx: click.Context, source: str, out: str, outputs: tuple[str, ...], **options: Any
) -> None:
    """Add the rm_qdrant metadata entry to SOURCE, an ONNX graph; nothing else in it changes.

    Roles map to the graph's own outputs (nothing is renamed), e.g.
    --output embedding=image_embeds. Output dimensions come from the graph's static
    shapes, or from one run on a zero input.

    An image graph takes --input-size and the image options. A text graph (inputs input_ids,
    attention_mask, optionally token_type_ids) takes --tokenizer and the text options; its
    tokenizer is written into the graph. --max-length left out is the tokenizer.json's own
    truncation max_length (a vocab.txt states none: give it).
    """
    from rm_qdrant.models.stamp import parse_output_roles

    as_json = options.pop("as_json")
    roles = parse_output_roles(outputs)
    common = {k: options.pop(k) for k in ("distance", "scale", "name")}
    if options["tokenizer"] is not None:
        _refuse_given(ctx, IMAGE_OPTIONS, why="is for image graphs; a text graph (--tokenizer) takes none")
        report = _stamp_text(source, out, roles=roles, options=options, common=common)
        emit(_text_dict(report), as_json, _text_text(report))
        return
    _refuse_given(ctx, TEXT_OPTIONS, why="is for text graphs: give the model's tokenizer with --tokenizer")
    if options["input_size"] is None:
        raise click.UsageError("an image graph needs --input-size (a text graph: --tokenizer)")
    image_report = _stamp_image(source, out, roles=roles, options=options, common=common)
    emit(_as_dict(image_report), as_json, _as_text(image_report))


def _refuse_given(ctx: click.Context, names: tuple[str, ...], *, why: str) -> None:
    """One line naming the first option of ``names`` the user gave."""
    for param in ctx.command.params:
        if (
            param.name in names
            and ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT
        ):
            flag = param.opts[0] if param.name != "normalize" else "--normalize/--no-normalize"
            raise click.UsageError(f"{flag} {why}")


def _stamp_text(
    source: str, out: str, *, roles: dict[str, str], options: dict[str, Any], common: dict[str, Any]
) -> TextStampReport:
    from rm_qdrant.models.text_stamp import stamp_text_model

    return stamp_text_model(
        source, out, outputs=roles, **{k: options[k] for k in ("tokenizer", *TEXT_OPTIONS)}, **common
    )


def _stamp_image(
    source: str, out: str, *, roles: dict[str, str], options: dict[str, Any], common: dict[str, Any]
) -> StampReport:
    from rm_qdrant.models.stamp import stamp_model

    return stamp_model(
        source,
        out,
        outputs=roles,
        size=options["input_size"],
        layout=options["input_layout"],
        dtype=options["input_dtype"],
        resize=options["resize"],
        crop=options["crop"],
        mean=parse_floats(options["mean"], "--mean"),
        std=parse_floats(options["std"], "--std"),
        channel_order=options["channel_order"],
        interpolation=options["interpolation"],
        orientation=options["orientation"],
        **common,
    )


def _head(report: StampReport | TextStampReport) -> dict[str, object]:
    """What every stamp's ``--json`` starts with: the files and the model's facts."""
    info = report.info
    return {
        "source": str(report.source),
        "out": str(report.out),
        "replaced": report.replaced,
        "name": info.name,
        "modality": info.modality,
        "distance": info.distance,
        "scale": info.scale,
    }


def _head_lines(report: StampReport | TextStampReport) -> list[str]:
    """What every stamp's text starts with."""
    lines = [f"stamped {report.source} -> {report.out} ({_facts(report.info)})"]
    if report.replaced:
        lines.append(f"  replaced the rm_qdrant entry {report.source} already had")
    return lines


def _as_dict(report: StampReport) -> dict[str, object]:
    info = report.info
    return {
        **_head(report),
        "outputs": {
            role: {"graph_output": info.output_names[role], "dim": dim, "from": report.dims_from[role]}
            for role, dim in info.outputs.items()
        },
        "input": {"name": report.input_name, **dataclasses.asdict(info.input)},
    }


def _as_text(report: StampReport) -> str:
    info = report.info
    lines = _head_lines(report)
    for role, dim in info.outputs.items():
        lines.append(f"  {role:9} -> {info.output_names[role]}: {dim}-d ({report.dims_from[role]})")
    lines.append(f"  input     {report.input_name}: {info.input.describe()}")
    return "\n".join(lines)


def _facts(info: ModelInfo) -> str:
    facts = [info.name, info.modality, f"{info.distance} distance" if info.distance else "any distance"]
    return ", ".join(facts + ([f"{info.scale} vectors"] if info.scale else []))


def _text_dict(report: TextStampReport) -> dict[str, object]:
    info = report.info
    return {
        **_head(report),
        "outputs": {
            role: {"graph_output": info.output_names[role], "dim": dim} for role, dim in info.outputs.items()
        },
        "input": {
            **info.input.to_json(),  # type: ignore[union-attr]  # a TextSpec
            "max_length_from": report.max_length_from,
            "tokenizer": _tokenizer_kind(info.input),  # type: ignore[arg-type]
            "vocabulary": report.vocabulary,
        },
    }


def _text_text(report: TextStampReport) -> str:
    info = report.info
    spec: TextSpec = info.input  # type: ignore[assignment]  # a text stamp's
    window = "given" if report.max_length_from == "given" else "the tokenizer's own truncation"
    lines = _head_lines(report)
    lines += _text_lines(
        info, spec, window=f"{spec.max_length} tokens ({window})", vocabulary=report.vocabulary
    )
    return "\n".join(lines)


def _text_lines(info: ModelInfo, spec: TextSpec, *, window: str, vocabulary: int) -> list[str]:
    """What a text graph says: its roles, window, pooling, prefixes and tokenizer."""
    lines = [f"  {role:9} -> {info.output_names[role]}: {dim}-d" for role, dim in info.outputs.items()]
    pooled = f"{spec.pooling} pooling" + (", L2-normalised" if spec.normalize else ", not normalised")
    lines.append(f"  text      {window}, cut {spec.truncation}; {pooled}")
    if spec.query_prefix or spec.document_prefix:
        shown = f"query {spec.query_prefix!r}, document {spec.document_prefix!r}"
        lines.append(f"  prefixes  {plain(shown)}")
    inputs = "input_ids, attention_mask" + (", token_type_ids" if spec.token_type_ids else "")
    kind = f"{_tokenizer_kind(spec)}, {vocabulary:,} tokens"
    lines.append(f"  tokenizer {spec.tokenizer_sha256} ({kind}); inputs {inputs}")
    return lines


def _tokenizer_kind(spec: TextSpec) -> str:
    """The tokenizer's model type (WordPiece, BPE, Unigram...)."""
    try:
        kind = json.loads(spec.tokenizer).get("model", {}).get("type")
    except (ValueError, AttributeError, RecursionError):
        kind = None
    return kind if isinstance(kind, str) else "unknown kind"


@model.command(name="describe")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@json_option
def describe_command(model_path: str, as_json: bool) -> None:
    """What a stamped graph says about itself: what it reads (images or text) and how, its roles and
    their dimensions, its distance and scale, and its fingerprint (what a pair records).

    The graph is loaded as every command loads it, so one that rm-qdrant would refuse is refused
    here, in one line.
    """
    encoder = load_encoder(model_path)
    info = encoder.info
    data: dict[str, Any] = {
        "path": model_path,
        "name": info.name,
        "fingerprint": encoder.fingerprint,
        "modality": info.modality,
        "distance": info.distance,
        "scale": info.scale,
        "outputs": {
            role: {"graph_output": info.output_names[role], "dim": d} for role, d in info.outputs.items()
        },
    }
    lines = [f"{model_path}: {_facts(info)}; fingerprint {encoder.fingerprint}"]
    if isinstance(info.input, TextSpec):
        vocabulary = encoder.vocabulary  # type: ignore[attr-defined]  # a TextEncoder
        data["input"] = {
            **info.input.to_json(),
            "tokenizer": _tokenizer_kind(info.input),
            "vocabulary": vocabulary,
        }
        lines += _text_lines(
            info, info.input, window=f"{info.input.max_length} tokens", vocabulary=vocabulary
        )
    else:
        data["input"] = dataclasses.asdict(info.input)
        lines += [f"  {role:9} -> {info.output_names[role]}: {d}-d" for role, d in info.outputs.items()]
        lines.append(f"  input     {info.input.describe()}")
    emit(data, as_json, "\n".join(lines))


model.add_command(check_command)
