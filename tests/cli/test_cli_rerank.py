"""``rmq search --rerank``, ``rmq init --rerank`` and ``rmq switch-encoder --rerank``: what a
user types and sees, and one line for each bad option."""

from __future__ import annotations

import json

import pytest

from rm_qdrant import open_store
from tests.conftest import one_error_line


def search_json(rmq, query, *args):
    return json.loads(rmq("search", "--name", "demo", query, "--limit", 8, "--exact", "--json", *args).output)


def test_search_rerank_reranks_and_says_what_each_hit_got(rmq, demo):
    rmq("migrate", "--name", "demo", "--limit", 8)
    plain = search_json(rmq, demo)
    hits = search_json(rmq, demo, "--rerank", 8)
    assert {h["rerank"] for h in plain} == {None}
    assert {h["rerank"] for h in hits} <= {"new", "embedded"}
    assert {h["rerank"] for h in hits if h["source"] == "old"} == {"embedded"}
    table = rmq("search", "--name", "demo", demo, "--limit", 8, "--exact", "--rerank", 8).output
    assert "(re-rank)" in table and "re-ranked:" in table and "embedded" in table


def test_promote_moves_the_embedded_hits_to_new_before_the_command_ends(rmq, demo, tmp_path):
    first = search_json(rmq, demo, "--rerank", 5)
    assert {h["source"] for h in first[:5]} == {"old"}
    out = rmq("search", "--name", "demo", demo, "--limit", 5, "--exact", "--rerank", 5, "--promote").output
    assert "promoted 5 points to new" in out
    status = json.loads(rmq("status", "--name", "demo", "--json").output)
    assert status["new_count"] == 5
    served = {h["id"]: h["source"] for h in search_json(rmq, demo, "--limit", 24)}
    assert len(served) == 24  # every point served once
    assert {served[h["id"]] for h in first[:5]} == {"new"}


def test_init_records_a_default_and_switch_encoder_changes_or_clears_it(rmq, models, image_folder, tmp_path):
    rmq("index", "--collection", "gallery", "--data", image_folder, "--encoder", models.old)
    out = rmq(
        "init",
        "--name",
        "demo",
        "--old-collection",
        "gallery",
        "--encoder",
        models.rm,
        "--rerank",
        6,
        "--rerank-budget",
        2,
    ).output
    assert "re-rank: first 6, deadline 0.5 s, fetch budget 2" in out
    query = sorted(image_folder.glob("a/*"))[0]
    hits = search_json(rmq, query)
    assert sorted(h["rerank"] for h in hits[:6]) == ["embedded"] * 2 + ["over budget"] * 4
    assert {h["rerank"] for h in search_json(rmq, query, "--no-rerank")} == {None}
    out = rmq("switch-encoder", "--name", "demo", "--rerank-deadline", 2).output
    assert "re-rank: first 6, deadline 2 s, fetch budget 2" in out
    rmq("switch-encoder", "--name", "demo", "--no-rerank")
    assert {h["rerank"] for h in search_json(rmq, query)} == {None}
    with open_store(tmp_path / "q") as store:
        from rm_qdrant import load_pair

        assert load_pair(store, "demo").rerank is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--rerank", 0], "--rerank"),
        (["--rerank", -1], "--rerank"),
        (["--rerank", 10_001], "10000"),
        (["--rerank", 5, "--rerank-deadline", 0], "--rerank-deadline"),
        (["--rerank", 5, "--rerank-deadline", "nan"], "--rerank-deadline"),
        (["--rerank", 5, "--rerank-budget", -1], "--rerank-budget"),
        (["--rerank-deadline", 1], "give --rerank K too"),
        (["--promote"], "give --rerank K too"),
        (["--no-rerank", "--rerank", 4], "--no-rerank"),
    ],
)
def test_bad_rerank_options_are_one_line(rmq, demo, args, says):
    result = rmq("search", "--name", "demo", demo, *args, ok=False)
    assert result.exit_code in (1, 2)
    assert says in one_error_line(result)


def test_every_source_down_answers_with_merged_distances_flagged(rmq, demo, image_folder, tmp_path):
    query = tmp_path / f"query{demo.suffix}"
    query.write_bytes(demo.read_bytes())
    plain = search_json(rmq, query)
    for path in [p for p in image_folder.rglob("*") if p.is_file()]:
        path.unlink()
    hits = search_json(rmq, query, "--rerank", 8)
    assert [h["id"] for h in hits] == [h["id"] for h in plain]
    assert {h["rerank"] for h in hits} == {"unreadable"}
    assert all(h["rerank_error"] for h in hits)


def test_searches_that_record_demand_send_their_old_hits_first(rmq, demo, image_folder):
    """rmq search --record-demand counts the hits served from old; rmq migrate --order demand
    moves the most returned first."""
    queries = sorted(image_folder.glob("a/*"))[:2]
    seen: dict = {}
    for query in [queries[0], queries[0], queries[1]]:
        for hit in search_json(rmq, query, "--limit", 3, "--record-demand"):
            seen[hit["id"]] = seen.get(hit["id"], 0) + 1
    top = max(seen.values())
    first = {i for i, n in seen.items() if n == top}
    rmq("migrate", "--name", "demo", "--order", "demand", "--limit", len(first))
    served = {h["id"]: h["source"] for h in search_json(rmq, queries[0], "--limit", 24)}
    assert {i for i, s in served.items() if s == "new"} == first


def test_switch_encoder_with_a_graph_and_rerank_records_both(rmq, demo, models):
    out = rmq("switch-encoder", "--name", "demo", "--encoder", models.rm, "--rerank", 4).output
    assert "re-rank: first 4, deadline 0.5 s, fetch budget K" in out
    hits = search_json(rmq, demo)
    assert {h["rerank"] for h in hits[:4]} <= {"new", "embedded"} and hits[4]["rerank"] is None


def test_an_unreadable_recorded_rerank_leaves_pairs_status_and_its_repair_working(rmq, demo, tmp_path):
    """A pair record whose re-rank another version wrote ({"k": "x"}): a search relying on it is one
    line naming the fix; --rerank K, --no-rerank, rmq pairs and rmq status work, and
    switch-encoder --rerank K rewrites it."""
    import dataclasses

    from rm_qdrant.pair.record import load_pair, save_pair

    with open_store(tmp_path / "q") as store:
        save_pair(store, dataclasses.replace(load_pair(store, "demo"), rerank={"k": "x"}))
    line = one_error_line(rmq("search", "--name", "demo", demo, ok=False))
    assert "cannot read" in line and "rmq switch-encoder --name demo --rerank K" in line
    assert {h["rerank"] for h in search_json(rmq, demo, "--no-rerank")} == {None}
    assert {h["rerank"] for h in search_json(rmq, demo, "--rerank", 3)[:3]} == {"embedded"}
    assert "demo" in rmq("pairs").output
    rmq("status", "--name", "demo")
    assert "re-rank: first 3" in rmq("switch-encoder", "--name", "demo", "--rerank", 3).output
    assert {h["rerank"] for h in search_json(rmq, demo)[:3]} == {"embedded"}


def test_promote_on_a_paused_pair_says_what_was_not_written(rmq, demo):
    rmq("pause", "--name", "demo")
    out = rmq("search", "--name", "demo", demo, "--limit", 3, "--rerank", 3, "--promote").output
    assert "promoted 0 points to new (0 left to the migration; 3 not written: the pair is paused" in out
    assert json.loads(rmq("status", "--name", "demo", "--json").output)["new_count"] == 0
