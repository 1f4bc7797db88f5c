"""`rmq model stamp --interpolation`: a team whose pipeline resizes with bicubic (or any Pillow
filter) describes it, and `rmq model check` tells the wrong filter from the right one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from PIL import Image

from rm_qdrant import ConfigError, EncoderError, OnnxEncoder, open_store
from rm_qdrant.cli import cli
from rm_qdrant.core.modelinfo import METADATA_KEY
from rm_qdrant.models.stamp import stamp_model
from tests.models import test_stamp as plain

FILTERS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
ALLOWED = "nearest, bilinear, bicubic, lanczos, box, hamming"
team_graph = plain.team_graph  # the CNN of test_stamp: float32 NCHW 32x32, output image_embeds


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """JPEG and PNG files several times larger than the input, with edges and fine texture
    (what a downscale filter changes), and the real camera JPEG kept in tests/data."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(11)
    files = [Path(__file__).parents[1] / "data" / "subsampling-441.jpg"]
    for i, (width, height) in enumerate([(160, 120), (90, 200), (300, 140), (128, 128), (75, 113)]):
        y, x = np.mgrid[0:height, 0:width]
        image = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 2.0 + y / 3.0)], axis=-1)
        image[((x // 7 + y // 5 + i) % 2) == 0] *= 0.4  # a checker of hard edges
        disc = (x - width * 0.3) ** 2 + (y - height * 0.6) ** 2 < (min(width, height) / 4) ** 2
        image[disc] = [250, 30, 90]
        image = np.clip(image + rng.normal(0, 20, size=image.shape), 0, 255).astype(np.uint8)
        target = folder / f"photo{i}.{'jpg' if i % 2 else 'png'}"
        Image.fromarray(image).save(target)
        files.append(target)
    return files


def pillow_pixels(path: Path, interpolation: str, *, resize: int | None = 36, side: int = 32) -> np.ndarray:
    """Pillow's own resize (shorter side ``resize`` then centre crop, or straight to side × side)."""
    image = Image.open(path).convert("RGB")
    resample = Image.Resampling[interpolation.upper()]
    if resize is None:
        return np.asarray(image.resize((side, side), resample))
    width, height = image.size
    size = (
        (resize, int(resize * height / width)) if width <= height else (int(resize * width / height), resize)
    )
    image = image.resize(size, resample)
    top, left = int(round((size[1] - side) / 2.0)), int(round((size[0] - side) / 2.0))
    return np.asarray(image.crop((left, top, left + side, top + side)))


def bicubic_team_vectors(graph: Path, files: list[Path]) -> np.ndarray:
    """The team's old pipeline: torchvision Resize(36, BICUBIC) + CenterCrop(32) + ImageNet statistics."""
    batch = np.stack([pillow_pixels(f, "bicubic") for f in files]).astype(np.float32) / 255.0
    batch = ((batch - plain.MEAN) / plain.STD).transpose(0, 3, 1, 2).astype(np.float32)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    return session.run(["image_embeds"], {"pixel_values": batch})[0]


def rmq(*args: object) -> object:
    return CliRunner().invoke(cli, list(map(str, args)))


def test_a_bicubic_team_passes_the_check_only_when_stamped_bicubic(team_graph, photos, tmp_path):
    folder = tmp_path / "qdrant"
    with open_store(folder) as store:
        store.create_collection("catalog", dim=24, distance="cosine")
        payloads = [{"uri": str(p)} for p in photos]
        store.upsert("catalog", list(range(len(photos))), bicubic_team_vectors(team_graph, photos), payloads)
    flags = [*plain.TEAM_FLAGS, *plain.NORM_FLAGS]
    assert rmq("model", "stamp", team_graph, "--out", tmp_path / "default.onnx", *flags).exit_code == 0
    wrong = rmq("--qdrant", folder, "model", "check", tmp_path / "default.onnx", "--collection", "catalog")
    assert wrong.exit_code == 1, wrong.output
    errors = [line for line in wrong.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "does not reproduce the stored vectors" in errors[0], wrong.output
    assert "--interpolation" in errors[0]  # the knob that fixes it is named
    bicubic = tmp_path / "bicubic.onnx"
    stamped = rmq("model", "stamp", team_graph, "--out", bicubic, *flags, "--interpolation", "bicubic")
    assert stamped.exit_code == 0 and "resize 36 + centre crop 32 (bicubic)" in stamped.output
    right = rmq("--qdrant", folder, "model", "check", bicubic, "--collection", "catalog", "--json")
    assert right.exit_code == 0, right.output
    report = json.loads(right.output)
    assert report["matches"] and report["checked"] == len(photos) and report["min"] >= 0.9999


@pytest.mark.parametrize("interpolation", FILTERS)
def test_every_filter_is_pillows_own_resize(team_graph, photos, tmp_path, interpolation):
    cropped, direct = tmp_path / "cropped.onnx", tmp_path / "direct.onnx"
    chosen = ["--interpolation", interpolation]
    assert rmq("model", "stamp", team_graph, "--out", cropped, *plain.TEAM_FLAGS, *chosen).exit_code == 0
    assert rmq("model", "stamp", team_graph, "--out", direct, *plain.TEAM_FLAGS[:4], *chosen).exit_code == 0
    for path in photos:
        got = OnnxEncoder(cropped).decode(path)
        np.testing.assert_array_equal(got, pillow_pixels(path, interpolation))
        np.testing.assert_array_equal(
            OnnxEncoder(direct).decode(path), pillow_pixels(path, interpolation, resize=None)
        )
        np.testing.assert_array_equal(OnnxEncoder(cropped).decode(path.read_bytes()), got)  # bytes too


def test_the_setting_round_trips_and_absent_means_bilinear(team_graph, tmp_path):
    lanczos = stamp_model(
        team_graph,
        tmp_path / "l.onnx",
        outputs={"embedding": "image_embeds"},
        size=32,
        interpolation="lanczos",
    )
    assert lanczos.info.input.interpolation == "lanczos"
    entry = json.loads(onnx.load(str(tmp_path / "l.onnx")).metadata_props[0].value)
    assert entry["input"]["interpolation"] == "lanczos"
    assert OnnxEncoder(tmp_path / "l.onnx").info.input.interpolation == "lanczos"
    report = rmq("model", "stamp", team_graph, "--out", tmp_path / "b.onnx", *plain.TEAM_FLAGS[:4], "--json")
    assert json.loads(report.output)["input"]["interpolation"] == "bilinear"
    entry = json.loads(onnx.load(str(tmp_path / "b.onnx")).metadata_props[0].value)
    assert "interpolation" not in entry["input"]  # the default is written as graphs were before it existed
    assert OnnxEncoder(tmp_path / "b.onnx").info.input.interpolation == "bilinear"


def with_interpolation(source: Path, out: Path, value: object) -> Path:
    model = onnx.load(str(source))
    prop = next(p for p in model.metadata_props if p.key == METADATA_KEY)
    body = json.loads(prop.value)
    body["input"]["interpolation"] = value
    prop.value = json.dumps(body)
    onnx.save(model, str(out))
    return out


def test_an_unknown_filter_is_refused_in_one_line(team_graph, tmp_path):
    out = tmp_path / "out.onnx"
    result = rmq(
        "model", "stamp", team_graph, "--out", out, *plain.TEAM_FLAGS[:4], "--interpolation", "cubic"
    )
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and "'cubic'" in result.output and "bicubic" in result.output
    assert not out.exists()
    with pytest.raises(ConfigError, match=f"input.interpolation must be one of {ALLOWED}, got 'cubic'"):
        stamp_model(team_graph, out, outputs={"embedding": "image_embeds"}, size=32, interpolation="cubic")
    assert rmq("model", "stamp", team_graph, "--out", out, *plain.TEAM_FLAGS[:4]).exit_code == 0
    for value in ["cubic", "BICUBIC", 3, None]:
        graph = with_interpolation(out, tmp_path / "hand-edited.onnx", value)
        with pytest.raises(EncoderError, match=f"input.interpolation must be one of {ALLOWED}") as caught:
            OnnxEncoder(graph)
        assert "\n" not in str(caught.value)
