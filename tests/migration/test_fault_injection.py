"""Kill a real `rmq migrate` process with SIGKILL, over and over, and lose nothing."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from rm_qdrant import DualIndex, open_store, scan_image_folder
from rm_qdrant.cli import cli
from tests.conftest import make_image_folder

pytestmark = pytest.mark.slow


def schedule(batch_kills: int) -> list[tuple[str | None, tuple[float, float]]]:
    """Where each kill lands: (the log line to wait for, or None; a window for the random delay
    after it, in s). Every kill costs a process start (~3 s of imports), so the kills go where
    they tell something apart: one in start-up, one while the first run ranks the gallery (its
    writes come within about 0.4 s of the encoder loading), then one in each of ``batch_kills``
    slices of the first 50 ms of batches (a batch of 10 takes about 5 ms: mark, copy, read
    back, retire)."""
    width = 0.05 / batch_kills
    batches = [("acknowledged", (k * width, (k + 1) * width)) for k in range(batch_kills)]
    return [(None, (0.1, 0.7)), ("loaded encoder", (0.0, 0.2)), *batches]


def kill_once(command, log, marker, window, rng):
    """Start ``command``, wait for ``marker`` in its log (stderr), wait a random moment of
    ``window``, SIGKILL it."""
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        # however long a busy machine takes to get there: the run either logs it or ends
        while marker is not None and marker not in log.read_text() and proc.poll() is None:
            time.sleep(0.01)
        assert marker is None or marker in log.read_text(), f"the run ended without logging {marker!r}"
        time.sleep(rng.uniform(*window))
        assert proc.poll() is None, "the migration finished before it was killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


SCHEDULE = schedule(6)
KILLS = len(SCHEDULE)


def rmq(store_path, *args, ok=True):
    result = CliRunner().invoke(cli, ["--qdrant", str(store_path), *map(str, args)])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def build(store_path, images, models):
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)


def search_everything(store_path, items):
    with open_store(store_path) as store, DualIndex.open(store, "p", exact=True) as index:
        results = index.search_batch([i.uri for i in items[::25]], limit=len(items))
        return [[(h.id, round(h.distance, 5)) for h in hits] for hits in results]


def test_sigkill_at_random_moments_loses_nothing(tmp_path, models):
    # 1,200 real image files: the kills move at most about 100 points each, so the final run
    # still has hundreds to move.
    images = make_image_folder(tmp_path / "images", per_class=400)
    items = scan_image_folder(images)
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    build(killed, images, models)
    build(reference, images, models)
    rmq(reference, "migrate", "--name", "p", "--batch", "50")

    rng = random.Random(1)
    logs = []
    command = [
        sys.executable,
        "-m",
        "rm_qdrant",
        "--qdrant",
        str(killed),
        "-vv",
        "migrate",
        "--name",
        "p",
        "--batch",
        "10",
        "--json",
    ]
    for marker, window in SCHEDULE:
        logs.append(tmp_path / f"run{len(logs)}.log")
        kill_once(command, logs[-1], marker, window, rng)
    final = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr

    with open_store(killed) as store:
        assert store.count("old") == 0
        assert store.count("p-new") == len(items)  # every id in exactly one collection, none lost
        new_ids = set()
        offset = None
        while True:
            page, offset = store.scroll("p-new", limit=1000, offset=offset)
            new_ids |= {r.id for r in page}
            if offset is None:
                break
        assert new_ids == {i.point_id for i in items}
    status = json.loads(rmq(killed, "status", "--name", "p", "--json").output)
    assert (status["failed"], status["old_count"], status["fraction"]) == (0, 0, 1.0)
    assert search_everything(killed, items) == search_everything(reference, items)

    # No point was embedded again once its upsert had been acknowledged.
    acknowledged: set[str] = set()
    for log in [*logs, None]:
        text = final.stderr if log is None else log.read_text()
        for kind, ids in re.findall(r"(encoded|acknowledged) \[([^\]]*)\]", text):
            batch = set(re.findall(r"'([^']+)'", ids))
            if kind == "encoded":
                assert not batch & acknowledged, "re-embedded after its upsert was acknowledged"
            else:
                acknowledged |= batch
    # (a kill between an upsert and its log line hides that batch from the logs; the
    # next run then repairs it without encoding it, which the check above covers)
    assert len(acknowledged) > len(items) - KILLS * 10


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_stop_cleanly_after_the_batch(tmp_path, models, image_folder, http_images, sig):
    store_path = tmp_path / "q"
    build(store_path, image_folder, models)
    # Every image comes from a slow HTTP source (1.5 s each), so the signal surely lands mid-run.
    with open_store(store_path) as store:
        store.set_payload(
            "old",
            [
                (i.point_id, {"uri": f"{http_images}/slow/{i.label}/{i.uri.rsplit('/', 1)[1]}"})
                for i in scan_image_folder(image_folder)
            ],
        )
    log = tmp_path / "run.log"
    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store_path), "-vv"]
    command += [
        "migrate",
        "--name",
        "p",
        "--batch",
        "4",
        "--fetch-workers",
        "4",
        "--allow-private-network",
        "--json",
    ]
    with log.open("w") as err_file:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err_file, text=True)
        while "acknowledged" not in log.read_text() and proc.poll() is None:  # however long that takes
            time.sleep(0.01)
        assert "acknowledged" in log.read_text(), "the run ended before its first batch was acknowledged"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    err = log.read_text()
    assert proc.returncode == 0, err
    report = json.loads(out)
    with open_store(store_path) as store:
        assert store.count("old") + store.count("p-new") == 24
        assert 0 < store.count("p-new") < 24
        assert store.count("p-new") == report["moved"]  # every settled batch reported, none half-done
    assert report["stopped_early"] is True
