"""The single-collection layout's writes are all or nothing, and ``finalize`` catches every
old-model write made before its record (issue 45, items 3 and 4).

- A rewrite of a point was three qdrant-edge operations (overwrite the payload, delete vectors,
  update vectors): an application killed after the first kept the new photo's payload with the
  old photo's vectors, its new vector included, so no migration embedded it again; a write from
  a ``DualIndex`` opened before ``finalize --drop-old`` replaced the payload, then was refused.
- ``finalize`` without ``--drop-old`` swept the points lacking the new vector once: a point an
  old-model write left without it after that sweep, but before the ``finalized`` record, was
  served by nothing once finalized.

"Served right" is checked against what the application wrote: each point served once, with a
payload it was given, by the vector its model makes of that payload's image (the new model's
where it has the new vector, else the old one's), and any old vector it keeps of the same image
(a rollback serves that one). Kills are exceptions raised in place of the engine's own write
(each qdrant-edge update operation, each qdrant-client request that writes), on both stores.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, load_pair, open_store, scan_image_folder
from rm_qdrant.errors import MigrationError, RmqError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.store import Where
from tests.conftest import make_image_folder
from tests.faults import Crash, Scripted, crash, nth_write
from tests.pair.test_single_collection import make_pair

LACKS_NEW = Where(lacks_vector=("new",))
ADDED, ADDED_TOO = 10_001, 10_002  # ids an application adds
_CLIENT_WRITES = frozenset(
    {
        "upsert",
        "update_vectors",
        "delete_vectors",
        "delete",
        "set_payload",
        "overwrite_payload",
        "delete_payload",
        "clear_payload",
        "batch_update_points",
    }
)


class Embeddings:
    """What each model makes of an image file, unit length (the collection is cosine)."""

    def __init__(self, models) -> None:
        self._new, self._old, self._seen = OnnxEncoder(models.rm), OnnxEncoder(models.old), {}

    def new(self, uri: str) -> np.ndarray:
        return self._unit("new", self._new, uri)

    def old(self, uri: str) -> np.ndarray:
        return self._unit(self._old.info.gallery_output(), self._old, uri)

    def _unit(self, output: str, encoder: OnnxEncoder, uri: str) -> np.ndarray:
        if (output, uri) not in self._seen:
            vector = encoder.encode([uri], [output])[output][0]
            self._seen[output, uri] = vector / np.linalg.norm(vector)
        return self._seen[output, uri]


@pytest.fixture(scope="module")
def embeddings(models):
    return Embeddings(models)


def unit(vector) -> np.ndarray:
    return np.asarray(vector, dtype=np.float64) / np.linalg.norm(vector)


def assert_served_right(store, embeddings: Embeddings, expected: dict) -> None:
    """Each point of ``expected`` (id -> the payloads it may have; None among them: it may be
    gone) is served once, with one of them, by the vector of that payload's image."""
    index = DualIndex.open(store, "p", exact=True)
    served = {p.id: p for p in index.retrieve(list(expected), with_vectors=True)}
    for point_id, allowed in expected.items():
        point = served.get(point_id)
        if point is None:
            assert None in allowed, f"point {point_id} is not served"
            continue
        assert point.payload in allowed, (point_id, point.payload)
        uri = point.payload["uri"]
        want = embeddings.new(uri) if point.source == "new" else embeddings.old(uri)
        assert np.allclose(unit(point.vector), want, atol=1e-4), (point_id, point.source, uri)
    assert index.count() == len(served) == store.count("photos")  # nothing stored but unserved
    for record in store.retrieve("photos", list(served), with_vectors=True, vector=""):
        if record.vector is not None:  # what a rollback would serve: the same image
            want = embeddings.old(record.payload["uri"])
            assert np.allclose(unit(record.vector), want, atol=1e-4), (record.id, "old vector")


def served_payloads(store) -> dict:
    index = DualIndex.open(store, "p")
    ids = [r.id for r in store.scroll("photos", limit=1000, with_payload=False)[0]]
    return {p.id: p.payload for p in index.retrieve(ids)}


@pytest.fixture
def opened():
    """The stores a test opens, closed at its end whatever happened."""
    stores: list = []
    yield stores
    for store in stores:
        store.close()


