"""``rm_qdrant.migrate``: the migration as a Python call (a scheduler's or a notebook's)."""

from __future__ import annotations

import threading

import pytest

import rm_qdrant
from rm_qdrant import OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.errors import ConfigError
from tests.conftest import make_image_folder

N = 60


@pytest.fixture
def pair(store, models, tmp_path):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=20))
    index_images(store, "old", OnnxEncoder(models.old), items)
    create_pair(store, "p", old_collection="old", encoder=OnnxEncoder(models.rm))
    return items


def test_migrate_in_steps_with_progress_and_a_stop_event(store, models, pair):
    seen = []
    half = rm_qdrant.migrate(store, "p", until=0.5, batch=7, on_batch=seen.append)
    assert isinstance(half, rm_qdrant.MigrationReport)
    assert (half.planned, half.moved, half.failed, half.stopped_early) == (30, 30, 0, False)
    assert sum(b.moved for b in seen) == 30 and store.count("p-new") == 30

    stop = threading.Event()
    stopped = rm_qdrant.migrate(
        store, "p", batch=7, encoder=models.rm, stop=stop, on_batch=lambda _: stop.set()
    )
    assert stopped.stopped_early and 7 <= stopped.moved < N - 30  # the batch in flight settles, no more
    assert store.count("p-new") == 30 + stopped.moved and store.count("old") == N - 30 - stopped.moved

    rest = rm_qdrant.migrate(store, "p", batch=7, workers=2, encoder=OnnxEncoder(models.rm))
    assert rest.moved == N - 30 - stopped.moved and not rest.stopped_early
    assert store.count("p-new") == N and store.count("old") == 0


def test_bad_options_are_one_clear_error(store, models, pair):
    with pytest.raises(ConfigError, match=r"unknown migrate options? 'batch_size', 'untill'.*batch.*until"):
        rm_qdrant.migrate(store, "p", batch_size=7, untill=0.5)
    with pytest.raises(ConfigError, match="order"):
        rm_qdrant.migrate(store, "p", order="sideways")
    with pytest.raises(ConfigError, match="workers"):
        rm_qdrant.migrate(store, "p", workers=0)
    assert store.count("p-new") == 0


@pytest.mark.parametrize(
    "options",
    [{"workers": 99999999999999999999999}, {"workers": 257}, {"fetch_workers": 10**22}],
)
def test_an_absurd_worker_count_is_refused_before_anything_is_built(store, pair, options):
    # one entry per worker was built first: 10**22 workers grew to gigabytes before a refusal
    with pytest.raises(ConfigError, match=r"workers.* is a whole number from 1 to 256"):
        rm_qdrant.migrate(store, "p", **options)
    assert store.count("p-new") == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch": "10"}, "batch must be an integer, got '10'"),
        ({"batch": 2.5}, "batch must be an integer"),
        ({"until": "0.5"}, "until must be a number"),
        ({"workers": "2"}, "workers must be an integer"),
        ({"limit": -1}, "limit must be >= 0"),
        ({"fetch_workers": True}, "fetch_workers must be an integer"),
        ({"optimize_every": -3}, "optimize_every must be >= 0"),
        ({"retry_failed": "yes"}, "retry_failed is True or False"),
        ({"stop": True}, "stop is a threading.Event"),
        ({"on_batch": 5}, "on_batch is a function"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_clear_error_before_anything_moves(store, pair, options, message):
    with pytest.raises(ConfigError, match=message):
        rm_qdrant.migrate(store, "p", **options)
    assert store.count("p-new") == 0
