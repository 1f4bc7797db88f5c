"""Model facts that travel inside an ONNX graph's metadata (pure: no ONNX, no I/O).

An rm-qdrant encoder carries one metadata entry, key ``rm_qdrant``, whose value
is JSON (``rmq model stamp`` writes it for any graph)::

    {"format": 2,
     "model_name": "team-vit",
     "distance": "cosine",
     "scale": "unit",
     "outputs": {"embedding": 512},
     "output_names": {"embedding": "image_embeds"},
     "input": {"layout": "NCHW", "dtype": "float32", "height": 224, "width": 224,
               "channels": 3, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
               "resize": 256, "crop": 224, "channel_order": "RGB", "interpolation": "bicubic"}}

``outputs`` maps each role rm-qdrant reads to its dimension: ``new`` (ρ^new, for the
new collection), ``rev`` (ψ(ρ^new), for the old collection), ``embedding`` (a
single-model graph: an old model, or a new model used in the naive mode) and
``scores`` (the old classifier's confidence, optional). ``output_names`` maps a
role to the graph's own output name; a role it leaves out is the output's name
(format 1 has no ``output_names``: every role is an output name).

``distance`` is optional: without it the graph serves a collection of any distance
(the collection's own metric decides, and ``rmq model check`` / ``rmq switch-encoder``
compare under it); with it, it is a promise that ``rmq init`` checks. ``scale`` is
optional too: ``unit`` when every vector the graph gives is L2-normalised, ``raw`` when
their norms carry meaning (a Euclid or dot collection of the model's own vectors);
it speaks of the vector outputs (``new``, ``rev``, ``embedding``), not ``scores``.
Without it the graph gives whatever it gives, as graphs stamped before it did. Graphs
rm-qdrant derives from a backbone (``rmq fit``, ``rmq export --new-onnx``) keep its
scale (:meth:`ModelInfo.derived_scale`) and its distance.

``input.dtype`` ``uint8`` feeds raw pixels (normalisation is inside the graph);
``float32`` feeds ``(pixel / 255 - mean) / std``, with mean and std in
``channel_order``. Without ``resize`` an image is resized straight to height × width;
with it, its shorter side becomes ``resize`` and a square ``crop`` is taken from the
centre, as torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` do. Every resize uses
Pillow's ``interpolation`` filter (absent: ``bilinear``; see
:mod:`rm_qdrant.core.inputspec`, which reads the ``input`` object).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rm_qdrant.core.inputspec import InputSpec, choice, clip, int_in, is_int, parse_input, show
from rm_qdrant.core.inputspec import check_input_shape as check_input_shape  # re-exported
from rm_qdrant.core.inputspec import parse_floats as parse_floats  # re-exported
from rm_qdrant.core.merge import check_distance
from rm_qdrant.core.textspec import TOKENIZER_KEY, TextSpec, is_text_input, parse_text_input
from rm_qdrant.errors import ConfigError, EncoderError

METADATA_KEY = "rm_qdrant"
ROLES = ("new", "rev", "embedding", "scores")
FORMATS = (1, 2)
#: ``unit``: every vector is L2-normalised; ``raw``: the vectors' norms carry meaning.
SCALES = ("unit", "raw")
#: The largest output dimension a graph may declare.
MAX_OUTPUT_DIM = 1 << 20
#: The longest metadata entry read (a graph's description, not its weights).
MAX_METADATA_CHARS = 1 << 20


@dataclass(frozen=True)
class ModelInfo:
    """What an encoder graph says about itself.

    Attributes:
        name: A human-readable model name.
        distance: The distance its vectors are meant for (``cosine``, ...), or None:
            any (the collection's own).
        outputs: Role → vector dimension, for the roles in :data:`ROLES`.
        input: Preprocessing facts.
        fingerprint: A hash of the graph file, set when the graph is loaded.
        output_names: Role → the graph's output name; filled in for every role
            (a role not given is its own output name).
        scale: ``unit`` (L2-normalised vectors), ``raw`` (norms carry meaning), or
            None: not stated (the graph gives what it gives).
    """

    name: str
    distance: str | None
    outputs: Mapping[str, int]
    input: InputSpec | TextSpec
    fingerprint: str = field(default="", compare=False)
    output_names: Mapping[str, str] = field(default_factory=dict, kw_only=True)
    scale: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        names = {role: self.output_names.get(role, role) for role in self.outputs}
        object.__setattr__(self, "output_names", names)

    def serves(self, distance: str) -> bool:
        """Whether the graph's vectors are meant for a collection of ``distance``."""
        return self.distance is None or self.distance == distance

    def derived_scale(self, collection: str | None = None) -> str | None:
        """The scale of a graph derived from this one (heads on its embedding): its own.

        Of unstated scale, its heads are L2-normalised for cosine (as rm-qdrant always did:
        a cosine collection stores unit vectors), the graph's distance or else the
        ``collection``'s it will serve; for any other distance, or none known, the derived
        vectors are left as the backbone makes them (None: not stated either).
        """
        if self.scale is None and (self.distance or collection) == "cosine":
            return "unit"
        return self.scale

    @property
    def modality(self) -> str:
        """``image`` or ``text``: what the graph reads."""
        return self.input.modality

    @property
    def items(self) -> str:
        """What the graph reads, for messages: ``images`` or ``text``."""
        return items_of(self.modality)

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

    def graph_output(self, role: str) -> str:
        """The graph's name for the output that plays ``role``.

        Raises:
            EncoderError: the model has no such role.
        """
        if role not in self.output_names:
            raise EncoderError(f"model {self.name!r} has no {role!r} output; it has {sorted(self.outputs)}")
        return self.output_names[role]

    def to_metadata(self) -> dict[str, str]:
        """The ``metadata_props`` entry that describes this model."""
        body: dict[str, Any] = {
            "format": 2,
            "model_name": self.name,
            "outputs": dict(self.outputs),
            "output_names": dict(self.output_names),
            "input": self.input.to_json(),
        }
        if self.distance is not None:
            body["distance"] = self.distance
        if self.scale is not None:
            body["scale"] = self.scale
        entry = {METADATA_KEY: json.dumps(body, sort_keys=True)}
        if isinstance(self.input, TextSpec):
            entry[TOKENIZER_KEY] = self.input.tokenizer
        return entry


def items_of(modality: str) -> str:
    """A modality as messages say it: ``images`` or ``text``."""
    return "images" if modality == "image" else modality


def parse_metadata(
    props: Mapping[str, str], graph_outputs: Sequence[str], *, source: str = "encoder"
) -> ModelInfo:
    """Read :class:`ModelInfo` from a graph's metadata and check it against the graph.

    Reads format 1 (roles are output names) and format 2 (``output_names``).

    Raises:
        EncoderError: the entry is missing or malformed (one line, whatever its
            content), or names outputs the graph lacks.
    """
    text = props.get(METADATA_KEY)
    if text is None:
        raise EncoderError(
            f"{source} has no '{METADATA_KEY}' metadata entry; describe the graph with "
            "'rmq model stamp' (see rm_qdrant.core.modelinfo)"
        )
    if len(text) > MAX_METADATA_CHARS:
        raise EncoderError(f"{source}: '{METADATA_KEY}' metadata is {len(text):,} characters, over 1 MiB")
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer of 5,000 digits
        raise EncoderError(
            f"{source}: '{METADATA_KEY}' metadata is not valid JSON: {clip(str(exc))}"
        ) from exc
    try:
        return _parse_body(raw, list(graph_outputs), source, props.get(TOKENIZER_KEY))
    except EncoderError as exc:
        raise EncoderError(f"{source}: {exc}") from exc
    except ConfigError as exc:  # an unknown distance
        raise EncoderError(f"{source}: {exc}") from exc


def _parse_body(raw: Any, graph_outputs: list[str], source: str, tokenizer: str | None) -> ModelInfo:
    if not isinstance(raw, dict):
        kind = {list: "an array", str: "a string", type(None): "null"}.get(type(raw), "a number")
        raise EncoderError(f"metadata must be a JSON object, got {kind}")
    fmt = raw.get("format", 1)
    if not is_int(fmt) or fmt not in FORMATS:
        raise EncoderError(f"unsupported metadata format {show(fmt)}; this rm-qdrant reads {FORMATS}")
    outputs, names = _parse_outputs(raw.get("outputs"), raw.get("output_names"), graph_outputs)
    distance = raw.get("distance")  # absent: any distance (the collection's)
    name = raw.get("model_name", source)
    if "distance" in raw and not isinstance(distance, str):
        raise EncoderError(f"distance must be a string, got {show(distance)}")
    if not isinstance(name, str):
        raise EncoderError(f"model_name must be a string, got {show(name)}")
    scale = choice(raw["scale"], "scale", SCALES) if "scale" in raw else None
    given = raw.get("input")
    spec = parse_text_input(given, tokenizer) if is_text_input(given) else parse_input(given)
    return ModelInfo(
        name,
        None if distance is None else check_distance(distance),
        outputs,
        spec,
        output_names=names,
        scale=scale,
    )


def _parse_outputs(raw: Any, raw_names: Any, graph_outputs: list[str]) -> tuple[dict, dict]:
    if not isinstance(raw, dict) or not raw:
        raise EncoderError("metadata needs an 'outputs' object (role -> dimension)")
    given = {} if raw_names is None else raw_names
    if not isinstance(given, dict):
        raise EncoderError(f"'output_names' must be an object (role -> graph output), got {show(given)}")
    if extra := sorted(set(given) - set(raw)):
        raise EncoderError(f"'output_names' maps {extra[0]!r}, which 'outputs' lacks")
    outputs, names = {}, {}
    for role, dim in raw.items():
        if role not in ROLES:
            raise EncoderError(f"unknown output role {show(role)}; expected {ROLES}")
        name = given.get(role, role)
        if not isinstance(name, str) or not name:
            raise EncoderError(f"output_names[{role!r}] must be a graph output name, got {show(name)}")
        if name not in graph_outputs:
            what = f"output {role!r}" if name == role else f"{role!r} as output {name!r}"
            raise EncoderError(f"metadata lists {what}, graph has {graph_outputs}")
        outputs[role] = int_in(dim, f"dimension of output {role!r}", MAX_OUTPUT_DIM)
        names[role] = name
    if len(set(names.values())) != len(names):
        raise EncoderError(f"two roles name the same graph output: {names}")
    if not ({"new", "embedding"} & set(outputs)):
        raise EncoderError(f"needs a 'new' or an 'embedding' output, has {sorted(outputs)}")
    return outputs, names
