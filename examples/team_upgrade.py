"""The walk of docs/guides/adopting.md, timed, on a gallery rm-qdrant did not make.

A stand-in for a team's deployment is built first, with no rm-qdrant code: the
CIFAR-10 test images (10,000 JPEGs from ../shared/data) served half over HTTP on
127.0.0.1 and half from a local S3-compatible server (moto); two small CNNs exported
by plain ``torch.onnx.export`` (random weights: this times the walk, it does not
measure quality) with outputs ``embeddings`` and ``image_embeds``, float32 NCHW input,
ImageNet normalisation, resize 36 then centre crop 32; the team's own onnxruntime code
embeds the gallery; the collection ``products`` (named vector ``image``, integer ids,
payload ``{image_url, sku, category}``) is written with plain qdrant-client
(``--backend client-folder``, a ``QdrantClient(path=...)`` folder) or plain qdrant-edge
(``--backend edge``). Then every step is an ``rmq`` process, timed.

Run: ``python examples/team_upgrade.py [--backend edge|client-folder] [--images 10000]``
(needs the dev extras: torch, boto3, moto).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import warnings
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnxruntime as ort
from PIL import Image

ARCHIVE = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpg.tar.gz"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cifar_test(limit: int) -> list[tuple[str, str, bytes]]:
    """(class, file name, JPEG bytes) of the first ``limit`` CIFAR-10 test images, read from the archive."""
    found = []
    with tarfile.open(ARCHIVE) as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and "test" in parts and member.name.endswith(".jpg"):
                handle = archive.extractfile(member)
                if handle is not None:
                    found.append((parts[-2], parts[-1], handle.read()))
    found.sort()
    return found[:: max(1, len(found) // limit)][:limit]  # every class, not the first ones


def export(path: Path, dim: int, output: str, seed: int) -> Path:
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, dim),
    ).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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


def team_embed(model: Path, images: list[bytes]) -> np.ndarray:
    """The team's own preprocessing (PIL + numpy) and inference (onnxruntime)."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    rows, out = [], []
    for data in images:
        picture = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = picture.size
        picture = picture.resize((int(36 * w / min(w, h)), int(36 * h / min(w, h))), Image.BILINEAR)
        w, h = picture.size
        left, top = int(round((w - 32) / 2.0)), int(round((h - 32) / 2.0))
        pixels = np.asarray(picture.crop((left, top, left + 32, top + 32)), np.float32) / 255.0
        rows.append(((pixels - MEAN) / STD).transpose(2, 0, 1))
        if len(rows) == 256:
            out.append(session.run([output], {"pixel_values": np.stack(rows).astype(np.float32)})[0])
            rows = []
    if rows:
        out.append(session.run([output], {"pixel_values": np.stack(rows).astype(np.float32)})[0])
    return np.concatenate(out)


