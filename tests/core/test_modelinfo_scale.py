"""The metadata's optional distance and output scale: what a graph promises about its vectors."""

from __future__ import annotations

import json

import pytest

from rm_qdrant import EncoderError, InputSpec, ModelInfo
from rm_qdrant.core.modelinfo import METADATA_KEY, parse_metadata


def meta(**fields):
    body = {"model_name": "m", "outputs": {"embedding": 8}, "input": {"height": 8, "width": 8}, **fields}
    return {METADATA_KEY: json.dumps(body)}


def test_a_graph_stamped_without_a_distance_serves_any_distance():
    info = parse_metadata(meta(), ["embedding"])
    assert info.distance is None
    assert all(info.serves(d) for d in ("cosine", "dot", "euclid", "manhattan"))
    body = json.loads(info.to_metadata()[METADATA_KEY])
    assert "distance" not in body and parse_metadata(info.to_metadata(), ["embedding"]) == info


def test_a_stated_distance_is_still_a_promise():
    info = parse_metadata(meta(distance="cosine"), ["embedding"])
    assert info.serves("cosine") and not info.serves("euclid")


@pytest.mark.parametrize("scale", ["unit", "raw"])
def test_the_output_scale_round_trips(scale):
    info = ModelInfo("m", "euclid", {"embedding": 8}, InputSpec(8, 8), scale=scale)
    body = json.loads(info.to_metadata()[METADATA_KEY])
    assert body["scale"] == scale
    parsed = parse_metadata(info.to_metadata(), ["embedding"])
    assert (parsed.scale, parsed.distance) == (scale, "euclid")


def test_a_graph_without_a_scale_keeps_what_it_did():
    info = parse_metadata(meta(distance="cosine"), ["embedding"])
    assert info.scale is None and "scale" not in json.loads(info.to_metadata()[METADATA_KEY])
    # Derived graphs (rmq fit, rmq export --new-onnx): a cosine graph's heads were L2-normalised
    # and still are; a Euclid or dot backbone's vectors, or one of any distance, are kept as they are.
    assert info.derived_scale() == "unit"
    assert parse_metadata(meta(distance="euclid"), ["embedding"]).derived_scale() is None
    anywhere = parse_metadata(meta(), ["embedding"])
    assert anywhere.derived_scale() is None and anywhere.derived_scale("euclid") is None
    assert anywhere.derived_scale("cosine") == "unit"  # rmq fit for a cosine pair: as before
    assert parse_metadata(meta(distance="cosine", scale="raw"), ["embedding"]).derived_scale() == "raw"
    assert parse_metadata(meta(distance="euclid", scale="unit"), ["embedding"]).derived_scale() == "unit"


@pytest.mark.parametrize("scale", ["normalised", 1, None])
def test_a_bad_scale_is_one_clear_error(scale):
    with pytest.raises(EncoderError, match="scale must be one of unit, raw"):
        parse_metadata(meta(scale=scale), ["embedding"])
