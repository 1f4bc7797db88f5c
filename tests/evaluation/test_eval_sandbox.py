"""``rmq eval`` measures a copy: the live store is free while it measures, and no copy outlives it.

Each eval here runs as a real ``rmq`` process whose measurement waits, after the copy,
until the test lets it go on (a line on its stdin), so every check is deterministic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from qdrant_client import QdrantClient

from tests.conftest import make_image_folder, settled
from tests.migration.test_fault_injection import rmq

pytestmark = pytest.mark.slow

# Runs rmq with the measurement held: after the copy, it writes MARKER and waits for a line on stdin.
HELD = textwrap.dedent(
    """
    import pathlib, sys
    import rm_qdrant.cli.evaluate as evaluate
    real, marker = evaluate.evaluate_served, pathlib.Path(sys.argv[1])
    def held(*args, **kwargs):
        marker.write_text("copied")
        sys.stdin.readline()
        return real(*args, **kwargs)
    evaluate.evaluate_served = held
    from rm_qdrant.cli import main
    sys.argv = ["rmq", *sys.argv[2:]]
    main()
    """
)


@pytest.fixture
def live(tmp_path, models):
    """A backfilling pair in an embedded store, its queries, and a private temporary folder."""
    store_path, images = tmp_path / "q", make_image_folder(tmp_path / "g", per_class=4)
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "photos", "--encoder", models.rm)
    rmq(store_path, "migrate", "--name", "p", "--until", "0.25")
    temp = tmp_path / "tmp"
    temp.mkdir()
    return store_path, images, temp


def eval_args(store_path, images):
    return [
        "--qdrant",
        str(store_path),
        "eval",
        "--name",
        "p",
        "--queries",
        str(images),
        "--at",
        "0,1",
        "--json",
    ]


def start_held(live, marker):
    """An ``rmq eval`` process held after its copy (returns once the copy is made)."""
    store_path, images, temp = live
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD, str(marker), *eval_args(store_path, images)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    while not marker.exists() and proc.poll() is None:  # however long a busy machine takes
        time.sleep(0.02)
    if not marker.exists():
        proc.kill()
        pytest.fail(f"eval never reached its measurement: {proc.communicate()[1][-2000:]}")
    return proc


def sandboxes(temp):
    return {p.name for p in temp.glob("rmq-eval-*")}


def test_the_live_pair_is_free_while_eval_measures_and_a_killed_evals_copy_goes_next_time(live, tmp_path):
    store_path, images, temp = live
    status = settled(rmq(store_path, "status", "--name", "p", "--json").output)
    held = start_held(live, tmp_path / "held")
    try:
        during = rmq(store_path, "status", "--name", "p", "--json", ok=False)  # while eval measures its copy
        assert during.exit_code == 0, during.output
        assert json.loads(during.output)["new_count"] == status["new_count"]
        mine = sandboxes(temp)
        killed = start_held(live, tmp_path / "killed")
        stale = sandboxes(temp) - mine
        os.kill(killed.pid, signal.SIGKILL)
        killed.communicate()
        assert len(stale) == 1 and sandboxes(temp) == mine | stale  # what a SIGKILL leaves behind
        again = subprocess.run(
            [sys.executable, "-m", "rm_qdrant", *eval_args(store_path, images)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TMPDIR": str(temp)},
        )
        assert again.returncode == 0, again.stderr
        assert sandboxes(temp) == mine  # the dead eval's copy is gone; the live one's is not
        out, err = held.communicate("go\n", timeout=300)
        assert held.returncode == 0, err
        assert [p["t"] for p in json.loads(out)["points"]] == [0.0, 1.0]
    finally:
        if held.poll() is None:
            held.kill()
            held.communicate()
    assert sandboxes(temp) == set()
    assert settled(rmq(store_path, "status", "--name", "p", "--json").output) == status  # never moved


def test_sigterm_stops_eval_in_one_line_and_removes_its_copy(live, tmp_path):
    store_path, _, temp = live
    held = start_held(live, tmp_path / "held")
    assert len(sandboxes(temp)) == 1
    held.send_signal(signal.SIGTERM)
    out, err = held.communicate(timeout=120)
    assert held.returncode == 1 and out == ""
    assert err.strip().splitlines()[-1].startswith("Error: ") and "Traceback" not in err, err
    assert "SIGTERM" in err
    assert sandboxes(temp) == set()
    assert json.loads(rmq(store_path, "status", "--name", "p", "--json").output)["fraction"] == 0.25


def test_eval_of_a_ranked_pair_in_a_qdrant_client_folder_measures_what_in_place_measures(tmp_path, models):
    # qdrant-client's local mode keeps no payload indexes; the copy still orders the backfill by rank.
    store_path, images = tmp_path / "local", make_image_folder(tmp_path / "g", per_class=4)
    QdrantClient(path=str(store_path)).close()  # an empty QdrantClient(path=...) folder
    rmq(store_path, "index", "--collection", "photos", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "photos", "--encoder", models.rm)
    rmq(store_path, "migrate", "--name", "p", "--until", "0.25")  # ranked
    status = settled(rmq(store_path, "status", "--name", "p", "--json").output)
    args = ["eval", "--name", "p", "--queries", images, "--at", "0.5,1", "--batch", "4", "--json"]

    on_copy = rmq(store_path, *args, ok=False)
    assert on_copy.exit_code == 0, on_copy.output
    assert settled(rmq(store_path, "status", "--name", "p", "--json").output) == status  # not moved
    in_place = json.loads(rmq(store_path, *args, "--in-place").stdout)

    copied = json.loads(on_copy.stdout)
    assert [p["fraction"] for p in copied["points"]] == [p["fraction"] for p in in_place["points"]]
    for key in ("map", "top1"):
        assert [p[key] for p in copied["points"]] == pytest.approx(
            [p[key] for p in in_place["points"]], abs=1e-6
        )
