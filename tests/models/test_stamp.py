"""`rmq model stamp`: a team's own ONNX graph, described in place, gives the team's own vectors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rm_qdrant import ConfigError, EncoderError, OnnxEncoder
from rm_qdrant.cli import cli
from rm_qdrant.core.modelinfo import METADATA_KEY
from rm_qdrant.models.stamp import parse_output_roles, stamp_model

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
TEAM_FLAGS = ["--output", "embedding=image_embeds", "--input-size", "32", "--resize", "36", "--crop", "32"]
NORM_FLAGS = ["--input-layout", "NCHW", "--input-dtype", "float32", "--mean", "0.485,0.456,0.406"]
NORM_FLAGS += ["--std", "0.229,0.224,0.225"]


def stamp(*args: object):
    return CliRunner().invoke(cli, ["model", "stamp", *map(str, args)])


@pytest.fixture(scope="module")
def team_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CNN, plain torch.onnx.export: float32 NCHW 32x32, dynamic batch, output image_embeds."""
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 15 * 15, 24),
    ).eval()
    path = tmp_path_factory.mktemp("team") / "team.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is legacy
        torch.onnx.export(
            net,
            (torch.zeros(1, 3, 32, 32),),
            str(path),
            input_names=["pixel_values"],
            output_names=["image_embeds"],
            dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
            dynamo=False,
        )
    return path


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Non-square pictures (smooth gradients, a bright disc off-centre, noise) as JPEG and PNG files."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(5)
    files = []
    for i, (width, height) in enumerate([(50, 40), (40, 64), (97, 61), (33, 33), (120, 36), (45, 90)]):
        y, x = np.mgrid[0:height, 0:width]
        image = np.stack([255 * x / width, 255 * y / height, 128 + 60 * np.sin(x / 4.0 + i)], axis=-1)
        disc = (x - width * 0.3) ** 2 + (y - height * 0.6) ** 2 < (min(width, height) / 4) ** 2
        image[disc] = [250, 30, 90]
        image = np.clip(image + rng.normal(0, 12, size=image.shape), 0, 255).astype(np.uint8)
        target = folder / f"photo{i}.{'jpg' if i % 2 else 'png'}"
        Image.fromarray(image).save(target)
        files.append(target)
    return files


def team_pipeline(path: Path, *, bgr: bool = False) -> np.ndarray:
    """The team's own preprocessing, as their training code does it (Resize(36), CenterCrop(32), ImageNet)."""
    image = Image.open(path).convert("RGB")
    width, height = image.size
    if width <= height:
        size = (36, int(36 * height / width))
    else:
        size = (int(36 * width / height), 36)
    image = image.resize(size, Image.Resampling.BILINEAR)
    top, left = int(round((size[1] - 32) / 2.0)), int(round((size[0] - 32) / 2.0))
    pixels = np.asarray(image.crop((left, top, left + 32, top + 32)), dtype=np.float32) / 255.0
    mean, std = MEAN, STD
    if bgr:  # an OpenCV-trained model: BGR pixels, statistics in BGR order
        pixels, mean, std = pixels[..., ::-1], MEAN[::-1], STD[::-1]
    return ((pixels - mean) / std).transpose(2, 0, 1)


def team_vectors(graph: Path, files: list[Path], *, bgr: bool = False) -> np.ndarray:
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    batch = np.stack([team_pipeline(f, bgr=bgr) for f in files]).astype(np.float32)
    return session.run(["image_embeds"], {"pixel_values": batch})[0]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_stamped_team_graph_gives_the_teams_own_vectors(team_graph, photos, tmp_path):
    out = tmp_path / "stamped.onnx"
    result = stamp(team_graph, "--out", out, *TEAM_FLAGS, *NORM_FLAGS)
    assert result.exit_code == 0, result.output
    assert "embedding -> image_embeds: 24-d (static shape, checked by a run)" in result.output
    assert "resize 36 + centre crop 32" in result.output
    encoder = OnnxEncoder(out)
    got = encoder.encode(photos)["embedding"]
    assert got.shape == (len(photos), 24)
    assert cosines(got, team_vectors(team_graph, photos)).min() >= 0.9999
    # The check can tell: resizing straight to 32x32 (the old pipeline) is not the team's vectors.
    plain = tmp_path / "plain.onnx"
    assert stamp(team_graph, "--out", plain, *TEAM_FLAGS[:4], *NORM_FLAGS).exit_code == 0
    assert (
        cosines(OnnxEncoder(plain).encode(photos)["embedding"], team_vectors(team_graph, photos)).min()
        < 0.999
    )


