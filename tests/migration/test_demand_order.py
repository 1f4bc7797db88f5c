"""``rmq migrate --order demand``: the points searches returned from old most often migrate first,
in the demand as of each run's start; a flush of demand in the middle of a batch changes nothing
of the batch."""

from __future__ import annotations

import json

import pytest

from rm_qdrant import (
    DualIndex,
    MigrationError,
    OnnxEncoder,
    create_pair,
    index_images,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.core.ordering import order_keys
from rm_qdrant.core.planning import DEMAND, RANK
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.pair.layouts import ids_in_new
from rm_qdrant.serving.demand import DemandLog
from rm_qdrant.store import Where
from tests.conftest import make_image_folder, one_error_line
from tests.faults import Scripted

#: How many searches returned each of these positions of the gallery from old (distinct counts:
#: one right order).
DEMANDED = {4: 9, 17: 7, 0: 5, 22: 3, 11: 2, 28: 1}


@pytest.fixture(params=["paired", "single-collection"])
def gallery(request, store, models, tmp_path):
    """30 real images indexed by the old model, paired with the rm graph; their ids."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    extra = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), **extra)
    return [item.point_id for item in items]


def searched(store, counts: dict, name: str = "p") -> None:
    """What searches that returned these points from old so many times leave in the store."""
    with DemandLog(store, load_pair(store, name), flush_every=3600) as demand:
        for point_id, times in counts.items():
            for _ in range(times):
                demand.record([point_id])


def expected_order(ids: list, counts: dict, seed: int = 0) -> list:
    """By brute force: descending count, then the never-returned in the seeded random order."""
    keys = dict(zip(ids, order_keys("random", ids, [], seed=seed).tolist(), strict=True))
    return sorted(ids, key=lambda i: (-counts.get(i, 0), keys[i]))


def moved(store, ids) -> set:
    return ids_in_new(store, load_pair(store, "p"), list(ids))


def migrate(store, **options) -> int:
    index = DualIndex.open(store, "p")
    return run_migration(index, MigrateOptions(batch=4, order="demand", **options)).moved


def test_the_most_demanded_move_first_then_the_rest_in_random_order(store, gallery):
    counts = {gallery[k]: n for k, n in DEMANDED.items()}
    searched(store, counts)
    order = expected_order(gallery, counts)
    assert migrate(store, limit=4) == 4
    assert moved(store, gallery) == set(order[:4])
    assert migrate(store, limit=5) == 5  # the last two demanded, then three never returned
    assert moved(store, gallery) == set(order[:9])
    assert load_pair(store, "p").order == "demand"


def test_each_run_ranks_by_the_demand_of_its_start(store, gallery):
    """Demand recorded between two rounds of --limit reorders the second: a point no search had
    returned, now returned most, moves next."""
    counts = {gallery[k]: n for k, n in DEMANDED.items()}
    searched(store, counts)
    migrate(store, limit=2)
    late = expected_order(gallery, counts)[-1]  # the last point of the first ranking
    searched(store, {late: 20})
    assert migrate(store, limit=1) == 1
    assert moved(store, [late]) == {late}
    assert moved(store, gallery) == set(expected_order(gallery, counts)[:2]) | {late}


def test_sharded_runs_take_the_prepared_ranks_and_refuse_without_them(store, gallery):
    """--shard cannot rank: it refuses a demand order no --prepare ranked, and takes the ranks of
    the last --prepare as they are (demand recorded since waits for the next --prepare)."""
    index = DualIndex.open(store, "p")
    with pytest.raises(MigrationError, match="rmq migrate --prepare"):
        run_migration(index, MigrateOptions(order="demand", shard=(0, 2)))
    counts = {gallery[k]: n for k, n in DEMANDED.items()}
    searched(store, counts)
    run_migration(index, MigrateOptions(order="demand", limit=0))  # what --prepare runs
    pair = load_pair(store, "p")
    ranked = {r.id: r.payload[RANK] for r in store.retrieve(pair.old_collection, gallery)}
    late = expected_order(gallery, counts)[-1]
    searched(store, {late: 50})
    total = sum(
        run_migration(DualIndex.open(store, "p"), MigrateOptions(order="demand", shard=(i, 2), limit=4)).moved
        for i in range(2)
    )
    assert total == 4 and late not in moved(store, gallery)
    left = {r.id: r.payload[RANK] for r in store.retrieve(pair.old_collection, gallery) if r.id in ranked}
    assert all(left[i] == ranked[i] for i in left)  # not ranked again


def flush_at(demand: DemandLog, ids: list):
    def flush() -> None:
        demand.record(ids)
        assert demand.flush() == len(ids)

    return flush


def in_the_batch(name, args, kwargs) -> bool:
    """Between a batch's claim and its settle: paired, its copies written to new (the batch's
    old points marked rmq_moving); one collection, before the new vectors are written where
    the points still hold the batch's token (rmq_batch)."""
    return (name == "upsert" and kwargs.get("insert_only")) or name == "set_vectors"


def test_a_flush_between_a_batch_claim_and_settle_does_not_disturb_it(store, gallery):
    pair = load_pair(store, "p")
    with DemandLog(store, pair, flush_every=3600) as demand:
        scripted = Scripted(store, [("before", in_the_batch, flush_at(demand, gallery[:6]))])
        # one batch of the whole gallery: the flushed points are the batch's
        report = run_migration(DualIndex.open(scripted, "p"), MigrateOptions(batch=len(gallery)))
        assert scripted.pending == 0, "the flush never found its moment"
    assert (report.moved, report.unconfirmed, report.rewritten, report.failed) == (len(gallery), 0, 0, 0)
    assert moved(store, gallery) == set(gallery)
    if not pair.single:  # the copies in new carry none of old's bookkeeping
        assert store.count(pair.new_collection, Where(not_empty=(DEMAND,))) == 0


def test_rmq_migrate_order_demand_through_the_cli(rmq, demo, tmp_path):
    """What a team types: --order demand is listed, moves the most demanded first, and sharded
    workers need rmq migrate --prepare first."""
    assert "demand" in rmq("migrate", "--help").output
    with open_store(tmp_path / "q") as store:
        ids = [r.id for r in store.scroll("gallery", limit=100)[0]]
        counts = {ids[k]: n for k, n in DEMANDED.items() if k < len(ids)}
        searched(store, counts, "demo")
    line = one_error_line(rmq("migrate", "--name", "demo", "--order", "demand", "--shard", "0/2", ok=False))
    assert "rmq migrate --prepare" in line
    dry = json.loads(rmq("migrate", "--name", "demo", "--order", "demand", "--dry-run", "--json").output)
    assert (dry["order"], dry["order_ready"]) == ("demand", False)
    report = json.loads(
        rmq("migrate", "--name", "demo", "--order", "demand", "--limit", "3", "--json").output
    )
    assert report["moved"] == 3
    with open_store(tmp_path / "q") as store:
        assert {r.id for r in store.scroll("demo-new", limit=100)[0]} == set(expected_order(ids, counts)[:3])
    rmq("migrate", "--name", "demo", "--prepare")  # the pair's order now: demand
    sharded = rmq("migrate", "--name", "demo", "--shard", "1/2", "--limit", "4", "--json")  # 4 / 2 shards
    assert json.loads(sharded.output)["moved"] == 2
