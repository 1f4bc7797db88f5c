"""What a Qdrant server refuses is refused on both stores, in one line that names the real fault
(issue 45, item 8).

Before: ``DualIndex.delete(models.Filter(...))`` said "invalid point id ('should', None)"; an id
or filter value past 64 bits was refused with the embedded store's binding's four lines (once
"a filter the embedded store cannot read" where no filter was given) and stored or matched
nothing on local mode; a ``FieldCondition`` with no condition, a NaN range bound and
``MinShould([], 3)`` matched nothing; a filter nested 200 levels was a RecursionError on local
mode; ``rmq search --filter price=99999999999999999999999`` matched the string of those digits;
``--offset 10**30`` was a 55-line OverflowError; a ``--filter`` JSON nested thousands of levels a
RecursionError; ``rmq migrate --dry-run --workers 2 --shard 0/2`` planned a run that refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
from qdrant_client import models

from rm_qdrant.errors import ConfigError, InvalidFilter, InvalidPointId
from rm_qdrant.store import Where
from rm_qdrant.store.bounds import MAX_FILTER_DEPTH
from tests.conftest import OLD_DIM, one_error_line
from tests.serving.hostile import LAYOUTS, N, build, ids

Q = np.ones(OLD_DIM, np.float32)


def _field(**condition) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key="n", **condition)])


def nested(levels: int) -> models.Filter:
    """A filter ``levels`` deep whose innermost condition matches n = 5 (one point)."""
    inner = _field(match=models.MatchValue(value=5))
    for _ in range(levels - 1):
        inner = models.Filter(must=[inner])
    return inner


def _is(value: int) -> models.FieldCondition:
    return models.FieldCondition(key="n", match=models.MatchValue(value=value))


def _circle(radius: float) -> models.GeoRadius:
    return models.GeoRadius(center=models.GeoPoint(lon=0.0, lat=0.0), radius=radius)


BAD_FILTERS = {
    "a FieldCondition with no condition": (
        models.Filter(must=[models.FieldCondition(key="n")]),
        "needs a condition",
    ),
    "a NaN range bound": (_field(range=models.Range(gte=float("nan"))), "NaN"),
    "MinShould([], 3)": (models.Filter(min_should=models.MinShould(conditions=[], min_count=3)), "3 of no"),
    "a match past 64 bits": (_field(match=models.MatchValue(value=2**64)), "64-bit"),
    "any past 64 bits": (_field(match=models.MatchAny(any=[1, -(2**63) - 1])), "64-bit"),
    "an id past 64 bits": (models.Filter(must=[models.HasIdCondition(has_id=[1, 2**64])]), "2\\*\\*64"),
    "a dict value past 64 bits": ({"n": 2**64}, "64-bit"),
    "a dict with an int key": ({1: "a"}, "field names"),
    "values_count past 64 bits": (_field(values_count=models.ValuesCount(lt=2**64)), "count from 0"),
    "a negative values_count": (_field(values_count=models.ValuesCount(gte=-1)), "count from 0"),
    "min_count past 64 bits": (
        models.Filter(min_should=models.MinShould(conditions=[_is(1), _is(2)], min_count=2**64)),
        "count from 0",
    ),
    "a lone surrogate value": ({"n": "\udcff"}, "UTF-8"),
    "a lone surrogate in a list": ({"n": ["a", "\udcff"]}, "UTF-8"),
    "a lone surrogate key": ({"\udcff": 1}, "UTF-8"),
    "a lone surrogate match": (_field(match=models.MatchAny(any=["\udcff"])), "UTF-8"),
    "a lone surrogate text": (_field(match=models.MatchText(text="a\udcff")), "UTF-8"),
    "a lone surrogate vector name": (
        models.Filter(must=[models.HasVectorCondition(has_vector="\udcff")]),
        "UTF-8",
    ),
    "a NaN geo radius": (_field(geo_radius=_circle(float("nan"))), "geo radius"),
    "a negative geo radius": (_field(geo_radius=_circle(-1.0)), "geo radius"),
    "a Where past 64 bits": (Where(must={"n": 2**64}), "64-bit"),
    "a Where of lists in a list": (Where(must={"n": [[1]]}), "a list matches"),
    "a Where of a dict": (Where(must={"n": {"a": 1}}), "not a dict"),
    "a Where's must_not a surrogate": (Where(must_not={"n": "\udcff"}), "UTF-8"),
    "a Where slice past 32 bits": (Where(slice=(0, 2**70)), "Where.slice"),
    "a Where slice of 0": (Where(slice=(0, 0)), "Where.slice"),
    "a Where clause of a string": (Where(clauses=("x",)), "models.Filter"),
    "a Where of a bad key": (Where(empty=("a..b",)), "payload path"),
    f"{MAX_FILTER_DEPTH + 1} levels": (nested(MAX_FILTER_DEPTH + 1), f"{MAX_FILTER_DEPTH} levels"),
    "200 levels": (nested(200), f"{MAX_FILTER_DEPTH} levels"),
    "a nested condition 40 deep": (
        models.Filter(must=[models.NestedCondition(nested=models.Nested(key="meta", filter=nested(40)))]),
        f"{MAX_FILTER_DEPTH} levels",
    ),
}
CALLS = {
    "count": lambda i, f: i.count(f),
    "search": lambda i, f: i.search_vectors(Q, Q, limit=3, filter=f),
    "set_payload": lambda i, f: i.set_payload({"x": 1}, f),
}


def test_a_filter_a_server_refuses_is_refused_on_both_stores(store, tmp_path):
    index = build(store, tmp_path, "paired")
    for name, (given, words) in BAD_FILTERS.items():
        for call in CALLS.values():
            with pytest.raises(InvalidFilter, match=words) as raised:
                call(index, given)
            assert "\n" not in str(raised.value), name
    assert index.count() == N and all("x" not in p.payload for p in index.retrieve(ids()))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_filter_as_deep_as_the_bound_still_works(store, tmp_path, layout):
    index = build(store, tmp_path, layout)
    deepest = nested(MAX_FILTER_DEPTH)
    assert index.count(deepest) == 1
    assert [h.payload["n"] for h in index.search_vectors(Q, Q, limit=N, filter=deepest)] == [5]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_delete_given_a_filter_says_it_takes_ids(store, tmp_path, layout):
    index = build(store, tmp_path, layout)
    for given in (
        models.Filter(should=[models.HasIdCondition(has_id=[1])]),
        models.FilterSelector(filter=nested(1)),
        {"n": 1},
    ):
        with pytest.raises(ConfigError, match="list of point ids, not a filter") as raised:
            index.delete(given)
        assert "invalid point id" not in str(raised.value)
    assert index.count() == N


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_id_past_64_bits_is_one_line_that_names_it_on_both_stores(store, tmp_path, layout):
    index = build(store, tmp_path, layout)
    vector = np.ones((1, OLD_DIM), np.float32)
    old = {"old_vectors": vector} if index.layout.keeps_writes_in_old else {}
    for call in (
        lambda: index.upsert_vectors([2**64], vector, [{"n": 1}], **old),
        lambda: index.retrieve([2**64]),
        lambda: index.delete([2**64]),
        lambda: index.set_payload({"x": 1}, [2**64]),
    ):
        with pytest.raises(
            InvalidPointId, match="invalid point id 18446744073709551616: ids are unsigned 64-bit"
        ) as raised:
            call()
        assert "\n" not in str(raised.value) and "filter" not in str(raised.value)
    assert index.count() == N  # local mode stored 2**64 before
    top = 2**64 - 1  # the largest id both stores hold
    index.upsert_vectors([top], vector, [{"n": 1}], **old)
    assert [p.id for p in index.retrieve([top])] == [top] and index.count() == N + 1


# -- the CLI ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--filter", "n=99999999999999999999999"), "outside the 64-bit integers"),
        (("--filter", "n=-9223372036854775809"), "outside the 64-bit integers"),
        (("--filter", "n=" + "9" * 5000), "5000 digits"),
        (("--offset", str(10**30)), "--offset"),
        (("--limit", str(10**30)), "--limit"),
        (("--limit", "2000000000", "--offset", "2000000000"), "limit + offset"),
        (("--filter", '{"must": [' * 5000 + "]}" * 5000), "nested deeper"),
        (("--filter", '{"must": [' * 500 + "{}" + "]}" * 500), "nested deeper"),
        (("--filter", '{"must": [{"key": "n", "match": {"value": 18446744073709551616}}]}'), "64-bit"),
        (("--filter", '{"must": [{"key": "n"}]}'), "needs a condition"),
        (("--filter", '{"must": [{"key": "n", "values_count": {"lt": -1}}]}'), "count from 0"),
        (("--filter", "n=\udcff"), "UTF-8"),  # $'n=\xff' from a shell
    ],
)
def test_a_search_the_cli_cannot_run_is_one_line(rmq, demo, args, words):
    line = one_error_line(rmq("search", "--name", "demo", demo, *args, ok=False))
    assert words in line


def test_migrate_dry_run_refuses_workers_with_a_shard_as_the_run_does(rmq, demo):
    for dry in (("--dry-run",), ()):
        line = one_error_line(
            rmq("migrate", "--name", "demo", "--workers", "2", "--shard", "0/2", *dry, ok=False)
        )
        assert "not both" in line
