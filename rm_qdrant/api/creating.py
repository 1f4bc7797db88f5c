"""Setting a pair up: :func:`index` (``rmq index``) fills a collection from an image folder,
:func:`init` (``rmq init``) creates the new half and the pair record."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rm_qdrant.api.common import Counted, OnStep, as_encoder, check_callback, image_items
from rm_qdrant.api.linked import linked_at_init
from rm_qdrant.core.inputspec import DEFAULT_DECODE, check_decode
from rm_qdrant.core.rerank import Rerank
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.create import create_pair
from rm_qdrant.operations.indexing import ImageItem, index_images
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PAIRED, SINGLE, PairRecord, load_pair
from rm_qdrant.sources import SourceConfig
from rm_qdrant.sources.settings import OPTIONS, from_settings
from rm_qdrant.store import Store

Model = str | os.PathLike[str] | OnnxEncoder


@dataclass(frozen=True)
class IndexSummary:
    """What :func:`index` wrote (``rmq index --json`` is :meth:`as_dict`).

    Attributes:
        collection: the collection filled.
        indexed: points written.
        failed: images skipped, as (URI, reason).
    """

    collection: str
    indexed: int
    failed: list[tuple[str, str]]

    def as_dict(self) -> dict[str, Any]:
        return {"collection": self.collection, "indexed": self.indexed, "failed": self.failed}


def index(
    store: Store,
    data: str | os.PathLike[str] | Sequence[ImageItem],
    *,
    encoder: Model,
    name: str | None = None,
    collection: str | None = None,
    batch: int = 256,
    on_step: OnStep | None = None,
) -> IndexSummary:
    """Embed an image folder with ``encoder`` into a collection: ``rmq index``.

    This is how a deployment that predates rm-qdrant is reproduced (the old model filling the
    old collection). Give exactly one of ``collection`` (created if missing) and ``name``, a
    pair whose old collection is filled (a paired pair: only before its new collection holds
    points). An image that cannot be read is skipped and reported. Into a pair, images are
    decoded as the pair records (``exact`` or ``fast``); into a collection, as ``encoder``
    decodes (an :class:`OnnxEncoder` loaded from a path: ``exact``).

    Args:
        data: the folder (``DATA/<label>/<image>``), or the images as :class:`ImageItem`.
        encoder: the model that fills the collection (a path or a loaded :class:`OnnxEncoder`).
        name: index into this pair's old collection.
        collection: index into this collection.
        batch: images per batch.
        on_step: told of each batch written (:class:`Step`).

    Raises:
        ConfigError: both or neither of ``name`` and ``collection``; a pair whose new half
            already holds points; no images in the folder.
        CollectionNotFound: no pair of that name.
        EncoderError: the model cannot be read.

    Example:
        >>> rm_qdrant.index(store, "images/", encoder="old.onnx", collection="photos")  # doctest: +SKIP
        IndexSummary(collection='photos', indexed=1797, failed=[])
    """
    if (name is None) == (collection is None):
        raise ConfigError("give exactly one of --name and --collection")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch is a whole number >= 1, got {batch!r}")
    check_callback(on_step, "on_step", "one Step")
    pair = None if collection else load_pair(store, name or "")
    if pair is not None:
        _check_index_into_old(store, pair)
    target = collection if pair is None else pair.old_collection
    vector = None if pair is None else layout_of(pair).index_vector
    items = image_items(data)
    model = as_encoder(encoder)
    if pair is not None:  # the pair's images, decoded as it records
        model = model.decoding_as(pair.decode)
    with Counted(on_step, f"indexing into {target}", "images") as step:
        step.start(len(items))
        report = index_images(
            store, target or "", model, items, batch_size=batch, on_batch=step.advance, vector=vector
        )
    return IndexSummary(target or "", report.indexed, report.failed)


def _check_index_into_old(store: Store, pair: PairRecord) -> None:
    """Refuse to write the old model's points into a paired layout's old collection once new
    holds points: a point in both would serve twice (in one collection, a rewritten point just
    loses its new vector and migrates again)."""
    if layout_of(pair).one_query:
        return
    moved = store.count(pair.new_collection) if store.has_collection(pair.new_collection) else 0
    if pair.state != "backfilling" or moved:
        raise ConfigError(
            f"pair {pair.name!r} is {pair.state} with {moved} points in {pair.new_collection!r}: indexing "
            f"into its old collection now would serve points twice; add images through the pair "
            "(DualIndex.upsert, the new model), or index into a collection of its own (--collection)"
        )


@dataclass(frozen=True)
class InitReport:
    """The pair :func:`init` created (``rmq init --json`` is :meth:`as_dict`, the record).

    Attributes:
        pair: the pair record, as later calls read it.
        note: where a team's shard adopted into the embedded store through a symbolic link
            ends up once migrated ("" for any other old collection).
    """

    pair: PairRecord
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self.pair)


def init(
    store: Store,
    name: str,
    *,
    encoder: Model,
    old_collection: str | None = None,
    collection: str | None = None,
    old_vector: str | None = None,
    new_vector: str | None = None,
    old_encoder: Model | None = None,
    new_model: Model | None = None,
    new_collection: str | None = None,
    mode: str | None = None,
    query_mode: str | None = None,
    keep_old: bool = False,
    uri_field: str | None = None,
    uri_template: str | None = None,
    text_field: str | None = None,
    label_field: str = "label",
    full_scan_kb: int | None = None,
    source: Mapping[str, Any] | None = None,
    decode: str = DEFAULT_DECODE,
    rerank: Rerank | int | None = None,
) -> InitReport:
    """Create the new collection (mirroring the old one's schema), or the new vector of a single
    collection, and the pair record: ``rmq init``.

    Args:
        name: the pair's name.
        encoder: the new model's graph (a path or a loaded :class:`OnnxEncoder`).
        old_collection: a paired pair's old collection, as the old model filled it.
        collection: a single-collection pair's collection (``mode="single-collection"``).
        old_vector: the old collection's vector name, where it has named vectors.
        new_vector: a single-collection pair's name for the new model's vector.
        old_encoder: the old model: the naive mode's, and what a rollback serves.
        new_model: the plain new model (no ψ/ρ) an rm graph was trained from.
        new_collection: the new collection's name (default ``NAME-new``).
        mode: the layout, ``paired`` (default) or ``single-collection``; ``rm`` and ``naive``
            are paired with that query mode.
        query_mode: ``rm`` or ``naive`` (default: rm where the encoder has a ``rev`` output).
        keep_old: keep migrated points in old (hidden) so :func:`rollback` works (needs
            ``old_encoder``).
        uri_field: payload field with each image's URI (default ``uri``; ``asset.url``: nested).
        uri_template: or the URI built from payload fields, e.g. ``s3://bucket/{sku}.jpg``.
        text_field: a text pair's payload field that holds each document's text itself
            (``body``, ``doc.text``: nested); without it a text pair's documents are read from
            ``uri_field`` / ``uri_template`` under the source rules.
        label_field: payload field with class labels.
        full_scan_kb: the searched vectors' HNSW ``full_scan_threshold`` (KB).
        source: image-source settings to record, by :class:`SourceConfig` field (``root``,
            ``schemes``, ``timeout``, ``max_pixels``, ``allow_private``, ``headers``), as plain
            data: every later call that reads the pair's images uses them unless given another.
        decode: how every later call decodes the pair's images: ``exact`` (the default: the
            team pipeline's pixels to the bit) or ``fast`` (JPEGs at a reduced DCT scale, nearly the
            same pixels for much less work). Recorded; only :func:`switch_encoder` changes it.
        rerank: the re-rank every search makes by default (K, or a :class:`Rerank`); None: none.
            :func:`set_rerank` changes it.

    Raises:
        ConfigError: options that do not fit together, a model that does not fit the collection.
        CollectionNotFound: the old collection does not exist.
        EncoderError: a model cannot be read.

    Example:
        >>> rm_qdrant.init(store, "photos", old_collection="photos", encoder="rm.onnx")  # doctest: +SKIP
    """
    if uri_template is not None and uri_field is not None:
        raise ConfigError("give --uri-field or --uri-template, not both")
    if text_field is not None and (uri_field is not None or uri_template is not None):
        raise ConfigError("give --text-field, or --uri-field/--uri-template, not both")
    check_decode(decode)
    layout, query_mode = _layout(mode, query_mode)
    if layout == SINGLE:
        if (collection is None) == (old_collection is None):
            raise ConfigError("--mode single-collection takes the collection as --collection C")
        if new_vector is None:
            raise ConfigError("--mode single-collection needs --new-vector NAME (the new model's vector)")
    elif collection is not None or new_vector is not None or old_collection is None:
        raise ConfigError(
            "a paired pair takes --old-collection (and --new-collection); --collection and --new-vector "
            "are for --mode single-collection"
        )
    settings = _source_settings(source)
    record = create_pair(
        store,
        name,
        old_collection=collection or old_collection or "",
        encoder=as_encoder(encoder),
        old_encoder=as_encoder(old_encoder) if old_encoder is not None else None,
        new_model=as_encoder(new_model) if new_model is not None else None,
        new_collection=new_collection,
        mode=query_mode,  # type: ignore[arg-type]
        keep_old=keep_old,
        old_vector=old_vector,
        uri=UriRule(text_field, inline=True) if text_field else UriRule(uri_field or "uri", uri_template),
        label_field=label_field,
        layout=layout,
        new_vector=new_vector,
        source=settings,
        full_scan_kb=full_scan_kb,
        decode=decode,
        rerank=rerank,
    )
    return InitReport(record, linked_at_init(store, record))


def _source_settings(source: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings to record, checked as a :class:`SourceConfig` would take them."""
    settings = dict(source or {})
    unknown = sorted(set(settings) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown source setting(s) {', '.join(map(repr, unknown))}: a pair records {', '.join(OPTIONS)}"
        )
    SourceConfig(**from_settings(settings))
    return settings


def _layout(mode: str | None, query_mode: str | None) -> tuple[str, str | None]:
    """``mode`` names the layout, or (as before layouts existed) a paired pair's query mode."""
    if mode not in (None, PAIRED, SINGLE, "rm", "naive"):
        raise ConfigError(f"mode is {PAIRED!r}, {SINGLE!r}, 'rm' or 'naive', not {mode!r}")
    if query_mode not in (None, "rm", "naive"):
        raise ConfigError(f"query_mode is 'rm' or 'naive', not {query_mode!r}")
    if mode in ("rm", "naive"):
        if query_mode not in (None, mode):
            raise ConfigError(f"--mode {mode} and --query-mode {query_mode} disagree")
        return PAIRED, mode
    return mode or PAIRED, query_mode
