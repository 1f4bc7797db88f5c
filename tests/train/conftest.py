"""A tiny CIFAR-like ImageFolder (real PNG files) for training tests, and one CPU thread."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only adds waiting
    yield
    torch.set_num_threads(before)


@pytest.fixture
def tiny_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data/{train,test}/<class>/NNN.png, 4 classes of 32x32 images; the test runs inside tmp_path."""
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    for split, count in (("train", 24), ("test", 8)):
        for k, label in enumerate(("ant", "bee", "cat", "dog")):
            base = np.zeros((32, 32, 3), dtype=np.int16)
            base[..., k % 3] = 170 if k < 3 else 90
            base[: 16 * (k % 2 + 1), :, :] += 60
            for i in range(count):
                pixels = np.clip(base + rng.integers(-50, 50, size=base.shape), 0, 255).astype(np.uint8)
                target = root / split / label / f"{i:03d}.png"
                target.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(target)
    monkeypatch.chdir(tmp_path)  # caches (.cache/) and runs/ go to the temporary folder
    return root
