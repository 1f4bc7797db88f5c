"""OnnxEncoder on real ONNX graphs run by ONNX Runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rm_qdrant import EncoderError, OnnxEncoder
from rm_qdrant.core.modelinfo import METADATA_KEY


def expected(models, images, matrix):
    flat = np.stack([np.asarray(i, dtype=np.float32).reshape(-1) / 255.0 for i in images])
    return flat @ matrix


def test_two_output_graph_gives_new_and_rev(models, image_folder):
    enc = OnnxEncoder(models.rm)
    files = sorted(image_folder.glob("*/*"))[:5]
    out = enc.encode(files)
    arrays = [np.asarray(Image.open(f).convert("RGB")) for f in files]
    new = expected(models, arrays, models.w_new)
    np.testing.assert_allclose(out["new"], new, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out["rev"], new @ models.w_rev, rtol=1e-4, atol=1e-3)
    assert enc.info.query_modes == ("rm",) and len(enc.fingerprint) == 16


def test_any_image_form_and_batching_give_the_same_vectors(models, image_folder):
    enc = OnnxEncoder(models.old, batch_size=3)
    path = sorted(image_folder.glob("*/*.png"))[0]
    array = np.asarray(Image.open(path).convert("RGB"))
    single = enc.encode(path)["embedding"]
    assert single.shape == (1, 6)
    for form in (str(path), path.read_bytes(), Image.open(path), array):
        np.testing.assert_allclose(enc.encode(form)["embedding"], single, atol=1e-6)
    batch = enc.encode(np.stack([array] * 7))
    assert batch["embedding"].shape == (7, 6) and batch["scores"].shape == (7, 3)
    np.testing.assert_allclose(batch["scores"].sum(axis=1), 1.0, atol=1e-5)


def float_nchw_graph(path, meta):
    """A graph that takes normalised float NCHW input and returns its per-channel means."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["embedding"], keepdims=0)]
    axes = numpy_helper.from_array(np.array([2, 3], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 3])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    if meta is not None:
        helper.set_model_props(model, {METADATA_KEY: json.dumps(meta)})
    onnx.save(model, str(path))
    return path


def test_float_input_is_normalised_from_metadata(tmp_path):
    meta = {
        "outputs": {"embedding": 3},
        "input": {
            "height": 4,
            "width": 4,
            "layout": "NCHW",
            "dtype": "float32",
            "mean": [0.5, 0.5, 0.5],
            "std": [0.5, 0.25, 1.0],
        },
    }
    enc = OnnxEncoder(float_nchw_graph(tmp_path / "f.onnx", meta))
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    image[..., 0] = 255
    np.testing.assert_allclose(enc.encode(image)["embedding"], [[1.0, -2.0, -0.5]], atol=1e-5)


