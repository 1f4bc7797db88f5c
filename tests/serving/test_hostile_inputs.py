"""Hostile input to the point API is refused in one line before anything is written, the same on
both stores, and the team's collection still opens and takes writes afterwards (issue 45, 1, 8).

Before: a payload nested ~128 levels deep through ``set_payload`` reached qdrant-edge's
write-ahead log, which could not read it back: every later write failed and the collection no
longer opened (``DualIndex.open`` failed for the pair); local mode raised a raw RecursionError.
NaN, datetime, ``np.float32`` payload values were refused by one store and stored by the other;
local mode stored id 2**64, which the embedded store refused with its binding's internals.
"""

from __future__ import annotations

import asyncio
import datetime

import numpy as np
import pytest
from qdrant_client import models

from rm_qdrant import DualIndex
from rm_qdrant.errors import ConfigError, InvalidPayload, InvalidPointId, RmqError
from tests.conftest import OLD_DIM
from tests.serving.hostile import LAYOUTS, build, ids, reopen, snapshot, still_works


def deep(levels: int) -> dict:
    value: object = 1
    for _ in range(levels - 1):
        value = {"a": value}
    return {"a": value}


def nested_list(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [1, value]
    return value


P = ids()[1]  # an int id still in old only
V = np.ones((1, OLD_DIM), np.float32)
#: name -> (call on a DualIndex, the error it must raise, a word of its line)
HOSTILE = {
    "set_payload 128 deep": (lambda i: i.set_payload(deep(128), [P]), InvalidPayload, "64 levels"),
    "set_payload 65 deep": (lambda i: i.set_payload({"x": deep(64)}, [P]), InvalidPayload, "64 levels"),
    "set_payload 5000 deep": (lambda i: i.set_payload(deep(5000), [P]), InvalidPayload, "64 levels"),
    "upsert_vectors 200 deep": (lambda i: _write(i, [P], deep(200)), InvalidPayload, "64 levels"),
    "a list 200 deep": (lambda i: _write(i, [P], {"x": nested_list(200)}), InvalidPayload, "64 levels"),
    "NaN": (lambda i: _write(i, [P], {"x": float("nan")}), InvalidPayload, "nan"),
    "infinity": (lambda i: i.set_payload({"x": -float("inf")}, [P]), InvalidPayload, "inf"),
    "an int key": (lambda i: _write(i, [P], {"a": {7: 1}}), InvalidPayload, "field name"),
    "2**64": (lambda i: _write(i, [P], {"x": 2**64}), InvalidPayload, "64-bit"),
    "-2**63 - 1": (lambda i: i.set_payload({"x": [1, -(2**63) - 1]}, [P]), InvalidPayload, "64-bit"),
    "datetime": (
        lambda i: i.set_payload({"at": datetime.datetime(2025, 1, 1)}, [P]),
        InvalidPayload,
        "isoformat",
    ),
    "a set": (lambda i: _write(i, [P], {"x": {1, 2}}), InvalidPayload, "list"),
    "bytes": (lambda i: _write(i, [P], {"x": b"\x00"}), InvalidPayload, "bytes"),
    "a lone surrogate": (lambda i: i.set_payload({"\udcff": 1}, [P]), InvalidPayload, "UTF-8"),
    "17 MiB": (lambda i: _write(i, [P], {"x": "a" * (17 << 20)}), InvalidPayload, "bytes of JSON"),
    "id 2**64 upsert": (lambda i: _write(i, [2**64], {"n": 1}), InvalidPointId, "2\\*\\*64"),
    "id 2**64 set_payload": (lambda i: i.set_payload({"n": 1}, [P, 2**64]), InvalidPointId, "2\\*\\*64"),
    "id 2**64 delete": (lambda i: i.delete([P, 2**64]), InvalidPointId, "2\\*\\*64"),
    "id -1 delete": (lambda i: i.delete([P, -1]), InvalidPointId, "unsigned"),
    "a clongdouble": (lambda i: i.set_payload({"x": np.clongdouble(1 + 2j)}, [P]), InvalidPayload, "complex"),
    "a complex128": (lambda i: _write(i, [P], {"x": [np.complex128(1j)]}), InvalidPayload, "complex"),
    "a longdouble past float64": (
        lambda i: _write(i, [P], {"x": np.longdouble(10) ** 400}),
        InvalidPayload,
        "64-bit floats",
    ),
    "other vectors of an int": (
        lambda i: _write(i, [P], {"n": 1}, others={"text": 5}),
        ConfigError,
        "'text'",
    ),
    "second of two payloads": (
        lambda i: _write(i, ids()[:2], [{"n": 1}, {"x": float("nan")}]),
        InvalidPayload,
        "nan",
    ),
}


def _write(index, points, payload, others=None) -> None:
    payloads = payload if isinstance(payload, list) else [payload] * len(points)
    vectors = np.ones((len(points), OLD_DIM), np.float32)
    more = {"old_vectors": vectors} if index.layout.keeps_writes_in_old else {}
    index.upsert_vectors(points, vectors, payloads, other_vectors=others, **more)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["edge", "local"])
