"""Promotion racing the pair's own operations: a migration batch claiming the same points,
``finalize``, ``rollback`` and ``rmq pause``, each forced into the window between the
promotion's claim and its settle (or the migration's), on both stores, in the three layouts.
What a user sees is checked each time: every point served once, with its image's vector, and
the migration and the cutover complete."""

# ruff: noqa: F811 - the test functions take `graphs`, test_rerank's fixture imported here
from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import (
    DualIndex,
    MigrationError,
    OnnxEncoder,
    finalize,
    load_pair,
    migrate,
    pause,
    resume,
    rollback,
    status,
)
from rm_qdrant.migration import migrator
from rm_qdrant.serving import promote as promoting
from rm_qdrant.serving.promote import Promoter, promote_batch
from tests.serving.promoting import (
    LAYOUTS,
    embedded,
    migrates_then_finalizes,
    new_vector,
    offered,
    served,
)
from tests.serving.test_rerank import graphs, make_pair  # noqa: F401 - graphs is a fixture

K = 10
#: Paired: a claimant settling points that another claimant migrated and deleted from old
#: meanwhile took them for points a user deleted, and deleted their copies from new (before
#: the settle marked its copies rmq_settled).
RACED = ["paired", "keep-old", "single"]


def after_claim(monkeypatch, module, action):
    """Run ``action`` once, right after ``module``'s next claim (the promotion's or the migration's)."""
    real = module.claim_batch
    pending = [action]

    def claim_then_act(*args, **kwargs):
        claimed = real(*args, **kwargs)
        if pending:
            pending.pop()()
        return claimed

    monkeypatch.setattr(module, "claim_batch", claim_then_act)
    return pending


def their_images(store, graphs, items, ids):
    """Each of ``ids`` has in new the new model's vector of its own image."""
    uris = {i.point_id: i.uri for i in items}
    expected = embedded(OnnxEncoder(graphs.rm), [uris[i] for i in ids])
    np.testing.assert_allclose(np.stack([new_vector(store, i) for i in ids]), expected, atol=1e-5)


def encoder_of(store):
    return OnnxEncoder(load_pair(store, "p").encoder.path)


@pytest.mark.parametrize("layout", RACED)
def test_a_migration_run_between_a_promotions_claim_and_settle(
    store, graphs, image_folder, monkeypatch, layout
):
    """The whole migration (its batches claim the promotion's points) lands between the
    promotion's claim and its settle: the promotion's stale claim writes nothing twice."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    offers = offered(store, query, K)
    ran = {}
    pending = after_claim(
        monkeypatch, promoting, lambda: ran.setdefault("report", migrate(store, "p", batch=7))
    )
    result = promote_batch(store, "p", encoder_of(store), offers)
    monkeypatch.undo()
    assert not pending and ran["report"].moved == n - 4 and result is not None
    hits = served(store, query, n)
    assert len(hits) == n and {h.source for h in hits.values()} == {"new"}
    their_images(store, graphs, items, [i.point_id for i in items])
    migrates_then_finalizes(store, query, n)


@pytest.mark.parametrize("layout", RACED)
def test_a_promotion_between_a_migration_batchs_claim_and_settle(
    store, graphs, image_folder, monkeypatch, layout
):
    """The reverse: a migration batch has claimed every point (and is embedding them) when a
    promotion claims and settles some of them; the batch then settles."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    offers = offered(store, query, K)
    results = []
    encoder = encoder_of(store)
    pending = after_claim(
        monkeypatch, migrator, lambda: results.append(promote_batch(store, "p", encoder, offers))
    )
    report = migrate(store, "p", batch=100)
    monkeypatch.undo()
    assert not pending and results[0].moved == len(offers)
    assert report.failed == 0 and status(store, "p").fraction == 1.0
    hits = served(store, query, n)
    assert len(hits) == n and {h.source for h in hits.values()} == {"new"}
    their_images(store, graphs, items, [i.point_id for i in items])
    migrates_then_finalizes(store, query, n)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_finalize_refuses_while_promoted_points_still_serve_from_old(
    store, graphs, image_folder, monkeypatch, layout
):
    """``finalize`` between a promotion's claim and settle, with those points in old still: its
    all-moved check refuses (nothing changed); after the settle the migration and the cutover
    complete."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    offers = offered(store, query, K)
    refused = []

    def cut_over():
        with pytest.raises(MigrationError, match="still serve from") as caught:
            finalize(store, "p")
        refused.append(str(caught.value))

    after_claim(monkeypatch, promoting, cut_over)
    result = promote_batch(store, "p", encoder_of(store), offers)
    monkeypatch.undo()
    assert refused and load_pair(store, "p").state == "backfilling"
    assert result.moved == len(offers)
    hits = served(store, query, n)
    assert len(hits) == n
    migrates_then_finalizes(store, query, n)


@pytest.mark.parametrize("drop_old", [False, True], ids=["keep", "drop-old"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_promotion_in_flight_through_a_cutover_changes_nothing(
    store,
    graphs,
    image_folder,
    monkeypatch,
    layout,
    drop_old,
):
    """The migration completes and ``finalize`` runs between a promotion's claim and settle: the
    promotion's settle on a finalized pair writes nothing a user sees (or fails, logged, where
    the old collection or vector was dropped), and what it still had queued is dropped."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    offers = offered(store, query, K)
    half = len(offers) // 2

    def migrate_and_cut_over():
        migrate(store, "p", batch=100)
        finalize(store, "p", drop_old=drop_old)

    after_claim(monkeypatch, promoting, migrate_and_cut_over)
    promoter = Promoter(store, "p", encoder_of(store))
    promoter.offer(offers[:half])
    assert promoter.wait(30)
    promoter.offer(offers[half:])  # queued after the cutover: dropped
    assert promoter.wait(30)
    promoter.close()
    monkeypatch.undo()
    assert load_pair(store, "p").state == "finalized"
    assert promoter.counts.dropped >= len(offers) - half
    hits = served(store, query, n)
    assert len(hits) == n and {h.source for h in hits.values()} == {"new"}
    their_images(store, graphs, items, [i.point_id for i in items])


