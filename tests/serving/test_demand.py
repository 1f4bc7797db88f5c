"""Search demand (serving/demand.py): what searches returned from old becomes a count in the old
point's payload, which users never see and which the migration's protocol does not notice."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rm_qdrant import (
    ConfigError,
    DualIndex,
    OnnxEncoder,
    PairRecord,
    StoreError,
    create_pair,
    index_images,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.core.planning import DEMAND
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.pair.layouts import ids_in_new
from rm_qdrant.pair.record import ModelRef
from rm_qdrant.serving.demand import DemandLog
from rm_qdrant.store import Where
from tests.conftest import NEW_DIM, OLD_DIM, make_image_folder
from tests.faults import Scripted


@pytest.fixture(params=["paired", "single-collection"])
def layout(request):
    return request.param


@pytest.fixture
def gallery(store, models, tmp_path, layout):
    """30 real images indexed by the old model, paired with the rm graph in ``layout``."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    extra = {"layout": "single-collection", "new_vector": "new"} if layout == "single-collection" else {}
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), **extra)
    return [item.point_id for item in items]


def demand_of(store, pair, ids) -> dict:
    return {r.id: r.payload.get(DEMAND) for r in store.retrieve(pair.old_collection, ids)}


def test_counts_reach_the_payload_add_up_over_flushes_and_stay_out_of_sight(store, gallery):
    pair = load_pair(store, "p")
    a, b, c = gallery[:3]
    with DemandLog(store, pair, flush_every=3600) as demand:
        demand.record([a, b])
        demand.record([a])
        assert demand_of(store, pair, [a, b, c]) == {a: None, b: None, c: None}  # nothing written yet
        assert demand.flush() == 2 and demand.pending == 0
        assert demand_of(store, pair, [a, b, c]) == {a: 2, b: 1, c: None}
        demand.record([b, c])
        demand.record([b])
        assert demand.flush() == 2
        assert demand.flush() == 0  # nothing counted since
    assert demand_of(store, pair, [a, b, c]) == {a: 2, b: 3, c: 1}

    index = DualIndex.open(store, "p", exact=True)
    points = index.retrieve([a, b, c])
    assert [p.source for p in points] == ["old"] * 3
    assert all(DEMAND not in p.payload and "uri" in p.payload for p in points)
    hits = index.search_vectors(
        np.ones(NEW_DIM, np.float32), np.ones(OLD_DIM, np.float32), limit=len(gallery)
    )
    assert len(hits) == len(gallery) and all(DEMAND not in h.payload for h in hits)


def test_points_deleted_or_migrated_meanwhile_are_skipped(store, gallery):
    pair = load_pair(store, "p")
    index = DualIndex.open(store, "p", exact=True)
    assert run_migration(index, MigrateOptions(batch=100, limit=5)).moved == 5
    moved = sorted(ids_in_new(store, pair, gallery))
    deleted, kept = [i for i in gallery if i not in moved][:2]
    with DemandLog(store, pair, flush_every=3600) as demand:
        demand.record([deleted, kept, *moved])
        index.delete([deleted])
        assert demand.flush() == 1  # the one point still serving from old
    assert demand_of(store, pair, [kept]) == {kept: 1}
    assert store.retrieve(pair.old_collection, [deleted]) == []
    # paired: the moved points left old; one collection: they are the same points, uncounted
    assert all(v is None for v in demand_of(store, pair, moved).values())


def test_a_failed_flush_keeps_its_counts_for_the_next(store, gallery):
    pair = load_pair(store, "p")
    broken = Scripted(store, [("before", lambda name, args, kwargs: name == "set_payload", _refuse)])
    with DemandLog(broken, pair, flush_every=3600) as demand:
        demand.record(gallery[:2])
        with pytest.raises(StoreError, match="refused"):
            demand.flush()
        assert demand.pending == 2
        demand.record(gallery[:1])
        assert demand.flush() == 2
    assert demand_of(store, pair, gallery[:2]) == {gallery[0]: 2, gallery[1]: 1}


def _refuse():
    raise StoreError("the server refused the write")


def test_the_background_thread_flushes_and_close_writes_the_rest(store, gallery):
    pair = load_pair(store, "p")
    written = threading.Event()
    watched = Scripted(store, [("after", lambda name, args, kwargs: name == "set_payload", written.set)])
    demand = DemandLog(watched, pair, flush_every=0.05)
    demand.record(gallery[:1])
    assert written.wait(30), "the flusher thread never wrote"
    demand.record(gallery[1:2])
    demand.close()
    demand.record(gallery[2:3])  # closed: not counted, nothing raised
    assert demand_of(store, pair, gallery[:3]) == {gallery[0]: 1, gallery[1]: 1, gallery[2]: None}


def test_after_the_cutover_no_point_keeps_a_count_and_demand_is_dropped(store, gallery):
    pair = load_pair(store, "p")
    with DemandLog(store, pair, flush_every=3600) as demand:
        demand.record(gallery[:4])
        assert demand.flush() == 4
        run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
        finalize(store, load_pair(store, "p"))
        demand.record(gallery[:4])
        assert demand.flush() == 0
    for name in {pair.old_collection, pair.new_collection}:
        if store.has_collection(name):
            assert store.count(name, Where(not_empty=(DEMAND,))) == 0


@pytest.mark.parametrize("every", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_flush_interval_that_is_not_seconds_is_refused(every):
    pair = PairRecord("p", "old", "p-new", "rm", "cosine", ModelRef("m", "0", 4, "-"))
    with pytest.raises(ConfigError, match="flush_every is seconds above 0"):
        DemandLog(open_store(":memory:"), pair, flush_every=every)
