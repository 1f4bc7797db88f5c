"""s3:// and gs:// images from a real S3-compatible server (moto, on 127.0.0.1).

The credential chain is pinned by the environment in every test: fake keys, the
endpoint in AWS_ENDPOINT_URL_S3 (RMQ_GS_ENDPOINT for gs://), no ~/.aws files, no
instance metadata, so a developer's own AWS set-up never takes part.
"""

from __future__ import annotations

import socket
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rm_qdrant import OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.planning import ERROR
from rm_qdrant.errors import SourceError
from rm_qdrant.migration.loading import preflight
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.serving.dual import DualIndex
from rm_qdrant.sources import ImageSource, SourceConfig, retry, shown
from rm_qdrant.sources.s3 import GS_ENDPOINT, gs_endpoint
from rm_qdrant.store import Where
from tests.conftest import make_image_folder

boto3 = pytest.importorskip("boto3", reason="the s3 extra (boto3) is not installed")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")

FAST = SourceConfig(timeout=2.0, retries=2, backoff=0.01)
#: Seconds that only a hang reaches: bounds here tell a hang from a slow, busy machine.
HANG = 30.0


@pytest.fixture
def jpeg(tmp_path: Path) -> bytes:
    return (make_image_folder(tmp_path / "img", per_class=1, labels=("a",)) / "a" / "000.jpg").read_bytes()


def fails(uri: str, match: str, config: SourceConfig = FAST, **kwargs: object) -> str:
    with ImageSource(config, **kwargs) as source, pytest.raises(SourceError, match=match) as caught:  # type: ignore[arg-type]
        source.fetch(uri)
    message = str(caught.value)
    assert message.startswith(shown(uri) + ": "), message
    return message


@pytest.fixture
def raw_server() -> Iterator[Callable[[bytes, bool], int]]:
    """Starts TCP servers on 127.0.0.1 that read a request, send ``reply``, then hang up or hold."""
    servers: list[socket.socket] = []
    held: list[socket.socket] = []

    def serve(server: socket.socket, reply: bytes, hang_up: bool) -> None:
        try:
            while True:
                conn = server.accept()[0]
                held.append(conn)
                conn.recv(65536)
                conn.sendall(reply)
                if hang_up:
                    conn.close()
        except OSError:  # the listening socket was closed: the test is over
            pass

    def start(reply: bytes, hang_up: bool) -> int:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)
        threading.Thread(target=serve, args=(server, reply, hang_up), daemon=True).start()
        return server.getsockname()[1]

    yield start
    for sock in servers + held:
        sock.close()


def test_s3_fetch_returns_the_objects_bytes(bucket, jpeg):
    name, put = bucket
    put("cats/001 a.jpg", jpeg)
    with ImageSource(FAST) as source:
        assert source.fetch(f"s3://{name}/cats/001 a.jpg") == jpeg
        assert source.fetch(f"S3://{name}/cats/001 a.jpg") == jpeg  # schemes are case-blind


def test_gs_goes_to_its_own_endpoint_not_aws_endpoint_url(aws, bucket, jpeg, monkeypatch, closed_port):
    name, put = bucket
    put("g/1.jpg", jpeg)
    assert gs_endpoint() == GS_ENDPOINT == "https://storage.googleapis.com"  # AWS_ENDPOINT_URL_S3 is set
    monkeypatch.setenv("RMQ_GS_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    message = fails(f"gs://{name}/g/1.jpg", f"could not connect to http://127.0.0.1:{closed_port}")
    assert "after 3 attempts" in message  # s3:// still reaches moto meanwhile:
    with ImageSource(FAST) as source:
        assert source.fetch(f"s3://{name}/g/1.jpg") == jpeg
    monkeypatch.setenv("RMQ_GS_ENDPOINT", aws)
    with ImageSource(FAST) as source:
        assert source.fetch(f"gs://{name}/g/1.jpg") == jpeg


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("{bucket}/nope.jpg", r"NoSuchKey \(the object does not exist\)$"),
        ("rmq-no-such-bucket/x.jpg", r"NoSuchBucket \(the bucket does not exist\)$"),
        ("{bucket}/big.jpg", r"\d+ bytes is over the 100-byte limit$"),
    ],
)
def test_s3_failures_say_why_and_are_not_retried(bucket, jpeg, where, why, monkeypatch):
    name, put = bucket
    put("big.jpg", jpeg)
    waits: list[float] = []
    monkeypatch.setattr(retry, "time", types.SimpleNamespace(sleep=waits.append))
    fails("s3://" + where.format(bucket=name), why, SourceConfig(max_bytes=100, retries=3, backoff=5.0))
    assert waits == []  # no backoff was waited: one attempt (the message has no "after N attempts")


def test_no_credentials_say_where_they_were_looked_for(aws, bucket, monkeypatch):
    name, _ = bucket
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    fails(f"s3://{name}/x.jpg", r"no AWS credentials found \(environment, ~/.aws, or an instance role\)")
    monkeypatch.setenv("RMQ_GS_ENDPOINT", aws)
    fails(f"gs://{name}/x.jpg", "needs a GCS HMAC key as AWS_ACCESS_KEY_ID.*not used")


def test_server_down_is_retried_then_reported(aws, monkeypatch, closed_port):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port}")
    fails(
        "s3://photos/x.jpg",
        rf"^s3://photos/x.jpg: connection failed: could not connect to http://127.0.0.1:{closed_port}"
        r" \(.*refused\) \(after 3 attempts\)$",
    )


HEADERS = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: image/jpeg\r\n\r\n"


