"""``rmq pause`` / ``resume`` and ``--rate`` on real migrations: a pause holds every worker of
every run on the store within one batch and loses nothing; a run started paused waits; a stop
while paused ends cleanly; the rate is an upper bound; the pace and ETA come from what the runs
recorded."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rm_qdrant import (
    ConfigError,
    DualIndex,
    MigrationError,
    OnnxEncoder,
    create_pair,
    drop_pair,
    finalize,
    index_images,
    migrate,
    pause,
    resume,
    rollback,
    scan_image_folder,
)
from rm_qdrant.api import status
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.pair import progress
from rm_qdrant.pair.control import is_paused
from rm_qdrant.serving.status import pair_status
from rm_qdrant.store import Where
from tests.conftest import OLD_DIM, make_image_folder
from tests.pair.test_single_collection import make_pair, user_vector

N = 60
BATCH = 5


@pytest.fixture
def pair(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 3))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    return store


def _in_new(store) -> int:
    return pair_status(store, _load(store)).new_count


def _load(store):
    from rm_qdrant import load_pair

    return load_pair(store, "p")


def _wait_for(condition, timeout=60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pause_holds_every_worker_within_a_batch_and_resume_finishes_the_gallery(pair, workers):
    """Paused from the first settled batch: each worker settles at most the batches it had in
    flight, then nothing moves until resume; the run then moves everything."""
    store, events, settled_at_pause = pair, [], []

    def on_batch(result):
        if not settled_at_pause:
            pause(store, "p")
            settled_at_pause.append(True)

    result = {}
    run = threading.Thread(
        target=lambda: result.update(
            report=migrate(
                store, "p", batch=BATCH, workers=workers, on_batch=on_batch, on_pause=events.append
            )
        )
    )
    run.start()
    _wait_for(lambda: events == [True])
    time.sleep(1.5)  # the other workers settle what they had in flight, then wait too
    held = _in_new(store)
    # per worker: at most the batch settled before the flag was read, the one it was encoding
    # and the one it had claimed; the first settled batch set the flag
    assert held <= BATCH * (1 + 3 * workers) < N, held
    time.sleep(1.5)  # the gate reads the flag every second: it would have let a batch go by now
    assert _in_new(store) == held and run.is_alive()
    assert pair_status(store, _load(store)).paused_since is not None
    resume(store, "p")
    run.join(60)
    assert events == [True, False]
    assert result["report"].moved == N and not result["report"].stopped_early
    assert _in_new(store) == N and not is_paused(store, "p")


def test_two_shards_of_the_pair_honour_one_pause(pair):
    """--shard i/n runs (here two runs on one store object, as shard processes share a server):
    the flag in the store holds both."""
    store = pair
    migrate(store, "p", limit=0)  # ranks the gallery, as --prepare does before sharded workers
    index = DualIndex.open(store, "p")
    pause(store, "p")
    reports, waiting = {}, []

    def shard(i):
        options = MigrateOptions(batch=BATCH, shard=(i, 2), optimize_every=None)
        reports[i] = run_migration(index, options, on_pause=lambda p: waiting.append((i, p)))

    threads = [threading.Thread(target=shard, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    _wait_for(lambda: sorted(waiting) == [(0, True), (1, True)])
    time.sleep(1.2)
    assert _in_new(store) == 0
    resume(store, "p")
    for t in threads:
        t.join(60)
    assert sum(r.moved for r in reports.values()) == N and _in_new(store) == N


def test_a_stop_while_paused_ends_the_run_and_loses_nothing(pair):
    store, stop, events = pair, threading.Event(), []
    pause(store, "p")
    report = {}
    run = threading.Thread(
        target=lambda: report.update(r=migrate(store, "p", batch=BATCH, stop=stop, on_pause=events.append))
    )
    run.start()
    _wait_for(lambda: events == [True])
    stop.set()
    run.join(30)
    assert report["r"].stopped_early and report["r"].moved == 0
    state = pair_status(store, _load(store))
    assert (state.old_count, state.new_count) == (N, 0)
    resume(store, "p")
    assert migrate(store, "p", batch=BATCH).moved == N


def test_the_rate_holds_the_run_back_by_the_points_over_one_seconds_worth(pair, monkeypatch):
    """On the gate's clock (simulated: it moves only when the gate sleeps), a run of N points at
    --rate R waits (N - R) / R seconds in all: the bucket starts with one second's points."""
    from types import SimpleNamespace

    from rm_qdrant.migration import gate

    clock = SimpleNamespace(now=0.0)
    slept = SimpleNamespace(monotonic=lambda: clock.now, sleep=lambda s: setattr(clock, "now", clock.now + s))
    monkeypatch.setattr(gate, "time", slept)
    rate = 40.0
    report = migrate(store := pair, "p", batch=BATCH, rate=rate)
    assert report.moved == N and _in_new(store) == N
    assert clock.now == pytest.approx((N - rate) / rate)


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True])
def test_a_bad_rate_is_refused_before_anything_is_written(pair, bad):
    with pytest.raises(ConfigError, match="rate"):
        migrate(pair, "p", batch=BATCH, rate=bad)
    assert _load(pair).order is None and _in_new(pair) == 0  # not even ranked


