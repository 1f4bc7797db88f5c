""" "Keep the payload" and set_payload around a migration batch, at every store call of it.

A write with ``payloads=None`` (or a None entry) keeps the point's payload. It read that
payload from new when new held the point, even while new held only the migration's copy of a
batch under way: a set_payload that reached old after the batch read the point (the batch's
catch-up brings its copy up to date, later) was then lost for good, the write putting the
stale copy's payload back and the batch retiring the point from old.

Each run puts one migration batch (paired or --keep-old) under a script: every point of the
batch is a victim whose user gets ``set_payload({"in_stock": "no"})`` before store call ``j``
of the batch and a write that keeps the payload (``upsert_vectors`` or ``upsert`` with
``payloads=None``; ``upsert_vectors`` with ``[None]`` and its other vector given) before call
``k``, for every (j, k) (196 victims; a batch makes 12 to 13 store calls). After
the run and one more ``migrate``, every victim must serve what its user wrote: the payload
with ``in_stock``, the user's vectors, its other vector, once, from new (and, --keep-old,
from old after a rollback).
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import rollback
from rm_qdrant.store.vectors import OtherVector
from tests.conftest import NEW_DIM, OLD_DIM, make_image_folder
from tests.faults import Scripted, Step

pytestmark = pytest.mark.slow

TEXT = 3
#: Store calls of one batch that a user's operation goes before (past the end: after the run).
MOMENTS = 13
STALE = {"in_stock": "no"}  # not False: the embedded store cannot filter on booleans


class Moments:
    """The real store; from the batch's first read of old (the claim), the ``n``-th store call
    is preceded by the user operations scheduled at ``n``."""

    def __init__(self, inner, schedule: dict[int, list]) -> None:
        self._inner, self._schedule, self.calls = inner, schedule, []

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            claim = name == "retrieve" and args[0] == "old" and "others" in kwargs
            if self.calls or claim:
                for act in self._schedule.pop(len(self.calls), []):
                    act()
                self.calls.append(f"{name}({args[0] if args else ''})")
            return attr(*args, **kwargs)

        return call

    def rest(self) -> None:
        """The operations whose moment never came (the batch made fewer calls): after the run."""
        for moment in sorted(self._schedule):
            for act in self._schedule.pop(moment):
                act()


def make(store, models, tmp_path, keep_old: bool):
    """A gallery with the old model's vector ``image`` and a vector rm-qdrant does not manage,
    ``text``, one point per (j, k)."""
    per_class = -(-((MOMENTS + 1) ** 2) // 3)
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=per_class))
    store.create_collection(
        "old", dim=OLD_DIM, distance="cosine", vector="image", others=[OtherVector("text", TEXT, "dot")]
    )
    index_images(store, "old", OnnxEncoder(models.old), items, vector="image")
    ids = [i.point_id for i in items]
    text = np.random.default_rng(4).normal(size=(len(ids), TEXT)).astype(np.float32)
    store.set_vectors("old", ids, text, vector="text")
    encoders = {"encoder": OnnxEncoder(models.rm), "old_encoder": OnnxEncoder(models.old)}
    create_pair(store, "p", old_collection="old", old_vector="image", keep_old=keep_old, **encoders)
    return items, dict(zip(ids, text, strict=True))


class Victims:
    """The user's operations on each victim and what each victim must serve afterwards."""

    def __init__(self, store, models, items, text, keep_old: bool, kind: str) -> None:
        self.user = DualIndex.open(store, "p")
        self.keep_old, self.kind = keep_old, kind
        rng = np.random.default_rng(8)
        self.ids = [i.point_id for i in items[: (MOMENTS + 1) ** 2]]
        self.new = rng.normal(size=(len(items), NEW_DIM)).astype(np.float32)
        self.old = rng.normal(size=(len(items), OLD_DIM)).astype(np.float32)
        self.text = text
        self.given = rng.normal(size=(len(items), TEXT)).astype(np.float32)
        self.payload = {r.id: r.payload for r in DualIndex.open(store, "p").retrieve(self.ids)}
        self.image = np.random.default_rng(9).integers(0, 255, size=(8, 8, 3), dtype=np.uint8)
        if kind == "upsert":  # every victim gets the same new photo
            self.new[:] = OnnxEncoder(models.rm).encode([self.image])["new"][0]
            self.old[:] = OnnxEncoder(models.old).encode([self.image])["embedding"][0]

    def keep(self, n: int) -> None:
        """The write that keeps the payload, of victim ``n``."""
        point = [self.ids[n]]
        if self.kind == "upsert":
            self.user.upsert(point, [self.image], None)
            return
        old = {"old_vectors": self.old[n : n + 1]} if self.keep_old else {}
        given = (
            {"other_vectors": [{"text": self.given[n]}]} if self.kind == "upsert_vectors, text given" else {}
        )
        payloads = [None] if given else None  # a None entry keeps it as payloads=None does
        self.user.upsert_vectors(point, self.new[n : n + 1], payloads, **old, **given)

    def schedule(self) -> tuple[dict[int, list], dict[int, tuple[int, int]]]:
        """Moment -> operations, and victim -> its (j, k)."""
        plan, at = {}, {}
        moments = itertools.product(range(MOMENTS + 1), repeat=2)
        for n, (j, k) in enumerate(moments):
            at[n] = (j, k)
            set_payload = lambda n=n: self.user.set_payload(STALE, [self.ids[n]])  # noqa: E731
            keep = lambda n=n: self.keep(n)  # noqa: E731
            first, second = ((j, set_payload), (k, keep)) if j <= k else ((k, keep), (j, set_payload))
            plan.setdefault(first[0], []).append(first[1])
            plan.setdefault(second[0], []).append(second[1])
        return plan, at

    def wrong(self, store, at: dict[int, tuple[int, int]], side: str) -> list[str]:
        """What each victim serves that its user did not write, as ``(j, k): what``."""
        index = DualIndex.open(store, "p", exact=True)
        served = {p.id: p for p in index.retrieve(self.ids, with_vectors=True)}
        pair = index.pair
        collection = pair.new_collection if side == "new" else pair.old_collection
        stored = {r.id: r for r in store.retrieve(collection, self.ids, others=["text"])}
        text = self.given if self.kind == "upsert_vectors, text given" else None
        wrong = []
        for n, moments in at.items():
            point, want = self.ids[n], {**self.payload[self.ids[n]], **STALE}
            got = served.get(point)
            if got is None or got.payload != want or got.source != side:
                wrong.append(f"{moments}: {None if got is None else (got.payload, got.source)}")
                continue
            vector = (self.new if side == "new" else self.old)[n]
            if not np.allclose(_unit(got.vector), _unit(vector), atol=1e-5):
                wrong.append(f"{moments}: not the user's vector")
            expected_text = self.text[point] if text is None else text[n]
            if not np.allclose(stored[point].others.get("text", np.zeros(TEXT)), expected_text, atol=1e-5):
                wrong.append(f"{moments}: other vector {stored[point].others.get('text')}")
        hits = index.search_vectors(self.new[0], self.old[0], limit=3 * len(self.ids), filter=STALE)
        if sorted(map(str, (h.id for h in hits))) != sorted(map(str, self.ids)):
            wrong.append(f"search with in_stock: {len(hits)} hits for {len(self.ids)} points")
        if index.count(STALE) != len(self.ids):
            wrong.append(f"count with in_stock: {index.count(STALE)}")
        return wrong


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("kind", ["upsert_vectors", "upsert_vectors, text given", "upsert"])
@pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])
def test_keeping_the_payload_and_set_payload_around_every_store_call_of_a_batch(
    store, models, tmp_path, keep_old, kind
):
    items, text = make(store, models, tmp_path, keep_old)
    victims = Victims(store, models, items, text, keep_old, kind)
    plan, at = victims.schedule()
    scripted = Moments(store, plan)
    run_migration(DualIndex.open(scripted, "p", exact=True), MigrateOptions(batch=len(items)))
    scripted.rest()
    run_migration(DualIndex.open(store, "p", exact=True), MigrateOptions(batch=len(items)))
    wrong = victims.wrong(store, at, "new")
    assert not wrong, f"{len(wrong)} wrong after the batch's calls {scripted.calls}: {wrong[:12]}"
    if keep_old:  # the rollback serves what the user wrote, by the old model
        rollback(store, DualIndex.open(store, "p").pair)
        wrong = victims.wrong(store, at, "old")
        assert not wrong, f"{len(wrong)} wrong after a rollback: {wrong[:12]}"


