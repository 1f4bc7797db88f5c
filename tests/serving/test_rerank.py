"""Re-rank: the new model re-scores the old hits of a merged list, checked against a brute-force
ranking of the whole gallery by the new model, over distances x layouts x stores."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from rm_qdrant import (
    ConfigError,
    DualIndex,
    OnnxEncoder,
    create_pair,
    index_images,
    migrate,
    scan_image_folder,
)
from rm_qdrant.core.merge import id_key
from rm_qdrant.core.rerank import RESCORED, Rerank, new_distances
from rm_qdrant.pair.record import SINGLE
from rm_qdrant.sources import SourceConfig
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import OLD_DIM, SPEC

DISTANCES = ("cosine", "dot", "euclid", "manhattan")
LAYOUTS = ("paired", "keep-old", "single")


@pytest.fixture(scope="module")
def graphs(models, tmp_path_factory):
    """The suite's old and rm graphs, stamped for any distance (raw vectors)."""
    folder = tmp_path_factory.mktemp("any-distance")
    old = linear_encoder(
        folder / "old.onnx",
        [("embedding", "pixels", models.w_old)],
        input_spec=SPEC,
        name="old-any",
        distance=None,
        scale="raw",
    )
    rm = linear_encoder(
        folder / "rm.onnx",
        [("new", "pixels", models.w_new), ("rev", "new", models.w_rev)],
        input_spec=SPEC,
        name="rm-any",
        distance=None,
        scale="raw",
    )
    return SimpleNamespace(old=old, rm=rm)


def make_pair(store, graphs, folder, distance: str, layout: str, *, moved: int = 8, **pair_options):
    """The team's gallery in ``distance``, a pair over it in ``layout``, ``moved`` points migrated."""
    items = scan_image_folder(folder)
    vector = "old" if layout == "single" else ""
    store.create_collection("gallery", dim=OLD_DIM, distance=distance, vector=vector)
    report = index_images(store, "gallery", OnnxEncoder(graphs.old), items, vector=vector or None)
    assert report.indexed == len(items)
    shape = {"keep_old": True, "old_encoder": OnnxEncoder(graphs.old)} if layout == "keep-old" else {}
    if layout == "single":
        shape = {"layout": SINGLE, "new_vector": "img2"}
    create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(graphs.rm), **shape, **pair_options)
    if moved:
        migrate(store, "p", limit=moved, batch=4)
    return items