@pytest.mark.parametrize(
    ("reply", "hang_up", "why"),
    [
        (b"", False, r"timed out after 0.3 s \(after 2 attempts\)$"),  # never answers
        (HEADERS + b"x" * 10, False, r"timed out after 0.3 s \(after 2 attempts\)$"),  # body stalls
        (HEADERS + b"x" * 10, True, r"connection failed: .* broke off \(after 2 attempts\)$"),  # cut short
    ],
)
def test_stalled_or_cut_transfers_are_retried_then_reported(
    aws, monkeypatch, raw_server, reply, hang_up, why
):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{raw_server(reply, hang_up)}")
    # The reason names the deadline that cut each attempt (botocore's own would wait 60 s per
    # read and say so in its words) and the attempts made.
    fails("s3://photos/x.jpg", why, SourceConfig(timeout=0.3, retries=1, backoff=0.01))


class _WaitsRecorded(threading.Event):
    """A stop event that records what each wait on it returned (True: ended by the stop)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[bool] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(super().wait(timeout))
        return self.waits[-1]


def test_a_stopping_run_retries_nothing(aws, monkeypatch, closed_port):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port}")
    stop = _WaitsRecorded()
    threading.Timer(0.2, stop.set).start()
    fails(
        "s3://photos/x.jpg",
        r"not retried, the run is stopping|\(after 1 attempts\)$",  # set during the wait, or the attempt
        SourceConfig(retries=3, backoff=10 * HANG),
        stop=stop,
    )
    # No second attempt (the message); and the backoff was a wait on the stop, which the stop
    # ended (a wait that ran out its 10 x HANG seconds returns False).
    assert stop.waits in ([], [True]), stop.waits
    fails("s3://photos/x.jpg", "not fetched, the run is stopping", stop=stop)


def test_the_allow_list_still_applies(aws):
    web_only = SourceConfig(schemes=("file", "http", "https"))
    fails("s3://photos/x.jpg", r"scheme 's3' is not allowed \(allowed: file, http, https\)", web_only)
    fails("gs://photos/x.jpg", "scheme 'gs' is not allowed", web_only)
    assert {"s3", "gs"} <= set(SourceConfig().schemes)


@pytest.mark.parametrize(
    "uri",
    ["s3://", "s3:///key.jpg", "s3://bucket", "s3://bucket/", "s3:bucket/key", "gs://bad bucket/k.jpg"]
    + ["s3://a:b/k.jpg", "s3://" + "x" * 300 + "/k.jpg", "gs://bü cket/k.jpg"],
)
def test_malformed_uris_are_source_errors(aws, uri):
    fails(uri, "malformed URI")


def test_secrets_in_uris_never_reach_messages(bucket, monkeypatch, closed_port):
    name, _ = bucket
    secret = "s3cr3t-VALUE"
    assert secret not in fails(f"s3://{name}/x.jpg?X-Amz-Signature={secret}&token={secret}", "NoSuchKey")
    assert secret not in fails(f"s3://AKIAXYZ:{secret}@{name}/x.jpg", "malformed URI")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port}")
    message = fails(f"s3://{name}/x.jpg?api_key={secret}", "connection failed", SourceConfig(retries=0))
    assert secret not in message  # botocore's own text would carry the key, URL-encoded


def test_without_boto3_the_message_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    fails("s3://photos/x.jpg", r"need boto3: pip install 'rm-qdrant\[s3\]'")


def test_migration_records_s3_failures_per_point_and_moves_the_rest(store, models, bucket, tmp_path):
    name, put = bucket
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    index_images(store, "old", OnnxEncoder(models.old), items)
    for item in items:
        put(f"g/{Path(item.uri).name}-{item.point_id}", Path(item.uri).read_bytes())
    uris = {item.point_id: f"s3://{name}/g/{Path(item.uri).name}-{item.point_id}" for item in items}
    broken = {items[0].point_id: "NoSuchKey", items[1].point_id: "NoSuchBucket"}
    uris[items[0].point_id] = f"s3://{name}/g/deleted.jpg"
    uris[items[1].point_id] = "s3://rmq-gone-bucket/g/x.jpg"
    store.set_payload("old", [(i, {"uri": uri}) for i, uri in uris.items()])
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    options = MigrateOptions(batch=5, fetch_workers=3, source=FAST, max_failure_share=1.0)
    report = run_migration(DualIndex.open(store, "p", exact=True), options)
    assert (report.moved, report.failed) == (len(items) - 2, 2)
    reasons = {r.id: r.payload[ERROR] for r in store.retrieve("old", list(broken))}
    assert all(reasons[i].startswith(uris[i] + ": " + code) for i, code in broken.items()), reasons


def test_preflight_tries_the_http_points_behind_the_s3_ones(store, models, bucket, tmp_path, closed_port):
    """The first points by id are on S3 (readable), the others on HTTP at a private address that
    --allow-private-network would let through: the pre-flight refuses before any point is marked
    failed, without a request (the address is refused before a connection; nothing listens)."""
    name, put = bucket
    items = sorted(
        scan_image_folder(make_image_folder(tmp_path / "g", per_class=4)), key=lambda i: i.point_id
    )
    index_images(store, "old", OnnxEncoder(models.old), items)
    uris = {}
    for item in items[:6]:
        put(f"g/{item.point_id}.jpg", Path(item.uri).read_bytes())
        uris[item.point_id] = f"s3://{name}/g/{item.point_id}.jpg"
    for item in items[6:]:
        uris[item.point_id] = f"http://127.0.0.1:{closed_port}/g/{item.point_id}.jpg"
    store.set_payload("old", [(i, {"uri": uri}) for i, uri in uris.items()])
    pair = create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    with pytest.raises(SourceError, match=r"could be read from http://127\.0\.0\.1, .*private") as refused:
        preflight(store, pair, OnnxEncoder(models.rm), FAST)
    assert str(refused.value).startswith("none of 5 sampled images")
    assert store.count("old", Where(not_empty=(ERROR,))) == 0
