"""Describe any ONNX image encoder for rm-qdrant: add the ``rm_qdrant`` metadata entry, change nothing else.

A team's own graph keeps its output names (``image_embeds``, ``pooler_output``, ...):
the entry maps rm-qdrant's roles to them, and says how images are prepared
(size, shorter-side resize and centre crop, the resize's Pillow filter, layout, dtype,
normalisation, channel order). The graph itself is written back byte for byte apart from ``metadata_props``.

Example:
    >>> stamp_model("vit.onnx", "vit-rmq.onnx", outputs={"embedding": "image_embeds"},
    ...             size=224, resize=256, crop=224, mean=(0.485, 0.456, 0.406),
    ...             std=(0.229, 0.224, 0.225))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from rm_qdrant.core.modelinfo import (
    METADATA_KEY,
    ROLES,
    InputSpec,
    ModelInfo,
    check_input_shape,
    parse_metadata,
)
from rm_qdrant.errors import ConfigError, EncoderError
from rm_qdrant.models.encoder import refuse_external_data
from rm_qdrant.models.text import load_encoder

#: ONNX element types rm-qdrant can feed, by the metadata's ``input.dtype`` name.
INPUT_TYPES = {TensorProto.FLOAT: "float32", TensorProto.UINT8: "uint8"}
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


@dataclass(frozen=True)
class StampReport:
    """What :func:`stamp_model` wrote.

    Attributes:
        source: The graph read.
        out: The graph written.
        info: The description stamped into it (roles, graph output names, dims, input).
        input_name: The graph's image input.
        dims_from: Role → where its dimension came from: ``"static shape"`` or ``"measured on a zero input"``.
        replaced: The source already had an ``rm_qdrant`` entry, now overwritten.
    """

    source: Path
    out: Path
    info: ModelInfo
    input_name: str
    dims_from: Mapping[str, str]
    replaced: bool


def parse_output_roles(items: Iterable[str]) -> dict[str, str]:
    """Read ``ROLE=GRAPH_OUTPUT`` strings (``rmq model stamp --output``) into role → graph output.

    >>> parse_output_roles(["embedding=image_embeds"])
    {'embedding': 'image_embeds'}

    Raises:
        ConfigError: a malformed item, an unknown role, a role given twice, or no item.
    """
    roles: dict[str, str] = {}
    for item in items:
        role, sep, name = item.partition("=")
        role, name = role.strip(), name.strip()
        if not sep or not role or not name:
            raise ConfigError(
                f"bad --output {item!r}: expected ROLE=GRAPH_OUTPUT, e.g. embedding=image_embeds"
            )
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r} in --output {item!r}; roles are {', '.join(ROLES)}")
        if role in roles:
            raise ConfigError(f"role {role!r} is given twice (--output {role}={roles[role]} and {item})")
        roles[role] = name
    if not roles:
        raise ConfigError("give at least one --output ROLE=GRAPH_OUTPUT, e.g. embedding=image_embeds")
    return roles


def stamp_model(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    outputs: Mapping[str, str],
    size: int,
    layout: str | None = None,
    dtype: str | None = None,
    resize: int | None = None,
    crop: int | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    channel_order: str = "RGB",
    interpolation: str = "bilinear",
    orientation: str = "ignore",
    distance: str | None = None,
    scale: str | None = None,
    name: str | None = None,
) -> StampReport:
    """Write ``source`` to ``out`` with an ``rm_qdrant`` metadata entry that describes it.

    Args:
        source: Any ONNX graph with one image input.
        out: Where the stamped graph goes (may be ``source``).
        outputs: Role (``embedding``, ``new``, ``rev``, ``scores``) → the graph's output name.
        size: Input height = width.
        layout: ``NCHW`` or ``NHWC``; by default read from the input's static shape (else NCHW).
        dtype: ``float32`` or ``uint8``; by default the input's element type.
        resize: The shorter side before the centre crop (torchvision ``Resize(resize)``).
        crop: The centre crop's side (torchvision ``CenterCrop(crop)``); equals ``size``.
        mean: Per-channel mean for ``float32`` input (in ``channel_order``); default none.
        std: Per-channel std for ``float32`` input; default none.
        channel_order: ``RGB`` or ``BGR``.
        interpolation: The Pillow filter of every resize, as the team's pipeline uses it:
            ``nearest``, ``bilinear`` (default), ``bicubic``, ``lanczos``, ``box`` or
            ``hamming`` (``Image.resize`` with ``Image.Resampling.<NAME>``, antialiased
            when shrinking, except ``nearest``).
        orientation: ``ignore`` the EXIF orientation tag (default: what ``Image.open``
            and torchvision's ``default_loader`` do) or turn each photo as it says
            (``exif``: the team's pipeline calls ``ImageOps.exif_transpose``).
        distance: The distance the vectors are meant for; None (default): any, the
            collection's own (checked there by ``rmq model check``).
        scale: ``unit`` (every vector L2-normalised: checked on random images), ``raw``
            (the norms carry meaning, as in a Euclid or dot collection of the model's
            own vectors), or None: not stated.
        name: The model's name; default the file's stem.

    Raises:
        ConfigError: options that do not fit the graph or each other (one line each).
        EncoderError: the graph cannot be read or run.
    """
    source, out = Path(source), Path(out)
    model = _load(source)
    image = _image_input(model, source)
    shape = _static_shape(image) or [None] * 4
    spec = InputSpec(
        height=size,
        width=size,
        channels=_channels(shape, layout or _guess_layout(shape)),
        layout=layout or _guess_layout(shape),
        dtype=_dtype(image, dtype, source),
        mean=tuple(mean or ()),
        std=tuple(std or ()),
        resize=resize,
        crop=crop,
        channel_order=channel_order,
        interpolation=interpolation,
        orientation=orientation,
    )
    if spec.dtype == "uint8" and (spec.mean or spec.std):
        raise ConfigError("mean and std apply to float32 input; a uint8 graph normalises inside itself")
    graph_outputs = {o.name: o for o in model.graph.output}
    _check_roles(outputs, graph_outputs, source)
    draft = ModelInfo(
        name or source.stem, distance, dict.fromkeys(outputs, 1), spec, output_names=outputs, scale=scale
    )
    probe = _validate(draft, list(graph_outputs), source)  # as the encoder will read it: defaults filled in
    spec = probe.input
    try:
        batch = check_input_shape(spec, shape, f"{source}: input {image.name!r}")
    except EncoderError as exc:
        raise ConfigError(str(exc)) from exc
    session = _session(model, source)
    dims, dims_from = _dims(session, image.name, spec, batch or 1, outputs, graph_outputs, source)
    if probe.scale == "unit":
        _check_unit(session, image.name, spec, batch or 2, outputs, source)
    info = dataclasses.replace(probe, outputs=dims)
    replaced = _set_entry(model, info.to_metadata()[METADATA_KEY])
    _write(model, out)
    return StampReport(source, out, info, image.name, dims_from, replaced)


def _load(source: Path) -> onnx.ModelProto:
    if not source.is_file():
        raise ConfigError(f"cannot read {source}: no such file")
    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise EncoderError(f"{source} is not a loadable ONNX graph: {type(exc).__name__}: {exc}") from exc
    if not model.graph.node:
        raise EncoderError(f"{source} is not an ONNX graph (it holds no operations)")
    refuse_external_data(model, str(source), ConfigError)
    return model


def _image_input(model: onnx.ModelProto, source: Path) -> onnx.ValueInfoProto:
    weights = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs) or "none"
        raise ConfigError(f"{source} has {len(inputs)} inputs ({names}); rm-qdrant feeds one image input")
    return inputs[0]


def _static_shape(value: onnx.ValueInfoProto) -> list[int | None] | None:
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]


def _guess_layout(shape: Sequence[int | None]) -> str:
    """NHWC when the static shape has its channels last, else NCHW (the usual PyTorch export)."""
    if len(shape) == 4 and shape[3] in (1, 3) and shape[1] not in (1, 3):
        return "NHWC"
    return "NCHW"


def _channels(shape: Sequence[int | None], layout: str) -> int:
    """The static channel count when it is 1 or 3, else 3 (a contradiction is refused later)."""
    if len(shape) != 4:
        return 3
    channels = shape[1 if layout == "NCHW" else 3]
    return channels if channels in (1, 3) else 3  # type: ignore[return-value]


def _dtype(image: onnx.ValueInfoProto, given: str | None, source: Path) -> str:
    elem = image.type.tensor_type.elem_type
    graph_dtype = INPUT_TYPES.get(elem)
    if graph_dtype is None:
        kind = TensorProto.DataType.Name(elem) if elem else "not a tensor"
        raise ConfigError(f"{source}: input {image.name!r} is {kind}; rm-qdrant feeds float32 or uint8")
    if given is not None and given != graph_dtype:
        raise ConfigError(f"{source}: input {image.name!r} takes {graph_dtype}, not {given}")
    return graph_dtype


def _check_roles(
    outputs: Mapping[str, str], graph_outputs: Mapping[str, onnx.ValueInfoProto], source: Path
) -> None:
    for role, name in outputs.items():
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        if name not in graph_outputs:
            raise ConfigError(f"{source} has no output {name!r}; its outputs: {', '.join(graph_outputs)}")
        elem = graph_outputs[name].type.tensor_type.elem_type
        if elem and elem not in FLOAT_TYPES:
            kind = TensorProto.DataType.Name(elem)
            raise ConfigError(f"{source}: output {name!r} ({role}) is {kind}, not a float vector")


def _validate(info: ModelInfo, graph_outputs: list[str], source: Path) -> ModelInfo:
    """What the encoder would refuse, refused now: the entry goes through the encoder's own parser."""
    try:
        return parse_metadata(info.to_metadata(), graph_outputs, source=str(source))
    except EncoderError as exc:
        raise ConfigError(f"cannot stamp {exc}") from exc


def _dims(
    session: ort.InferenceSession,
    input_name: str,
    spec: InputSpec,
    batch: int,
    outputs: Mapping[str, str],
    graph_outputs: Mapping[str, onnx.ValueInfoProto],
    source: Path,
) -> tuple[dict[str, int], dict[str, str]]:
    """Each role's dimension, from one run of the graph on zeros at the declared input size.

    The run also proves the graph takes that size (a graph with dynamic height and width
    says nothing about it), and that each output is one vector per image.
    """
    names = list(outputs.values())
    shapes = _measure(session, input_name, spec, batch, names, source)
    dims, dims_from = {}, {}
    for (role, name), shape in zip(outputs.items(), shapes, strict=True):
        if sum(s > 1 for s in shape) > 1:
            raise ConfigError(
                f"{source}: output {name!r} ({role}) gives {tuple(shape)} values per image, not one vector: "
                "pool it inside the graph first"
            )
        dims[role] = math.prod(shape)
        static = _static_shape(graph_outputs[name])
        known = static is not None and len(static) >= 2 and all(s is not None for s in static[1:])
        dims_from[role] = "static shape, checked by a run" if known else "measured on a zero input"
    return dims, dims_from


def _session(model: onnx.ModelProto, source: Path) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise EncoderError(f"{source} is not a loadable ONNX graph: {exc}") from exc


def _measure(
    session: ort.InferenceSession,
    input_name: str,
    spec: InputSpec,
    batch: int,
    names: list[str],
    source: Path,
) -> list[list[int]]:
    """Each output's per-image shape on a zero batch of the declared size."""
    zeros = np.zeros(spec.tensor_shape(batch), dtype=spec.dtype)
    try:
        values = session.run(names, {input_name: zeros})
    except Exception as exc:
        raise ConfigError(
            f"{source} does not run on a {spec.height}x{spec.width} {spec.layout} {spec.dtype} input "
            f"(--input-size, --input-layout): {str(exc).splitlines()[0][:200]}"
        ) from exc
    shapes = [np.asarray(v).shape for v in values]
    for name, shape in zip(names, shapes, strict=True):
        if len(shape) < 2 or shape[0] != batch:  # squeezed, transposed, or a fixed count of rows
            raise ConfigError(
                f"{source}: output {name!r} has shape {tuple(shape)} for a batch of {batch}: rm-qdrant "
                "needs one row per image, (batch, dim)"
            )
    return [list(shape[1:]) for shape in shapes]


def _check_unit(
    session: ort.InferenceSession,
    input_name: str,
    spec: InputSpec,
    batch: int,
    outputs: Mapping[str, str],
    source: Path,
) -> None:
    """``--scale unit`` is a promise: the vector outputs of random images must have norm 1."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(batch, spec.height, spec.width, spec.channels))
    tensor = pixels.astype(spec.dtype)
    if spec.dtype == "float32":
        tensor = (tensor / 255.0 - np.asarray(spec.mean)) / np.asarray(spec.std)
    if spec.layout == "NCHW":
        tensor = tensor.transpose(0, 3, 1, 2)
    roles = [role for role in outputs if role != "scores"]
    try:
        values = session.run(
            [outputs[r] for r in roles], {input_name: np.ascontiguousarray(tensor, spec.dtype)}
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise ConfigError(
            f"{source} does not run on random images: {str(exc).splitlines()[0][:200]}"
        ) from exc
    for role, value in zip(roles, values, strict=True):
        norms = np.linalg.norm(np.asarray(value, np.float64).reshape(batch, -1), axis=1)
        if not np.all(np.abs(norms - 1.0) <= 1e-3):
            raise ConfigError(
                f"{source}: --scale unit, but output {outputs[role]!r} ({role}) gives vectors of norm "
                f"{norms.min():.4g} to {norms.max():.4g} on random images, not L2-normalised: "
                "stamp it --scale raw, or leave --scale out"
            )


def _set_entry(model: onnx.ModelProto, text: str) -> bool:
    """Put the entry in ``metadata_props`` (in place of an existing one); True if one was there."""
    found = [i for i, prop in enumerate(model.metadata_props) if prop.key == METADATA_KEY]
    for index in reversed(found[1:]):
        del model.metadata_props[index]
    if found:
        model.metadata_props[found[0]].value = text
    else:
        model.metadata_props.add(key=METADATA_KEY, value=text)
    return bool(found)


def _write(model: onnx.ModelProto, out: Path) -> None:
    """Write through a temporary file, after the encoder has accepted it: no half-stamped graph."""
    partial = out.with_name(f".{out.name}.stamping")
    try:
        partial.write_bytes(model.SerializeToString())
        try:
            load_encoder(partial)
        except EncoderError as exc:
            raise EncoderError(str(exc).replace(str(partial), str(out))) from exc
        os.replace(partial, out)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)
