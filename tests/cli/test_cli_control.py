"""``rmq pause``, ``rmq resume``, ``rmq status`` (pace, ETA, --watch) and ``rmq migrate --rate``
as a user types them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rm_qdrant.cli.status import duration, watching
from tests.conftest import one_error_line


def test_pause_and_resume_show_in_status_and_say_when_nothing_changed(rmq, demo):
    assert "paused demo" in rmq("pause", "demo").output
    assert "already paused" in rmq("pause", "demo").output
    text = rmq("status", "--name", "demo").output
    assert "backfilling, PAUSED)" in text and "rmq resume demo lets them go on" in text
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["paused"] is True
    assert "resumed demo" in rmq("resume", "demo").output
    assert "was not paused" in rmq("resume", "demo").output
    assert "PAUSED" not in rmq("status", "--name", "demo").output


def test_a_migrate_started_paused_waits_and_says_so(rmq, demo, tmp_path):
    """In a process of its own: the pause flag stops it claiming; SIGINT ends it cleanly."""
    rmq("pause", "demo")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rm_qdrant", "--qdrant", str(tmp_path / "q"), "migrate", "--name", "demo"],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        while line and "paused by rmq pause" not in line:
            line = proc.stderr.readline()
        assert "waiting for 'rmq resume demo'" in line
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "moved 0 points" in out and "stopped early" in out


@pytest.mark.parametrize(
    "args",
    [
        ("pause", "nope"),
        ("resume", "nope"),
        ("migrate", "--name", "demo", "--rate", "0"),
        ("migrate", "--name", "demo", "--rate", "-3"),
        ("migrate", "--name", "demo", "--rate", "nan"),
        ("migrate", "--name", "demo", "--rate", "inf"),
        ("status", "--name", "demo", "--watch", "0"),
        ("status", "--name", "demo", "--watch", "1e10"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(rmq, demo, args):
    before = rmq("status", "--name", "demo", "--json").output
    one_error_line(rmq(*args, ok=False))
    after = rmq("status", "--name", "demo", "--json").output
    assert json.loads(after)["new_count"] == json.loads(before)["new_count"] == 0
    assert json.loads(after)["order"] is None  # not even ranked


def test_pause_of_a_finalized_pair_says_it_is_not_migrating(rmq, demo):
    rmq("migrate", "--name", "demo")
    rmq("finalize", "--name", "demo")
    assert "is finalized, not migrating" in one_error_line(rmq("pause", "demo", ok=False))


def test_status_after_a_partial_run_shows_pace_and_eta(rmq, demo):
    rmq("migrate", "--name", "demo", "--until", "0.5", "--batch", "4", "--rate", "1000")
    text = rmq("status", "--name", "demo").output
    pace = next(line for line in text.splitlines() if line.startswith("pace"))
    eta = next(line for line in text.splitlines() if line.startswith("eta"))
    assert "points/s over the last" in pace and "0 processes migrating now" in pace
    data = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert f"for {data['remaining']:,} points" in eta
    assert data["eta_seconds"] == pytest.approx(data["remaining"] / data["points_per_second"])


def test_watch_refreshes_until_stopped_and_lets_go_of_the_embedded_store(rmq, demo, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rm_qdrant", "--qdrant", str(tmp_path / "q"), "status", "--name", "demo"]
        + ["--watch", "0.3", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        frames = [json.loads(proc.stdout.readline()) for _ in range(2)]
        # between refreshes the store is closed: this process can open it
        for _ in range(50):
            result = rmq("pause", "demo", ok=False)
            if result.exit_code == 0:
                break
            time.sleep(0.05)
        assert result.exit_code == 0, result.output
        while not json.loads(proc.stdout.readline())["paused"]:
            pass
    finally:
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert [f["name"] for f in frames] == ["demo", "demo"]


def test_watching_prints_a_frame_each_time_over_the_last():
    import threading

    stop, count = threading.Event(), []

    def frame():
        count.append(1)
        if len(count) == 3:
            stop.set()
        return f"frame {len(count)}"

    from click.testing import CliRunner

    runner = CliRunner()
    with runner.isolation() as (out, _, _):
        watching(frame, every=0.01, clear=True, stop=stop)
        text = out.getvalue().decode()
    assert text.count("\x1b[H\x1b[2J") == 3 and "frame 3" in text


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0, 59.6, 61, 3600, 4331, 90_000)] == [
        "0 s",
        "1 min 0 s",
        "1 min 1 s",
        "1 h 0 min",
        "1 h 12 min",
        "1 d 1 h",
    ]


def _write_meta(tmp_path, kind, key, payload) -> None:
    """A point of ``rmq_meta`` written as an operator's hand edit (or another version) would."""
    from rm_qdrant import open_store
    from rm_qdrant.pair.record import _put

    with open_store(tmp_path / "q") as store:
        _put(store, kind, key, payload)


