from __future__ import annotations

import json
import re

import pytest

from rm_qdrant import EncoderError, InputSpec, ModelInfo
from rm_qdrant.core.modelinfo import METADATA_KEY, check_input_shape, parse_metadata


def meta(**overrides):
    body = {
        "model_name": "m",
        "distance": "cosine",
        "outputs": {"new": 8, "rev": 4},
        "input": {"height": 32, "width": 32},
    }
    body.update(overrides)
    return {METADATA_KEY: json.dumps(body)}


def test_round_trip_through_metadata():
    info = ModelInfo(
        "m", "dot", {"embedding": 16, "scores": 5}, InputSpec(28, 28, 1, "NCHW", "float32", (0.5,), (0.25,))
    )
    parsed = parse_metadata(info.to_metadata(), ["embedding", "scores"])
    assert parsed == info
    assert parsed.gallery_output() == "embedding"
    assert parsed.query_modes == ()


def test_rm_graph_is_recognised():
    info = parse_metadata(meta(), ["new", "rev"])
    assert info.query_modes == ("rm",)
    assert info.gallery_output() == "new"
    assert info.input.mean == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("props", "outputs", "message"),
    [
        ({}, ["new"], "no 'rm_qdrant' metadata entry"),
        ({METADATA_KEY: "{not json"}, ["new"], "not valid JSON"),
        (meta(outputs={"new": 8, "rev": 4}), ["new"], "lists output 'rev'"),
        (meta(outputs={"rev": 4}), ["rev"], "needs a 'new' or an 'embedding' output"),
        (meta(outputs={"logits": 4}), ["logits"], "unknown output role"),
        (meta(outputs={"new": 0}), ["new"], "positive integer"),
        (meta(distance="hamming"), ["new", "rev"], "unknown distance"),
        (meta(input={"height": 32}), ["new", "rev"], "input.width"),
        (meta(input={"height": 10**9, "width": 32}), ["new", "rev"], "input.height must be .* up to 8192"),
        (meta(input={"height": 32, "width": 32, "mean": [float("nan")] * 3}), ["new", "rev"], "finite"),
        (meta(output_names={"new": "n"}), ["new", "rev"], "'new' as output 'n'"),
        ({METADATA_KEY: "[]"}, ["new"], "must be a JSON object, got an array"),
        (meta(input={"height": 8, "width": 8, "layout": "HWC"}), ["new", "rev"], "input.layout"),
        (
            meta(input={"height": 8, "width": 8, "channels": 3, "mean": [0.5]}),
            ["new", "rev"],
            "one value per channel",
        ),
    ],
)
def test_malformed_metadata_is_one_clear_error(props, outputs, message):
    with pytest.raises(EncoderError, match=message):
        parse_metadata(props, outputs)


def test_format_2_round_trip_with_output_names_and_crop():
    spec = InputSpec(224, 224, 3, "NCHW", "float32", (0.4, 0.5, 0.6), (0.2, 0.2, 0.2), 256, 224, "BGR")
    info = ModelInfo("team", "cosine", {"embedding": 512}, spec, output_names={"embedding": "image_embeds"})
    body = json.loads(info.to_metadata()[METADATA_KEY])
    assert body["format"] == 2 and body["output_names"] == {"embedding": "image_embeds"}
    assert body["input"]["resize"] == 256 and body["input"]["channel_order"] == "BGR"
    parsed = parse_metadata(info.to_metadata(), ["image_embeds"])
    assert parsed == info and parsed.graph_output("embedding") == "image_embeds"


def test_format_1_roles_are_output_names():
    info = parse_metadata(meta(format=1), ["new", "rev"])
    assert info.output_names == {"new": "new", "rev": "rev"}
    assert (info.input.resize, info.input.crop, info.input.channel_order) == (None, None, "RGB")


@pytest.mark.parametrize(
    ("shape", "spec", "result"),
    [
        (["N", 3, 32, 32], InputSpec(32, 32, 3, "NCHW"), None),
        ([4, 32, 32, 3], InputSpec(32, 32, 3, "NHWC"), 4),
        ([None, None, None, 3], InputSpec(99, 7, 3, "NHWC"), None),
        ([1, 3, 224, 224], InputSpec(256, 256, 3, "NCHW"), "needs [N, 3, 256, 256]"),
        ([1, 3, 224, 224], InputSpec(224, 224, 3, "NHWC"), "needs [N, 224, 224, 3]"),
        (["N", 3, 32], InputSpec(32, 32, 3, "NCHW"), "4-D image input"),
    ],
)
def test_static_input_shape_against_the_spec(shape, spec, result):
    if isinstance(result, str):
        with pytest.raises(EncoderError, match=re.escape(result)):
            check_input_shape(spec, shape, "g.onnx")
    else:
        assert check_input_shape(spec, shape, "g.onnx") == result
