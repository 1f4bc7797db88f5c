"""``rmq drop-pair``: forget a pair, leaving the team's data as its own code expects it.

A drop is recorded before it starts: its first write sets the pair's state to
``dropping`` and records the plan (the state it dropped from, whether the new
collection or vector goes). Every later step is idempotent and the pair record goes
last, so a drop killed at any point is finished by running ``rmq drop-pair`` again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rm_qdrant.errors import ConfigError
from rm_qdrant.pair.layouts import layout_of
from rm_qdrant.pair.progress import forget_progress
from rm_qdrant.pair.record import (
    META_COLLECTION,
    PairRecord,
    _get,
    _key,
    _put,
    clear_bookkeeping,
    load_pair,
)
from rm_qdrant.store import Store

DROPPING = "dropping"


@dataclass(frozen=True)
class Dropped:
    """What ``rmq drop-pair`` did."""

    pair: PairRecord  # as it was before the drop began
    deleted_new: bool  # the new collection (or vector) was empty or unserved, so it went too


def drop_pair(store: Store, name: str, *, force: bool = False) -> Dropped:
    """Forget a pair. Never deletes the old collection; deletes the new one only when empty.

    rm-qdrant's own payload fields (``rmq_*``: ranks, failure reasons, copy marks) are
    removed from both collections, which are left as the team's own code expects them.
    A pair whose drop was interrupted (state ``dropping``) is dropped as first planned.

    Raises:
        CollectionNotFound: no such pair.
        ConfigError: the pair is mid-backfill and points live only in its new collection
            (without ``force``): dropping it would stop serving them through the pair.
    """
    pair = load_pair(store, name)
    if pair.state == DROPPING:
        pair, delete_new = _resume(store, pair)
    else:
        delete_new = _plan(store, pair, force)
        _put(
            store,
            "pair",
            name,
            {**replace(pair, state=DROPPING).to_payload(), "drop": _plan_payload(pair, delete_new)},
        )
    clear_bookkeeping(store, pair)
    deleted = delete_new and _delete_new(store, pair)
    forget_progress(store, name)
    store.delete(META_COLLECTION, [_key("control", name), _key("pair", name)])  # the record last
    return Dropped(pair, deleted)


def _plan_payload(pair: PairRecord, delete_new: bool) -> dict[str, Any]:
    return {"from": pair.state, "delete_new": delete_new}


def _resume(store: Store, pair: PairRecord) -> tuple[PairRecord, bool]:
    """The pair as it was before its interrupted drop, and whether that drop deletes new."""
    plan = (_get(store, "pair", pair.name) or {}).get("drop") or {}
    return replace(pair, state=str(plan.get("from", "backfilling"))), bool(plan.get("delete_new", False))


def _plan(store: Store, pair: PairRecord, force: bool) -> bool:
    """Whether the drop deletes the new collection (or vector): it is there, empty, and not serving alone.

    Raises:
        ConfigError: points live only in new and ``force`` is not given.
    """
    plan = layout_of(pair).plan_drop(store)
    if pair.state in ("backfilling", "finalizing") and plan.only_new > 0 and not force:
        raise ConfigError(
            f"pair {pair.name!r} is {pair.state} and {plan.only_new} {plan.where}: finish it (rmq migrate, "
            f"rmq finalize) first, or --force to drop the record ({plan.stays})"
        )
    return plan.has_new and plan.in_new == 0 and pair.state != "finalized"


def _delete_new(store: Store, pair: PairRecord) -> bool:
    """Delete the new collection (or vector) and its model record; False if it now holds points.

    Each step is skipped when done already, so a rerun after a kill goes on from where it stopped.
    """
    layout = layout_of(pair)
    if not layout.delete_new(store):
        return False
    store.delete(META_COLLECTION, [_key("collection", layout.new_model_key)])
    return True
