"""A user's write that spans both halves of a pair is all or nothing, as the application sees it.

A write the library refuses changes nothing: a --keep-old ``upsert_vectors`` with NaN in
``old_vectors`` replaced the point's copy in new, then raised ``ConfigError`` at the write to
old, leaving the application told "failed" while search served the write, a rollback serving
the previous data, and ``rmq_moving`` on old's copy.

A write killed at any of its store operations (``upsert_vectors``, ``set_payload``,
``delete``; paired and --keep-old) leaves each point served once, as it was or as written,
its vector the model's embedding of the image its payload names (a migrated point's copy or a
user's write, never one's vector under the other's payload); the next ``migrate`` embeds what
old then serves, and running the write again completes it (a --keep-old rollback then serves
it by the old model).

Points of each kind are written together, as an application's batch: one still in old, one
migrated, one a migration step left in both (its copy written, old not yet retired), and a new one.
"""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.errors import RmqError
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import rollback
from tests.conftest import make_image_folder
from tests.faults import Crash, Scripted, crash, nth_write

pytestmark = pytest.mark.slow

N = 12
ADDED = 10_000


class Gallery:
    """A pair mid-migration and its models, to say what each served point must be."""

    def __init__(self, store, models, tmp_path, keep_old: bool) -> None:
        self.store, self.keep_old = store, keep_old
        self.items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=N // 3))
        self.rm, self.old_model = OnnxEncoder(models.rm), OnnxEncoder(models.old)
        index_images(store, "old", self.old_model, self.items)
        create_pair(
            store, "p", old_collection="old", encoder=self.rm, old_encoder=self.old_model, keep_old=keep_old
        )
        run_migration(self.index(), MigrateOptions(batch=4, limit=4))
        copied = lambda name, args, kwargs: name == "upsert" and kwargs.get("insert_only")  # noqa: E731
        with pytest.raises(Crash):  # a step cut short after its copies: two points in both
            run_migration(
                DualIndex.open(Scripted(store, [("after", copied, crash)]), "p"), MigrateOptions(batch=2)
            )
        in_new = {r.id for r in store.scroll("p-new", limit=100)[0]}
        hidden = set(self.hidden())
        in_old = {r.id for r in store.scroll("old", limit=100)[0]} - hidden
        self.waiting = next(i.point_id for i in self.items if i.point_id not in in_new)
        self.moved = next(i.point_id for i in self.items if i.point_id in in_new and i.point_id not in in_old)
        self.both = next(i.point_id for i in self.items if i.point_id in in_new and i.point_id in in_old)
        self.victims = [self.waiting, self.moved, self.both, ADDED]

    def index(self, store=None) -> DualIndex:
        return DualIndex.open(store or self.store, "p", exact=True)

    def hidden(self) -> list:
        return [
            r.id for r in self.store.scroll("old", limit=100, where=None)[0] if r.payload.get("rmq_migrated")
        ]

    def snapshot(self) -> dict:
        """Everything both collections hold (bookkeeping included)."""
        return {
            name: {
                str(r.id): (r.payload, np.round(r.vector, 5).tolist())
                for r in self.store.scroll(name, limit=100, with_vectors=True)[0]
            }
            for name in ("old", "p-new")
        }

    def served(self) -> dict[str, tuple[dict, str]]:
        """Each point the pair serves (str id -> user payload, side), checked: once in search
        and count, its vector its side's model's embedding of the image its payload names."""
        index = self.index()
        ids = [i.point_id for i in self.items] + [ADDED]
        points = {str(p.id): p for p in index.retrieve(ids, with_vectors=True)}
        rng = np.random.default_rng(2)
        hits = index.search_vectors(rng.normal(size=10), rng.normal(size=6), limit=3 * N)
        assert sorted(str(h.id) for h in hits) == sorted(points), "a point served twice, or not at all"
        assert index.count() == len(points)
        for key, point in points.items():
            want = self._embedding(point.payload["uri"], point.source)
            cosine = point.vector @ want / np.linalg.norm(point.vector) / np.linalg.norm(want)
            assert cosine > 1 - 1e-5, f"{key} ({point.source}): not the vector of {point.payload['uri']}"
        return {key: (p.payload, p.source) for key, p in points.items()}

    def _embedding(self, uri: str, side: str) -> np.ndarray:
        if side == "new":
            return self.rm.encode([uri])["new"][0]
        return self.old_model.encode([uri])["embedding"][0]

    def write(self, n: int = 0) -> dict:
        """An application's write of every victim: the image ``items[-1 - n]``, by both models."""
        uri = self.items[-1 - n].uri
        rows = len(self.victims)
        new = np.repeat(self.rm.encode([uri])["new"], rows, axis=0)
        old = np.repeat(self.old_model.encode([uri])["embedding"], rows, axis=0)
        extra = {"old_vectors": old} if self.keep_old else {}
        return {"ids": self.victims, "vectors": new, "payloads": [{"uri": uri, "by": "user"}] * rows, **extra}


@pytest.fixture(params=[False, True], ids=["paired", "keep-old"])
def gallery(request, store, models, tmp_path):
    return Gallery(store, models, tmp_path, request.param)


