"""``rmq migrate --engine ray`` on a local Ray and real stores: the same end state as the local
engine, the same guarantees under kills and stops, the same failure records.

Tests that need Ray are skipped, with the reason, where it is not installed.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from rm_qdrant import (
    DualIndex,
    OnnxEncoder,
    RayOptions,
    create_pair,
    index_images,
    open_store,
    scan_image_folder,
)
from rm_qdrant.cli import cli
from rm_qdrant.core.planning import BATCH, ERROR
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration.migrate import MigrateOptions, MigrationReport, run_migration
from rm_qdrant.store import Where
from tests.conftest import make_image_folder, one_error_line
from tests.migration.test_migrate_faults import nan_encoder

pytestmark = pytest.mark.slow

N = 30
LAYOUTS = {
    "paired": {},
    "keep-old": {"keep_old": True},
    "single": {"layout": "single-collection", "new_vector": "new"},
}


def gallery(store, models, folder: Path, layout: str, encoder: Path | None = None) -> None:
    """N real images indexed into 'old' by the old model, and a pair 'p' over them."""
    items = scan_image_folder(folder)
    index_images(store, "old", OnnxEncoder(models.old), items)
    extra = LAYOUTS[layout]
    old = OnnxEncoder(models.old) if extra.get("keep_old") else None
    create_pair(
        store, "p", old_collection="old", encoder=OnnxEncoder(encoder or models.rm), old_encoder=old, **extra
    )


def snapshot(store) -> dict:
    """Every point of every collection: payload and vectors, as the store returns them."""
    seen = {}
    for name in store.list_collections():
        records, _ = store.scroll(name, limit=10_000, with_vectors=True)
        # each run records its own progress (a point per process, for the pace): not the gallery
        seen[name] = {r.id: (r.payload, r.vector) for r in records if r.payload.get("kind") != "progress"}
    return seen


def _tokenless(payload: dict) -> dict:
    """A payload with its batch token (random per run) shown as there or not."""
    return {k: (v if k != BATCH else "token") for k, v in payload.items()}


def same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for point, (payload, vector) in a[name].items():
            other_payload, other_vector = b[name][point]
            assert _tokenless(payload) == _tokenless(other_payload), (name, point)
            assert np.array_equal(np.asarray(vector), np.asarray(other_vector)), (name, point)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_both_engines_end_with_identical_vectors_and_payloads(models, tmp_path, local_ray, layout):
    """The shapes matrix (test_shapes_matrix.py) runs --engine ray over distances, scales,
    vector layouts, id types and both stores; this compares it with the local engine directly."""
    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    store, reference = open_store(tmp_path / "q"), open_store(tmp_path / "ref")
    gallery(reference, models, folder, layout)
    gallery(store, models, folder, layout)
    local = run_migration(DualIndex.open(reference, "p"), MigrateOptions(batch=7))
    ray = run_migration(
        DualIndex.open(store, "p"), MigrateOptions(batch=7), ray=RayOptions(encoders=2, decoders=2)
    )
    assert (ray.moved, ray.failed, ray.stopped_early) == (local.moved, local.failed, False) == (N, 0, False)
    same(snapshot(store), snapshot(reference))
    store.close()
    reference.close()


def test_a_poison_image_and_a_nan_are_recorded_as_the_local_engine_records_them(models, tmp_path, local_ray):
    """A file that is no image, a missing file and an image the encoder turns into NaN: each
    point failed with its reason, the others moved, by either engine alike."""
    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    black = tmp_path / "black.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(black)
    poison = tmp_path / "poison.jpg"
    poison.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    graph = nan_encoder(tmp_path / "nan.onnx", models)
    ends = []
    for engine in ("local", "ray"):
        with open_store(tmp_path / f"q-{engine}") as store:
            gallery(store, models, folder, "paired", encoder=graph)
            ids = sorted(r.id for r in store.scroll("old", limit=100)[0])
            bad = {ids[1]: str(black), ids[4]: str(poison), ids[7]: str(tmp_path / "missing.png")}
            store.set_payload("old", [(i, {"uri": uri}) for i, uri in bad.items()])
            ray = RayOptions(encoders=1, decoders=2) if engine == "ray" else None
            report = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=8), ray=ray)
            failed = {
                r.id: r.payload[ERROR]
                for r in store.scroll("old", limit=100, where=Where(not_empty=(ERROR,)))[0]
            }
            ends.append((report.moved, report.failed, failed))
    assert ends[0] == ends[1]
    moved, count, failed = ends[1]
    assert (moved, count, set(failed)) == (N - 3, 3, set(bad))
    assert "NaN" in failed[ids[1]] and "poison.jpg" in failed[ids[4]] and "missing.png" in failed[ids[7]]


def test_the_drivers_metrics_carry_the_ray_workers_stage_seconds(models, tmp_path, local_ray):
    """``--engine ray --metrics-port``: the driver serves the seconds its decode tasks and encoder
    actors spent, one observation a batch, beside its own write seconds."""
    from rm_qdrant import migrate
    from tests.monitoring.test_migration_metrics import free_port, scrape, value

    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    port, seen = free_port(), []
    with open_store(tmp_path / "q") as store:
        gallery(store, models, folder, "paired")
        report = migrate(
            store,
            "p",
            batch=10,
            engine=RayOptions(encoders=1, decoders=2),
            metrics_port=port,
            on_batch=lambda result: seen.append((result, scrape(port))),
        )
    assert report.moved == N and len(seen) == N // 10
    result, samples = seen[-1]
    assert value(samples, "rmq_migrate_moved_points_total") == N
    for stage in ("fetch", "decode", "encode", "write"):
        assert value(samples, "rmq_migrate_batch_seconds_count", stage=stage) == N // 10
        assert value(samples, "rmq_migrate_batch_seconds_sum", stage=stage) == pytest.approx(
            sum(r.stages[stage] for r, _ in seen)
        )
    assert all(r.stages["decode"] > 0 and r.stages["encode"] > 0 for r, _ in seen)  # measured on Ray


def _encoder_actor_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"ray::EncoderActor" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_a_killed_encoder_actor_is_restarted_and_the_run_loses_nothing(models, tmp_path, local_ray):
    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    with open_store(tmp_path / "ref") as reference:
        gallery(reference, models, folder, "paired")
        run_migration(DualIndex.open(reference, "p"), MigrateOptions(batch=5))
        expected = snapshot(reference)
    killed = []

    def kill_an_encoder(result) -> None:
        if not killed:
            pids = _encoder_actor_pids()
            assert pids, "no encoder actor is running"
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    with open_store(tmp_path / "q") as store:
        gallery(store, models, folder, "paired")
        report = run_migration(
            DualIndex.open(store, "p"),
            MigrateOptions(batch=5),
            ray=RayOptions(encoders=1, decoders=1),
            on_batch=kill_an_encoder,
        )
        assert killed and (report.moved, report.failed) == (N, 0)
        same(snapshot(store), expected)


# -- the CLI, in processes of its own --------------------------------------------------------

#: ``rmq`` that SIGKILLs itself before its Nth store write (the ranking already done).
KILL_AT_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from rm_qdrant.store.edge import EdgeStore
    from tests.faults import WRITES
    n = int(os.environ["RMQ_KILL_AT"])
    count = [0]
    def wrap(name):
        real = getattr(EdgeStore, name)
        def write(self, *args, **kwargs):
            count[0] += 1
            if count[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, *args, **kwargs)
        return write
    for name in WRITES:
        if hasattr(EdgeStore, name):
            setattr(EdgeStore, name, wrap(name))
    from rm_qdrant.cli import main
    sys.argv = ["rmq", *sys.argv[1:]]
    main()
    """
)
RAY_ARGS = ["--engine", "ray", "--encoders", "1", "--decoders", "1"]


