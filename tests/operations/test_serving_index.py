"""The vectors a pair searches get a low HNSW full_scan_threshold at init (issue 26): Qdrant's
default (10,000 KB) scans every segment of fewer than 20,000 128-d vectors although its graph
exists. Checked in the shard's own config (qdrant-edge); qdrant-client's local mode always scans
and takes the setting without effect; a server's is checked in tests/integration."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import qdrant_edge as qe
from qdrant_client import models as qm

from rm_qdrant import OnnxEncoder, create_pair, index_images, open_store, scan_image_folder
from rm_qdrant.errors import ConfigError
from rm_qdrant.store.tuning import (
    SERVING_FULL_SCAN_KB,
    client_thresholds,
    client_vectors_diff,
    edge_thresholds,
)
from tests.conftest import make_image_folder


def thresholds(store, name):
    return edge_thresholds(
        json.loads((store.path / "collections" / name / "shard" / "edge_config.json").read_text())
    )


@pytest.fixture
def edge(tmp_path):
    with open_store(tmp_path / "store") as store:
        yield store


@pytest.fixture
def items(tmp_path):
    return scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))


def init_over_photos(edge, models, layout, kb):
    """``create_pair`` 'p' over the collection 'photos', in ``layout``, with ``full_scan_kb=kb``."""
    single = layout == "single-collection"
    return create_pair(
        edge,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.rm),
        layout=layout,
        new_vector="new" if single else None,
        full_scan_kb=kb,
    )


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_init_full_scan_kb_gives_the_searched_vectors_that_threshold(edge, models, items, layout):
    index_images(edge, "photos", OnnxEncoder(models.old), items)
    assert thresholds(edge, "photos") == {"": 10_000}  # Qdrant's default until init
    single = layout == "single-collection"
    pair = init_over_photos(edge, models, layout, SERVING_FULL_SCAN_KB)
    assert thresholds(edge, "photos") == (
        {"": SERVING_FULL_SCAN_KB, "new": SERVING_FULL_SCAN_KB} if single else {"": SERVING_FULL_SCAN_KB}
    )
    if not single:
        assert thresholds(edge, pair.new_collection) == {"": SERVING_FULL_SCAN_KB}
    assert edge.count("photos") == len(items)  # the shard reopened with every point


@pytest.mark.slow
@pytest.mark.parametrize("acorn", [True, False])
@pytest.mark.parametrize(
    ("layout", "own", "kb", "said"),
    [
        ("single-collection", None, 1000, "--full-scan-kb 1000"),
        ("single-collection", None, None, None),
        ("single-collection", None, 10_000, None),
        ("paired", None, 1000, None),
        # the team's collection came with a low threshold of its own, which init leaves be
        ("single-collection", 1000, None, "full_scan_threshold 1000 KB"),
        ("single-collection", 20_000, None, None),
        ("paired", 1000, None, None),
    ],
)
def test_a_low_threshold_on_a_single_collection_pairs_old_vector_warns_without_acorn(
    edge, models, items, layout, own, kb, said, acorn, caplog, monkeypatch
):
    """The old vector's filtered search walks its graph under a low threshold and loses recall
    late in a backfill (benchmarks/results/single_collection_share-kb1000.md) unless it searches
    with ACORN, as the embedded store and servers from Qdrant 1.16 on do
    (tests/serving/test_old_side_acorn.py). Without it (``acorn`` False: what an older server
    says), init says so, whether the threshold is init's ``--full-scan-kb`` or the team's own."""
    monkeypatch.setattr(type(edge), "capabilities", replace(edge.capabilities, filtered_recall=acorn))
    index_images(edge, "photos", OnnxEncoder(models.old), items)
    if own is not None:
        edge.tune_index("photos", [""], full_scan_kb=own)
    with caplog.at_level("WARNING", logger="rm_qdrant.operations.create"):
        init_over_photos(edge, models, layout, kb)
    warnings = [r.getMessage() for r in caplog.records if "loses recall" in r.getMessage()]
    assert len(warnings) == (said is not None and not acorn)
    if warnings:
        assert said in warnings[0] and "takes no ACORN (older than 1.16" in warnings[0]
    if own is not None:
        assert thresholds(edge, "photos")[""] == own


def test_an_adopted_shard_keeps_its_own_settings(tmp_path, models, items):
    """A team's shard placed in the store: the threshold changes, its other HNSW and vector
    settings stay, and so do its points."""
    shard_dir = tmp_path / "store" / "collections" / "team" / "shard"
    own = qe.HnswIndexConfig(m=32, ef_construct=200, full_scan_threshold=20_000)
    params = qe.EdgeVectorParams(size=8, distance=qe.Distance.Cosine, on_disk=True, hnsw_config=own)
    shard = qe.EdgeShard.create(str(shard_dir), qe.EdgeConfig(vectors={"img": params}))
    rows = np.random.default_rng(0).normal(size=(5, 8)).tolist()
    shard.update(
        qe.UpdateOperation.upsert_points([qe.Point(i, {"img": r}, {"k": i}) for i, r in enumerate(rows)])
    )
    shard.close()
    with open_store(tmp_path / "store") as store:
        before = store.search("team", np.array(rows[:1]), limit=3, vector="img", exact=True)
        store.tune_index("team", ["img"], full_scan_kb=500)
        assert store.search("team", np.array(rows[:1]), limit=3, vector="img", exact=True) == before
    with open_store(tmp_path / "store") as store:  # persisted
        assert thresholds(store, "team") == {"img": 500}
        config = json.loads((shard_dir / "edge_config.json").read_text())["vectors"]["img"]
        assert config["on_disk"] is True
        assert (config["hnsw_config"]["m"], config["hnsw_config"]["ef_construct"]) == (32, 200)
        assert store.count("team") == 5


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_a_bad_threshold_is_a_config_error(store, bad):
    store.create_collection("c", dim=4, distance="cosine")
    with pytest.raises(ConfigError, match="full_scan_threshold"):
        store.tune_index("c", [""], full_scan_kb=bad)


def test_an_unknown_vector_is_a_config_error(edge):
    edge.create_collection("c", dim=4, distance="cosine")
    with pytest.raises(ConfigError, match="no dense vector 'nope'"):
        edge.tune_index("c", ["nope"], full_scan_kb=100)
    assert edge.count("c") == 0  # still open


def test_the_client_store_sends_the_threshold_per_vector(store):
    """The diff a server gets; local mode takes it (and always scans)."""
    diff = client_vectors_diff(["", "new"], 1_000)
    assert {k: v.hnsw_config.full_scan_threshold for k, v in diff.items()} == {"": 1_000, "new": 1_000}
    store.create_collection("c", dim=4, distance="cosine")
    store.upsert("c", [1, 2], np.eye(2, 4, dtype=np.float32))
    store.tune_index("c", [""], full_scan_kb=1_000)
    assert [h.id for h in store.search("c", np.eye(1, 4, dtype=np.float32), limit=2)[0]] == [1, 2]


def test_client_thresholds_reads_a_servers_answer():
    info = qm.CollectionInfo.model_validate(
        {
            "status": "green",
            "optimizer_status": "ok",
            "segments_count": 1,
            "config": {
                "params": {
                    "vectors": {
                        "": {"size": 4, "distance": "Cosine", "hnsw_config": {"full_scan_threshold": 1000}},
                        "x": {"size": 4, "distance": "Cosine"},
                    }
                },
                "hnsw_config": {"m": 16, "ef_construct": 100, "full_scan_threshold": 10000},
                "optimizer_config": {
                    "deleted_threshold": 0.2,
                    "vacuum_min_vector_number": 1000,
                    "default_segment_number": 0,
                    "flush_interval_sec": 5,
                },
            },
            "payload_schema": {},
        }
    )
    assert client_thresholds(info) == {"": 1000, "x": 10000}


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_an_index_opened_exact_asks_for_exact_search(edge, layout):
    """With the graph used from 1,000 KB up, ``DualIndex(exact=True)`` (``rmq search --exact``) must
    still ask every search it sends for an exact one."""
    from rm_qdrant import DualIndex
    from rm_qdrant.pair.record import SINGLE, ModelRef, PairRecord

    single = layout == "single-collection"
    edge.create_collection("old", dim=4, distance="cosine")
    edge.upsert("old", [1, 2], np.eye(2, 4, dtype=np.float32))
    if single:
        edge.add_vector("old", "new", dim=4, distance="cosine")
    else:
        edge.create_collection("new", dim=4, distance="cosine")
    model = ModelRef("m", "0", 4, "-")
    pair = PairRecord("p", "old", "old" if single else "new", "rm", "cosine", model)
    if single:
        pair = PairRecord("p", "old", "old", "rm", "cosine", model, layout=SINGLE, new_vector="new")
    asked = []
    search, merged = edge.search, edge.merged_search
    edge.search = lambda *a, **kw: asked.append(kw["search_params"].exact) or search(*a, **kw)
    edge.merged_search = lambda *a: asked.append(a[3].search_params.exact) or merged(*a)
    DualIndex(edge, pair, exact=True).search_vectors(np.ones(4), np.ones(4), limit=2)
    assert asked and all(asked)


def test_init_can_keep_the_collections_own_threshold(edge, models, items):
    index_images(edge, "photos", OnnxEncoder(models.old), items)
    encoder = OnnxEncoder(models.rm)
    with pytest.raises(ConfigError, match="full_scan_threshold"):
        create_pair(edge, "p", old_collection="photos", encoder=encoder, full_scan_kb=-5)
    assert "p-new" not in edge.list_collections() and thresholds(edge, "photos") == {
        "": 10_000
    }  # nothing written
    create_pair(edge, "p", old_collection="photos", encoder=encoder)  # the default: the team's own
    assert thresholds(edge, "photos") == {"": 10_000}


@pytest.mark.parametrize("given", [None, 10_000])
def test_a_single_collection_pair_searches_its_graph_unless_told_otherwise(edge, models, items, given):
    """The single-collection layout's new vector is spread over the collection's segments, each
    under Qdrant's default threshold: scanned on every search although the graph exists
    (4.3-4.6x the paired layout at equal recall on CIFAR embeddings). By default init gives the
    new vector 1,000 KB and leaves the team's own alone; a threshold given goes on both."""
    index_images(edge, "photos", OnnxEncoder(models.old), items)
    encoder = OnnxEncoder(models.rm)
    create_pair(
        edge,
        "p",
        old_collection="photos",
        encoder=encoder,
        layout="single-collection",
        new_vector="new",
        full_scan_kb=given,
    )
    expected = {"": 10_000, "new": SERVING_FULL_SCAN_KB} if given is None else {"": given, "new": given}
    assert thresholds(edge, "photos") == expected


def test_rmq_init_full_scan_kb(rmq, models, image_folder, tmp_path):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    bad = rmq(
        "init",
        "--name",
        "p",
        "--old-collection",
        "gallery",
        "--encoder",
        models.rm,
        "--full-scan-kb",
        -1,
        ok=False,
    )
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    rmq("init", "--name", "p", "--old-collection", "gallery", "--encoder", models.rm, "--full-scan-kb", 1000)
    from rm_qdrant import open_store

    with open_store(tmp_path / "q") as store:
        assert thresholds(store, "gallery") == thresholds(store, "p-new") == {"": 1000}