def fresh_pair(opened, backend, tmp_path, n, models, items, until):
    store = open_store(":memory:" if backend == "memory" else tmp_path / f"q{n}")
    opened.append(store)
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100, until=until))
    return store


# -- a user's write killed at each of the engine's writes ------------------------------------------


class _Engine:
    """A qdrant-edge shard or a QdrantClient whose write number ``n`` (0-based) never lands:
    the process dies in its place."""

    def __init__(self, inner, writes, n) -> None:
        self._inner, self._writes, self._left, self.killed = inner, writes, n, False

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in self._writes:
            return attr

        def call(*args, **kwargs):
            if self._left == 0 and not self.killed:
                self.killed = True
                raise Crash
            self._left -= 1
            return attr(*args, **kwargs)

        return call


@contextlib.contextmanager
def engine_killed(store, n):
    """``store`` with its engine's write number ``n`` replaced by a crash."""
    if hasattr(store, "_shards"):  # qdrant-edge: every write is one shard update
        specs, shard = store._open("photos")
        engine = _Engine(shard, {"update"}, n)
        store._shards["photos"] = (specs, engine)
        try:
            yield engine
        finally:
            store._shards["photos"] = (store._shards["photos"][0], shard)
    else:
        engine = _Engine(store._client, _CLIENT_WRITES, n)
        store._client = engine
        try:
            yield engine
        finally:
            store._client = engine._inner


def user_write(kind, index, embeddings, targets, images):
    """One application write of ``kind`` to ``targets`` (ids), with ``images`` where it writes some."""
    payloads = [{"uri": uri, "by": "app"} for uri in images]
    if kind == "upsert":  # images: both models embed them (a rollback serves the old vector)
        index.upsert(targets, images, payloads)
    elif kind == "upsert_vectors":  # the new model's vectors alone: the old ones go
        index.upsert_vectors(targets, np.stack([embeddings.new(uri) for uri in images]), payloads)
    elif kind == "keep_payload":  # the new model's vectors again, payloads kept: the old ones go
        index.upsert_vectors(targets, np.stack([embeddings.new(uri) for uri in images]), None)
    elif kind == "set_payload":
        index.set_payload({"tag": 1}, targets)
    else:
        index.delete(targets)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["upsert", "upsert_vectors", "keep_payload", "set_payload", "delete"])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_a_write_killed_at_any_engine_write_leaves_every_point_served_right(
    models, embeddings, tmp_path, opened, backend, kind
):
    """Targets: a migrated point, one not yet migrated and, for upserts, a point added."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    n = 0
    while True:
        store = fresh_pair(opened, backend, tmp_path, n, models, items, until=0.5)
        migrated = {r.id for r in store.scroll("photos", limit=100, where=Where(has_vector=("new",)))[0]}
        before = served_payloads(store)
        moved, waiting = min(migrated), min(set(before) - migrated)
        targets = [moved, waiting] + ([ADDED] if kind.startswith("upsert") else [])
        by_id = {i.point_id: i.uri for i in items}
        images = [items[-1].uri, items[-2].uri, items[-3].uri][: len(targets)]
        if kind == "keep_payload":
            images = [by_id[t] for t in targets]
        with engine_killed(store, n) as engine, contextlib.suppress(Crash):
            user_write(kind, DualIndex.open(store, "p"), embeddings, targets, images)
        if not engine.killed:  # the write made fewer than n + 1 engine writes: each one was killed
            break
        written = _written(kind, before, targets, images)
        either = {i: [before.get(i), written[i]] if i in written else [p] for i, p in before.items()}
        either.update({i: [None, p] for i, p in written.items() if i not in before})
        assert_served_right(store, embeddings, either)  # at once, before anything repairs it
        run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))  # the next migrate
        assert_served_right(store, embeddings, either)
        user_write(kind, DualIndex.open(store, "p"), embeddings, targets, images)  # the application retries
        assert_served_right(store, embeddings, {i: [p] for i, p in {**before, **written}.items()})
        n += 1
    assert n >= 1


def _written(kind, before, targets, images):
    """Each target's payload once the write is done (None: deleted)."""
    if kind in ("upsert", "upsert_vectors"):
        return {t: {"uri": uri, "by": "app"} for t, uri in zip(targets, images, strict=True)}
    if kind == "keep_payload":
        return {t: before[t] for t in targets}
    if kind == "set_payload":
        return {t: {**before[t], "tag": 1} for t in targets}
    return dict.fromkeys(targets)


