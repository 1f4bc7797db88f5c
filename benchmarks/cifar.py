"""CIFAR-10 from ../shared/data, extracted once into .cache/data (ignored by git)."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
DATA = ROOT / ".cache" / "data"


def cifar_root() -> Path:
    """The folder holding train/ and test/ (ImageFolder layout), extracted on first use."""
    if not (DATA / "train").is_dir() or not (DATA / "test").is_dir():
        if not ARCHIVE.is_file():
            sys.exit(f"missing {ARCHIVE}: the CIFAR-10 archive sits in ../shared/data")
        DATA.mkdir(parents=True, exist_ok=True)
        with tarfile.open(ARCHIVE) as archive:
            archive.extractall(DATA, filter="data")
    return DATA