def test_pause_refuses_a_pair_that_is_not_migrating_and_both_are_idempotent(pair):
    store = pair
    assert pause(store, "p").changed and not pause(store, "p").changed
    assert resume(store, "p").changed and not resume(store, "p").changed
    migrate(store, "p", batch=N)
    finalize(store, "p")
    with pytest.raises(MigrationError, match="not migrating"):
        pause(store, "p")
    assert not is_paused(store, "p")


def test_status_tells_the_pace_and_the_eta_of_what_remains(pair):
    """After a run to half the gallery, the pace is what the run recorded and the ETA is what
    remains at that pace; with no run going on, no process is migrating now."""
    store = pair
    report = migrate(store, "p", batch=BATCH, until=0.5)
    s = status(store, "p").status
    assert s.remaining == N - report.moved > 0
    assert s.points_per_second is not None
    recorded = [sum(w.buckets.values()) for w in progress.workers(store, "p")]
    assert recorded == [report.moved]  # one run, which recorded every point it moved
    assert s.eta_seconds == pytest.approx(s.remaining / s.points_per_second)
    assert s.migrating_now == 0
    as_dict = status(store, "p").as_dict()
    assert as_dict["remaining"] == s.remaining and as_dict["paused"] is False


def test_finalize_embeds_late_writes_of_a_paused_single_collection_pair(store, models, tmp_path):
    """A pause holds the backfill, not the cutover: finalize's own pass over points written
    without the new vector (here: after the finalized record, by the app's old code) goes on."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    make_pair(store, models, items)
    migrate(store, "p", batch=BATCH)
    pause(store, "p")
    finalize(store, "p")
    store.upsert("photos", [items[0].point_id], user_vector(2, OLD_DIM), [{"uri": items[5].uri}])
    done = {}
    run = threading.Thread(target=lambda: done.update(report=finalize(store, "p")), daemon=True)
    run.start()
    run.join(60)
    assert "report" in done, "finalize waited for rmq resume"
    assert store.count("photos", Where(lacks_vector=("new",))) == 0
    found = store.retrieve("photos", [items[0].point_id], with_vectors=True, vector="new")[0]
    assert found.vector is not None and np.isfinite(found.vector).all()


@pytest.mark.parametrize("end", ["drop-pair --force", "rollback"])
def test_a_paused_run_stops_when_its_pair_is_dropped_or_rolled_back_meanwhile(store, models, tmp_path, end):
    """The gallery stays where the pair's end left it: the workers held by the pause do not go on
    moving it into a collection nothing serves any more."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 3))
    index_images(store, "old", OnnxEncoder(models.old), items)
    old = OnnxEncoder(models.old)
    create_pair(
        store, "p", old_collection="old", encoder=OnnxEncoder(models.rm), keep_old=True, old_encoder=old
    )
    migrate(store, "p", batch=BATCH, limit=BATCH)
    pause(store, "p")
    events, outcome = [], {}

    def run():
        try:
            outcome["report"] = migrate(store, "p", batch=BATCH, on_pause=events.append)
        except MigrationError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_for(lambda: events == [True])
    if end == "rollback":
        rollback(store, "p")
    else:
        drop_pair(store, "p", force=True)
    thread.join(60)
    assert "report" not in outcome, outcome
    assert "p" in outcome["error"] and ("dropped" in outcome["error"] or "rolled back" in outcome["error"])
    assert store.count("p-new") == BATCH  # nothing moved after the pause


