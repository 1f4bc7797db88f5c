"""Shared fixtures: real ONNX encoders built with onnx.helper, real image files, real stores."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from exporters.linear import linear_encoder
from rm_qdrant import InputSpec, open_store
from rm_qdrant.store import Store

SPEC = InputSpec(height=8, width=8, channels=3)
PIXELS = SPEC.height * SPEC.width * SPEC.channels
OLD_DIM, NEW_DIM = 6, 10


@dataclass(frozen=True)
class Models:
    """Encoder files and the matrices inside them, to check results with numpy."""

    old: Path  # output "embedding" (OLD_DIM), plus "scores"
    rm: Path  # outputs "new" (NEW_DIM) and "rev" (OLD_DIM)
    new_only: Path  # output "embedding" (NEW_DIM), for the naive mode
    w_old: np.ndarray
    w_new: np.ndarray
    w_rev: np.ndarray


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    rng = np.random.default_rng(7)
    w_old = rng.normal(size=(PIXELS, OLD_DIM))
    # The new model extends the old one, and ψ selects the old part back: a perfectly
    # compatible pair, so a query's rev vector finds the query's own old copy at distance 0.
    w_new = np.hstack([w_old, rng.normal(size=(PIXELS, NEW_DIM - OLD_DIM))])
    w_rev = np.vstack([np.eye(OLD_DIM), np.zeros((NEW_DIM - OLD_DIM, OLD_DIM))])
    w_cls = rng.normal(size=(OLD_DIM, 3))
    folder = tmp_path_factory.mktemp("models")
    old = linear_encoder(
        folder / "old.onnx",
        [("embedding", "pixels", w_old), ("scores", "embedding", w_cls)],
        input_spec=SPEC,
        name="old-linear",
    )
    rm = linear_encoder(
        folder / "rm.onnx", [("new", "pixels", w_new), ("rev", "new", w_rev)], input_spec=SPEC, name="new-rm"
    )
    new_only = linear_encoder(
        folder / "new.onnx", [("embedding", "pixels", w_new)], input_spec=SPEC, name="new"
    )
    return Models(old, rm, new_only, w_old, w_new, w_rev)


def make_image_folder(root: Path, *, per_class: int = 8, labels: tuple[str, ...] = ("a", "b", "c")) -> Path:
    """Write real PNG and JPEG files in the ImageFolder layout; each class has its own colour."""
    rng = np.random.default_rng(3)
    for k, label in enumerate(labels):
        base = np.zeros((8, 8, 3), dtype=np.int16)
        base[..., k % 3] = 180
        for i in range(per_class):
            noise = rng.integers(-60, 60, size=(8, 8, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            target = root / label / f"{i:03d}.{'png' if i % 2 else 'jpg'}"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(target)
    return root


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return make_image_folder(tmp_path / "images")


@pytest.fixture(params=["edge", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store test runs on the embedded qdrant-edge store and on qdrant-client's :memory:."""
    opened = open_store(tmp_path / "qdrant" if request.param == "edge" else ":memory:")
    yield opened
    opened.close()