@pytest.mark.parametrize(
    "since",
    ["yesterday", None, [1], 1e300, -1e20, True],
    ids=["text", "null", "list", "far-future", "far-past", "bool"],
)
def test_a_hand_edited_pause_flag_still_holds_and_never_crashes_a_command(rmq, demo, tmp_path, since):
    """The flag's time cannot be read: status says paused since an unknown time (exit 0), resume
    lowers the flag, and the migration then moves the whole gallery."""
    flag = {"kind": "control", "name": "demo", "paused": True, "since": since}
    _write_meta(tmp_path, "control", "demo", flag)
    text = rmq("status", "--name", "demo").output
    assert "backfilling, PAUSED)" in text and "since an unknown time" in text
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["paused"] is True
    assert "already paused" in rmq("pause", "demo").output
    assert "resumed demo" in rmq("resume", "demo").output
    rmq("migrate", "--name", "demo")
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["remaining"] == 0


@pytest.mark.parametrize(
    "record",
    [
        {"started": "abc", "updated": 1.0, "buckets": {}},
        {"started": 1.0, "updated": 1.0, "buckets": [1, 2]},
        {"started": 1.0, "updated": 1.0, "buckets": {"zz": 1}},
        {"started": 1.0, "updated": 1.0, "buckets": {"10": "many"}},
        {"started": 1.0, "updated": "soon", "buckets": {}},
        {},
    ],
    ids=["started-text", "buckets-list", "bucket-key", "bucket-count", "updated-text", "empty"],
)
def test_a_hand_edited_progress_record_is_left_out_of_the_pace_and_removed_by_the_next_run(
    rmq, demo, tmp_path, record, caplog
):
    payload = {"kind": "progress", "name": "demo", "worker": "edited", **record}
    _write_meta(tmp_path, "progress", "demo/edited", payload)
    assert "pace          - (no point moved" in rmq("status", "--name", "demo").output
    assert [r.message for r in caplog.records if "progress record" in r.message] == [
        "pair 'demo': 1 progress record(s) in rmq_meta not as rm-qdrant writes them, left out of the "
        "pace (the next rmq migrate removes them)"
    ]
    rmq("migrate", "--name", "demo", "--until", "0.5", "--batch", "4")  # a pace takes two batches
    caplog.clear()
    rmq("status", "--name", "demo")
    assert not [r for r in caplog.records if "progress record" in r.message]  # the run removed it
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["points_per_second"] > 0


@pytest.mark.parametrize("kind", ["edge", "local"])
def test_watch_goes_on_while_a_migration_holds_the_embedded_store(rmq, models, image_folder, tmp_path, kind):
    """A run takes the embedded store (qdrant-edge's, or qdrant-client's local-mode folder)
    between two refreshes: the watch says so in each refresh and shows the status again once the
    store is free, instead of ending in an error."""
    from qdrant_client import QdrantClient

    from rm_qdrant import StoreLocked, open_store

    if kind == "local":
        QdrantClient(path=str(tmp_path / "q")).close()
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)

    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(tmp_path / "q"), "status"]
    proc = subprocess.Popen(
        [*command, "--name", "demo", "--watch", "0.3", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(proc.stdout.readline())["name"] == "demo"
        for _ in range(100):  # as a migration would: open the store between two refreshes
            try:
                held = open_store(tmp_path / "q")
                break
            except StoreLocked:
                time.sleep(0.05)
        with held:
            frame = json.loads(proc.stdout.readline())
            while "locked" not in frame:
                frame = json.loads(proc.stdout.readline())
            assert frame["name"] == "demo" and "another" in frame["locked"]
        while "locked" in frame:
            frame = json.loads(proc.stdout.readline())
        assert frame["new_count"] == 0
    finally:
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "Error" not in err
