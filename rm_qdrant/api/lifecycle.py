"""Ending a backfill, undoing it, or changing what a running pair serves: :func:`finalize`
(``rmq finalize``), :func:`rollback` (``rmq rollback``) and :func:`switch_encoder` (``rmq
switch-encoder``)."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rm_qdrant.api.common import as_encoder, pair_source
from rm_qdrant.api.linked import linked_after_finalize, linked_before_finalize
from rm_qdrant.core.inputspec import check_decode
from rm_qdrant.core.rerank import Rerank, as_rerank
from rm_qdrant.errors import ConfigError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations import cutover
from rm_qdrant.operations import switch as switching
from rm_qdrant.operations.failures import DroppedFailures, finalize_dropping_failed
from rm_qdrant.operations.verify import Agreement
from rm_qdrant.pair.layouts import count_new
from rm_qdrant.pair.record import PairRecord, load_pair, save_unless_changed
from rm_qdrant.sources import SourceConfig
from rm_qdrant.store import Store

Model = str | os.PathLike[str] | OnnxEncoder


def default_list_path(name: str) -> Path:
    """Where :func:`finalize` with ``drop_failed`` writes the list without ``out``: the current
    folder, ``rmq-failures-<pair>-<UTC time>.jsonl`` (the pair's name made file-safe)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]
    return Path(f"rmq-failures-{safe}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.jsonl")


@dataclass(frozen=True)
class FinalizeReport:
    """What :func:`finalize` did (``rmq finalize --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's record after the cutover.
        drop_old: whether the old collection (or the old vector) was deleted.
        dropped: with ``drop_failed``, the failed points listed and removed; else None.
        note: where the gallery lives now when the old collection was a team's shard adopted
            through a symbolic link ("" otherwise).
    """

    pair: PairRecord
    drop_old: bool = False
    dropped: DroppedFailures | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self.pair)
        if self.dropped is None:
            return data
        path = None if self.dropped.path is None else str(self.dropped.path)
        return {**data, "dropped_failed": self.dropped.removed, "failures_list": path}


def finalize(
    store: Store,
    name: str,
    *,
    alias: str | None = None,
    drop_old: bool = False,
    encoder: Model | None = None,
    drop_failed: bool = False,
    out: str | os.PathLike[str] | None = None,
    source: SourceConfig | None = None,
) -> FinalizeReport:
    """Cut over: point the serving alias at new (one collection: serve its new vector); search
    then uses new alone: ``rmq finalize``.

    A cutover killed half-way is completed by calling this again.

    Args:
        alias: the serving alias to point at new (default: the pair's name).
        drop_old: delete the old collection, or the old vector of one collection (no rollback
            afterwards).
        encoder: one collection: the pair's encoder file, where it moved since ``init`` (it
            embeds points written with the old vector only while the cutover runs).
        drop_failed: first remove the points whose migration failed, after writing their list
            (JSON lines) to ``out``.
        out: with ``drop_failed``, the list's file, never overwritten (default:
            ``./rmq-failures-<pair>-<UTC time>.jsonl``).
        source: how images are fetched (default: the settings the pair recorded).

    Raises:
        ConfigError: ``out`` without ``drop_failed``; an alias the cutover cannot take; ``out``
            exists already.
        CollectionNotFound: no pair of that name.
        MigrationError: points still serve from old (the message names the ways out), or the
            pair is finalized or rolled back.

    Example:
        >>> rm_qdrant.finalize(store, "photos", alias="live").pair.state  # doctest: +SKIP
        'finalized'
    """
    if out is not None and not drop_failed:
        raise ConfigError("--out is the list of --drop-failed: give both, or neither")
    pair = load_pair(store, name)
    linked = linked_before_finalize(store, pair)
    images = pair_source(pair, source)
    model = encoder if isinstance(encoder, OnnxEncoder) or encoder is None else os.fspath(encoder)
    if not drop_failed:
        record = cutover.finalize(store, pair, alias=alias, drop_old=drop_old, encoder=model, source=images)
        note = linked_after_finalize(store, record, linked, dropped_old=drop_old)
        return FinalizeReport(record, drop_old, None, note)
    path = Path(out) if out is not None else default_list_path(name)
    record, dropped = finalize_dropping_failed(
        store, pair, path, alias=alias, drop_old=drop_old, encoder=model, source=images
    )
    note = linked_after_finalize(store, record, linked, dropped_old=drop_old, removed=dropped.removed)
    return FinalizeReport(record, drop_old, dropped, note)


def rollback(
    store: Store, name: str, *, alias: str | None = None, old_encoder: Model | None = None
) -> PairRecord:
    """Serve the old model again: from the old collection (pairs created with ``keep_old``) or the
    old vector (single-collection pairs): ``rmq rollback``. Returns the pair's record.

    Args:
        alias: the serving alias to point at old (default: the pair's).
        old_encoder: the old model, for a pair created without one.

    Raises:
        CollectionNotFound: no pair of that name.
        ConfigError: no old model recorded or given, or one that does not fit.
        MigrationError: the pair cannot roll back (not created with ``keep_old``, finalized
            with the old collection dropped).

    Example:
        >>> rm_qdrant.rollback(store, "photos").state  # doctest: +SKIP
        'rolled_back'
    """
    model = None if old_encoder is None else as_encoder(old_encoder)
    return cutover.rollback(store, load_pair(store, name), alias=alias, old_encoder=model)