def run_rmq(store_path: Path, *args, ok: bool = True):
    result = CliRunner().invoke(cli, ["--qdrant", str(store_path), *map(str, args)])
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize(("layout", "kill_at"), [("paired", 4), ("single", 7)])
def test_sigkill_of_the_driver_then_a_rerun_loses_and_reembeds_nothing(models, tmp_path, layout, kill_at):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    with open_store(tmp_path / "ref") as reference:
        gallery(reference, models, folder, layout)
        run_migration(DualIndex.open(reference, "p"), MigrateOptions(batch=6))
        expected = snapshot(reference)
    store_path = tmp_path / "q"
    with open_store(store_path) as store:
        gallery(store, models, folder, layout)
    run_rmq(store_path, "migrate", "--name", "p", "--prepare")
    args = ["--qdrant", str(store_path), "migrate", "--name", "p", "--batch", "6", *RAY_ARGS]
    env = {**os.environ, "RMQ_KILL_AT": str(kill_at)}
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_WRITE, *args],
        capture_output=True,
        env=env,
        timeout=300,
        cwd=Path.cwd(),
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    before = json.loads(run_rmq(store_path, "status", "--name", "p", "--json").output)
    assert 0 < before["new_count"] < N  # killed mid-run, some batch written
    rerun = json.loads(
        run_rmq(store_path, "migrate", "--name", "p", "--batch", "6", *RAY_ARGS, "--json").output
    )
    # a point the killed run had written is not embedded again (at most confirmed, or retired)
    assert rerun["moved"] == N - before["new_count"] and rerun["failed"] == 0
    with open_store(store_path) as store:
        same(snapshot(store), expected)


