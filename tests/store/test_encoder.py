"""OnnxEncoder on real ONNX graphs run by ONNX Runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from rm_qdrant import EncoderError, OnnxEncoder
from rm_qdrant.modelinfo import METADATA_KEY


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
