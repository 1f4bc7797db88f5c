"""A rollback killed at any store write, and rmq index into a pair that is migrating.

rollback cleared the bookkeeping (the marks that hide migrated points in old) before it
recorded the pair rolled back: killed between the two, the pair still backfilled with those
marks gone, so old served every migrated point again beside its copy in new (counted twice,
served by the old model). It now records the state first; a rerun finishes what a kill cut.

``rmq index --name P`` wrote the old model's points into a paired layout's old collection
while new held points: each point then lived in both, unmarked (served twice, counted twice).
"""

from __future__ import annotations

import pytest

from rm_qdrant import DualIndex, load_pair
from rm_qdrant.operations.cutover import rollback
from rm_qdrant.serving.status import pair_status
from tests.conftest import settled
from tests.faults import Crash, Scripted, crash, nth_write
from tests.serving.test_in_both_search import N, _build

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("n", range(5))
def test_a_rollback_killed_at_any_write_serves_each_point_once_and_a_rerun_finishes_it(store, tmp_path, n):
    ids, old, new, served, both = _build(store, tmp_path, "cosine", keep_old=True)
    killed = Scripted(store, [("before", nth_write(n), crash)])
    try:
        rollback(killed, load_pair(store, "p"))
    except Crash:
        pass
    for attempt in ("after the kill", "after a rerun"):
        index = DualIndex.open(store, "p", exact=True)
        hits = index.search_vectors(new[0], old[0], limit=2 * N)
        status = pair_status(store, index.pair)
        assert sorted(map(str, (h.id for h in hits))) == sorted(map(str, ids)), attempt
        if index.pair.state == "rolled_back":  # new's points stay, unserved
            assert {h.source for h in hits} == {"old"} and status.old_count == N, attempt
        else:
            assert status.old_count + status.new_count == N, attempt
        assert index.count() == N, attempt
        index.close()
        rollback(store, load_pair(store, "p"))
    records, _ = store.scroll("old", limit=2 * N)
    assert not any(k.startswith("rmq_") for r in records for k in r.payload)  # the rerun cleared them
    assert load_pair(store, "p").state == "rolled_back"


def test_rmq_index_into_a_pair_whose_new_holds_points_is_refused(rmq, demo, models, image_folder):
    rmq("migrate", "--name", "demo", "--limit", "5", "--batch", "5")
    before = [settled(rmq("status", "--name", "demo", "--json").output)]
    result = rmq("index", "--name", "demo", "--data", image_folder, "--encoder", models.old, ok=False)
    assert result.exit_code == 1 and "would serve points twice" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert settled(rmq("status", "--name", "demo", "--json").output) == before[0]


def test_rmq_index_into_a_fresh_pair_still_loads_its_old_collection(rmq, demo, models, image_folder):
    result = rmq("index", "--name", "demo", "--data", image_folder, "--encoder", models.old)
    assert "indexed" in result.output
