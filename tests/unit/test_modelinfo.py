from __future__ import annotations

import json

import pytest

from rm_qdrant import EncoderError, InputSpec, ModelInfo
from rm_qdrant.modelinfo import METADATA_KEY, parse_metadata


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
