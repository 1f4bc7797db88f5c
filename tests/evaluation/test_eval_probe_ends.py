"""An rm pair's own ends are not Old and New (issue 28): ``rmq eval``'s Gain and ``rmq probe``'s naive curve.

The graph here maps the new model's embedding through a random ρ and queries old through a
random ψ, so its served t = 0 is not the old model alone and its t = 1 is not the plain new
model alone. The naive pair over the same gallery (old model on old, plain new model on new)
serves Old at t = 0 and New at t = 1: the references both commands must be measured against.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC

pytestmark = pytest.mark.slow


def _means(w: np.ndarray, columns: slice = slice(0, 3), *, half: str | None = None) -> np.ndarray:
    """``w`` with, in ``columns``, each channel's mean pixel (NHWC, flattened): of the left or right half."""
    for c, col in enumerate(range(*columns.indices(w.shape[1]))):
        for h in range(SPEC.height):
            for x in range(SPEC.width):
                if half is None or (half == "left") == (x < SPEC.width // 2):
                    w[(h * SPEC.width + x) * SPEC.channels + c, col] = 1.0
    return w


@pytest.fixture
def pairs(rmq, tmp_path: Path) -> tuple[Path, Path]:
    """Pairs ``rm`` (a graph whose ends are neither Old nor New) and ``naive`` (old, plain new), one
    gallery each, the same images; returns the images and the plain new model.

    Classes differ by colour (red or green) and by which half of the image is bright: the old model
    sees only the colour, the plain new model both, the graph's new output only the colour again,
    and its ψ is random. So Old < New, the graph's t = 1 is not New and its t = 0 is not Old.
    """
    rng = np.random.default_rng(5)
    for k, label in enumerate("abcd"):
        for i in range(6):
            pixels = rng.integers(0, 60, size=(SPEC.height, SPEC.width, 3))
            bright = slice(0, 4) if k % 2 == 0 else slice(4, 8)
            pixels[:, bright, k // 2] += 150
            target = tmp_path / "images" / label / f"{i}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels.astype(np.uint8)).save(target)
    small = 0.01 * rng.normal(size=(PIXELS, NEW_DIM))
    old_w = _means(small[:, :OLD_DIM].copy())
    new_w = _means(_means(small.copy(), slice(0, 3), half="left"), slice(3, 6), half="right")
    graph_w = _means(0.01 * rng.normal(size=(PIXELS, NEW_DIM)))
    old = linear_encoder(tmp_path / "old.onnx", [("embedding", "pixels", old_w)], input_spec=SPEC, name="old")
    new = linear_encoder(tmp_path / "new.onnx", [("embedding", "pixels", new_w)], input_spec=SPEC, name="new")
    graph = linear_encoder(
        tmp_path / "graph.onnx",
        [("new", "pixels", graph_w), ("rev", "new", rng.normal(size=(NEW_DIM, OLD_DIM)))],
        input_spec=SPEC,
        name="graph",
    )
    images = tmp_path / "images"
    for gallery in ("gallery", "gallery2"):  # one collection per pair: the same images, the same old vectors
        rmq("index", "--collection", gallery, "--data", images, "--encoder", old)
    rmq("init", "--name", "rm", "--old-collection", "gallery", "--encoder", graph, "--old-encoder", old)
    naive = (
        "init",
        "--name",
        "naive",
        "--old-collection",
        "gallery2",
        "--encoder",
        new,
        "--old-encoder",
        old,
    )
    rmq(*naive, "--query-mode", "naive")
    return images, new


def _eval(rmq, name: str, queries: Path, *extra: object) -> dict:
    return json.loads(
        rmq("eval", "--name", name, "--queries", queries, "--at", "0,0.5,1", "--json", *extra).stdout
    )


def test_eval_gain_of_an_rm_pair_is_against_old_and_new_and_its_own_ends_are_named_apart(rmq, pairs):
    images, new_model = pairs
    naive = _eval(rmq, "naive", images)
    old, new = naive["points"][0], naive["points"][-1]
    out = _eval(rmq, "rm", images, "--new-model", new_model)
    first, last = out["points"][0], out["points"][-1]
    assert (first["map"], last["map"]) != (old["map"], new["map"])  # the graph's ends are not Old and New
    assert (out["old_map"], out["new_map"]) == (old["map"], new["map"])
    assert (out["old_top1"], out["new_top1"]) == (old["top1"], new["top1"])
    auc = out["auc_map"]
    assert out["gain_map"] == pytest.approx((auc - old["map"]) / (new["map"] - old["map"]))
    assert out["shape_map"] == pytest.approx((auc - first["map"]) / (last["map"] - first["map"]))
    # a naive pair's own ends are Old and New: both measures agree there
    assert naive["gain_map"] == pytest.approx(naive["shape_map"]) and naive["gain_note"] is None
    text = rmq("eval", "--name", "rm", "--queries", images, "--at", "0,1", "--new-model", new_model).output
    assert "the paper's Gain" in text and "Old (the old model alone)" in text
    assert "New (the plain new model alone)" in text
    assert "against this pair's own t = 0 and t = 1 points" in text


def test_eval_of_an_rm_pair_without_a_plain_new_model_says_why_there_is_no_gain_nor_naive_curve(rmq, pairs):
    images, _ = pairs
    out = _eval(rmq, "rm", images)
    assert out["gain_map"] is None and out["new_map"] is None and out["shape_map"] is not None
    assert "plain new model" in out["gain_note"]
    assert out["naive"] is None and "--new-model" in out["naive_note"]
    text = rmq("eval", "--name", "rm", "--queries", images, "--at", "0,1").output
    lines = [line for line in text.splitlines() if "the paper's Gain cannot be computed" in line]
    assert len(lines) == 1 and "--new-model" in lines[0]
    lines = [line for line in text.splitlines() if "naive curve" in line]
    assert lines == ["no naive curve beside this pair's: it needs the plain new model (--new-model PATH)"]


def test_eval_of_an_rm_pair_prints_the_naive_curve_of_the_same_gallery_beside_it(rmq, pairs):
    """Issue 39: the naive merge (old model, plain new model) served on a copy at the same
    fractions, in the same order: the naive pair's own curve, whose ends are Old and New."""
    images, new_model = pairs
    naive = _eval(rmq, "naive", images)
    assert naive["naive"] is None  # a naive pair's own curve is the naive curve
    out = _eval(rmq, "rm", images, "--new-model", new_model)
    curve = out["naive"]["points"]
    assert [(p["t"], p["map"], p["top1"]) for p in curve] == [
        (p["t"], p["map"], p["top1"]) for p in naive["points"]
    ]
    assert (curve[0]["map"], curve[-1]["map"]) == (out["old_map"], out["new_map"])  # Old and New
    assert out["naive"]["auc_map"] == pytest.approx(naive["auc_map"])
    below = [(p["t"], n["map"] - p["map"]) for p, n in zip(out["points"], curve) if p["map"] < n["map"]]
    assert [(b["t"], b["map_margin"]) for b in out["naive"]["below_naive"]] == below
    assert below  # this graph's ψ is random: it starts below the old model
    text = rmq(
        "eval", "--name", "rm", "--queries", images, "--at", "0,0.5,1", "--new-model", new_model
    ).output
    lines = text.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("served mAP and top-1 (%)")))
    assert lines[head + 1].split() == ["t", "0", "0.5", "1", "AUC"]
    for row, points, key in (("rm mAP", out["points"], "auc_map"), ("naive mAP", curve, None)):
        line = next(x for x in lines if x.startswith(row))
        auc = out[key] if key else out["naive"]["auc_map"]
        assert line.split()[2:] == [f"{100 * p['map']:.1f}" for p in points] + [f"{100 * auc:.1f}"]
    worst = max(below, key=lambda b: b[1])
    assert (
        f"rm's mAP falls below the naive merge's at t = {', '.join(f'{t:g}' for t, _ in below)}, "
        f"by up to {100 * worst[1]:.1f} points (at t = {worst[0]:g})"
    ) in lines