def test_bad_encoders_are_encoder_errors(tmp_path, models):
    with pytest.raises(EncoderError, match="cannot read encoder"):
        OnnxEncoder(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is no protobuf")
    with pytest.raises(EncoderError, match="not a loadable ONNX graph"):
        OnnxEncoder(junk)
    with pytest.raises(EncoderError, match="no 'rm_qdrant' metadata entry"):
        OnnxEncoder(float_nchw_graph(tmp_path / "nometa.onnx", None))
    wrong_dim = {
        "outputs": {"embedding": 5},
        "input": {"height": 4, "width": 4, "layout": "NCHW", "dtype": "float32"},
    }
    enc = OnnxEncoder(float_nchw_graph(tmp_path / "wrongdim.onnx", wrong_dim))
    with pytest.raises(EncoderError, match="metadata says 5"):
        enc.encode(np.zeros((4, 4, 3), dtype=np.uint8))


BASE = {"outputs": {"embedding": 3}, "input": {"height": 4, "width": 4, "layout": "NCHW", "dtype": "float32"}}


def entry(**changes):
    """BASE with top-level keys replaced; ``input_<key>`` replaces one input field."""
    body = {**BASE, "input": dict(BASE["input"])}
    for key, value in changes.items():
        if key.startswith("input_"):
            body["input"][key.removeprefix("input_")] = value
        else:
            body[key] = value
    return json.dumps(body)


HOSTILE = {
    "array": "[1, 2]",
    "string": '"rm_qdrant"',
    "null": "null",
    "number": "42",
    "deep nesting": "[" * 100_000 + "]" * 100_000,
    "5000-digit integer": '{"outputs": {"embedding": 1' + "0" * 5000 + "}}",
    "2 MB entry": json.dumps({**BASE, "model_name": "x" * 2_000_000}),
    "format 99": entry(format=99),
    "outputs a list": entry(outputs=["embedding"]),
    "outputs empty": entry(outputs={}),
    "dim a string": entry(outputs={"embedding": "3"}),
    "dim a bool": entry(outputs={"embedding": True}),
    "dim negative": entry(outputs={"embedding": -3}),
    "dim a float": entry(outputs={"embedding": 3.0}),
    "dim huge": entry(outputs={"embedding": 10**12}),
    "output name a number": entry(output_names={"embedding": 7}),
    "output name missing": entry(output_names={"embedding": "image_embeds"}),
    "output_names a list": entry(output_names=["embedding"]),
    "output_names for a role not in outputs": entry(output_names={"new": "embedding"}),
    "distance a number": entry(distance=5),
    "distance unknown": entry(distance="hamming"),
    "model_name an object": entry(model_name={"a": 1}),
    "input a string": entry(input="224x224"),
    "height 10**9": entry(input_height=10**9, input_width=10**9),
    "height a string": entry(input_height="4"),
    "height a bool": entry(input_height=True),
    "width negative": entry(input_width=-4),
    "height infinite": entry(input_height=float("inf")),
    "channels 4": entry(input_channels=4),
    "layout unknown": entry(input_layout="CHW"),
    "layout a list": entry(input_layout=["NCHW"]),
    "dtype float64": entry(input_dtype="float64"),
    "mean NaN": entry(input_mean=[float("nan"), 0.0, 0.0]),
    "mean a string": entry(input_mean="0.5,0.5,0.5"),
    "mean of bools": entry(input_mean=[True, False, True]),
    "mean too short": entry(input_mean=[0.5]),
    "mean a huge integer": entry(input_mean=[10**400, 0, 0]),
    "std zero": entry(input_std=[0.0, 1.0, 1.0]),
    "std Infinity": entry(input_std=[float("inf"), 1.0, 1.0]),
    "crop over resize": entry(input_resize=4, input_crop=8, input_height=8, input_width=8),
    "resize without crop": entry(input_resize=8),
    "crop not the input size": entry(input_resize=8, input_crop=6),
    "channel order lower case": entry(input_channel_order="bgr"),
    "BGR with one channel": entry(input_channel_order="BGR", input_channels=1),
    "size contradicts the graph": entry(input_height=8, input_width=8),
    "layout contradicts the graph": entry(input_layout="NHWC"),
    "dtype contradicts the graph": entry(input_dtype="uint8"),
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_metadata_is_one_encoder_error(tmp_path, text):
    path = float_nchw_graph(tmp_path / "g.onnx", None)
    model = onnx.load(str(path))
    helper.set_model_props(model, {METADATA_KEY: text})
    onnx.save(model, str(path))
    with pytest.raises(EncoderError) as caught:  # any other exception fails the test
        OnnxEncoder(path)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message


def test_roles_map_to_the_graphs_own_output_names(tmp_path):
    """The graph's output is 'embedding'; stamped as the role 'new', results come back as 'new'."""
    meta = {**BASE, "outputs": {"new": 3, "rev": 3}}
    path = float_nchw_graph(tmp_path / "g.onnx", None)
    model = onnx.load(str(path))
    model.graph.node.append(helper.make_node("Neg", ["embedding"], ["negated"]))
    model.graph.output.append(helper.make_tensor_value_info("negated", TensorProto.FLOAT, ["N", 3]))
    helper.set_model_props(
        model, {METADATA_KEY: json.dumps({**meta, "output_names": {"new": "embedding", "rev": "negated"}})}
    )
    onnx.save(model, str(path))
    enc = OnnxEncoder(path)
    image = np.full((4, 4, 3), 51, dtype=np.uint8)
    out = enc.encode(image)
    assert set(out) == {"new", "rev"} and enc.info.query_modes == ("rm",)
    np.testing.assert_allclose(out["new"], [[0.2, 0.2, 0.2]], atol=1e-6)
    np.testing.assert_allclose(enc.encode([image], ["rev"])["rev"], [[-0.2, -0.2, -0.2]], atol=1e-6)
    with pytest.raises(EncoderError, match="has no 'embedding' output"):
        enc.encode(image, ["embedding"])
