"""Writers that bypass rm-qdrant (issue 38): a team's job writes the old collection by name with
the store directly (as plain qdrant-client would: upsert with a new image, upsert of a new payload
with the same vector, delete, set_payload) between every pair of a migration's store writes, in
the three layouts, on both stores. After the next migrate and the cutover, what the pair serves
(retrieve, count, search, each point's vector) equals a brute-force reference of what the team
wrote, except the kinds of write the layout says at init it cannot see."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair, index_images, scan_image_folder
from rm_qdrant.core.planning import MIGRATED, MOVING, user_payload
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from rm_qdrant.operations.cutover import finalize
from rm_qdrant.serving.status import pair_status
from tests.conftest import make_image_folder
from tests.faults import WRITES, Scripted

LAYOUTS = {
    "paired": {},
    "keep-old": {"keep_old": True},
    "single": {"layout": "single-collection", "new_vector": "new"},
}
KINDS = ("upsert_image", "upsert_payload", "delete", "set_payload")


def _pair(store, models, tmp_path, layout):
    items = scan_image_folder(make_image_folder(tmp_path / "g", per_class=8))
    index_images(store, "old", OnnxEncoder(models.old), items)
    record = create_pair(
        store,
        "p",
        old_collection="old",
        encoder=OnnxEncoder(models.rm),
        old_encoder=OnnxEncoder(models.old),
        **LAYOUTS[layout],
    )
    return record, items


class Team:
    """The team's own writer: the store, by name, and the reference of what it wrote."""

    def __init__(self, store, record, items, models) -> None:
        self.store, self.pair, self.rng = store, record, random.Random(3)
        self.old_model = OnnxEncoder(models.old)
        self.uris = [i.uri for i in items]
        self.reference = {r.id: user_payload(r.payload) for r in store.scroll("old", limit=1000)[0]}
        self.unseen, self.log, self.either = 0, [], {}

    def write(self, kind: str, point) -> None:
        """One bypassing write of ``point``, recorded in the reference unless the layout cannot see it."""
        store, old, vector = self.store, self.pair.old_collection, self.pair.vector
        if point not in self.reference or point in self.either:
            return
        there = store.retrieve(old, [point], with_vectors=True, vector=vector)
        hidden = bool(there) and there[0].payload.get(MIGRATED) == 1
        version = len(self.reference) + self.rng.randrange(10**6)
        self.log.append((kind, point, bool(there), hidden, version))
        if kind == "upsert_image":
            uri = self.rng.choice(self.uris)
            body = {"uri": uri, "label": "re-shot", "v": version}
            store.upsert(old, [point], self.old_model.encode([uri])["embedding"], [body], vector=vector)
            self.reference[point] = body
        elif kind == "upsert_payload":
            body = {**self.reference[point], "v": version}
            image = self.old_model.encode([body["uri"]])["embedding"]
            store.upsert(old, [point], image, [body], vector=vector)
            self.reference[point] = body
        elif kind == "delete":
            paired = self.pair.layout != "single-collection" and not self.pair.keep_old
            copy = store.retrieve(self.pair.new_collection, [point]) if paired else []
            store.delete(old, [point])
            if paired and there and MOVING in there[0].payload:  # migrating: seen until the batch
                self.either[point] = [None, self.reference[point]]  # read old back, not after
            elif copy:  # paired, a rewrite in old of a migrated point: seen only if a sweep dropped
                self.either[point] = [None, user_payload(copy[0].payload)]  # the stale copy first
            elif there or self.pair.layout == "single-collection":
                del self.reference[point]
            else:
                self.unseen += 1  # paired: old kept nothing of it (init said so)
        else:
            store.set_payload(old, [(point, {"v": version})])
            before, after = self.reference[point], {**self.reference[point], "v": version}
            if self.pair.layout == "single-collection" or (
                there and not hidden and MOVING not in there[0].payload
            ):
                self.reference[point] = after
            elif there and not hidden:  # migrating: seen before the batch reads old back, not after
                self.either[point] = [before, after]
                self.reference[point] = after
            else:
                self.unseen += 1  # paired: nothing in old; keep-old: the hidden copy (init said so)


def _served_equals_reference(store, team, models) -> None:
    """What the pair serves is what the team wrote; where a write raced a batch in a way the layout
    says it cannot see (``team.either``), one of the two outcomes."""
    index = DualIndex.open(store, "p", exact=True)
    points = index.retrieve([*team.reference, 10**6], with_vectors=True)
    served = {p.id: p.payload for p in points}
    expected = {i: body for i, body in team.reference.items() if i not in team.either}
    expected.update(
        (i, served[i]) for i, options in team.either.items() if i in served and served[i] in options
    )
    assert served == expected, [e for e in team.log if served.get(e[1]) != expected.get(e[1])]
    assert not [i for i, options in team.either.items() if i not in served and None not in options]
    assert index.count() == len(served)
    encoder = OnnxEncoder(models.rm)
    for p in points:
        want = encoder.encode([served[p.id]["uri"]])["new"][0]
        np.testing.assert_allclose(
            p.vector / np.linalg.norm(p.vector), want / np.linalg.norm(want), atol=1e-5
        )
    hits = index.search(team.uris[0], limit=len(served) + 5)
    assert sorted(h.id for h in hits) == sorted(served)  # each point once