def write_collection(
    backend: str, folder: Path, name: str, vectors: np.ndarray, payloads: list[dict]
) -> None:
    ids = list(range(1, len(payloads) + 1))
    if backend == "client-folder":
        from qdrant_client import QdrantClient, models

        client = QdrantClient(path=str(folder))
        params = models.VectorParams(size=vectors.shape[1], distance=models.Distance.COSINE)
        client.create_collection(name, vectors_config={"image": params})
        for start in range(0, len(ids), 1000):
            points = [
                models.PointStruct(id=i, vector={"image": v.tolist()}, payload=p)
                for i, v, p in zip(
                    ids[start : start + 1000],
                    vectors[start : start + 1000],
                    payloads[start : start + 1000],
                    strict=True,
                )
            ]
            client.upsert(name, points)
        client.close()
        return
    import qdrant_edge as qe

    path = folder / "collections" / name / "shard"
    path.parent.mkdir(parents=True)
    params = qe.EdgeVectorParams(size=vectors.shape[1], distance=qe.Distance.Cosine)
    shard = qe.EdgeShard.create(str(path), qe.EdgeConfig(vectors={"image": params}))
    points = [qe.Point(i, {"image": v.tolist()}, p) for i, v, p in zip(ids, vectors, payloads, strict=True)]
    shard.update(qe.UpdateOperation.upsert_points(points))
    shard.update(qe.UpdateOperation.create_field_index("category", qe.PayloadSchemaType.Keyword))
    shard.close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve_images(root: Path, images: list[tuple[str, str, bytes]]) -> tuple[list[str], object, object]:
    """Even images over HTTP, odd ones in S3; returns each image's URL and the two servers."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    web = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    threading.Thread(target=web.serve_forever, daemon=True).start()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3.start()
    host, port = s3.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="team",
        AWS_SECRET_ACCESS_KEY="team",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL_S3=f"http://{host}:{port}",
        AWS_EC2_METADATA_DISABLED="true",
    )
    client = boto3.session.Session().client("s3")
    client.create_bucket(Bucket="team-images")
    urls = []
    for k, (label, name, data) in enumerate(images):
        key = f"{label}/{name}"
        if k % 2:
            client.put_object(Bucket="team-images", Key=key, Body=data)
            urls.append(f"s3://team-images/{key}")
        else:
            (root / label).mkdir(exist_ok=True)
            (root / key).write_bytes(data)
            urls.append(f"http://127.0.0.1:{web.server_address[1]}/{key}")
    return urls, web, s3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["edge", "client-folder"], default="edge")
    parser.add_argument("--images", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        images = cifar_test(args.images)
        (work / "www").mkdir()
        urls, web, s3 = serve_images(work / "www", images)
        payloads = [
            {"image_url": u, "sku": f"SKU-{k:05d}", "category": label}
            for k, (u, (label, _, _)) in enumerate(zip(urls, images, strict=True))
        ]
        old = export(work / "team-old.onnx", 64, "embeddings", seed=1)
        new = export(work / "team-new.onnx", 128, "image_embeds", seed=2)
        started = time.perf_counter()
        vectors = team_embed(old, [d for _, _, d in images])
        store = work / "team-store"
        write_collection(args.backend, store, "products", vectors, payloads)
        write_collection(args.backend, work / "team-store-b", "catalog", vectors, payloads)
        print(f"team deployment built in {time.perf_counter() - started:.1f} s: {len(images)} images")
        query = work / "query.jpg"
        query.write_bytes(images[0][2])
        walk(work, store, old, new, query)
        web.shutdown()  # type: ignore[attr-defined]
        s3.stop()  # type: ignore[attr-defined]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}"
    print(f"\n({machine}, --backend {args.backend})")


def walk(work: Path, store: Path, old: Path, new: Path, query: Path) -> None:
    prep = ["--input-size", "32", "--resize", "36", "--crop", "32", "--input-layout", "NCHW", "--input-dtype"]
    prep += ["float32", "--mean", ",".join(map(str, MEAN)), "--std", ",".join(map(str, STD))]
    net = ["--allow-private-network"]  # the stand-in image server is on 127.0.0.1
    b = work / "team-store-b"
    steps = [
        (
            None,
            ["model", "stamp", old, "--out", work / "old.onnx", "--output", "embedding=embeddings", *prep],
        ),
        (
            None,
            ["model", "stamp", new, "--out", work / "new.onnx", "--output", "embedding=image_embeds", *prep],
        ),
        (
            store,
            [
                "model",
                "check",
                work / "old.onnx",
                "--collection",
                "products",
                "--uri-field",
                "image_url",
                *net,
            ],
        ),
        (
            store,
            [
                "init",
                "--name",
                "upgrade",
                "--old-collection",
                "products",
                "--encoder",
                work / "new.onnx",
                "--old-encoder",
                work / "old.onnx",
                "--uri-field",
                "image_url",
                "--label-field",
                "category",
            ],
        ),
        (store, ["probe", "--name", "upgrade", "--sample", "2000", *net]),
        (store, ["migrate", "--name", "upgrade", "--until", "0.5", "--batch", "1000", *net]),
        (store, ["search", "--name", "upgrade", query, "--limit", "5"]),
        (store, ["migrate", "--name", "upgrade", "--batch", "1000", *net]),
        (store, ["status", "--name", "upgrade"]),
        (store, ["finalize", "--name", "upgrade", "--alias", "products", "--drop-old"]),
        (
            b,
            [
                "init",
                "--name",
                "trial",
                "--old-collection",
                "catalog",
                "--encoder",
                work / "new.onnx",
                "--old-encoder",
                work / "old.onnx",
                "--uri-field",
                "image_url",
                "--keep-old",
            ],
        ),
        (b, ["migrate", "--name", "trial", "--until", "0.5", "--batch", "1000", *net]),
        (b, ["rollback", "--name", "trial"]),
        (b, ["status", "--name", "trial", "--json"]),
    ]
    print("\n| step | seconds |\n|---|--:|")
    for location, args in steps:
        command = ["rmq", *(["--qdrant", str(location)] if location else []), *map(str, args)]
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rm_qdrant", *command[1:]], capture_output=True, text=True
        )
        seconds = time.perf_counter() - started
        shown = " ".join(str(a) if not str(a).startswith(str(work)) else Path(a).name for a in command)
        print(f"| `{shown}` | {seconds:.1f} |")
        if done.returncode != 0:
            sys.exit(f"failed: {done.stderr.strip()}")
        if args[0] == "status" and "--json" in args:
            state = json.loads(done.stdout)
            print(f"|   state {state['state']}, old {state['old_count']}, new {state['new_count']} | |")


if __name__ == "__main__":
    main()
