"""``rmq init``: checking a pair against its collection and models, and creating it."""

from __future__ import annotations

import logging
from typing import Any

from rm_qdrant.core.inputspec import DEFAULT_DECODE, check_decode
from rm_qdrant.core.paths import check_path
from rm_qdrant.core.planning import INTERNAL_FIELDS
from rm_qdrant.core.rerank import Rerank, as_rerank
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError, DimensionMismatch, EncoderError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.bypass import unseen_writes
from rm_qdrant.pair.control import forget_pause
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.progress import forget_progress
from rm_qdrant.pair.record import (
    LAYOUTS,
    PAIRED,
    SINGLE,
    Mode,
    ModelRef,
    PairRecord,
    _get,
    check_collection_model,
    list_pairs,
    record_collection_model,
    save_pair,
)
from rm_qdrant.store import CollectionSpec, Store, Where
from rm_qdrant.store.base import resolve
from rm_qdrant.store.tuning import QDRANT_FULL_SCAN_KB, SERVING_FULL_SCAN_KB, check_kb

log = logging.getLogger(__name__)


def _check_free(store: Store, collection: str) -> None:
    for other in list_pairs(store):
        if collection == other.old_collection or (
            collection == other.new_collection and other.state != "finalized"
        ):
            raise ConfigError(
                f"collection {collection!r} already belongs to pair {other.name!r} ({other.state}); "
                f"two pairs on one collection would each serve part of it. See 'rmq pairs', "
                f"'rmq drop-pair {other.name}'"
            )


