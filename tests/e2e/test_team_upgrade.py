"""A team's deployment, upgraded through ``rmq`` alone.

The team side has no rm-qdrant code: its collection is made with plain qdrant-client
calls (a local-mode folder) or plain qdrant-edge calls (the embedded store), with a
named vector ``image``, integer ids and its own payload ``{image_url, sku, category}``;
its vectors come from its own onnxruntime code; its two models are exported by plain
``torch.onnx.export`` (float32 NCHW, ImageNet normalisation, resize then centre crop,
outputs ``embeddings`` and ``image_embeds``); its images are served over HTTP on
127.0.0.1 and from a local S3 server. rm-qdrant then stamps, checks, pairs, probes,
migrates, serves, cuts over and, on a keep-old pair, rolls back; after every step each
id is in the gallery exactly once with the team's payload as it was.
"""

from __future__ import annotations

import json
import threading
import warnings
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from PIL import Image

from rm_qdrant import load_pair, open_store
from rm_qdrant.cli import cli
from rm_qdrant.core.planning import user_payload
from rm_qdrant.pair.layouts import active_where

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

N = 40
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CATEGORIES = ("shoes", "bags", "hats", "belts")
TEAM_FIELDS = {"image_url", "sku", "category"}
PAYLOADS: dict[int, dict] = {}  # id -> the team's payload, filled by the deployment fixture


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web(tmp_path):
    """The team's image server on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def export(path: Path, dim: int, output: str, seed: int) -> Path:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, dim),
    ).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is legacy
        torch.onnx.export(
            net,
            (torch.zeros(1, 3, 32, 32),),
            str(path),
            input_names=["pixel_values"],
            output_names=[output],
            dynamic_axes={"pixel_values": {0: "batch"}, output: {0: "batch"}},
            dynamo=False,
        )
    return path


def team_embed(model: Path, images: list[bytes], resample: int = Image.BILINEAR) -> np.ndarray:
    """The team's own preprocessing and inference: PIL, numpy, onnxruntime."""
    import io

    rows = []
    for data in images:
        picture = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = picture.size
        scale = 36 / min(w, h)
        picture = picture.resize((max(36, int(w * scale)), max(36, int(h * scale))), resample)
        w, h = picture.size
        left, top = int(round((w - 32) / 2.0)), int(round((h - 32) / 2.0))
        pixels = np.asarray(picture.crop((left, top, left + 32, top + 32)), np.float32) / 255.0
        rows.append(((pixels - MEAN) / STD).transpose(2, 0, 1))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_outputs()[0].name
    return session.run([name], {"pixel_values": np.stack(rows).astype(np.float32)})[0]


@pytest.fixture
def deployment(tmp_path, web, bucket):
    """Images on HTTP and S3, the team's models, and the rows of its gallery."""
    root, base = web
    bucket_name, put = bucket
    rng = np.random.default_rng(0)
    rows = []
    for k in range(N):
        size = (int(rng.integers(36, 90)), int(rng.integers(36, 90)))
        colour = np.zeros((size[1], size[0], 3), np.int16) + 40 * (k % 4)
        pixels = np.clip(colour + rng.integers(0, 120, size=colour.shape), 0, 255).astype(np.uint8)
        name = f"sku-{k:03d}.{'jpg' if k % 3 else 'png'}"
        import io

        out = io.BytesIO()
        Image.fromarray(pixels).save(out, "JPEG" if k % 3 else "PNG")
        data = out.getvalue()
        if k % 2:
            put(name, data)
            url = f"s3://{bucket_name}/{name}"
        else:
            (root / name).write_bytes(data)
            url = f"{base}/{name}"
        rows.append(
            {
                "id": 1000 + k,
                "data": data,
                "payload": {"image_url": url, "sku": f"SKU-{k:03d}", "category": CATEGORIES[k % 4]},
            }
        )
    PAYLOADS.clear()
    PAYLOADS.update({r["id"]: r["payload"] for r in rows})
    old = export(tmp_path / "team-old.onnx", 16, "embeddings", seed=1)
    new = export(tmp_path / "team-new.onnx", 24, "image_embeds", seed=2)
    vectors = team_embed(old, [r["data"] for r in rows])
    return rows, vectors, old, new


def make_local_folder(folder: Path, name: str, rows, vectors) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(folder))
    client.create_collection(
        name, vectors_config={"image": models.VectorParams(size=16, distance=models.Distance.COSINE)}
    )
    points = [
        models.PointStruct(id=r["id"], vector={"image": v.tolist()}, payload=r["payload"])
        for r, v in zip(rows, vectors)
    ]
    client.upsert(name, points)
    client.close()


def make_edge_shard(folder: Path, name: str, rows, vectors) -> None:
    import qdrant_edge as qe

    path = folder / "collections" / name / "shard"
    path.parent.mkdir(parents=True)
    config = qe.EdgeConfig(vectors={"image": qe.EdgeVectorParams(size=16, distance=qe.Distance.Cosine)})
    shard = qe.EdgeShard.create(str(path), config)
    points = [qe.Point(r["id"], {"image": v.tolist()}, r["payload"]) for r, v in zip(rows, vectors)]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.update(qe.UpdateOperation.create_field_index("category", qe.PayloadSchemaType.Keyword))
    shard.close()


