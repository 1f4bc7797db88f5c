"""Attach trained ρ and ψ to a team's own ONNX backbone: still one graph, two outputs.

For teams whose new model is not PyTorch: the heads are exported on their own
(embedding in, ``new`` and ``rev`` out) and joined to the backbone's embedding
output with ``onnx.compose``. The backbone must describe itself (``rmq model stamp``):
its ``embedding`` role names the output the heads read, and its input facts (size,
resize and crop, layout, dtype, normalisation, channel order), its distance and its
output scale become the composed graph's. The heads' outputs are L2-normalised only
where the backbone's are (:meth:`ModelInfo.derived_scale`): a Euclid or dot
collection stores raw vectors, and ``new`` must stay in their space.

A text backbone keeps its tokenizer, window and prefixes; the pooling and normalisation
rm-qdrant's text encoder did outside it go into the graph before the heads
(:mod:`rm_qdrant_exporters.text_pool`).
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import compose, helper
from torch import Tensor, nn

from rm_qdrant.core.modelinfo import METADATA_KEY, InputSpec, ModelInfo, parse_metadata
from rm_qdrant.core.textspec import TextSpec
from rm_qdrant.errors import EncoderError
from rm_qdrant.models.encoder import OnnxEncoder, run_in_chunks
from rm_qdrant.models.text import load_encoder
from rm_qdrant_exporters.serving import TOLERANCE, ExportError, FoldedHeads, checked_write, unit
from rm_qdrant_exporters.text_pool import POOLED, parity_texts, pool_in_graph, pooled_spec, text_embeddings
from rm_qdrant_train.heads import Heads, load_heads

PREFIX = "rmq_heads/"
#: Metadata entry (JSON) saying how ``rmq fit`` made the heads, e.g. ``{"recipe": "label-free/procrustes"}``;
#: apart from the ``rm_qdrant`` entry, so readers of that entry (and graphs without it) are unchanged.
FIT_METADATA_KEY = "rm_qdrant_fit"


class _HeadsGraph(nn.Module):
    def __init__(self, heads: nn.Module, *, normalise: bool) -> None:
        super().__init__()
        self.heads, self.normalise = heads, normalise

    def forward(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        new, rev = self.heads(phi)
        return (unit(new), unit(rev)) if self.normalise else (new, rev)


def _describe(model: onnx.ModelProto, output_name: str | None, source: str) -> tuple[ModelInfo, str]:
    """The backbone's own description, and the output that holds its embedding."""
    props = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in props:
        raise ExportError(
            f"{source} has no rm_qdrant metadata: describe it first with 'rmq model stamp' "
            f"(e.g. rmq model stamp {source} --out stamped.onnx --output embedding=OUTPUT --input-size N "
            "[--resize N --crop N] [--mean a,b,c --std a,b,c]), then export the stamped graph"
        )
    names = [o.name for o in model.graph.output]
    try:
        info = parse_metadata(props, names, source=source)
    except EncoderError as exc:
        raise ExportError(str(exc)) from exc
    if output_name is not None:
        if output_name not in names:
            raise ExportError(f"{source} has no output {output_name!r}; it has {', '.join(names)}")
        return info, output_name
    if "embedding" not in info.outputs:
        raise ExportError(
            f"{source}'s metadata has no 'embedding' role (it has {', '.join(info.outputs)}); "
            "stamp it with --output embedding=OUTPUT, or choose the output with --output-name"
        )
    return info, info.graph_output("embedding")


def _sample_images(spec: InputSpec, n: int) -> list[np.ndarray]:
    """Random RGB images of several sizes, none of them the input size: preprocessing is exercised too."""
    rng = np.random.default_rng(0)
    sizes = [(spec.height + 3 * i + 1, spec.width + 5 * i + 2) for i in range(n)]
    return [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in sizes]


