"""``rmq fit`` without labels: the guard keeps the naive merge and says why; every label-free
candidate's holdout evidence and the winner are printed, in --json, and in the graph's metadata."""

from __future__ import annotations

import json
import re

import onnx
import pytest

from tests.e2e.test_fit import FIT, team  # noqa: F401
from tests.e2e.test_team_upgrade import deployment, web  # noqa: F401

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

REFUSAL = re.compile(
    r"at t = ([\d.]+) the fitted graph's hits score ([\d.]+) by the new model's ranks \(1 - log\(1 \+ "
    r"rank\) / log n, held-out queries against the whole sample\), below the naive merge's ([\d.]+) "
    r"\(tolerance ([\d.]+)"
)


def test_the_guard_keeps_the_naive_merge_and_names_t_and_the_two_numbers(team):  # noqa: F811
    rmq, tmp, _ = team
    out = tmp / "bad.onnx"
    # One tiny step leaves ψ at its random start: it scatters what the old model finds at t = 0.
    bad = ["--backbone", tmp / "new.onnx", "--out", out, "--loss", "rqt", "--steps", "1", "--lr", "1e-9"]
    result = rmq(*FIT, *bad, ok=False)
    errors = [line for line in result.output.splitlines() if "not written" in line]
    assert result.exit_code == 3 and len(errors) == 1, result.output
    found = REFUSAL.search(errors[0])
    assert found, errors[0]
    fitted, naive, tolerance = (float(found.group(i)) for i in (2, 3, 4))
    assert fitted < naive - tolerance
    assert "naive merge is kept" in errors[0] and not out.exists()


def test_label_free_fit_names_its_candidates_and_winner_in_json_and_graph_metadata(team, monkeypatch):  # noqa: F811
    # Few steps, and a holdout the 10 training pairs can spare, so that every candidate is tried.
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 10)
    monkeypatch.setattr("rm_qdrant_train.label_free.K", 1)
    monkeypatch.setattr("rm_qdrant_train.label_free.HOLDOUT", 0.3)
    rmq, tmp, _ = team
    out = tmp / "lf.onnx"
    args = [*FIT, "--backbone", tmp / "new.onnx", "--out", out, "--force"]
    report = json.loads(rmq(*args, "--json").output)
    recipes = [c["recipe"] for c in report["candidates"]]
    assert recipes[0] == "procrustes" and len(recipes) == 5 and recipes[1].startswith("clusters ")
    assert report["winner"] in recipes and report["why"]
    assert report["recipe"] == f"label-free/{report['winner']}"
    assert report["decided_by"] == "guard" and len(report["guard"]["fitted"]) == len(report["guard"]["naive"])
    for c in report["candidates"]:
        guard = c["guard"]
        assert set(guard) >= {"fitted", "naive", "min_margin", "min_margin_t", "worst_t", "passed"}
        low = guard["fractions"].index(guard["min_margin_t"])
        assert abs(guard["fitted"][low] - guard["naive"][low] - guard["min_margin"]) < 1e-9
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["rm_qdrant_fit"])["recipe"] == report["recipe"]

    text = rmq(*args).output
    for recipe in recipes:
        assert re.search(
            rf"^  {recipe}: t=0 [\d.]+ \(old [\d.]+\), min fitted-naive [-+][\d.]+ at t=", text, re.M
        )
    assert f"won: {report['winner']}: " in text
