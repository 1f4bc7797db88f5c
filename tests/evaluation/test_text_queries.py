"""A text pair's judged queries as JSONL (``rmq eval --queries FILE.jsonl``): what a line may hold,
and the one line that names what is wrong with one that is not a query."""

from __future__ import annotations

import pytest

from rm_qdrant.errors import ConfigError
from rm_qdrant.evaluation.queries import TextQuery, parse_queries, read_queries

UUID = "0B3C7A52-1D2E-4F60-8A9B-0C1D2E3F4A5B"


def test_labels_relevant_ids_and_ids_are_read_as_the_gallery_holds_them(tmp_path):
    path = tmp_path / "q.jsonl"
    lines = [
        '\ufeff{"text": "storm at sea", "label": "weather"}',
        "",
        '{"text": "price of bread", "label": 3}',
        f'{{"text": "a fox", "relevant": [812, "{UUID}", 812], "id": 7}}',
        "   ",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")
    assert read_queries(path) == [
        TextQuery("storm at sea", label="weather"),
        TextQuery("price of bread", label="3"),  # compared as text, as payload labels are
        TextQuery("a fox", relevant=frozenset({812, UUID.lower()}), id=7),
    ]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"text": "", "label": "a"}', "the text is empty"),
        ('{"text": "  \\n ", "label": "a"}', "the text is empty"),
        ('{"text": "ok\\u0000", "label": "a"}', "control character U+0000"),
        ('{"text": "ok", "label": "a"', "not JSON"),
        ('["ok", "a"]', "expected an object"),
        ('{"label": "a"}', 'no "text"'),
        ('{"text": 5, "label": "a"}', '"text" is a string'),
        ('{"text": "ok"}', 'one of "label" and "relevant"'),
        ('{"text": "ok", "label": "a", "relevant": [1]}', 'one of "label" and "relevant"'),
        ('{"text": "ok", "label": true}', '"label" is a string or an integer'),
        ('{"text": "ok", "relevant": []}', "lists no id"),
        ('{"text": "ok", "relevant": 4}', "a list of point ids"),
        ('{"text": "ok", "relevant": [1.0]}', "no point id"),
        ('{"text": "ok", "relevant": [-1]}', "unsigned"),
        ('{"text": "ok", "relevant": ["doc-1"]}', "invalid point id"),
        ('{"text": "ok", "label": "a", "id": "x"}', '"id": invalid point id'),
        ('{"text": "ok", "lable": "a"}', "unknown key(s) 'lable'"),
    ],
)
def test_a_line_that_is_no_query_is_named_by_its_number(line, says):
    lines = ['{"text": "fine", "label": "a"}', "", line]
    with pytest.raises(ConfigError) as caught:
        parse_queries(lines, source="q.jsonl")
    message = str(caught.value)
    assert message.startswith("q.jsonl, line 3: ") and says in message, message
    assert "\n" not in message


def test_bytes_that_are_not_utf8_and_a_file_of_no_query_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"q.jsonl, line 2: not UTF-8"):
        parse_queries([b'{"text": "a", "label": "b"}', b'{"text": "\xff"}'], source="q.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds no query"):
        read_queries(empty)
    with pytest.raises(ConfigError, match="cannot read query file"):
        read_queries(tmp_path / "missing.jsonl")
