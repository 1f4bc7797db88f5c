"""Labels win where they exist (issue 39): a payload's labels judge ``rmq fit``'s graph even when
they do not train it: the pair's label field, or ``--label-field`` with ``--loss label-free``.

The team's payload gets a field the old model sorts and the new one does not: each tint of the
images split in two by the side of a plane the stored old vector falls on. The old model is then
as good as it gets by those labels, and a ψ from the unrelated new model falls below it at t = 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.e2e.test_fit import FIT, SOURCES, team  # noqa: F401
from tests.e2e.test_team_upgrade import deployment, make_local_folder, web  # noqa: F401

pytestmark = pytest.mark.slow

pytest.importorskip("torch")


@pytest.fixture
def grouped(team, deployment):  # noqa: F811
    """``team``'s collection with a payload field 'group' that follows the stored old vectors, and
    a pair 'judged' on it whose label field that is."""
    from qdrant_client import QdrantClient

    rmq, tmp, rows = team
    _, vectors, _, _ = deployment
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    colour = np.arange(len(rows)) % 4  # the images' tint, which any model sorts by
    residual = unit - np.stack([unit[colour == c].mean(0) for c in colour])
    side = residual @ np.random.default_rng(7).normal(size=unit.shape[1]) > 0
    groups = [
        f"g{c}{int(s)}" for c, s in zip(colour, side, strict=True)
    ]  # the old model's own split of each tint
    client = QdrantClient(path=str(tmp / "team-store"))
    for row, group in zip(rows, groups, strict=True):
        client.set_payload("products", {"group": group}, points=[row["id"]])
    client.close()
    rmq("drop-pair", "upgrade")  # one pair a collection: 'judged' takes its place
    rmq(
        "init",
        "--name",
        "judged",
        "--old-collection",
        "products",
        "--encoder",
        tmp / "new.onnx",
        "--old-encoder",
        tmp / "old.onnx",
        "--uri-field",
        "image_url",
        "--label-field",
        "group",
    )
    return rmq, tmp


JUDGED = ["fit", "--name", "judged", *FIT[3:]]


def test_the_pairs_label_field_decides_a_fit_trained_without_labels(grouped):
    rmq, tmp = grouped
    out = tmp / "p.onnx"
    result = rmq(*JUDGED, "--backbone", tmp / "new.onnx", "--out", out, "--loss", "procrustes", ok=False)
    assert result.exit_code == 3 and not out.exists(), result.output
    assert "refused by the labels" in result.output and "mAP over the held-out points" in result.output
    report = json.loads(
        rmq(
            *JUDGED, "--backbone", tmp / "new.onnx", "--out", out, "--loss", "procrustes", "--force", "--json"
        ).output
    )
    assert report["decided_by"] == "labels" and report["labels_from"] == "group"
    assert report["labelled"]["measure"].startswith("mAP") and not report["labelled"]["passed"]
    assert report["labelled"]["fitted"][0] < report["labelled"]["naive"][0]  # below the old model at t = 0
    assert report["forecasts"][1]["map"] is not None


def test_label_free_candidates_are_each_judged_by_the_labels(grouped, monkeypatch):
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 10)
    monkeypatch.setattr("rm_qdrant_train.label_free.K", 2)
    monkeypatch.setattr("rm_qdrant_train.label_free.HOLDOUT", 0.5)  # 20 training pairs: 10 to choose on
    rmq, tmp = grouped
    report = json.loads(
        rmq(
            *JUDGED,
            "--backbone",
            tmp / "new.onnx",
            "--out",
            tmp / "lf.onnx",
            "--loss",
            "label-free",
            "--label-field",
            "group",
            "--force",
            "--json",
        ).output
    )
    assert report["loss"] == "label-free" and not report["learned_rho"]  # the labels did not train
    assert report["decided_by"] == "labels"
    candidates = report["candidates"]
    assert candidates and all(c["labelled"] is not None for c in candidates)
    refused = [c for c in candidates if not c["labelled"]["passed"]]
    assert refused and all(not c["eligible"] for c in refused)  # below the old model by the labels


def test_a_fit_without_labels_anywhere_is_still_decided_by_the_guard(team):  # noqa: F811
    rmq, tmp, _ = team
    report = json.loads(
        rmq(
            *FIT,
            "--backbone",
            tmp / "new.onnx",
            "--out",
            tmp / "g.onnx",
            "--loss",
            "procrustes",
            "--force",
            "--json",
        ).output
    )
    assert report["decided_by"] == "guard" and report["labels_from"] is None and report["labelled"] is None


_ = (SOURCES, make_local_folder)


def test_a_label_field_that_tells_no_classes_apart_does_not_judge():
    """A pair's default label field may hold a caption per point, or one value everywhere: every AP
    would be 0 (or 1) on both curves, and every fit refused on a tie. Such a field does not judge."""
    from rm_qdrant.cli.fit import informative

    assert informative([f"caption {i}" for i in range(20)]) is None  # each point its own class
    assert informative(["shoes"] * 20) is None  # one class
    assert informative(None) is None
    assert informative(["a", "b", "a", 3]) == ["a", "b", "a", 3]
