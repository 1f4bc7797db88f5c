"""`rmq model stamp --orientation exif`: a team whose pipeline turns photos as their EXIF tag says
(``ImageOps.exif_transpose``) describes it, and `rmq model check` tells it from one that does not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from PIL import Image, ImageOps

from rm_qdrant import OnnxEncoder, open_store
from rm_qdrant.cli import cli
from tests.models import test_stamp as plain
from tests.models.test_stamp_interpolation import photos  # noqa: F401  (a fixture)

team_graph = plain.team_graph
FLAGS = [*plain.TEAM_FLAGS, *plain.NORM_FLAGS]


@pytest.fixture(scope="module")
def tagged(photos: list[Path], tmp_path_factory: pytest.TempPathFactory) -> list[Path]:  # noqa: F811
    """The photos as a camera writes them: stored sideways with an orientation tag (6, 8, 3), or none."""
    folder = tmp_path_factory.mktemp("tagged")
    out = []
    for i, path in enumerate(photos):
        exif = Image.Exif()
        exif[0x0112] = (6, 8, 3, 1)[i % 4]
        target = folder / f"{path.stem}.jpg"
        Image.open(path).convert("RGB").save(target, quality=95, exif=exif)
        out.append(target)
    return out


def exif_team_vectors(graph: Path, files: list[Path]) -> np.ndarray:
    """The team's pipeline: exif_transpose, then Resize(36) + CenterCrop(32) + ImageNet statistics."""
    rows = []
    for f in files:
        image = ImageOps.exif_transpose(Image.open(f)).convert("RGB")
        width, height = image.size
        size = (36, int(36 * height / width)) if width <= height else (int(36 * width / height), 36)
        image = image.resize(size, Image.Resampling.BILINEAR)
        top, left = int(round((size[1] - 32) / 2.0)), int(round((size[0] - 32) / 2.0))
        rows.append(np.asarray(image.crop((left, top, left + 32, top + 32))))
    batch = (np.stack(rows).astype(np.float32) / 255.0 - plain.MEAN) / plain.STD
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    return session.run(["image_embeds"], {"pixel_values": batch.transpose(0, 3, 1, 2).astype(np.float32)})[0]


def rmq(*args: object):
    return CliRunner().invoke(cli, list(map(str, args)))


def test_a_team_that_honours_the_tag_passes_the_check_only_when_stamped_exif(team_graph, tagged, tmp_path):
    folder = tmp_path / "qdrant"
    with open_store(folder) as store:
        store.create_collection("catalog", dim=24, distance="cosine")
        payloads = [{"uri": str(p)} for p in tagged]
        store.upsert("catalog", list(range(len(tagged))), exif_team_vectors(team_graph, tagged), payloads)
    ignoring = tmp_path / "ignore.onnx"
    assert rmq("model", "stamp", team_graph, "--out", ignoring, *FLAGS).exit_code == 0
    wrong = rmq("--qdrant", folder, "model", "check", ignoring, "--collection", "catalog")
    assert wrong.exit_code == 1, wrong.output
    errors = [line for line in wrong.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "--orientation" in errors[0], wrong.output
    turning = tmp_path / "exif.onnx"
    stamped = rmq("model", "stamp", team_graph, "--out", turning, *FLAGS, "--orientation", "exif")
    assert stamped.exit_code == 0 and "turned as the EXIF orientation tag says" in stamped.output
    right = rmq("--qdrant", folder, "model", "check", turning, "--collection", "catalog", "--json")
    assert right.exit_code == 0, right.output
    report = json.loads(right.output)
    assert report["matches"] and report["checked"] == len(tagged) and report["min"] >= 0.9999


def test_the_setting_round_trips_and_absent_means_ignore(team_graph, tagged, tmp_path):
    turning, ignoring = tmp_path / "exif.onnx", tmp_path / "ignore.onnx"
    assert rmq("model", "stamp", team_graph, "--out", turning, *FLAGS, "--orientation", "exif").exit_code == 0
    assert rmq("model", "stamp", team_graph, "--out", ignoring, *FLAGS).exit_code == 0
    entry = json.loads(onnx.load(str(ignoring)).metadata_props[0].value)
    assert "orientation" not in entry["input"]  # graphs stamped before the setting read the same
    assert OnnxEncoder(turning).info.input.orientation == "exif"
    assert OnnxEncoder(turning).fingerprint != OnnxEncoder(ignoring).fingerprint  # a different model identity
    sideways = tagged[0]  # tag 6
    assert not np.array_equal(OnnxEncoder(turning).decode(sideways), OnnxEncoder(ignoring).decode(sideways))


def test_an_unknown_orientation_is_refused_in_one_line(team_graph, tmp_path):
    out = tmp_path / "out.onnx"
    result = rmq("model", "stamp", team_graph, "--out", out, *FLAGS, "--orientation", "auto")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and "'auto'" in result.output and "exif" in result.output
    assert not out.exists()
