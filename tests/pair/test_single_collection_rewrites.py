"""The single-collection layout against code that still writes only the old vector.

A team's application before its upgrade rewrites points with ``upsert`` (the old vector and a
payload, say a new image URI): the point loses the new vector, if it had one. Two windows:

- between the migration's read of a batch's payloads and its conditional write of their new
  vectors: the write must not land (it embeds the previous image), and the next run embeds the
  point from its new image;
- during ``finalize --drop-old``, between its count of the points lacking the new vector and
  its drop of the old one: such a point must not be left with no vector at all.

Each test runs on qdrant-edge and on qdrant-client's local mode (the ``store`` fixture).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, load_pair, open_store, scan_image_folder
from rm_qdrant.errors import MigrationError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.serving.status import pair_status
from rm_qdrant.store import Where
from tests.conftest import OLD_DIM, make_image_folder
from tests.faults import Scripted
from tests.migration.test_fault_injection import rmq
from tests.pair.test_single_collection import make_pair, user_vector
from tests.pair.test_single_collection_faults import build

HAS_NEW, LACKS_NEW = Where(has_vector=("new",)), Where(lacks_vector=("new",))
NEWCOMER = 10_001  # an id the application adds while the cutover runs


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=10))
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    return items


def embedding(models, uri):
    """What the pair's encoder makes of an image file, unit length (the collection is cosine)."""
    vector = OnnxEncoder(models.rm).encode([uri], ["new"])["new"][0]
    return vector / np.linalg.norm(vector)


def stored_new(store, point_id):
    found = store.retrieve("photos", [point_id], with_vectors=True, vector="new")
    vector = found[0].vector if found else None
    return None if vector is None else vector / np.linalg.norm(vector)


def legacy_upsert(store, point_id, uri):
    """The application's old code: the point rewritten whole with its old vector and a payload."""
    store.upsert("photos", [point_id], user_vector(2, OLD_DIM), [{"uri": uri, "by": "app"}])


def the_new_vector_is_written(name, args, kwargs):
    return name == "set_vectors" and kwargs.get("vector") == "new"


def the_old_vector_is_dropped(name, args, kwargs):
    return name == "drop_vector"


def finalize_counts(name, args, kwargs):
    return name == "count" and args[0] == "photos"


def test_a_rewrite_between_the_migration_read_and_write_is_embedded_from_its_new_image(
    store, gallery, models
):
    victim, replacement = gallery[0], gallery[17]

    def rewrite():
        legacy_upsert(store, victim.point_id, replacement.uri)

    scripted = Scripted(store, [("before", the_new_vector_is_written, rewrite)])
    first = run_migration(DualIndex.open(scripted, "p"), MigrateOptions(batch=100))
    assert scripted.pending == 0, "the scripted write never found its moment"
    status = pair_status(store, load_pair(store, "p"))
    assert first.moved == len(gallery) - 1 and first.unconfirmed == 1
    assert (status.old_count, status.new_count) == (1, len(gallery) - 1)  # not counted as migrated
    assert stored_new(store, victim.point_id) is None  # no vector of the previous image

    again = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert again.moved == 1
    assert np.allclose(stored_new(store, victim.point_id), embedding(models, replacement.uri), atol=1e-5)
    status = pair_status(store, load_pair(store, "p"))
    assert (status.old_count, status.new_count, status.failed, status.fraction) == (0, len(gallery), 0, 1.0)
    stored = store.retrieve("photos", [victim.point_id])[0].payload
    assert {k: v for k, v in stored.items() if not k.startswith("rmq_")} == {
        "uri": replacement.uri,
        "by": "app",
    }
    finalize(store, load_pair(store, "p"))
    assert not any(k.startswith("rmq_") for r in store.scroll("photos", limit=100)[0] for k in r.payload)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["read-modify-write", "set_payload"])
def test_a_rewrite_that_keeps_the_token_but_changes_the_image_is_embedded_again(store, gallery, models, how):
    """Code that reads the point, changes its image and writes the payload it read back (token
    and all) passes the write's condition: the vector lands, is found stale, and goes again."""
    victim, replacement = gallery[0], gallery[17]

    def rewrite():
        point = store.retrieve("photos", [victim.point_id], with_vectors=True)[0]
        payload = {**point.payload, "uri": replacement.uri}
        if how == "set_payload":
            store.set_payload("photos", [(victim.point_id, {"uri": replacement.uri})])
        else:
            store.upsert("photos", [victim.point_id], point.vector.reshape(1, -1), [payload])

    scripted = Scripted(store, [("before", the_new_vector_is_written, rewrite)])
    first = run_migration(DualIndex.open(scripted, "p"), MigrateOptions(batch=100))
    assert scripted.pending == 0 and first.unconfirmed == 1
    assert stored_new(store, victim.point_id) is None  # the previous image's vector did not stay
    again = run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    assert again.moved == 1
    assert np.allclose(stored_new(store, victim.point_id), embedding(models, replacement.uri), atol=1e-5)