def test_a_payload_nested_128_deep_leaves_the_team_collection_whole(kind, layout, tmp_path):
    """The reported loss: set_payload writes old (the team's collection) first; on the embedded
    store the payload broke its write-ahead log, and after a restart DualIndex.open failed."""
    store = reopen(kind, tmp_path)
    build(store, tmp_path, layout)
    with pytest.raises(RmqError):
        DualIndex.open(store, "p", exact=True).set_payload({"x": deep(127)}, [P])
    still_works(store, kind, tmp_path).close()


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["edge", "local"])
def test_a_hostile_input_writes_nothing_and_the_collection_still_opens(kind, layout, tmp_path):
    store = reopen(kind, tmp_path)
    build(store, tmp_path, layout)
    for name, (call, error, words) in HOSTILE.items():
        index = DualIndex.open(store, "p", exact=True)
        before = snapshot(store)
        with pytest.raises(error, match=words) as raised:
            call(index)
        assert "\n" not in str(raised.value), name
        assert snapshot(store) == before, name
        store = still_works(store, kind, tmp_path)
    store.close()


@pytest.mark.parametrize("kind", ["edge", "local"])
def test_numbers_of_numpy_and_tuples_are_stored_alike_on_both_stores(kind, tmp_path):
    """np.float32 was refused by local mode and stored by the embedded store: both store it now, as
    the Python number, and read it back the same."""
    store = reopen(kind, tmp_path)
    build(store, tmp_path, "paired")
    index = DualIndex.open(store, "p", exact=True)
    given = {"f": np.float32(1.5), "i": np.int64(-3), "b": np.bool_(True), "t": (1, "x")}
    given["d"] = {"u": np.uint8(7), "top": np.uint64(2**64 - 1), "low": -(2**63)}
    given["l"] = np.longdouble(1.5)  # its .item() is a longdouble: a RecursionError before
    _write(index, [P], given)
    index.set_payload({"g": np.float64(0.25), "h": [np.longdouble(-2.5)]}, [P])
    expected = {"f": 1.5, "i": -3, "b": True, "t": [1, "x"], "d": {"u": 7, "top": 2**64 - 1, "low": -(2**63)}}
    expected.update(l=1.5, g=0.25, h=[-2.5])
    assert [p.payload for p in index.retrieve([P])] == [expected]
    assert index.count({"i": -3}) == 1
    store.close()


def test_every_refusal_is_a_library_error():
    assert all(issubclass(error, RmqError) for _, error, _ in HOSTILE.values())


@pytest.mark.parametrize("kind", ["edge", "local"])
def test_a_store_copies_a_stored_payload_up_to_its_own_bound(kind, tmp_path):
    """An application's payload stops at 64 levels; a store write (what a migration does with a
    team's stored payload, which a server may have taken deeper) stops at 100, well before the
    embedded store's log breaks (128): such a point still migrates, and the store reopens."""
    store = reopen(kind, tmp_path)
    build(store, tmp_path, "paired")
    store.upsert("p-new", [P], V, [{"x": deep(99)}])
    before = snapshot(store)
    with pytest.raises(InvalidPayload, match="100 levels"):
        store.upsert("p-new", [P], V, [{"x": deep(100)}])
    with pytest.raises(InvalidPayload, match="100 levels"):
        store.mark("old", [P], {"x": deep(100)})
    assert snapshot(store) == before
    store = still_works(store, kind, tmp_path)
    assert store.retrieve("p-new", [P])[0].payload == {"x": deep(99)}
    store.close()


@pytest.mark.parametrize("kind", ["edge", "local"])
def test_async_dual_index_refuses_the_same_before_writing(kind, tmp_path):
    from rm_qdrant import AsyncDualIndex

    store = reopen(kind, tmp_path)
    build(store, tmp_path, "keep-old")
    before = snapshot(store)

    async def main() -> list[type]:
        index = AsyncDualIndex(DualIndex.open(store, "p", exact=True))
        refused = []
        for call in (
            lambda: index.set_payload(deep(128), [P]),
            lambda: index.upsert_vectors([P], V, [{"x": float("nan")}], old_vectors=V),
            lambda: index.upsert_vectors([P], V, [{"n": 1}], old_vectors=V * np.nan),
            lambda: index.delete([2**64]),
            lambda: index.count({"n": 2**64}),
            lambda: index.search_vectors(V[0], V[0], offset=10**30),
            lambda: index.set_payload({"x": np.clongdouble(1)}, [P]),
            lambda: index.upsert_vectors([P], V, [{"x": np.longdouble(10) ** 400}], old_vectors=V),
            lambda: index.count({"n": "\udcff"}),
            lambda: index.count(models.Filter(must=[_count_below(-1)])),
            lambda: index.search_vectors(V[0], V[0], filter=models.Filter(must=[_count_below(2**64)])),
        ):
            try:
                await call()
            except RmqError as exc:
                refused.append(type(exc))
        await index.close()
        return refused

    assert len(asyncio.run(main())) == 11
    assert snapshot(store) == before
    still_works(store, kind, tmp_path).close()


def _count_below(count: int) -> models.FieldCondition:
    return models.FieldCondition(key="n", values_count=models.ValuesCount(lt=count))
