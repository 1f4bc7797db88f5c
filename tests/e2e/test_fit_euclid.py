"""``rmq fit`` then ``rmq switch-encoder`` on a Euclid collection of raw vectors (issue 23, item 1).

The backbone was stamped ``--distance euclid`` before output scales existed, or without a
distance and ``--scale raw``: the fitted graph keeps its distance and scale and its raw
vectors (no L2 normalisation), ψ answers in the stored old vectors' own space, and
switch-encoder takes it; a graph that L2-normalises the same vectors is refused, with
the reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rm_qdrant import DualIndex, OnnxEncoder, load_pair, open_store
from rm_qdrant.migration.migrate import MigrateOptions, run_migration
from tests.models.test_metric_scale import N, build_team, l2_normalised, rmq

pytestmark = pytest.mark.slow

pytest.importorskip("torch")


@pytest.fixture(params=[("euclid", None), (None, "raw")], ids=["stamped-euclid", "any-distance-raw"])
def fitted(request, tmp_path):
    team = build_team(tmp_path, stamp=request.param)
    rmq(
        team.folder,
        "init",
        "--name",
        "up",
        "--old-collection",
        "catalog",
        "--encoder",
        team.backbone,
        "--old-encoder",
        team.old,
    )
    rmq(team.folder, "migrate", "--name", "up", "--until", "0.5", "--batch", "8")
    out = tmp_path / "fitted.onnx"
    fit = ["fit", "--name", "up", "--sample", N, "--holdout", "0.5", "--k", "3", "--loss", "procrustes"]
    rmq(team.folder, *fit, "--backbone", team.backbone, "--out", out, "--force")
    return team, out


def test_the_fitted_graph_keeps_the_backbones_distance_and_raw_scale(fitted):
    team, out = fitted
    info, backbone_info = OnnxEncoder(out).info, OnnxEncoder(team.backbone).info
    assert info.distance != "cosine" and info.scale != "unit"
    assert (info.distance, info.scale) == (backbone_info.distance, backbone_info.scale)  # its backbone's
    uris = [i.uri for i in team.items]
    got = OnnxEncoder(out).encode(uris)
    backbone = OnnxEncoder(team.backbone).encode(uris)["embedding"]
    np.testing.assert_allclose(got["new"], backbone, rtol=1e-4, atol=1e-4)  # ρ = identity, raw
    stored = OnnxEncoder(team.old).encode(uris)["embedding"]
    ratio = np.median(np.linalg.norm(got["rev"], axis=1)) / np.median(np.linalg.norm(stored, axis=1))
    # ψ answers in the old vectors' raw space, not at unit length (about 0.12 here), and at their
    # scale: least squares on a small random sample lands within 15-20 % of it (1.375 unscaled)
    assert 0.7 < ratio < 1.3, ratio


def test_switch_encoder_takes_the_raw_graph_and_refuses_one_that_normalises(fitted, tmp_path):
    team, out = fitted
    switched = rmq(team.folder, "switch-encoder", "--name", "up", "--encoder", out)
    assert "(euclid): cosine min" in switched.output and "norms: stored min" in switched.output
    unit = l2_normalised(out, tmp_path / "fitted-unit.onnx", ("new", "rev"))
    refused = rmq(team.folder, "switch-encoder", "--name", "up", "--encoder", unit, ok=False)
    lines = [line for line in refused.output.splitlines() if line.startswith(("Error", "Not kept"))]
    assert len(lines) == 1, refused.output
    assert (
        "does not reproduce the vectors already in 'up-new' (euclid distance: the same directions" in lines[0]
    )
    assert "it L2-normalises them" in lines[0] and "the stored ones min" in lines[0]
    status = json.loads(rmq(team.folder, "status", "--name", "up", "--json").output)
    assert status["mode"] == "rm"
    with open_store(team.folder) as store:
        index = DualIndex.open(store, "up", exact=True)
        pair = load_pair(store, "up")
        moved = {p.id for p in store.scroll(pair.new_collection, limit=N)[0]}
        fresh = next(i for i in team.items if i.point_id not in moved)
        # A product the application writes now is stored raw, like those already in new.
        index.add(fresh.point_id, fresh.uri, {"uri": fresh.uri})
        (record,) = store.retrieve(pair.new_collection, [fresh.point_id], with_vectors=True)
        norms = [
            np.linalg.norm(p.vector) for p in store.scroll(pair.new_collection, limit=N, with_vectors=True)[0]
        ]
        assert np.linalg.norm(record.vector) > 2 and min(norms) > 2
        hits = index.search(fresh.uri, limit=5)
        assert hits[0].id == fresh.point_id and hits[0].distance < 1e-3
        run_migration(index, MigrateOptions(batch=50))
        assert store.count(pair.new_collection) == N
