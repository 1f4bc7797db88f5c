"""Model facts that travel inside an ONNX graph's metadata (pure: no ONNX, no I/O).

An rm-qdrant encoder carries one metadata entry, key ``rm_qdrant``, whose value
is JSON::

    {"format": 1,
     "model_name": "resnet18-new+heads",
     "distance": "cosine",
     "outputs": {"new": 128, "rev": 64},
     "input": {"layout": "NHWC", "dtype": "uint8", "height": 32, "width": 32,
               "channels": 3, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 0.0]}}

``outputs`` maps each graph output that rm-qdrant reads to its dimension. The
output names have fixed roles: ``new`` (ρ^new, for the new collection), ``rev``
(ψ(ρ^new), for the old collection), ``embedding`` (a single-model graph: an old
model, or a new model used in the naive mode) and ``scores`` (the old
classifier's confidence, optional). ``input.dtype`` ``uint8`` feeds raw pixels
(normalisation is inside the graph); ``float32`` feeds ``(pixel / 255 - mean) / std``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rm_qdrant.errors import EncoderError
from rm_qdrant.merge import check_distance

METADATA_KEY = "rm_qdrant"
ROLES = ("new", "rev", "embedding", "scores")


@dataclass(frozen=True)
class InputSpec:
    """How images are laid out and scaled before they enter the graph."""

    height: int
    width: int
    channels: int = 3
    layout: str = "NHWC"
    dtype: str = "uint8"
    #: Per-channel normalisation for ``float32`` input; empty means none.
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelInfo:
    """What an encoder graph says about itself.

    Attributes:
        name: A human-readable model name.
        distance: The distance its vectors are meant for (``cosine``, ...).
        outputs: Output name → vector dimension, for the roles in :data:`ROLES`.
        input: Preprocessing facts.
        fingerprint: A hash of the graph file, set when the graph is loaded.
    """

    name: str
    distance: str
    outputs: Mapping[str, int]
    input: InputSpec
    fingerprint: str = field(default="", compare=False)

    @property
    def query_modes(self) -> tuple[str, ...]:
        """``("rm",)`` for a graph with ``new`` and ``rev`` outputs, else ``()``."""
        return ("rm",) if {"new", "rev"} <= set(self.outputs) else ()

    def gallery_output(self) -> str:
        """The output that embeds gallery images: ``new`` if present, else ``embedding``."""
        for role in ("new", "embedding"):
            if role in self.outputs:
                return role
        raise EncoderError(f"model {self.name!r} has neither a 'new' nor an 'embedding' output")

    def to_metadata(self) -> dict[str, str]:
        """The ``metadata_props`` entry that describes this model."""
        body = {
            "format": 1,
            "model_name": self.name,
            "distance": self.distance,
            "outputs": dict(self.outputs),
            "input": {**asdict(self.input), "mean": list(self.input.mean), "std": list(self.input.std)},
        }
        return {METADATA_KEY: json.dumps(body, sort_keys=True)}


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EncoderError(f"{what} must be a positive integer, got {value!r}")
    return value


def _parse_input(raw: Any) -> InputSpec:
    if not isinstance(raw, Mapping):
        raise EncoderError("metadata 'input' must be an object with height and width")
    channels = _positive_int(raw.get("channels", 3), "input.channels")
    if channels not in (1, 3):
        raise EncoderError(f"input.channels must be 1 or 3, got {channels}")
    layout = raw.get("layout", "NHWC")
    dtype = raw.get("dtype", "uint8")
    if layout not in ("NHWC", "NCHW"):
        raise EncoderError(f"input.layout must be NHWC or NCHW, got {layout!r}")
    if dtype not in ("uint8", "float32"):
        raise EncoderError(f"input.dtype must be uint8 or float32, got {dtype!r}")
    mean = tuple(float(v) for v in raw.get("mean") or [0.0] * channels)
    std = tuple(float(v) for v in raw.get("std") or [1.0] * channels)
    if len(mean) != channels or len(std) != channels or not all(s > 0 for s in std):
        raise EncoderError("input.mean and input.std need one value per channel, std > 0")
    return InputSpec(
        height=_positive_int(raw.get("height"), "input.height"),
        width=_positive_int(raw.get("width"), "input.width"),
        channels=channels,
        layout=layout,
        dtype=dtype,
        mean=mean,
        std=std,
    )


def parse_metadata(
    props: Mapping[str, str], graph_outputs: list[str], *, source: str = "encoder"
) -> ModelInfo:
    """Read :class:`ModelInfo` from a graph's metadata and check it against the graph.

    Raises:
        EncoderError: the entry is missing or malformed, or names outputs the
            graph lacks.
    """
    text = props.get(METADATA_KEY)
    if text is None:
        raise EncoderError(
            f"{source} has no '{METADATA_KEY}' metadata entry; export it with rm-qdrant's "
            "exporters or add the entry (see rm_qdrant.modelinfo)"
        )
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EncoderError(f"{source}: '{METADATA_KEY}' metadata is not valid JSON: {exc}") from exc
    if not isinstance(raw, Mapping) or not isinstance(raw.get("outputs"), Mapping):
        raise EncoderError(f"{source}: metadata needs an 'outputs' object (name -> dimension)")
    outputs = {}
    for name, dim in raw["outputs"].items():
        if name not in ROLES:
            raise EncoderError(f"{source}: unknown output role {name!r}; expected {ROLES}")
        if name not in graph_outputs:
            raise EncoderError(f"{source}: metadata lists output {name!r}, graph has {graph_outputs}")
        outputs[name] = _positive_int(dim, f"dimension of output {name!r}")
    if not ({"new", "embedding"} & set(outputs)):
        raise EncoderError(f"{source} needs a 'new' or an 'embedding' output, has {sorted(outputs)}")
    try:
        distance = check_distance(str(raw.get("distance", "cosine")))
    except Exception as exc:
        raise EncoderError(f"{source}: {exc}") from exc
    return ModelInfo(
        name=str(raw.get("model_name", source)),
        distance=distance,
        outputs=outputs,
        input=_parse_input(raw.get("input")),
    )
