"""Payload paths: nested fields named by dots, wherever a payload field is named."""

from __future__ import annotations

import numpy as np
import pytest

from rm_qdrant import ConfigError
from rm_qdrant.core.ordering import order_keys, ranks
from rm_qdrant.core.paths import MAX_DEPTH, check_path, payload_value
from rm_qdrant.core.uris import UriRule
from rm_qdrant.errors import SourceError

ASSET = {"asset": {"url": "https://cdn.example.com/a/1.jpg", "sku": "A-1"}, "meta": {"dept": "shoes"}}


@pytest.mark.parametrize(
    ("payload", "path", "value"),
    [
        (ASSET, "asset.url", "https://cdn.example.com/a/1.jpg"),
        (ASSET, "meta.dept", "shoes"),
        (ASSET, "asset", ASSET["asset"]),
        ({"a": {"b": {"c": {"d": 4}}}}, "a.b.c.d", 4),
        ({"asset.url": "top", "asset": {"url": "nested"}}, "asset.url", "top"),  # exact key first
        ({"asset.url": "top"}, "asset.url", "top"),
        (ASSET, "asset.missing", None),
        (ASSET, "asset.url.more", None),  # a string on the way is not an object
        ({"asset": [{"url": "x"}]}, "asset.url", None),  # lists are not walked
        ({"asset": None}, "asset.url", None),
        ({}, "url", None),
    ],
)
def test_payload_value_walks_objects_only(payload, path, value):
    assert payload_value(payload, path) == value


def test_a_path_is_dictionary_lookups_and_nothing_else():
    class Loud(dict):
        def __getattr__(self, name):
            raise AssertionError(f"attribute {name} read")

    assert payload_value({"sku": "A-1"}, "sku.__class__") is None
    assert payload_value(Loud(a=Loud(b=1)), "a.b") == 1
    deep = "x." * MAX_DEPTH + "x"
    nested: dict = {}
    cursor = nested
    for _ in range(MAX_DEPTH):
        cursor["x"] = {}
        cursor = cursor["x"]
    cursor["x"] = 1
    assert payload_value(nested, deep) is None  # past the bound: not read


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "not a payload field"),
        ("asset..url", "not a payload field"),
        (".url", "not a payload field"),
        ("asset.", "not a payload field"),
        ("assets[0].url", "list indexes are not read"),
        ("assets[].url", "list indexes are not read"),
        (".".join(["k"] * (MAX_DEPTH + 1)), "17 keys deep"),
    ],
)
def test_bad_paths_are_refused_naming_the_option(path, message):
    with pytest.raises(ConfigError, match=message) as caught:
        check_path(path, "--uri-field")
    assert "--uri-field" in str(caught.value)
    with pytest.raises(ConfigError, match=message):
        UriRule(path)


def test_uri_field_reads_a_nested_path_and_names_a_missing_one():
    rule = UriRule("asset.url")
    assert rule.uri(1, ASSET) == "https://cdn.example.com/a/1.jpg"
    with pytest.raises(SourceError, match=r"^payload has no 'asset.url'$"):
        rule.uri(2, {"asset": {"file": "x.jpg"}})
    with pytest.raises(SourceError, match="payload has no 'uri'"):
        UriRule().uri(3, {})
    assert rule.find(2, {}) is None
    assert rule.same_image(1, ASSET, {**ASSET, "price": 3})
    assert not rule.same_image(1, ASSET, {"asset": {"url": "other"}})


def test_uri_template_reads_nested_fields():
    rule = UriRule(template="https://cdn.example.com/{meta.dept}/{asset.sku}.jpg")
    assert rule.uri(1, ASSET) == "https://cdn.example.com/shoes/A-1.jpg"
    assert UriRule(template="file://{asset.url}").uri(1, {"asset": {"url": "/g/1.jpg"}}) == "file:///g/1.jpg"
    with pytest.raises(SourceError, match=r"payload has no 'meta.dept' for the uri template"):
        rule.uri(2, {"asset": {"sku": "A-2"}})
    with pytest.raises(SourceError, match="payload 'asset' is a dict"):
        UriRule(template="s3://b/{asset}.jpg").uri(1, ASSET)
    # what looked like attribute access is a path: inert, and missing on a string
    with pytest.raises(SourceError, match=r"payload has no 'sku.__class__'"):
        UriRule(template="s3://b/{sku.__class__}.jpg").uri(1, {"sku": "A-1"})


@pytest.mark.parametrize("template", ["s3://b/{sku[0]}.jpg", "s3://b/{sku!r}.jpg", "s3://b/{a..b}.jpg"])
def test_templates_still_refuse_indexes_conversions_and_empty_keys(template):
    with pytest.raises(ConfigError, match="bad --uri-template"):
        UriRule(template=template)


def test_payload_order_and_centroid_labels_read_nested_fields():
    payloads = [{"asset": {"created_at": t}} for t in ("2025-03-01", "2024-01-01", "2025-01-01")]
    payloads.append({"asset": {}})  # no date: last
    assert ranks(order_keys("payload:asset.created_at", [1, 2, 3, 4], payloads)).tolist() == [2, 0, 1, 3]
    with pytest.raises(ConfigError, match="unknown backfill order|list indexes"):
        order_keys("payload:asset[0]", [1], [{}])
    vectors = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.6]])
    labels = [{"meta": {"dept": d}} for d in ("a", "a", "b", "a")]
    keys = order_keys("centroid", [1, 2, 3, 4], labels, vectors, label_field="meta.dept")
    assert int(np.argmin(keys)) == 3
    with pytest.raises(ConfigError, match="1 points have no 'meta.dept' payload"):
        order_keys("centroid", [1, 2], [labels[0], {"meta": {}}], vectors[:2], label_field="meta.dept")
