"""A naive pair on a Dot or a Euclid collection of raw vectors (issue 23, item 2).

The team's new model writes vectors ten times longer than the old one's: under dot its
distances are a hundred times larger, so new hits take the whole merged top k; under
Euclid ten times larger, so old hits do. ``rmq probe`` must say which side is crowded out
(not "safe"), ``rmq calibrate`` must map the old distances onto the new scale, and then
each side holds about its share of the top k and a query finds its own old image first.
``rmq search`` shows a dot product as a score. Real ONNX graphs, real images, the embedded
store on disk.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rm_qdrant import OnnxEncoder, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import PIXELS, SPEC, make_image_folder

pytestmark = pytest.mark.slow

PER_CLASS = 20  # 60 images, 30 left in old at t = 0.5


@dataclass(frozen=True)
class Deployment:
    rmq: object
    images: Path
    old: Path
    new: Path


def raw_pair(root: Path, distance: str) -> tuple[Path, Path]:
    """Old and new linear models stamped for ``distance``; the new one extends the old one and
    its vectors are ten times longer. Each weight column sums to zero over every colour
    channel, so an image's vector is its noise pattern, not its class colour: directions
    spread out, and most images are their own nearest neighbour under dot too."""
    rng = np.random.default_rng(11)

    def weights(dim: int) -> np.ndarray:
        w = rng.normal(size=(SPEC.height * SPEC.width, SPEC.channels, dim))
        return (w - w.mean(axis=0)).reshape(PIXELS, dim) * 1.75

    w_old = weights(16)  # old vectors: norms about 4 to 12, median 8
    w_new = 10.0 * np.hstack([w_old, weights(8)])
    old = linear_encoder(
        root / "old.onnx", [("embedding", "pixels", w_old)], input_spec=SPEC, name="old", distance=distance
    )
    new = linear_encoder(
        root / "new.onnx", [("embedding", "pixels", w_new)], input_spec=SPEC, name="new", distance=distance
    )
    return old, new


@pytest.fixture(params=["dot", "euclid"])
def deployment(request, tmp_path) -> Iterator[Deployment]:
    # The images at a fixed path: the points' ids (derived from the URIs), and so the samples
    # that probe and calibrate draw, are the same in every run, whatever pytest's folder is.
    fixed = Path(tempfile.gettempdir()) / f"rmq-test-merge-metrics-{request.param}"
    shutil.rmtree(fixed, ignore_errors=True)
    images = make_image_folder(fixed / "images", per_class=PER_CLASS)
    old, new = raw_pair(tmp_path / "models", request.param)

    def rmq(*args, ok=True, code=0):
        result = CliRunner().invoke(cli, ["--qdrant", str(tmp_path / "q"), *map(str, args)])
        if ok:
            assert result.exit_code == code, result.output
        return result

    rmq("index", "--collection", "gallery", "--data", images, "--encoder", old)
    init = ["init", "--name", "p", "--old-collection", "gallery", "--encoder", new, "--old-encoder", old]
    rmq(*init, "--mode", "naive")
    rmq("migrate", "--name", "p", "--until", "0.5")
    yield Deployment(rmq, images, old, new)
    shutil.rmtree(fixed, ignore_errors=True)


def search(rmq, image: str, limit: int = 10) -> list[dict]:
    return json.loads(rmq("search", "--name", "p", image, "--limit", limit, "--exact", "--json").output)


def old_share(rmq, uris: list[str]) -> float:
    """The old side's share of the merged top 10 over every other image as a query."""
    hits = [h for uri in uris[::2] for h in search(rmq, uri)]
    return sum(h["source"] == "old" for h in hits) / len(hits)


def clearly_first(model: Path, uris: list[str], distance: str) -> set[str]:
    """The images this model ranks first for themselves, by a 5 % margin (dot: not all)."""
    v = OnnxEncoder(model).encode(uris)["embedding"].astype(np.float64)
    d = -(v @ v.T) if distance == "dot" else np.linalg.norm(v[:, None] - v[None], axis=2)
    keep = set()
    for i, uri in enumerate(uris):
        runner_up = np.min(np.delete(d[i], i))
        if d[i, i] < runner_up - 0.05 * abs(runner_up):
            keep.add(uri)
    return keep


