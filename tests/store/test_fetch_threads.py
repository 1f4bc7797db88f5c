"""How many threads fetch a migration's images: by where they are, unless the caller says.

Local files get few threads (a disk read waits little; more threads only contend for the
GIL with the encoder and the store's writes), network sources many. The pure choice is
tested against every kind of URI; the migration is tested with a fetch slowed down so that
every thread the pool is given would be busy at once.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.backfill.loading import LOCAL_WORKERS, NETWORK_WORKERS, fetch_threads
from rm_qdrant.backfill.migrate import MigrateOptions, run_migration
from rm_qdrant.errors import ConfigError
from rm_qdrant.sources import ImageSource
from rm_qdrant.store.ids import normalize_ids
from tests.conftest import make_image_folder

N = 40


@pytest.mark.parametrize(
    ("uris", "workers", "expected"),
    [
        (["/data/a.jpg", "b/c.jpg", "file:///data/d.jpg", "C:/x.jpg"], None, LOCAL_WORKERS),
        (["/data/a.jpg", "https://cdn.example.com/b.jpg"], None, NETWORK_WORKERS),
        (["s3://bucket/a.jpg"], None, NETWORK_WORKERS),
        (["gs://bucket/a.jpg", None], None, NETWORK_WORKERS),
        ([None, "/data/a.jpg"], None, LOCAL_WORKERS),  # a point without a uri fetches nothing
        (["/data/a.jpg"], 5, 5),  # the caller's number wins
        (["https://cdn.example.com/b.jpg"], 1, 1),
    ],
)
def test_fetch_threads_follow_where_the_images_are(uris, workers, expected):
    with ImageSource() as source:
        assert fetch_threads(source, uris, workers) == expected


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 3 + 1))[:N]
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    return DualIndex.open(store, "p")


def _busiest(monkeypatch) -> list[int]:
    """Patch the source's fetch to take a while; the list gets the most fetches seen at once."""
    lock, now, most = threading.Lock(), [0], [0]
    fetch = ImageSource.fetch

    def slow(self, uri):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.01)  # long enough for every thread given work to be in here together
            return fetch(self, uri)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(ImageSource, "fetch", slow)
    return most


def test_local_files_are_fetched_by_few_threads_by_default(gallery, monkeypatch):
    most = _busiest(monkeypatch)
    report = run_migration(gallery, MigrateOptions(batch=N))
    assert report.moved == N and report.failed == 0
    assert 1 <= most[0] <= LOCAL_WORKERS


def test_fetch_workers_given_are_used_for_local_files_too(gallery, monkeypatch):
    most = _busiest(monkeypatch)
    report = run_migration(gallery, MigrateOptions(batch=N, fetch_workers=4))
    assert report.moved == N and report.failed == 0
    assert LOCAL_WORKERS < most[0] <= 4


def test_a_batch_of_ids_is_normalised_as_one_id_at_a_time_would_be():
    ids = [str(uuid.uuid4()) for _ in range(50)]
    assert normalize_ids(ids) == ids
    assert normalize_ids([uuid.UUID(i) for i in ids]) == ids
    assert normalize_ids([ids[0].upper(), 7]) == [ids[0], 7]
    assert normalize_ids([]) == []


@pytest.mark.parametrize(
    "bad",
    [
        "{a}\n{b}",  # two canonical ids in one string: as long as two ids and a newline
        "{a}\n",
        "x",
        "{a}{b}",
    ],
)
def test_a_batch_holding_one_bad_id_is_refused(bad):
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with pytest.raises(ConfigError, match="invalid point id"):
        normalize_ids([a, bad.format(a=a, b=b), b])
