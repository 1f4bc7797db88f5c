"""``rmq migrate --metrics-port`` and ``migrate(metrics_port=...)``: a real migration (real JPEGs
and PNGs, a real ONNX encoder, the embedded store) scraped over HTTP while it runs, as Prometheus
would, and the port released when it returns."""

from __future__ import annotations

import json
import socket
import time
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import rm_qdrant
from rm_qdrant import OnnxEncoder, create_pair, index_images, load_pair, open_store, scan_image_folder
from rm_qdrant.core.planning import MOVING, RANK
from rm_qdrant.errors import CollectionNotFound, ConfigError
from rm_qdrant.monitoring import exported_metric_names, migration
from rm_qdrant.monitoring.migration import (
    PAIR_STATES,
    MigrationMetrics,
    PairCollector,
    PairFigures,
    read_figures,
)
from rm_qdrant.pair import progress
from rm_qdrant.pair.outcome import STAGES
from rm_qdrant.serving.status import pair_status
from rm_qdrant.sources import SourceConfig
from tests.conftest import make_image_folder, one_error_line

N, BATCH = 40, 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample served on ``port``, as Prometheus parses it: (name, labels) -> value."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"pair": "p", **labels}.items())))]


def closed(port: int) -> bool:
    """Nothing listens on ``port`` and another server can listen there (as servers do, with
    SO_REUSEADDR: the scrapes' connections may linger in TIME_WAIT)."""
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    with socket.create_server(("0.0.0.0", port)):
        return True


