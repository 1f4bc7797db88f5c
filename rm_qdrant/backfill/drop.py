"""``rmq drop-pair``: forget a pair, leaving the team's data as its own code expects it."""

from __future__ import annotations

from dataclasses import dataclass

from rm_qdrant.backfill.pair import (
    META_COLLECTION,
    PairRecord,
    _key,
    clear_bookkeeping,
    count_new,
    load_pair,
    new_model_key,
)
from rm_qdrant.core.planning import MIGRATED
from rm_qdrant.errors import ConfigError
from rm_qdrant.store import Store, Where


@dataclass(frozen=True)
class Dropped:
    """What ``rmq drop-pair`` did."""

    pair: PairRecord
    deleted_new: bool  # the new collection (or vector) was empty or unserved, so it went too


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
    if pair.single:
        return _drop_single(store, pair, force)
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


def _drop_single(store: Store, pair: PairRecord, force: bool) -> Dropped:
    """One collection: the new vector goes when no point has it, as an empty new collection does."""
    collection, new = pair.old_collection, pair.new_using
    has_vector = store.has_collection(collection) and new in store.collection(collection, pair.vector).vectors
    in_new = count_new(store, pair) if has_vector else 0
    only_new = store.count(collection, Where(lacks_vector=(pair.vector,))) if in_new else 0
    if pair.state in ("backfilling", "finalizing") and only_new > 0 and not force:
        raise ConfigError(
            f"pair {pair.name!r} is {pair.state} and {only_new} points of {collection!r} hold only the new "
            f"vector {new!r}: finish it (rmq migrate, rmq finalize) first, or --force to drop the record "
            "(the collection and both vectors stay)"
        )
    store.delete(META_COLLECTION, [_key("pair", pair.name)])
    clear_bookkeeping(store, pair)
    deleted = has_vector and in_new == 0 and pair.state != "finalized"
    if deleted:
        store.drop_vector(collection, new)
        store.delete(META_COLLECTION, [_key("collection", new_model_key(pair))])
    return Dropped(pair, deleted)
