"""Attach trained ρ and ψ to a team's own ONNX backbone: still one graph, two outputs.

For teams whose new model is not PyTorch: the heads are exported on their own
(embedding in, ``new`` and ``rev`` out, L2-normalised) and joined to the
backbone's embedding output with ``onnx.compose``. The image input is the
backbone's; its layout and normalisation come from the backbone's own
``rm_qdrant`` metadata when it has one, or from the caller.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import compose, helper
from torch import Tensor, nn

from exporters.serving import TOLERANCE, ExportError, FoldedHeads, unit
from rm_qdrant.modelinfo import METADATA_KEY, InputSpec, ModelInfo, parse_metadata
from train.heads import load_heads

PREFIX = "rmq_heads/"


class _HeadsGraph(nn.Module):
    def __init__(self, heads: nn.Module) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        new, rev = self.heads(phi)
        return unit(new), unit(rev)


def _backbone_output(model: onnx.ModelProto, output_name: str | None, source: str) -> str:
    names = [o.name for o in model.graph.output]
    if output_name is not None:
        if output_name not in names:
            raise ExportError(f"{source} has no output {output_name!r}; it has {', '.join(names)}")
        return output_name
    if len(names) != 1:
        raise ExportError(f"{source} has several outputs ({', '.join(names)}); choose one with --output-name")
    return names[0]


def _input_spec(model: onnx.ModelProto, given: InputSpec | None, source: str) -> InputSpec:
    """The caller's input facts, else the backbone's own rm_qdrant metadata."""
    if given is not None:
        return given
    props = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in props:
        raise ExportError(
            f"{source} has no rm_qdrant metadata: give its input size, layout, dtype and normalisation"
        )
    return parse_metadata(props, [o.name for o in model.graph.output], source=source).input


def _sample(spec: InputSpec, n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = (
        (n, spec.height, spec.width, spec.channels)
        if spec.layout == "NHWC"
        else (n, spec.channels, spec.height, spec.width)
    )
    if spec.dtype == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.normal(size=shape).astype(np.float32)


def attach_heads(
    backbone_onnx: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    output_name: str | None = None,
    input_spec: InputSpec | None = None,
    name: str | None = None,
) -> tuple[Path, float]:
    """Join the heads to ``backbone_onnx``'s embedding output; returns (path, worst parity difference).

    Raises:
        ExportError: an ambiguous or missing output, a width that does not fit the
            heads, missing input facts, or a parity failure.
    """
    source = str(backbone_onnx)
    try:
        backbone = onnx.load(source)
    except Exception as exc:
        raise ExportError(f"{source} is not a loadable ONNX graph: {exc}") from exc
    embedding = _backbone_output(backbone, output_name, source)
    spec = _input_spec(backbone, input_spec, source)
    head_model, meta = load_heads(heads)
    input_name = backbone.graph.input[0].name
    sample = _sample(spec, 7)
    session = ort.InferenceSession(backbone.SerializeToString(), providers=["CPUExecutionProvider"])
    phi = session.run([embedding], {input_name: sample})[0].reshape(len(sample), -1).astype(np.float32)
    if phi.shape[1] != meta["d_new"]:
        raise ExportError(
            f"{source} output {embedding!r} is {phi.shape[1]}-d; {heads} expects {meta['d_new']}-d"
        )
    opset = next((o.version for o in backbone.opset_import if o.domain in ("", "ai.onnx")), 17)
    graph = _HeadsGraph(FoldedHeads(head_model.eval())).eval()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
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
        head_graph = onnx.load(f"{tmp}/heads.onnx")
    head_graph.ir_version = backbone.ir_version
    if opset < 13:
        backbone = onnx.version_converter.convert_version(backbone, 13)
    merged = compose.merge_models(
        backbone,
        compose.add_prefix(head_graph, PREFIX),
        io_map=[(embedding, f"{PREFIX}phi")],
        outputs=[f"{PREFIX}new", f"{PREFIX}rev"],
    )
    merged.graph.node.extend(helper.make_node("Identity", [f"{PREFIX}{o}"], [o]) for o in ("new", "rev"))
    for value in merged.graph.output:
        value.name = value.name.removeprefix(PREFIX)
    del merged.metadata_props[:]
    info = ModelInfo(
        name or f"{Path(source).stem}+heads", "cosine", {"new": meta["d_new"], "rev": meta["d_old"]}, spec
    )
    helper.set_model_props(merged, info.to_metadata())
    onnx.checker.check_model(merged)
    path = Path(out)
    onnx.save(merged, str(path))
    with torch.no_grad():
        expected = [t.numpy() for t in graph(torch.from_numpy(phi))]
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        ["new", "rev"], {input_name: sample}
    )
    worst = max(float(np.abs(e - g).max()) for e, g in zip(expected, got, strict=True))
    if worst > TOLERANCE:
        raise ExportError(
            f"{path}: composed graph differs from backbone + heads by {worst:.2e} (> {TOLERANCE})"
        )
    return path, worst