@pytest.fixture
def store(models, tmp_path):
    """N real images indexed into 'old' by the old model, and an rm pair 'p' over them."""
    opened = open_store(tmp_path / "q")
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 4, labels=tuple("abcd")))
    index_images(opened, "old", OnnxEncoder(models.old), items)
    create_pair(opened, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    yield opened
    opened.close()


def test_a_migration_is_scraped_while_it_runs_and_its_port_released_after(store, monkeypatch):
    monkeypatch.setattr(migration, "REFRESH_SECONDS", 0.0)  # the pair's figures read at each scrape
    port = free_port()
    seen = []

    def during(result):
        seen.append((result, scrape(port)))

    report = rm_qdrant.migrate(store, "p", batch=BATCH, metrics_port=port, on_batch=during)
    assert report.moved == N and len(seen) == N // BATCH
    moved = 0
    for batches, (result, samples) in enumerate(seen, start=1):
        moved += result.moved
        assert value(samples, "rmq_migrate_moved_points_total") == moved
        assert value(samples, "rmq_migrate_failed_points_total") == 0
        assert value(samples, "rmq_migrate_retries_total") == 0
        for stage in STAGES:  # one observation per batch and stage, of the seconds the batch gives
            assert value(samples, "rmq_migrate_batch_seconds_count", stage=stage) == batches
            assert result.stages[stage] >= 0
        gallery = value(samples, "rmq_gallery_points")
        migrated, remaining = value(samples, "rmq_migrated_points"), value(samples, "rmq_remaining_points")
        assert gallery == N == migrated + remaining + value(samples, "rmq_failed_points")
        assert migrated == moved  # on_batch runs while no other batch is being written
        for state in PAIR_STATES:
            assert value(samples, "rmq_pair_state", state=state) == (state == "backfilling")
        assert value(samples, "rmq_migrate_paused") == 0
        if ("rmq_migrate_points_per_second", (("pair", "p"),)) in samples:  # known once recorded
            pace = value(samples, "rmq_migrate_points_per_second")
            assert pace > 0 and value(samples, "rmq_migrate_eta_seconds") == pytest.approx(remaining / pace)
    last = seen[-1][1]
    assert value(last, "rmq_migrated_points") == N and value(last, "rmq_remaining_points") == 0
    write = sum(r.stages["write"] for r, _ in seen)
    assert value(last, "rmq_migrate_batch_seconds_sum", stage="write") == pytest.approx(write)
    assert closed(port)


def test_the_pace_and_eta_are_the_ones_rmq_status_gives(store, monkeypatch):
    """Read from what every process recorded (here: one run, over), as ``rmq status`` reads it
    (at one instant: the pace of a run that ended is taken up to now)."""
    rm_qdrant.migrate(store, "p", batch=BATCH)
    now = time.time()
    monkeypatch.setattr(progress, "time", SimpleNamespace(time=lambda: now))
    gauges = {m.name: m.samples for m in PairCollector("p", lambda: read_figures(store, "p"), 0).collect()}
    status = pair_status(store, load_pair(store, "p"))
    assert status.points_per_second > 0
    assert gauges["rmq_migrate_points_per_second"][0].value == pytest.approx(status.points_per_second)
    assert gauges["rmq_migrate_eta_seconds"][0].value == 0 == status.eta_seconds  # nothing remains


def test_a_pause_shows_in_the_scrape(store, monkeypatch):
    """rmq pause (here from the run's own on_batch, as another process would) sets
    rmq_migrate_paused; resume clears it, and the run goes on."""
    monkeypatch.setattr(migration, "REFRESH_SECONDS", 0.0)
    port, flags = free_port(), []

    def during(result):
        if not flags:
            rm_qdrant.pause(store, "p")
            flags.append(value(scrape(port), "rmq_migrate_paused"))
            rm_qdrant.resume(store, "p")
            flags.append(value(scrape(port), "rmq_migrate_paused"))

    report = rm_qdrant.migrate(store, "p", batch=BATCH, metrics_port=port, on_batch=during)
    assert flags == [1, 0] and report.moved == N


def test_the_scrape_serves_exactly_the_names_a_dashboard_is_given(store):
    """exported_metric_names() (what a Grafana dashboard is checked against) is what a run
    serves, the search metrics aside."""
    port = free_port()
    families = []

    def during(result):
        if not families:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            families.extend(text_string_to_metric_families(text))

    rm_qdrant.migrate(store, "p", batch=BATCH, metrics_port=port, on_batch=during)
    served = {f"{f.name}_total" if f.type == "counter" else f.name for f in families if f.type != "gauge"}
    served |= {f.name for f in families if f.type == "gauge" and not f.name.endswith("_created")}
    names = exported_metric_names()
    assert served == {n for n in names if not n.startswith(("rmq_search", "rmq_searches"))}
    assert names >= {"rmq_search_seconds", "rmq_search_hits_total", "rmq_searches_total"}


def test_fetches_retried_are_counted(store, http_images, image_folder):
    """Images behind a server that answers 503 twice before each image: two retries a point."""
    served = sorted(p.relative_to(image_folder) for p in image_folder.rglob("*.*"))
    ids = sorted(r.id for r in store.scroll("old", limit=N)[0])[: len(served)]
    store.set_payload("old", [(i, {"uri": f"{http_images}/flaky/{p}"}) for i, p in zip(ids, served)])
    port = free_port()
    seen = []
    source = SourceConfig(retries=2, backoff=0.01, allow_private=True)
    report = rm_qdrant.migrate(
        store,
        "p",
        batch=N,
        source=source,
        metrics_port=port,
        on_batch=lambda r: seen.append((r, scrape(port))),
    )
    (result, samples), *_ = seen
    assert report.moved == N and report.failed == 0
    assert result.retries == 2 * len(served) == value(samples, "rmq_migrate_retries_total")


def test_a_run_that_fails_to_start_releases_its_port(store):
    port = free_port()
    with pytest.raises(CollectionNotFound):
        rm_qdrant.migrate(store, "no-such-pair", metrics_port=port)
    assert closed(port)


@pytest.mark.parametrize("port", [0, 65536, -1, True, "9100", 1.5])
def test_a_bad_metrics_port_is_refused_before_anything_is_written(store, port):
    with pytest.raises(ConfigError, match="metrics port .* whole number from 1 to 65535"):
        rm_qdrant.migrate(store, "p", metrics_port=port)
    assert load_pair(store, "p").order is None and store.count("p-new") == 0


def test_a_metrics_host_that_is_not_this_machines_is_one_clear_error(store):
    with pytest.raises(ConfigError, match="192.0.2.1 is not an address of this machine"):
        rm_qdrant.migrate(store, "p", metrics_port=free_port(), metrics_host="192.0.2.1")
    with pytest.raises(ConfigError, match="only with a metrics port"):
        rm_qdrant.migrate(store, "p", metrics_host="127.0.0.1")
    assert store.count("p-new") == 0


def test_the_pairs_figures_are_read_once_per_refresh_whatever_the_scrapes():
    """Reading them costs several counts: scrapes in between get the last figures."""
    reads = []
    figures = PairFigures(10, 4, 5, 1, "backfilling", False, None, None)
    collector = PairCollector("p", lambda: reads.append(1) or figures, every=3600)
    for _ in range(5):
        assert list(collector.collect())
    assert len(reads) == 1

    def broken():
        raise CollectionNotFound("no pair named 'p'")

    empty = PairCollector("p", broken, every=0)
    gauges = {m.name: m.samples for m in empty.collect()}
    assert gauges["rmq_gallery_points"] == [] and gauges["rmq_pair_state"] == []  # served, empty


def test_a_registry_takes_one_migration_metrics():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    MigrationMetrics(registry, "p")
    with pytest.raises(ConfigError, match="one MigrationMetrics"):
        MigrationMetrics(registry, "p")


def test_a_registry_with_a_metric_of_the_same_name_is_left_as_it_was():
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("rmq_migrate_retries", "someone else's", registry=registry)  # the third MigrationMetrics makes
    with pytest.raises(ConfigError, match="rmq_migrate_retries"):
        MigrationMetrics(registry, "p")
    assert sorted(m.name for m in registry.collect()) == ["rmq_migrate_retries"]  # nothing half-registered


# -- the command line -----------------------------------------------------------------------


def _untouched(tmp_path) -> None:
    """The demo pair as rmq init left it: no rank, no claim, nothing in new."""
    with open_store(tmp_path / "q") as store:
        records, _ = store.scroll("gallery", limit=1000)
        assert records and not any(RANK in r.payload or MOVING in r.payload for r in records)
        assert store.count("demo-new") == 0 and load_pair(store, "demo").order is None


def test_rmq_migrate_serves_metrics_on_the_port_given(rmq, demo, tmp_path):
    port = free_port()
    report = json.loads(rmq("migrate", "--name", "demo", "--metrics-port", port, "--json").output)
    assert report["moved"] == 24 and closed(port)


def test_a_metrics_port_in_use_is_one_line_and_changes_nothing(rmq, demo, tmp_path):
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        line = one_error_line(rmq("migrate", "--name", "demo", "--metrics-port", port, ok=False))
    assert f"metrics port {port} on 0.0.0.0 is in use" in line
    _untouched(tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "0"], "0 is not in the range 1<=x<=65535"),
        (["--metrics-port", "65536"], "65536 is not in the range 1<=x<=65535"),
        (["--metrics-port", "http"], "'http' is not a valid integer"),
        (["--metrics-host", "127.0.0.1"], "only with a metrics port (--metrics-port)"),
        (["--metrics-port", "9", "--metrics-host", "no-such-host.invalid"], "does not resolve"),
        (["--metrics-port", "9", "--metrics-host", "metrics..example.com"], "is not a host name"),
        (["--metrics-port", "9", "--metrics-host", "x" * 64], "is not a host name"),
    ],
)
def test_bad_metrics_options_are_one_line(rmq, demo, tmp_path, args, message):
    line = one_error_line(rmq("migrate", "--name", "demo", *args, ok=False))
    assert message in line
    _untouched(tmp_path)


def test_a_batchs_load_time_is_shared_between_fetch_and_decode_by_their_threads_time():
    from rm_qdrant.migration.loading import stage_seconds

    assert stage_seconds(2.0, fetch=1.0, decode=3.0) == {"fetch": 0.5, "decode": 1.5}
    assert stage_seconds(0.25, fetch=0.0, decode=0.0) == {"fetch": 0.25, "decode": 0.0}  # no image read
