"""Linear encoders as real ONNX graphs, built with ``onnx.helper`` (no torch).

Pixels in, matrix products out: small enough to build in a test or a quickstart,
yet a real graph that ONNX Runtime runs and rm-qdrant loads like any exported
model. ``scores`` outputs get a softmax, the way a classifier head would.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant.core.modelinfo import InputSpec, ModelInfo

OPSET = 17

#: One output: (output name, source, matrix). The source is ``"pixels"`` (the
#: flattened image scaled to [0, 1]) or the name of an earlier output.
Projection = tuple[str, str, np.ndarray]


def linear_encoder(
    path: str | Path,
    projections: Sequence[Projection],
    *,
    input_spec: InputSpec,
    name: str,
    distance: str | None = "cosine",
    scale: str | None = None,
) -> Path:
    """Write a linear encoder graph to ``path`` and return the path.

    ``distance`` None stamps it for any distance; ``scale`` is the metadata's (``raw``:
    a linear map's vectors are not normalised).

    Example:
        >>> import numpy as np
        >>> spec = InputSpec(height=8, width=8, channels=1)
        >>> rng = np.random.default_rng(0)
        >>> linear_encoder("/tmp/m.onnx", [("new", "pixels", rng.normal(size=(64, 16))),
        ...                                ("rev", "new", rng.normal(size=(16, 8)))],
        ...                input_spec=spec, name="toy")  # doctest: +SKIP
    """
    h, w, c = input_spec.height, input_spec.width, input_spec.channels
    if input_spec.layout != "NHWC" or input_spec.dtype != "uint8":
        raise ValueError("linear encoders take uint8 NHWC input")
    nodes = [
        helper.make_node("Cast", ["images"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["as_float", "inv255"], ["scaled"]),
        helper.make_node("Flatten", ["scaled"], ["pixels"], axis=1),
    ]
    inits = [numpy_helper.from_array(np.array(1.0 / 255.0, dtype=np.float32), "inv255")]
    outputs, dims = [], {}
    for out, source, matrix in projections:
        weight = np.asarray(matrix, dtype=np.float32)
        inits.append(numpy_helper.from_array(weight, f"W_{out}"))
        product = f"{out}_logits" if out == "scores" else out
        nodes.append(helper.make_node("MatMul", [source, f"W_{out}"], [product]))
        if out == "scores":
            nodes.append(helper.make_node("Softmax", [product], [out], axis=1))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", weight.shape[1]]))
        dims[out] = int(weight.shape[1])
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", h, w, c])],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    info = ModelInfo(name=name, distance=distance, outputs=dims, input=input_spec, scale=scale)
    helper.set_model_props(model, info.to_metadata())
    onnx.checker.check_model(model)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target
