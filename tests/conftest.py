"""Shared fixtures: real ONNX encoders built with onnx.helper, real image files, real stores."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads: tiny tensors, and one worker per core

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from rm_qdrant import InputSpec, open_store
from rm_qdrant.caches import CACHE_ENV
from rm_qdrant.cli import cli
from rm_qdrant.store import Store
from rm_qdrant_exporters.linear import linear_encoder

SPEC = InputSpec(height=8, width=8, channels=3)
PIXELS = SPEC.height * SPEC.width * SPEC.channels
OLD_DIM, NEW_DIM = 6, 10


@pytest.fixture(autouse=True, scope="session")
def _caches_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Decoded images, embeddings and probe samples go to a throwaway folder, not ~/.cache."""
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("rmq-cache"))
    yield
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@dataclass(frozen=True)
class Models:
    """Encoder files and the matrices inside them, to check results with numpy."""

    old: Path  # output "embedding" (OLD_DIM), plus "scores"
    rm: Path  # outputs "new" (NEW_DIM) and "rev" (OLD_DIM)
    new_only: Path  # output "embedding" (NEW_DIM), for the naive mode
    w_old: np.ndarray
    w_new: np.ndarray
    w_rev: np.ndarray


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    rng = np.random.default_rng(7)
    w_old = rng.normal(size=(PIXELS, OLD_DIM))
    # The new model extends the old one, and ψ selects the old part back: a perfectly
    # compatible pair, so a query's rev vector finds the query's own old copy at distance 0.
    w_new = np.hstack([w_old, rng.normal(size=(PIXELS, NEW_DIM - OLD_DIM))])
    w_rev = np.vstack([np.eye(OLD_DIM), np.zeros((NEW_DIM - OLD_DIM, OLD_DIM))])
    w_cls = rng.normal(size=(OLD_DIM, 3))
    folder = tmp_path_factory.mktemp("models")
    old = linear_encoder(
        folder / "old.onnx",
        [("embedding", "pixels", w_old), ("scores", "embedding", w_cls)],
        input_spec=SPEC,
        name="old-linear",
    )
    rm = linear_encoder(
        folder / "rm.onnx", [("new", "pixels", w_new), ("rev", "new", w_rev)], input_spec=SPEC, name="new-rm"
    )
    new_only = linear_encoder(
        folder / "new.onnx", [("embedding", "pixels", w_new)], input_spec=SPEC, name="new"
    )
    return Models(old, rm, new_only, w_old, w_new, w_rev)


