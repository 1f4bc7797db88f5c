"""Ending a backfill: cut over to the new collection, or roll back to the old one."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.modelinfo import items_of
from rm_qdrant.errors import ConfigError, MigrationError, RmqError
from rm_qdrant.migration.gate import Gate
from rm_qdrant.migration.migrate import MigrateOptions, Migrator
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.create import old_model_ref
from rm_qdrant.pair.layouts import active_where, layout_of
from rm_qdrant.pair.layouts.base import check_alias
from rm_qdrant.pair.record import (
    ModelRef,
    PairRecord,
    check_unchanged,
    clear_bookkeeping,
    open_encoder,
    save_pair,
)
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store
from rm_qdrant.store.points import every_id

log = logging.getLogger(__name__)


def finalize(
    store: Store,
    pair: PairRecord,
    *,
    alias: str | None = None,
    drop_old: bool = False,
    encoder: OnnxEncoder | str | None = None,
    source: SourceConfig | None = None,
) -> PairRecord:
    """Point the serving alias at the new collection and serve from it alone.

    The cutover is recorded before it starts (state ``finalizing``: new serves
    alone from then on), so a run killed half-way is completed by running it again,
    whatever it had done: dropped the old collection, moved the alias, or neither.

    Args:
        alias: the name the application serves from (default: the pair's name).
        drop_old: delete the old collection (no rollback is possible then). If the
            alias is the old collection's own name, the collection is dropped first
            so that the application's name now serves new.
        encoder: one collection: the pair's encoder (default: the file it recorded), which
            embeds the points written without the new vector while the cutover runs, up to its
            ``finalized`` record (a last pass runs after the record; run again on a finalized
            pair, ``finalize`` embeds the points that lack the new vector).
        source: how their images are fetched.

    Raises:
        MigrationError: the pair is finalized (one collection: and no point lacks the new
            vector) or rolled back, or old still serves points (the
            message names the ways out: retry the failed ones, or drop them with
            :func:`~rm_qdrant.operations.failures.finalize_dropping_failed`),
            or (one collection) a point written meanwhile without the new vector could not
            be embedded (the pair stays ``finalizing``; a rerun completes it).
    """
    late = _Late(encoder, source or SourceConfig())
    return layout_of(pair).finalize(store, alias, drop_old, lambda now: _embed_late_writes(store, now, late))


@dataclass(frozen=True)
class _Late:
    """How a single-collection cutover embeds points written without the new vector meanwhile."""

    encoder: OnnxEncoder | str | None
    source: SourceConfig


@dataclass
class _Sweep:
    """What :class:`Migrator` works on (a :class:`DualIndex`'s parts, without its query models)."""

    store: Store
    pair: PairRecord
    encoder: OnnxEncoder


#: Passes over the points lacking the new vector (writes may keep adding some while they run).
_PASSES = 5


def _embed_late_writes(store: Store, pair: PairRecord, late: _Late) -> None:
    """Give the new vector, as a migration would, to every point that lacks it.

    Raises:
        MigrationError: some points still lack it (their image could not be read, say).
    """
    if not store.count(pair.old_collection, active_where(pair)):
        return  # the usual case: nothing written meanwhile
    try:
        encoder = open_encoder(late.encoder, pair.encoder, pair.name, "encoder", decode=pair.decode)
    except RmqError as exc:
        why = f"embedding needs the pair's encoder: {exc}"
        raise _stranded(store, pair, _lacking(store, pair), {}, why) from exc
    sweep = _Sweep(store, pair, encoder)
    options = MigrateOptions(batch=256, retry_failed=True, max_failure_share=1.0, source=late.source)
    failed: dict[PointId, str] = {}
    for _ in range(_PASSES):
        todo = [i for i in _lacking(store, pair) if i not in failed]
        if not todo:
            break
        cutover = Gate(store, pair.name, pausable=False)  # rmq pause holds the backfill, not this
        Migrator(sweep, options, finishing=True, gate=cutover).run(
            ids=todo, on_batch=lambda r: failed.update(r.failed)
        )
    left = _lacking(store, pair)
    if left:
        raise _stranded(
            store, pair, left, failed, "written meanwhile by code that writes only the old vector"
        )


def _lacking(store: Store, pair: PairRecord) -> list[PointId]:
    return every_id(store, pair.old_collection, active_where(pair))


def _stranded(
    store: Store, pair: PairRecord, left: list[PointId], failed: dict[PointId, str], why: str
) -> MigrationError:
    """The one-line refusal: how many points lack the new vector, why, and what they keep."""
    first = next((f"; first: {i}: {failed[i]}" for i in left if i in failed), "")
    old = pair.vector in store.collection(pair.old_collection, pair.new_using).vectors
    many = len(left) != 1
    kept = "payload and old vector" if old else "payload"
    return MigrationError(
        f"{len(left)} point{'s' if many else ''} of {pair.old_collection!r} {'have' if many else 'has'} "
        f"no vector {pair.new_using!r} and could not be embedded ({why}{first}); the cutover stays under "
        f"way (each point's {kept} kept): fix the cause, then run 'rmq finalize --name {pair.name}' again"
    )


def rollback(
    store: Store, pair: PairRecord, *, alias: str | None = None, old_encoder: OnnxEncoder | None = None
) -> PairRecord:
    """Serve the old model again, from the old collection alone (keep-old pairs), or from the
    old vector alone (single-collection pairs, whose new vectors stay, unserved).

    Queries are then encoded by the old model, which the pair records (``rmq init
    --old-encoder``; a pair created without it takes ``old_encoder`` here). Points
    added or updated through the new model since the backfill began are in new only,
    so they are not served until they are indexed with the old model.

    Raises:
        MigrationError: the pair did not keep old points, or its old collection is gone.
        ConfigError: no old model is recorded or given, or the one given does not fit.
    """
    layout = layout_of(pair)
    if pair.state == "rolled_back" and layout.rolls_back:  # run again: finish one cut short
        clear_bookkeeping(store, pair)
        return pair
    layout.check_rollback(alias)
    if not store.has_collection(pair.old_collection):
        raise MigrationError(f"the old collection {pair.old_collection!r} was dropped")
    model = pair.old_encoder
    if old_encoder is not None:
        model = _check_old_model(store, pair, old_encoder)
    if model is None:
        raise ConfigError(
            f"pair {pair.name!r} has no old model recorded: give it (rmq rollback --old-encoder OLD.onnx) "
            "so that queries are encoded as the old collection's vectors were"
        )
    name = layout.rollback_alias(alias)
    check_unchanged(store, pair, "rollback")  # the old model's check took a while: nothing undone
    if name is not None and store.alias(name) != pair.old_collection:  # a rerun may find it moved
        store.set_alias(check_alias(store, name), pair.old_collection)
    updated = replace(pair, state="rolled_back", alias=name, old_encoder=model)
    save_pair(store, updated)  # first: old then serves whole whatever its marks say
    clear_bookkeeping(store, updated)  # a kill before this: running rollback again finishes it
    return updated


def _check_old_model(store: Store, pair: PairRecord, encoder: OnnxEncoder) -> ModelRef:
    if encoder.info.modality != pair.encoder.modality:
        raise ConfigError(
            f"{encoder.path} reads {encoder.info.items}, pair {pair.name!r} serves "
            f"{items_of(pair.encoder.modality)}"
        )
    ref = old_model_ref(store, store.collection(pair.old_collection, pair.vector), encoder)
    if pair.old_encoder is not None and pair.old_encoder.fingerprint != ref.fingerprint:
        raise ConfigError(f"pair {pair.name!r} recorded another old model ({pair.old_encoder.name})")
    return ref
