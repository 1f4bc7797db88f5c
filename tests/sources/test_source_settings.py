"""The pair remembers how its images are fetched: ``rmq init`` records the source settings,
every later command uses them, a command-line value overrides for one run and says so,
and HTTP headers (secrets) never show in any output."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from rm_qdrant.store import open_store
from tests.conftest import QuietHandler

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-bearer-value"  # noqa: S105 - a test value


class _Images(QuietHandler):
    """Serves ``/img/<absolute path>``; with ``needs`` set, only to requests that send that header."""

    needs: tuple[str, str] | None = None
    seen: list[str]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.seen.append(self.path)
        if self.needs is not None and self.headers.get(self.needs[0]) != self.needs[1]:
            self.send_error(401)
            return
        target = Path(unquote(self.path.removeprefix("/img")))
        if not target.is_file():
            self.send_error(404)
            return
        self.reply(target.read_bytes())


def _serve(needs: tuple[str, str] | None):
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_Images,), {"needs": needs, "seen": []}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def served():
    servers = []

    def start(needs=None):
        servers.append(_serve(needs))
        return f"http://127.0.0.1:{servers[-1].server_address[1]}/img{{uri}}"

    start.seen = lambda: servers[-1].RequestHandlerClass.seen  # the paths the last server was asked for
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def gallery(rmq, models, image_folder):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    return "gallery"


def _init(rmq, models, template, *source):
    return rmq(
        "init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm,
        "--uri-template", template, *source,
    )  # fmt: skip


def _failed(rmq):
    return json.loads(rmq("status", "--name", "demo", "--json").output)["failed"]


def test_a_plain_migrate_uses_the_settings_init_recorded(rmq, models, gallery, served):
    _init(rmq, models, served(), "--allow-private-network", "--timeout", "30")
    report = json.loads(rmq("migrate", "--name", "demo", "--json").output)
    assert report["moved"] == 24 and report["failed"] == 0
    status = rmq("status", "--name", "demo").output
    assert "allow-private-network" in status and "--timeout 30" in status
    recorded = json.loads(rmq("status", "--name", "demo", "--json").output)["source"]
    assert recorded["allow_private"] is True and recorded["timeout"] == 30


def test_a_command_line_value_overrides_for_that_run_and_says_so(rmq, models, gallery, served):
    _init(rmq, models, served(), "--allow-private-network", "--timeout", "30")
    result = rmq("migrate", "--name", "demo", "--timeout", "5", "--max-pixels", "1", ok=False)
    assert "using --timeout 5 for this run (the pair records 30)" in result.stderr
    # --max-pixels 1 was used: no image passes, and the pre-flight stops before any point fails
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "none of" in result.stderr and len(result.stderr.strip().splitlines()) == 2
    assert _failed(rmq) == 0
    assert "--timeout 30" in rmq("status", "--name", "demo").output  # the record is unchanged


def test_preflight_stops_in_one_line_and_marks_nothing_failed(rmq, models, gallery, served):
    _init(rmq, models, served())  # no --allow-private-network: every fetch is refused
    result = rmq("migrate", "--name", "demo", "--order", "payload:label", ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "private" in lines[0] and "could be read" in lines[0]
    assert _failed(rmq) == 0


def test_a_header_from_the_environment_is_sent_and_never_shown(rmq, models, gallery, served, monkeypatch):
    monkeypatch.setenv("RMQ_TEST_TOKEN", f"Bearer {SECRET}")
    template = served(needs=("Authorization", f"Bearer {SECRET}"))
    shown = [
        _init(rmq, models, template, "--allow-private-network",
              "--http-header", "Authorization: $RMQ_TEST_TOKEN", "--json"),
        rmq("-v", "migrate", "--name", "demo", "--json"),
        rmq("status", "--name", "demo"),
        rmq("status", "--name", "demo", "--json"),
    ]  # fmt: skip
    assert json.loads(shown[1].stdout)["moved"] == 24
    assert "Authorization: $RMQ_TEST_TOKEN" in shown[2].output
    assert all(SECRET not in result.output for result in shown)
    monkeypatch.delenv("RMQ_TEST_TOKEN")
    result = rmq("migrate", "--name", "demo", "--retry-failed", ok=False)
    assert result.exit_code == 1 and "RMQ_TEST_TOKEN" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_literal_header_value_is_redacted_everywhere(rmq, models, gallery, served):
    template = served(needs=("X-Api-Key", SECRET))
    shown = [
        _init(rmq, models, template, "--allow-private-network",
              "--http-header", f"X-Api-Key: {SECRET}", "--json"),
        rmq("status", "--name", "demo"),
        rmq("status", "--name", "demo", "--json"),
    ]  # fmt: skip
    wrong = rmq("migrate", "--name", "demo", "--http-header", "X-Api-Key: wrong-value", ok=False)
    assert wrong.exit_code == 1 and "X-Api-Key" in wrong.stderr and "wrong-value" not in wrong.output
    assert _failed(rmq) == 0
    shown.append(rmq("-v", "migrate", "--name", "demo", "--json"))
    assert json.loads(shown[-1].stdout)["moved"] == 24
    assert all(SECRET not in result.output for result in shown)


def test_fit_reads_a_few_images_before_sampling(rmq, models, gallery, served, tmp_path):
    pytest.importorskip("torch", reason="rmq fit needs the train extra")
    _init(rmq, models, served())  # no --allow-private-network: every fetch is refused
    out = tmp_path / "fitted.onnx"
    fit = ["fit", "--name", "demo", "--backbone", models.new_only, "--out", out, "--sample", 8]
    result = rmq(*fit, ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "could be read" in lines[0] and not out.exists()


@pytest.mark.parametrize("command", ["probe", "calibrate"])
def test_probe_and_calibrate_read_a_few_images_before_their_sample(rmq, models, gallery, served, command):
    template = served(needs=("Authorization", f"Bearer {SECRET}"))  # the pair was set up without it
    pair = [
        "--name",
        "demo",
        "--old-collection",
        "gallery",
        "--uri-template",
        template,
        "--allow-private-network",
    ]
    if command == "probe":
        rmq("init", *pair, "--encoder", models.rm)
    else:
        rmq("init", *pair, "--encoder", models.new_only, "--old-encoder", models.old)
    result = rmq(command, "--name", "demo", "--sample", 24, ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "could be read" in lines[0] and "HTTP 401" in lines[0]
    assert len(served.seen()) <= 5  # a handful of fetches, not the whole sample


def test_preflight_tries_each_kind_of_source_the_run_will_meet(rmq, models, gallery, served, tmp_path):
    base = served().removesuffix("{uri}")  # http://127.0.0.1:PORT/img
    with open_store(tmp_path / "q") as store:
        records, _ = store.scroll("gallery", limit=100)
        # the first points by id stay local files (all a five-image sample of the first points would
        # see); the others come over HTTP, from an address refused without --allow-private-network
        later = sorted(records, key=lambda r: r.id)[8:]
        store.set_payload("gallery", [(r.id, {"uri": base + r.payload["uri"]}) for r in later])
    rmq("init", "--name", "demo", "--old-collection", "gallery", "--encoder", models.rm)
    result = rmq("migrate", "--name", "demo", ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "private" in lines[0]
    assert "images could be read from http://127.0.0.1," in lines[0]
    status = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert status["failed"] == 0 and status["new_count"] == 0  # nothing started, no point marked failed
    assert served.seen() == []  # refused by its address: no request was sent
    rmq("migrate", "--name", "demo", "--allow-private-network")  # the settings that read both kinds
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["new_count"] == 24
