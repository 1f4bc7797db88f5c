"""What a new user sees from `rmq train`: progress by default, settings in --help, no files in the cwd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from rm_qdrant.caches import CACHE_ENV
from rm_qdrant.cli import cli

pytestmark = pytest.mark.slow


def rmq(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # one thread: these tensors are tiny, and a second thread only waits on a 2-core machine
    env = {**os.environ, CACHE_ENV: "", "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rm_qdrant", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_training_shows_progress_keeps_caches_out_of_the_cwd_and_takes_its_settings(tiny_folder, tmp_path):
    work, cache = tmp_path / "work", tmp_path / "xdg"
    work.mkdir()
    args = ["train", "backbone", "--data", str(tiny_folder), "--role", "old", "--epochs", "1"]
    args += ["--image-size", "16", "--normalize", "auto", "--no-flip", "--crop-padding", "0"]
    done = rmq(work, cache, *args, "--out", "old.pt")
    assert done.returncode == 0, done.stderr
    assert (
        "epoch 1/1" in done.stderr and "cached 96 decoded images" in done.stderr and " kB) at " in done.stderr
    )
    assert sorted(p.name for p in work.iterdir()) == ["old.pt"]  # nothing else in the working directory
    assert (cache / "rm-qdrant" / "decoded").is_dir()
    saved = torch.load(work / "old.pt", weights_only=True)
    assert saved["image_size"] == 16 and saved["mean"] != (0.4914, 0.4822, 0.4465)
    assert (saved["config"]["flip"], saved["config"]["crop_padding"]) == (False, 0)
    quiet = rmq(
        work, cache, "train", "backbone", "-q", "--data", str(tiny_folder), "--epochs", "1",
        "--image-size", "16", "--out", "new.pt",
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout.strip() == "wrote new.pt"
    verbose = rmq(
        work,
        cache,
        "train",
        "heads",
        "-v",
        "--old",
        "old.pt",
        "--new",
        "new.pt",
        "--data",
        str(tiny_folder),
        "--steps",
        "2",
        "--batch",
        "32",
        "--lr",
        "3e-3",
        "--out",
        "h.pt",
        "--cache-dir",
        str(tmp_path / "elsewhere"),
    )
    assert verbose.returncode == 0, verbose.stderr
    assert "embedding" in verbose.stderr and (tmp_path / "elsewhere" / "embeddings").is_dir()
    assert (
        "2 steps (0.7 epochs) of batch 32, Adam lr 0.003" in verbose.stderr
        and "mcl step 2/2 loss" in verbose.stderr
    )
    exported = rmq(work, cache, "export", "--new", "new.pt", "--out", "new.onnx")
    assert exported.returncode == 0 and "against PyTorch at batch 1 and 7" in exported.stderr
    assert sorted(p.name for p in work.iterdir()) == ["h.pt", "new.onnx", "new.pt", "old.pt"]
    text = CliRunner().invoke(cli, ["train", "backbone", "--help"]).output
    for option in ("--image-size", "--normalize", "--flip / --no-flip", "--crop-padding", "-q, --quiet"):
        assert option in text


def test_a_bad_heads_setting_is_one_line_from_the_installed_command(tmp_path):
    rmq_script = Path(sys.executable).with_name("rmq")  # the console script pip installed
    bad = [str(rmq_script), "train", "heads", "--set", "steps=1.5"]
    done = subprocess.run(bad, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        "Error: setting steps: expected int, got 1.5\n",
    )
