"""Switching a running pair to another encoder (``rmq switch-encoder``).

A naive pair can start serving as soon as the team has a plain new model, and move
to a trained graph (ψ, and ρ held at the identity) once it exists, without starting
over. The one rule: the vectors already in the new collection must stay valid, so
the candidate's gallery output must reproduce them, under the collection's own metric
(a Euclid or dot collection compares norms too: a graph that L2-normalises raw vectors
is refused); otherwise two embedding spaces would mix in one collection, and the switch
is refused with the measured reason.

The graph a naive pair served until it switches to ψ is the plain new model that ψ's graph was
trained from: the pair records it (unless it records one already), as ``rmq eval``'s and
``rmq probe``'s New.

A calibration (``rmq calibrate``) maps the old model's own distances for the naive merge: it
stays with a naive pair moving to another naive graph (the new vectors and the old ones are
unchanged, so the map still fits them), and goes with a move to an rm graph, whose old half is
searched through ρ on another scale; :func:`calibration_after` names what happened, and
``rmq switch-encoder`` says it.

The switch is also the one way to change how the pair decodes its images (``exact`` or ``fast``,
recorded at ``rmq init --decode``), with or without another graph: :func:`switch_decode`. Points
already in new stay as they were decoded; the batches of a migration started after the switch
(one under way keeps the mode it started with, as it keeps its graph), the queries of a
:class:`~rm_qdrant.serving.dual.DualIndex` opened (or refreshed) after the switch, and every
command that reads the pair's images decode the new way. A graph given with it is checked under
the mode the pair had, the one the vectors already in new were made with.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rm_qdrant.core.inputspec import check_decode
from rm_qdrant.core.modelinfo import items_of
from rm_qdrant.core.textspec import TextSpec
from rm_qdrant.errors import ConfigError, EncoderError, MigrationError, Refused
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.operations.create import old_model_ref, plain_model_ref
from rm_qdrant.operations.verify import SAME_OUTPUT, Agreement, agreement
from rm_qdrant.pair.layouts import count_new, layout_of, new_where
from rm_qdrant.pair.record import ModelRef, PairRecord, record_collection_model, save_pair
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

__all__ = ["SAME_OUTPUT", "calibration_after", "switch_decode", "switch_encoder"]


def _check_switchable(pair: PairRecord) -> None:
    if pair.state != "backfilling":
        raise MigrationError(
            f"pair {pair.name!r} is {pair.state}: only a backfilling pair switches its encoder or decode mode"
        )


def switch_decode(store: Store, pair: PairRecord, decode: str) -> PairRecord:
    """Record ``decode`` (``exact`` or ``fast``) as how the pair decodes its images, keeping its
    graph: the points already in new keep the vectors of the old mode (no check is made; ``rmq
    model check --decode fast`` measures how far the two modes are apart on the pair's images).

    Raises:
        ConfigError: an unknown mode, or a text pair (text is read one way).
        MigrationError: the pair is not backfilling.
    """
    check_decode(decode)
    _check_switchable(pair)
    _check_decodes_images(pair)
    updated = replace(pair, decode=decode)
    save_pair(store, updated)
    return updated


def _check_decodes_images(pair: PairRecord) -> None:
    if pair.encoder.modality == "text":
        raise ConfigError(f"--decode is for images: text pair {pair.name!r} reads its documents one way")


def _check_reads(
    pair: PairRecord, encoder: OnnxEncoder, old: OnnxEncoder | None, plain: OnnxEncoder | None
) -> None:
    """Every graph given reads what the pair's models read (images or text).

    Raises:
        ConfigError: one line naming the graph that reads the other kind.
    """
    for model in (encoder, old, plain):
        if model is not None and model.info.modality != pair.encoder.modality:
            raise ConfigError(
                f"{model.path} reads {model.info.items}, pair {pair.name!r} serves "
                f"{items_of(pair.encoder.modality)}: a pair's models read one kind of item"
            )


def _check_window(pair: PairRecord, encoder: OnnxEncoder) -> None:
    """A text graph cuts documents where the pair's graph cut them (``max_length``, ``truncation``).

    The sampled check sees a changed window only on documents longer than it; where those are few
    none may be drawn, and the long documents already in new would keep vectors of another cut
    than the ones migrated after the switch, without a word. The pair's graph is read from the
    path it recorded; where that file is gone or changed, the check alone decides.

    Raises:
        ConfigError: the windows differ (one line naming both).
    """
    if pair.encoder.modality != "text" or not Path(pair.encoder.path).is_file():
        return
    try:
        current = load_encoder(pair.encoder.path)
    except (ConfigError, EncoderError):  # the file was replaced by something unreadable
        return
    if current.fingerprint != pair.encoder.fingerprint:
        return
    ours, theirs = current.info.input, encoder.info.input
    if isinstance(ours, TextSpec) and isinstance(theirs, TextSpec):
        if (ours.max_length, ours.truncation) != (theirs.max_length, theirs.truncation):
            raise ConfigError(
                f"{encoder.path} cuts documents at {theirs.max_length} tokens (keeping the "
                f"{_kept(theirs)}), the vectors already in {pair.new_collection!r} were made cut at "
                f"{ours.max_length} (keeping the {_kept(ours)}): longer documents would be embedded "
                "two ways, which a sampled check need not see; switch only to a graph with the same "
                "max_length and truncation, or start a new pair"
            )


def _kept(spec: TextSpec) -> str:
    return "start" if spec.truncation == "right" else "end"


def calibration_after(before: PairRecord, after: PairRecord) -> str | None:
    """What a switch did to the pair's calibration: "kept", "dropped", or None (it had none)."""
    if before.calibration is None:
        return None
    return "kept" if after.calibration is not None else "dropped"


def switch_encoder(
    store: Store,
    pair: PairRecord,
    encoder: OnnxEncoder,
    *,
    old_encoder: OnnxEncoder | None = None,
    new_model: OnnxEncoder | None = None,
    sample: int = 64,
    source: SourceConfig | None = None,
    decode: str | None = None,
) -> tuple[PairRecord, Agreement | None]:
    """Make ``encoder`` the pair's encoder, if the vectors already in new stay valid.

    ``decode``: record this decode mode too (None: keep the pair's); the check re-encodes new's
    sample decoded as the pair decoded until now, as the vectors there were made.

    The mode follows the graph: ``rm`` with ``new`` and ``rev`` outputs, else ``naive``
    (with the pair's old model, or ``old_encoder``). The plain new model the record keeps is
    ``new_model`` if given, else the one recorded, else (a naive pair moving to ``rm``) the
    graph the pair served until now.

    A naive pair's calibration is kept by a naive graph and dropped by an rm graph (module
    docstring).

    Returns:
        The updated record, and the agreement measured on new (None when new is empty).

    Raises:
        MigrationError: the pair is not backfilling.
        ConfigError: sizes or distance do not fit; a graph that reads another kind of item
            (images, text) than the pair; ``decode`` on a text pair.
        Refused: the candidate's output differs from the vectors already in new.
    """
    if decode is not None:
        check_decode(decode)
        _check_decodes_images(pair)
    _check_switchable(pair)
    _check_reads(pair, encoder, old_encoder, new_model)
    encoder = encoder.decoding_as(pair.decode)  # as new's vectors were made (a copy: the caller's stays)
    gallery = encoder.info.gallery_output()
    new_dim = store.collection(pair.new_collection, pair.new_using).dim
    old_dim = store.collection(pair.old_collection, pair.vector).dim
    if encoder.info.outputs[gallery] != new_dim or not encoder.info.serves(pair.distance):
        raise ConfigError(
            f"{encoder.path} makes {encoder.info.outputs[gallery]}-d {encoder.info.distance or 'any'} "
            f"vectors, collection {pair.new_collection!r} holds {new_dim}-d {pair.distance} ones"
        )
    mode = "rm" if "rm" in encoder.info.query_modes else "naive"
    if mode == "rm" and encoder.info.outputs["rev"] != old_dim:
        raise ConfigError(
            f"{encoder.path} output 'rev' is {encoder.info.outputs['rev']}-d, old holds {old_dim}-d"
        )
    old_model = pair.old_encoder
    if old_encoder is not None:
        old_model = old_model_ref(store, store.collection(pair.old_collection, pair.vector), old_encoder)
    if mode == "naive" and old_model is None:
        raise ConfigError(f"{encoder.path} has no 'rev' output: the naive mode needs --old-encoder")
    plain = pair.new_model
    if new_model is not None:
        plain = plain_model_ref(new_model, pair.name, dim=new_dim, distance=pair.distance)
    elif plain is None and pair.mode == "naive" and mode == "rm":
        plain = pair.encoder
    measured = None
    if count_new(store, pair):
        _check_window(pair, encoder)
        measured = agreement(
            store,
            pair.new_collection,
            encoder,
            output=gallery,
            vector=pair.new_using,
            where=new_where(pair),
            rule=pair.uri_rule,
            sample=sample,
            source=source,
        )
        reason = measured.mismatch()
        if reason is not None:
            other = pair.encoder.another_kind(encoder)  # a text graph with another tokenizer says so
            raise Refused(
                f"{encoder.path} does not reproduce the vectors already in {pair.new_collection!r} "
                f"({reason}, {measured.checked} points{'; ' + other if other else ''}); "
                "they would mix two embedding spaces. Switch only to a graph whose gallery output is "
                "unchanged (e.g. ψ trained with ρ = identity), or start a new pair",
                measured=measured,
            )
    updated = replace(
        pair,
        encoder=ModelRef.of(encoder, gallery),
        mode=mode,
        old_encoder=old_model,
        new_model=plain,
        calibration=pair.calibration if mode == "naive" else None,  # module docstring
        decode=pair.decode if decode is None else decode,
    )
    save_pair(store, updated)
    record_collection_model(store, layout_of(pair).new_model_key, updated.encoder)
    return updated, measured
