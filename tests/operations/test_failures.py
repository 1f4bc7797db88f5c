"""Points whose images are gone for good: listed by ``rmq failures``, dropped at the cutover."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from rm_qdrant import (
    DualIndex,
    OnnxEncoder,
    create_pair,
    index_images,
    load_pair,
    open_store,
    scan_image_folder,
)
from rm_qdrant.errors import ConfigError, MigrationError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.operations.failures import (
    drop_failures,
    finalize_dropping_failed,
    iter_failures,
    write_failures,
)
from rm_qdrant.store import Store
from tests.conftest import make_image_folder

LAYOUTS = {
    "paired": {},
    "keep-old": {"keep_old": True},
    "single": {"layout": "single-collection", "new_vector": "new"},
}
SECRET = "s3cr3t-pw"


def build(store: Store, models, tmp_path, layout: str, *, ftp: bool = False):
    """12 images in 'photos', a pair 'p', and broken images: a missing file, a truncated JPEG
    (and an ftp URI with a password, refused by scheme). Returns items and {id: kind}."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    index_images(store, "photos", OnnxEncoder(models.old), items)
    create_pair(
        store,
        "p",
        old_collection="photos",
        encoder=OnnxEncoder(models.rm),
        old_encoder=OnnxEncoder(models.old),
        **LAYOUTS[layout],
    )
    whole = tmp_path / "whole.jpg"
    pixels = np.random.default_rng(0).integers(0, 255, size=(64, 64, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(whole, quality=95)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    bad = {"missing": str(tmp_path / "missing.jpg"), "truncated": str(truncated)}
    if ftp:
        bad["ftp"] = f"ftp://team:{SECRET}@example.invalid/x.jpg"
    ids = [item.point_id for item in items[: len(bad)]]
    store.set_payload("photos", [(i, {"uri": uri}) for i, uri in zip(ids, bad.values(), strict=True)])
    return items, dict(zip(ids, bad, strict=True))


def migrate(store: Store, **options) -> None:
    index = DualIndex.open(store, "p")
    run_migration(
        index, MigrateOptions(**{"batch": 5, "fetch_workers": 2, "max_failure_share": 1.0, **options})
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_failures_list_exactly_the_broken_points_with_reasons_and_attempts(store, models, tmp_path, layout):
    _, broken = build(store, models, tmp_path, layout)
    migrate(store)
    migrate(store, retry_failed=True)
    found = {f.id: f for f in iter_failures(store, load_pair(store, "p"), page=1)}
    assert set(found) == set(broken)
    by_kind = {broken[i]: f for i, f in found.items()}
    assert "No such file" in by_kind["missing"].reason
    assert "truncated.jpg" in by_kind["truncated"].uri and by_kind["truncated"].reason
    assert all(f.attempts == 2 for f in found.values())


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_finalize_drop_failed_removes_them_writes_the_list_and_serves_every_other_point(
    store, models, tmp_path, layout
):
    items, broken = build(store, models, tmp_path, layout)
    migrate(store)
    with pytest.raises(MigrationError, match=r"--retry-failed.*rmq failures --name p.*--drop-failed"):
        finalize(store, load_pair(store, "p"))
    out = tmp_path / "failed.jsonl"
    record, dropped = finalize_dropping_failed(store, load_pair(store, "p"), out)
    assert record.state == "finalized" and (dropped.listed, dropped.removed, dropped.path) == (2, 2, out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["id"] for row in lines} == set(broken) and all(row["attempts"] == 1 for row in lines)
    index = DualIndex.open(store, "p", exact=True)
    assert index.status().new_count == len(items) - 2
    for item in items:
        hits = index.search(item.uri, limit=1) if item.point_id not in broken else []
        assert item.point_id in broken or hits[0].id == item.point_id
    assert store.retrieve(record.new_collection, list(broken)) == []


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_alias_the_cutover_cannot_take_is_refused_before_a_failed_point_is_dropped(
    store, models, tmp_path, layout
):
    """Paired: the old collection's own name without --drop-old; one collection: any alias.
    The refusal came after the drop: the failed points were gone and the pair still backfilling."""
    items, broken = build(store, models, tmp_path, layout)
    migrate(store)
    before = store.count("photos")
    out = tmp_path / "failed.jsonl"
    error = "a collection has that name" if layout != "single" else "no alias to move"
    with pytest.raises(ConfigError, match=error):
        finalize_dropping_failed(store, load_pair(store, "p"), out, alias="photos")
    assert store.count("photos") == before and not out.exists()
    assert {f.id for f in iter_failures(store, load_pair(store, "p"))} == set(broken)
    assert load_pair(store, "p").state == "backfilling"
    record, dropped = finalize_dropping_failed(store, load_pair(store, "p"), out)  # as it should have been
    assert record.state == "finalized" and dropped.removed == len(broken)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_point_rewritten_after_the_list_was_written_is_not_dropped(store, models, tmp_path, layout):
    items, broken = build(store, models, tmp_path, layout)
    migrate(store)
    pair = load_pair(store, "p")
    listed = [f.id for f in iter_failures(store, pair)]
    fixed = listed[0]
    # The team's own code rewrites the point with a good image (no failure on it any more).
    old = store.retrieve("photos", [fixed], with_vectors=True, vector=pair.vector)[0]
    good = items[-1].uri
    store.upsert("photos", [fixed], old.vector[None, :], [{"uri": good, "label": "a"}], vector=pair.vector)
    assert drop_failures(store, pair, listed) == 1
    assert [r.payload["uri"] for r in store.retrieve("photos", [fixed])] == [good]
    with pytest.raises(MigrationError, match="1 point that did not fail still serves"):
        finalize_dropping_failed(store, load_pair(store, "p"), tmp_path / "again.jsonl")
    assert not (tmp_path / "again.jsonl").exists()  # refused before anything was written
    migrate(store)
    record, dropped = finalize_dropping_failed(store, load_pair(store, "p"), tmp_path / "again.jsonl")
    assert record.state == "finalized" and dropped.listed == 0
    assert [h.id for h in DualIndex.open(store, "p", exact=True).search(good, limit=2)][:2].count(fixed) == 1


def test_the_list_is_never_overwritten(tmp_path):
    out = tmp_path / "list.jsonl"
    out.write_text("kept\n")
    with pytest.raises(ConfigError, match="exists already"):
        write_failures(out, [])
    assert out.read_text() == "kept\n" and list(tmp_path.iterdir()) == [out]


def test_a_list_into_a_missing_folder_names_the_folder(tmp_path):
    with pytest.raises(
        ConfigError, match=f"cannot write .*: the folder {tmp_path / 'nowhere'} does not exist"
    ):
        write_failures(tmp_path / "nowhere" / "list.jsonl", [])
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def rmq(rmq, tmp_path, monkeypatch):
    """conftest's rmq, run from tmp_path (finalize --drop-failed writes its list to the working folder)."""
    monkeypatch.chdir(tmp_path)
    return rmq


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rmq_failures_and_finalize_drop_failed(rmq, models, tmp_path, layout):
    store = open_store(tmp_path / "q", create=True)
    items, broken = build(store, models, tmp_path, layout, ftp=True)
    migrate(store)
    store.close()

    text = rmq("failures", "--name", "p").output
    lines = text.splitlines()
    assert lines[-1] == "3 failed points in pair 'p'" and len(lines) == 4
    assert all(any(str(i) in line for line in lines) for i in broken)
    assert SECRET not in text and "scheme 'ftp'" in text
    rows = json.loads(rmq("failures", "--name", "p", "--json").output)
    assert rows["failed"] == 3 and {r["id"] for r in rows["points"]} == set(broken)
    assert SECRET not in json.dumps(rows)
    assert "wrote 3 failed points" in rmq("failures", "--name", "p", "--out", "list.jsonl").output
    assert len((tmp_path / "list.jsonl").read_text().splitlines()) == 3
    again = rmq("failures", "--name", "p", "--out", "list.jsonl", ok=False)
    assert again.exit_code == 1 and "exists already" in again.output
    both = rmq("failures", "--name", "p", "--out", "x.jsonl", "--json", ok=False)
    assert both.exit_code == 1 and "not both" in both.output

    refused = rmq("finalize", "--name", "p", ok=False)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "rmq migrate --name p --retry-failed" in refused.output
    assert (
        "rmq failures --name p" in refused.output and "rmq finalize --name p --drop-failed" in refused.output
    )

    done = rmq("finalize", "--name", "p", "--drop-failed").output
    written = list(tmp_path.glob("rmq-failures-p-*.jsonl"))
    assert len(written) == 1 and len(written[0].read_text().splitlines()) == 3
    assert f"removed 3 failed points (listed in {written[0].name})" in done and "finalized" in done
    status = json.loads(rmq("status", "--name", "p", "--json").output)
    assert status["state"] == "finalized" and status["new_count"] == len(items) - 3
    assert "0 failed points" in rmq("failures", "--name", "p").output
