"""The pair record: which two collections serve together, with which models.

Records live in Qdrant itself, in a small collection (``rmq_meta``) whose points
carry the record as payload, so every process that opens the store sees the same
configuration. The same collection remembers which model filled a collection that
``rmq index`` created.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import numpy as np

from rm_qdrant.core.calibration import Calibration
from rm_qdrant.core.inputspec import DECODES, DEFAULT_DECODE
from rm_qdrant.core.modelinfo import items_of
from rm_qdrant.core.planning import INTERNAL_FIELDS
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import CollectionNotFound, ConfigError, MigrationError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.models.text import load_encoder
from rm_qdrant.store import Store, Where

META_COLLECTION = "rmq_meta"
_NAMESPACE = uuid.UUID("5b0e6a52-8c1f-4a8e-9a43-0f1d2e3c4b5a")
Mode = Literal["rm", "naive"]
#: The two layouts of a pair: two collections, or one collection with a second named vector.
PAIRED, SINGLE = "paired", "single-collection"
LAYOUTS = (PAIRED, SINGLE)


@dataclass(frozen=True)
class ModelRef:
    """A model as a record remembers it: name, graph fingerprint, dimension, file path, and what
    it reads (``image`` or ``text``, with a text model's tokenizer hash).

    Records written before ``modality`` existed read ``image``; an image model's record leaves
    the two facts out, so a record reads the same to an rm-qdrant that predates them.
    """

    name: str
    fingerprint: str
    dim: int
    path: str
    modality: str = "image"
    #: A text model's ``tokenizer_sha256``; "" for an image model.
    tokenizer: str = ""

    @classmethod
    def of(cls, encoder: OnnxEncoder, output: str) -> ModelRef:
        info = encoder.info
        tokenizer = str(getattr(info.input, "tokenizer_sha256", ""))
        path = str(encoder.path.resolve())
        return cls(info.name, encoder.fingerprint, info.outputs[output], path, info.modality, tokenizer)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelRef:
        """A reference as :meth:`to_dict` wrote it (facts a newer rm-qdrant added are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        """The reference as a record stores it; an image model's without ``modality`` and ``tokenizer``."""
        raw = asdict(self)
        if self.modality == "image" and not self.tokenizer:
            del raw["modality"], raw["tokenizer"]
        return raw

    def another_kind(self, encoder: OnnxEncoder) -> str | None:
        """How ``encoder`` differs from this model in what it reads: another modality, another
        tokenizer; None where it reads what this model read."""
        info = encoder.info
        if info.modality != self.modality:
            return f"it reads {info.items}, {self.name} reads {items_of(self.modality)}"
        theirs = str(getattr(info.input, "tokenizer_sha256", ""))
        if self.tokenizer and theirs != self.tokenizer:
            return f"another tokenizer: {theirs}, {self.name}'s is {self.tokenizer}"
        return None


@dataclass(frozen=True)
class PairRecord:
    """Two collections served as one.

    Attributes:
        name: The pair's name, as ``rmq --name`` takes it.
        old_collection: Holds the gallery as the old model embedded it.
        new_collection: Receives the gallery as the new model embeds it.
        mode: ``rm`` (one graph with ``new`` and ``rev`` outputs) or ``naive``
            (the old model queries old, the new model queries new).
        distance: The distance of both collections.
        encoder: The graph that makes new-collection vectors (and, in ``rm``
            mode, old-collection queries).
        old_encoder: The old model, for the ``naive`` mode (optional in ``rm``).
        new_model: The plain new model (no ψ/ρ heads) an ``rm`` pair's graph was trained from:
            New for ``rmq eval``'s Gain and ``rmq probe``'s naive curve (``rmq init --new-model``,
            or the graph a naive pair served before ``rmq switch-encoder`` moved it to ψ). None:
            not recorded (a naive pair's own encoder is its plain new model).
        state: ``backfilling``, then ``finalized`` (new serves alone) or
            ``rolled_back`` (old serves alone; keep-old pairs only). ``finalizing``
            while a cutover is under way (new serves alone; ``rmq finalize`` completes it).
        keep_old: migrated points stay in old, marked and hidden from search, so
            the pair can roll back to the old model at once.
        order: the backfill order the old points are ranked by (None: not yet).
        order_seed: the seed of that order.
        order_ready: False while the ranks of ``order`` are being written (a run
            killed then left ranks of two orders; the next run ranks again).
        alias: the alias that serves the gallery after a cutover or rollback.
        drop_old: the cutover under way drops the old collection.
        vector: the vector name in both collections (``""``: one unnamed vector).
        uri_field: the payload field that holds each point's image URI.
        uri_template: or a template that builds it from payload fields (see :mod:`rm_qdrant.core.uris`).
        label_field: the payload field with class labels, where the gallery has them.
        calibration: the calibrated naive merge's map of old distances (``rmq calibrate``;
            :class:`~rm_qdrant.core.calibration.Calibration` as a dict), or None.
        layout: ``paired`` (two collections), or ``single-collection``: one collection
            (``old_collection`` and ``new_collection`` are the same) where migrating a point
            adds its ``new_vector``; ``vector`` is the old model's.
        new_vector: the new model's vector name in the single-collection layout.
        source: the source settings ``rmq init`` was given (``--root``, ``--timeout``, ...,
            keyed by SourceConfig field; see :mod:`rm_qdrant.sources.settings`), which every
            command reading the pair's images uses; None: the defaults.
        decode: how every command decodes the pair's images, ``exact`` (the team pipeline's
            pixels to the bit) or ``fast`` (JPEGs at a reduced DCT scale; see
            :func:`rm_qdrant.models.images.pixels`). Set by ``rmq init --decode``, changed only by
            ``rmq switch-encoder --decode``; a record written before it existed reads ``exact``.
        text_field: a text pair's payload field holding each document's text (``rmq init
            --text-field``); None: documents (or images) are fetched by ``uri_field``/``uri_template``.
        rerank: the re-rank every search of the pair makes unless it says otherwise (``rmq init
            --rerank K``, ``rmq switch-encoder --rerank K``): :meth:`Rerank.to_dict
            <rm_qdrant.core.rerank.Rerank.to_dict>`'s fields; None: no re-rank.
    """

    name: str
    old_collection: str
    new_collection: str
    mode: Mode
    distance: str
    encoder: ModelRef
    old_encoder: ModelRef | None = None
    new_model: ModelRef | None = None
    state: str = "backfilling"
    keep_old: bool = False
    order: str | None = None
    order_seed: int = 0
    order_ready: bool = True
    alias: str | None = None
    drop_old: bool = False
    vector: str = ""
    uri_field: str = "uri"
    uri_template: str | None = None
    label_field: str = "label"
    calibration: dict[str, list[float]] | None = None
    layout: str = PAIRED
    new_vector: str | None = None
    source: dict[str, Any] | None = None
    decode: str = DEFAULT_DECODE
    text_field: str | None = None
    rerank: dict[str, Any] | None = None

    @property
    def single(self) -> bool:
        """Whether the pair is one collection with the new model as a second named vector
        (code acts on a pair through its layout object: :func:`rm_qdrant.pair.layouts.layout_of`)."""
        return self.layout == SINGLE

    @property
    def new_using(self) -> str:
        """The vector name new-model vectors are stored under."""
        return self.new_vector if self.single and self.new_vector is not None else self.vector

    @property
    def old_distance(self) -> Calibration | None:
        """The map the merge applies to old distances: a calibrated naive pair's, while it merges."""
        if self.calibration is None or self.mode != "naive" or self.state != "backfilling":
            return None
        return Calibration.from_dict(self.calibration)

    @property
    def uri_rule(self) -> UriRule:
        """How this pair finds a point's image (or text) in its payload."""
        if self.text_field is not None:
            return UriRule(self.text_field, inline=True)
        return UriRule(self.uri_field, self.uri_template)

    @property
    def serves_old(self) -> bool:
        """Whether search reads the old collection (not once a cutover has begun)."""
        return self.state in ("backfilling", "rolled_back")

    @property
    def serves_new(self) -> bool:
        """Whether search reads the new collection (not after a rollback)."""
        return self.state != "rolled_back"

    def to_payload(self) -> dict[str, Any]:
        record = asdict(self)
        for model in ("encoder", "old_encoder", "new_model"):
            ref = getattr(self, model)
            record[model] = None if ref is None else ref.to_dict()
        return {"kind": "pair", "name": self.name, "record": record}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> PairRecord:
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in payload["record"].items() if k in known}
        raw["encoder"] = ModelRef.from_dict(raw["encoder"])
        for model in ("old_encoder", "new_model"):  # optional: absent from records written before it
            if raw.get(model):
                raw[model] = ModelRef.from_dict(raw[model])
        # Absent from records written before it: exact. A mode this rm-qdrant does not know is
        # refused where images are decoded (open_encoder), not here: `rmq pairs`, `drop-pair` and
        # `switch-encoder --decode` still reach the pair to list, remove or repair it.
        raw.setdefault("decode", DEFAULT_DECODE)
        return cls(**raw)


def open_encoder(
    given: OnnxEncoder | str | None, ref: ModelRef, pair: str, role: str, *, decode: str
) -> OnnxEncoder:
    """``given`` (a graph or its path; default: the one ``ref`` recorded), if it is the model ``ref``
    says ``pair`` was created with, decoding images as ``decode`` says (the pair's recorded mode).

    An encoder given that decodes otherwise is not changed: a copy that shares its ONNX Runtime
    session decodes the pair's way (:meth:`~rm_qdrant.models.encoder.PixelDecoder.decoding_as`)."""
    if decode not in DECODES:
        raise ConfigError(
            f"pair {pair!r} records decode {decode!r}, which this rm-qdrant does not know (expected one "
            f"of {', '.join(DECODES)}): a newer rm-qdrant wrote it, or the record was edited; "
            f"'rmq switch-encoder --name {pair} --decode exact' records a known one"
        )
    encoder = given if isinstance(given, OnnxEncoder) else load_encoder(given or ref.path, decode=decode)
    if encoder.fingerprint != ref.fingerprint:
        other = ref.another_kind(encoder)
        raise ConfigError(
            f"{role} {encoder.path} (fingerprint {encoder.fingerprint}) is not the model pair "
            f"{pair!r} was created with ({ref.name}, fingerprint {ref.fingerprint})"
            + (f"; {other}" if other else "")
        )
    return encoder.decoding_as(decode)


def _key(kind: str, name: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{kind}:{name}"))


def _ensure_meta(store: Store) -> None:
    if not store.has_collection(META_COLLECTION):
        store.create_collection(META_COLLECTION, dim=1, distance="dot")


def _put(store: Store, kind: str, name: str, payload: dict[str, Any]) -> None:
    _ensure_meta(store)
    vector = np.ones((1, 1), dtype=np.float32)
    store.upsert(META_COLLECTION, [_key(kind, name)], vector, [payload])


def _get(store: Store, kind: str, name: str) -> dict[str, Any] | None:
    if not store.has_collection(META_COLLECTION):
        return None
    found = store.retrieve(META_COLLECTION, [_key(kind, name)])
    return found[0].payload if found else None


def save_pair(store: Store, record: PairRecord) -> None:
    """Write (or overwrite) a pair record."""
    _put(store, "pair", record.name, record.to_payload())


def save_unless_changed(store: Store, read: PairRecord, updated: PairRecord, command: str) -> None:
    """Write ``updated``, made from ``read``, unless the stored record is no longer ``read``.

    A command that reads the record, works a while (counts, checks, embeds a sample), then
    writes its change would otherwise undo what another command recorded meanwhile
    (``rmq switch-encoder --decode`` during a ``finalize``). The records carry no version, so
    this narrows the window to one read and one write; it does not close it.

    Raises:
        MigrationError: the record changed (the fields are named); nothing was written.
    """
    check_unchanged(store, read, command)
    save_pair(store, updated)


def check_unchanged(store: Store, read: PairRecord, command: str) -> None:
    """Raise :class:`MigrationError` naming the fields if the stored record is no longer ``read``
    (see :func:`save_unless_changed`)."""
    current = load_pair(store, read.name)
    if current != read:
        changed = [f.name for f in fields(PairRecord) if getattr(current, f.name) != getattr(read, f.name)]
        raise MigrationError(
            f"pair {read.name!r} changed while {command} ran ({', '.join(changed)}); nothing was "
            f"recorded: run {command} again"
        )


def load_pair(store: Store, name: str) -> PairRecord:
    """Read a pair record.

    Raises:
        CollectionNotFound: no pair of that name exists in this store.
    """
    payload = _get(store, "pair", name)
    if payload is None:
        raise CollectionNotFound(f"no pair named {name!r} in this store; create it with 'rmq init'")
    return PairRecord.from_payload(payload)


def record_collection_model(store: Store, collection: str, model: ModelRef) -> None:
    """Remember which model made a collection's vectors."""
    _put(
        store, "collection", collection, {"kind": "collection", "name": collection, "model": model.to_dict()}
    )


def collection_model(store: Store, collection: str) -> ModelRef | None:
    """The model recorded for a collection, or None if rm-qdrant did not fill it."""
    payload = _get(store, "collection", collection)
    return ModelRef.from_dict(payload["model"]) if payload else None


def check_collection_model(store: Store, collection: str, encoder: OnnxEncoder) -> None:
    """Refuse to mix spaces: ``encoder`` must be the model recorded for ``collection``, if any.

    Raises:
        ConfigError: the collection's vectors were made by another model.
    """
    recorded = collection_model(store, collection)
    if recorded is not None and recorded.fingerprint != encoder.fingerprint:
        raise ConfigError(
            f"collection {collection!r} holds vectors of model {recorded.name} "
            f"(fingerprint {recorded.fingerprint}); {encoder.path} is {encoder.info.name} "
            f"(fingerprint {encoder.fingerprint})"
        )


def list_pairs(store: Store) -> list[PairRecord]:
    """Every pair recorded in this store, by name."""
    if not store.has_collection(META_COLLECTION):
        return []
    page, _ = store.scroll(META_COLLECTION, limit=100_000, where=Where(must={"kind": "pair"}))
    return sorted((PairRecord.from_payload(r.payload) for r in page), key=lambda p: p.name)


def clear_bookkeeping(store: Store, pair: PairRecord) -> None:
    """Remove rm-qdrant's ``rmq_*`` payload fields from both collections (idempotent)."""
    for collection in dict.fromkeys((pair.old_collection, pair.new_collection)):  # one, in one collection
        if store.has_collection(collection):
            store.clear_fields(collection, INTERNAL_FIELDS)
