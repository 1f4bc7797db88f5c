"""``rmq model check``: does a stamped graph reproduce the vectors a collection already stores?"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import click

from rm_qdrant.cli.common import SEED, decode_option, emit, json_option, open_cli_store
from rm_qdrant.cli.sourceopts import source_options
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.models.text import load_encoder
from rm_qdrant.sources import SourceConfig

if TYPE_CHECKING:
    from rm_qdrant.operations.verify import Agreement, Fidelity

#: What to look at when the vectors differ, by what the graph reads.
_IMAGE_HINT = (
    "--resize/--crop, --interpolation, --orientation, --mean/--std, --channel-order and --input-size of "
    "'rmq model stamp'"
)
_TEXT_HINT = (
    "that it is the model that made them, stamped with its own tokenizer, and --max-length, --pooling, "
    "--normalize/--no-normalize, --truncation and --document-prefix of 'rmq model stamp --tokenizer'"
)


@click.command(name="check")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(dir_okay=False))
@click.option("--collection", required=True, help="A collection whose vectors this model should reproduce.")
@click.option("--vector", help="Its vector name, if it has named vectors [default: its only vector].")
@click.option("--sample", default=200, show_default=True, type=click.IntRange(min=1), help="Points compared.")
@click.option("--uri-field", default="uri", show_default=True, help="Payload field with each image's URI.")
@click.option("--uri-template", help="Or build the URI from payload fields, e.g. 's3://bucket/{sku}.jpg'.")
@click.option(
    "--text-field",
    help="A text model: the payload field that holds each document's text itself ('body', 'doc.text') "
    "[default: documents are read from --uri-field/--uri-template].",
)
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
    text_field: str | None,
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

    A text model (stamped with --tokenizer) re-encodes each point's document: the text in
    --text-field, or the file or object at --uri-field/--uri-template, decoded as UTF-8.
    """
    from rm_qdrant.operations.verify import Fidelity, agreement, fidelity, recorded_decode

    uri_given = ctx.get_parameter_source("uri_field") is not click.core.ParameterSource.DEFAULT
    if text_field is not None and (uri_given or uri_template is not None):
        raise click.UsageError("give --text-field, or --uri-field/--uri-template, not both")
    encoder = load_encoder(model_path)  # decodes exact; fidelity decodes fast too
    text = encoder.info.modality == "text"
    if text and decode is not None:
        raise click.UsageError("--decode is for images: a text model reads its documents one way")
    if text_field is not None and not text:
        raise click.UsageError(f"--text-field is for text models; {model_path} reads images (--uri-field)")
    store = open_cli_store(ctx)
    recorded = None
    if decode is None and not text:
        decode, recorded = recorded_decode(store, collection)
    rule = UriRule(text_field, inline=True) if text_field else UriRule(uri_field, uri_template)
    measure = fidelity if decode == "fast" else agreement
    measured = measure(
        store, collection, encoder, vector=vector, rule=rule, sample=sample, seed=seed, source=source
    )
    fast = measured if isinstance(measured, Fidelity) else None
    found = measured.exact if isinstance(measured, Fidelity) else measured
    shown = _check_text(model_path, collection, found=found, fast=fast, recorded=recorded, text=text)
    emit(_check_dict(found, fast, decode=decode, recorded=recorded), as_json, shown)
    reason = found.mismatch()
    if reason is not None:
        raws = (
            ""
            if found.metric == "cosine"
            else "that the graph gives its raw vectors (not L2-normalised), and "
        )
        raise ConfigError(
            f"the model does not reproduce the stored vectors ({reason}): check {raws}"
            + (_TEXT_HINT if text else _IMAGE_HINT)
        )


def _check_dict(
    found: Agreement, fast: Fidelity | None, *, decode: str | None, recorded: str | None
) -> dict[str, object]:
    from rm_qdrant.operations.verify import SAME_OUTPUT, SAME_VECTOR

    return {
        **dataclasses.asdict(found),
        "matches": found.mismatch() is None,
        "threshold": SAME_OUTPUT,
        "max_relative_error": SAME_VECTOR,
        "decode": decode,
        "decode_from_pair": recorded,
        "fast": None if fast is None else _fast_dict(fast),
    }


def _check_text(
    model_path: str,
    collection: str,
    *,
    found: Agreement,
    fast: Fidelity | None,
    recorded: str | None,
    text: bool,
) -> str:
    line = f"{model_path} against {found.checked} stored vectors of {collection!r} ({found.metric}): "
    line += found.describe()
    if found.unreadable:
        items = "documents" if text else "images"
        line += f"; {found.unreadable} {items} unreadable (first: {found.first_error})"
    if found.longest is not None and found.window is not None and found.longest < found.window:
        line += (
            f"; the longest document compared has {found.longest} of the window's {found.window} tokens: "
            "a graph stamped with another --max-length would match these too"
        )
    return line if fast is None else line + "\n" + _fast_text(fast, recorded)


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
