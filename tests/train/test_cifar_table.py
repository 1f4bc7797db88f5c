"""benchmarks/cifar_table.py end to end on tiny images: every row, then a rerun that trains nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "cifar_table.py"
ROWS = [
    "Old",
    "New",
    "RM_naive",
    "RM ψ:RQT",
    "RM ψ:CL-S",
    "RM CL-M + ρ",
    "RM ψ:MCL",
    "RM full (MCL + ρ)",
    "Procrustes adapter",
    "low-rank adapter",
    "residual-MLP adapter",
    "BCT",
    "RACT",
    "FCT",
    "FCT (no side-info)",
    "BiCT",
]


def run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny tensors: a second thread only waits
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_one_command_writes_every_methods_row_and_reuses_what_it_trained(tiny_folder: Path, tmp_path: Path):
    args = ["--preset", "smoke", "--data", str(tiny_folder), "--runs", "runs", "--out", "results"]
    first = run(*args)
    assert "trained old.pt" in first and "trained bict.pt" in first
    for setting in ("extended", "open"):
        stem = tmp_path / "results" / f"cifar-{setting}-small-cnn"
        report = json.loads(stem.with_suffix(".json").read_text())
        assert [r["name"] for r in report["rows"]] == ROWS
        assert all(
            len(r["map"]) == 11 and 0.0 <= min(r["map"]) <= max(r["map"]) <= 1.0 for r in report["rows"]
        )
        naive = report["rows"][2]
        assert (
            naive["map"][0] == report["rows"][0]["map"][0] and naive["map"][-1] == report["rows"][1]["map"][0]
        )
        assert set(report["orders"]) == {"random", "confidence", "centroid", "centroid-unsupervised"}
        table = stem.with_suffix(".md").read_text()
        assert all(f"| {name} |" in table for name in ROWS) and report["command"] in table
        assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    second = run(*args)
    assert "trained" not in second  # everything reused from runs/
    again = json.loads((tmp_path / "results" / "cifar-open-small-cnn.json").read_text())
    assert again["rows"] == report["rows"]


def test_a_heterogeneous_upgrade_keeps_the_old_model_and_drops_the_same_width_baselines(
    tiny_folder: Path, tmp_path: Path
):
    common = ["--preset", "smoke", "--data", str(tiny_folder), "--runs", "runs", "--out", "results"]
    run(*common, "--settings", "extended", "--stage", "backbones")
    out = run(*common, "--settings", "extended", "--new-arch", "resnet18", "--new-dim", "24")
    assert "trained old.pt" not in out  # the homogeneous run's old model serves as the old one
    stem = tmp_path / "results" / "cifar-extended-small-cnn-to-resnet18-24d"
    report = json.loads(stem.with_suffix(".json").read_text())
    assert [r["name"] for r in report["rows"]] == [n for n in ROWS if n not in ("BCT", "RACT", "BiCT")]
    assert report["new_dim"] == 24 and "need one size" in stem.with_suffix(".md").read_text()
