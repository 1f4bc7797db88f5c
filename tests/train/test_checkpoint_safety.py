"""A checkpoint from another team is data: loading it never runs code, and a bad one is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rm_qdrant_train.checkpoints import load_checkpoint


class _Payload:
    """Pickles to a call of os.system: what a hostile .pt holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _hostile(path: Path, marker: Path, kind: str) -> Path:
    torch.save({"kind": kind, "arch": _Payload(marker), "state_dict": {}}, path)
    return path


def _rmq(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rm_qdrant", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["export", "--new", "{pt}", "--out", "x.onnx"],
        ["export", "--old", "{pt}", "--out-old", "x.onnx"],
        ["train", "heads", "--old", "{pt}", "--new", "{pt}", "--data", "data", "--out", "h.pt"],
        ["train", "adapter", "--old", "{pt}", "--new", "{pt}", "--data", "data", "--out", "a.pt"],
    ],
    ids=["export-new", "export-old", "train-heads", "train-adapter"],
)
def test_a_pickle_that_calls_code_does_not_run_and_is_refused_in_one_line(tiny_folder, tmp_path, args):
    marker = tmp_path / "pwned"
    pt = _hostile(tmp_path / "evil.pt", marker, "backbone")
    done = _rmq(tmp_path, *[a.replace("{pt}", str(pt)) for a in args])
    assert not marker.exists(), "loading the checkpoint ran its code"
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert "evil.pt" in lines[0] and "Traceback" not in done.stderr


def test_load_checkpoint_refuses_code_and_missing_fields(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ValueError, match="not plain data"):
        load_checkpoint(_hostile(tmp_path / "evil.pt", marker, "heads"), "heads")
    assert not marker.exists()
    torch.save({"kind": "backbone", "state_dict": {}}, tmp_path / "short.pt")
    with pytest.raises(ValueError, match="lacks 'arch'"):
        load_checkpoint(tmp_path / "short.pt", "backbone", needs=("arch", "embed_dim"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="junk.pt"):
        load_checkpoint(tmp_path / "junk.pt", "backbone")
