"""store/bounds.py: what a payload, a filter's JSON and a search may be, at the edges of each bound."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from enum import Enum, IntEnum

import numpy as np
import pytest

from rm_qdrant.errors import InvalidFilter, InvalidPayload
from rm_qdrant.store.bounds import (
    MAX_HITS,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    STORE_MAX_DEPTH,
    check_hits,
    check_json_depth,
    check_key_path,
    check_payload,
    check_stored,
)


def nested(levels: int, leaf: object = 1) -> dict:
    value = leaf
    for _ in range(levels - 1):
        value = {"a": value}
    return {"a": value}


def test_a_plain_payload_is_returned_as_it_is():
    payload = {"uri": "s3://b/k.jpg", "n": 3, "tags": ["a"], "meta": {"x": None, "ok": True, "f": 0.5}}
    assert check_payload(payload) is payload


def test_numpy_scalars_enums_and_tuples_become_json_values():
    class Size(IntEnum):
        BIG = 2

    class Colour(str, Enum):
        RED = "red"

    given = {"f": np.float32(0.5), "i": np.int8(-1), "u": np.uint64(2**64 - 1), "b": np.bool_(False)}
    given |= {"t": (1, (2,)), "e": Size.BIG, "c": Colour.RED, "s": np.str_("x")}
    checked = check_payload(given)
    assert checked == {
        "f": 0.5,
        "i": -1,
        "u": 2**64 - 1,
        "b": False,
        "t": [1, [2]],
        "e": 2,
        "c": "red",
        "s": "x",
    }
    assert [type(v) for v in checked.values()] == [float, int, int, bool, list, int, str, str]
    json.dumps(checked, allow_nan=False)  # what a server would be sent


def test_the_depth_bound_is_exact():
    check_payload(nested(MAX_PAYLOAD_DEPTH))
    check_payload({"l": [[[]]]} | nested(MAX_PAYLOAD_DEPTH - 1))
    with pytest.raises(
        InvalidPayload, match=f"at a.a.a.*: nested deeper than the {MAX_PAYLOAD_DEPTH} levels"
    ):
        check_payload(nested(MAX_PAYLOAD_DEPTH + 1))
    check_stored(nested(STORE_MAX_DEPTH))
    with pytest.raises(InvalidPayload, match=f"{STORE_MAX_DEPTH} levels"):
        check_stored(nested(STORE_MAX_DEPTH + 1))
    with pytest.raises(InvalidPayload, match="64 levels"):
        check_payload(nested(100_000))  # no RecursionError: the walk stops at the bound


def test_the_size_bound_is_the_compact_json_text():
    fits = {"x": "a" * (MAX_PAYLOAD_BYTES - len('{"x":""}'))}
    assert len(json.dumps(fits, separators=(",", ":"))) == MAX_PAYLOAD_BYTES
    check_payload(fits)
    with pytest.raises(InvalidPayload, match="16,777,217 bytes of JSON, over the 16,777,216"):
        check_payload({"x": fits["x"] + "a"})
    check_stored({"x": fits["x"] * 2})  # a store copies a stored payload of any size


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"x": float("nan")}, "at x: nan is not a number JSON holds"),
        ({"x": [1, float("-inf")]}, r"at x\[1\]: -inf"),
        ({"x": np.float64("nan")}, "nan"),
        ({"x": 2**64}, "outside the 64-bit integers"),
        ({"x": -(2**63) - 1}, "outside the 64-bit integers"),
        ({3: 1}, "a field name is a string, not int"),
        ({"m": {None: 1}}, "at m: a field name is a string, not NoneType"),
        ({"x": datetime.date(2025, 1, 1)}, "isoformat"),
        ({"x": {1}}, "give a list"),
        ({"x": b"a"}, "bytes"),
        ({"x": Decimal("1.5")}, "Decimal"),
        ({"x": np.zeros(2)}, "tolist"),
        ({"x": object()}, "object is not a JSON value"),
        ({"x": "\ud800"}, "not UTF-8"),
        ({"\ud800": 1}, "not UTF-8"),
        ([("a", 1)], "a mapping"),
    ],
)
def test_what_no_store_holds_is_one_line_naming_where(payload, words):
    with pytest.raises(InvalidPayload, match=words) as raised:
        check_payload(payload)
    assert "\n" not in str(raised.value)


def test_a_filters_json_depth_is_checked_without_recursion():
    deep: object = {}
    for _ in range(100_000):
        deep = {"must": [deep]}
    with pytest.raises(InvalidFilter, match="too deep"):
        check_json_depth(deep, 104, "too deep")
    check_json_depth({"must": [{"must": [{}]}]}, 5, "too deep")  # 5 levels: the root is 1
    with pytest.raises(InvalidFilter):
        check_json_depth({"must": [{"must": [{}]}]}, 4, "too deep")


@pytest.mark.parametrize("key", ["n", "meta.dept", "tags[]", "a[0].b", '"sp ace".x', "-a_1", "é"])
def test_a_payload_path_a_filter_may_name(key):
    assert check_key_path(key) == key


@pytest.mark.parametrize("key", ["", "a..b", ".a", "a.", "sp ace", "a[x]", 3, None])
def test_a_path_no_store_reads_is_refused(key):
    with pytest.raises(InvalidFilter, match="not a payload path"):
        check_key_path(key)


def test_limit_and_offset_are_bounded_together():
    check_hits(MAX_HITS, 0)
    check_hits(1, MAX_HITS - 1)
    with pytest.raises(Exception, match=f"over the {MAX_HITS} hits"):
        check_hits(MAX_HITS, 1)