def _step(n: int, team: Team, picks: random.Random):
    """After the n-th store write of the run, one bypassing write: of a point that write names
    (in flight) every other round of the kinds, else of any point."""
    chosen = {}

    def test(name, args, kwargs):
        if name not in WRITES:
            return False
        listed = args[1] if len(args) > 1 and isinstance(args[1], list) else []
        ids = [i for i in listed if not isinstance(i, tuple) and i in team.reference]
        in_flight = ids and (n // len(KINDS)) % 2 == 0
        chosen["point"] = picks.choice(ids) if in_flight else picks.choice(sorted(team.reference))
        return True

    return ("after", test, lambda: team.write(KINDS[n % len(KINDS)], chosen["point"]))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bypassing_writes_between_every_migration_step(store, models, tmp_path, layout):
    record, items = _pair(store, models, tmp_path, layout)
    team, picks = Team(store, record, items, models), random.Random(1)
    run_migration(DualIndex.open(store, "p"), MigrateOptions(until=0.3, batch=4))
    scripted = Scripted(store, [_step(n, team, picks) for n in range(60)])
    run_migration(DualIndex.open(scripted, "p"), MigrateOptions(batch=4))
    assert scripted.pending < 60 - 6  # the run wrote, and the team after each write
    run_migration(DualIndex.open(store, "p"), MigrateOptions(batch=4))  # the next run repairs
    assert pair_status(store, DualIndex.open(store, "p").pair).old_count == 0
    _served_equals_reference(store, team, models)
    finalize(store, DualIndex.open(store, "p").pair)
    _served_equals_reference(store, team, models)


def _migrated(store, count):
    return [r.id for r in store.scroll("p-new", limit=100)[0]][:count]


@pytest.mark.parametrize("layout", ["paired", "keep-old"])
def test_a_rewrite_of_migrated_points_serves_from_old_at_once(store, models, tmp_path, layout):
    """Issue 38, problem 2: the team's job rewrites three migrated points in old (a new photo, a new
    payload): they serve from old at once, each once, and the next migrate moves them again."""
    record, items = _pair(store, models, tmp_path, layout)
    run_migration(DualIndex.open(store, "p"), MigrateOptions(until=0.5, batch=4))
    rewritten, photo = _migrated(store, 3), items[-1].uri
    body = {"uri": photo, "label": "re-shot"}
    vectors = OnnxEncoder(models.old).encode([photo] * 3)["embedding"]
    store.upsert("old", rewritten, vectors, [body] * 3)
    index = DualIndex.open(store, "p", exact=True)
    assert {(p.source, p.payload["label"]) for p in index.retrieve(rewritten)} == {("old", "re-shot")}
    assert index.count() == len(items) and index.count({"label": "re-shot"}) == 3
    for query in (photo, *[i.uri for i in items if i.point_id in rewritten]):
        hits = index.search(query, limit=len(items) + 3)
        assert sorted(h.id for h in hits) == sorted(i.point_id for i in items)  # each point once
        assert {(h.source, h.payload["label"]) for h in hits if h.id in rewritten} == {("old", "re-shot")}
    status = pair_status(store, index.pair)
    assert (status.stale_copies, status.old_count + status.new_count) == (3, len(items))
    report = run_migration(index, MigrateOptions(batch=4))
    assert (report.stale_dropped, report.remigrated, report.writer_deleted) == (3, 3, 0)
    assert {(p.source, p.payload["label"]) for p in index.retrieve(rewritten)} == {("new", "re-shot")}
    assert pair_status(store, index.pair).stale_copies == 0


def test_a_delete_of_migrated_points_goes_from_new_too_with_keep_old(store, models, tmp_path):
    """Issue 38, problem 1, with --keep-old: the job deletes migrated points from old; the next
    migrate (or finalize) deletes them from new."""
    record, items = _pair(store, models, tmp_path, "keep-old")
    run_migration(DualIndex.open(store, "p"), MigrateOptions(until=0.5, batch=4))
    gone = _migrated(store, 3)
    store.delete("old", gone)
    index = DualIndex.open(store, "p", exact=True)
    report = run_migration(index, MigrateOptions(batch=4))
    assert report.writer_deleted == 3 and not index.retrieve(gone)
    store.delete("old", _migrated(store, 1))  # after the last run: finalize deletes it
    finalize(store, index.pair)
    index.refresh()
    assert index.count() == len(items) - 4


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_init_says_what_a_layout_cannot_see(store, models, tmp_path, layout, caplog):
    with caplog.at_level("WARNING"):
        _pair(store, models, tmp_path, layout)
    said = [r.getMessage() for r in caplog.records if "not seen" in r.getMessage()]
    if layout == "single":
        assert not said
    else:
        assert len(said) == 1 and "single-collection" in said[0]
        assert ("--keep-old" in said[0]) == (layout == "paired")


def test_migrate_summary_explains_bypassing_writes_and_points_left_in_old():
    from rm_qdrant.cli.migrate import _summary
    from rm_qdrant.pair.outcome import MigrationReport

    text = _summary(
        MigrationReport(stale_dropped=5, remigrated=4, writer_deleted=3, unconfirmed=2, rewritten=1), "p"
    )
    assert "5 migrated points rewritten in old" in text and "4 migrated again" in text
    assert "3 migrated points deleted from old" in text and "2 points stay in old" in text


def test_status_says_what_bypassing_writers_left_for_the_next_run():
    from types import SimpleNamespace

    from rm_qdrant.cli.status import _bypass_lines

    assert _bypass_lines(SimpleNamespace(stale_copies=0)) == []
    (line,) = _bypass_lines(SimpleNamespace(stale_copies=3))
    assert "3 migrated points rewritten in old" in line and "next rmq migrate" in line
