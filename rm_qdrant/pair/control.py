"""``rmq pause`` / ``rmq resume``: a flag beside the pair's record that every running migration
reads before it claims a batch.

The flag is a point of its own in ``rmq_meta`` (kind ``control``), not a field of the pair
record: commands that rewrite the record after a long step (``finalize``, ``calibrate``) refuse
when it changed meanwhile, and a pause must not make them fail. Every process that opens the
store sees it: shards on other machines against a server, and the workers of this process. The
embedded store admits one process, so there the flag reaches a migration only from that process
(the Python API); from another terminal, stop it with Ctrl-C and run it again later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rm_qdrant.errors import CollectionNotFound, MigrationError
from rm_qdrant.pair.record import META_COLLECTION, _get, _key, _put, load_pair
from rm_qdrant.store import Store

KIND = "control"
#: :func:`paused_since` of a flag that holds the pair but whose time cannot be read (edited by
#: hand, or written by another version): the pause holds all the same.
UNKNOWN_SINCE = 0.0
#: 9999-12-31: a time past this (or before the epoch) is not one :func:`pause` wrote.
_LAST_TIME = 253_402_300_799.0


@dataclass(frozen=True)
class Paused:
    """What :func:`pause` and :func:`resume` did.

    Attributes:
        name: the pair.
        paused: whether the pair is paused now.
        changed: False when it already was (both commands are idempotent: nothing was written).
        since: when it was paused (seconds since the epoch; None when not paused).
    """

    name: str
    paused: bool
    changed: bool
    since: float | None


def paused_since(store: Store, name: str) -> float | None:
    """When the pair was paused (seconds since the epoch), or None when it is not paused.

    A flag whose ``paused`` is set holds the pair whatever else it holds: a ``since`` that is
    not a time reads as :data:`UNKNOWN_SINCE`, and :func:`resume` rewrites it."""
    control = _get(store, KIND, name) or {}
    if not control.get("paused"):
        return None
    since = control.get("since")
    readable = isinstance(since, int | float) and not isinstance(since, bool) and 0 < since <= _LAST_TIME
    return float(since) if readable else UNKNOWN_SINCE


def is_paused(store: Store, name: str) -> bool:
    """Whether ``rmq pause`` holds the pair's migrations."""
    return paused_since(store, name) is not None


def pause(store: Store, name: str) -> Paused:
    """Hold every migration of the pair before its next batch: ``rmq pause``.

    Batches already claimed finish and settle; a migration started while the pair is paused
    waits before its first batch. :func:`resume` lets them go on.

    Raises:
        CollectionNotFound: no pair of that name.
        MigrationError: the pair is not backfilling (finalized, rolled back, cut over, dropped).
    """
    _check_backfilling(store, name, "pause")
    since = paused_since(store, name)
    if since is not None:
        return Paused(name, True, False, since)
    now = time.time()
    _put(store, KIND, name, {"kind": KIND, "name": name, "paused": True, "since": now})
    return Paused(name, True, True, now)


def resume(store: Store, name: str) -> Paused:
    """Let the pair's migrations go on: ``rmq resume``.

    Raises:
        CollectionNotFound: no pair of that name.
    """
    load_pair(store, name)  # a pair that does not exist says so
    if paused_since(store, name) is None:
        return Paused(name, False, False, None)
    _put(store, KIND, name, {"kind": KIND, "name": name, "paused": False, "since": None})
    return Paused(name, False, True, None)


def still_backfilling(store: Store, name: str) -> None:
    """What a paused run checks while it waits: that its pair was not dropped, rolled back or cut
    over meanwhile (resumed, it would move points into a collection nothing serves any more).

    Raises:
        MigrationError: it was; the run stops.
    """
    try:
        state = load_pair(store, name).state
    except CollectionNotFound:
        state = "dropped"
    if state != "backfilling":
        raise MigrationError(
            f"pair {name!r} was {state.replace('_', ' ')} while this run was paused: the run stops, "
            "nothing more is moved"
        )


def forget_pause(store: Store, name: str) -> None:
    """Remove the pair's flag (``rmq drop-pair``; ``rmq init``, where an earlier pair of the name
    left one)."""
    if store.has_collection(META_COLLECTION):
        store.delete(META_COLLECTION, [_key(KIND, name)])


def _check_backfilling(store: Store, name: str, command: str) -> None:
    state = load_pair(store, name).state
    if state != "backfilling":
        raise MigrationError(f"pair {name!r} is {state}, not migrating: there is nothing to {command}")
