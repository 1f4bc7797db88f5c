"""A team whose payload is nested: the image address is ``asset.url``, the label ``meta.dept``.

Every place a payload field is named reads a dotted path into objects, and a point
without it is recorded as failed with the reason, while the run goes on.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from qdrant_client import QdrantClient

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant.core.merge import Hit
from rm_qdrant.core.planning import ERROR, RANK
from rm_qdrant.core.uris import UriRule
from rm_qdrant.evaluation.evaluate import average_precision
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from tests.conftest import OLD_DIM, make_image_folder

N = 24


def nested_gallery(store, models, tmp_path):
    """The team's 'products': payload ``{"asset": {...}, "meta": {"dept": ...}}``; point 0 lacks its url."""
    items = scan_image_folder(make_image_folder(tmp_path / "images"))
    vectors = OnnxEncoder(models.old).encode([i.uri for i in items])["embedding"]
    payloads = [
        {
            "asset": {
                "url": i.uri,
                "folder": i.label,
                "file": i.uri.rsplit("/", 1)[1],
                "created_at": f"2025-{1 + (k * 7) % 12:02d}-{1 + k:02d}",
            },
            "meta": {"dept": i.label},
        }
        for k, i in enumerate(items)
    ]
    del payloads[0]["asset"]["url"]
    del payloads[0]["asset"]["file"]
    store.create_collection("products", dim=OLD_DIM, distance="cosine")
    store.upsert("products", list(range(N)), vectors, payloads)
    return items, payloads


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["edge", "local"])
def test_rmq_migrates_a_gallery_whose_image_address_is_nested(models, tmp_path, backend):
    folder = tmp_path / "q"
    if backend == "local":
        QdrantClient(path=str(folder)).close()  # a QdrantClient(path=...) folder
    with open_store(folder) as store:
        items, payloads = nested_gallery(store, models, tmp_path)
    runner = CliRunner()

    def rmq(*args):
        result = runner.invoke(cli, ["--qdrant", str(folder), *map(str, args)])
        assert result.exit_code == 0, result.output
        return result.output

    out = rmq(
        "init", "--name", "p", "--old-collection", "products", "--encoder", models.rm,
        "--uri-field", "asset.url", "--label-field", "meta.dept",
    )  # fmt: skip
    assert "images from payload field 'asset.url'" in out
    rmq("migrate", "--name", "p", "--order", "payload:asset.created_at", "--prepare")
    with open_store(folder) as store:
        ranked = {r.id: r.payload[RANK] for r in store.retrieve("products", list(range(N)))}
    by_date = sorted(range(N), key=lambda k: payloads[k]["asset"]["created_at"])
    assert sorted(ranked, key=ranked.__getitem__) == by_date

    report = json.loads(rmq("migrate", "--name", "p", "--json"))
    assert (report["moved"], report["failed"]) == (N - 1, 1)
    with open_store(folder) as store:
        left = store.retrieve("products", [0])[0]
        assert left.payload[ERROR] == "payload has no 'asset.url'"
        assert store.count("products") == 1 and store.count("p-new") == N - 1
    hits = rmq("search", "--name", "p", items[5].uri, "--limit", "2", "--exact")
    assert items[5].label in hits.splitlines()[1].split()  # the label column reads meta.dept


def test_a_uri_template_over_nested_fields(store, models, tmp_path):
    nested_gallery(store, models, tmp_path)
    template = "file://" + str(tmp_path / "images") + "/{asset.folder}/{asset.file}"
    create_pair(
        store, "p", old_collection="products", encoder=OnnxEncoder(models.rm), uri=UriRule(template=template)
    )
    report = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert (report.moved, report.failed) == (N - 1, 1)
    error = store.retrieve("products", [0])[0].payload[ERROR]
    assert error.startswith("payload has no 'asset.file' for the uri template")


def test_served_precision_reads_a_nested_label():
    hits = [
        Hit(1, 1.0, 0.0, "old", {"meta": {"dept": "shoes"}}),
        Hit(2, 0.9, 0.1, "new", {"meta": {"dept": "bags"}}),
        Hit(3, 0.8, 0.2, "new", {"meta": {"dept": "shoes"}}),
    ]
    ap, top = average_precision(hits, "shoes", 2, skip_uri="", k=None, label_field="meta.dept")
    assert top and ap == pytest.approx((1 + 2 / 3) / 2)
