"""Migration planning and bookkeeping that needs no store (pure functions).

Payload fields that rm-qdrant writes on gallery points are named here too, so
every module spells them the same way.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rm_qdrant.core.merge import PointId
from rm_qdrant.errors import ConfigError

RANK = "rmq_rank"  # position in the backfill order (old points)
BUCKET = "rmq_bucket"  # shard bucket, from the id (old points)
ERROR = "rmq_error"  # why the last migration attempt failed (old points)
ATTEMPTS = "rmq_attempts"  # how many migration attempts of this point failed (old points, next to ERROR)
MIGRATED = "rmq_migrated"  # keep-old mode: 1 once this old point has a copy in new (an int:
# qdrant-edge 0.9 does not match booleans in filters)
MOVING = "rmq_moving"  # 1 on old points whose batch is being written to new (a crash can
# leave them in both collections: counts subtract those found in new)
ORIGIN = "rmq_origin"  # "migrate" on new points the migration wrote
ORIGIN_MIGRATE = "migrate"
BATCH = "rmq_batch"  # one collection: the token of the batch that read this point's payload; the
# write of its new vector requires it, and a user's rewrite of the point (a new payload) removes it
STALE = "rmq_stale"  # two collections: the token of the sweep that is dropping this new copy, which
# a writer's old copy made stale (see pair/bypass.py); a user's rewrite of the copy removes it
DEMAND = "rmq_demand"  # how many searches returned this point from old (old points; see
# serving/demand.py), which ``--order demand`` ranks by; a migrated copy never carries it
SETTLED = "rmq_settled"  # two collections: 1 on a migrated copy in new once its settle confirmed it,
# just before old's copy is retired: a point gone from old whose copy is settled was moved (by
# another claimant: a search's promotion, a concurrent run), not deleted by a user
INTERNAL_FIELDS = (RANK, BUCKET, ERROR, ATTEMPTS, MIGRATED, MOVING, ORIGIN, BATCH, STALE, DEMAND, SETTLED)


def points_to_move(*, old_active: int, new: int, until: float | None, limit: int | None) -> int:
    """How many points this run may still move to respect ``--until`` and ``--limit``.

    >>> points_to_move(old_active=70, new=30, until=0.5, limit=None)
    20
    """
    if until is not None and not 0.0 <= until <= 1.0:
        raise ConfigError(f"--until must be a fraction in [0, 1], got {until}")
    room = old_active
    if until is not None:
        room = min(room, max(0, math.ceil(until * (old_active + new) - 1e-9) - new))
    if limit is not None:
        room = min(room, max(0, limit))
    return room


def over_failure_limit(failed: int, attempted: int, share: float) -> bool:
    """Whether a batch failed badly enough to stop the run (more than ``share`` of it)."""
    return attempted > 0 and failed / attempted > share


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` → ``(i, n)``, checked."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ConfigError(f"bad --shard {text!r}: expected i/n, e.g. 0/2") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"bad --shard {text!r}: need 0 <= i < n")
    return index, count


def user_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A payload without rm-qdrant's bookkeeping fields (what users write and see)."""
    return {k: v for k, v in payload.items() if k not in INTERNAL_FIELDS}


def new_payload(old: Mapping[str, Any]) -> dict[str, Any]:
    """The payload a migrated point gets in new: the old one, less bookkeeping, marked."""
    return {**user_payload(old), ORIGIN: ORIGIN_MIGRATE}


@dataclass(frozen=True)
class Settlement:
    """What to do with a written batch once new and old have been read back.

    Attributes:
        remove_from_old: confirmed in new and still in old: safe to retire the old copy.
        delete_from_new: gone from old, and new held our copy when read: a user deleted the
            point meanwhile. The store deletes these only if still ours (``rmq_origin``) at
            the moment of the delete, so a user's write that lands after the read survives.
        unconfirmed: written but not found (or malformed) in new: left in old for a retry.
    """

    remove_from_old: list[PointId]
    delete_from_new: list[PointId]
    unconfirmed: list[PointId]


def settle(
    batch: Sequence[PointId],
    *,
    in_new: Mapping[PointId, tuple[int, Mapping[str, Any]]],
    still_in_old: Collection[PointId],
    dim: int,
) -> Settlement:
    """Decide the fate of each id of a batch after its insert-only write to new.

    Args:
        batch: ids written (or found already written) to new.
        in_new: id → (vector length, payload) as read back from new.
        still_in_old: ids of the batch still present in old.
        dim: the new collection's vector size.

    An id gone from old meanwhile was deleted or updated by a user. If the copy
    in new is still the migration's own (marked ``rmq_origin``), the user deleted
    it, and the copy must go; a user's update replaced the copy, so it stays.
    """
    remove, resurrected, unconfirmed = [], [], []
    for point_id in batch:
        found = in_new.get(point_id)
        if point_id not in still_in_old:
            if found is not None and found[1].get(ORIGIN) == ORIGIN_MIGRATE:
                resurrected.append(point_id)
        elif found is None or found[0] != dim:
            unconfirmed.append(point_id)
        else:
            remove.append(point_id)
    return Settlement(remove, resurrected, unconfirmed)


def chunks(items: Sequence[PointId], size: int) -> Iterable[Sequence[PointId]]:
    """Consecutive slices of at most ``size`` items."""
    if size < 1:
        raise ConfigError(f"batch size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start : start + size]


def user_bodies(
    payloads: Sequence[Mapping[str, Any] | None] | None, rows: int
) -> list[dict[str, Any] | None]:
    """A user's write's payloads without rm-qdrant's fields (None: keep the point's). A write that
    carried them (a hit's payload written back, say) would pass for a migration copy, which the
    migration may delete."""
    if payloads is None:
        return [None] * rows
    if (
        isinstance(payloads, (Mapping, str, bytes))
        or not isinstance(payloads, Sequence)
        or not all(p is None or isinstance(p, Mapping) for p in payloads)
    ):
        raise ConfigError("payloads are a list of one dict (or None) a point, in the order of the ids")
    if len(payloads) != rows:
        raise ConfigError(f"{len(payloads)} payloads for {rows} ids")
    return [None if p is None else user_payload(p) for p in payloads]
