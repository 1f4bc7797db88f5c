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
from rm_qdrant.core.planning import INTERNAL_FIELDS, MIGRATED
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import CollectionNotFound, ConfigError, DimensionMismatch
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.store import CollectionSpec, Store, Where
from rm_qdrant.store.base import resolve

META_COLLECTION = "rmq_meta"
_NAMESPACE = uuid.UUID("5b0e6a52-8c1f-4a8e-9a43-0f1d2e3c4b5a")
Mode = Literal["rm", "naive"]


@dataclass(frozen=True)
class ModelRef:
    """A model as a record remembers it: name, graph fingerprint, dimension, file path."""

    name: str
    fingerprint: str
    dim: int
    path: str

    @classmethod
    def of(cls, encoder: OnnxEncoder, output: str) -> ModelRef:
        return cls(
            encoder.info.name, encoder.fingerprint, encoder.info.outputs[output], str(encoder.path.resolve())
        )


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
    """

    name: str
    old_collection: str
    new_collection: str
    mode: Mode
    distance: str
    encoder: ModelRef
    old_encoder: ModelRef | None = None
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

    @property
    def old_distance(self) -> Calibration | None:
        """The map the merge applies to old distances: a calibrated naive pair's, while it merges."""
        if self.calibration is None or self.mode != "naive" or self.state != "backfilling":
            return None
        return Calibration.from_dict(self.calibration)

    @property
    def uri_rule(self) -> UriRule:
        """How this pair finds a point's image in its payload."""
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
        return {"kind": "pair", "name": self.name, "record": asdict(self)}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> PairRecord:
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in payload["record"].items() if k in known}
        raw["encoder"] = ModelRef(**raw["encoder"])
        if raw.get("old_encoder"):
            raw["old_encoder"] = ModelRef(**raw["old_encoder"])
        return cls(**raw)


def active_where(pair: PairRecord) -> Where:
    """The old points that still serve from old (keep-old mode hides migrated ones)."""
    return Where(must_not={MIGRATED: 1}) if pair.keep_old else Where()


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
    _put(store, "collection", collection, {"kind": "collection", "name": collection, "model": asdict(model)})


def collection_model(store: Store, collection: str) -> ModelRef | None:
    """The model recorded for a collection, or None if rm-qdrant did not fill it."""
    payload = _get(store, "collection", collection)
    return ModelRef(**payload["model"]) if payload else None


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
    new_collection: str | None = None,
    mode: Mode | None = None,
    keep_old: bool = False,
    old_vector: str | None = None,
    uri: UriRule | None = None,
    label_field: str = "label",
) -> PairRecord:
    """Create the new collection and the pair record (what ``rmq init`` does).

    The new collection mirrors the old one: the same vector name and distance, and
    the same payload indexes. The mode defaults to ``rm`` when ``encoder`` has a
    ``rev`` output, else ``naive``, which needs ``old_encoder``. Every check runs
    before anything is written.

    Args:
        old_vector: the old collection's vector (None: its only one).
        uri: where each point's image is (default: payload field ``uri``).
        label_field: the payload field with class labels, if the gallery has them.

    Raises:
        CollectionNotFound: the old collection does not exist.
        DimensionMismatch: a query vector would not fit the collection it searches.
        ConfigError: the pair exists, the old collection belongs to another pair, the
            distances differ, or the mode lacks a model.
    """
    if _get(store, "pair", name) is not None:
        raise ConfigError(f"pair {name!r} already exists")
    chosen: Mode = mode or ("rm" if "rm" in encoder.info.query_modes else "naive")
    if chosen == "rm" and "rm" not in encoder.info.query_modes:
        raise ConfigError(
            f"encoder {encoder.path} has no 'new' and 'rev' outputs; use --old-encoder (naive mode)"
        )
    old_collection = resolve(store, old_collection)  # an alias (a finalized upgrade's name): its collection
    old_spec = store.collection(old_collection, old_vector)
    if old_spec.others() or old_spec.multivector:
        raise ConfigError(_cannot_carry(old_spec))
    if chosen == "naive" and old_encoder is None:
        raise ConfigError(f"encoder {encoder.path} has no 'rev' output: the naive mode needs --old-encoder")
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
    target = new_collection or f"{name}-new"
    _check_free(store, old_collection)
    _check_free(store, target)
    _prepare_new_collection(store, target, dim=encoder.info.outputs[gallery], old=old_spec)
    record = PairRecord(
        name=name,
        old_collection=old_collection,
        new_collection=target,
        mode=chosen,
        distance=old_spec.distance,
        encoder=ModelRef.of(encoder, gallery),
        old_encoder=old_ref,
        keep_old=keep_old,
        vector=old_spec.vector,
        uri_field=(uri or UriRule()).field,
        uri_template=(uri or UriRule()).template,
        label_field=label_field,
    )
    save_pair(store, record)
    record_collection_model(store, target, record.encoder)
    return record


