"""A second team's deployment, upgraded through ``rmq`` alone, its search service in Python.

It differs from tests/e2e/test_team_upgrade.py's team in every way issue 25 names: the image
address is nested (``asset.url``); the old pipeline resizes with bicubic interpolation; the
images sit on a private CDN on 127.0.0.1 that wants an ``Authorization`` header, and on S3;
two JPEG files are truncated, one URL answers 404 and one S3 key does not exist; ids are
UUIDs, the collection is Euclidean with the models' raw vectors and keeps a second named
vector ``caption``; the service filters with ``models.Filter`` ranges (a number and a
datetime), cuts with ``score_threshold``, pages with ``offset`` and runs on asyncio.

Nothing is changed in the team's data or pipeline: every source setting is given once, at
``rmq init``, and the broken images are dropped at the cutover with ``--drop-failed``.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from qdrant_client import models

from rm_qdrant import AsyncDualIndex, DualIndex, load_pair, open_store
from rm_qdrant.cli import cli
from rm_qdrant.core.planning import user_payload
from tests.conftest import QuietHandler
from tests.e2e.test_team_upgrade import MEAN, STD, export, team_embed

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

N = 40
TOKEN = "s3cr3t-cdn-token"
START = datetime(2025, 1, 1, tzinfo=UTC)
TRUNCATED, MISSING_HTTP, MISSING_S3 = (4, 10), 16, 7  # indexes of the broken images


class _Cdn(QuietHandler):
    """A private CDN: 401 without the team's bearer token, 404 for what it does not have."""

    files: dict[str, bytes]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.reply(body)


