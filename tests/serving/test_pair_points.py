"""DualIndex.set_payload, retrieve and count across the pair (qdrant-client's vocabulary), on
every layout and state and both stores, against a brute-force reference: the points (and
their sides, payloads and vectors) that an exhaustive search of the pair returns."""

from __future__ import annotations

import numpy as np
import pytest
from qdrant_client import models

from rm_qdrant import ConfigError, DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.planning import MOVING, new_payload
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize, rollback
from tests.conftest import NEW_DIM, OLD_DIM, make_image_folder

pytestmark = pytest.mark.slow

ADDED, MISSING = 10_000, 99_999
LAYOUTS = {
    "paired": {},
    "keep-old": {"keep_old": True},
    "single": {"layout": "single-collection", "new_vector": "new"},
}
CASES = [
    ("paired", "backfilling"),
    ("paired", "finalized"),
    ("keep-old", "backfilling"),
    ("keep-old", "finalized"),
    ("keep-old", "rolled_back"),
    ("single", "backfilling"),
    ("single", "finalized"),
    ("single", "rolled_back"),
]
FILTERS = [
    None,
    {"label": "a"},
    models.Filter(must_not=[models.FieldCondition(key="label", match=models.MatchValue(value="b"))]),
]


def build(store, models_, tmp_path, layout, state):
    """A pair of 24 images in ``state``: half migrated, a point added and one deleted by the
    application, and (two collections) a point left in both by a migration step cut short."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=8))
    index_images(store, "old", OnnxEncoder(models_.old), items)
    encoder, old = OnnxEncoder(models_.rm), OnnxEncoder(models_.old)
    create_pair(store, "p", old_collection="old", encoder=encoder, old_encoder=old, **LAYOUTS[layout])
    index = DualIndex.open(store, "p", exact=True)
    run_migration(index, MigrateOptions(until=0.5, batch=5))
    index.upsert([ADDED], [items[0].uri], [{"uri": items[0].uri, "label": "z"}])
    index.delete([items[1].point_id])
    if layout != "single":
        waiting = next(
            r for r in store.scroll("old", limit=100)[0] if not index.layout.ids_in_new(store, [r.id])
        )
        store.mark("old", [waiting.id], {MOVING: 1})
        vector = encoder.encode([waiting.payload["uri"]])["new"]
        store.upsert("p-new", [waiting.id], vector, [new_payload(waiting.payload)])
    if state == "finalized":
        run_migration(index, MigrateOptions(batch=5))
        finalize(store, index.pair)
    elif state == "rolled_back":
        rollback(store, index.pair)
    return DualIndex.open(store, "p", exact=True), [i.point_id for i in items]


@pytest.fixture(params=CASES, ids=["-".join(c) for c in CASES])
def pair(request, store, models, tmp_path):
    return build(store, models, tmp_path, *request.param)


def served(index, filter=None):
    """Brute force: every point an exhaustive search of the pair returns, by id."""
    hits = index.search_vectors(
        np.ones(NEW_DIM, np.float32),
        np.ones(OLD_DIM, np.float32),
        limit=1000,
        filter=filter,
        with_vectors=True,
    )
    assert len({h.id for h in hits}) == len(hits), "search served a point twice"
    return {h.id: h for h in hits}


def test_count_is_the_number_of_points_search_serves(pair):
    index, _ = pair
    for filter in FILTERS:
        want = served(index, filter)
        assert index.count(filter) == len(want), filter
        assert index.count(filter, exact=False) == len(want), filter


def test_retrieve_gives_each_point_as_search_serves_it(pair):
    index, ids = pair
    want = served(index)
    asked = [MISSING, *reversed(ids), ADDED, ids[3]]
    got = index.retrieve(asked, with_vectors=True)
    assert [p.id for p in got] == [i for i in dict.fromkeys(asked) if i in want]
    for point in got:
        hit = want[point.id]
        assert (point.source, point.payload) == (hit.source, hit.payload)
        assert not any(k.startswith("rmq_") for k in point.payload)
        np.testing.assert_allclose(point.vector, hit.vector, atol=1e-6)
    plain = index.retrieve(asked)
    assert [p.id for p in plain] == [p.id for p in got] and all(p.vector is None for p in plain)
    assert [p.payload for p in index.retrieve(asked, with_payload=["label"])] == [
        {"label": want[p.id].payload["label"]} for p in got
    ]
    assert all(p.payload == {} for p in index.retrieve(asked, with_payload=False))


def test_set_payload_by_ids_updates_every_served_point_named(pair):
    index, ids = pair
    before = served(index)
    sources = {h.source for h in before.values()}
    chosen = [MISSING, ADDED, ids[1], *ids[::3]]  # ids[1] was deleted
    index.set_payload({"tag": "x", "label": "tagged"}, chosen)
    after = served(index)
    assert set(after) == set(before)
    for point_id, hit in after.items():
        if point_id in chosen:
            assert hit.payload == {**before[point_id].payload, "tag": "x", "label": "tagged"}
            assert hit.source == before[point_id].source
        else:
            assert hit.payload == before[point_id].payload
    assert index.count({"tag": "x"}) == len(set(chosen) & set(after)) > 0
    assert {p.id for p in index.retrieve(chosen)} == set(chosen) & set(after)
    assert sources == {h.source for h in after.values()}


def test_set_payload_by_filter_updates_the_points_it_matches(pair):
    index, _ = pair
    for form, filter in enumerate(FILTERS[1:]):  # the dict form, then models.Filter
        matching = set(served(index, filter))
        index.set_payload({"tag": f"y{form}"}, filter)
        assert {i for i, h in served(index).items() if h.payload.get("tag") == f"y{form}"} == matching
        assert index.count({"tag": f"y{form}"}) == len(matching)


@pytest.mark.parametrize("layout", ["keep-old", "single"])
def test_a_rollback_serves_the_updates_made_while_backfilling(store, models, tmp_path, layout):
    index, ids = build(store, models, tmp_path, layout, "backfilling")
    index.set_payload({"tag": "kept"}, [*ids, ADDED])
    migrated = {i for i, h in served(index).items() if h.source == "new"}
    rollback(store, index.pair)
    back = DualIndex.open(store, "p", exact=True)
    after = served(back)
    assert migrated & set(after) and ADDED in after
    assert all(h.payload.get("tag") == "kept" and h.source == "old" for h in after.values())
    assert back.count({"tag": "kept"}) == len(after) == back.count()


def test_a_finalized_pair_leaves_the_old_collection_it_kept_alone(store, models, tmp_path):
    index, ids = build(store, models, tmp_path, "keep-old", "finalized")
    index.set_payload({"tag": "new-only"}, [*ids, ADDED])
    assert all(h.payload["tag"] == "new-only" for h in served(index).values())
    assert all("tag" not in r.payload for r in store.scroll("old", limit=100)[0])


BAD_CALLS = [
    (lambda i: i.set_payload({"rmq_origin": "user"}, [1]), "rmq_origin"),
    (lambda i: i.set_payload({"rmq_migrated": 0, "a": 1}, [1]), "rmq_migrated"),
    (lambda i: i.set_payload({"a": 1}, [1], key="meta"), "nested key"),
    (lambda i: i.set_payload({"a": 1}, "12"), "list of ids or a filter"),
    (lambda i: i.set_payload(["a"], [1]), "mapping"),
    (lambda i: i.set_payload({"a": 1}, ["not-an-id"]), "invalid point id"),
    (lambda i: i.set_payload({"a": 1}, {"meta": {"dept": "a"}}), "gt, gte, lt, lte"),
    (lambda i: i.retrieve([1], with_payload="label"), "with_payload"),
    (lambda i: i.retrieve([1], with_vectors="yes"), "with_vectors"),
    (lambda i: i.retrieve(7), "list of ids"),
    (lambda i: i.count(exact="yes"), "exact"),
    (lambda i: i.count({"meta": {"dept": "a"}}), "gt, gte, lt, lte"),
]


def test_bad_input_is_one_clear_error(store, models, tmp_path):
    index, _ = build(store, models, tmp_path, "paired", "backfilling")

    def state():
        return {i: (h.source, h.payload) for i, h in served(index).items()}

    before = state()
    for call, message in BAD_CALLS:
        with pytest.raises(ConfigError, match=message):
            call(index)
    assert state() == before  # nothing was written