def test_sigterm_stops_without_waiting_for_the_fetches_under_way(tmp_path, models, trickling_server):
    """Every image comes from a server that sends its headers a byte every 0.3 s, forever: the
    run stops at SIGTERM, writes nothing and marks nothing failed, and no fetch starts after."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    connections = trickling_server.connections
    store_path = tmp_path / "q"
    with open_store(store_path) as store:
        gallery(store, models, make_image_folder(tmp_path / "g", per_class=N // 3), "paired")
    run_rmq(store_path, "migrate", "--name", "p", "--prepare")  # ranked: the run fetches no sample first
    with open_store(store_path) as store:
        ids = [r.id for r in store.scroll("old", limit=100)[0]]
        store.set_payload("old", [(i, {"uri": f"{trickling_server.url}/{k}.jpg"}) for k, i in enumerate(ids)])
    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store_path), "migrate", "--name", "p"]
    command += ["--timeout", "4", "--batch", "8", "--fetch-workers", "2", *RAY_ARGS]
    command += ["--allow-private-network", "--json"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The one decode task's 2 fetch threads are connected, however long Ray took to start; the
    # next attempt would come at their 4 s deadline
    while len(connections) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert len(connections) == 2, proc.communicate()[1][-2000:]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out)["stopped_early"] is True
    # The fetches under way were cancelled: a run that waited for them would retry each (3
    # attempts of 4 s) and connect again; one that began the next batch would too.
    assert len(connections) == 2, f"{len(connections) - 2} fetch attempts began after SIGTERM"
    with open_store(store_path) as store:
        assert store.count("old") == N and store.count("old", Where(not_empty=(ERROR,))) == 0


SIGTERM_MID_BATCH = textwrap.dedent(
    """
    import os, signal, sys, time
    from rm_qdrant import OnnxEncoder, RayOptions
    from rm_qdrant.migration.ray_engine import RayEngine
    from rm_qdrant.cli.migrate import stop_on_signals
    from rm_qdrant.core.uris import UriRule
    from rm_qdrant.sources import SourceConfig
    with stop_on_signals(echo=False) as stop:
        engine = RayEngine(
            RayOptions(encoders=1, decoders=1), OnnxEncoder(sys.argv[1]), output="new",
            distance="cosine", source=SourceConfig(), rule=UriRule(), fetch_workers=None, halt=stop,
        )
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(4)  # the batch in flight takes longer to finish than Ray's 3 s
        engine.close()
    print("stopped after the batch" if stop.is_set() else "SIGTERM was not seen")
    """
)


def test_sigterm_while_a_batch_takes_long_to_finish_still_stops_cleanly(models):
    """Ray's driver puts a crash reporter under SIGTERM that aborts the process 3 s after the
    signal: a run whose batch in flight took longer to finish died with SIGABRT (a stack on
    stderr, no summary) instead of stopping after it."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_MID_BATCH, str(models.rm)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped after the batch"
    assert "SIGTERM received" not in done.stderr


# -- bad input: one line, exit 1 ---------------------------------------------------------------


def test_ray_options_without_the_ray_engine_are_refused(rmq, demo):
    result = rmq("migrate", "--name", "demo", "--encoders", "2", ok=False)
    assert result.exit_code == 1 and "--encoders: only with --engine ray" in one_error_line(result)


