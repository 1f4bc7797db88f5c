"""Served evaluation through the live pair equals the offline protocol on the same vectors and order,
and measuring a copy of the pair (what ``rmq eval`` does) equals measuring the pair itself."""

from __future__ import annotations

import numpy as np
import pytest
from qdrant_client import QdrantClient

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, open_store, scan_image_folder
from rm_qdrant.core.metrics import backfill_retrieval, migrated_at
from rm_qdrant.core.planning import RANK
from rm_qdrant.evaluation.evaluate import evaluate_served
from rm_qdrant.evaluation.sandbox import sandbox
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.pair.record import load_pair

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("k", [None, 5])
def test_served_map_t_equals_offline_map_t(store, models, image_folder, k):
    items = scan_image_folder(image_folder)
    index_images(store, "gallery", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm))
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(limit=0, order="random", seed=3))  # rank only
    ranks = {r.id: r.payload[RANK] for r in store.retrieve("gallery", [i.point_id for i in items])}
    order = np.argsort([ranks[i.point_id] for i in items], kind="stable")

    served = evaluate_served(index, items, [0.0, 0.25, 0.5, 0.75, 1.0], options=MigrateOptions(batch=5), k=k)

    rm = OnnxEncoder(models.rm).encode([i.uri for i in items])
    old = OnnxEncoder(models.old).encode([i.uri for i in items])["embedding"]
    labels = np.array([i.label for i in items])
    for point in served:
        offline = backfill_retrieval(
            rm["new"], rm["rev"], rm["new"], old, labels, migrated_at(order, point.t), k=k
        )
        assert point.fraction == pytest.approx(point.t)
        assert point.map == pytest.approx(offline.map, abs=1e-6)
        assert point.top1 == pytest.approx(offline.top1, abs=1e-6)


@pytest.fixture(params=["edge", "memory", "local"])
def any_store(request, tmp_path):
    """The embedded store, qdrant-client's :memory:, and a ``QdrantClient(path=...)`` folder
    (qdrant-client's local mode keeps no payload indexes)."""
    if request.param == "local":
        QdrantClient(path=str(tmp_path / "local")).close()  # an empty local-mode folder
    location = {"edge": tmp_path / "edge", "memory": ":memory:", "local": tmp_path / "local"}[request.param]
    opened = open_store(location)
    yield opened
    opened.close()


@pytest.mark.parametrize("layout", ["paired", "single-collection"])
def test_eval_of_a_copy_of_a_ranked_pair_equals_eval_in_place(any_store, models, image_folder, layout):
    store, items = any_store, scan_image_folder(image_folder)
    index_images(store, "gallery", OnnxEncoder(models.old), items)
    new_vector = "new" if layout == "single-collection" else None
    create_pair(
        store,
        "p",
        old_collection="gallery",
        encoder=OnnxEncoder(models.rm),
        layout=layout,
        new_vector=new_vector,
    )
    index = DualIndex.open(store, "p", exact=True)
    run_migration(
        index, MigrateOptions(until=0.25, order="random", seed=3, batch=5)
    )  # ranked, a quarter moved
    pair, fractions, options = load_pair(store, "p"), [0.5, 1.0], MigrateOptions(batch=5)

    with sandbox(store, pair) as (copy, _):
        on_copy = evaluate_served(DualIndex.open(copy, "p", exact=True), items, fractions, options=options)
    assert load_pair(store, "p") == pair and index.progress() == pytest.approx(
        0.25
    )  # the copy moved, not the pair
    in_place = evaluate_served(index, items, fractions, options=options)

    assert [(p.t, p.fraction) for p in on_copy] == [(p.t, p.fraction) for p in in_place]
    assert [p.map for p in on_copy] == pytest.approx([p.map for p in in_place], abs=1e-6)
    assert [p.top1 for p in on_copy] == pytest.approx([p.top1 for p in in_place], abs=1e-6)
