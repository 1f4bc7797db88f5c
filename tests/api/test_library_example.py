"""examples/library.py, the tour of the library's one-call functions, runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_tour_runs_every_step_as_a_python_call(tmp_path):
    out = tmp_path / "tour"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "library.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # not the repository: the example finds quickstart.py beside itself
    )
    assert result.returncode == 0, result.stderr
    assert "1797 images into 'gallery', 0 skipped" in result.stdout
    assert "indexing into gallery: 1797 of 1797 images" in result.stdout  # on_step
    assert "re-embedding the sample: 400 of 400 images" in result.stdout
    assert "recommendation: serve" in result.stdout
    assert "t=1.0" in result.stdout and "AUC_mAP" in result.stdout
    assert "moved 899 points" in result.stdout and "status: 50% in new, 0 failed" in result.stdout
    assert "estimate: recall@10" in result.stdout
    assert "pair 'digits' is finalized, served as 'digits'" in result.stdout
    assert "probe now: pair 'digits' is finalized" in result.stdout
    assert (out / "rm.onnx").is_file() and (out / "qdrant" / "collections" / "digits-new").is_dir()