def search_finds(store, point_id, uri):
    hits = DualIndex.open(store, "p", exact=True).search(uri, limit=3)
    return any(h.id == point_id and h.distance == pytest.approx(0, abs=1e-5) for h in hits)


def test_old_vector_writes_between_finalize_count_and_drop_are_embedded(store, gallery, models):
    """A rewrite of a migrated point (a new image) and a new point, both with the old vector only,
    land just before the old vector is dropped: finalize embeds both with the new model."""
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    victim, replacement, added = gallery[0], gallery[17], gallery[25]

    def legacy_writes():
        legacy_upsert(store, victim.point_id, replacement.uri)
        legacy_upsert(store, NEWCOMER, added.uri)

    scripted = Scripted(store, [("before", the_old_vector_is_dropped, legacy_writes)])
    done = finalize(scripted, load_pair(store, "p"), drop_old=True)
    assert scripted.pending == 0
    assert done.state == "finalized" and store.collection("photos", "new").vectors == ("new",)
    assert store.count("photos") == len(gallery) + 1
    assert store.count("photos", LACKS_NEW) == 0  # no point left without a vector
    assert np.allclose(stored_new(store, victim.point_id), embedding(models, replacement.uri), atol=1e-5)
    assert np.allclose(stored_new(store, NEWCOMER), embedding(models, added.uri), atol=1e-5)
    assert search_finds(store, NEWCOMER, added.uri) and search_finds(store, victim.point_id, replacement.uri)
    assert not any(k.startswith("rmq_") for r in store.scroll("photos", limit=100)[0] for k in r.payload)


def test_an_old_vector_write_after_finalize_counted_is_embedded_before_the_drop(store, gallery, models):
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    added = gallery[4]

    def add():
        legacy_upsert(store, NEWCOMER, added.uri)

    scripted = Scripted(store, [("after", finalize_counts, add)])
    done = finalize(scripted, load_pair(store, "p"), drop_old=True)
    assert scripted.pending == 0 and done.state == "finalized"
    assert store.count("photos", LACKS_NEW) == 0
    assert search_finds(store, NEWCOMER, added.uri)


def test_finalize_refuses_a_point_it_cannot_embed_and_keeps_its_old_vector(store, gallery, models, tmp_path):
    """The image of the point written during the cutover is missing: finalize says so, drops
    nothing, and completes once the image is there."""
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    missing = tmp_path / "later" / "x.png"

    def add():
        legacy_upsert(store, NEWCOMER, str(missing))

    scripted = Scripted(store, [("after", finalize_counts, add)])
    with pytest.raises(MigrationError, match=r"1 point .*no vector 'new'.*could not be embedded") as caught:
        finalize(scripted, load_pair(store, "p"), drop_old=True)
    assert "\n" not in str(caught.value) and "finalize --name p" in str(caught.value)
    assert load_pair(store, "p").state == "finalizing"
    assert store.collection("photos", "new").vectors == ("", "new")  # the old vector not dropped
    kept = store.retrieve("photos", [NEWCOMER], with_vectors=True)[0]
    assert kept.vector is not None and kept.payload["uri"] == str(missing)
    missing.parent.mkdir()
    shutil.copy(gallery[4].uri, missing)
    done = finalize(store, load_pair(store, "p"), drop_old=True)
    assert done.state == "finalized" and store.collection("photos", "new").vectors == ("new",)
    assert store.count("photos", LACKS_NEW) == 0 and search_finds(store, NEWCOMER, gallery[4].uri)


@pytest.mark.slow
def test_rmq_finalize_names_the_points_it_could_not_embed_in_one_line(tmp_path, models):
    """Through the command: a point left with no vector by a write between the count and the drop,
    whose image is missing, is reported (exit 1, one line) until its image is back."""
    store_path, images = tmp_path / "q", make_image_folder(tmp_path / "g", per_class=4)
    build(store_path, images, models)
    rmq(store_path, "migrate", "--name", "p")
    missing = tmp_path / "later" / "x.png"
    with open_store(store_path) as store:

        def add():
            legacy_upsert(store, NEWCOMER, str(missing))

        scripted = Scripted(store, [("before", the_old_vector_is_dropped, add)])
        with pytest.raises(MigrationError):
            finalize(scripted, load_pair(store, "p"), drop_old=True)
        assert store.retrieve("photos", [NEWCOMER])[0].payload["uri"] == str(missing)  # kept
    result = rmq(store_path, "finalize", "--name", "p", "--drop-old", ok=False)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("Error: ") and "1 point" in result.output
    missing.parent.mkdir()
    shutil.copy(next(images.glob("a/*")), missing)
    assert "serves vector 'new'" in rmq(store_path, "finalize", "--name", "p", "--drop-old").output
    with open_store(store_path) as store:
        assert store.count("photos", LACKS_NEW) == 0 and store.count("photos") == 13