def one_error_line(result) -> str:
    """The one line a CLI failure printed (exit 1, ``Error: ...``, no traceback)."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def make_image_folder(root: Path, *, per_class: int = 8, labels: tuple[str, ...] = ("a", "b", "c")) -> Path:
    """Write real PNG and JPEG files in the ImageFolder layout; each class has its own colour."""
    rng = np.random.default_rng(3)
    for k, label in enumerate(labels):
        base = np.zeros((8, 8, 3), dtype=np.int16)
        base[..., k % 3] = 180
        for i in range(per_class):
            noise = rng.integers(-60, 60, size=(8, 8, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            target = root / label / f"{i:03d}.{'png' if i % 2 else 'jpg'}"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(target)
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images")


#: The side of :func:`make_photo_folder`'s photos: large enough that ``decode="fast"`` decodes them at
#: a reduced DCT scale (1/8 for an 8x8 input), so fast and exact pixels differ.
PHOTO_SIZE = (1600, 1067)


def make_photo_folder(root: Path) -> Path:
    """Write six real camera photos (scikit-learn's two sample JPEGs, turned and cropped) as
    1600x1067 JPEGs in the ImageFolder layout: ``a/`` the temple, ``b/`` the flower."""
    from sklearn.datasets import load_sample_image

    for label, photo in (("a", "china.jpg"), ("b", "flower.jpg")):
        picture = Image.fromarray(load_sample_image(photo))
        width, height = picture.size
        variants = (
            picture,
            picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
            picture.crop((width // 8, height // 8, width - width // 16, height - height // 16)),
        )
        for i, variant in enumerate(variants):
            target = root / label / f"{i:03d}.jpg"
            target.parent.mkdir(parents=True, exist_ok=True)
            variant.resize(PHOTO_SIZE, Image.Resampling.BICUBIC).save(target, quality=90)
    return root


@pytest.fixture(scope="session")
def photo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six large JPEG photos (:func:`make_photo_folder`), shared by the session: read, never written."""
    return make_photo_folder(tmp_path_factory.mktemp("photos"))


@pytest.fixture(params=["edge", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store test runs on the embedded qdrant-edge store and on qdrant-client's :memory:."""
    opened = open_store(tmp_path / "qdrant" if request.param == "edge" else ":memory:")
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """A local Ray for this test process (4 logical CPUs), which ``--engine ray`` runs use and
    leave running; skipped where Ray is not installed."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'rm-qdrant[ray]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """A TCP server on 127.0.0.1 whose every connection runs ``answer(conn)``; yields a starter."""
    servers = []

    def start(answer: Callable[[socket.socket], None]) -> str:
        sock = socket.create_server(("127.0.0.1", 0))
        servers.append(sock)

        def serve() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                threading.Thread(target=_answer, args=(answer, conn), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    yield start
    for sock in servers:
        sock.close()


def _answer(answer: Callable[[socket.socket], None], conn: socket.socket) -> None:
    with conn:
        try:
            conn.recv(65536)
            answer(conn)
        except OSError:
            pass


@dataclass
class Trickling:
    """A server on 127.0.0.1 that answers every request with headers a byte every 0.3 s, forever."""

    url: str
    connections: list[None]  # one entry per request it got


@pytest.fixture
def trickling_server(raw_server: Callable[[Callable[[socket.socket], None]], str]) -> Trickling:
    connections: list[None] = []

    def trickle(conn: socket.socket) -> None:
        connections.append(None)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            conn.sendall(b"a")
            time.sleep(0.3)

    return Trickling(raw_server(trickle), connections)


class QuietHandler(BaseHTTPRequestHandler):
    """A test server's request handler: no access log, and one way to answer with a body."""

    def reply(self, body: bytes) -> None:
        """Answer 200 with ``body``; a client that hung up meanwhile (a stopped run) is no error:
        socketserver would print its traceback to stderr, into a later test's captured output."""
        try:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


class _Handler(QuietHandler):
    """Serves the test image folder over HTTP, plus paths that misbehave on purpose."""

    root: Path
    flaky: dict[str, int]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/slow"):
            time.sleep(1.5)
        if self.path.startswith("/flaky"):
            self.flaky[self.path] = self.flaky.get(self.path, 0) + 1
            if self.flaky[self.path] <= 2:
                self.send_error(503)
                return
        target = self.root / self.path.split("/", 2)[-1]
        if self.path.startswith("/big"):
            self.send_response(200)
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
            return
        if not target.is_file():
            self.send_error(404)
            return
        self.reply(target.read_bytes())


@pytest.fixture
def http_images(image_folder: Path) -> Iterator[str]:
    """A local HTTP server (127.0.0.1) over the image folder; yields its base URL.

    ``/ok/<label>/<file>`` serves a file, ``/slow/...`` answers after 1.5 s,
    ``/flaky/...`` fails twice with 503 first, ``/big/...`` announces a 1 GB body.
    """
    handler = type("Handler", (_Handler,), {"root": image_folder, "flaky": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- a local S3-compatible server (moto) and an AWS environment that points only at it ---

_ISOLATE = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "RMQ_GS_ENDPOINT",
)


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    """A moto S3 server on a free port of 127.0.0.1; yields its URL."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto: str) -> str:
    """The environment of a machine whose only AWS set-up points at moto; yields the endpoint."""
    for name in _ISOLATE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto


@pytest.fixture
def bucket(aws: str) -> tuple[str, Callable[[str, bytes], None]]:
    """A fresh bucket on moto; yields its name and a function that uploads ``key, data``."""
    boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed")
    name = f"rmq-{uuid.uuid4().hex[:12]}"
    client = boto3.session.Session().client("s3", endpoint_url=aws)
    client.create_bucket(Bucket=name)

    def put(key: str, data: bytes) -> None:
        client.put_object(Bucket=name, Key=key, Body=data)

    return name, put


@pytest.fixture
def rmq(tmp_path: Path) -> Callable[..., object]:
    """``rmq --qdrant tmp_path/q ARGS`` in-process; ``ok`` (default) asserts exit status 0."""
    runner = CliRunner()

    def run(*args: object, ok: bool = True):
        result = runner.invoke(cli, ["--qdrant", str(tmp_path / "q"), *map(str, args)])
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


@pytest.fixture
def demo(rmq: Callable[..., object], models: Models, image_folder: Path) -> Path:
    """A pair ``demo`` over the image folder indexed as ``gallery`` (rm mode); a query image."""
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    return sorted(image_folder.glob("b/*"))[0]


def says_remote(store, monkeypatch) -> None:
    """Make ``store`` declare what a remote server does: both searches of a pair sent at once."""
    from dataclasses import replace

    monkeypatch.setattr(type(store), "capabilities", replace(store.capabilities, concurrent_search=True))


#: ``rmq status --json`` fields that change with the clock alone (the recorded pace slides).
PACE_FIELDS = ("points_per_second", "eta_seconds", "pace_seconds", "migrating_now")


def settled(status_json: str) -> dict:
    """``rmq status --json`` output less the fields the clock changes: equal means nothing changed."""
    import json

    return {k: v for k, v in json.loads(status_json).items() if k not in PACE_FIELDS}