def test_bgr_graph(team_graph, photos, tmp_path):
    out = tmp_path / "bgr.onnx"
    bgr_norm = ["--mean", "0.406,0.456,0.485", "--std", "0.225,0.224,0.229", "--channel-order", "BGR"]
    result = stamp(team_graph, "--out", out, *TEAM_FLAGS, *bgr_norm)
    assert result.exit_code == 0, result.output
    got = OnnxEncoder(out).encode(photos)["embedding"]
    assert cosines(got, team_vectors(team_graph, photos, bgr=True)).min() >= 0.9999
    assert cosines(got, team_vectors(team_graph, photos)).min() < 0.999


def test_only_the_metadata_changes(team_graph, tmp_path):
    plain = tmp_path / "plain.onnx"
    assert stamp(team_graph, "--out", plain, *TEAM_FLAGS, *NORM_FLAGS).exit_code == 0
    stamped = onnx.load(str(plain))
    assert [p.key for p in stamped.metadata_props] == [METADATA_KEY]
    del stamped.metadata_props[:]
    assert stamped.SerializeToString() == team_graph.read_bytes()  # torch's file, byte for byte
    source = onnx.load(str(team_graph))
    helper.set_model_props(source, {"producer_note": "kept"})
    given, first, second = tmp_path / "given.onnx", tmp_path / "first.onnx", tmp_path / "second.onnx"
    onnx.save(source, str(given))
    assert stamp(given, "--out", first, *TEAM_FLAGS, *NORM_FLAGS).exit_code == 0
    result = stamp(first, "--out", second, "--output", "embedding=image_embeds", "--input-size", "32")
    assert result.exit_code == 0 and "replaced the rm_qdrant entry" in result.output
    props = {p.key: p.value for p in onnx.load(str(second)).metadata_props}
    assert len(onnx.load(str(second)).metadata_props) == 2 and props["producer_note"] == "kept"
    assert OnnxEncoder(second).info.input.resize is None  # the new entry, not the old one


def test_json_report_and_python_api(team_graph, tmp_path):
    result = stamp(team_graph, "--out", tmp_path / "a.onnx", *TEAM_FLAGS, *NORM_FLAGS, "--json")
    report = json.loads(result.output)
    assert report["outputs"] == {
        "embedding": {"graph_output": "image_embeds", "dim": 24, "from": "static shape, checked by a run"}
    }
    assert report["input"]["name"] == "pixel_values" and report["input"]["crop"] == 32
    assert report["replaced"] is False
    same = stamp_model(
        team_graph, tmp_path / "b.onnx", outputs={"embedding": "image_embeds"}, size=32, resize=36, crop=32,
        mean=MEAN.tolist(), std=STD.tolist(),
    )  # fmt: skip
    assert same.info.input.layout == "NCHW" and same.info.input.dtype == "float32"  # read from the graph
    entry = json.loads(onnx.load(str(tmp_path / "b.onnx")).metadata_props[0].value)
    assert entry["output_names"] == {"embedding": "image_embeds"} and entry["format"] == 2


