"""``rmq search --offset N --score-threshold T``: paging and a score cut on the merged hits."""

from __future__ import annotations

import json

import pytest


def hits(rmq, query, *args):
    out = rmq("search", "--name", "demo", query, "--exact", "--json", *args).output
    return json.loads(out)


def test_offset_pages_through_the_merged_hits(rmq, demo):
    every = [h["id"] for h in hits(rmq, demo, "--limit", "15")]
    assert len(every) == 15
    assert [h["id"] for h in hits(rmq, demo, "--limit", "5", "--offset", "3")] == every[3:8]
    assert [h["id"] for h in hits(rmq, demo, "--limit", "5", "--offset", "10")] == every[10:15]
    table = rmq("search", "--name", "demo", demo, "--exact", "--limit", "2", "--offset", "4").output
    assert [line.split()[0] for line in table.splitlines()[1:3]] == ["5", "6"]  # ranks go on


def test_score_threshold_keeps_the_hits_at_least_that_close(rmq, demo):
    every = hits(rmq, demo, "--limit", "24")
    cut = every[5]["score"] - 1e-6  # cosine: score >= T, as Qdrant's
    kept = hits(rmq, demo, "--limit", "24", "--score-threshold", repr(cut))
    assert [h["id"] for h in kept] == [h["id"] for h in every if h["score"] >= cut]
    assert 6 <= len(kept) < len(every)
    assert hits(rmq, demo, "--limit", "24", "--score-threshold", "2") == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--offset", "-1"], "Invalid value for '--offset'"),
        (["--offset", "two"], "Invalid value for '--offset'"),
        (["--score-threshold", "high"], "Invalid value for '--score-threshold'"),
        (["--score-threshold", "nan"], "not a finite number"),
    ],
)
def test_a_bad_value_is_one_line(rmq, demo, args, message):
    result = rmq("search", "--name", "demo", demo, *args, ok=False)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