def new_ranking(graphs, items, query_uri: str, distance: str) -> list:
    """Every gallery point ranked by the new model's distance to the query (ties by id)."""
    rm = OnnxEncoder(graphs.rm)
    gallery = rm.encode([i.uri for i in items], ["new"])["new"]
    query = rm.encode([query_uri], ["new"], query=True)["new"][0]
    d = new_distances(query, gallery, distance)
    return [
        i.point_id for _, i in sorted(zip(d.tolist(), items), key=lambda x: (x[0], id_key(x[1].point_id)))
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("distance", DISTANCES)
def test_a_rerank_over_the_whole_list_serves_the_new_models_ranking(
    store, graphs, image_folder, distance, layout
):
    """With K covering the gallery, the re-ranked list is New's own ranking, mid-migration."""
    items = make_pair(store, graphs, image_folder, distance, layout)
    index = DualIndex.open(store, "p", exact=True)
    n = len(items)
    for query in (items[0].uri, items[13].uri):
        plain = index.search(query, limit=n)
        hits = index.search(query, limit=n, rerank=n)
        expected = new_ranking(graphs, items, query, distance)
        assert [h.id for h in plain] != expected  # the old half's distances are not New's
        assert [h.id for h in hits] == expected
        assert {h.source for h in hits} == {"old", "new"}
        assert all(h.rerank in RESCORED for h in hits)
        assert all((h.rerank == "new") == (h.source == "new") for h in hits)
    index.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_first_k_are_reranked_and_the_rest_keep_the_merged_order(store, graphs, image_folder, layout):
    items = make_pair(store, graphs, image_folder, "cosine", layout)
    index = DualIndex.open(store, "p", exact=True)
    plain = index.search(items[3].uri, limit=len(items))
    hits = index.search(items[3].uri, limit=len(items), rerank=5)
    assert {h.id for h in hits[:5]} == {h.id for h in plain[:5]}
    assert [h.id for h in hits[5:]] == [h.id for h in plain[5:]]
    assert all(h.rerank is None for h in hits[5:])
    first = [h.distance for h in hits[:5]]
    assert first == sorted(first)
    # a page past the first K: offset and limit apply to the re-ranked list
    page = index.search(items[3].uri, limit=3, offset=2, rerank=5)
    assert [h.id for h in page] == [h.id for h in hits[2:5]]
    index.close()


def test_vectors_are_cached_by_item_and_an_updated_image_is_embedded_again(store, graphs, image_folder):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    first = index.search(items[0].uri, limit=6, rerank=6)
    assert {h.rerank for h in first} == {"embedded"}
    again = index.search(items[0].uri, limit=6, rerank=6)
    assert [h.id for h in again] == [h.id for h in first]
    assert {h.rerank for h in again} == {"cached"}
    # a writer that bypasses rm-qdrant points one of them at another image
    changed = again[0].id
    other = next(i for i in items if i.point_id not in {h.id for h in again})
    store.set_payload("gallery", [(changed, {"uri": other.uri})])
    third = index.search(items[0].uri, limit=6, rerank=6)
    state = {h.id: h.rerank for h in third}
    assert state.get(changed, "embedded") == "embedded"
    assert [s for i, s in state.items() if i != changed] == ["cached"] * (len(state) - (changed in state))
    index.close()


def test_budget_reads_the_closest_old_hits_first(store, graphs, image_folder):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    plain = index.search(items[5].uri, limit=6)
    hits = index.search(items[5].uri, limit=6, rerank=Rerank(6, budget=2))
    state = {h.id: h.rerank for h in hits}
    assert [state[h.id] for h in plain[:2]] == ["embedded", "embedded"]
    assert [state[h.id] for h in plain[2:]] == ["over budget"] * 4
    kept = {h.id: h.distance for h in hits if h.rerank == "over budget"}
    assert kept == {h.id: h.distance for h in plain[2:]}  # their merged distances
    cache_only = index.search(items[5].uri, limit=6, rerank=Rerank(6, budget=0))
    assert sorted(h.rerank for h in cache_only) == ["cached"] * 2 + ["over budget"] * 4
    index.close()


def test_an_unreadable_image_keeps_its_merged_distance_and_says_why(store, graphs, image_folder, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(image_folder, folder)
    items = make_pair(store, graphs, folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    plain = index.search(items[2].uri, limit=4)
    gone = plain[1].id
    (folder / next(i.uri for i in items if i.point_id == gone)).unlink()
    hits = index.search(items[2].uri, limit=4, rerank=4)
    broken = next(h for h in hits if h.id == gone)
    assert broken.rerank == "unreadable" and broken.distance == plain[1].distance
    assert "no such file" in broken.rerank_error.lower() or "not found" in broken.rerank_error.lower()
    assert sum(h.rerank == "embedded" for h in hits) == 3
    index.close()


def test_with_every_source_down_the_search_answers_at_its_deadline(
    store, graphs, image_folder, trickling_server
):
    """A source that never answers: the hits come back flagged late with their merged distances
    (waiting for the fetches would have ended them unreadable, at the source's timeout)."""
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    for item in items:
        store.set_payload(
            "gallery", [(item.point_id, {"uri": f"{trickling_server.url}/{item.point_id}.png"})]
        )

    index = DualIndex.open(store, "p", exact=True, source=SourceConfig(allow_private=True, timeout=30))
    plain = index.search(items[0].uri, limit=5)
    hits = index.search(items[0].uri, limit=5, rerank=Rerank(5, deadline=0.2))
    assert [h.id for h in hits] == [h.id for h in plain]
    assert {h.rerank for h in hits} == {"late"}
    assert [h.distance for h in hits] == [h.distance for h in plain]
    index.close()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (0, "rerank must be an integer from 1"),
        (-3, "rerank must be an integer from 1"),
        (10_001, "rerank must be an integer from 1 to 10,000"),
        (True, "rerank must be an integer"),
        ("five", "rerank is K"),
        (Rerank.__new__(Rerank), None),
    ],
)
def test_bad_rerank_options_are_one_clear_error(store, graphs, image_folder, given, says):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=4)
    index = DualIndex.open(store, "p", exact=True)
    if says is None:
        with pytest.raises(ConfigError, match="deadline"):
            Rerank(5, deadline=0)
        with pytest.raises(ConfigError, match="budget"):
            Rerank(5, budget=-1)
        with pytest.raises(ConfigError, match="needs a re-rank"):
            index.search(items[0].uri, promote=True)
        return
    with pytest.raises(ConfigError, match=says):
        index.search(items[0].uri, rerank=given)
    index.close()


def test_a_pair_default_rerank_applies_unless_a_search_turns_it_off(store, graphs, image_folder):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", rerank=Rerank(4))
    index = DualIndex.open(store, "p", exact=True)
    assert {h.rerank for h in index.search(items[1].uri, limit=4)} <= set(RESCORED)
    assert {h.rerank for h in index.search(items[1].uri, limit=4, rerank=None)} == {None}
    index.close()