def test_probe_flags_the_crowded_side_and_calibrate_gives_each_side_its_share(deployment):
    rmq = deployment.rmq
    distance = json.loads(rmq("pairs", "--json").output)[0]["distance"]
    uris = sorted(item.uri for item in scan_image_folder(deployment.images))
    status = json.loads(rmq("status", "--name", "p", "--json").output)
    assert status["fraction"] == pytest.approx(0.5)
    crowded = "old" if distance == "dot" else "new"  # dot: new's distances are 100x; Euclid: 10x
    before = old_share(rmq, uris)
    assert (before < 0.05) if crowded == "old" else (before > 0.9)  # a migrated query's own image is 0 away

    probe = ["probe", "--name", "p", "--sample", "30", "--k", "3"]
    report = json.loads(rmq(*probe, "--json").output)
    advice = report["recommendation"]
    assert "is safe" not in advice and "not safe" in advice, advice
    assert f"{crowded} hits are crowded out of the merged top 3" in advice and "rmq calibrate" in advice
    assert {c["side"] for c in report["forecasts"][0]["crowded_out"]} == {crowded}
    text = rmq(*probe).output
    assert f"{crowded} hits are crowded out" in text and "old hits' share of the merged top 3" in text

    calibrate = ["calibrate", "--name", "p", "--sample", "30", "--holdout", "0.5", "--k", "3"]
    kept = json.loads(rmq(*calibrate, "--json").output)
    assert kept["kept"] and kept["distance"] == distance and kept["mapping"] == "quantile"
    assert kept["guard"]["passed"]  # the guard does not stand in the way of a map that un-crowds a side
    assert kept["better_than_in_use"] is None  # the pair had no map
    assert 0.3 < old_share(rmq, uris) < 0.7  # half the gallery in old, about half the top 10
    # The same fit again is no better than the map it would replace: the pair keeps its map.
    kept_map = json.loads(rmq("pairs", "--json").output)[0]["calibration"]
    again = rmq(*calibrate, "--json", code=3)
    refit = json.loads(again.stdout)
    assert not refit["kept"] and refit["better_than_in_use"] is False
    assert refit["refused"].startswith("it forecasts no better than the map in use")
    assert "keeps the map it had" in again.stderr
    assert kept_map is not None and json.loads(rmq("pairs", "--json").output)[0]["calibration"] == kept_map
    after = json.loads(rmq(*probe, "--json").output)
    assert "crowded out of" not in after["recommendation"] and not after["forecasts"][0]["crowded_out"]

    in_old = {h["payload"]["uri"] for h in search(rmq, uris[0], 3 * PER_CLASS) if h["source"] == "old"}
    assert len(in_old) == len(uris) // 2
    own = (
        in_old & clearly_first(deployment.old, uris, distance) & clearly_first(deployment.new, uris, distance)
    )
    assert len(own) >= 10
    for uri in sorted(own):
        first = search(rmq, uri)[0]
        assert (first["payload"]["uri"], first["source"]) == (uri, "old")
    if distance == "dot":  # the two models' scores side by side: the table says how they were ranked
        text = rmq("search", "--name", "p", min(own), "--exact").output.splitlines()
        assert text[1].split()[2] == "old" and float(text[1].split()[1]) > 0
        assert (
            text[-1]
            == "(old hits' scores are the old model's; the calibrated merge ranks them on the new scale)"
        )


def test_search_shows_a_dot_product_as_a_score_and_json_carries_both(deployment):
    rmq = deployment.rmq
    distance = json.loads(rmq("pairs", "--json").output)[0]["distance"]
    query = str(sorted(deployment.images.glob("a/*"))[0])
    hits = search(rmq, query, 5)
    lines = rmq("search", "--name", "p", query, "--limit", 5, "--exact").output.splitlines()
    header, rows = lines[0].split(), [line.split() for line in lines[1:]]
    values = [float(row[1]) for row in rows]
    if distance == "dot":
        assert header[1] == "score" and "distance" not in header
        assert all(v > 0 for v in values) and values == [pytest.approx(h["score"], abs=1e-3) for h in hits]
        assert all(h["distance"] == pytest.approx(-h["score"]) for h in hits)  # plain merge: -x·y
    else:
        assert header[1] == "distance"
        assert all(v >= 0 for v in values) and values == [
            pytest.approx(h["distance"], abs=1e-3) for h in hits
        ]
        assert all(h["distance"] == pytest.approx(h["score"]) for h in hits)