def gallery_once(folder: Path, pair: str, rows) -> dict[int, str]:
    """Every id served from exactly one collection, with the team's payload: id -> side."""
    with open_store(folder) as store:
        record = load_pair(store, pair)
        sides: dict[int, str] = {}
        if record.serves_new:
            for point in store.scroll(record.new_collection, limit=10_000)[0]:
                sides[point.id] = "new"
                assert user_payload(point.payload) == PAYLOADS[point.id]
        if record.serves_old:
            where = active_where(record) if record.state == "backfilling" else None
            for point in store.scroll(record.old_collection, limit=10_000, where=where)[0]:
                sides.setdefault(point.id, "old")  # in both after a cut-short step: served from new
                assert user_payload(point.payload) == PAYLOADS[point.id]
    assert sorted(sides) == [r["id"] for r in rows]
    return sides


@pytest.mark.parametrize("backend", ["qdrant-client folder", "embedded store"])
def test_a_team_upgrades_its_deployment_with_rmq_alone(tmp_path, deployment, backend):
    rows, vectors, old, new = deployment
    folder = tmp_path / "team-store"
    build = make_local_folder if backend == "qdrant-client folder" else make_edge_shard
    build(folder, "products", rows, vectors)
    build_b = tmp_path / "team-store-b"
    build(build_b, "catalog", rows, vectors)

    def rmq(*args, store=folder, ok=True):
        result = CliRunner().invoke(cli, ["--qdrant", str(store), *map(str, args)])
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
    sources = ["--allow-private-network"]
    check = json.loads(
        rmq(
            "model",
            "check",
            tmp_path / "old.onnx",
            "--collection",
            "products",
            "--uri-field",
            "image_url",
            "--json",
            *sources,
        ).output
    )
    assert check["matches"] and check["checked"] == N and check["min"] >= 0.999

    pair = ["--name", "upgrade"]
    rmq(
        "init",
        *pair,
        "--old-collection",
        "products",
        "--encoder",
        tmp_path / "new.onnx",
        "--old-encoder",
        tmp_path / "old.onnx",
        "--uri-field",
        "image_url",
        "--label-field",
        "category",
    )
    assert set(gallery_once(folder, "upgrade", rows).values()) == {"old"}
    probe = json.loads(rmq("probe", *pair, "--sample", "40", "--json", *sources).output)
    assert (probe["sample"], probe["unreadable"]) == (N, 0)
    rmq("migrate", *pair, "--until", "0.5", "--batch", "8", *sources)
    assert list(gallery_once(folder, "upgrade", rows).values()).count("new") == N // 2
    query = tmp_path / "query.jpg"
    query.write_bytes(rows[6]["data"])
    hits = json.loads(rmq("search", *pair, query, "--json").output)
    assert len(hits) == 10 and hits[0]["id"] == rows[6]["id"] and hits[0]["distance"] < 1e-4
    assert all(set(h["payload"]) == TEAM_FIELDS and isinstance(h["id"], int) for h in hits)
    rmq("migrate", *pair, *sources)
    assert set(gallery_once(folder, "upgrade", rows).values()) == {"new"}
    rmq("finalize", *pair, "--alias", "products", "--drop-old")
    gallery_once(folder, "upgrade", rows)
    if backend == "qdrant-client folder":  # the team's own client now reads the new model's collection
        from qdrant_client import QdrantClient

        client = QdrantClient(path=str(folder))
        config = client.get_collection("products").config.params.vectors
        found = client.query_points("products", query=np.ones(24).tolist(), using="image", limit=N).points
        client.close()
        assert list(config) == ["image"] and config["image"].size == 24
        assert sorted(p.id for p in found) == [r["id"] for r in rows]
        assert all(p.payload == next(r["payload"] for r in rows if r["id"] == p.id) for p in found)

    trial = ["--name", "trial"]
    rmq(
        "init",
        *trial,
        "--old-collection",
        "catalog",
        "--encoder",
        tmp_path / "new.onnx",
        "--old-encoder",
        tmp_path / "old.onnx",
        "--uri-field",
        "image_url",
        "--keep-old",
        store=build_b,
    )
    rmq("migrate", *trial, "--until", "0.5", *sources, store=build_b)
    rmq("rollback", *trial, store=build_b)
    assert set(gallery_once(build_b, "trial", rows).values()) == {"old"}
    hits = json.loads(rmq("search", *trial, query, "--json", store=build_b).output)
    assert (
        hits[0]["id"] == rows[6]["id"]
        and hits[0]["distance"] < 1e-4
        and {h["source"] for h in hits} == {"old"}
    )
    status = json.loads(rmq("status", *trial, "--json", store=build_b).output)
    assert (status["state"], status["old_count"], status["fraction"]) == ("rolled_back", N, 0.0)
    with open_store(build_b) as store:  # the team's catalog as its own code reads it: no rmq_* left
        page, _ = store.scroll("catalog", limit=N)
        assert all(p.payload == next(r["payload"] for r in rows if r["id"] == p.id) for p in page)