def _copies(name, args, kwargs):
    return name == "upsert" and kwargs.get("insert_only")


def _reads_a_half(name, args, kwargs):
    return name == "retrieve" and args[0] in ("old", "p-new")


@pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])
def test_a_batch_that_settles_between_a_writes_two_reads_loses_no_update(store, models, tmp_path, keep_old):
    """The batch copies a point from old before a set_payload reached old; a write that keeps
    the payload reads the point, and before it reads the other half the batch brings its copy
    up to date and retires the point. Whichever half the write read first, it must write the
    update (read new first, it held the stale copy and old was gone)."""
    items, _ = make(store, models, tmp_path, keep_old)
    victim, user = items[0].point_id, DualIndex.open(store, "p")
    paused, resume = threading.Event(), threading.Event()
    steps: list[Step] = [
        ("before", _copies, lambda: user.set_payload(STALE, [victim])),
        ("after", _copies, lambda: (paused.set(), resume.wait(60))),
    ]
    batch = DualIndex.open(Scripted(store, steps), "p", exact=True)
    migration = threading.Thread(target=run_migration, args=(batch, MigrateOptions(batch=len(items))))
    migration.start()
    assert paused.wait(60)
    writer = DualIndex.open(
        Scripted(store, [("after", _reads_a_half, lambda: (resume.set(), migration.join(60)))]), "p"
    )
    vector = np.random.default_rng(3).normal(size=(1, NEW_DIM)).astype(np.float32)
    old = {"old_vectors": np.ones((1, OLD_DIM), np.float32)} if keep_old else {}
    writer.upsert_vectors([victim], vector, None, **old)
    assert not migration.is_alive()
    found = DualIndex.open(store, "p").retrieve([victim])
    assert [(p.payload["in_stock"], p.source) for p in found] == [("no", "new")]
    assert DualIndex.open(store, "p").count(STALE) == 1
