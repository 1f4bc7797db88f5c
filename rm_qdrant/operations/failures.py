"""The points a migration could not move: list them, write the list, drop them at the cutover.

A failed point keeps serving from old with the reason of its last attempt (``rmq_error``)
and how many attempts failed (``rmq_attempts``). A point whose image is gone for good (a
404, a deleted object, a truncated file) never migrates, so the cutover would wait for ever:
:func:`finalize_dropping_failed` writes the list of such points first, removes them from the
gallery, then cuts over.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.core.planning import ATTEMPTS, ERROR, chunks
from rm_qdrant.core.redact import redact
from rm_qdrant.errors import ConfigError, MigrationError, SourceError
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.record import PairRecord
from rm_qdrant.sources import SourceConfig, shown
from rm_qdrant.store import Store, Where
from rm_qdrant.store.points import present_ids

log = logging.getLogger(__name__)
_PAGE = 1_000


@dataclass(frozen=True)
class FailedPoint:
    """One point whose migration failed.

    Attributes:
        id: the point's id.
        uri: its image, as messages show it (credentials redacted, length bounded).
        reason: why its last attempt failed (redacted).
        attempts: how many attempts failed; None for a failure recorded before rm-qdrant
            counted them.
    """

    id: PointId
    uri: str
    reason: str
    attempts: int | None


@dataclass(frozen=True)
class DroppedFailures:
    """What ``finalize --drop-failed`` removed: ``listed`` points written to ``path``, of which
    ``removed`` were deleted (a point rewritten meanwhile is no longer failed, and stays)."""

    listed: int
    removed: int
    path: Path | None


def failed_where(pair: PairRecord) -> Where:
    """The points that still serve from old and whose last attempt failed."""
    return layout_of(pair).old_where() & Where(not_empty=(ERROR,))


def count_failures(store: Store, pair: PairRecord) -> int:
    """How many points of ``pair`` failed and still serve from old."""
    if pair.state != "backfilling" or not store.has_collection(pair.old_collection):
        return 0
    return store.count(pair.old_collection, failed_where(pair))


def iter_failures(store: Store, pair: PairRecord, *, page: int = _PAGE) -> Iterator[FailedPoint]:
    """Every failed point of ``pair``, read ``page`` at a time (any gallery size)."""
    if pair.state != "backfilling" or not store.has_collection(pair.old_collection):
        return
    where, offset = failed_where(pair), None
    while True:
        records, offset = store.scroll(pair.old_collection, limit=page, offset=offset, where=where)
        for r in records:
            attempts = r.payload.get(ATTEMPTS)
            yield FailedPoint(
                r.id,
                shown(_uri(pair, r.id, r.payload)),
                redact(str(r.payload.get(ERROR))),
                attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
            )
        if offset is None:
            return


def _uri(pair: PairRecord, point_id: PointId, payload: dict[str, Any]) -> object:
    try:
        return pair.uri_rule.uri(point_id, payload)
    except SourceError as exc:
        return f"({exc})"


def write_failures(path: Path, failures: Iterator[FailedPoint] | Sequence[FailedPoint]) -> int:
    """Write ``failures`` as JSON lines to ``path``, atomically, and return how many.

    The file appears whole or not at all (written next to it, then linked into place), and
    an existing file is never replaced: a list written before is evidence of what was dropped.

    Raises:
        ConfigError: ``path`` exists already, or its folder does not.
    """
    path = Path(path)
    if path.exists():
        raise ConfigError(
            f"{path} exists already: choose another file (--out), the list is never overwritten"
        )
    if not path.parent.is_dir():
        raise ConfigError(f"cannot write {path}: the folder {path.parent} does not exist")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    written = 0
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            for failure in failures:
                out.write(json.dumps(asdict(failure), ensure_ascii=True) + "\n")
                written += 1
            out.flush()
            os.fsync(out.fileno())
        _place(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)
    return written


def _place(temporary: str, path: Path) -> None:
    """Give the written file its name, unless a file has it (one that appeared meanwhile too)."""
    try:
        os.link(temporary, path)
        return
    except FileExistsError:
        raise ConfigError(f"{path} exists already: choose another file (--out)") from None
    except OSError:  # a file system without hard links: checked, then renamed
        if path.exists():
            raise ConfigError(f"{path} exists already: choose another file (--out)") from None
    os.replace(temporary, path)


def drop_failures(store: Store, pair: PairRecord, ids: Sequence[PointId]) -> int:
    """Remove from the gallery those of ``ids`` that still serve from old and still failed.

    Each delete checks the failure at the moment it deletes (one store operation), so a point
    a user rewrote since the list was read (its failure cleared) survives.

    Returns:
        How many of ``ids`` were removed.
    """
    where = failed_where(pair)
    removed = 0
    for batch in chunks(list(ids), _PAGE):
        before = present_ids(store, pair.old_collection, batch)
        store.delete(pair.old_collection, list(batch), where=where)
        after = present_ids(store, pair.old_collection, batch)
        removed += len(before - after)
    log.info("pair %s: removed %d failed points from %s", pair.name, removed, pair.old_collection)
    return removed


def finalize_dropping_failed(
    store: Store,
    pair: PairRecord,
    path: Path,
    *,
    alias: str | None = None,
    drop_old: bool = False,
    encoder: OnnxEncoder | str | None = None,
    source: SourceConfig | None = None,
) -> tuple[PairRecord, DroppedFailures]:
    """Cut over, first removing the points whose migration failed (``rmq finalize --drop-failed``).

    The list of failed points is written to ``path`` (JSON lines, see :func:`write_failures`)
    before any is deleted; only points that still serve from old and still carry a failure
    are deleted. Points that still wait without having failed stop it, as :func:`finalize`.

    Raises:
        MigrationError: points that did not fail still serve from old (nothing is written or
            deleted), or see :func:`finalize`.
        ConfigError: an alias the cutover cannot take (nothing is written or deleted).
        ConfigError: ``path`` exists already.
    """
    if pair.state != "backfilling":  # a cutover under way, or none possible: finalize says which
        return finalize(store, pair, alias=alias, drop_old=drop_old, encoder=encoder, source=source), (
            DroppedFailures(0, 0, None)
        )
    layout = layout_of(pair)
    layout.check_finalize(store, alias, drop_old)  # a cutover refused after the drop would lose the points
    failed = count_failures(store, pair)
    waiting = store.count(pair.old_collection, layout.old_where()) - failed
    if waiting > 0:
        raise MigrationError(
            f"{plural(waiting, 'point')} that did not fail still {'serves' if waiting == 1 else 'serve'} "
            f"from {pair.old_collection!r}: finish the migration (rmq migrate --name {pair.name}) "
            "first; --drop-failed drops only failed points"
        )
    dropped = DroppedFailures(0, 0, None)
    if failed:
        ids: list[PointId] = []
        listed = write_failures(path, _noting(iter_failures(store, pair), ids))
        removed = drop_failures(store, pair, ids)
        dropped = DroppedFailures(listed, removed, path)
    record = finalize(store, pair, alias=alias, drop_old=drop_old, encoder=encoder, source=source)
    return record, dropped


def _noting(failures: Iterator[FailedPoint], ids: list[PointId]) -> Iterator[FailedPoint]:
    """``failures``, each one's id added to ``ids`` as it passes (the list is read once)."""
    for failure in failures:
        ids.append(failure.id)
        yield failure


def plural(count: int, noun: str) -> str:
    """``1 point``, ``2 points``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def failure_line(failure: FailedPoint) -> str:
    """One failed point as ``rmq failures`` prints it (make it terminal-safe before printing)."""
    tried = "" if failure.attempts is None else f"  ({plural(failure.attempts, 'attempt')})"
    return f"{failure.id}  {failure.uri}  {failure.reason}{tried}"


def as_json(failure: FailedPoint) -> dict[str, Any]:
    """One failed point as JSON data."""
    return asdict(failure)
