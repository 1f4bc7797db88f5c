"""How many threads fetch a migration's images: by where they are, unless the caller says.

Local files get few threads (a disk read waits little; more threads only contend for the
GIL with the encoder and the store's writes), one where the run's images have been light
(FetchPace), network sources many. The pure choice is tested against every kind of URI and
pace; the migration is tested with a fetch slowed down (by sleeping, which costs no CPU, or
by spinning, which does) so that every thread the pool is given would be busy at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import ConfigError
from rm_qdrant.migration import loading
from rm_qdrant.migration.loading import (
    LIGHT_IMAGE,
    LOCAL_WORKERS,
    NETWORK_WORKERS,
    FetchPace,
    fetch_threads,
    load_batch,
)
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
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


def _paced(seconds: float | None, images: int = 100) -> FetchPace:
    pace = FetchPace()
    if seconds is not None:
        pace.add(seconds * images, images)
        pace.batch_done()
    return pace


@pytest.mark.parametrize(
    ("uris", "workers", "per_image", "expected"),
    [
        (["/data/a.jpg"], None, None, LOCAL_WORKERS),  # nothing measured yet
        (["/data/a.jpg"], None, LIGHT_IMAGE / 10, 1),  # light images: one thread
        (["/data/a.jpg", None], None, LIGHT_IMAGE * 0.99, 1),
        (["/data/a.jpg"], None, LIGHT_IMAGE, LOCAL_WORKERS),  # heavy: decoding gains from two
        (["/data/a.jpg"], None, LIGHT_IMAGE * 10, LOCAL_WORKERS),
        (["https://cdn.example.com/b.jpg"], None, LIGHT_IMAGE / 10, NETWORK_WORKERS),  # the network waits
        (["/data/a.jpg"], 3, LIGHT_IMAGE / 10, 3),  # the caller's number wins
    ],
)
def test_local_files_get_one_thread_where_the_images_are_light(uris, workers, per_image, expected):
    with ImageSource() as source:
        assert fetch_threads(source, uris, workers, _paced(per_image)) == expected


def test_the_pace_is_the_last_batch_with_images():
    pace = _paced(LIGHT_IMAGE * 4)
    pace.add(LIGHT_IMAGE / 2 * 10, 10)
    pace.add(LIGHT_IMAGE / 2 * 30, 30)
    assert pace.per_image is not None and pace.per_image > LIGHT_IMAGE  # a batch under way counts not
    pace.batch_done()
    assert pace.per_image == pytest.approx(LIGHT_IMAGE / 2)
    pace.batch_done()  # a batch with nothing added: the pace stays
    assert pace.per_image == pytest.approx(LIGHT_IMAGE / 2)


@pytest.mark.parametrize("fails", ["no uri", "missing file", "network"])
def test_points_that_fail_or_come_over_the_network_leave_the_pace_alone(models, tmp_path, fails):
    """A batch of failures costs microseconds an image: counted, it would make heavy images
    look light and halve the next batch's threads (and a network batch's fetch CPU says
    nothing of the local files')."""
    encoder = OnnxEncoder(models.rm)
    heavy = _paced(2 * LIGHT_IMAGE)
    uris = {
        "no uri": [{} for _ in range(40)],
        "missing file": [{"uri": str(tmp_path / f"gone-{i}.jpg")} for i in range(40)],
        "network": [{"uri": f"http://127.0.0.1:9/{i}.jpg"} for i in range(40)],
    }[fails]
    points = [(i, payload) for i, payload in enumerate(uris)]
    with ImageSource() as source, ThreadPoolExecutor(8) as pool:
        loaded = load_batch(encoder, source, UriRule(), points, pool, workers=None, pace=heavy)
        assert loaded.rows == [] and len(loaded.failed) == 40
        assert heavy.per_image == pytest.approx(2 * LIGHT_IMAGE)
        assert fetch_threads(source, ["/data/a.jpg"], None, heavy) == LOCAL_WORKERS
        fresh = FetchPace()  # a first batch that fails whole leaves the pace unmeasured
        load_batch(encoder, source, UriRule(), points, pool, workers=None, pace=fresh)
        assert fresh.per_image is None


@pytest.fixture
def gallery(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 3 + 1))[:N]
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    return DualIndex.open(store, "p")


def _busiest(monkeypatch, cost: float | None = None) -> list[int]:
    """Patch the source's fetch to take a while; the list gets the most fetches seen at once
    (per batch, with _per_batch). ``cost``: the loader's thread clock (which the pace reads)
    advances by exactly that a fetch and by nothing else, so the pace sees images of that
    cost whatever the machine's speed."""
    lock, now, most = threading.Lock(), [0], [0]
    fetch = ImageSource.fetch
    if cost is not None:
        clock = threading.local()
        thread_time = lambda: getattr(clock, "t", 0.0)  # noqa: E731
        monkeypatch.setattr(
            loading, "time", SimpleNamespace(thread_time=thread_time, perf_counter=time.perf_counter)
        )

    def slow(self, uri):
        with lock:
            now[0] += 1
            most[-1] = max(most[-1], now[0])
        try:
            time.sleep(0.01)  # long enough for every thread given work to be in here together
            if cost is not None:
                clock.t = getattr(clock, "t", 0.0) + cost
            return fetch(self, uri)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(ImageSource, "fetch", slow)
    return most


def _per_batch(most: list[int], monkeypatch) -> list[int]:
    """Start a new count in ``most`` (from _busiest) at each batch the migration prepares."""
    from rm_qdrant.migration.migrator import Migrator

    prepare = Migrator._prepare

    def counted(self, *args, **kwargs):
        most.append(0)
        return prepare(self, *args, **kwargs)

    monkeypatch.setattr(Migrator, "_prepare", counted)
    return most


def test_local_files_are_fetched_by_few_threads_by_default(gallery, monkeypatch):
    most = _busiest(monkeypatch)
    report = run_migration(gallery, MigrateOptions(batch=N))
    assert report.moved == N and report.failed == 0
    assert 1 <= most[0] <= LOCAL_WORKERS


def test_light_local_images_are_fetched_by_one_thread(gallery, monkeypatch):
    """Images of a tenth of LIGHT_IMAGE: after the first slice of the first batch, fetched on
    its own to measure them, one thread."""
    most = _per_batch(_busiest(monkeypatch, cost=LIGHT_IMAGE / 10), monkeypatch)
    report = run_migration(gallery, MigrateOptions(batch=N // 4))
    assert report.moved == N and report.failed == 0
    assert most[1:] == [1, 1, 1, 1]  # most[0]: before the first batch


def test_heavy_local_images_keep_the_default_threads(gallery, monkeypatch):
    """Images of twice LIGHT_IMAGE: every batch gets the default (the first once its first
    slice was measured)."""
    most = _per_batch(_busiest(monkeypatch, cost=2 * LIGHT_IMAGE), monkeypatch)
    report = run_migration(gallery, MigrateOptions(batch=N // 4))
    assert report.moved == N and report.failed == 0
    assert most[1:] == [LOCAL_WORKERS] * 4


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
