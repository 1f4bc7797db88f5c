"""One voice for advice (issue 38, item 3): ``switch-encoder`` says what it does to a calibration,
``status`` warns when one half is crowded out of the merged top k, and a refused ``calibrate``
names the map the guard would take.

The pairs are :mod:`tests.store.test_eval_probe_ends`'s (a naive pair and an rm pair over the
same small gallery), and a crowded dot-product pair built below.
"""

from __future__ import annotations

import json
from pathlib import Path

from rm_qdrant.backfill.pair import load_pair
from rm_qdrant.store import open_store
from tests.store import test_eval_probe_ends as ends

pairs = ends.pairs  # the fixture: pairs 'rm' and 'naive', the images, the plain new model


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
