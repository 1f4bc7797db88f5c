"""``rmq probe`` recommends by the labels where the sample has them (issue 39).

The pair here serves a graph whose ψ imitates the new model's neighbourhoods and scrambles
the classes: each image is a class (one of three colours), a two-number nuisance and noise.
The old model sees mostly the class; the new model mostly the nuisance; ψ maps the new
model's nuisance into the old space with a class-blind constant. So ψ's hits among the old
vectors are the new model's neighbours (recall@k against them is high) of any class (mAP
falls far below the old model's at t = 0): the label-free forecast picks rm, the labels naive.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC, one_error_line

#: The first pixel values of each image: class one-hot (3), nuisance (2), a constant, noise (4).
FEATURES = 10


def _weights(w: np.ndarray) -> np.ndarray:
    """``w`` (FEATURES rows) as a linear encoder's weights over all the pixels (the rest unread)."""
    full = np.zeros((PIXELS, w.shape[1]))
    full[:FEATURES] = w
    return full


@pytest.fixture
def scrambled(rmq, tmp_path: Path) -> Path:
    """Pair ``rm`` over 24 images (classes a, b, c in payload 'label'), recording the plain new
    model, its label field one the payloads lack ('category'); returns the images."""
    rng = np.random.default_rng(0)
    for k, label in enumerate("abc"):
        for i in range(8):
            values = np.zeros(PIXELS)
            values[k] = 1.0
            values[3:5] = rng.uniform(0, 1, 2)
            values[5] = 1.0
            values[6:10] = rng.uniform(0, 1, 4)
            target = tmp_path / "images" / label / f"{i}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.round(255 * values).astype(np.uint8).reshape(SPEC.height, SPEC.width, SPEC.channels)
            Image.fromarray(pixels).save(target)
    old_w = np.zeros((FEATURES, OLD_DIM))
    old_w[[0, 1, 2], [0, 1, 2]], old_w[[3, 4], [3, 4]], old_w[5, 5] = 1.0, 0.36, 3.3
    old_w[6:] = 0.05 * np.array(
        [[1, -1, 0, 0, 1, 0], [0, 1, -1, 1, 0, 0], [1, 0, 1, 0, -1, 0], [0, 0, 0, 1, 1, -1]]
    )
    new_w = np.zeros((FEATURES, NEW_DIM))
    new_w[[0, 1, 2], [0, 1, 2]], new_w[[3, 4], [3, 4]], new_w[5, 5] = 0.1, 1.0, 0.55
    new_w[6:, 6:] = 0.05 * np.eye(4)
    psi = np.zeros((NEW_DIM, OLD_DIM))
    psi[5, :3], psi[[3, 4], [3, 4]], psi[5, 5] = 1.19 / 3 / 0.55, 0.26, 2.4 / 0.55
    old = linear_encoder(
        tmp_path / "old.onnx", [("embedding", "pixels", _weights(old_w))], input_spec=SPEC, name="old"
    )
    new = linear_encoder(
        tmp_path / "new.onnx", [("embedding", "pixels", _weights(new_w))], input_spec=SPEC, name="new"
    )
    graph = linear_encoder(
        tmp_path / "graph.onnx",
        [("new", "pixels", _weights(new_w)), ("rev", "new", psi)],
        input_spec=SPEC,
        name="scrambling-graph",
    )
    images = tmp_path / "images"
    rmq("index", "--collection", "gallery", "--data", images, "--encoder", old)
    rmq(
        *("init", "--name", "rm", "--old-collection", "gallery", "--encoder", graph),
        *("--old-encoder", old, "--new-model", new, "--label-field", "category"),
    )
    return images


def _probe(rmq, *extra: object) -> tuple[dict, str]:
    args = ("probe", "--name", "rm", "--sample", "24", "--k", "3", *extra)
    return json.loads(rmq(*args, "--json").output), rmq(*args).output


def test_probe_recommends_naive_when_the_labels_put_rm_below_it_and_says_the_forecasts_disagree(
    rmq, scrambled
):
    # the pair's label field is not in the payloads: the label-free forecast decides, and picks rm
    free, _ = _probe(rmq)
    assert free["decided_by"] == "label-free" and free["serve"] == "rm" and free["label_field"] is None
    assert free["recommendation"].startswith("serve rm (area ")
    # --label-field supplies the labels: they decide, and refuse rm
    out, text = _probe(rmq, "--label-field", "label")
    curves = {f["mode"]: f for f in out["forecasts"]}
    assert curves["rm"]["area"] > curves["naive"]["area"]  # recall@k still says rm
    assert curves["rm"]["map"][0] < curves["naive"]["map"][0] - 0.3  # the labels say rm starts far below
    assert out["serve"] == "naive" and out["decided_by"] == "labels" and out["label_field"] == "label"
    assert out["disagreement"] == {"labels": "naive", "label_free": "rm"}
    assert out["rm_below_naive"][0]["t"] == 0.0
    advice = next(line for line in text.splitlines() if line.startswith("recommendation: "))
    assert advice.startswith("recommendation: serve naive by the labelled forecast (mAP area ")
    assert "rm's mAP falls below the naive merge's at t = 0, " in advice
    assert (
        "the label-free forecast (recall@k against the new model's own neighbours) would have picked rm"
        in advice
    )
    assert "but the labels say otherwise" in advice
    # both tables show the naive curve beside rm's (the plain new model is recorded)
    for title in ("recall@3 against", "mAP over the sample"):
        start = next(i for i, line in enumerate(text.splitlines()) if line.startswith(title))
        rows = {line.split()[0] for line in text.splitlines()[start : start + 6] if line.strip()}
        assert {"naive", "rm"} <= rows


def test_probe_label_field_missing_on_the_sample_is_one_line(rmq, scrambled):
    line = one_error_line(
        rmq("probe", "-q", "--name", "rm", "--sample", "24", "--label-field", "meta.dept", ok=False)
    )
    assert "payload field 'meta.dept' is missing on some sampled points" in line
    line = one_error_line(rmq("probe", "--name", "rm", "--label-field", "a..b", ok=False))
    assert "--label-field 'a..b' is not a payload field" in line


def test_probe_where_labels_and_recall_agree_recommends_as_before(rmq, demo, models):
    """A graph that serves the old model's vectors through ψ and the plain new model's through ρ:
    both forecasts find it no worse than the naive merge, and rm is served as before."""
    args = ("probe", "--name", "demo", "--sample", "24", "--k", "3", "--new-model", models.new_only)
    out = json.loads(rmq(*args, "--json").output)
    assert out["label_field"] == "label" and out["decided_by"] == "labels"
    assert out["serve"] == "rm" and out["disagreement"] is None and out["rm_below_naive"] == []
    assert out["recommendation"].startswith("serve rm by the labelled forecast")
    assert "the label-free forecast agrees (recall@k area " in out["recommendation"]