def _embeddings(source: str, embedding: str, images: list[np.ndarray]) -> np.ndarray:
    """φ of ``images`` as rm-qdrant's encoder would feed the backbone (its own metadata's preprocessing)."""
    try:
        encoder = OnnxEncoder(source)
    except EncoderError as exc:
        raise ExportError(str(exc)) from exc
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    tensor = encoder.preprocess(images)
    fixed = encoder.fixed_batch
    name = session.get_inputs()[0].name
    (phi,) = run_in_chunks(
        session, name, [embedding], tensor, chunk=fixed or len(images), fixed=fixed is not None, what=source
    )
    return phi


def _export_heads(graph: nn.Module, phi: np.ndarray, opset: int, tmp: str) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is legacy
        torch.onnx.export(
            graph,
            (torch.from_numpy(phi[:2]),),
            f"{tmp}/heads.onnx",
            input_names=["phi"],
            output_names=["new", "rev"],
            opset_version=max(opset, 13),
            dynamic_axes={"phi": {0: "batch"}, "new": {0: "batch"}, "rev": {0: "batch"}},
            dynamo=False,
        )
    return onnx.load(f"{tmp}/heads.onnx")


def _parity_items(
    source: str, info: ModelInfo, embedding: str, items: Sequence[Any] | None
) -> tuple[list[Any], dict[int, np.ndarray]]:
    """What the parity check feeds both graphs (``items``, else random images of several sizes or
    texts of several lengths), and the backbone's φ of the first one alone and of all of them.

    A text batch is padded to its longest text, so φ of one text is its own run, not a row of
    the batch's: the check then sees whether padding reaches a vector in the composed graph."""
    if not isinstance(info.input, TextSpec):
        images = list(items) if items is not None else _sample_images(info.input, 7)
        phi = _embeddings(source, embedding, images)
        return images, {1: phi[:1], len(images): phi}
    texts = list(items) if items is not None else parity_texts(info.input)
    return texts, {
        count: text_embeddings(source, info, embedding, texts[:count]) for count in (1, len(texts))
    }


def _merge(backbone: onnx.ModelProto, heads: onnx.ModelProto, embedding: str) -> onnx.ModelProto:
    heads.ir_version = backbone.ir_version
    merged = compose.merge_models(
        backbone,
        compose.add_prefix(heads, PREFIX),
        io_map=[(embedding, f"{PREFIX}phi")],
        outputs=[f"{PREFIX}new", f"{PREFIX}rev"],
    )
    merged.graph.node.extend(helper.make_node("Identity", [f"{PREFIX}{o}"], [o]) for o in ("new", "rev"))
    for value in merged.graph.output:
        value.name = value.name.removeprefix(PREFIX)
    del merged.metadata_props[:]
    return merged


def _parity(path: Path, items: list[Any], expected: dict[int, list[np.ndarray]]) -> float:
    """Largest difference between the composed graph, read through rm-qdrant's encoder, and
    backbone + heads (``expected``: batch size → ``new`` and ``rev``), at batch 1 and 7, relative
    to the largest value where that exceeds 1 (raw vectors of norm 100 carry float noise of their
    own size)."""
    encoder = load_encoder(path)
    worst = 0.0
    for count, wanted in expected.items():
        got = encoder.encode(items[:count], ["new", "rev"])
        for want, role in zip(wanted, ("new", "rev"), strict=True):
            if not (np.isfinite(want).all() and np.isfinite(got[role]).all()):
                raise ExportError(f"the heads give NaN or infinity for {role!r}; nothing written")
            size = max(1.0, float(np.abs(want).max()))
            worst = max(worst, float(np.abs(want - got[role]).max()) / size)
    if worst > TOLERANCE:
        raise ExportError(f"composed graph differs from backbone + heads by {worst:.2e} (> {TOLERANCE})")
    return worst


