"""DualIndex(metrics=SearchMetrics(registry)): each search observed in the application's own
registry, on both layouts and both embedded stores, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from rm_qdrant import AsyncDualIndex, ConfigError, DualIndex, SearchMetrics, create_pair
from rm_qdrant.monitoring import MetricsServer
from tests.conftest import OLD_DIM, says_remote
from tests.serving.test_dual import linear_rm_with_dims, unit

N = 60


@pytest.fixture(params=["paired", "single-collection"])
def pair(request, store, models):
    """N points, every other one migrated: hits come from both sides."""
    store.create_collection("photos", dim=OLD_DIM, distance="cosine")
    gallery = unit(N, OLD_DIM, 1)
    store.upsert("photos", list(range(N)), gallery, [{"price": float(i)} for i in range(N)])
    options = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="photos", encoder=linear_rm_with_dims(models, OLD_DIM), **options)
    moved = list(range(0, N, 2))
    DualIndex.open(store, "p", exact=True).upsert_vectors(moved, gallery[moved])
    return request.param


def scraped(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    """The registry served over HTTP and parsed: (sample name, side or '') -> value, pair 'p'."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with MetricsServer(port, host="127.0.0.1", registry=registry) as server:
        text = httpx.get(server.url, timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("pair") == "p" and "le" not in s.labels:
                samples[(s.name, s.labels.get("side", ""))] = s.value
    return samples


def counted(rows) -> dict[str, int]:
    return {side: sum(h.source == side for hits in rows for h in hits) for side in ("old", "new")}


def test_each_search_is_observed_with_the_sides_of_its_hits(pair, store, image_folder):
    registry = CollectorRegistry()
    index = DualIndex.open(store, "p", exact=True, metrics=SearchMetrics(registry))
    queries = unit(3, OLD_DIM, 5)
    rows = [index.search_vectors(q, q, limit=7) for q in queries]  # three searches
    rows += index.search_vectors_batch(queries, queries, limit=5, offset=2)  # one search of three
    rows.append(index.search(sorted(image_folder.rglob("*.png"))[0], limit=4))  # one, encoding included
    rows.append(index.search_vectors(queries[0], queries[0], limit=0))  # one, of no hit
    hits = counted(rows)
    assert hits["old"] and hits["new"]  # the pair serves from both sides
    samples = scraped(registry)
    searches = 6
    assert samples[("rmq_searches_total", "")] == searches
    assert samples[("rmq_search_seconds_count", "total")] == searches
    for side in ("old", "new"):
        assert samples[("rmq_search_hits_total", side)] == hits[side]
    old, new = samples[("rmq_search_seconds_count", "old")], samples[("rmq_search_seconds_count", "new")]
    if pair == "paired":  # each side searched apart by every search that asked for a hit
        assert old == new == searches - 1
    else:  # one query searches both vectors (both embedded stores take it): no side of its own
        assert old == new == 0
    total = samples[("rmq_search_seconds_sum", "total")]
    assert total > 0 and total >= max(samples[("rmq_search_seconds_sum", s)] for s in ("old", "new"))


def test_searches_sent_to_both_sides_at_once_time_each_side(store, models, monkeypatch):
    """Against a server, old is searched on a thread of the index while new is searched on the
    caller's: each side's seconds still count for the search that asked."""
    says_remote(store, monkeypatch)
    store.create_collection("photos", dim=OLD_DIM, distance="cosine")
    gallery = unit(N, OLD_DIM, 1)
    store.upsert("photos", list(range(N)), gallery)
    create_pair(store, "p", old_collection="photos", encoder=linear_rm_with_dims(models, OLD_DIM))
    DualIndex.open(store, "p").upsert_vectors(list(range(0, N, 2)), gallery[0:N:2])
    registry = CollectorRegistry()
    with DualIndex.open(store, "p", exact=True, metrics=SearchMetrics(registry)) as index:
        assert index._pool is not None  # both sides at once
        rows = [index.search_vectors(q, q, limit=9) for q in unit(4, OLD_DIM, 6)]
    value = registry.get_sample_value
    for side in ("old", "new"):
        assert value("rmq_search_seconds_count", {"pair": "p", "side": side}) == 4
        assert value("rmq_search_hits_total", {"pair": "p", "side": side}) == counted(rows)[side]


def test_the_awaitable_index_is_observed_as_the_blocking_one(pair, store):
    registry = CollectorRegistry()
    metrics = SearchMetrics(registry)
    queries = unit(4, OLD_DIM, 7)

    async def main():
        async with await AsyncDualIndex.open(store, "p", exact=True, metrics=metrics) as index:
            return await asyncio.gather(*(index.search_vectors(q, q, limit=6) for q in queries))

    rows = asyncio.run(main())
    value = registry.get_sample_value
    assert value("rmq_searches_total", {"pair": "p"}) == 4
    assert value("rmq_search_seconds_count", {"pair": "p", "side": "total"}) == 4
    for side, count in counted(rows).items():
        assert value("rmq_search_hits_total", {"pair": "p", "side": side}) == count


def test_a_search_that_fails_is_not_counted(pair, store):
    registry = CollectorRegistry()
    index = DualIndex.open(store, "p", metrics=SearchMetrics(registry))
    with pytest.raises(ConfigError, match="limit must be an integer"):
        index.search_vectors(unit(1, OLD_DIM, 1)[0], unit(1, OLD_DIM, 1)[0], limit=-1)
    index.search_vectors(unit(1, OLD_DIM, 1)[0], unit(1, OLD_DIM, 1)[0], limit=3)  # the thread is not stuck
    assert registry.get_sample_value("rmq_searches_total", {"pair": "p"}) == 1


def test_bad_metrics_are_refused_in_one_clear_error(pair, store):
    registry = CollectorRegistry()
    SearchMetrics(registry)
    with pytest.raises(ConfigError, match="a registry takes one SearchMetrics"):
        SearchMetrics(registry)
    with pytest.raises(ConfigError, match="registry is a prometheus_client CollectorRegistry"):
        SearchMetrics("registry")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="metrics is a SearchMetrics"):
        DualIndex.open(store, "p", metrics=registry)  # type: ignore[arg-type]


def test_a_registry_with_an_application_metric_of_the_same_name_is_left_as_it_was():
    registry = CollectorRegistry()
    Counter("rmq_search_hits", "the application's own", registry=registry)  # the last SearchMetrics makes
    with pytest.raises(ConfigError, match="rmq_search_hits"):
        SearchMetrics(registry)
    assert sorted(m.name for m in registry.collect()) == ["rmq_search_hits"]  # nothing half-registered


@pytest.mark.parametrize("buckets", [(1.0, 0.5), (), ("fast", "slow"), None])
def test_bad_buckets_are_refused_as_bad_buckets(buckets):
    registry = CollectorRegistry()
    with pytest.raises(ConfigError, match="buckets are two or more upper bounds in seconds"):
        SearchMetrics(registry, buckets=buckets)
    assert list(registry.collect()) == []