def test_a_pause_left_at_the_cutover_is_not_reported_once_the_pair_is_finalized(pair):
    store = pair
    migrate(store, "p", batch=N)
    pause(store, "p")  # nothing left to migrate, but still backfilling: it may be paused
    finalize(store, "p")
    report = status(store, "p")
    assert report.status.paused_since is None and report.as_dict()["paused"] is False


def test_a_pause_holds_the_batch_that_was_waiting_for_the_rate(pair):
    """At one point a second, the second batch waits five seconds for its points; a pause set
    meanwhile holds it too: it is not claimed once the bucket lets it go."""
    store, stop, events = pair, threading.Event(), []
    run = threading.Thread(
        target=lambda: migrate(store, "p", batch=BATCH, rate=1.0, stop=stop, on_pause=events.append)
    )
    run.start()
    try:
        _wait_for(lambda: _in_new(store) == BATCH)  # the first batch went at once, the next waits
        pause(store, "p")
        _wait_for(lambda: events == [True])
        time.sleep(1.5)  # a batch let go would have settled by now
        assert _in_new(store) == BATCH
    finally:
        stop.set()
        run.join(60)


def test_a_pair_made_again_under_a_dropped_ones_name_starts_with_no_pace_and_no_pause(pair, models):
    """A run of the dropped pair still going (here: paused after a batch) writes its last progress
    after the drop; the new pair of that name shows none of it, and is not paused."""
    store, events, outcome = pair, [], {}

    def run():
        try:
            migrate(store, "p", batch=BATCH, on_batch=lambda _: pause(store, "p"), on_pause=events.append)
        except MigrationError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_for(lambda: events == [True])
    drop_pair(store, "p", force=True)
    thread.join(60)
    assert "error" in outcome
    left = store.count("old")
    create_pair(store, "p", old_collection="old", new_collection="again", encoder=OnnxEncoder(models.rm))
    s = status(store, "p").status
    assert (s.paused_since, s.points_per_second, s.migrating_now) == (None, None, 0)
    assert migrate(store, "p", batch=BATCH).moved == left  # and nothing holds it


def test_a_run_held_by_a_pause_still_says_it_is_running(pair, monkeypatch):
    """Its heartbeat keeps its progress record fresh between batches: status counts it as
    migrating now however long the pause, and the pace takes the time that passes."""
    monkeypatch.setattr(progress, "HEARTBEAT", 0.3)
    store, events, stop = pair, [], threading.Event()
    pause(store, "p")
    run = threading.Thread(target=lambda: migrate(store, "p", batch=BATCH, stop=stop, on_pause=events.append))
    run.start()
    try:
        _wait_for(lambda: events == [True])
        first = max(w.updated for w in progress.workers(store, "p"))
        _wait_for(lambda: max(w.updated for w in progress.workers(store, "p")) > first + 0.2)
        assert status(store, "p").status.migrating_now == 1
    finally:
        stop.set()
        run.join(30)
    assert status(store, "p").status.migrating_now == 0  # the run ended: its record says so
