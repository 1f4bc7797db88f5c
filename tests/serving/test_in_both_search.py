"""A point a migration step left in both collections serves once, as its new copy, in every search.

A step writes a batch to new, then removes it from old; a step cut short between the two (or
one under way) leaves each point of the batch in both, marked ``rmq_moving`` in old. Before,
search dropped such a point's old copy only when new's own hit list held the point: where its
copy was far from the new query and its old copy close to the old one, the point came back at
its old distance, from the model being replaced, and pushed the real last hit off the page.

Space tested against a brute-force reference (each id once: from new if it is there, else
from old): two stores x three distances x vectors far from unit norm x paired and --keep-old
x searches sent one after the other or together (a server's), with int and UUID ids, points
in both, points marked but never written to new (served from old), and every query aimed at
a point in both. Two more force the interleavings of a copy landing during the search.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, create_pair
from rm_qdrant.core.planning import MOVING, new_payload
from rm_qdrant.serving.status import pair_status
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import OLD_DIM, SPEC, says_remote
from tests.faults import Crash, Scripted, crash

N, K = 120, 5
DISTANCES = ["cosine", "dot", "euclid"]


def _ids() -> list[int | str]:
    return [i if i % 2 else str(uuid.UUID(int=i + 1)) for i in range(N)]


def _score(query: np.ndarray, vector: np.ndarray, distance: str) -> float:
    """A distance, smaller is closer, as Qdrant ranks ``distance``."""
    q, v = query.astype(np.float64), vector.astype(np.float64)
    if distance == "cosine":
        return -float(q @ v / np.linalg.norm(q) / np.linalg.norm(v))
    if distance == "dot":
        return -float(q @ v)
    return float(np.linalg.norm(q - v))


def _encoders(folder) -> tuple[OnnxEncoder, OnnxEncoder]:
    """An rm graph and an old model for any distance (stamped without one), raw scale."""
    rng = np.random.default_rng(5)
    rm = linear_encoder(
        folder / "rm.onnx",
        [("new", "pixels", rng.normal(size=(192, OLD_DIM))), ("rev", "new", np.eye(OLD_DIM))],
        input_spec=SPEC,
        name="any-distance",
        distance=None,
        scale="raw",
    )
    old = linear_encoder(
        folder / "old.onnx",
        [("embedding", "pixels", rng.normal(size=(192, OLD_DIM)))],
        input_spec=SPEC,
        name="any-distance-old",
        distance=None,
        scale="raw",
    )
    return OnnxEncoder(rm), OnnxEncoder(old)


def _build(store, folder, distance: str, keep_old: bool):
    """A pair over N raw-norm points: a quarter migrated, ten in both (their copies far from
    their old vectors), five marked moving but never written to new."""
    rng = np.random.default_rng(11)
    ids = _ids()
    old = (rng.normal(size=(N, OLD_DIM)) * rng.uniform(0.05, 20, size=(N, 1))).astype(np.float32)
    new = (rng.normal(size=(N, OLD_DIM)) * rng.uniform(0.05, 20, size=(N, 1))).astype(np.float32)
    store.create_collection("old", dim=OLD_DIM, distance=distance)
    store.upsert("old", ids, old, [{"n": i} for i in range(N)])
    rm, old_model = _encoders(folder)
    extra = {"old_encoder": old_model, "keep_old": True} if keep_old else {}
    create_pair(store, "p", old_collection="old", encoder=rm, **extra)
    index = DualIndex.open(store, "p", exact=True)
    moved = list(range(0, N, 4))
    index.upsert_vectors(
        [ids[i] for i in moved],
        new[moved],
        [{"n": i} for i in moved],
        **({"old_vectors": old[moved]} if keep_old else {}),
    )
    both, marked = list(range(1, 40, 4)), list(range(2, 22, 4))
    store.mark("old", [ids[i] for i in both + marked], {MOVING: 1})
    store.upsert("p-new", [ids[i] for i in both], new[both], [new_payload({"n": i}) for i in both])
    served = {ids[i]: ("new" if i in moved or i in both else "old", i) for i in range(N)}
    return ids, old, new, served, [ids[i] for i in both]


def _reference(served, old, new, q_new, q_old, distance: str) -> list[tuple[int | str, str]]:
    scored = [
        (_score(q_new, new[i], distance) if side == "new" else _score(q_old, old[i], distance), pid, side)
        for pid, (side, i) in served.items()
    ]
    return [(pid, side) for _, pid, side in sorted(scored)]


@pytest.mark.slow
@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "together"])
@pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])
@pytest.mark.parametrize("distance", DISTANCES)
def test_a_point_in_both_is_served_once_as_its_new_copy(
    store, tmp_path, distance, keep_old, together, monkeypatch
):
    if together:
        says_remote(store, monkeypatch)  # the two searches sent at once, as to a server
    ids, old, new, served, both = _build(store, tmp_path, distance, keep_old)
    index = DualIndex.open(store, "p", exact=True)
    assert (index._pool is not None) == together
    rng = np.random.default_rng(3)
    for pid in both:  # the old query finds the old copy at distance 0
        i = ids.index(pid)
        q_new, q_old = rng.normal(size=OLD_DIM).astype(np.float32), old[i]
        expected = _reference(served, old, new, q_new, q_old, distance)
        for limit, offset in [(K, 0), (K, 3), (N, 0)]:
            hits = index.search_vectors(q_new, q_old, limit=limit, offset=offset)
            assert [(h.id, h.source) for h in hits] == expected[offset : offset + limit]
    index.close()


@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "together"])
def test_a_copy_that_lands_during_the_search_is_served_once(store, tmp_path, together, monkeypatch):
    """The copy of a marked point lands (a) between old's search and new's, or (b, searches sent
    together) after new's search ran: either way the point comes back once, from new, where
    its copy is the closest point to the new query."""
    if together:
        says_remote(store, monkeypatch)
    ids, old, new, served, _ = _build(store, tmp_path, "euclid", False)
    index = DualIndex.open(store, "p", exact=True)
    late = ids[2]  # marked moving, not yet in new
    q_old, copy = old[2], np.full((1, OLD_DIM), 50.0, np.float32)
    q_new = copy[0] + 0.01
    search, landed = store.search, []

    def landing(name, queries, **kw):
        found = search(name, queries, **kw)
        if (name == "p-new") == together and not landed:  # after old's search, or after new's
            store.upsert("p-new", [late], copy, [new_payload({"n": 2})])  # the step's write lands
            landed.append(late)
        return found

    store.search = landing
    hits = index.search_vectors(q_new, q_old, limit=K)
    assert [h.id for h in hits].count(late) == 1
    assert (hits[0].id, hits[0].source) == (late, "new")
    index.close()


@pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])
def test_count_agrees_with_search_where_a_point_in_both_has_two_payloads(store, tmp_path, keep_old):
    """A copy made before a user's set_payload reached old, its step cut short: count counted the
    old copy where the filter matched it alone, search serves the new copy only."""
    ids, old, new, served, both = _build(store, tmp_path, "cosine", keep_old)
    stale = both[:3]
    store.upsert("p-new", stale, new[[ids.index(i) for i in stale]], [new_payload({"n": -1}) for _ in stale])
    index = DualIndex.open(store, "p", exact=True)
    for where in [{"n": ids.index(stale[0])}, {"n": -1}, {"n": [ids.index(i) for i in both]}, None]:
        hits = index.search_vectors(new[0], old[0], limit=N, filter=where)
        assert index.count(where) == len(hits) == len({h.id for h in hits}), where
    index.close()


@pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])
def test_a_user_write_cut_short_after_its_write_to_new_serves_once_from_new(store, tmp_path, keep_old):
    """DualIndex.upsert_vectors writes new, then removes (or hides) the old copy; a process
    killed between the two left an unmarked old copy: served from old at its old distance
    (under a small limit), counted twice by count() and rmq status, until the next migrate."""
    ids, old, new, served, _ = _build(store, tmp_path, "euclid", keep_old)
    rows = [i for i in range(N) if served[ids[i]][0] == "old"][:10]
    fresh = np.random.default_rng(8).normal(size=(len(rows), OLD_DIM)).astype(np.float32) * 30
    new_written = lambda name, args, _: name == "upsert" and args[0] == "p-new"  # noqa: E731
    killed = Scripted(store, [("after", new_written, crash)])
    with pytest.raises(Crash):
        DualIndex.open(killed, "p", exact=True).upsert_vectors(
            [ids[i] for i in rows], fresh, **({"old_vectors": old[rows]} if keep_old else {})
        )
    new = new.copy()
    new[rows] = fresh
    served.update({ids[i]: ("new", i) for i in rows})
    index = DualIndex.open(store, "p", exact=True)
    status = pair_status(store, index.pair)
    assert index.count() == N and status.old_count + status.new_count == N
    rng = np.random.default_rng(9)
    for i in rows:  # the old query finds the unmarked old copy at distance 0
        q_new = rng.normal(size=OLD_DIM).astype(np.float32)
        expected = _reference(served, old, new, q_new, old[i], "euclid")
        hits = index.search_vectors(q_new, old[i], limit=K)
        assert [(h.id, h.source) for h in hits] == expected[:K]
    index.close()
