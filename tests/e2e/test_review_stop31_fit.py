"""What an adversarial review of stop 31 broke in ``rmq fit`` (a traceback, not one line), now held."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from rm_qdrant import open_store, scan_image_folder
from rm_qdrant.cli import cli
from tests.conftest import make_image_folder, one_error_line
from tests.e2e.test_fit_reproducible import naive_pair, torch_threads  # noqa: F401 (an autouse fixture)

pytest.importorskip("torch")


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
    assert huge in one_error_line(result)  # before: a ValueError traceback from torch


@pytest.mark.slow
def test_fit_on_a_gallery_of_identical_images_is_one_line_or_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr("rm_qdrant_train.label_free.STEPS", 5)
    items = scan_image_folder(make_image_folder(tmp_path / "images", per_class=120))
    for item in items[1:]:  # the same bytes everywhere: every embedding is the same
        shutil.copy(items[0].uri, item.uri)
    folder, new = naive_pair(tmp_path, items)  # its models: 1 - cos of equal vectors rounds below 0
    rmq = ["--qdrant", str(folder)]
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
