"""A small CNN encoder as a real ONNX graph with random weights, for benchmarks.

Built with ``onnx.helper`` (no torch): uint8 NHWC images in, three conv blocks,
global average pooling, then linear heads. The cost per image is that of a
small CIFAR-10 backbone, so timing it says how much of a migration's time the
model takes, which is all a benchmark of the pipeline needs (the weights are
untrained).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant.core.modelinfo import InputSpec, ModelInfo

#: Conv stages (output channels, convs in the stage); each stage but the last halves the resolution.
SMALL = ((32, 1), (64, 1), (128, 1))  # ~6 M multiply-adds per 32x32 image
RESNET18_SIZE = ((64, 2), (128, 2), (256, 2), (512, 2))  # ~300 M, ResNet-18's scale on CIFAR
NULL = ()  # no convolution: pooling and the heads only, what a GPU encoder costs the CPU


def convnet_encoder(
    path: Path,
    *,
    heads: dict[str, tuple[str, int]],
    stages: tuple[tuple[int, int], ...] = SMALL,
    size: int = 32,
    seed: int = 0,
) -> Path:
    """Write the graph; ``heads`` maps output name → (source, dim), source ``features`` or an output."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array(1 / 255, np.float32), "inv255")]
    nodes = [
        helper.make_node("Cast", ["images"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "inv255"], ["scaled"]),
        helper.make_node("Transpose", ["scaled"], ["x0"], perm=[0, 3, 1, 2]),
    ]
    channels, current = 3, "x0"
    for s, (out, convs) in enumerate(stages):
        for c in range(convs):
            i = f"{s}_{c}"
            weight = rng.normal(0, np.sqrt(2 / (channels * 9)), size=(out, channels, 3, 3)).astype(np.float32)
            inits += [
                numpy_helper.from_array(weight, f"w{i}"),
                numpy_helper.from_array(np.zeros(out, np.float32), f"b{i}"),
            ]
            nodes += [
                helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
            ]
            current, channels = f"r{i}", out
        if s < len(stages) - 1:
            nodes.append(
                helper.make_node("MaxPool", [current], [f"p{s}"], kernel_shape=[2, 2], strides=[2, 2])
            )
            current = f"p{s}"
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["features"], axis=1),
    ]
    dims, outputs = {"features": channels}, []
    for name, (source, dim) in heads.items():
        weight = rng.normal(0, 1 / np.sqrt(dims[source]), size=(dims[source], dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"W_{name}"))
        product = f"{name}_logits" if name == "scores" else name
        nodes.append(helper.make_node("MatMul", [source, f"W_{name}"], [product]))
        if name == "scores":
            nodes.append(helper.make_node("Softmax", [product], [name], axis=1))
        dims[name] = dim
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", dim]))
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("images", TensorProto.UINT8, ["N", size, size, 3])],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    info = ModelInfo(
        f"convnet-{'-'.join(heads)}", "cosine", {k: dims[k] for k in heads}, InputSpec(size, size, 3)
    )
    helper.set_model_props(model, info.to_metadata())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
