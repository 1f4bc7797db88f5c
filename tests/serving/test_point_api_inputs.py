"""The point API (DualIndex's writes, count and set_payload) with the inputs a team's code gives.

From an adversarial run: ``upsert_vectors(ids, v, payloads=None)`` ("keep the point's payload")
wiped it where a UUID came upper case, as ``uuid.UUID`` or as 32 hex digits; ``set_payload`` by
filter wrote a point left in both whose served (new) copy the filter does not match; a range
with an open end (``{"gte": 1, "lt": None}``) or a numpy or Decimal bound matched nothing (read
as dates); and a bad key path, a NaN or a set in a payload, one dict for ``payloads`` or
``delete(None)`` were tracebacks.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import numpy as np
import pytest

from rm_qdrant import ConfigError, DualIndex, StoreError
from rm_qdrant.core.planning import MOVING, new_payload
from rm_qdrant.errors import InvalidPayload
from tests.conftest import OLD_DIM
from tests.serving.test_in_both_search import N, _build

LAYOUTS = pytest.mark.parametrize("keep_old", [False, True], ids=["paired", "keep-old"])


@LAYOUTS
@pytest.mark.parametrize("form", ["upper", "uuid.UUID", "hex", "canonical"])
def test_a_write_that_keeps_the_payload_keeps_it_whatever_the_id_spelling(store, tmp_path, keep_old, form):
    ids, old, *_ = _build(store, tmp_path, "cosine", keep_old)
    pid = next(i for i in ids if isinstance(i, str) and not store.retrieve("p-new", [i]))
    store.upsert("old", [pid], old[:1], [{"label": "keep-me", "meta": {"dept": "d9"}}])
    given = {"upper": pid.upper(), "uuid.UUID": uuid.UUID(pid), "hex": uuid.UUID(pid).hex, "canonical": pid}[
        form
    ]
    index = DualIndex.open(store, "p", exact=True)
    vector = np.ones((1, OLD_DIM), np.float32)
    index.upsert_vectors([given], vector, None, **({"old_vectors": vector} if keep_old else {}))
    assert [(r.id, r.payload) for r in index.retrieve([pid])] == [
        (pid, {"label": "keep-me", "meta": {"dept": "d9"}})
    ]
    assert index.count() == N


@LAYOUTS
def test_set_payload_by_filter_writes_the_points_count_and_search_serve(store, tmp_path, keep_old):
    ids, old, new, served, both = _build(store, tmp_path, "cosine", keep_old)
    relabelled = both[0]  # in both: old's copy says n=1, the copy new serves says n=-1
    store.upsert("p-new", [relabelled], new[1:2], [new_payload({"n": -1})])
    index = DualIndex.open(store, "p", exact=True)
    match = {"n": [1, 5, 9]}
    hits = index.search_vectors(new[0], old[0], limit=2 * N, filter=match)
    assert relabelled not in {h.id for h in hits} and index.count(match) == len(hits)
    index.set_payload({"flag": 1}, match)
    flagged = [r.id for r in index.retrieve(ids) if r.payload.get("flag") == 1]
    assert sorted(map(str, flagged)) == sorted(map(str, (h.id for h in hits)))
    assert store.retrieve("old", [relabelled])[0].payload.get(MOVING) == 1  # still a point in both


@pytest.mark.parametrize(
    "bounds",
    [
        {"gte": 1, "lt": None},
        {"gte": np.int64(1)},
        {"gte": np.float32(1.0)},
        {"gte": Decimal(1)},
        {"gt": 0.5},
    ],
)
def test_a_range_with_an_open_end_or_a_numpy_bound_is_a_number_range(store, tmp_path, bounds):
    ids, *_ = _build(store, tmp_path, "cosine", False)
    index = DualIndex.open(store, "p", exact=True)
    assert index.count({"n": bounds}) == N - 1  # n = 1 .. N-1 (every point once)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda index: index.count({"meta..dept": "d1"}), "ath"),
        (
            lambda index: index.upsert_vectors([1], np.ones((1, OLD_DIM), np.float32), {"label": "a"}),
            "payloads",
        ),
        (lambda index: index.delete(None), "list of ids"),
        (lambda index: index.search_vectors([1j] * OLD_DIM, [1j] * OLD_DIM), "complex numbers"),
        (lambda index: index.search_vectors([None] * OLD_DIM, [None] * OLD_DIM), "holds None"),
        (lambda index: index.search_vectors_batch([[None] * OLD_DIM], [[None] * OLD_DIM]), "holds None"),
    ],
)
def test_bad_input_to_the_point_api_is_one_line(store, tmp_path, call, words):
    _build(store, tmp_path, "cosine", False)
    with pytest.raises(Exception, match=words) as raised:  # ConfigError, or the server's StoreError
        call(DualIndex.open(store, "p", exact=True))
    assert isinstance(raised.value, (ConfigError, StoreError)) and "\n" not in str(raised.value)


@pytest.mark.parametrize("value", [float("nan"), {1, 2}])
def test_a_payload_the_embedded_store_cannot_hold_is_one_line(tmp_path, value):
    from rm_qdrant import open_store

    store = open_store(tmp_path / "q")
    _build(store, tmp_path, "cosine", False)
    index = DualIndex.open(store, "p", exact=True)
    for write in (
        lambda: index.set_payload({"x": value}, [1]),
        lambda: index.upsert_vectors([1], np.ones((1, OLD_DIM), np.float32), [{"x": value}]),
    ):
        with pytest.raises(InvalidPayload, match="payload at x: "):  # both stores: test_hostile_inputs.py
            write()
    store.close()