@dataclass(frozen=True)
class SwitchReport:
    """What :func:`switch_encoder` did (``rmq switch-encoder --json`` is :meth:`as_dict`).

    Attributes:
        pair: the pair's record, serving the new graph.
        previous: the record before the switch.
        check: how the graph reproduced a sample of the vectors already in new (None: new was
            empty, or no graph was given).
        calibration: what became of the pair's calibration: ``kept``, ``dropped``, or None (it
            had none).
        migrated: points already in new when the decode mode changed (decoded the old way;
            0 when it did not change).
    """

    pair: PairRecord
    previous: PairRecord
    check: Agreement | None
    calibration: str | None
    migrated: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "pair": dataclasses.asdict(self.pair),
            "switched": True,
            "check": self.check and dataclasses.asdict(self.check),
            "calibration": self.calibration,  # kept | dropped | null (the pair had none)
            "decode": {"before": self.previous.decode, "after": self.pair.decode},
            "decoded_before": self.migrated,  # points in new decoded the old way (0: unchanged)
        }


def switch_encoder(
    store: Store,
    name: str,
    encoder: Model | None = None,
    *,
    old_encoder: Model | None = None,
    new_model: Model | None = None,
    sample: int = 64,
    source: SourceConfig | None = None,
    decode: str | None = None,
) -> SwitchReport:
    """Serve a running pair with another graph, if the vectors already in new stay valid, or
    decode its images another way: ``rmq switch-encoder``.

    A sample of new is re-encoded with the graph (decoded as the pair decoded until now); if it
    does not reproduce the vectors stored there, the pair is left as it was.

    ``decode`` alone (no ``encoder``) changes only how the pair decodes its images: the points
    already in new keep the vectors their images gave decoded the old way (nothing is
    re-encoded, nothing checked; :attr:`SwitchReport.migrated` counts them), and every migration
    started afterwards, every :class:`DualIndex` opened (or refreshed) afterwards, and every call
    that reads the pair's images decodes the new way (a migration under way finishes in the mode
    it started with, as it keeps the graph it started with).
    The mode is recorded only here and at :func:`init`, never changed silently.

    Args:
        encoder: the graph to serve from now on (None: keep the pair's; then ``decode`` is needed).
        old_encoder: the old model, if the pair has none recorded.
        new_model: the plain new model (no ψ/ρ) to record as New for :func:`evaluate` and
            :func:`probe` (default: a naive pair moving to a graph with ψ records the graph it
            served until now).
        sample: points of new re-encoded for the check.
        source: how images are fetched (default: the settings the pair recorded).
        decode: ``exact`` or ``fast``: how the pair decodes its images from now on (None: as
            before).

    Raises:
        Refused: the graph does not reproduce the vectors in new (its ``measured`` says how far).
        ConfigError: sizes or distance do not fit; neither ``encoder`` nor ``decode``; an
            unknown ``decode``; ``old_encoder`` or ``new_model`` without ``encoder``.
        MigrationError: the pair is not backfilling.
        CollectionNotFound: no pair of that name.

    Example:
        >>> rm_qdrant.switch_encoder(store, "photos", "fitted.onnx").pair.mode  # doctest: +SKIP
        'rm'
    """
    if decode is not None:
        check_decode(decode)
    if encoder is None and decode is None:
        raise ConfigError("give the graph to serve (--encoder), the decode mode (--decode), or both")
    if encoder is None and (old_encoder is not None or new_model is not None):
        raise ConfigError("--old-encoder and --new-model go with --encoder: the graph they are recorded with")
    before = load_pair(store, name)
    if encoder is None:
        updated, measured = switching.switch_decode(store, before, decode or before.decode), None
    else:
        updated, measured = switching.switch_encoder(
            store,
            before,
            as_encoder(encoder),
            old_encoder=as_encoder(old_encoder) if old_encoder is not None else None,
            new_model=as_encoder(new_model) if new_model is not None else None,
            sample=sample,
            source=pair_source(before, source),
            decode=decode,
        )
    migrated = count_new(store, updated) if updated.decode != before.decode else 0
    return SwitchReport(updated, before, measured, switching.calibration_after(before, updated), migrated)


def set_rerank(store: Store, name: str, rerank: Rerank | int | None) -> PairRecord:
    """Record the re-rank every search of pair ``name`` makes unless it says otherwise (K, or a
    :class:`Rerank`; None: none): ``rmq switch-encoder --rerank K`` / ``--no-rerank``. A
    serving :class:`DualIndex` sees it at its next :meth:`~DualIndex.refresh`.

    Raises:
        CollectionNotFound: no such pair.
        ConfigError: a re-rank out of range; a pair being dropped.
        MigrationError: the record changed while this ran (nothing written).
    """
    pair = load_pair(store, name)
    if pair.state == "dropping":
        raise ConfigError(f"pair {name!r} is being dropped: 'rmq drop-pair {name}' finishes it")
    plan = as_rerank(rerank)
    updated = dataclasses.replace(pair, rerank=None if plan is None else plan.to_dict())
    save_unless_changed(store, pair, updated, "switch-encoder --rerank")
    return updated
