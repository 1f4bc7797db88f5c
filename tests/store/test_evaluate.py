"""Served evaluation through the live pair equals the offline protocol on the same vectors and order."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.backfill.evaluate import evaluate_served
from rm_qdrant.backfill.migrate import MigrateOptions, run_migration
from rm_qdrant.core.metrics import backfill_retrieval, migrated_at
from rm_qdrant.core.planning import RANK


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
