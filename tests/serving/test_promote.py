"""Promotion: a re-ranked search with ``promote=True`` writes the vectors it embedded to new,
through the migration's claim/settle protocol; an application's write racing it wins, and a
writer that bypasses rm-qdrant rewriting an image keeps the previous image's vector out of new.
On both stores, in the three layouts."""

# ruff: noqa: F811 - the test functions take `graphs`, test_rerank's fixture imported here
from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, load_pair, migrate, status
from rm_qdrant.core.planning import MIGRATED
from rm_qdrant.serving import promote as promoting
from rm_qdrant.serving.promote import promote_batch
from tests.serving.promoting import (
    LAYOUTS,
    embedded,
    migrates_then_finalizes,
    new_vector,
    offered,
    served,
    unit,
)
from tests.serving.test_rerank import graphs, make_pair  # noqa: F401 - graphs is a fixture

K = 10


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_promoting_search_migrates_the_old_hits_it_embedded(store, graphs, image_folder, layout):
    items = make_pair(store, graphs, image_folder, "cosine", layout)
    n, query = len(items), items[0].uri
    uris = {i.point_id: i.uri for i in items}
    before = served(store, query, n)
    index = DualIndex.open(store, "p", exact=True)
    reranked = index.search(query, limit=K, rerank=K, promote=True)
    assert index._promoter.wait(30)
    index.close()
    promoted = [h.id for h in reranked if h.source == "old"]
    assert promoted and index._promoter.counts.promoted == len(promoted)
    assert index._promoter.counts.dropped == 0

    # in new, with exactly the vectors the new model gives their images
    expected = embedded(OnnxEncoder(graphs.rm), [uris[i] for i in promoted])
    got = np.stack([new_vector(store, i) for i in promoted])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    pair = load_pair(store, "p")
    in_old = {r.id: r.payload for r in store.retrieve(pair.old_collection, promoted)}
    if layout == "paired":
        assert in_old == {}
    elif layout == "keep-old":
        assert {p[MIGRATED] for p in in_old.values()} == {1}  # hidden, kept for a rollback
    else:
        assert set(in_old) == set(promoted)  # one point, now with both vectors

    # served once each, from new, with the user's payload, at the distance the re-rank gave
    after = served(store, query, n)
    assert set(after) == set(before)
    for hit in reranked:
        now = after[hit.id]
        assert now.source == "new" and now.payload == before[hit.id].payload
        assert not any(key.startswith("rmq_") for key in now.payload)
        assert now.distance == pytest.approx(hit.distance, abs=1e-5)
    assert status(store, "p").status.new_count == 8 + len(promoted)

    # the migration takes the rest only: nothing embedded twice, nothing duplicated
    report = migrate(store, "p", batch=7)
    assert report.moved == n - 8 - len(promoted)
    np.testing.assert_allclose(np.stack([new_vector(store, i) for i in promoted]), expected, atol=1e-5)
    migrates_then_finalizes(store, query, n)


def test_a_promoted_point_serves_from_new_and_is_not_offered_again(
    store,
    graphs,
    image_folder,
):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    first = index.search(items[3].uri, limit=K, rerank=K, promote=True)
    assert index._promoter.wait(30) and index._promoter.counts.promoted == K
    again = index.search(items[3].uri, limit=K, rerank=K, promote=True)
    assert index._promoter.wait(30)
    index.close()
    promoted = {h.id for h in first}
    # the promoted points serve from new, scored by it; old hits that rose into the first K
    # (the new model's distances are not the merge's) are embedded and promoted in turn
    assert all(h.source == "new" and h.rerank == "new" for h in again if h.id in promoted)
    risen = [h.id for h in again if h.source == "old"]
    assert index._promoter.counts.promoted == K + len(risen)
    assert index._promoter.counts.skipped == 0 and index._promoter.counts.dropped == 0


# -- writes racing a promotion: the application's, and one behind rm-qdrant's back -----------

OPS = ("upsert", "upsert_vectors", "set_payload", "delete", "bypass")
WINDOWS = ("before-claim", "after-claim", "in-settle")


def user_vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(1, 10)).astype(np.float32)


def apply_write(store, op, victim, other_uri):
    """``op`` on ``victim``: the application's write through DualIndex, or (``bypass``) a plain
    payload write to old pointing it at another image, as a client of Qdrant's own does. Returns
    what the pair should serve: the payload (None: deleted) and the new vector ("image": the
    new model's of ``other_uri``; None: of the point's own image)."""
    index = DualIndex.open(store, "p")
    if op == "upsert":
        index.upsert([victim], [other_uri], [{"uri": other_uri, "by": "user"}])
        return {"uri": other_uri, "by": "user"}, "image"
    if op == "upsert_vectors":
        index.upsert_vectors([victim], user_vector(1), [{"by": "user"}])
        return {"by": "user"}, unit(user_vector(1)[0])
    if op == "delete":
        index.delete([victim])
        return None, None
    payload = index.retrieve([victim])[0].payload
    if op == "set_payload":
        index.set_payload({"tag": "late"}, [victim])
        return {**payload, "tag": "late"}, None
    store.set_payload(load_pair(store, "p").old_collection, [(victim, {"uri": other_uri})])
    return {**payload, "uri": other_uri}, "image"


