"""``rmq search --filter``: Qdrant's JSON filter shape besides the FIELD=VALUE form."""

from __future__ import annotations

import json

import pytest


def labels(rmq, query, *filters):
    args = [a for f in filters for a in ("--filter", f)]
    out = rmq("search", "--name", "demo", query, "--limit", "30", "--exact", "--json", *args).output
    return sorted({h["payload"]["label"] for h in json.loads(out)})


def test_a_json_filter_in_qdrants_shape(rmq, demo):
    any_of = json.dumps({"must": [{"key": "label", "match": {"any": ["a", "c"]}}]})
    assert labels(rmq, demo, any_of) == ["a", "c"]
    but_not = json.dumps({"must_not": [{"key": "label", "match": {"value": "a"}}]})
    assert labels(rmq, demo, any_of, but_not) == ["c"]
    assert labels(rmq, demo, but_not, "label=b") == ["b"]
    assert labels(rmq, demo, "label=a") == ["a"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ('{"must": [', "not valid JSON"),
        ('{"must": [{"key": "label", "match": {"nope": 1}}]}', "not a Qdrant filter"),
        ("[1, 2]", "a JSON object"),
        (
            '{"must": [{"key": "price", "range": {"gte": "cheap"}}]}',
            "not a Qdrant filter: must[0].range.gte: Input should be a valid number",
        ),
    ],
)
def test_a_bad_json_filter_is_one_line(rmq, demo, given, message):
    result = rmq("search", "--name", "demo", demo, "--filter", given, ok=False)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("given", "what"),
    [
        ("price=1.5", "a decimal number"),
        ("in_stock=true", "a true/false field"),
        ("note=null", "a null field"),
    ],
)
def test_a_plain_value_that_reads_as_a_number_bool_or_null_is_one_line_with_its_json(rmq, demo, given, what):
    """It matched only the string of that spelling: nothing, where the payload holds the value."""
    result = rmq("search", "--name", "demo", demo, "--filter", given, ok=False)
    assert result.exit_code == 1 and f"for {what}" in result.output and " give " in result.output
    assert len(result.output.strip().splitlines()) == 1
    suggested = result.output.split(" give '", 1)[1].split("', for the string", 1)[0]
    if not what.startswith(
        "a true/false field"
    ):  # the embedded store refuses true/false matches (its own line)
        assert labels(rmq, demo, suggested) == []  # the JSON it names is a filter rmq takes
    key, value = given.split("=")
    assert labels(rmq, demo, f'{key}="{value}"') == []  # quoted: the string, as before


def test_a_field_named_in_two_filters_must_hold_both(rmq, demo):
    """The dict of FIELD=VALUE terms kept the last value of a field named twice: 'label=a'
    then 'label=b' searched for b, where no point is both."""
    assert labels(rmq, demo, "label=a", "label=b") == []
    assert labels(rmq, demo, "label=a", "label=a") == ["a"]
    not_a = json.dumps({"must_not": [{"key": "label", "match": {"value": "a"}}]})
    assert labels(rmq, demo, "label=b", not_a, "label=c") == []