def create_pair(
    store: Store,
    name: str,
    *,
    old_collection: str,
    encoder: OnnxEncoder,
    old_encoder: OnnxEncoder | None = None,
    new_model: OnnxEncoder | None = None,
    new_collection: str | None = None,
    mode: Mode | None = None,
    keep_old: bool = False,
    old_vector: str | None = None,
    uri: UriRule | None = None,
    label_field: str = "label",
    layout: str = PAIRED,
    new_vector: str | None = None,
    source: dict[str, Any] | None = None,
    full_scan_kb: int | None = None,
    decode: str = DEFAULT_DECODE,
    rerank: Rerank | int | None = None,
) -> PairRecord:
    """Create the new collection (or the new vector) and the pair record (what ``rmq init`` does).

    In the paired layout the new collection mirrors the old one: the same vector name
    and distance, the collection's other vectors (dense or sparse, the same configs: a
    migrated point takes them along), and the same payload indexes. In the single-collection
    layout the old collection gets a second named vector, ``new_vector``, and nothing else
    changes. The mode defaults to ``rm`` when ``encoder`` has a ``rev`` output, else
    ``naive``, which needs ``old_encoder``. Every check runs before anything is written.

    Args:
        new_model: the plain new model (no ψ/ρ heads) ``encoder`` was trained from, recorded as
            ``rmq eval``'s and ``rmq probe``'s New (see :func:`plain_model_ref`).
        old_vector: the old collection's vector (None: its only one).
        uri: where each point's image is (default: payload field ``uri``).
        label_field: the payload field with class labels, if the gallery has them (a path:
            ``meta.dept`` is nested, see :mod:`rm_qdrant.core.paths`).
        layout: ``paired`` or ``single-collection``.
        new_vector: the new vector's name (single-collection layout).
        source: the source settings every command reading the pair's images uses
            (plain data, as :mod:`rm_qdrant.sources.settings` reads it), or None.
        full_scan_kb: the HNSW ``full_scan_threshold`` (KB) every searched vector gets (the
            team's too: ``drop_pair`` does not put it back). None, the default: in the
            single-collection layout :data:`~rm_qdrant.store.tuning.SERVING_FULL_SCAN_KB` (1,000)
            on the ``new`` vector alone, which is spread thin over the collection's segments (on
            real CNN embeddings, 50,000 points half migrated, the search went from 4.3-4.6x the
            paired layout's latency at equal recall to 1.19-1.38x, about what tuning both gives:
            benchmarks/results/search_recall-cifar-old*.md);
            the collections' own in the paired layout. It suits embeddings that reach their
            recall at ef <= 64; vectors that need ef in the hundreds (random Gaussian ones) scan
            faster, and find every point, up to ~8,000 KB (Qdrant's default is 10,000).
        decode: how every command decodes the pair's images, ``exact`` (the default: the team
            pipeline's pixels) or ``fast`` (see :attr:`PairRecord.decode`).
        rerank: the re-rank every search of the pair makes by default (K, or a
            :class:`~rm_qdrant.core.rerank.Rerank`); None: none.

    Raises:
        CollectionNotFound: the old collection does not exist.
        DimensionMismatch: a query vector would not fit the collection it searches.
        EncoderError: a graph's outputs are not the sizes its metadata says.
        ConfigError: the pair exists, the old collection belongs to another pair, the
            distances differ, or the mode lacks a model.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    check_decode(decode)
    default_rerank = as_rerank(rerank)
    check_path(label_field, "--label-field")
    check_modality(encoder, [old_encoder, new_model], uri)
    if decode != DEFAULT_DECODE and encoder.info.modality == "text":
        raise ConfigError(f"--decode {decode} is for images: a text pair reads its documents one way")
    single = layout == SINGLE
    existing = _get(store, "pair", name)
    if existing is not None:
        if existing.get("record", {}).get("state") == "dropping":
            raise ConfigError(
                f"pair {name!r} is being dropped: 'rmq drop-pair {name}' finishes it, then init again"
            )
        raise ConfigError(f"pair {name!r} already exists")
    chosen: Mode = mode or ("rm" if "rm" in encoder.info.query_modes else "naive")
    if chosen == "rm" and "rm" not in encoder.info.query_modes:
        raise ConfigError(
            f"encoder {encoder.path} has no 'new' and 'rev' outputs; use --old-encoder (naive mode)"
        )
    old_collection = resolve(store, old_collection)  # an alias (a finalized upgrade's name): its collection
    old_spec = store.collection(old_collection, old_vector)
    if old_spec.multivector:
        raise ConfigError(_cannot_merge(old_spec))
    if chosen == "naive" and old_encoder is None:
        raise ConfigError(f"encoder {encoder.path} has no 'rev' output: the naive mode needs --old-encoder")
    if single and (keep_old or new_collection not in (None, old_collection)):
        raise ConfigError(
            "the single-collection layout has no new collection and always keeps the old vectors "
            "until 'rmq finalize': drop --new-collection and --keep-old"
        )
    if keep_old and old_encoder is None:
        raise ConfigError(
            "--keep-old needs --old-encoder: a rollback serves the old model again, and it must "
            "encode the queries"
        )
    if chosen == "rm":
        _check_fits(old_spec, encoder.info.outputs["rev"], f"{encoder.path} output 'rev'")
    old_ref = old_model_ref(store, old_spec, old_encoder) if old_encoder is not None else None
    _check_distance(old_spec, encoder)
    gallery = encoder.info.gallery_output()
    dim = encoder.info.outputs[gallery]
    for model in (encoder, old_encoder):
        if model is not None:
            check_output_sizes(model)
    plain = None
    if new_model is not None:
        plain = plain_model_ref(new_model, name, dim=dim, distance=old_spec.distance)
        if chosen == "naive" and new_model.fingerprint != encoder.fingerprint:
            raise ConfigError(
                f"pair {name!r} is naive: its encoder {encoder.path} is the plain new model, and "
                f"--new-model {new_model.path} is another one"
            )
    if full_scan_kb is not None:
        check_kb(full_scan_kb)
    _check_free(store, old_collection)
    if single:
        target = old_collection
        _add_new_vector(store, old_spec, new_vector, dim)
        if full_scan_kb is None:  # the new vector only: rm-qdrant's, which drop-pair deletes
            tune_search(store, {old_collection: [new_vector or ""]}, SERVING_FULL_SCAN_KB)
            own = _threshold(store, old_collection, old_spec.vector)
            if own is not None and own < QDRANT_FULL_SCAN_KB and not store.capabilities.filtered_recall:
                _warn_filtered_recall(
                    f"the old vector {old_spec.vector or '(unnamed)'!r} of {old_collection!r} has "
                    f"full_scan_threshold {own} KB",
                    f"or give it Qdrant's default with --full-scan-kb {QDRANT_FULL_SCAN_KB}",
                )
        else:
            tune_search(store, {old_collection: [old_spec.vector, new_vector or ""]}, full_scan_kb)
            if full_scan_kb < QDRANT_FULL_SCAN_KB and not store.capabilities.filtered_recall:
                _warn_filtered_recall(f"--full-scan-kb {full_scan_kb}", "or leave --full-scan-kb out")
    else:
        target = new_collection or f"{name}-new"
        _check_free(store, target)
        _prepare_new_collection(store, target, dim=dim, old=old_spec)
        tune_search(store, {old_collection: [old_spec.vector], target: [old_spec.vector]}, full_scan_kb)
    record = PairRecord(
        name=name,
        old_collection=old_collection,
        new_collection=target,
        mode=chosen,
        distance=old_spec.distance,
        encoder=ModelRef.of(encoder, gallery),
        old_encoder=old_ref,
        new_model=plain,
        keep_old=keep_old,
        vector=old_spec.vector,
        uri_field="uri" if (uri or UriRule()).inline else (uri or UriRule()).field,
        uri_template=(uri or UriRule()).template,
        text_field=uri.field if uri is not None and uri.inline else None,
        label_field=label_field,
        layout=layout,
        new_vector=new_vector if single else None,
        source=source or None,
        decode=decode,
        rerank=None if default_rerank is None else default_rerank.to_dict(),
    )
    # a run of an earlier pair of this name may have written after its drop: this one starts clean
    forget_progress(store, name)
    forget_pause(store, name)
    save_pair(store, record)
    unseen = unseen_writes(record)
    if unseen:
        log.warning("pair %r: %s", name, unseen)
    record_collection_model(store, layout_of(record).new_model_key, record.encoder)
    return record


def tune_search(store: Store, vectors: dict[str, list[str]], kb: int | None = SERVING_FULL_SCAN_KB) -> None:
    """Give the vectors a pair searches (collection -> vector names) a low HNSW
    ``full_scan_threshold``, so that a segment holding a few thousand of them is searched through
    its graph rather than scanned (see :mod:`rm_qdrant.store.tuning`). A store that cannot
    (qdrant-client's local mode always scans) keeps its own."""
    if kb is not None:
        for collection, names in vectors.items():
            store.tune_index(collection, names, full_scan_kb=kb)


def _threshold(store: Store, collection: str, vector: str) -> int | None:
    """A vector's HNSW ``full_scan_threshold`` (KB), where the store has one to read."""
    return store.index_thresholds(collection).get(vector)


def _warn_filtered_recall(setting: str, remedy: str) -> None:
    """A single-collection pair's old vector under a low threshold, on a server without ACORN
    (before Qdrant 1.16; the embedded store and newer servers search it with ACORN): say what
    it costs."""
    log.warning(
        "%s on a single-collection pair, and this Qdrant server takes no ACORN (older than 1.16, "
        "or its version could not be read): "
        "the old vector's search, filtered to the points not yet migrated, walks its graph where "
        "Qdrant would scan, and loses recall late in the backfill (recall@10 0.82-0.89 at 75 %% "
        "migrated on CIFAR-10 embeddings, ef 10-64; benchmarks/single_collection_share.py): "
        "upgrade the server %s",
        setting,
        remedy,
    )


def check_modality(encoder: OnnxEncoder, others: list[OnnxEncoder | None], uri: UriRule | None) -> None:
    """Every model of a pair reads what ``encoder`` reads (images or text), and only a text
    pair takes its documents from a payload field.

    Raises:
        ConfigError: one line naming the model that reads the other kind, or the option.
    """
    modality = encoder.info.modality
    for other in others:
        if other is not None and other.info.modality != modality:
            raise ConfigError(
                f"{other.path} reads {other.info.items}, {encoder.path} reads {encoder.info.items}: "
                "a pair's models read the same kind of item"
            )
    if uri is not None and uri.inline and modality != "text":
        raise ConfigError(f"--text-field is for text encoders; {encoder.path} reads images (--uri-field)")


def check_output_sizes(model: OnnxEncoder) -> None:
    """Run ``model`` once on a blank image: every output must be the size its metadata says.

    The metadata is what the collection's new vector is made from; a graph that states
    65,536 and makes 10 would otherwise add a 65,536-d vector that no migration can fill.

    Raises:
        EncoderError: an output has another size, or the graph cannot run on an image.
    """
    try:
        model.run_pixels(model.blank(1))
    except EncoderError as exc:
        raise EncoderError(f"{exc}; nothing was written") from exc


def _add_new_vector(store: Store, old: CollectionSpec, name: str | None, dim: int) -> None:
    if not name:
        raise ConfigError(
            f"the single-collection layout needs --new-vector NAME: the name the new model's vectors "
            f"get in {old.name!r}"
        )
    if name == old.vector or name in old.sparse:
        raise ConfigError(
            f"collection {old.name!r} already has a vector {name!r}: choose another --new-vector"
        )
    if name in old.vectors:  # what a crashed 'init' leaves: an empty vector of the right shape
        spec = store.collection(old.name, name)
        if (spec.dim, spec.distance) != (dim, old.distance) or store.count(
            old.name, Where(has_vector=(name,))
        ):
            raise ConfigError(
                f"collection {old.name!r} already has a vector {name!r}: choose another --new-vector"
            )
        return
    store.add_vector(old.name, name, dim=dim, distance=old.distance)


def _cannot_merge(spec: CollectionSpec) -> str:
    return (
        f"vector {spec.vector!r} of {spec.name!r} is a multivector (late interaction): rm-qdrant "
        "merges single-vector searches"
    )


def plain_model_ref(model: OnnxEncoder, pair: str, *, dim: int, distance: str) -> ModelRef:
    """The plain new model (no ψ/ρ heads) as pair ``pair`` records it, once it runs and makes
    vectors of the pair's new size (``dim``) for its ``distance``.

    Raises:
        DimensionMismatch: its gallery output is another size.
        ConfigError: it is an rm graph (it has ψ), or is made for another distance.
        EncoderError: it does not run, or its outputs are not the sizes its metadata says.
    """
    if "rm" in model.info.query_modes:
        raise ConfigError(
            f"--new-model {model.path} has a 'rev' output (ψ): the plain new model is the new model "
            "without ψ/ρ heads"
        )
    output = model.info.gallery_output()
    if model.info.outputs[output] != dim:
        raise DimensionMismatch(
            f"--new-model {model.path} makes {model.info.outputs[output]}-d vectors, pair {pair!r} "
            f"stores {dim}-d new vectors: it is not the plain new model of this pair"
        )
    if not model.info.serves(distance):
        raise ConfigError(
            f"--new-model {model.path} is made for {model.info.distance} distance, pair {pair!r} "
            f"uses {distance}"
        )
    check_output_sizes(model)
    return ModelRef.of(model, output)


def old_model_ref(store: Store, old: CollectionSpec, encoder: OnnxEncoder) -> ModelRef:
    """The old model as a pair records it, once it fits the old collection: its size, its
    distance, and the model recorded for it (if rm-qdrant filled it).

    Raises:
        DimensionMismatch, ConfigError: it does not fit.
    """
    output = encoder.info.gallery_output()
    _check_fits(old, encoder.info.outputs[output], str(encoder.path))
    _check_distance(old, encoder)
    check_collection_model(store, old.name, encoder)
    return ModelRef.of(encoder, output)


def _check_distance(old: CollectionSpec, model: OnnxEncoder) -> None:
    """A graph stamped with a distance promises it; one stamped without serves any collection."""
    if not model.info.serves(old.distance):
        raise ConfigError(
            f"{model.path} is made for {model.info.distance} distance, "
            f"collection {old.name!r} uses {old.distance} (a graph stamped without --distance "
            "serves any)"
        )


def _check_fits(old: CollectionSpec, dim: int, by: str) -> None:
    if dim != old.dim:
        named = f" (vector {old.vector!r})" if old.vector else ""
        raise DimensionMismatch(
            f"collection {old.name!r}{named} holds {old.dim}-d vectors but {by} makes {dim}-d queries"
        )


def _prepare_new_collection(store: Store, name: str, *, dim: int, old: CollectionSpec) -> None:
    # An empty collection of the right shape is what a crashed 'init' leaves: reuse it.
    if not store.has_collection(name):
        store.create_collection(name, dim=dim, distance=old.distance, vector=old.vector, others=old.extra)
    else:
        try:
            spec = store.collection(name, old.vector)
            shape = (spec.dim, spec.distance, set(spec.extra))
        except ConfigError:  # it has no vector of that name
            shape = None
        if shape != (dim, old.distance, set(old.extra)) or store.count(name):
            also = f" with the other vectors of {old.name!r}" if old.extra else ""
            raise ConfigError(
                f"collection {name!r} already exists and is not an empty {dim}-d {old.distance} "
                f"collection{also}"
            )
    # The team's indexes with their settings: a text index's case or tokenizer decides what a
    # filter matches, and would differ between the two collections with defaults.
    kinds = {f: kind for f, kind in store.payload_indexes(old.name).items() if f not in INTERNAL_FIELDS}
    store.copy_indexes(old.name, name, list(kinds))