def test_search_vectors_reranks_with_the_new_query_vector(store, graphs, image_folder):
    items = make_pair(store, graphs, image_folder, "euclid", "paired")
    index = DualIndex.open(store, "p", exact=True)
    new, old = index.query_vectors([items[7].uri])
    by_vectors = index.search_vectors(new[0], old[0], limit=len(items), rerank=len(items))
    assert [h.id for h in by_vectors] == new_ranking(graphs, items, items[7].uri, "euclid")
    got = new_distances(new[0], OnnxEncoder(graphs.rm).encode([items[7].uri], ["new"])["new"], "euclid")
    assert np.isclose(by_vectors[0].distance, got[0], atol=1e-4)
    index.close()


def test_async_index_reranks_as_the_index_does(store, graphs, image_folder):
    import asyncio

    from rm_qdrant import AsyncDualIndex

    items = make_pair(store, graphs, image_folder, "cosine", "paired")

    async def run():
        async with await AsyncDualIndex.open(store, "p", exact=True) as index:
            return await index.search(items[4].uri, limit=len(items), rerank=len(items))

    hits = asyncio.run(run())
    assert [h.id for h in hits] == new_ranking(graphs, items, items[4].uri, "cosine")


def test_refresh_after_a_decode_switch_reranks_as_the_pair_now_decodes(store, graphs, photo_folder):
    """``rmq switch-encoder --decode fast`` then ``refresh()``: the re-rank embeds as a fresh index
    does, not from vectors its cache holds from the old decode mode."""
    from rm_qdrant import switch_encoder

    items = make_pair(store, graphs, photo_folder, "cosine", "paired", moved=0)
    index = DualIndex.open(store, "p", exact=True)
    n, query = len(items), items[0].uri
    before = index.search(query, limit=n, rerank=n)
    switch_encoder(store, "p", decode="fast")
    index.refresh()
    after = index.search(query, limit=n, rerank=n)
    with DualIndex.open(store, "p", exact=True) as fresh:
        expected = fresh.search(query, limit=n, rerank=n)
    assert [h.distance for h in expected] != [h.distance for h in before]  # the decode mode matters
    assert {h.rerank for h in after} == {"embedded"}
    assert [(h.id, h.distance) for h in after] == [(h.id, h.distance) for h in expected]
    index.close()


@pytest.mark.parametrize("written", [{"k": "x"}, [5], 5, {}, {"k": 5, "deadline": "soon"}])
def test_an_unreadable_recorded_rerank_is_one_error_naming_the_fix(store, graphs, image_folder, written):
    """A pair record whose re-rank this version cannot read (another version wrote it): a search
    that relies on it is one ConfigError saying how to rewrite it; one that gives rerank serves."""
    import dataclasses

    from rm_qdrant.pair.record import load_pair, save_pair

    items = make_pair(store, graphs, image_folder, "cosine", "paired")
    save_pair(store, dataclasses.replace(load_pair(store, "p"), rerank=written))
    index = DualIndex.open(store, "p", exact=True)
    with pytest.raises(ConfigError, match=r"records a re-rank this version cannot read.*--no-rerank"):
        index.search(items[0].uri, limit=4)
    assert {h.rerank for h in index.search(items[0].uri, limit=4, rerank=None)} == {None}
    assert {h.rerank for h in index.search(items[0].uri, limit=4, rerank=4)} <= set(RESCORED)
    index.close()


def test_a_slow_source_does_not_starve_the_next_queries_reads(store, graphs, image_folder, trickling_server):
    items = make_pair(store, graphs, image_folder, "cosine", "paired", moved=0)
    slow, local = items[:12], items[12:]
    for item in slow:
        store.set_payload(
            "gallery", [(item.point_id, {"uri": f"{trickling_server.url}/{item.point_id}.png"})]
        )
    index = DualIndex.open(store, "p", exact=True, source=SourceConfig(allow_private=True, timeout=30))
    index.search(slow[0].uri, limit=len(items), rerank=Rerank(len(items), deadline=0.2))
    hits = index.search(local[0].uri, limit=len(items), rerank=Rerank(len(items), deadline=0.5))
    on_disk = {i.point_id for i in local}
    assert {h.rerank for h in hits if h.id in on_disk} <= {"embedded", "cached"}  # none late
    index.close()


def test_a_closed_index_refuses_a_rerank_in_one_line(store, graphs, image_folder):
    items = make_pair(store, graphs, image_folder, "cosine", "paired")
    index = DualIndex.open(store, "p", exact=True)
    index.search(items[0].uri, limit=3, rerank=3)
    index.close()
    with pytest.raises(ConfigError, match="closed"):
        index.search(items[0].uri, limit=3, rerank=3)