# -- a write from a DualIndex opened before finalize --drop-old -------------------------------------


def test_a_write_of_old_vectors_after_the_drop_is_refused_before_anything_is_written(
    store, models, embeddings, tmp_path
):
    """The application opened its DualIndex while the pair backfilled (it writes the old model's
    vectors too); the cutover then dropped the old vector. Its write is refused whole, in one
    line; refreshed, it writes the new vector alone. A write without old vectors completes."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    stale = DualIndex.open(store, "p")
    finalize(store, load_pair(store, "p"), drop_old=True)
    before = served_payloads(store)
    targets, images = [items[0].point_id, ADDED], [items[-1].uri, items[-2].uri]
    payloads = [{"uri": uri, "by": "app"} for uri in images]
    with pytest.raises(MigrationError, match=r"old vector '' dropped: nothing was written; refresh\(\)") as e:
        stale.upsert(targets, images, payloads)
    assert "\n" not in str(e.value)
    assert served_payloads(store) == before  # the payload of the rewritten point too
    assert_served_right(store, embeddings, {i: [p] for i, p in before.items()})
    vectors = np.stack([embeddings.new(uri) for uri in images])
    stale.upsert_vectors(targets, vectors, payloads)  # no old vectors: nothing refused
    written = dict(zip(targets, payloads, strict=True))
    assert_served_right(store, embeddings, {i: [p] for i, p in {**before, **written}.items()})
    stale.refresh()
    stale.upsert(targets, images[::-1], payloads[::-1])
    written = dict(zip(targets, payloads[::-1], strict=True))
    assert_served_right(store, embeddings, {i: [p] for i, p in {**before, **written}.items()})


# -- old-model writes racing finalize ---------------------------------------------------------------


def nth_call(n: int):
    """A step test that holds before the n-th store call (0-based), reads included."""
    seen = [0]

    def test(name, args, kwargs):
        seen[0] += 1
        return seen[0] == n + 1

    return test


def old_model_writes(store, stale, embeddings, items, expected):
    """What runs between two of finalize's store calls: the team's old code rewrites a point with a
    new image and adds one (the old vector alone, through the store), and a DualIndex opened before
    finalize does the same (it writes both models' vectors). ``expected`` takes what landed."""
    plain = {items[0].point_id: items[-1].uri, ADDED: items[-2].uri}
    with contextlib.suppress(RmqError):  # after the drop the old vector is refused
        for point_id, uri in plain.items():
            payload = {"uri": uri, "by": "old code"}
            store.upsert("photos", [point_id], embeddings.old(uri)[None], [payload])
            expected[point_id] = payload
    targets, images = [items[1].point_id, ADDED_TOO], [items[-3].uri, items[-4].uri]
    payloads = [{"uri": uri, "by": "app"} for uri in images]
    with contextlib.suppress(MigrationError):  # after the drop: refused, nothing written
        stale.upsert(targets, images, payloads)
        expected.update(zip(targets, payloads, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("drop_old", [False, True])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_old_model_writes_between_any_two_finalize_calls_are_served_once_it_is_done(
    models, embeddings, tmp_path, opened, backend, drop_old
):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    n = 0
    while True:
        store = fresh_pair(opened, backend, tmp_path, n, models, items, until=None)
        stale, expected = DualIndex.open(store, "p"), served_payloads(store)
        writes = functools.partial(old_model_writes, store, stale, embeddings, items, expected)
        scripted = Scripted(store, [("before", nth_call(n), writes)])
        try:
            done = finalize(scripted, load_pair(store, "p"), drop_old=drop_old)
        except MigrationError:  # written before it counted: it refuses, the team migrates and reruns
            assert load_pair(store, "p").state == "backfilling"
            run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
            done = finalize(store, load_pair(store, "p"), drop_old=drop_old)
        if scripted.pending:  # finalize made fewer than n + 1 calls: every gap was tried
            break
        assert done.state == "finalized" == load_pair(store, "p").state
        assert store.count("photos", LACKS_NEW) == 0, n
        assert_served_right(store, embeddings, {i: [p] for i, p in expected.items()})
        n += 1
    assert n >= 5


def after_the_passes_before_the_record(drop_old: bool):
    """The moment old-model writes land: just before the old vector is dropped, or (kept) just
    before the bookkeeping is cleared and the pair recorded finalized."""
    last = "drop_vector" if drop_old else "clear_fields"
    return lambda name, args, kwargs: name == last


@pytest.mark.slow
@pytest.mark.parametrize("drop_old", [False, True])
@pytest.mark.parametrize("backend", ["edge", "memory"])
def test_finalize_killed_at_any_write_after_old_model_writes_is_completed_by_a_rerun(
    models, embeddings, tmp_path, opened, backend, drop_old
):
    """Killed at each of its writes from the old-model writes on (the record and the pass after it
    included), ``finalize`` run again leaves every point served: a finalized pair whose points
    lack the new vector has them embedded by the rerun."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    n = 0
    while True:
        store = fresh_pair(opened, backend, tmp_path, n, models, items, until=None)
        stale, expected = DualIndex.open(store, "p"), served_payloads(store)
        writes = functools.partial(old_model_writes, store, stale, embeddings, items, expected)
        moment = after_the_passes_before_the_record(drop_old)
        killed = Scripted(store, [("before", moment, writes), ("before", nth_write(n), crash)])
        with contextlib.suppress(Crash):
            finalize(killed, load_pair(store, "p"), drop_old=drop_old)
        if killed.pending:  # finalize made fewer than n + 1 writes after them: each one was killed
            break
        try:
            finalize(store, load_pair(store, "p"), drop_old=drop_old)  # the team runs it again
        except MigrationError as exc:
            assert "already finalized" in str(exc)
        assert load_pair(store, "p").state == "finalized"
        assert store.count("photos", LACKS_NEW) == 0, n
        assert_served_right(store, embeddings, {i: [p] for i, p in expected.items()})
        n += 1
    assert n >= 3


def test_a_point_the_last_pass_cannot_embed_puts_the_pair_back_to_finalizing(
    store, models, embeddings, tmp_path
):
    """Old code adds a point whose image is missing just before the record: finalize says so in
    one line and the pair stays under way (not 'finalized' with a point served by nothing); run
    again once the image is there, it completes."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    missing = (tmp_path / "later" / "x").with_suffix(Path(items[0].uri).suffix)

    def add():
        store.upsert("photos", [ADDED], embeddings.old(items[0].uri)[None], [{"uri": str(missing)}])

    scripted = Scripted(store, [("before", after_the_passes_before_the_record(False), add)])
    with pytest.raises(MigrationError, match=r"1 point .*no vector 'new'.*finalize --name p") as caught:
        finalize(scripted, load_pair(store, "p"))
    assert "\n" not in str(caught.value) and load_pair(store, "p").state == "finalizing"
    missing.parent.mkdir()
    shutil.copy(items[0].uri, missing)
    assert finalize(store, load_pair(store, "p")).state == "finalized"
    assert store.count("photos", LACKS_NEW) == 0
    served = DualIndex.open(store, "p").retrieve([ADDED], with_vectors=True)[0]
    assert np.allclose(unit(served.vector), embeddings.new(items[0].uri), atol=1e-4)


def test_finalize_run_again_embeds_what_old_code_wrote_after_the_record(store, models, embeddings, tmp_path):
    """Once finalized, a point written by old code (the old vector alone) is served by nothing:
    'finalize' run again embeds it, and says 'already finalized' when there is nothing to do."""
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=4))
    make_pair(store, models, items, old_encoder=OnnxEncoder(models.old))
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=100))
    finalize(store, load_pair(store, "p"))
    store.upsert("photos", [ADDED], embeddings.old(items[1].uri)[None], [{"uri": items[1].uri}])
    assert DualIndex.open(store, "p").retrieve([ADDED]) == []
    assert finalize(store, load_pair(store, "p")).state == "finalized"
    served = DualIndex.open(store, "p").retrieve([ADDED], with_vectors=True)[0]
    assert np.allclose(unit(served.vector), embeddings.new(items[1].uri), atol=1e-4)
    with pytest.raises(MigrationError, match="already finalized"):
        finalize(store, load_pair(store, "p"))
