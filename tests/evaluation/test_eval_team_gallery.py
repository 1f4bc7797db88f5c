"""``rmq eval`` on a team's gallery equals the offline protocol where the payload says the same
thing differently (found by an adversarial run, each silently wrong before):

- labels stored as integers (class 0, 1, 2) against query folders named "0", "1", "2": mAP 0;
- image paths stored relative to the pair's ``--root``: each query was its own top hit;
- a query class the gallery lacks: scored AP 0 into the mean, without a word.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.metrics import backfill_retrieval, migrated_at
from rm_qdrant.core.planning import RANK
from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.evaluate import evaluate_served
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.sources import SourceConfig
from tests.conftest import make_image_folder

FRACTIONS = [0.0, 0.5]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["integer labels", "relative paths", "a class the gallery lacks"])
def test_served_eval_of_a_teams_gallery_equals_offline(store, models, tmp_path, shape, caplog):
    folder = make_image_folder(tmp_path / "g", per_class=6, labels=("0", "1", "2"))
    items = scan_image_folder(folder)
    index_images(store, "gallery", OnnxEncoder(models.old), items)
    source = None
    if shape == "integer labels":
        store.set_payload("gallery", [(i.point_id, {"label": int(i.label)}) for i in items])
    if shape == "relative paths":
        store.set_payload("gallery", [(i.point_id, {"uri": os.path.relpath(i.uri, folder)}) for i in items])
        source = {"root": str(folder)}
    create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm), source=source)
    index = DualIndex.open(store, "p", exact=True)
    run_migration(
        index, MigrateOptions(limit=0, order="random", seed=3, source=SourceConfig(**(source or {})))
    )
    ranks = {r.id: r.payload[RANK] for r in store.retrieve("gallery", [i.point_id for i in items])}
    order = np.argsort([ranks[i.point_id] for i in items], kind="stable")
    queries = items
    if shape == "a class the gallery lacks":
        queries = items + scan_image_folder(make_image_folder(tmp_path / "q", per_class=2, labels=("zebra",)))
    options = MigrateOptions(batch=5, source=SourceConfig(**(source or {})))
    with caplog.at_level("WARNING", logger="rm_qdrant.evaluation.evaluate"):
        served = evaluate_served(index, queries, FRACTIONS, options=options)
    assert ("no gallery point is labelled 'zebra'" in caplog.text) == (shape == "a class the gallery lacks")

    rm = OnnxEncoder(models.rm).encode([i.uri for i in items])
    old = OnnxEncoder(models.old).encode([i.uri for i in items])["embedding"]
    labels = np.array([i.label for i in items])
    for point in served:
        offline = backfill_retrieval(
            rm["new"], rm["rev"], rm["new"], old, labels, migrated_at(order, point.t)
        )
        assert point.map == pytest.approx(offline.map, abs=1e-6)
        assert point.top1 == pytest.approx(offline.top1, abs=1e-6)


def test_no_query_label_in_the_gallery_is_one_line(store, models, tmp_path):
    folder = make_image_folder(tmp_path / "g", per_class=3, labels=("a", "b"))
    items = scan_image_folder(folder)
    index_images(store, "gallery", OnnxEncoder(models.old), items)
    store.set_payload("gallery", [(i.point_id, {"label": {"name": i.label}}) for i in items])  # not text
    create_pair(store, "p", old_collection="gallery", encoder=OnnxEncoder(models.rm))
    with pytest.raises(
        ConfigError, match="no gallery point has a query's label in its payload field 'label'"
    ):
        evaluate_served(DualIndex.open(store, "p", exact=True), items, FRACTIONS)
