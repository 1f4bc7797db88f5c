"""The migration engine on real stores, real images and real ONNX encoders."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, load_pair, scan_image_folder
from rm_qdrant.core.planning import ERROR, MOVING, ORIGIN, RANK, SETTLED
from rm_qdrant.errors import MigrationError
from rm_qdrant.migration.migrate import MigrateOptions, Migrator, run_migration
from rm_qdrant.operations.cutover import finalize, rollback
from rm_qdrant.serving.status import pair_status
from rm_qdrant.sources import SourceConfig
from tests.conftest import make_image_folder

N = 60


@pytest.fixture
def gallery(store, models, tmp_path):
    """60 real images indexed into 'old' by the old model, and an rm pair 'p' over it."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=20))
    index_images(store, "old", OnnxEncoder(models.old), items)
    return items


def open_pair(store, models, *, keep_old=False):
    old = OnnxEncoder(models.old) if keep_old else None  # a rollback serves the old model
    create_pair(
        store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), keep_old=keep_old, old_encoder=old
    )
    return DualIndex.open(store, "p", exact=True)


def migrate(index, **options):
    return run_migration(index, MigrateOptions(**{"batch": 7, "fetch_workers": 4, **options}))


def test_full_migration_moves_every_point_once_and_keeps_payloads(store, models, gallery):
    index = open_pair(store, models)
    report = migrate(index)
    assert (report.planned, report.moved, report.failed) == (N, N, 0)
    assert store.count("old") == 0 and store.count("p-new") == N
    moved = store.retrieve("p-new", [gallery[0].point_id], with_vectors=True)[0]
    assert moved.payload == {
        "uri": gallery[0].uri,
        "label": gallery[0].label,
        ORIGIN: "migrate",
        SETTLED: 1,  # confirmed before old's copy went: see paired.py
        "old_confidence": pytest.approx(moved.payload["old_confidence"]),
    }
    expected = index.encoder.encode([gallery[0].uri])["new"][0]
    np.testing.assert_allclose(
        moved.vector / np.linalg.norm(moved.vector), expected / np.linalg.norm(expected), atol=1e-5
    )
    assert migrate(index).planned == 0  # nothing left: a rerun is a no-op


