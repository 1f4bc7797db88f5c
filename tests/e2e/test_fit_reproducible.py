"""``rmq fit`` twice with the same seed gives the same graph (issue 28, "Reproducible").

A gallery of 360 small images and two linear ONNX models (the new one a rotation of the old
one's space plus extra dimensions): enough pairs for the label-free recipe to choose its
cluster ladder on a holdout (k-means, MCL training, the choice), in a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rm_qdrant import ImageItem, OnnxEncoder, index_images, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC, make_image_folder

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

N = 360  # 324 pairs to train on: the label-free recipe holds out 32 of them to choose on


@pytest.fixture(autouse=True)
def torch_threads():
    """rmq fit sets this process's torch threads (CliRunner runs it here): put them back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def naive_pair(tmp_path: Path, items: list[ImageItem]) -> tuple[Path, Path]:
    """``items`` indexed in a store under ``tmp_path`` by the old linear model, and the naive pair
    'up' on them with the new one: (the store's folder, the new model: the backbone to fit)."""
    rng = np.random.default_rng(5)
    w_old = rng.normal(size=(PIXELS, OLD_DIM))
    w_new = np.hstack(
        [w_old @ rng.normal(size=(OLD_DIM, OLD_DIM)), rng.normal(size=(PIXELS, NEW_DIM - OLD_DIM))]
    )
    old = linear_encoder(tmp_path / "old.onnx", [("embedding", "pixels", w_old)], input_spec=SPEC, name="old")
    new = linear_encoder(tmp_path / "new.onnx", [("embedding", "pixels", w_new)], input_spec=SPEC, name="new")
    folder = tmp_path / "qdrant"
    with open_store(folder) as store:
        index_images(store, "catalog", OnnxEncoder(old), items)
    init = ["init", "--name", "up", "--old-collection", "catalog", "--encoder", new, "--old-encoder", old]
    result = CliRunner().invoke(cli, ["--qdrant", str(folder), *map(str, init)])
    assert result.exit_code == 0, result.output
    return folder, new


@pytest.fixture
def gallery(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=N // 3))
    return (*naive_pair(tmp_path, items), [i.uri for i in items[::7]])


def served(graph: Path, images: list[str]) -> np.ndarray:
    got = OnnxEncoder(graph).encode(images)
    return np.hstack([got["new"], got["rev"]])


def fit_args(folder: Path, backbone: Path, out: Path, *extra: object) -> list[str]:
    args = ["--qdrant", folder, "fit", "--name", "up", "--sample", N, "--backbone", backbone, "--out", out]
    return [str(a) for a in (*args, "--force", *extra)]


def test_two_label_free_fits_with_the_same_seed_give_the_same_graph(gallery, tmp_path, monkeypatch):
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 10)
    folder, backbone, images = gallery
    reports, outputs = [], []
    for run in ("a", "b"):
        out = tmp_path / f"fit-{run}.onnx"
        result = CliRunner().invoke(cli, fit_args(folder, backbone, out, "--json"))
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout))
        outputs.append(served(out, images))
    assert reports[0]["loss"] == "label-free" and reports[0]["forecasts"] == reports[1]["forecasts"]
    assert (reports[0]["seed"], reports[0]["threads"]) == (0, 1)  # what it takes to repeat the fit
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=0, atol=1e-6)


def test_fits_in_fresh_processes_repeat_with_the_same_seed_and_differ_with_another(gallery, tmp_path):
    folder, backbone, images = gallery
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}

    def fit(out: Path, *extra: str, hashseed: str) -> np.ndarray:
        command = [sys.executable, "-m", "rm_qdrant", *fit_args(folder, backbone, out, "--loss", "rqt")]
        command += ["--steps", "30", "--json", *extra]
        done = subprocess.run(
            command, env={**env, "PYTHONHASHSEED": hashseed}, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return served(out, images)

    first = fit(tmp_path / "a.onnx", hashseed="1")
    again = fit(tmp_path / "b.onnx", hashseed="2")  # another order of every str set and dict hash
    other = fit(tmp_path / "c.onnx", "--seed", "1", hashseed="1")
    np.testing.assert_allclose(first, again, rtol=0, atol=1e-6)
    assert not np.allclose(first, other, atol=1e-3)  # the seed is the sample's, the split's, ψ's start


def test_fit_says_what_it_takes_to_repeat_it_in_one_line(gallery, tmp_path):
    folder, backbone, _ = gallery
    result = CliRunner().invoke(
        cli, fit_args(folder, backbone, tmp_path / "x.onnx", "--loss", "procrustes", "--threads", "2")
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("torch threads")]
    assert lines == [
        "torch threads: 2 (--threads); the same --seed, sample and thread count give the same graph, "
        "another thread count may not"
    ]


def test_the_order_a_store_hands_points_back_in_does_not_change_the_graph(gallery, tmp_path, monkeypatch):
    folder, backbone, images = gallery
    rqt = ("--loss", "rqt", "--steps", "30")
    as_stored = tmp_path / "as-stored.onnx"
    assert CliRunner().invoke(cli, fit_args(folder, backbone, as_stored, *rqt)).exit_code == 0
    from rm_qdrant.store.edge import EdgeStore

    retrieve = EdgeStore.retrieve
    monkeypatch.setattr(EdgeStore, "retrieve", lambda *a, **kw: retrieve(*a, **kw)[::-1])
    reversed_ = tmp_path / "reversed.onnx"
    result = CliRunner().invoke(cli, fit_args(folder, backbone, reversed_, *rqt))
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(served(as_stored, images), served(reversed_, images), rtol=0, atol=1e-6)
