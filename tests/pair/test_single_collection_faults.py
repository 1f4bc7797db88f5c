"""The single-collection layout through ``rmq``: the commands a team runs, bad input, and kills."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys

import pytest

from rm_qdrant import (
    DualIndex,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.store import Where
from tests.conftest import make_image_folder
from tests.faults import Crash, Scripted, crash, nth_write
from tests.migration.test_fault_injection import kill_once, rmq, schedule
from tests.pair.test_single_collection import make_pair

pytestmark = pytest.mark.slow

SCHEDULE = schedule(3)  # start-up, ranking, three moments among the batches
HAS_NEW, LACKS_NEW = Where(has_vector=("new",)), Where(lacks_vector=("new",))


def build(store_path, images, models):
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", models.old)
    rmq(
        store_path,
        "init",
        "--name",
        "p",
        "--mode",
        "single-collection",
        "--collection",
        "photos",
        "--new-vector",
        "new",
        "--encoder",
        models.rm,
        "--old-encoder",
        models.old,
    )


def test_a_team_runs_the_whole_upgrade_with_commands(tmp_path, models):
    store_path, images = tmp_path / "q", make_image_folder(tmp_path / "g", per_class=10)
    build(store_path, images, models)
    assert "photos: vector '' -> 'new'" in rmq(store_path, "pairs").output
    rmq(store_path, "migrate", "--name", "p", "--until", "0.5", "--batch", "5")
    status = json.loads(rmq(store_path, "status", "--name", "p", "--json").output)
    assert (status["layout"], status["old_count"], status["new_count"]) == ("single-collection", 15, 15)
    text = rmq(store_path, "status", "--name", "p").output
    assert "photos (vector 'new'): 15 points" in text and "single-collection" in text
    query = next(images.glob("a/*"))
    hits = json.loads(rmq(store_path, "search", "--name", "p", query, "--limit", "30", "--json").output)
    assert {h["source"] for h in hits} == {"old", "new"} and len({h["id"] for h in hits}) == 30
    rmq(store_path, "migrate", "--name", "p")
    done = rmq(store_path, "finalize", "--name", "p", "--drop-old").output
    assert "serves vector 'new'" in done and "dropped vector ''" in done
    hits = json.loads(rmq(store_path, "search", "--name", "p", query, "--json").output)
    assert {h["source"] for h in hits} == {"new"}
    with open_store(store_path) as store:
        assert store.collection("photos").vectors == ("new",)
        assert store.list_collections() == ["photos", "rmq_meta"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "single-collection", "--collection", "photos"], "needs --new-vector NAME"),
        (["--mode", "single-collection", "--new-vector", "new"], "takes the collection as --collection C"),
        (["--collection", "photos", "--new-vector", "new"], "are for --mode single-collection"),
        (["--mode", "rm", "--query-mode", "naive", "--old-collection", "photos"], "disagree"),
        (
            ["--mode", "single-collection", "--collection", "photos", "--new-vector", "new", "--keep-old"],
            "always keeps the old vectors",
        ),
        (["--mode", "single-collection", "--collection", "nope", "--new-vector", "new"], "not found"),
    ],
)
def test_bad_init_input_is_one_line_and_writes_nothing(tmp_path, models, args, message):
    store_path, images = tmp_path / "q", make_image_folder(tmp_path / "g", per_class=2)
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", models.old)
    result = rmq(store_path, "init", "--name", "p", "--encoder", models.rm, *args, ok=False)
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    with open_store(store_path) as store:
        assert store.collection("photos").vectors == ("",)


def search_everything(store_path, items):
    with open_store(store_path) as store, DualIndex.open(store, "p", exact=True) as index:
        results = index.search_batch([i.uri for i in items[::25]], limit=len(items))
        # sorted: near-ties swap places between runs of different batch sizes (float noise)
        return [sorted((round(h.distance, 4), h.id, h.source) for h in hits) for hits in results]


def test_sigkill_at_random_moments_loses_nothing(tmp_path, models):
    # 600 real image files: the kills move at most about 100 points each
    images = make_image_folder(tmp_path / "images", per_class=200)
    items = scan_image_folder(images)
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    build(killed, images, models)
    build(reference, images, models)
    rmq(reference, "migrate", "--name", "p", "--batch", "50")
    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(killed), "-vv", "migrate", "--name", "p"]
    command += ["--batch", "10", "--json"]
    rng = random.Random(2)
    for run, (marker, window) in enumerate(SCHEDULE):
        kill_once(command, tmp_path / f"run{run}.log", marker, window, rng)
        with open_store(killed) as store:  # after every kill: every point there, each once
            assert store.count("photos") == len(items)
    final = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr
    with open_store(killed) as store:
        assert store.count("photos", HAS_NEW) == len(items) and store.count("photos", LACKS_NEW) == 0
    status = json.loads(rmq(killed, "status", "--name", "p", "--json").output)
    assert (status["failed"], status["old_count"], status["fraction"]) == (0, 0, 1.0)
    assert search_everything(killed, items) == search_everything(reference, items)


@pytest.mark.parametrize("drop_old", [False, True])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_finalize_killed_at_any_write_is_completed_by_running_it_again(
    models, tmp_path, drop_old, when, backend
):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=5))
    n = 0
    while True:
        store = open_store(":memory:" if backend == "memory" else tmp_path / f"q{n}")
        make_pair(store, models, items)
        run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
        killed = Scripted(store, [(when, nth_write(n), crash)])
        with contextlib.suppress(Crash):
            finalize(killed, load_pair(store, "p"), drop_old=drop_old)
        if killed.pending:  # finalize made fewer than n + 1 writes: every kill point is done
            store.close()
            break
        if load_pair(store, "p").state != "finalized":  # killed before the end: the user reruns it
            finalize(store, load_pair(store, "p"), drop_old=drop_old)
        assert load_pair(store, "p").state == "finalized"
        assert store.collection("photos", "new").vectors == (("new",) if drop_old else ("", "new"))
        hits = DualIndex.open(store, "p", exact=True).search(items[0].uri, limit=30)
        assert len({h.id for h in hits}) == len(items) and {h.source for h in hits} == {"new"}
        assert not any(k.startswith("rmq_") for h in hits for k in h.payload)
        store.close()
        n += 1
    assert n >= 3
