"""What an adversarial review of stop 31 broke in ``rmq fit`` (a traceback, not one line), now held."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from rm_qdrant import OnnxEncoder, index_images, open_store, scan_image_folder
from rm_qdrant.cli import cli
from rm_qdrant_exporters.linear import linear_encoder
from tests.conftest import NEW_DIM, OLD_DIM, PIXELS, SPEC, make_image_folder, one_error_line

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def torch_threads():
    """rmq fit sets this process's torch threads (CliRunner runs it here): put them back."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("how", ["--threads", "OMP_NUM_THREADS"])
def test_a_thread_count_torch_cannot_take_is_one_line(how, tmp_path):
    open_store(tmp_path / "q").close()
    args = [
        "--qdrant",
        str(tmp_path / "q"),
        "fit",
        "--name",
        "p",
        "--backbone",
        "pyproject.toml",
        "--out",
        str(tmp_path / "x.onnx"),
    ]
    huge = str(2**31)
    if how == "--threads":
        result = CliRunner().invoke(cli, [*args, "--threads", huge])
    else:
        result = CliRunner().invoke(cli, args, env={"OMP_NUM_THREADS": huge})
    assert huge in one_error_line(result)  # today: a ValueError traceback from torch


def test_fit_on_a_gallery_of_identical_images_is_one_line_or_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 5)
    rng = np.random.default_rng(5)
    items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=120))
    for item in items[1:]:  # the same bytes everywhere: every embedding is the same
        shutil.copy(items[0].uri, item.uri)
    w_old = rng.normal(size=(PIXELS, OLD_DIM))
    w_new = np.hstack(  # test_fit_reproducible's models: 1 - cos of equal vectors rounds below 0 here
        [w_old @ rng.normal(size=(OLD_DIM, OLD_DIM)), rng.normal(size=(PIXELS, NEW_DIM - OLD_DIM))]
    )
    old = linear_encoder(tmp_path / "old.onnx", [("embedding", "pixels", w_old)], input_spec=SPEC, name="old")
    new = linear_encoder(tmp_path / "new.onnx", [("embedding", "pixels", w_new)], input_spec=SPEC, name="new")
    folder = tmp_path / "qdrant"
    with open_store(folder) as store:
        index_images(store, "catalog", OnnxEncoder(old), items)
    rmq = ["--qdrant", str(folder)]
    init = [
        "init",
        "--name",
        "up",
        "--old-collection",
        "catalog",
        "--encoder",
        str(new),
        "--old-encoder",
        str(old),
    ]
    assert CliRunner().invoke(cli, [*rmq, *init]).exit_code == 0
    fit = [
        "fit",
        "--name",
        "up",
        "--sample",
        "360",
        "--backbone",
        str(new),
        "--out",
        str(tmp_path / "f.onnx"),
    ]
    result = CliRunner().invoke(cli, [*rmq, *fit])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code == 1:
        one_error_line(result)
    elif result.exit_code == 3:
        assert "Not kept:" in result.output, result.output
    else:  # every candidate ties the naive merge: the guard passes it, and it is written
        assert result.exit_code == 0 and "passes the guard" in result.output, result.output