def promote_with_writes(store, offers, write, window, monkeypatch):
    """Promote ``offers`` with ``write`` run in ``window``: between the search and the claim,
    between the claim and the settle, or inside the settle (right after its write to new)."""
    if window == "before-claim":
        write()
    elif window == "after-claim":
        real = promoting.claim_batch

        def claim_then_write(*args, **kwargs):
            claimed = real(*args, **kwargs)
            write()
            return claimed

        monkeypatch.setattr(promoting, "claim_batch", claim_then_write)
    else:
        layout = type(promoting.layout_of(load_pair(store, "p")))
        real_settle = layout.settle

        def settle_with_write(self, store_, prepared, encoded, dim):
            return real_settle(self, _WriteAfterCopy(store_, write), prepared, encoded, dim)

        monkeypatch.setattr(layout, "settle", settle_with_write)
    try:
        return promote_batch(store, "p", OnnxEncoder(load_pair(store, "p").encoder.path), offers)
    finally:
        monkeypatch.undo()


class _WriteAfterCopy:
    """The store, running ``write`` once right after the settle's write to new."""

    def __init__(self, inner, write) -> None:
        self._inner, self._write = inner, write

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in ("upsert", "set_vectors"):
            return attr

        def call(*args, **kwargs):
            result = attr(*args, **kwargs)
            if self._write is not None and (kwargs.get("insert_only") or name == "set_vectors"):
                write, self._write = self._write, None
                write()
            return result

        return call


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_writes_racing_a_promotion_win(store, graphs, image_folder, monkeypatch, layout, window):
    """Each of the promoted points gets one write (an application's upsert, upsert_vectors,
    set_payload, delete; a plain payload write to old that changes the image) in ``window``:
    every write wins, before and after the migration and the cutover, and the other points
    are promoted from their own images."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    uris = {i.point_id: i.uri for i in items}
    offers = offered(store, query, K)
    assert len(offers) > len(OPS)
    victims = dict(zip(OPS, [o[0] for o in offers], strict=False))
    other = next(i for i in items if i.point_id not in {o[0] for o in offers})
    wanted = {}

    def write():
        for op, victim in victims.items():
            wanted[op] = apply_write(store, op, victim, other.uri)

    result = promote_with_writes(store, offers, write, window, monkeypatch)
    assert result is not None and set(wanted) == set(OPS)
    rm = OnnxEncoder(graphs.rm)
    mine = embedded(rm, [uris[o[0]] for o in offers])
    theirs = embedded(rm, [other.uri])[0]

    def check(hits, migrated):
        for op, victim in victims.items():
            payload, vector = wanted[op]
            if payload is None:
                assert victim not in hits, "a deleted point came back"
                assert DualIndex.open(store, "p").retrieve([victim]) == []
                continue
            assert hits[victim].payload == payload, op
            if op == "bypass" and not migrated:  # left in old: the migration embeds the new image
                assert new_vector(store, victim) is None and hits[victim].source == "old"
                continue
            expected = theirs if isinstance(vector, str) else vector
            if expected is None:
                expected = mine[OPS.index(op)]  # set_payload: its own image
            np.testing.assert_allclose(new_vector(store, victim), expected, atol=1e-5, err_msg=op)
        for row, (point_id, _, _) in enumerate(offers):
            if point_id not in victims.values():  # promoted, from their own images
                assert hits[point_id].source == "new"
                np.testing.assert_allclose(new_vector(store, point_id), mine[row], atol=1e-5)

    hits = served(store, query, n)
    assert len(hits) == n - 1
    check(hits, migrated=False)
    check(migrates_then_finalizes(store, query, n - 1), migrated=True)


def test_the_promotion_thread_ends_when_idle_and_comes_back(store, graphs, image_folder, monkeypatch):
    """An index that stops promoting keeps no thread; the next promoting search starts one."""

    monkeypatch.setattr(promoting, "IDLE", 0.2)
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    index.search(items[0].uri, limit=4, rerank=4, promote=True)
    promoter = index._promoter
    assert promoter.wait(30)
    first = promoter._thread
    if first is not None:
        first.join(10)
    assert promoter._thread is None
    index.search(items[9].uri, limit=4, rerank=4, promote=True)
    assert promoter.wait(30) and promoter.counts.promoted >= 5
    index.close()
    promoter.offer([(items[1].point_id, {}, None)])  # after close: dropped, nothing waits for it
    assert promoter.wait(1)