def test_until_holds_the_backfill_at_each_step(store, models, gallery):
    index = open_pair(store, models)
    for step in range(1, 11):
        migrate(index, until=step / 10)
        assert store.count("p-new") == -(-step * N // 10)
        assert store.count("old") + store.count("p-new") == N
    assert index.progress() == 1.0


def test_limit_and_order(store, models, gallery):
    index = open_pair(store, models)
    report = migrate(index, limit=10, order="confidence")
    assert report.moved == 10 and load_pair(store, "p").order == "confidence"
    confidences = sorted((r.payload["old_confidence"], r.id) for r in store.scroll("p-new", limit=100)[0])
    remaining = [r.payload["old_confidence"] for r in store.scroll("old", limit=100)[0]]
    assert max(c for c, _ in confidences) <= min(remaining)  # the least confident went first
    ranks_before = {r.id: r.payload[RANK] for r in store.scroll("old", limit=100)[0]}
    migrate(index, limit=5)  # no --order: the stored order is reused, not recomputed
    ranks_after = {r.id: r.payload[RANK] for r in store.scroll("old", limit=100)[0]}
    assert all(ranks_after[i] == ranks_before[i] for i in ranks_after)


def break_sources(store, gallery, tmp_path, http_images, closed_port):
    """Point six gallery images at six kinds of broken source; return their ids."""
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    bad = {
        "missing file": str(tmp_path / "missing.jpg"),
        "corrupt JPEG": str(corrupt),
        "disallowed scheme": "ftp://example.invalid/x.jpg",
        "HTTP 404": f"{http_images}/ok/a/nope.png",
        "timeout": f"{http_images}/slow/a/000.jpg",
        "connection refused": f"http://127.0.0.1:{closed_port}/x.jpg",
    }
    ids = [item.point_id for item in gallery[: len(bad)]]
    store.set_payload("old", [(i, {"uri": uri}) for i, uri in zip(ids, bad.values())])
    return dict(zip(ids, bad))


def test_bad_sources_are_recorded_with_reasons_and_nothing_is_lost(
    store, models, gallery, tmp_path, http_images, closed_port
):
    broken = break_sources(store, gallery, tmp_path, http_images, closed_port)
    index = open_pair(store, models)
    source = SourceConfig(timeout=0.3, retries=1, backoff=0.01, allow_private=True)
    report = migrate(index, batch=N, source=source, max_failure_share=1.0)
    assert report.moved == N - 6 and report.failed == 6
    reasons = {r.id: r.payload[ERROR] for r in store.retrieve("old", list(broken))}
    expected = {
        "missing file": "No such file",
        "corrupt JPEG": "not a readable image",
        "disallowed scheme": "scheme 'ftp'",
        "HTTP 404": "HTTP 404",
        "timeout": "timed out",
        "connection refused": "connection failed",
    }
    for point_id, kind in broken.items():
        assert expected[kind] in reasons[point_id], (kind, reasons[point_id])
    status = pair_status(store, load_pair(store, "p"))
    assert status.failed == 6 and len(status.failure_sample) == 5 and status.old_count == 6
    # still searchable in old
    hits = index.search_vectors(np.zeros(10, np.float32) + 1, np.ones(6, np.float32), limit=N)
    assert len({h.id for h in hits}) == N
    assert migrate(index, source=source).planned == 0  # failed points wait for --retry-failed
    store.set_payload("old", [(i, {"uri": gallery[-1].uri}) for i in broken])  # the team fixes the URIs
    assert migrate(index, retry_failed=True).moved == 6
    assert store.count("old") == 0 and store.count("p-new") == N


def test_each_moved_point_gets_its_own_images_vector_when_others_in_its_batch_fail(
    store, models, gallery, tmp_path, http_images, closed_port
):
    """A batch is decoded into one array: the failures in it must not shift any vector onto another point."""
    broken = break_sources(store, gallery, tmp_path, http_images, closed_port)
    index = open_pair(store, models)
    source = SourceConfig(timeout=0.3, retries=1, backoff=0.01, allow_private=True)
    migrate(index, batch=N, source=source, max_failure_share=1.0)
    moved = store.retrieve("p-new", [item.point_id for item in gallery], with_vectors=True)
    assert len(moved) == N - len(broken)
    uri = {item.point_id: item.uri for item in gallery}
    expected = index.encoder.encode([uri[r.id] for r in moved])["new"]
    stored = np.stack([r.vector for r in moved])
    cosines = np.einsum("ij,ij->i", stored, expected) / (
        np.linalg.norm(stored, axis=1) * np.linalg.norm(expected, axis=1)
    )
    np.testing.assert_allclose(cosines, 1.0, atol=1e-5)


def test_a_broken_source_stops_the_run_instead_of_marching_on(store, models, gallery, tmp_path):
    store.set_payload("old", [(i.point_id, {"uri": f"{tmp_path}/gone{i.uri}"}) for i in gallery])
    index = open_pair(store, models)
    with pytest.raises(MigrationError, match="7 of 7 points in a batch failed"):
        migrate(index)
    assert store.count("old") == N and store.count("p-new") == 0


def test_keep_old_hides_migrated_points_and_rolls_back(store, models, gallery):
    index = open_pair(store, models, keep_old=True)
    migrate(index, until=0.5)
    assert store.count("old") == N and pair_status(store, index.pair).kept_count == N // 2
    everything = index.search(gallery[0].uri, limit=2 * N)
    assert len(everything) == N and len({h.id for h in everything}) == N  # each point once
    with pytest.raises(MigrationError, match="30 points still serve from 'old'"):
        finalize(store, index.pair)
    record = rollback(store, index.pair)
    assert (record.state, store.alias("p")) == ("rolled_back", "old")
    index.refresh()
    hits = index.search(gallery[0].uri, limit=2 * N)
    assert len(hits) == N and {h.source for h in hits} == {"old"}  # the old model serves the whole gallery
    with pytest.raises(MigrationError, match="rolled_back"):
        Migrator(index, MigrateOptions())


def test_finalize_serves_new_alone(store, models, gallery):
    index = open_pair(store, models)
    migrate(index)
    record = finalize(store, index.pair, alias="gallery")
    assert store.alias("gallery") == "p-new" and record.state == "finalized"
    index.refresh()
    new_vector, _ = index.query_vectors([gallery[3].uri])
    hits = index.search_vectors(new_vector, None, limit=3)
    assert hits[0].id == gallery[3].point_id and {h.source for h in hits} == {"new"}
    with pytest.raises(MigrationError, match="cannot serve the whole gallery"):
        rollback(store, record)


def test_writes_racing_a_batch_win(store, models, gallery):
    """An update landing mid-batch keeps its vector; a delete landing mid-batch stays deleted."""
    index = open_pair(store, models)
    migrator = Migrator(index, MigrateOptions(fetch_workers=2))
    migrator.ensure_order()
    updated, deleted = gallery[0], gallery[1]
    with Migrator_pools() as (source, pool):
        prepared = migrator._prepare([updated.point_id, deleted.point_id, gallery[2].point_id], source, pool)
    other = gallery[-1].uri
    index.upsert([updated.point_id], [other], [{"uri": other, "label": "updated"}])  # the user's update
    index.delete([deleted.point_id])  # the user's delete
    result = migrator._settle(prepared, migrator._encode(prepared))
    assert result.moved == 1 and result.gone == 2
    fresh = store.retrieve("p-new", [updated.point_id])[0]
    assert fresh.payload["label"] == "updated"
    assert (
        store.retrieve("p-new", [deleted.point_id]) == [] and store.retrieve("old", [deleted.point_id]) == []
    )
    assert store.count("old") + store.count("p-new") == N - 1


class Migrator_pools:  # noqa: N801 - reads as the pools a Migrator.run would open
    def __enter__(self):
        from concurrent.futures import ThreadPoolExecutor

        from rm_qdrant.sources import ImageSource

        self.source, self.pool = ImageSource(), ThreadPoolExecutor(2)
        return self.source, self.pool

    def __exit__(self, *exc):
        self.pool.shutdown()
        self.source.close()


def test_point_left_in_both_is_repaired_without_embedding_it_again(store, models, gallery, caplog):
    index = open_pair(store, models)
    item = gallery[4]
    vector = index.encoder.encode([item.uri])["new"]
    store.mark("old", [item.point_id], {MOVING: 1})  # as a batch does before it writes new
    store.upsert(
        "p-new", [item.point_id], vector, [{"uri": item.uri, ORIGIN: "migrate"}]
    )  # a crash before removal (unmarked, old's copy would be a writer's newer one: bypass.py)
    with caplog.at_level(logging.DEBUG, logger="rm_qdrant.migration.migrator"):
        report = migrate(index)
    assert report.repaired == 1 and report.moved == N - 1
    encoded = " ".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("encoded"))
    assert item.point_id not in encoded
    assert store.count("old") == 0 and store.count("p-new") == N


