"""The README's main job runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_indexes_pairs_and_searches(tmp_path):
    out = tmp_path / "qs"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "indexed 1797 images into 'digits'" in result.stdout
    assert "moved 899 points" in result.stdout
    assert "50% of 1797 images are in the new collection" in result.stdout
    precision = float(result.stdout.split("both halves merged: ")[1].split()[0])
    assert precision > 0.8  # digits of the same class come back
    assert (out / "model.onnx").is_file() and (out / "qdrant" / "collections" / "digits-new").is_dir()
