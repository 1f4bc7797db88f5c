"""Conditions joined on one field: every one holds, on both stores.

``Where & Where`` (how rm-qdrant adds its own conditions to a team's filter, and how the CLI
joins its ``--filter`` terms) kept one value a field: the second of two equalities on a field
replaced the first, and so did the second of two exclusions. A dict filter whose value no store
can match as given (a decimal number, None, a 70-bit integer) was a library's traceback.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rm_qdrant.errors import ConfigError
from rm_qdrant.store import Where

VALUES = ["a", "b", 1, ["a", "c"], [1, 2]]
POINTS = [{"f": v} for v in ["a", "b", "c", 1, 2]] + [{"f": ["a", "b"]}, {"f": [1, "b"]}, {}]


def _matches(payload: dict, value) -> bool:
    """Qdrant's equality on ``f``: the field (or an element of it) equals the value (or one of them)."""
    held = payload.get("f")
    held = held if isinstance(held, list) else [] if held is None else [held]
    wanted = value if isinstance(value, list) else [value]
    return any(h == w and type(h) is type(w) for h in held for w in wanted)


@pytest.fixture
def filled(store):
    store.create_collection("c", dim=2, distance="cosine")
    store.upsert("c", list(range(len(POINTS))), np.ones((len(POINTS), 2), np.float32), POINTS)
    return store


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), list(itertools.product(VALUES, VALUES)))
def test_two_conditions_on_one_field_both_hold(filled, first, second):
    both = Where(must={"f": first}) & Where(must={"f": second})
    neither = Where(must_not={"f": first}) & Where(must_not={"f": second})
    for where, keep in [
        (both, lambda p: _matches(p, first) and _matches(p, second)),
        (neither, lambda p: not _matches(p, first) and not _matches(p, second)),
    ]:
        expected = sorted(i for i, p in enumerate(POINTS) if keep(p))
        found, _ = filled.scroll("c", limit=100, where=where, with_payload=False)
        assert sorted(r.id for r in found) == expected


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (3.5, "give a range"),
        ([1.5, "a"], "give a range"),
        (None, "cannot be None"),
        (2**70, "outside the 64-bit integers"),
        ({1, 2.5}, "give a range"),
        (object(), "not object"),
        (["x", 1], "not both"),
        ([[1]], "not \\[1\\]"),
        ([True, False], "not True"),
    ],
)
def test_a_plain_filter_value_no_store_matches_is_one_line(filled, value, words):
    with pytest.raises(ConfigError, match=words) as refused:
        filled.count("c", {"f": value})
    assert "\n" not in str(refused.value)


def test_one_and_true_are_two_values(filled):
    """Python's 1 == True let the second condition on a field replace the first."""
    filled.upsert("c", [100, 101], np.ones((2, 2), np.float32), [{"f": True}, {"f": False}])
    for where, expected in [
        (Where(must={"f": True}) & Where(must={"f": 1}), []),
        (Where(must_not={"f": 1}) & Where(must_not={"f": True}), [0, 1, 2, 4, 5, 7, 101]),
    ]:
        if type(filled).__name__ == "EdgeStore":  # qdrant-edge cannot match true/false: one line
            with pytest.raises(ConfigError, match="true/false"):
                filled.scroll("c", limit=200, where=where)
            continue
        found, _ = filled.scroll("c", limit=200, where=where, with_payload=False)
        assert sorted(r.id for r in found) == expected
