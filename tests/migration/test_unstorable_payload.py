"""A stored payload outside the store's bounds (written past rm-qdrant, by qdrant-client's local
mode or a raw qdrant-edge upsert) fails its own point, with the reason, and the run goes on."""

from __future__ import annotations

import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, load_pair, scan_image_folder
from rm_qdrant.core.planning import ERROR
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.failures import finalize_dropping_failed, iter_failures
from rm_qdrant.store import Store
from rm_qdrant.store.edge import EdgeStore
from tests.conftest import make_image_folder
from tests.operations.test_failures import LAYOUTS

pytestmark = pytest.mark.slow


def deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


BAD = {
    "nan": (float("nan"), "payload at x: nan is not a number JSON holds"),
    "int": (2**70, "payload at x:"),
    "deep": (deep(110), "payload at x"),
}


def write_raw(store: Store, collection: str, point_id, payload: dict) -> None:
    """Write ``payload`` past the store's bounds check, as another client would."""
    if isinstance(store, EdgeStore):
        import qdrant_edge as qe

        shard = store._open(collection)[1]
        try:
            shard.update(qe.UpdateOperation.set_payload([point_id], payload))
        except ValueError as exc:  # qdrant-edge holds no NaN
            pytest.skip(f"qdrant-edge refuses it too: {exc}")
    else:
        store._client.set_payload(collection, payload, points=[point_id])


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_unstorable_payload_fails_its_point_and_the_run_goes_on(store, models, tmp_path, layout, bad):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=2))
    index_images(store, "photos", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.rm),
        old_encoder=OnnxEncoder(models.old),
        **LAYOUTS[layout],
    )
    victim = items[1].point_id
    value, reason = BAD[bad]
    write_raw(store, "photos", victim, {"x": value})
    stored = store.retrieve("photos", [victim])[0].payload.get("x")
    if stored is None or stored == {} or (bad != "nan" and stored != value):
        pytest.skip(f"this store does not keep {bad} as written (reads back {str(stored)[:40]!r})")
    index = DualIndex.open(store, "p")
    report = run_migration(index, MigrateOptions(batch=2))

    pair = load_pair(store, "p")
    if layout == "single":  # nothing is copied: the payload stays where it is, the vector is added
        assert (report.moved, report.failed) == (len(items), 0)
        return
    assert (report.moved, report.failed) == (len(items) - 1, 1)
    failures = list(iter_failures(store, pair))
    assert [f.id for f in failures] == [victim]
    assert failures[0].reason.startswith("its payload cannot be copied: " + reason)
    old = store.retrieve("photos", [victim])[0].payload
    assert old[ERROR].startswith("its payload cannot be copied") and old["uri"] == items[1].uri
    assert store.count(pair.new_collection) == len(items) - 1
    index = DualIndex.open(store, "p", exact=True)
    hit = index.search(items[1].uri, limit=1)[0]
    assert (hit.id, hit.source) == (victim, "old")  # still served, from old

    again = run_migration(index, MigrateOptions(batch=2, retry_failed=True))  # fails alone again
    assert (again.moved, again.failed) == (0, 1)
    record, dropped = finalize_dropping_failed(store, load_pair(store, "p"), tmp_path / "failed.jsonl")
    assert record.state == "finalized" and dropped.removed == 1
    assert store.retrieve(record.new_collection, [victim]) == []


def test_rmq_migrate_lists_the_point_in_failures_and_finalize_drop_failed_removes_it(rmq, models, tmp_path):
    from rm_qdrant.store.client import ClientStore

    store = ClientStore(path=str(tmp_path / "q"))  # qdrant-client's local mode, as rmq opens it
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=2))
    index_images(store, "old", OnnxEncoder(models.old), items)
    victim = items[2].point_id
    store._client.set_payload("old", {"x": float("nan")}, points=[victim])
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    store.close()

    ran = rmq("migrate", "--name", "p", "--batch", "2").output  # used to stop at this point, every run
    assert "moved 5 points" in ran and "failed 1" in ran, ran
    listed = rmq("failures", "--name", "p").output
    assert (
        f"{victim}  " in listed
        and "its payload cannot be copied: payload at x: nan is not a number" in listed
    )
    out = tmp_path / "failed.jsonl"
    done = rmq("finalize", "--name", "p", "--drop-failed", "--out", out).output
    assert "removed 1 failed points" in done and str(victim) in out.read_text()


def test_the_ray_engine_fails_the_point_alike(models, tmp_path, local_ray):
    from rm_qdrant.migration.ray_engine import RayOptions
    from rm_qdrant.store.client import ClientStore

    store = ClientStore(path=str(tmp_path / "q"))
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=2))
    index_images(store, "photos", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="photos", encoder=OnnxEncoder(models.rm))
    victim = items[3].point_id
    write_raw(store, "photos", victim, {"x": deep(110)})
    report = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=2), ray=RayOptions(decoders=1))
    assert (report.moved, report.failed) == (len(items) - 1, 1)
    (failure,) = iter_failures(store, load_pair(store, "p"))
    assert failure.id == victim and "its payload cannot be copied: payload at x.a.a" in failure.reason
    store.close()