def attach_heads(
    backbone_onnx: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    output_name: str | None = None,
    name: str | None = None,
) -> tuple[Path, float]:
    """Join a heads checkpoint to ``backbone_onnx``'s embedding output: :func:`attach_model`."""
    head_model, _ = load_heads(heads)
    return attach_model(backbone_onnx, head_model, out, output_name=output_name, name=name, what=str(heads))


def attach_model(
    backbone_onnx: str | Path,
    heads: Heads,
    out: str | Path,
    *,
    output_name: str | None = None,
    name: str | None = None,
    what: str = "the heads",
    distance: str | None = None,
    fit: dict[str, object] | None = None,
    parity_items: Sequence[Any] | None = None,
) -> tuple[Path, float]:
    """Join trained heads to ``backbone_onnx``'s embedding output; returns (path, worst parity difference).

    The backbone needs its ``rm_qdrant`` entry (``rmq model stamp``); the heads read
    its ``embedding`` role's output, or ``output_name``. The composed graph keeps the
    backbone's input facts, distance and output scale: its heads L2-normalise only when
    the backbone's vectors are unit length, or of unstated scale for cosine (the
    backbone's distance, else ``distance``, the collection the graph will serve). Parity: images
    go through rm-qdrant's encoder on both sides, the backbone's φ through the heads in
    PyTorch, at batch 1 and 7. ``fit`` (e.g. the winning recipe) goes into the graph's metadata
    as JSON under :data:`FIT_METADATA_KEY`.

    A text backbone (its stamp reads text) gets the pooling and normalisation its encoder did
    outside the graph added to the graph before the heads (:mod:`rm_qdrant_exporters.text_pool`):
    the composed graph keeps its tokenizer, window, truncation and prefixes, and gives one
    vector a text. Parity is checked on ``parity_items`` (texts, or images; default: seven
    texts of several lengths in the tokenizer's words, or random images of several sizes).

    Raises:
        ExportError: an unstamped backbone, a missing output, a width that does not
            fit the heads, or a parity failure.
    """
    source = str(backbone_onnx)
    try:
        backbone = onnx.load(source)
    except Exception as exc:
        raise ExportError(f"{source} is not a loadable ONNX graph: {exc}") from exc
    info, embedding = _describe(backbone, output_name, source)
    items, phis = _parity_items(source, info, embedding, parity_items)
    if (width := phis[len(items)].shape[1]) != heads.d_new:
        raise ExportError(f"{source} output {embedding!r} is {width}-d; {what} expects {heads.d_new}-d")
    opset = next((o.version for o in backbone.opset_import if o.domain in ("", "ai.onnx")), 17)
    if opset < 13:  # the heads' and the pooling's nodes are opset 13's
        backbone, opset = onnx.version_converter.convert_version(backbone, 13), 13
    spec = info.input
    if isinstance(spec, TextSpec):  # heads read one vector a text: the encoder's pooling goes in the graph
        backbone, embedding, spec = pool_in_graph(backbone, embedding, spec, width), POOLED, pooled_spec(spec)
    scale = info.derived_scale(distance)
    graph = _HeadsGraph(FoldedHeads(heads.eval()), normalise=scale == "unit").eval()
    with tempfile.TemporaryDirectory() as tmp:
        merged = _merge(backbone, _export_heads(graph, phis[len(items)], opset, tmp), embedding)
    composed = ModelInfo(
        name or f"{Path(source).stem}+heads",
        info.distance,
        {"new": heads.d_new, "rev": heads.d_old},
        spec,
        scale=scale,
    )
    props = composed.to_metadata()
    if fit is not None:
        props[FIT_METADATA_KEY] = json.dumps(fit, sort_keys=True)
    helper.set_model_props(merged, props)
    onnx.checker.check_model(merged)
    path = Path(out)
    with checked_write(path) as partial:
        onnx.save(merged, str(partial))
        with torch.no_grad():
            expected = {n: [t.numpy() for t in graph(torch.from_numpy(phi))] for n, phi in phis.items()}
        worst = _parity(partial, items, expected)
    return path, worst
