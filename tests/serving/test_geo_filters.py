"""Geo, text-any and true/false conditions of a ``models.Filter`` through DualIndex, on both
stores and both layouts, against the same predicate in Python (points well inside or outside, so the
reference needs no exact geodesy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from qdrant_client import models

from rm_qdrant import ConfigError, DualIndex, create_pair
from tests.conftest import OLD_DIM
from tests.serving.test_dual import linear_rm_with_dims, unit

pytestmark = pytest.mark.slow

N = 80
GRID = np.random.default_rng(4).uniform(-10, 10, size=(N, 2))  # lon, lat in degrees


def payload(i: int) -> dict:
    body = {
        "caption": ["red shoe", "blue bag", "green hat", "red hat"][i % 4],
        "in_stock": i % 3 == 0,
        "n": i % 2,
    }
    if i % 9:  # some points have no location
        body["where"] = {"lon": float(GRID[i, 0]), "lat": float(GRID[i, 1])}
    return body


def km(a, b) -> float:
    """Great-circle distance on a sphere of Qdrant's earth radius."""
    (lon1, lat1), (lon2, lat2) = np.radians(a), np.radians(b)
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6371.0088 * math.asin(math.sqrt(h))


def where(i):
    return tuple(payload(i)["where"].values()) if "where" in payload(i) else None


def in_square(p, lo, hi):
    return p is not None and lo < p[0] < hi and lo < p[1] < hi


def square(lo, hi):
    corners = [(lo, lo), (hi, lo), (hi, hi), (lo, hi), (lo, lo)]
    return models.GeoLineString(points=[models.GeoPoint(lon=x, lat=y) for x, y in corners])


#: (condition, the predicate in Python); the margins keep every point clearly in or out
CASES = [
    (
        models.FieldCondition(
            key="where",
            geo_bounding_box=models.GeoBoundingBox(
                top_left=models.GeoPoint(lon=-5, lat=5), bottom_right=models.GeoPoint(lon=5, lat=-5)
            ),
        ),
        lambda i: in_square(where(i), -5, 5),
    ),
    (
        models.FieldCondition(
            key="where", geo_radius=models.GeoRadius(center=models.GeoPoint(lon=2, lat=1), radius=600_000)
        ),
        lambda i: where(i) is not None and km(where(i), (2, 1)) < 600,
    ),
    (
        models.FieldCondition(
            key="where", geo_polygon=models.GeoPolygon(exterior=square(-8, 8), interiors=[square(-3, 3)])
        ),
        lambda i: in_square(where(i), -8, 8) and not in_square(where(i), -3, 3),
    ),
    (
        models.FieldCondition(key="caption", match=models.MatchTextAny(text_any="bag hat")),
        lambda i: "bag" in payload(i)["caption"] or "hat" in payload(i)["caption"],
    ),
]


def clear(i, case) -> bool:
    """Not on a boundary within the margin (0.3 degrees, 30 km) of any case's shape."""
    p = where(i)
    if p is None or case == 3:
        return True
    edges = {0: (5,), 2: (8, 3)}.get(case, ())
    if case == 1:
        return abs(km(p, (2, 1)) - 600) > 30
    return all(abs(abs(c) - e) > 0.3 for c in p for e in edges)


@pytest.fixture(params=["paired", "single-collection"])
def index(request, store, models):
    store.create_collection("places", dim=OLD_DIM, distance="cosine")
    gallery = unit(N, OLD_DIM, 1)
    store.upsert("places", list(range(N)), gallery, [payload(i) for i in range(N)])
    store.create_index("places", "caption", "text")
    options = {"layout": "single-collection", "new_vector": "new"} if request.param != "paired" else {}
    create_pair(store, "p", old_collection="places", encoder=linear_rm_with_dims(models, OLD_DIM), **options)
    index = DualIndex.open(store, "p", exact=True)
    moved = list(range(0, N, 2))
    index.upsert_vectors(moved, gallery[moved], [payload(i) for i in moved])
    return index, gallery


@pytest.mark.parametrize("case", range(len(CASES)))
def test_a_geo_or_text_condition_gives_the_points_inside_it(index, case):
    index, gallery = index
    condition, keep = CASES[case]
    q = unit(1, OLD_DIM, 3)[0]
    hits = index.search_vectors(q, q, limit=N, filter=models.Filter(must=[condition]))
    got = {h.id for h in hits}
    want = {i for i in range(N) if keep(i)}
    assert want, "the case selects nothing"
    assert {i for i in got ^ want if clear(i, case)} == set()
    ranked = sorted(got, key=lambda i: -float(gallery[i] @ q))
    assert [h.id for h in hits] == ranked


@pytest.mark.parametrize(
    "condition",
    [
        models.FieldCondition(
            key="where", geo_radius=models.GeoRadius(center=models.GeoPoint(lon=500, lat=2), radius=5)
        ),
        models.FieldCondition(
            key="where",
            geo_bounding_box=models.GeoBoundingBox(
                top_left=models.GeoPoint(lon=-5, lat=95), bottom_right=models.GeoPoint(lon=5, lat=-5)
            ),
        ),
        models.FieldCondition(key="where", geo_polygon=models.GeoPolygon(exterior=square(-8, 200))),
    ],
)
def test_a_geo_point_out_of_range_is_one_line_on_both_stores(index, condition):
    index, _ = index
    q = unit(1, OLD_DIM, 3)[0]
    nested = models.Filter(should=[models.Filter(must=[condition])])
    with pytest.raises(ConfigError, match=r"filter on 'where': a geo point needs lon within \[-180, 180\]"):
        index.search_vectors(q, q, limit=3, filter=nested)
    with pytest.raises(ConfigError, match="a geo point needs"):
        index.count(nested)


@pytest.mark.parametrize("form", ["models.Filter", "dict"])
@pytest.mark.parametrize("value", [True, False])
def test_a_true_false_match_is_right_or_one_line(index, value, form):
    """qdrant-edge 0.9's binding reads True / False as 1 / 0: such a match found no boolean
    payload (and the points whose integer field is 1 instead). Its store refuses it in one line,
    in each filter form; qdrant-client's finds the points."""
    index, _ = index
    nested = (
        models.Filter(must=[models.FieldCondition(key="in_stock", match=models.MatchValue(value=value))])
        if form == "models.Filter"
        else {"in_stock": value}
    )
    q = unit(1, OLD_DIM, 3)[0]
    if type(index.store).__name__ == "EdgeStore":
        for run in (lambda: index.search_vectors(q, q, limit=N, filter=nested), lambda: index.count(nested)):
            with pytest.raises(ConfigError, match="filter on 'in_stock': the embedded store .* true/false"):
                run()
        return
    want = {i for i in range(N) if payload(i)["in_stock"] == value}
    assert {h.id for h in index.search_vectors(q, q, limit=N, filter=nested)} == want
    assert index.count(nested) == len(want)
