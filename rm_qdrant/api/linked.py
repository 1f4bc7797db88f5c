"""What ``init`` and ``finalize`` say of a team's shard adopted into the embedded store through
a symbolic link (docs/guides/operations.md, "Stores"): a paired migration moves the gallery
into the store's folder."""

from __future__ import annotations

from rm_qdrant.pair.record import PairRecord
from rm_qdrant.store import Store, linked_shard, shard_path


def linked_at_init(store: Store, pair: PairRecord) -> str:
    """One line for a paired pair whose old collection is a linked shard ("" for any other)."""
    target = linked_shard(store, pair.old_collection) if pair.layout == "paired" else None
    if target is None:
        return ""
    kept = "keeps it there too (hidden, for a rollback)" if pair.keep_old else "removes it from there"
    return (
        f"{pair.old_collection!r} is a shard adopted through a link ({target}): each migrated point is "
        f"written to {pair.new_collection!r}, a shard in this store's folder "
        f"({shard_path(store, pair.new_collection)}), and the migration {kept}; after finalize the "
        "gallery lives in the store's folder: keep it (--mode single-collection adds the new vector "
        "to the linked shard itself)"
    )


def linked_before_finalize(store: Store, pair: PairRecord) -> tuple[str, int] | None:
    """The linked shard of a paired pair's old collection and its points, read before a finalize
    that may drop the link; None for any other pair."""
    target = linked_shard(store, pair.old_collection) if pair.layout == "paired" else None
    return None if target is None else (str(target), store.count(pair.old_collection))


def linked_after_finalize(
    store: Store, pair: PairRecord, linked: tuple[str, int] | None, *, dropped_old: bool, removed: int = 0
) -> str:
    """Where the gallery is after the cutover, and what the team's linked shard holds ("" if none)."""
    if linked is None:
        return ""
    target, points = linked[0], linked[1] - removed
    held = f"{points} point(s)" + (" (the old model's copies --keep-old kept)" if pair.keep_old else "")
    link = (
        "--drop-old removed the link to it, not the shard"
        if dropped_old
        else f"it is still linked as {pair.old_collection!r}"
    )
    return (
        f"\nthe gallery lives in {pair.new_collection!r}, in this store's folder "
        f"({shard_path(store, pair.new_collection)}); the team's shard {target} holds {held}: {link}"
    )