def test_parallel_workers_do_no_point_twice(store, models, gallery, caplog):
    index = open_pair(store, models)
    with caplog.at_level(logging.DEBUG, logger="rm_qdrant.migration.migrator"):
        report = run_migration(index, MigrateOptions(batch=5), workers=3)
    encoded = [
        point_id for r in caplog.records if r.getMessage().startswith("encoded") for point_id in r.args[0]
    ]
    assert report.moved == N and sorted(encoded) == sorted(i.point_id for i in gallery)
    assert store.count("old") == 0


def test_search_beside_a_migration_never_loses_or_doubles_a_point(store, models, gallery):
    index = open_pair(store, models)
    stop, seen, problems = threading.Event(), [], []

    def search_loop():
        while not stop.is_set():
            hits = index.search(gallery[0].uri, limit=N)
            ids = [h.id for h in hits]
            seen.append(len(ids))
            if len(set(ids)) != len(ids) or len(ids) != N:
                problems.append(ids)

    thread = threading.Thread(target=search_loop)
    thread.start()
    try:
        migrate(index, batch=3)
    finally:
        stop.set()
        thread.join()
    assert not problems and len(seen) > 5


def test_sharded_workers_need_a_prepared_order(store, models, gallery):
    index = open_pair(store, models)
    with pytest.raises(MigrationError, match="rmq migrate --prepare"):
        run_migration(index, MigrateOptions(shard=(0, 2)))
    run_migration(index, MigrateOptions(limit=0))  # prepares the order, moves nothing
    moved = [run_migration(index, MigrateOptions(shard=(i, 2), batch=4)).moved for i in range(2)]
    assert sum(moved) == N and all(m > 0 for m in moved)