@pytest.mark.parametrize("layout", ["keep-old", "single"])
def test_a_rollback_between_a_promotions_claim_and_settle_serves_old_whole(
    store,
    graphs,
    image_folder,
    monkeypatch,
    layout,
):
    """``rollback`` lands between a promotion's claim and its settle: afterwards the old model
    serves every point once, with its payload, as after a rollback that a migration batch raced."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    before = {i: h.payload for i, h in served(store, query, n).items()}
    offers = offered(store, query, K)
    old = OnnxEncoder(graphs.old)
    after_claim(monkeypatch, promoting, lambda: rollback(store, "p", old_encoder=old))
    promote_batch(store, "p", encoder_of(store), offers)
    monkeypatch.undo()
    assert load_pair(store, "p").state == "rolled_back"
    hits = served(store, query, n)
    assert {i: h.payload for i, h in hits.items()} == before
    assert {h.source for h in hits.values()} == {"old"}
    # the query's own image is at distance 0 in the old model's space: old serves it
    assert hits[items[0].point_id].distance == pytest.approx(0.0, abs=1e-5)
    # a later promotion gets nothing: the pair is no longer backfilling
    promoter = Promoter(store, "p", encoder_of(store))
    promoter.offer(offers)
    assert promoter.wait(30)
    promoter.close()
    assert promoter.counts.dropped == len(offers) and promoter.counts.promoted == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_paused_pair_gets_no_promotion(store, graphs, image_folder, layout):
    """``rmq pause`` holds promotion as it holds the migration: a promoting search still answers,
    its vectors are dropped (counted), nothing is written; after ``rmq resume`` it promotes."""
    items = make_pair(store, graphs, image_folder, "cosine", layout, moved=4)
    n, query = len(items), items[0].uri
    pause(store, "p")
    index = DualIndex.open(store, "p", exact=True)
    hits = index.search(query, limit=K, rerank=K, promote=True)
    assert index._promoter.wait(30)
    old_hits = [h.id for h in hits if h.source == "old"]
    assert index._promoter.counts.dropped == len(old_hits) > 0
    assert index._promoter.counts.promoted == 0
    assert status(store, "p").status.new_count == 4
    assert all(new_vector(store, i) is None for i in old_hits)
    resume(store, "p")
    # the same index: the vectors its cache kept while paused are offered again, and promoted
    again = index.search(query, limit=K, rerank=K, promote=True)
    assert {h.rerank for h in again if h.source == "old"} == {"cached"}
    assert index._promoter.wait(30)
    index.close()
    assert index._promoter.counts.promoted == len(old_hits)
    assert status(store, "p").status.new_count == 4 + len(old_hits)
    migrates_then_finalizes(store, query, n)