@pytest.fixture
def cdn():
    handler = type("Cdn", (_Cdn,), {"files": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler.files, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def picture(k: int, rng: np.random.Generator) -> bytes:
    """A JPEG several times larger than the input, with hard edges and fine texture: what a
    downscale filter changes."""
    width, height = int(rng.integers(110, 260)), int(rng.integers(110, 260))
    y, x = np.mgrid[0:height, 0:width]
    image = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 2.0 + y / 3.0)], axis=-1)
    image[((x // (5 + k % 4) + y // 5 + k) % 2) == 0] *= 0.4
    image = np.clip(image + rng.normal(0, 20, size=image.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG", quality=95)
    return out.getvalue()


@pytest.fixture
def team(tmp_path, cdn, bucket, monkeypatch):
    """The team's images, models, and gallery rows (UUID ids, nested payloads)."""
    files, base = cdn
    bucket_name, put = bucket
    monkeypatch.setenv("CDN_TOKEN", TOKEN)
    rng = np.random.default_rng(3)
    rows = []
    for k in range(N):
        data = picture(k, rng)
        name = f"img-{k:03d}.jpg"
        if k % 2:
            url = f"s3://{bucket_name}/{name}"
            if k != MISSING_S3:
                put(name, data)
        else:
            url = f"{base}/assets/{name}"
            if k != MISSING_HTTP:
                files[f"/assets/{name}"] = data[: len(data) // 3] if k in TRUNCATED else data
        created = (START + timedelta(days=3 * k)).isoformat()
        rows.append(
            {
                "id": str(uuid.UUID(int=int(rng.integers(1, 2**62)) << 64 | k)),
                "data": data,
                "payload": {
                    "asset": {"url": url, "created_at": created},
                    "meta": {"dept": ["home", "garden"][k % 2]},
                    "price": float(5 * (k % 9)),
                },
            }
        )
    old = export(tmp_path / "team-old.onnx", 16, "embeddings", seed=11)
    new = export(tmp_path / "team-new.onnx", 24, "image_embeds", seed=12)
    vectors = team_embed(old, [r["data"] for r in rows], resample=Image.BICUBIC)
    return rows, vectors, old, new


def broken(rows) -> set[str]:
    return {rows[k]["id"] for k in (*TRUNCATED, MISSING_HTTP, MISSING_S3)}


def build_collection(folder: Path, backend: str, rows, vectors) -> None:
    """The team's collection, made with its own client calls: Euclid, raw vectors, UUID ids,
    a second named vector the team searches on its own."""
    captions = np.random.default_rng(5).normal(size=(len(rows), 8))
    if backend == "qdrant-client folder":
        from qdrant_client import QdrantClient

        client = QdrantClient(path=str(folder))
        client.create_collection(
            "products",
            vectors_config={
                "image": models.VectorParams(size=16, distance=models.Distance.EUCLID),
                "caption": models.VectorParams(size=8, distance=models.Distance.DOT),
            },
        )
        points = [
            models.PointStruct(
                id=r["id"], vector={"image": v.tolist(), "caption": c.tolist()}, payload=r["payload"]
            )
            for r, v, c in zip(rows, vectors, captions)
        ]
        client.upsert("products", points)
        client.close()
        return
    import qdrant_edge as qe

    path = folder / "collections" / "products" / "shard"
    path.parent.mkdir(parents=True)
    config = qe.EdgeConfig(
        vectors={
            "image": qe.EdgeVectorParams(size=16, distance=qe.Distance.Euclid),
            "caption": qe.EdgeVectorParams(size=8, distance=qe.Distance.Dot),
        }
    )
    shard = qe.EdgeShard.create(str(path), config)
    points = [
        qe.Point(r["id"], {"image": v.tolist(), "caption": c.tolist()}, r["payload"])
        for r, v, c in zip(rows, vectors, captions)
    ]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.close()


@pytest.mark.parametrize("backend", ["qdrant-client folder", "embedded store"])
def test_a_second_team_upgrades_with_rmq_alone_and_serves_from_python(tmp_path, team, backend):
    rows, vectors, old, new = team
    folder = tmp_path / "team-store"
    build_collection(folder, backend, rows, vectors)
    by_id = {r["id"]: r for r in rows}

    def rmq(*args, ok=True):
        result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, args)])
        assert (result.exit_code == 0) == ok, result.output
        return result

    preprocessing = ["--input-size", "32", "--resize", "36", "--crop", "32", "--input-layout", "NCHW"]
    preprocessing += [
        "--input-dtype",
        "float32",
        "--mean",
        ",".join(map(str, MEAN)),
        "--std",
        ",".join(map(str, STD)),
    ]
    sources = ["--allow-private-network", "--http-header", "Authorization: Bearer $CDN_TOKEN"]
    check = ["--collection", "products", "--vector", "image", "--uri-field", "asset.url", "--json", *sources]

    # The old pipeline resizes bicubic: stamped as bilinear (the default) the check fails and
    # names the knob; stamped --interpolation bicubic it passes.
    rmq(
        "model",
        "stamp",
        old,
        "--out",
        tmp_path / "old.onnx",
        "--output",
        "embedding=embeddings",
        *preprocessing,
    )
    wrong = rmq("model", "check", tmp_path / "old.onnx", *check, ok=False)
    assert "--interpolation" in wrong.output
    rmq(
        "model", "stamp", old, "--out", tmp_path / "old.onnx", "--output", "embedding=embeddings",
        "--interpolation", "bicubic", *preprocessing,
    )  # fmt: skip
    found = json.loads(rmq("model", "check", tmp_path / "old.onnx", *check).output)
    assert found["matches"] and found["checked"] == N - 4 and found["unreadable"] == 4
    rmq(
        "model",
        "stamp",
        new,
        "--out",
        tmp_path / "new.onnx",
        "--output",
        "embedding=image_embeds",
        *preprocessing,
    )

    # Source settings once, at init; the header's value comes from the environment.
    pair = ["--name", "upgrade"]
    rmq(
        "init", *pair, "--old-collection", "products", "--old-vector", "image",
        "--encoder", tmp_path / "new.onnx", "--old-encoder", tmp_path / "old.onnx",
        "--uri-field", "asset.url", "--label-field", "meta.dept", *sources,
    )  # fmt: skip
    status = rmq("status", *pair).output
    assert TOKEN not in status and "Authorization" in status
    probe = json.loads(rmq("probe", *pair, "--sample", str(N), "--json").output)
    assert (probe["sample"], probe["unreadable"]) == (N - 4, 4)  # the readable ones were probed
    rmq("migrate", *pair, "--order", "payload:asset.created_at", "--until", "0.5", "--batch", "8")

    # The search service, half-way: models.Filter ranges, score_threshold, offset, async.
    query = rows[6]["data"]
    with open_store(folder) as store:
        index = DualIndex.open(store, "upgrade")
        assert {h.source for h in index.search(query, limit=N)} == {"old", "new"}
        serve_like_a_service(index, query, by_id)
        assert index.count() == N  # each point once, wherever it is
        moving = [p.id for p in index.retrieve(list(by_id)) if p.source == "old"]
        waiting = [i for i in moving if i not in broken(rows)][:3]  # points that will migrate
        index.set_payload(
            {"on_sale": 1}, waiting
        )  # the service edits points the migration has yet to move (1, not True: the embedded
        # store refuses true/false matches, tests/serving/test_geo_filters.py)
        for point_id in waiting:
            by_id[point_id]["payload"]["on_sale"] = 1
        index.close()

    rest = rmq("migrate", *pair).output
    assert "rmq failures --name upgrade" in rest and "--drop-failed" in rest
    listed = json.loads(rmq("failures", *pair, "--json").output)
    assert listed["failed"] == 4 and {p["id"] for p in listed["points"]} == broken(rows)
    reasons = " ".join(p["reason"] for p in listed["points"])
    assert "404" in reasons and "NoSuchKey" in reasons or "no such key" in reasons.lower()
    assert all(TOKEN not in p["uri"] + p["reason"] for p in listed["points"])
    refused = rmq("finalize", *pair, "--alias", "products", "--drop-old", ok=False).output
    assert "--drop-failed" in refused and "--retry-failed" in refused
    dropped = rmq(
        "finalize",
        *pair,
        "--alias",
        "products",
        "--drop-old",
        "--drop-failed",
        "--out",
        tmp_path / "failed.jsonl",
    )
    assert "4" in dropped.output
    assert {
        json.loads(line)["id"] for line in (tmp_path / "failed.jsonl").read_text().splitlines()
    } == broken(rows)

    with open_store(
        folder
    ) as store:  # the served gallery: every readable image, payload as the team wrote it
        record = load_pair(store, "upgrade")
        page, _ = store.scroll(record.new_collection, limit=10 * N, others=("caption",))
        assert record.state == "finalized"
        assert sorted(p.id for p in page) == sorted(set(by_id) - broken(rows))
        assert all(user_payload(p.payload) == by_id[p.id]["payload"] and "caption" in p.others for p in page)
        index = DualIndex.open(store, "upgrade")
        assert index.count() == N - 4 and index.count({"on_sale": 1}) == len(waiting) == 3
        assert {h.source for h in index.search(query, limit=N)} == {"new"}
        serve_like_a_service(index, query, by_id)
        index.close()


def serve_like_a_service(index: DualIndex, query: bytes, by_id: dict) -> None:
    """What the team's service asks, each answer checked against the full merged list."""
    everything = index.search(query, limit=N)
    assert everything[0].id == next(i for i, r in by_id.items() if r["data"] == query)
    ids = [h.id for h in everything]
    cheap_and_recent = models.Filter(
        must=[
            models.FieldCondition(key="price", range=models.Range(lt=25)),
            models.FieldCondition(
                key="asset.created_at", range=models.DatetimeRange(gte=START + timedelta(days=30))
            ),
        ]
    )

    def keeps(point_id):
        body = by_id[point_id]["payload"]
        return body["price"] < 25 and datetime.fromisoformat(
            body["asset"]["created_at"]
        ) >= START + timedelta(days=30)

    filtered = index.search(query, limit=5, filter=cheap_and_recent)
    assert [h.id for h in filtered] == [i for i in ids if keeps(i)][:5]
    assert [h.id for h in index.search(query, limit=5, offset=3)] == ids[3:8]
    cut = everything[6].distance  # Euclid: Qdrant keeps score <= threshold, the score being the distance
    close = index.search(query, limit=N, score_threshold=cut)
    assert [h.id for h in close] == ids[: len(close)] and len(close) >= 7
    assert all(h.distance <= cut + 1e-6 for h in close)

    async def service():
        async with AsyncDualIndex(index) as served:
            return await asyncio.gather(
                served.search(query, limit=5, filter=cheap_and_recent),
                served.search(query, limit=5, offset=3),
                served.search(query, limit=N, score_threshold=cut),
            )

    answers = asyncio.run(service())
    assert [[h.id for h in hits] for hits in answers] == [
        [h.id for h in filtered],
        ids[3:8],
        [h.id for h in close],
    ]
