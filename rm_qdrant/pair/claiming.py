"""Claiming a batch of old points: the first step of the migration's protocol, shared by the
migration (:mod:`rm_qdrant.migration.migrator`) and a search's promotion
(:mod:`rm_qdrant.serving.promote`)."""

from __future__ import annotations

from collections.abc import Sequence

from rm_qdrant.core.merge import PointId
from rm_qdrant.pair.layouts import Layout
from rm_qdrant.pair.outcome import ClaimedBatch, uncopyable
from rm_qdrant.store import Store


def claim_batch(
    layout: Layout, store: Store, batch: Sequence[PointId], carried: tuple[str, ...]
) -> ClaimedBatch:
    """Read a batch (one collection: token it) before its items are read: the points still
    there, those done already, and those to embed (a payload new cannot take fails its point)."""
    claimed = layout.claim(store, list(batch), carried)
    present, done = claimed.present, claimed.done
    payloads = {r.id: r.payload for r in present}
    ids = [i for i in batch if i in payloads]  # a user may have deleted some meanwhile
    refused = {}
    if layout.copies_payload:  # one payload new cannot take fails its point, not the run
        refused = uncopyable({i: payloads[i] for i in ids if i not in done})
    return ClaimedBatch(
        ids,
        payloads,
        [i for i in ids if i in done],
        [(i, payloads[i]) for i in ids if i not in done and i not in refused],
        len(batch) - len(ids),
        claimed.token,
        {r.id: r.others for r in present} if carried else {},
        list(refused.items()),
    )