def fixed_batch_graph(path: Path, batch: int | None, weights: np.ndarray, *, shaped: bool = True) -> Path:
    """float NCHW 3x8x8 → Flatten → MatMul → 'feat'; the batch axis fixed at ``batch`` (None: dynamic)."""
    dim = batch if batch is not None else "N"
    nodes = [
        helper.make_node("Flatten", ["x"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["feat"]),
    ]
    out_shape = [dim, weights.shape[1]] if shaped else None
    graph = helper.make_graph(
        nodes,
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3, 8, 8])],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(weights.astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("batch", [1, 4])
def test_fixed_batch_graph_encodes_seven_images(tmp_path, batch):
    weights = np.random.default_rng(batch).normal(size=(192, 5))
    graph = fixed_batch_graph(tmp_path / "fixed.onnx", batch, weights)
    out = tmp_path / "stamped.onnx"
    result = stamp(graph, "--out", out, "--output", "embedding=feat", "--input-size", "8")
    assert result.exit_code == 0, result.output
    images = np.random.default_rng(9).integers(0, 256, size=(7, 8, 8, 3), dtype=np.uint8)
    encoder = OnnxEncoder(out, batch_size=3)
    assert encoder.fixed_batch == batch
    got = encoder.encode(images)["embedding"]
    expected = (images.transpose(0, 3, 1, 2).reshape(7, -1) / 255.0) @ weights
    assert got.shape == (7, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_dims_are_measured_when_the_graph_does_not_say(tmp_path):
    weights = np.ones((192, 6))
    graph = fixed_batch_graph(tmp_path / "unshaped.onnx", 2, weights, shaped=False)
    report = stamp_model(graph, tmp_path / "out.onnx", outputs={"embedding": "feat"}, size=8)
    assert report.info.outputs == {"embedding": 6}
    assert report.dims_from == {"embedding": "measured on a zero input"}


def two_input_graph(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["feat"])],
        "two",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3, 8, 8]) for n in ("a", "b")],
        [helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", 3, 8, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


REFUSALS = [
    (["--output", "logits=image_embeds", "--input-size", "32"], "unknown role 'logits'"),
    (["--output", "embedding=nope", "--input-size", "32"], "has no output 'nope'"),
    (["--output", "embedding", "--input-size", "32"], "expected ROLE=GRAPH_OUTPUT"),
    (TEAM_FLAGS + ["--output", "embedding=image_embeds"], "role 'embedding' is given twice"),
    (["--output", "scores=image_embeds", "--input-size", "32"], "needs a 'new' or an 'embedding' output"),
    (TEAM_FLAGS + ["--mean", "0.5,0.5", "--std", "0.2,0.2,0.2"], "input.mean needs one value per channel"),
    (TEAM_FLAGS + ["--std", "0.2,0,0.2"], "input.std values must be > 0"),
    (TEAM_FLAGS + ["--std", "-1,1,1"], "input.std values must be > 0"),
    (TEAM_FLAGS + ["--mean", "a,b,c"], "bad --mean 'a,b,c'"),
    (
        ["--output", "embedding=image_embeds", "--input-size", "32", "--resize", "30", "--crop", "32"],
        "input.crop (32) must not exceed input.resize (30)",
    ),  # fmt: skip
    (["--output", "embedding=image_embeds", "--input-size", "32", "--resize", "36"], "go together"),
    (
        ["--output", "embedding=image_embeds", "--input-size", "32", "--resize", "36", "--crop", "30"],
        "must equal input.height and input.width",
    ),  # fmt: skip
    (["--output", "embedding=image_embeds", "--input-size", "256"], "needs [N, 3, 256, 256]"),
    (
        ["--output", "embedding=image_embeds", "--input-size", "32", "--input-layout", "NHWC"],
        "needs [N, 32, 32, 3]",
    ),  # fmt: skip
    (
        ["--output", "embedding=image_embeds", "--input-size", "32", "--input-dtype", "uint8"],
        "takes float32, not uint8",
    ),  # fmt: skip
    (["--output", "embedding=image_embeds", "--input-size", "100000"], "up to 8192"),
]


@pytest.mark.parametrize(("flags", "message"), REFUSALS)
def test_refusals_are_one_line(team_graph, tmp_path, flags, message):
    out = tmp_path / "out.onnx"
    result = stamp(team_graph, "--out", out, *flags)
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert message in result.output
    assert not out.exists() and not list(tmp_path.iterdir())


def test_graphs_that_cannot_be_stamped(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"no protobuf here")
    for source, message in [
        (two_input_graph(tmp_path / "two.onnx"), "has 2 inputs (a, b)"),
        (junk, "not a loadable ONNX graph"),
        (tmp_path / "missing.onnx", "cannot read"),
    ]:
        result = stamp(
            source, "--out", tmp_path / "o.onnx", "--output", "embedding=feat", "--input-size", "8"
        )
        assert result.exit_code == 1 and result.output.count("\n") == 1 and message in result.output


def test_output_roles_parser():
    assert parse_output_roles(["new = n", "rev=r"]) == {"new": "n", "rev": "r"}
    with pytest.raises(Exception, match="at least one"):
        parse_output_roles([])


def test_a_stamped_graph_without_its_output_is_an_encoder_error(team_graph, tmp_path):
    """Metadata that maps a role to an output the graph lacks fails on load, not on first use."""
    model = onnx.load(str(team_graph))
    entry = {"outputs": {"embedding": 24}, "output_names": {"embedding": "gone"},
             "input": {"height": 32, "width": 32, "layout": "NCHW", "dtype": "float32"}}  # fmt: skip
    helper.set_model_props(model, {METADATA_KEY: json.dumps(entry)})
    onnx.save(model, str(tmp_path / "m.onnx"))
    with pytest.raises(EncoderError, match="'embedding' as output 'gone'"):
        OnnxEncoder(tmp_path / "m.onnx")


def test_stamp_runs_the_graph_at_the_declared_size_and_wants_one_vector_per_image(tmp_path):
    """A graph with dynamic height and width that only works at 8x8, and one that gives a matrix per image."""
    from onnx import TensorProto, helper, numpy_helper

    def graph(path, out_shape_reshape):
        nodes = [
            helper.make_node("Flatten", ["x"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["y"]),
            helper.make_node("Reshape", ["y", "shape"], ["out"]),
        ]
        inits = [
            numpy_helper.from_array(np.ones((3 * 8 * 8, 12), np.float32), "W"),
            numpy_helper.from_array(np.array(out_shape_reshape, np.int64), "shape"),
        ]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
        out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
        model = helper.make_model(
            helper.make_graph(nodes, "g", [x], [out], inits), opset_imports=[helper.make_opsetid("", 17)]
        )
        model.ir_version = 8
        onnx.save(model, str(path))
        return path

    only_8 = graph(tmp_path / "only8.onnx", [-1, 12])
    with pytest.raises(ConfigError, match="does not run on a 224x224 NCHW float32 input"):
        stamp_model(only_8, tmp_path / "a.onnx", outputs={"embedding": "out"}, size=224)
    assert stamp_model(only_8, tmp_path / "b.onnx", outputs={"embedding": "out"}, size=8).info.outputs == {
        "embedding": 12
    }
    matrix = graph(tmp_path / "matrix.onnx", [-1, 3, 4])
    with pytest.raises(ConfigError, match=r"gives \(3, 4\) values per image, not one vector"):
        stamp_model(matrix, tmp_path / "c.onnx", outputs={"embedding": "out"}, size=8)
    # No row per image: squeezed to one vector for the whole batch, or transposed (dim, batch).
    # Both were stamped "1-d" (found by an adversarial run); rmq index then failed on them.
    for name, reshape in (("squeezed", [-1]), ("transposed", [12, -1])):
        rowless = graph(tmp_path / f"{name}.onnx", reshape)
        with pytest.raises(ConfigError, match=r"needs one row per image, \(batch, dim\)"):
            stamp_model(rowless, tmp_path / f"{name}-out.onnx", outputs={"embedding": "out"}, size=8)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(EncoderError, match="not an ONNX graph"):
        stamp_model(empty, tmp_path / "d.onnx", outputs={"embedding": "out"}, size=8)
