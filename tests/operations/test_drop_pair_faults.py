"""``drop-pair`` killed at each of its store writes, in both layouts: a rerun finishes it.

What a user must see: the rerun of the same command completes the drop, every point of
the team's collection is still there with its own payload and vector and none of
rm-qdrant's ``rmq_*`` fields, and the empty new collection (or new vector) is gone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap

import pytest

from rm_qdrant import (
    DualIndex,
    OnnxEncoder,
    create_pair,
    index_images,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.errors import CollectionNotFound
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.drop import drop_pair
from rm_qdrant.pair.record import META_COLLECTION, list_pairs
from tests.conftest import make_image_folder
from tests.faults import Crash, Scripted, crash, nth_write
from tests.migration.test_fault_injection import rmq

pytestmark = pytest.mark.slow


def _build(store, models, items, layout):
    index_images(store, "photos", OnnxEncoder(models.old), items)
    single = {"layout": "single-collection", "new_vector": "new"} if layout == "single" else {}
    create_pair(store, "p", old_collection="photos", encoder=OnnxEncoder(models.rm), **single)
    run_migration(DualIndex.open(store, "p"), MigrateOptions(limit=0, order="centroid"))  # ranks: rmq_rank


def _points(store):
    page, _ = store.scroll("photos", limit=10_000, with_vectors=True)
    return {r.id: (r.payload, r.vector.round(5).tolist()) for r in page}


def _team_data(store, items):
    """Each point of the team's collection as its own code sees it (rm-qdrant's fields left out)."""
    return {
        i: ({k: v for k, v in p.items() if not k.startswith("rmq_")}, v)
        for i, (p, v) in _points(store).items()
    }


@pytest.mark.parametrize("layout", ["paired", "single"])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_drop_pair_killed_at_any_write_is_completed_by_running_it_again(
    models, tmp_path, layout, when, backend
):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=5))
    n = 0
    while True:
        store = open_store(":memory:" if backend == "memory" else tmp_path / f"q{n}")
        _build(store, models, items, layout)
        before = _team_data(store, items)
        assert any(k.startswith("rmq_") for p, _ in _points(store).values() for k in p)  # ranks were written
        killed = Scripted(store, [(when, nth_write(n), crash)])
        with contextlib.suppress(Crash):
            drop_pair(killed, "p")
        if killed.pending:  # drop_pair made fewer than n + 1 writes: every kill point is done
            store.close()
            break
        with contextlib.suppress(CollectionNotFound):  # killed at the very end: nothing left to do
            drop_pair(store, "p")  # the user runs the same command again
        assert list_pairs(store) == []
        with pytest.raises(CollectionNotFound):
            load_pair(store, "p")
        points = _points(store)
        assert not any(k.startswith("rmq_") for p, _ in points.values() for k in p), (n, when)
        assert _team_data(store, items) == before and len(points) == len(items)  # nothing lost
        if layout == "single":
            assert store.collection("photos").vectors == ("",)
        else:
            assert sorted(store.list_collections()) == sorted([META_COLLECTION, "photos"])
        meta = {(r.payload["kind"], r.payload["name"]) for r in store.scroll(META_COLLECTION, limit=100)[0]}
        assert meta == {("collection", "photos")}  # what 'index' recorded; no pair, no new model
        store.close()
        n += 1
    assert n >= 3


def test_a_drop_killed_mid_way_says_so_and_the_rerun_prints_what_it_did(models, tmp_path):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=5)
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "photos", "--encoder", models.rm)
    rmq(store_path, "migrate", "--name", "p", "--limit", "0", "--order", "centroid")
    killer = textwrap.dedent(
        """
        import os, signal, sys
        from rm_qdrant.store.edge import EdgeStore
        real = EdgeStore.clear_fields
        def clear_then_die(self, *args, **kwargs):
            real(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)
        EdgeStore.clear_fields = clear_then_die
        from rm_qdrant.cli import main
        sys.argv = ["rmq", *sys.argv[1:]]
        main()
        """
    )
    args = ["--qdrant", str(store_path), "drop-pair", "p"]
    killed = subprocess.run([sys.executable, "-c", killer, *args], capture_output=True, timeout=120)
    assert killed.returncode == -9
    listed = json.loads(rmq(store_path, "pairs", "--json").output)
    assert [(p["name"], p["state"]) for p in listed] == [("p", "dropping")]
    finish = "being dropped: 'rmq drop-pair p' finishes it"
    for command in (["search", "--name", "p", str(next(images.rglob("*.png")))], ["migrate", "--name", "p"]):
        told = rmq(store_path, *command, ok=False)  # not a half-dropped pair served or migrated
        assert told.exit_code == 1 and finish in told.output, told.output
    again = rmq(
        store_path, "init", "--name", "p", "--old-collection", "photos", "--encoder", models.rm, ok=False
    )
    assert again.exit_code == 1 and finish in again.output
    done = rmq(store_path, "drop-pair", "p").output
    assert "dropped pair 'p' (backfilling)" in done and "'p-new' deleted (it was empty)" in done
    with open_store(store_path) as store:
        assert sorted(store.list_collections()) == sorted([META_COLLECTION, "photos"])
        assert not any(k.startswith("rmq_") for r in store.scroll("photos", limit=100)[0] for k in r.payload)
