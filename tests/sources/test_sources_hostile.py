"""Sources that misbehave on purpose: each fails fast with a SourceError that says why.

Real files, FIFOs and devices; real HTTP servers on 127.0.0.1 (with the private-network
guard allowed, except where the guard itself is tested).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable

import pytest

from rm_qdrant.errors import SourceError
from rm_qdrant.sources import ImageSource, SourceConfig
from rm_qdrant.sources import http as http_module

LOCAL = SourceConfig(timeout=1.0, retries=0, allow_private=True)
#: Seconds that only a hang reaches: bounds here tell a hang from a slow, busy machine.
HANG = 30.0


def fails(uri: str, match: str, config: SourceConfig = LOCAL) -> str:
    with ImageSource(config) as source, pytest.raises(SourceError, match=match) as caught:
        source.fetch(uri)
    return str(caught.value)


def trickle(head: bytes, body: bytes = b"") -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(head)
        for byte in body:
            conn.sendall(bytes([byte]))
            time.sleep(0.3)

    return answer


def reply(raw: bytes) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(raw)


@pytest.mark.parametrize(
    "answer",
    [
        trickle(b"HTTP/1.1 200 OK\r\n", b"X-Slow: " + b"a" * 1000),  # headers, a byte at a time
        trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"b" * 1000),  # the body
    ],
    ids=["headers", "body"],
)
def test_a_trickling_server_is_cut_off_at_the_fetch_deadline(raw_server, answer):
    """Each byte comes well within the socket timeout; the whole answer takes 300 s."""
    # The reason names the fetch deadline (1 s): the socket timeout alone never fires, since
    # each byte comes well within it, and the whole answer would take 10 x HANG seconds.
    fails(raw_server(answer) + "/x.jpg", r"timed out after 1 s")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"HTTP/1.1 302 Found\r\nLocation: /x.jpg\r\nContent-Length: 0\r\n\r\n", "more than 5 redirects"),
        (
            b"HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\nContent-Length: 0\r\n\r\n",
            "redirect|scheme",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 9\r\n\r\nnot gzip!",
            "not valid gzip/deflate data",
        ),
        (b"garbage that is not HTTP\r\n\r\n", "connection failed"),
    ],
    ids=["redirect-loop", "redirect-to-file", "bad-gzip", "not-http"],
)
def test_malformed_answers(raw_server, raw, match):
    fails(raw_server(reply(raw)) + "/x.jpg", match)


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("http://[::1", "malformed|Invalid|InvalidURL"),
        ("http://127.0.0.1:1/" + "a" * 70_000, "URL too long|InvalidURL|malformed"),
        ("/tmp/nul\x00byte.jpg", "embedded null byte"),
        ("/dev/zero", "not a regular file"),
        ("/dev/urandom", "not a regular file"),
        ("file:///dev/zero", "not a regular file"),
    ],
    ids=["broken-ipv6", "64kb-url", "nul-byte", "dev-zero", "dev-urandom", "file-uri-dev-zero"],
)
def test_bad_uris(uri, match):
    message = fails(uri, match)
    assert len(message) < 500  # a 70 KB URI is shortened in the message


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    done = threading.Event()

    def fetch() -> None:
        fails(str(fifo), "not a regular file")
        done.set()

    worker = threading.Thread(target=fetch, daemon=True)  # a blocking open would wait forever
    worker.start()
    worker.join(HANG)
    assert done.is_set(), "opening the FIFO blocked (or failed otherwise)"


def test_a_file_is_read_with_a_bound_whatever_its_size_says(tmp_path):
    big = tmp_path / "big.jpg"
    big.write_bytes(b"x" * 2_000)
    fails(str(big), "over the 1000-byte limit", SourceConfig(max_bytes=1_000))


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("169.254.169.254", "link-local"),
        ("[::ffff:127.0.0.1]", "loopback"),
        ("metadata.google.internal", "metadata service"),
        ("localhost", "loopback"),
    ],
)
def test_the_guard_refuses_local_and_private_addresses_by_default(host, why):
    message = fails(f"http://{host}:8080/x.jpg", why, SourceConfig(retries=0))
    assert "--allow-private-network" in message or "metadata" in message


def test_the_guard_checks_every_redirect(raw_server, monkeypatch):
    """The first hop is allowed (this test's policy lets 127.0.0.1 through by number), the
    redirect to a name that resolves to loopback is refused when its connection opens."""
    target = raw_server(reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    port = target.rsplit(":", 1)[1]
    first = raw_server(reply(f"HTTP/1.1 302 Found\r\nLocation: http://localhost:{port}/x\r\n\r\n".encode()))
    real = http_module.resolve_public
    monkeypatch.setattr(http_module, "resolve_public", lambda h, p: h if h == "127.0.0.1" else real(h, p))
    fails(first + "/x.jpg", "localhost.*loopback|loopback", SourceConfig(retries=0))
    with ImageSource(SourceConfig(retries=0, allow_private=True)) as source:
        assert source.fetch(first + "/x.jpg") == b"ok"


def test_credentials_never_reach_an_error(raw_server, closed_port):
    secret = "hunter2-secret"
    for uri in (
        f"http://user:{secret}@127.0.0.1:{closed_port}/x.jpg",
        f"http://127.0.0.1:{closed_port}/x.jpg?api_key={secret}&size=2",
        f"http://user:{secret}@[::1/x.jpg",
    ):
        with ImageSource(LOCAL) as source, pytest.raises(SourceError) as caught:
            source.fetch(uri)
        assert secret not in str(caught.value) and "***" in str(caught.value)


def gzip_bytes(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, compresslevel=9)


def test_a_gzip_bomb_is_cut_at_the_size_cap_and_stacked_encodings_are_refused(raw_server):
    bomb = gzip_bytes(b"\0" * (64 * 1024 * 1024))  # 64 MiB of zeros in ~65 KB
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n".encode()
    url = raw_server(reply(head + bomb)) + "/x.jpg"
    tracemalloc.start()
    try:
        fails(
            url, "over the 1048576-byte limit", SourceConfig(retries=0, allow_private=True, max_bytes=1 << 20)
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak} bytes at the peak: the bomb was inflated past the cap"
    double = gzip_bytes(gzip_bytes(b"\0" * 1_000_000))
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip, gzip\r\nContent-Length: {len(double)}\r\n\r\n"
    fails(raw_server(reply(head.encode() + double)) + "/x.jpg", "unsupported Content-Encoding 'gzip, gzip'")
    small = gzip_bytes(b"a real body")
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(small)}\r\n\r\n".encode()
    with ImageSource(LOCAL) as source:
        assert source.fetch(raw_server(reply(head + small)) + "/x.jpg") == b"a real body"


def test_names_that_do_not_resolve_are_retried_and_say_which_uri(monkeypatch):
    import socket as sockets

    calls = []

    def no_dns(*args, **kwargs):
        calls.append(args[0])
        raise sockets.gaierror(-2, "Name or service not known")

    monkeypatch.setattr("rm_qdrant.sources.network_guard.socket.getaddrinfo", no_dns)
    message = fails(
        "http://images.example.com/a.jpg", "cannot resolve", SourceConfig(retries=1, backoff=0.01)
    )
    assert message.startswith("http://images.example.com/a.jpg: cannot resolve") and len(calls) == 2


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_timeout_must_be_a_positive_finite_number(value):
    from rm_qdrant.errors import ConfigError

    with pytest.raises(ConfigError, match="--timeout must be a positive number"):
        SourceConfig(timeout=value)