def _nan(matrix: np.ndarray) -> np.ndarray:
    spoilt = matrix.copy()
    spoilt[-1, 0] = np.nan
    return spoilt


REFUSED = {
    "infinity in vectors": lambda w: {**w, "vectors": _nan(w["vectors"]) * np.inf},
    "an other vector the collection lacks": lambda w: {**w, "other_vectors": {"text": [[1.0]] * 4}},
}
#: --keep-old only (a paired pair takes no old vectors).
REFUSED_OLD = {
    "NaN in old_vectors": lambda w: {**w, "old_vectors": _nan(w["old_vectors"])},
    "a float64 too large for float32 in old_vectors": lambda w: {
        **w,
        "old_vectors": w["old_vectors"].astype(np.float64) * 1e300,
    },
    "old_vectors of the wrong size": lambda w: {**w, "old_vectors": w["old_vectors"][:, :-1]},
    "one vector too few in old_vectors": lambda w: {**w, "old_vectors": w["old_vectors"][:-1]},
}


def _refused(gallery, spoil) -> None:
    before = gallery.snapshot()
    with pytest.raises(RmqError) as refused:
        gallery.index().upsert_vectors(**spoil(gallery.write()))
    assert len(str(refused.value).splitlines()) == 1
    assert gallery.snapshot() == before


@pytest.mark.parametrize("spoil", list(REFUSED))
def test_a_refused_write_changes_nothing(gallery, spoil):
    _refused(gallery, REFUSED[spoil])


@pytest.mark.parametrize("spoil", list(REFUSED_OLD))
def test_a_refused_keep_old_write_changes_nothing(store, models, tmp_path, spoil):
    """The issue's case: NaN in old_vectors was refused after new's copy was replaced."""
    _refused(Gallery(store, models, tmp_path, keep_old=True), REFUSED_OLD[spoil])


def _upsert(gallery, index):
    index.upsert_vectors(**gallery.write())


def _set_payload(gallery, index):
    index.set_payload({"tag": "x"}, gallery.victims)


def _delete(gallery, index):
    index.delete(gallery.victims)


def _wanted(gallery, op, before: dict) -> dict:
    """Each victim's payload once ``op`` is done (None: not served)."""
    keys = [str(v) for v in gallery.victims]
    if op is _upsert:
        written = gallery.write()["payloads"][0]
        return dict.fromkeys(keys, written)
    if op is _set_payload:
        return {k: None if before.get(k) is None else {**before[k], "tag": "x"} for k in keys}
    return dict.fromkeys(keys)


KILLS = [(_upsert, n) for n in range(3)] + [(op, n) for op in (_set_payload, _delete) for n in range(2)]


@pytest.mark.parametrize(("op", "n"), KILLS, ids=[f"{op.__name__[1:]}-write{n}" for op, n in KILLS])
def test_a_write_killed_at_any_store_write_serves_each_point_once_as_it_was_or_as_written(gallery, op, n):
    served = gallery.served()
    before = {str(v): served[str(v)][0] if str(v) in served else None for v in gallery.victims}
    wanted = _wanted(gallery, op, before)
    killed = Scripted(gallery.store, [("before", nth_write(n), crash)])
    with pytest.raises(Crash):
        op(gallery, gallery.index(killed))
    for moment in ("after the kill", "after the next migrate", "after a second migrate"):
        if moment != "after the kill":
            run_migration(gallery.index(), MigrateOptions(batch=N))
        served = gallery.served()
        for key in before:
            now = served[key][0] if key in served else None
            assert now in (before[key], wanted[key]), f"{moment}: {key} serves {now}"
    assert all(side == "new" for _, side in served.values()), "a point left for the migration"
    op(gallery, gallery.index())  # the application runs its write again
    served = gallery.served()
    assert {key: served[key][0] if key in served else None for key in before} == wanted
    if gallery.keep_old:  # and a rollback serves it, by the old model
        rollback(gallery.store, gallery.index().pair)
        served = gallery.served()
        assert {key: served[key][0] if key in served else None for key in before} == wanted
        assert {side for _, side in served.values()} == {"old"}


@pytest.mark.parametrize("n", range(3))
def test_a_keep_old_write_killed_at_any_store_write_then_rolled_back_serves_what_search_served(
    store, models, tmp_path, n
):
    """upsert_vectors wrote new, then old's hidden copy: killed between the two, new served the
    write and the next migrate hid old's previous copy, which a rollback then served. Old's copy
    is now written first, served, and hidden once new is written."""
    gallery = Gallery(store, models, tmp_path, keep_old=True)
    killed = Scripted(store, [("before", nth_write(n), crash)])
    with pytest.raises(Crash):
        _upsert(gallery, gallery.index(killed))
    for _ in range(2):
        run_migration(gallery.index(), MigrateOptions(batch=N))
    served = gallery.served()
    rollback(store, gallery.index().pair)
    assert {key: payload for key, (payload, _) in gallery.served().items()} == {
        key: payload for key, (payload, _) in served.items()
    }