def _cannot_carry(spec: CollectionSpec) -> str:
    if spec.multivector:
        return (
            f"vector {spec.vector!r} of {spec.name!r} is a multivector (late interaction): rm-qdrant "
            "merges single-vector searches"
        )
    return (
        f"collection {spec.name!r} also has the vector(s) {', '.join(spec.others())}: a pair migrates one "
        f"vector ({spec.vector!r}), so its new collection would lack the others and a migrated point would "
        "lose them; such collections are not supported yet"
    )


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
    if model.info.distance != old.distance:
        raise ConfigError(
            f"{model.path} is made for {model.info.distance} distance, "
            f"collection {old.name!r} uses {old.distance}"
        )


def clear_bookkeeping(store: Store, pair: PairRecord) -> None:
    """Remove rm-qdrant's ``rmq_*`` payload fields from both collections (idempotent)."""
    for collection in (pair.old_collection, pair.new_collection):
        if store.has_collection(collection):
            store.clear_fields(collection, INTERNAL_FIELDS)


def _check_fits(old: CollectionSpec, dim: int, by: str) -> None:
    if dim != old.dim:
        named = f" (vector {old.vector!r})" if old.vector else ""
        raise DimensionMismatch(
            f"collection {old.name!r}{named} holds {old.dim}-d vectors but {by} makes {dim}-d queries"
        )


def _prepare_new_collection(store: Store, name: str, *, dim: int, old: CollectionSpec) -> None:
    # An empty collection of the right shape is what a crashed 'init' leaves: reuse it.
    if not store.has_collection(name):
        store.create_collection(name, dim=dim, distance=old.distance, vector=old.vector)
    else:
        spec = store.collection(name)
        if (spec.dim, spec.distance, spec.vector) != (dim, old.distance, old.vector) or store.count(name):
            raise ConfigError(
                f"collection {name!r} already exists and is not an empty {dim}-d {old.distance} collection"
            )
    for field_name, kind in store.payload_indexes(old.name).items():
        if field_name not in INTERNAL_FIELDS:
            store.create_index(name, field_name, kind)


@dataclass(frozen=True)
class Dropped:
    """What ``rmq drop-pair`` did."""

    pair: PairRecord
    deleted_new: bool  # the new collection was empty and rm-qdrant's own, so it went too


def drop_pair(store: Store, name: str, *, force: bool = False) -> Dropped:
    """Forget a pair. Never deletes the old collection; deletes the new one only when empty.

    rm-qdrant's own payload fields (``rmq_*``: ranks, failure reasons, copy marks) are
    removed from both collections, which are left as the team's own code expects them.

    Raises:
        CollectionNotFound: no such pair.
        ConfigError: the pair is mid-backfill and points live only in its new collection
            (without ``force``): dropping it would stop serving them through the pair.
    """
    pair = load_pair(store, name)
    has_new = store.has_collection(pair.new_collection)
    in_new = store.count(pair.new_collection) if has_new else 0
    kept = store.count(pair.old_collection, Where(must={MIGRATED: 1})) if pair.keep_old and in_new else 0
    only_in_new = in_new - kept  # keep-old: migrated points are still in old; a user's writes are not
    if pair.state in ("backfilling", "finalizing") and only_in_new > 0 and not force:
        raise ConfigError(
            f"pair {name!r} is {pair.state} and {only_in_new} points live in {pair.new_collection!r} only: "
            "finish it (rmq migrate, rmq finalize) first, or --force to drop the record "
            "(both collections stay)"
        )
    store.delete(META_COLLECTION, [_key("pair", name)])
    clear_bookkeeping(store, pair)
    deleted = has_new and in_new == 0 and pair.state != "finalized"
    if deleted:
        store.delete_collection(pair.new_collection)
        store.delete(META_COLLECTION, [_key("collection", pair.new_collection)])
    return Dropped(pair, deleted)
