"""Congruence: the same scenarios on a real Qdrant server and on the embedded store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from rm_qdrant import (
    DualIndex,
    OnnxEncoder,
    StoreError,
    create_pair,
    index_images,
    open_store,
    scan_image_folder,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def server(server_url):
    store = open_store(server_url)
    before = set(store.list_collections())
    yield store
    for name in set(store.list_collections()) - before:
        store.delete_collection(name)
    store.close()


def scenario(store, models, image_folder, prefix):
    """Index, pair, move half, search: return what a user would see."""
    items = scan_image_folder(image_folder)
    old = f"{prefix}gallery"
    index_images(store, old, OnnxEncoder(models.old), items)
    create_pair(store, f"{prefix}p", old_collection=old, encoder=OnnxEncoder(models.rm))
    index = DualIndex.open(store, f"{prefix}p", exact=True)
    half = items[::2]
    index.upsert(
        [i.point_id for i in half], [i.uri for i in half], [{"uri": i.uri, "label": i.label} for i in half]
    )
    index.delete([items[5].point_id])
    results = index.search_batch([i.uri for i in items[:6]], limit=8, filter={"label": ["a", "c"]})
    index.close()
    return [[(h.id, h.source, round(h.distance, 4)) for h in hits] for hits in results], index.progress()


def prepared_pair(server_url, models, tmp_path):
    """A pair of 300 images on the server, ranked (``--prepare``); ``rmq`` as a function, and
    the command line that starts it."""
    from tests.conftest import make_image_folder

    images = make_image_folder(tmp_path / "many", per_class=100)
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    base = [sys.executable, "-m", "rm_qdrant", "--qdrant", server_url]
    run = lambda *args: subprocess.run([*base, *args], capture_output=True, text=True, timeout=300)  # noqa: E731
    assert (
        run("index", "--collection", f"{prefix}old", "--data", images, "--encoder", models.old).returncode
        == 0
    )
    init = ("init", "--name", f"{prefix}p", "--old-collection", f"{prefix}old", "--encoder", models.rm)
    assert run(*init).returncode == 0
    assert run("migrate", "--name", f"{prefix}p", "--prepare").returncode == 0
    return prefix, base, run


def test_server_and_embedded_store_agree(server, models, image_folder, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    on_server = scenario(server, models, image_folder, prefix)
    with open_store(tmp_path / "edge") as edge:
        embedded = scenario(edge, models, image_folder, prefix)
    assert server.capabilities.concurrent_search  # DualIndex sends both searches at once here
    assert on_server == embedded


def test_wrong_api_key_is_a_clear_error(server_url):
    if not os.environ.get("QDRANT_API_KEY"):
        pytest.skip("the server was started without an API key (set QDRANT_API_KEY to test key checks)")
    with pytest.raises(StoreError, match="rejected the API key"):
        open_store(server_url, api_key="definitely-wrong")


def test_search_against_many_points(server):
    rng = np.random.default_rng(0)
    name = f"t{uuid.uuid4().hex[:8]}"
    server.create_collection(name, dim=16, distance="cosine")
    vectors = rng.normal(size=(2000, 16)).astype(np.float32)
    server.upsert(name, list(range(2000)), vectors)
    hits = server.search(name, vectors[:3], limit=5, exact=True)
    assert [h[0].id for h in hits] == [0, 1, 2]


def test_two_shard_processes_share_one_migration(server_url, models, tmp_path):
    """Two `rmq migrate --shard i/2` processes against one server: every point moved once."""
    prefix, base, _ = prepared_pair(server_url, models, tmp_path)
    workers = [
        subprocess.Popen(
            [*base, "migrate", "--name", f"{prefix}p", "--shard", f"{i}/2", "--batch", "20", "--json"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    reports = [json.loads(w.communicate(timeout=300)[0]) for w in workers]
    store = open_store(server_url)
    try:
        assert sum(r["moved"] for r in reports) == 300 and all(r["moved"] > 0 for r in reports)
        assert store.count(f"{prefix}old") == 0 and store.count(f"{prefix}p-new") == 300
    finally:
        for name in (f"{prefix}old", f"{prefix}p-new"):
            store.delete_collection(name)
        store.close()


def test_a_pause_holds_two_shard_processes_within_a_batch(server_url, models, tmp_path):
    """`rmq pause` from a third process holds two `--shard i/2` processes: each says so, settles at
    most the batches it had in flight, and both finish after `rmq resume`; status tells the pace."""
    prefix, base, run = prepared_pair(server_url, models, tmp_path)
    name, batch = f"{prefix}p", 10
    assert run("pause", name).returncode == 0
    shards = [
        subprocess.Popen(
            [*base, "migrate", "--name", name, "--shard", f"{i}/2", "--batch", str(batch), "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    store = open_store(server_url)
    try:
        for shard in shards:  # each started paused, and says it waits
            lines = iter(shard.stderr.readline, "")
            assert any("paused by rmq pause" in line for line in lines)
        time.sleep(2)
        assert store.count(f"{name}-new") == 0
        assert run("resume", name).returncode == 0
        time.sleep(1.5)
        assert run("pause", name).returncode == 0
        time.sleep(2)  # every shard is waiting again: nothing moves
        held = store.count(f"{name}-new")
        time.sleep(2)
        assert store.count(f"{name}-new") == held
        status = json.loads(run("status", "--name", name, "--json").stdout)
        assert status["paused"] is True and status["points_per_second"] > 0
        assert run("resume", name).returncode == 0
        reports = [json.loads(s.communicate(timeout=300)[0]) for s in shards]
        assert sum(r["moved"] for r in reports) == 300 and store.count(f"{name}-new") == 300
    finally:
        for shard in shards:
            shard.kill()
        for collection in (f"{prefix}old", f"{name}-new"):
            if store.has_collection(collection):
                store.delete_collection(collection)
        store.close()