def test_the_ray_engine_without_ray_says_how_to_install_it(rmq, demo, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = rmq("migrate", "--name", "demo", "--engine", "ray", ok=False)
    assert result.exit_code == 1 and "pip install 'rm-qdrant[ray]'" in one_error_line(result)


class _Cluster:
    """What ``ray.cluster_resources()`` answers, for RayEngine's resource check alone."""

    def __init__(self, **resources: float) -> None:
        self.resources = resources

    def cluster_resources(self) -> dict:
        return self.resources


@pytest.mark.parametrize(
    ("address", "have", "options", "refused"),
    [
        (
            "local",
            {"CPU": 2},
            RayOptions(gpus_per_encoder=1),
            "this machine's Ray has 0 GPUs, and --encoders 1",
        ),
        ("local", {"CPU": 3, "GPU": 1}, RayOptions(encoders=2, gpus_per_encoder=0.5), None),
        (
            "auto",
            {"CPU": 64},
            RayOptions(encoders=2, gpus_per_encoder=1),
            None,
        ),  # warned: an autoscaler may add them
        ("auto", {"CPU": 2}, RayOptions(encoders=2), "has 2 CPUs: --encoders 2 take one each"),
        ("auto", {"CPU": 3}, RayOptions(encoders=2, decoders=8), None),  # one decode task at a time
    ],
)
def test_resources_the_run_could_never_get_are_refused(address, have, options, refused):
    from rm_qdrant.migration.ray_engine import RayEngine

    engine = object.__new__(RayEngine)
    engine.ray, engine.options, engine.address = _Cluster(**have), options, address
    if refused is None:
        engine._check_room()
    else:
        with pytest.raises(ConfigError, match=re.escape(refused)):
            engine._check_room()


def test_encoders_that_leave_no_cpu_to_decode_are_refused(models, tmp_path, local_ray):
    """The tests' Ray has 4 CPUs: 4 encoder actors would take them all, and no decode task
    could ever run."""
    folder = make_image_folder(tmp_path / "g", per_class=N // 3)
    with open_store(tmp_path / "q") as store:
        gallery(store, models, folder, "paired")
        with pytest.raises(ConfigError, match="has 4 CPUs: --encoders 4 take one each"):
            run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=7), ray=RayOptions(encoders=4))
        assert store.count("p-new") == 0


#: ``rmq`` with Ray's start-up bounded at 3 s instead of 120.
SHORT_START = textwrap.dedent(
    """
    import sys
    import rm_qdrant.migration.ray_engine as engine
    engine.START_TIMEOUT = 3.0
    from rm_qdrant.cli import main
    sys.argv = ["rmq", *sys.argv[1:]]
    main()
    """
)


def test_ray_address_where_nothing_answers_is_one_error_line(rmq, demo, tmp_path):
    """RAY_ADDRESS (set by ``ray job submit``) is the cluster when --ray-address is not given."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    args = ["--qdrant", str(tmp_path / "q"), "migrate", "--name", "demo", *RAY_ARGS, "--json"]
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    result = subprocess.run(
        [sys.executable, "-c", SHORT_START, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: cannot start or reach Ray at 127.0.0.1:1 within 3 s"
    ), result.stderr
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["new_count"] == 0


def test_sigterm_while_ray_starts_stops_the_run_at_once(rmq, demo, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    command = [
        sys.executable,
        "-m",
        "rm_qdrant",
        "--qdrant",
        str(tmp_path / "q"),
        "migrate",
        "--name",
        "demo",
    ]
    command += [*RAY_ARGS, "--ray-address", "127.0.0.1:1"]  # nothing answers: start-up never ends
    log = tmp_path / "run.log"
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        # the progress line comes once the plan is made, just before Ray starts
        while "migrating demo" not in log.read_text() and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log.read_text()
    assert "stopped early: run the same command again to continue" in out
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["new_count"] == 0


def test_header_variables_are_read_where_rmq_runs(monkeypatch):
    from rm_qdrant.migration.ray_engine import sent
    from rm_qdrant.sources import SourceConfig
    from rm_qdrant.sources.settings import header_values

    monkeypatch.setenv("CDN_TOKEN", "s3cr$t")
    config = SourceConfig(headers=(("Authorization", "Bearer $CDN_TOKEN"),))
    shipped = sent(config)
    monkeypatch.delenv("CDN_TOKEN")  # a worker's environment lacks it
    assert header_values(shipped.headers) == {"Authorization": "Bearer s3cr$t"}


def test_what_ray_prints_on_the_drivers_stdout_stays_out_of_the_json_report(rmq, demo, monkeypatch):
    """Ray's raylet reports (a task retried after an actor died, say) reach the driver's stdout:
    with --json that would break the report (seen when a stop killed actors with calls in flight)."""
    worker = pytest.importorskip("ray._private.worker", reason="Ray is not installed")
    command = importlib.import_module("rm_qdrant.cli.migrate")  # the module, not the click command

    def run(*args, **kwargs):
        line = "Task EncoderActor.encode failed. There are 3 retries remaining"
        worker.print_to_stdstream({"lines": [line], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        return MigrationReport(stopped_early=True)

    monkeypatch.setattr(command, "run_migration", run)
    result = rmq("migrate", "--name", "demo", "--engine", "ray", "--json")
    assert json.loads(result.stdout)["stopped_early"] is True
    assert "EncoderActor.encode failed" in result.stderr
