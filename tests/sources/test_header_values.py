"""``--http-header`` values: environment variables anywhere in a value, never a secret shown."""

from __future__ import annotations

import pytest

from rm_qdrant.errors import ConfigError
from rm_qdrant.sources.settings import header_values, shown_header

ENV = {"TOKEN": "t0k", "USER": "me"}


@pytest.mark.parametrize(
    ("value", "sent", "shown"),
    [
        ("$TOKEN", "t0k", "$TOKEN"),
        ("${TOKEN}", "t0k", "${TOKEN}"),
        ("Bearer $TOKEN", "Bearer t0k", "*** $TOKEN"),
        ("Bearer ${TOKEN}", "Bearer t0k", "*** ${TOKEN}"),
        ("Token ${USER}-${TOKEN}", "Token me-t0k", "***"),
        ("Bearer plain-secret", "Bearer plain-secret", "***"),
        ("plain", "plain", "***"),
        ("pa$$word $$TOKEN", "pa$word $TOKEN", "***"),
        ("Bearer $$$TOKEN", "Bearer $t0k", "***"),
    ],
)
def test_variables_are_read_where_they_stand_and_only_they_are_shown(value, sent, shown):
    assert header_values((("Authorization", value),), ENV) == {"Authorization": sent}
    assert shown_header(("Authorization", value)) == f"Authorization: {shown}"
    assert "$" in sent or "t0k" not in shown_header(("Authorization", sent))  # a literal value is masked


@pytest.mark.parametrize("value", ["$MISSING", "Bearer ${MISSING}"])
def test_a_variable_not_set_is_one_line_naming_it(value):
    with pytest.raises(ConfigError, match=r"\$MISSING is not set"):
        header_values((("Authorization", value),), ENV)


def test_a_variable_holding_a_line_break_is_refused():
    with pytest.raises(ConfigError, match="line break"):
        header_values((("X-Key", "Bearer $BAD"),), {"BAD": "a\r\nInjected: 1"})
