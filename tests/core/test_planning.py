from __future__ import annotations

import pytest

from rm_qdrant import ConfigError
from rm_qdrant.core.planning import (
    ORIGIN,
    RANK,
    chunks,
    new_payload,
    over_failure_limit,
    parse_shard,
    points_to_move,
    settle,
)


@pytest.mark.parametrize(
    ("old", "new", "until", "limit", "expected"),
    [
        (100, 0, None, None, 100),
        (100, 0, 0.1, None, 10),
        (70, 30, 0.3, None, 0),  # already there
        (70, 30, 0.25, None, 0),  # past it: never moves back
        (70, 30, 1.0, 5, 5),
        (3, 0, 0.5, None, 2),  # rounds up: 1.5 points -> 2
        (10, 0, None, 0, 0),
    ],
)
def test_points_to_move(old, new, until, limit, expected):
    assert points_to_move(old_active=old, new=new, until=until, limit=limit) == expected


def test_until_must_be_a_fraction():
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        points_to_move(old_active=1, new=0, until=1.5, limit=None)


def test_settle_covers_every_race():
    mine = (4, {ORIGIN: "migrate", "uri": "x"})
    users = (4, {"uri": "updated"})
    outcome = settle(
        [1, 2, 3, 4, 5],
        in_new={1: mine, 2: mine, 3: users, 5: (3, {ORIGIN: "migrate"})},
        still_in_old={1, 4, 5},
        dim=4,
    )
    assert outcome.remove_from_old == [1]  # written, confirmed, still in old
    assert outcome.delete_from_new == [2]  # the user deleted it meanwhile: our copy must go
    # 3: the user updated it meanwhile (their copy in new stays, nothing to do)
    assert outcome.unconfirmed == [4, 5]  # acknowledged but missing, or the wrong size: stays in old


def test_new_payload_drops_bookkeeping_and_marks_origin():
    assert new_payload({"uri": "a.jpg", RANK: 3, "rmq_error": "x", "label": "cat"}) == {
        "uri": "a.jpg",
        "label": "cat",
        ORIGIN: "migrate",
    }


def test_small_helpers():
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "x", "1/0", "-1/2"):
        with pytest.raises(ConfigError):
            parse_shard(bad)
    assert [list(c) for c in chunks([1, 2, 3, 4, 5], 2)] == [[1, 2], [3, 4], [5]]
    assert over_failure_limit(6, 10, 0.5) and not over_failure_limit(5, 10, 0.5)
    assert not over_failure_limit(0, 0, 0.0)
