"""One voice for advice (issue 38, item 3): ``switch-encoder`` says what it does to a calibration,
``status`` warns when one half is crowded out of the merged top k, and a refused ``calibrate``
names the map the guard would take.

The pairs are :mod:`tests.evaluation.test_eval_probe_ends`'s (a naive pair and an rm pair over the
same small gallery), and :mod:`tests.evaluation.test_merge_metrics`'s dot-product pair, half migrated,
whose new vectors are ten times longer: old hits never reach the merged top k.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rm_qdrant.evaluation.probe import draw_sample
from rm_qdrant.models.encoder import OnnxEncoder
from rm_qdrant.pair.record import load_pair
from rm_qdrant.store import open_store
from tests.evaluation import test_eval_probe_ends as ends
from tests.evaluation import test_merge_metrics as crowded

pytestmark = pytest.mark.slow

pairs = ends.pairs  # the fixture: pairs 'rm' and 'naive', the images, the plain new model
deployment = crowded.deployment  # naive pair 'p', raw vectors, new ten times longer, half migrated
dot_only = pytest.mark.parametrize("deployment", ["dot"], indirect=True)  # old is crowded out under dot


def _calibration(tmp_path: Path, name: str) -> dict | None:
    store = open_store(tmp_path / "q")
    try:
        return load_pair(store, name).calibration
    finally:
        store.close()


def _merge_line(rmq, name: str) -> str:
    return next(s for s in rmq("status", "--name", name).output.splitlines() if s.startswith("merge"))


def test_switch_encoder_to_an_rm_graph_says_it_drops_the_calibration(rmq, pairs, tmp_path):
    rmq("calibrate", "--name", "naive", "--sample", "24", "--k", "3", "--holdout", "0.5", "--force")
    assert "calibrated" in _merge_line(rmq, "naive")
    out = json.loads(
        rmq("switch-encoder", "--name", "naive", "--encoder", tmp_path / "graph.onnx", "--json").output
    )
    assert out["calibration"] == "dropped"
    assert _calibration(tmp_path, "naive") is None  # not left behind, to come back unannounced
    assert "plain distances" in _merge_line(rmq, "naive")


def test_switch_encoder_to_another_naive_graph_says_it_keeps_the_calibration(rmq, pairs, tmp_path):
    _, new = pairs
    rmq("calibrate", "--name", "naive", "--sample", "24", "--k", "3", "--holdout", "0.5", "--force")
    kept = _calibration(tmp_path, "naive")
    text = rmq("switch-encoder", "--name", "naive", "--encoder", new).output
    assert "calibration kept" in text
    assert _calibration(tmp_path, "naive") == kept
    assert "calibrated" in _merge_line(rmq, "naive")


@dot_only
def test_status_warns_with_the_share_when_old_is_crowded_out(deployment):
    rmq = deployment.rmq
    assert "CROWDED" not in rmq("status", "--name", "p").output  # no probe sample yet: nothing to say
    rmq("probe", "--name", "p", "--sample", "30", "--k", "3")  # its sample: the half still in old
    status = json.loads(rmq("status", "--name", "p", "--json").output)
    estimate = status["estimate"]
    assert status["fraction"] == pytest.approx(0.5) and estimate["old_share_gallery"] == pytest.approx(0.5)
    assert estimate["old_share_top_k"] < 0.05
    assert [c["side"] for c in estimate["crowded_out"]] == ["old"]
    line = next(s for s in rmq("status", "--name", "p").output.splitlines() if "CROWDED OUT" in s)
    # probe's words and probe's advice, with the shares
    assert "old hits are crowded out of the merged top 3" in line and "old holds 50% of the sample" in line
    assert "run rmq calibrate" in line
    rmq("calibrate", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3")  # quantile: kept
    after = json.loads(rmq("status", "--name", "p", "--json").output)["estimate"]
    assert after["calibrated"] and not after["crowded_out"] and after["old_share_top_k"] > 0.25


@dot_only
def test_a_refused_calibrate_reports_each_other_map_it_tried(deployment):
    rmq = deployment.rmq
    calibrate = ["calibrate", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3"]
    kept = json.loads(rmq(*calibrate, "--map", "isotonic", "--json").output)
    assert kept["kept"] and kept["alternatives"] == []  # nothing else is tried when the map is kept
    refused = rmq(*calibrate, "--map", "quantile", "--json", code=3)
    report = json.loads(refused.stdout)
    assert not report["kept"] and report["refused"].startswith("it forecasts no better than the map in use")
    # The other map, tried on the same held-out points: the same isotonic fit as the one in use.
    [isotonic] = report["alternatives"]
    assert isotonic["map"] == "isotonic" and isotonic["refused"].startswith("it forecasts no better")
    line = refused.stderr.strip().splitlines()[-1]
    assert "the quantile map is refused" in line and "keeps the map it had" in line
    assert "no map this command knows would be kept" in line and "--map isotonic: also refused" in line


@dot_only
def test_a_refused_fit_names_what_would_pass_cheapest_first(deployment, tmp_path):
    pytest.importorskip("torch")
    rmq = deployment.rmq
    out = tmp_path / "fitted.onnx"
    args = ["fit", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3", "--json"]
    args += ["--backbone", deployment.new, "--out", out, "--loss", "rqt", "--steps", "1", "--lr", "1e-9"]
    refused = rmq(*args, code=3)
    tried = [(o["option"], o["passes"]) for o in json.loads(refused.stdout)["instead"]]
    assert [o for o, _ in tried] == [
        "rmq calibrate --map quantile",
        "rmq calibrate --map isotonic",
        "rmq fit --loss procrustes",
    ]
    line = refused.stderr.strip().splitlines()[-1]
    assert "rmq calibrate --map quantile would pass" in line and not out.exists()


@dot_only
def test_the_guards_verdict_is_the_same_on_the_same_sample_and_says_when_the_sample_moved(deployment):
    rmq = deployment.rmq
    calibrate = ["calibrate", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3", "--json"]
    first = json.loads(rmq(*calibrate).output)
    again = json.loads(rmq(*calibrate, code=3).stdout)  # refused now only for the map in use
    assert again["sample_key"] == first["sample_key"] and again["guard"] == first["guard"]
    rmq("migrate", "--name", "p", "--until", "0.75")  # the sample is drawn from the points still in old
    text = rmq(*calibrate[:-1], code=3).output
    line = next(s for s in text.splitlines() if s.startswith("sample "))
    assert first["sample_key"] not in line and "from the 15 still in old" in line
    assert "judged against the map in use" in line


@dot_only
def test_a_sample_is_the_same_whatever_order_the_store_hands_the_points_back_in(
    deployment, tmp_path, monkeypatch
):
    with open_store(tmp_path / "q") as store:
        pair, encoder = load_pair(store, "p"), OnnxEncoder(deployment.new)
        as_stored = draw_sample(store, pair, encoder, 12, seed=0)
        retrieve = store.retrieve
        monkeypatch.setattr(store, "retrieve", lambda *a, **kw: retrieve(*a, **kw)[::-1])  # a server's order
        reversed_ = draw_sample(store, pair, encoder, 12, seed=0)
    assert reversed_.ids == as_stored.ids and reversed_.key == as_stored.key


@dot_only
def test_probe_names_the_map_calibrate_would_keep(deployment):
    rmq = deployment.rmq
    advice = json.loads(rmq("probe", "--name", "p", "--sample", "30", "--k", "3", "--json").output)[
        "recommendation"
    ]
    assert "run rmq calibrate --map quantile (tried on this sample: quantile kept, isotonic kept)" in advice
    # and calibrate, on its own sample, agrees
    calibrate = ["calibrate", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3", "--json"]
    assert json.loads(rmq(*calibrate, "--map", "quantile").output)["kept"]