def _probe(rmq, name: str, *extra: object) -> dict:
    args = ("probe", "--name", name, "--sample", "24", "--k", "3", "--json", *extra)
    return json.loads(rmq(*args).output)


def test_probe_of_an_rm_pair_draws_the_naive_curve_with_the_plain_new_model(rmq, pairs):
    real = {f["mode"]: f for f in _probe(rmq, "naive")["forecasts"]}["naive"]
    out = _probe(rmq, "rm", "--new-model", pairs[1])
    curves = {f["mode"]: f for f in out["forecasts"]}
    assert sorted(curves) == ["naive", "rm"]
    assert curves["naive"]["map"] == pytest.approx(real["map"])  # ends at New, as the naive pair's probe
    assert curves["naive"]["recall"] == pytest.approx(real["recall"])
    assert curves["rm"]["map"][-1] != pytest.approx(real["map"][-1])  # the graph ends elsewhere


def test_probe_of_an_rm_pair_without_a_plain_new_model_names_its_other_curve(rmq, pairs):
    out = _probe(rmq, "rm")
    modes = [f["mode"] for f in out["forecasts"]]
    assert "naive" not in modes and "rm" in modes
    other = next(f for f in out["forecasts"] if f["mode"] != "rm")
    assert "without ψ" in other["curve"] and "not the naive merge" in other["curve"]
    advice = out["recommendation"]
    assert not advice.startswith("serve naive") and "the naive merge is" not in advice
    text = rmq("probe", "--name", "rm", "--sample", "24", "--k", "3").output
    assert "no-psi: this pair's new output merged with the stored old vectors without ψ" in text
    assert "the naive merge was not forecast" in text.lower() and "--new-model" in text
