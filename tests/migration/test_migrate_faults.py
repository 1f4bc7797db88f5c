"""The migration and the cutover under faults: bad sources, a NaN encoder, kills at each write.

What a user must see: every bad point recorded with its reason while the run goes
on, counts that stay true after a kill, and a rerun of the same command that
finishes whatever a kill interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant import (
    DualIndex,
    OnnxEncoder,
    create_pair,
    index_images,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.cli import cli
from rm_qdrant.core.modelinfo import ModelInfo
from rm_qdrant.core.ordering import order_keys, ranks
from rm_qdrant.core.planning import ERROR, RANK
from rm_qdrant.errors import MigrationError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.migration.ranking import read_all
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.serving.status import pair_status
from tests.conftest import NEW_DIM, OLD_DIM, SPEC, make_image_folder
from tests.faults import Crash, Scripted, crash, nth_write

N = 30


def rmq(store_path, *args, ok=True):
    result = CliRunner().invoke(cli, ["--qdrant", str(store_path), *map(str, args)])
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    index_images(store, "old", OnnxEncoder(models.old), items)
    return items


def hostile_files(folder):
    """Files a gallery can point at that once stopped a migration for good."""
    folder.mkdir()

    def png(width, height, body=b""):
        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")

    (folder / "bomb.png").write_bytes(png(50_000, 50_000))
    (folder / "broken.png").write_bytes(png(8, 8, b"\x78\x9c not deflate"))
    (folder / "broken.tif").write_bytes(b"II*\x00\x08\x00\x00\x00\xff\xff" + b"\x00" * 40)
    os.mkfifo(folder / "fifo.jpg")
    return {
        "bomb": (str(folder / "bomb.png"), "pixel"),
        "broken PNG": (str(folder / "broken.png"), "not a readable image"),
        "broken TIFF": (str(folder / "broken.tif"), "not a readable image"),
        "FIFO": (str(folder / "fifo.jpg"), "not a regular file"),
        "/dev/zero": ("/dev/zero", "not a regular file"),
        "NUL byte": ("/tmp/a\x00b.jpg", "null byte"),
        "bad URL": ("http://[::1", "InvalidURL|malformed"),
        "64 KB URL": ("http://example.invalid/" + "a" * 65_536, "InvalidURL|too long"),
    }


def test_hostile_sources_are_recorded_and_every_rerun_goes_on(tmp_path, models):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    bad = hostile_files(tmp_path / "hostile")
    items = scan_image_folder(images)
    victims = dict(zip([i.point_id for i in items], bad))
    with open_store(store_path) as store:
        store.set_payload("old", [(i, {"uri": bad[kind][0]}) for i, kind in victims.items()])
    report = json.loads(rmq(store_path, "migrate", "--name", "p", "--batch", "100", "--json").output)
    assert (report["moved"], report["failed"]) == (N - len(bad), len(bad))
    with open_store(store_path) as store:
        reasons = {r.id: r.payload[ERROR] for r in store.retrieve("old", list(victims))}
    for point_id, kind in victims.items():
        assert __import__("re").search(bad[kind][1], reasons[point_id]), (kind, reasons[point_id])
    again = rmq(store_path, "migrate", "--name", "p").output
    assert "moved 0 points" in again and f"{len(bad)} points that failed before were not tried" in again
    retried = json.loads(rmq(store_path, "migrate", "--name", "p", "--retry-failed", "--json").output)
    assert (retried["moved"], retried["failed"]) == (0, len(bad))  # failing again does not stop a retry
    status = json.loads(rmq(store_path, "status", "--name", "p", "--json").output)
    assert (status["failed"], status["old_count"], status["new_count"]) == (len(bad), len(bad), N - len(bad))


def test_index_probe_and_search_skip_or_refuse_a_hostile_image(tmp_path, models, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    bomb = hostile_files(tmp_path / "hostile")["bomb"][0]
    (images / "a" / "bomb.png").write_bytes(Path(bomb).read_bytes())
    out = json.loads(
        rmq(
            store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old, "--json"
        ).output
    )
    assert out["indexed"] == N and "pixel" in out["failed"][0][1]
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    result = rmq(store_path, "search", "--name", "p", bomb, ok=False)
    assert result.exit_code == 1 and "pixel" in result.output and len(result.output.splitlines()) == 1
    with open_store(store_path) as store:
        first = store.scroll("old", limit=1)[0][0].id
        store.set_payload("old", [(first, {"uri": bomb})])
    probe = json.loads(rmq(store_path, "probe", "--name", "p", "--sample", "30", "--json").output)
    assert (probe["sample"], probe["unreadable"]) == (N - 1, 1)


def nan_encoder(path, models):
    """The rm graph of the shared models, times sqrt(mean pixel - 0.02): NaN for a black image."""
    nodes = [
        helper.make_node("Cast", ["images"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "inv255"], ["scaled"]),
        helper.make_node("Flatten", ["scaled"], ["pixels"], axis=1),
        helper.make_node("ReduceMean", ["pixels"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["mean", "floor"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["gain"]),
        helper.make_node("MatMul", ["pixels", "W_new"], ["raw"]),
        helper.make_node("Mul", ["raw", "gain"], ["new"]),
        helper.make_node("MatMul", ["new", "W_rev"], ["rev"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(1 / 255, np.float32), "inv255"),
        numpy_helper.from_array(np.array(0.02, np.float32), "floor"),
        numpy_helper.from_array(models.w_new.astype(np.float32), "W_new"),
        numpy_helper.from_array(models.w_rev.astype(np.float32), "W_rev"),
    ]
    graph = helper.make_graph(
        nodes,
        "nan",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", 8, 8, 3])],
        [
            helper.make_tensor_value_info("new", TensorProto.FLOAT, ["N", NEW_DIM]),
            helper.make_tensor_value_info("rev", TensorProto.FLOAT, ["N", OLD_DIM]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    info = ModelInfo("nan-on-black", "cosine", {"new": NEW_DIM, "rev": OLD_DIM}, SPEC)
    helper.set_model_props(model, info.to_metadata())
    onnx.save(model, str(path))
    return path


def test_an_encoder_returning_nan_for_one_image_records_that_point(store, models, gallery, tmp_path):
    from PIL import Image

    black = tmp_path / "black.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(black)
    victim = gallery[5].point_id
    store.set_payload("old", [(victim, {"uri": str(black)})])
    create_pair(
        store, "p", old_collection="old", encoder=OnnxEncoder(nan_encoder(tmp_path / "nan.onnx", models))
    )
    report = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert (report.moved, report.failed) == (N - 1, 1)
    reason = store.retrieve("old", [victim])[0].payload[ERROR]
    assert "NaN" in reason and report.failure_sample == [(victim, reason)]


def test_a_kill_between_write_and_removal_is_not_counted_twice(store, models, gallery):
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    killed = Scripted(store, [("before", lambda n, a, k: n == "delete" and a[0] == "old", crash)])
    with pytest.raises(Crash):
        run_migration(DualIndex.open(killed, "p"), MigrateOptions(batch=6, limit=6))
    assert store.count("old") == N and store.count("p-new") == 6  # six points in both
    status = pair_status(store, load_pair(store, "p"))
    assert (status.old_count, status.new_count, status.fraction) == (N - 6, 6, pytest.approx(0.2))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=4, until=0.5))
    assert store.count("p-new") == N // 2 and store.count("old") == N // 2


def test_a_kill_while_ranking_a_new_order_is_redone_by_a_plain_rerun(store, models, gallery):
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(limit=0, order="random"))

    def half_then_crash(name, args, kwargs):
        if name == "set_payload" and args[0] == "old":
            store.set_payload("old", args[1][: len(args[1]) // 2])
            return True
        return False

    killed = Scripted(store, [("before", half_then_crash, crash)])
    with pytest.raises(Crash):
        run_migration(DualIndex.open(killed, "p"), MigrateOptions(limit=0, order="centroid"))
    assert load_pair(store, "p").order_ready is False
    run_migration(DualIndex.open(store, "p"), MigrateOptions(limit=0))  # a plain rerun
    pair = load_pair(store, "p")
    assert (pair.order, pair.order_ready) == ("centroid", True)
    ids, payloads, vectors = read_all(
        store, "old", __import__("rm_qdrant.store", fromlist=["Where"]).Where(), True
    )
    expected = ranks(order_keys("centroid", ids, payloads, vectors)).tolist()
    assert [p[RANK] for p in payloads] == expected


VARIANTS = {
    "plain": {},
    "alias and drop": {"alias": "live", "drop_old": True},
    "alias is the old name": {"alias": "old", "drop_old": True},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_finalize_killed_at_any_write_is_completed_by_running_it_again(
    models, tmp_path, variant, when, backend
):
    options = VARIANTS[variant]
    alias, drop = options.get("alias", "p"), options.get("drop_old", False)
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    n = 0
    while True:
        store = open_store(":memory:" if backend == "memory" else tmp_path / f"q{n}")
        index_images(store, "old", OnnxEncoder(models.old), items)
        create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
        run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
        killed = Scripted(store, [(when, nth_write(n), crash)])
        with contextlib.suppress(Crash):
            finalize(killed, load_pair(store, "p"), **options)
        if killed.pending:  # finalize made fewer than n + 1 writes: every kill point is done
            store.close()
            break
        if load_pair(store, "p").state != "finalized":  # killed before the end: the user reruns it
            finalize(store, load_pair(store, "p"), **options)
        assert load_pair(store, "p").state == "finalized" and store.alias(alias) == "p-new"
        assert ("old" in store.list_collections()) == (not drop)
        hits = DualIndex.open(store, "p", exact=True).search(items[0].uri, limit=2 * N)
        assert len({h.id for h in hits}) == N
        store.close()
        n += 1
    assert n >= 3


KILL_AFTER_DROP = textwrap.dedent(
    """
    import os, signal, sys
    from rm_qdrant.store.edge import EdgeStore
    real = EdgeStore.delete_collection
    def drop_then_die(self, name):
        real(self, name)
        os.kill(os.getpid(), signal.SIGKILL)
    EdgeStore.delete_collection = drop_then_die
    from rm_qdrant.cli import main
    sys.argv = ["rmq", *sys.argv[1:]]
    main()
    """
)


@pytest.mark.slow
def test_sigkill_after_finalize_dropped_old_then_finalize_again(tmp_path, models):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "gallery", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "gallery", "--encoder", models.rm)
    rmq(store_path, "migrate", "--name", "p")
    args = ["--qdrant", str(store_path), "finalize", "--name", "p", "--alias", "gallery", "--drop-old"]
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_DROP, *args], capture_output=True, timeout=120)
    assert killed.returncode == -9
    status = json.loads(rmq(store_path, "status", "--name", "p", "--json").output)
    assert status["state"] == "finalizing" and status["new_count"] == N
    query = next(images.glob("a/*"))
    assert len(json.loads(rmq(store_path, "search", "--name", "p", query, "--json").output)) == 10
    blocked = rmq(store_path, "migrate", "--name", "p", ok=False).output
    assert "rmq finalize --name p" in blocked
    assert "alias 'gallery' -> p-new" in rmq(store_path, "finalize", "--name", "p").output
    assert json.loads(rmq(store_path, "status", "--name", "p", "--json").output)["state"] == "finalized"


@pytest.mark.slow
def test_sigterm_acts_within_a_fetch_deadline_on_a_trickling_server(tmp_path, models, trickling_server):
    """Every image comes from a server that sends its headers a byte every 0.3 s, forever."""
    import signal
    import time

    connections = trickling_server.connections  # one per fetch attempt
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    url = trickling_server.url
    with open_store(store_path) as store:
        ids = [r.id for r in store.scroll("old", limit=100)[0]]
        store.set_payload("old", [(i, {"uri": f"{url}/{k}.jpg"}) for k, i in enumerate(ids)])
    command = [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store_path), "-v", "migrate", "--name", "p"]
    # Ignoring SIGTERM would make every point's 3 attempts (4 s each); acting within one fetch
    # deadline lets only the attempts already under way finish: no new one starts.
    workers = 4
    command += ["--timeout", "4", "--batch", "8", "--fetch-workers", str(workers)]
    command += ["--allow-private-network", "--json"]
    log = tmp_path / "run.log"
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        while "retrying" not in log.read_text() and proc.poll() is None:  # however long that takes
            time.sleep(0.05)
        assert "retrying" in log.read_text(), "the run ended before its first retry"
        at_signal = len(connections)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, log.read_text()
    assert json.loads(out)["stopped_early"] is True
    # At most one attempt per fetch worker was past its stop check when the signal came; a run
    # that went on retrying (or began the next batch) would connect again many times.
    late = len(connections) - at_signal
    assert late <= workers, f"{late} fetch attempts began after SIGTERM ({len(connections)} in all)"
    with open_store(store_path) as store:
        assert store.count("old") == N  # nothing moved, nothing recorded as failed by the stop
        assert (
            store.count("old", __import__("rm_qdrant.store", fromlist=["Where"]).Where(not_empty=(ERROR,)))
            == 0
        )


@pytest.mark.slow
def test_credentials_in_uris_stay_out_of_every_output(tmp_path, models, closed_port):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    secret = "hunter2-secret"
    with open_store(store_path) as store:
        ids = [r.id for r in store.scroll("old", limit=100)[0]]
        uris = [
            f"http://me:{secret}@127.0.0.1:{closed_port}/a.jpg",
            f"http://127.0.0.1:{closed_port}/b.jpg?token={secret}",
        ]
        store.set_payload("old", [(i, {"uri": uris[k % 2]}) for k, i in enumerate(ids[:4])])
    logged = subprocess.run(
        [sys.executable, "-m", "rm_qdrant", "--qdrant", str(store_path), "-vv", "migrate", "--name", "p"]
        + ["--allow-private-network", "--timeout", "0.2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert logged.returncode == 0 and "retrying http://***@127.0.0.1" in logged.stderr
    retried = rmq(store_path, "migrate", "--name", "p", "--retry-failed", "--allow-private-network", ok=False)
    outputs = [
        logged.stdout + logged.stderr,
        retried.output,
        rmq(store_path, "status", "--name", "p").output,
        rmq(store_path, "status", "--name", "p", "--json").output,
    ]
    with open_store(store_path) as store:
        outputs += [str(r.payload.get(ERROR)) for r in store.retrieve("old", ids[:4])]
    assert all(secret not in text for text in outputs)
    assert "***" in outputs[2] and "***" in outputs[-1]
    server = rmq(
        f"http://user:{secret}@127.0.0.1:{closed_port}/?api_key={secret}", "status", "--name", "p", ok=False
    )
    assert server.exit_code == 1 and secret not in server.output and "cannot reach Qdrant" in server.output


def test_retry_failed_gets_past_points_that_fail_again(store, models, gallery, tmp_path):
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    broken = {i.point_id for i in gallery[:10]}
    store.set_payload(
        "old",
        [
            (i.point_id, {"prio": 0, "uri": "/gone.jpg"} if i.point_id in broken else {"prio": 1})
            for i in gallery
        ],
    )
    index = DualIndex.open(store, "p")
    with pytest.raises(MigrationError, match="8 of 8 points in a batch failed"):  # the broken ones go first
        run_migration(index, MigrateOptions(batch=8, order="payload:prio"))
    assert store.count("p-new") == 0
    report = run_migration(index, MigrateOptions(batch=8, retry_failed=True))  # the same 8 first again
    assert (report.moved, report.failed) == (N - 10, 10) and store.count("p-new") == N - 10


def test_dry_run_says_half_written_ranks_are_not_ready(tmp_path, models):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    with open_store(store_path) as store:
        from dataclasses import replace

        from rm_qdrant.pair.record import save_pair

        save_pair(store, replace(load_pair(store, "p"), order="centroid", order_ready=False))
    plan = json.loads(rmq(store_path, "migrate", "--name", "p", "--dry-run", "--json").output)
    assert (plan["order"], plan["order_ready"]) == ("centroid", False)
    assert "ranks half-written" in rmq(store_path, "status", "--name", "p").output


def test_what_an_interrupted_delete_leaves_is_removed_at_the_next_open(tmp_path):
    with open_store(tmp_path / "q") as store:
        store.create_collection("big", dim=3, distance="cosine")
        store.upsert("big", [1, 2], np.eye(3, dtype=np.float32)[:2])
    folder = tmp_path / "q" / "collections" / "big"
    (folder / ".creating").touch()  # what delete_collection marks first, then
    (folder / "spec.json").unlink()  # a kill in the middle of the rmtree
    with open_store(tmp_path / "q") as store:
        assert not store.has_collection("big") and not folder.exists()


def test_hostile_query_paths_give_one_line(tmp_path, models):
    store_path = tmp_path / "q"
    images = make_image_folder(tmp_path / "g", per_class=10)
    rmq(store_path, "index", "--collection", "old", "--data", images, "--encoder", models.old)
    rmq(store_path, "init", "--name", "p", "--old-collection", "old", "--encoder", models.rm)
    fifo = tmp_path / "query.jpg"
    os.mkfifo(fifo)
    for query in ("/dev/zero", fifo):
        result = rmq(store_path, "search", "--name", "p", query, ok=False)
        assert result.exit_code == 1 and "not a regular file" in result.output
        assert len(result.output.strip().splitlines()) == 1
