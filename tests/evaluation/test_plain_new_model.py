"""A pair records its plain new model (issue 28), so ``rmq eval`` and ``rmq probe`` on an rm pair
measure Old and New without ``--new-model``.

The models and galleries are :mod:`tests.evaluation.test_eval_probe_ends`'s: an rm graph whose ends are
neither Old nor New, and the naive pair of the same images, whose ends are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rm_qdrant.pair.record import META_COLLECTION, PairRecord, _key, _put, load_pair
from rm_qdrant.store import open_store
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC, one_error_line
from tests.evaluation import test_eval_probe_ends as ends

pairs = ends.pairs  # the fixture: pairs 'rm' and 'naive', the images, the plain new model
_eval = ends._eval


def _record(tmp_path: Path, name: str) -> PairRecord:
    store = open_store(tmp_path / "q")
    try:
        return load_pair(store, name)
    finally:
        store.close()


def _init_rm(rmq, tmp_path: Path, collection: str, *extra: object):
    rmq(
        "index", "--collection", collection, "--data", tmp_path / "images", "--encoder", tmp_path / "old.onnx"
    )
    args = ("init", "--name", "planned", "--old-collection", collection, "--encoder", tmp_path / "graph.onnx")
    return rmq(*args, "--old-encoder", tmp_path / "old.onnx", *extra, ok=False)


@pytest.mark.slow
def test_init_records_the_plain_new_model_and_eval_measures_old_and_new_without_it(rmq, pairs, tmp_path):
    images, new_model = pairs
    naive = _eval(rmq, "naive", images)
    done = _init_rm(rmq, tmp_path, "gallery3", "--new-model", new_model)
    assert done.exit_code == 0, done.output
    out = _eval(rmq, "planned", images)  # no --new-model: the recorded one
    assert out["gain_map"] is not None and out["gain_note"] is None
    assert (out["old_map"], out["new_map"]) == (naive["points"][0]["map"], naive["points"][-1]["map"])
    status = rmq("status", "--name", "planned").output
    line = next(s for s in status.splitlines() if s.startswith("plain new"))
    recorded = _record(tmp_path, "planned").new_model
    assert recorded is not None and recorded.name == "new" and recorded.fingerprint in line
    weights = ends._means(0.01 * np.random.default_rng(2).normal(size=(PIXELS, NEW_DIM)))  # colour only
    other = linear_encoder(
        tmp_path / "other.onnx", [("embedding", "pixels", weights)], input_spec=SPEC, name="o"
    )
    given = _eval(rmq, "planned", images, "--new-model", other)  # the command line wins for that run
    assert given["old_map"] == out["old_map"] and given["new_map"] != out["new_map"]
    Path(new_model).unlink()  # moved away: one line, naming the recorded model and the way out
    args = ("eval", "--name", "planned", "--queries", images, "--at", "0,1")
    line = one_error_line(rmq(*args, ok=False))
    assert "recorded plain new model" in line and "--new-model PATH" in line


@pytest.mark.slow
def test_a_naive_pair_switched_to_an_rm_graph_records_the_model_it_served(rmq, pairs, tmp_path):
    images, _ = pairs
    naive = _eval(rmq, "naive", images)
    switched = rmq("switch-encoder", "--name", "naive", "--encoder", tmp_path / "graph.onnx").output
    assert "plain new model" in switched and "new (" in switched  # it says what it recorded
    out = _eval(rmq, "naive", images)  # now an rm pair, and no --new-model
    assert out["gain_map"] is not None
    assert (out["old_map"], out["new_map"]) == (naive["points"][0]["map"], naive["points"][-1]["map"])
    probe = json.loads(rmq("probe", "--name", "naive", "--sample", "24", "--k", "3", "--json").output)
    assert sorted(f["mode"] for f in probe["forecasts"]) == ["naive", "rm"]


def test_a_plain_new_model_of_another_size_is_one_line_and_nothing_is_recorded(rmq, pairs, tmp_path):
    rng = np.random.default_rng(1)
    small = linear_encoder(
        tmp_path / "small.onnx",
        [("embedding", "pixels", rng.normal(size=(PIXELS, OLD_DIM)))],
        input_spec=SPEC,
        name="small",
    )
    line = one_error_line(_init_rm(rmq, tmp_path, "gallery3", "--new-model", small))
    assert "small.onnx" in line and f"{OLD_DIM}-d" in line
    assert "planned" not in rmq("pairs").output
    switch = ("switch-encoder", "--name", "rm", "--encoder", tmp_path / "graph.onnx", "--new-model", small)
    assert f"{OLD_DIM}-d" in one_error_line(rmq(*switch, ok=False))
    assert _record(tmp_path, "rm").new_model is None


def test_a_record_written_before_the_field_existed_loads(rmq, pairs, tmp_path):
    store = open_store(tmp_path / "q")
    try:
        payload = store.retrieve(META_COLLECTION, [_key("pair", "rm")])[0].payload
        payload["record"].pop("new_model", None)  # as a record from before the field
        _put(store, "pair", "rm", payload)
    finally:
        store.close()
    assert _record(tmp_path, "rm").new_model is None
    assert "plain new     -" in rmq("status", "--name", "rm").output
