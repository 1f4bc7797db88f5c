"""Encoders for the photo benchmarks, stamped as a torchvision-style pipeline takes photos.

Both take float32 NCHW 224 x 224 input normalised with ImageNet's mean and std, after
``Resize(256)`` and ``CenterCrop(224)`` (``rmq model stamp --resize 256 --crop 224``):

- :func:`cheap_graph`: 16 x 16 average pooling and two matrix products (outputs ``new``, 128,
  and ``rev``, 64): what a backfill's CPU side sees when the model runs elsewhere (a GPU);
- :func:`resnet50_graph`: a ResNet-50 (torchvision's layout: bottleneck blocks 3-4-6-3, about
  4.1 G multiply-adds an image) written in plain torch with torchvision's initialisation
  (convolutions Kaiming-normal, fan out; batch norms at their initial statistics, in eval
  mode: what ``torchvision.models.resnet50(weights=None).eval()`` computes), a fixed seed; its
  512-d embedding is centred on the mean over random crops of scikit-learn's bundled photos
  (a random net's raw features share one large direction, which would make any two images
  look alike, and any two decodes of one image too). Exported to ONNX once into the cache
  folder.

Random weights are all there is offline, and how sensitive a random net is to small pixel
changes depends on its initialisation, not on what a trained model would do: the same net with
its batch norms' statistics set from real crops (every layer rescaled to unit variance) is
chaotic, ±1 pixel level of noise alone taking the cosine to about 0.83, where this one stays
at 1.000. Its cosines are a stand-in, to be read beside the reference perturbations the
benchmark prints, and checked on a trained model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rm_qdrant.caches import cache_root
from rm_qdrant.models.stamp import stamp_model

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
RESNET50 = "resnet50-torchvision-init-seed0.onnx"


def _stamp(raw: Path, out: Path, outputs: dict[str, str], name: str) -> Path:
    stamp_model(
        raw, out, outputs=outputs, size=224, layout="NCHW", dtype="float32",
        resize=256, crop=224, mean=MEAN, std=STD, name=name,
    )  # fmt: skip
    raw.unlink()
    return out


def cheap_graph(path: Path, *, seed: int = 0) -> Path:
    """Write the cheap encoder (outputs ``new`` and ``rev``) to ``path``, stamped."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.05, (588, 128)).astype(np.float32), "W_new"),
        numpy_helper.from_array(rng.normal(0, 0.1, (128, 64)).astype(np.float32), "W_rev"),
    ]
    nodes = [
        helper.make_node("AveragePool", ["images"], ["pooled"], kernel_shape=[16, 16], strides=[16, 16]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W_new"], ["new"]),
        helper.make_node("MatMul", ["new", "W_rev"], ["rev"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cheap",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [
            helper.make_tensor_value_info("new", TensorProto.FLOAT, ["N", 128]),
            helper.make_tensor_value_info("rev", TensorProto.FLOAT, ["N", 64]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    raw = path.with_suffix(".raw.onnx")
    onnx.save(model, str(raw))
    return _stamp(raw, path, {"new": "new", "rev": "rev"}, "cheap")


def _resnet50(dim: int):  # noqa: ANN202  # torch is imported here only: the cheap path needs none
    from torch import nn

    def bn_conv(cin: int, cout: int, k: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, mid: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                *bn_conv(cin, mid, 1), nn.ReLU(), *bn_conv(mid, mid, 3, stride), nn.ReLU(),
                *bn_conv(mid, mid * 4, 1),
            )  # fmt: skip
            same = stride == 1 and cin == mid * 4
            self.skip = nn.Identity() if same else nn.Sequential(*bn_conv(cin, mid * 4, 1, stride))
            self.relu = nn.ReLU()

        def forward(self, x):  # noqa: ANN001, ANN202
            return self.relu(self.body(x) + self.skip(x))

    layers, cin = [*bn_conv(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if b == 0 else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, dim)]
    return nn.Sequential(*layers)


def _calibration_crops(count: int, seed: int) -> np.ndarray:
    """``count`` random 224 x 224 crops of the bundled photos, laid out as the graph takes them."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(load_sample_image(n)) for n in ("china.jpg", "flower.jpg")]
    crops = []
    for _ in range(count):
        photo = photos[int(rng.integers(2))]
        side = int(rng.integers(224, 427))
        left, top = int(rng.integers(photo.width - side + 1)), int(rng.integers(photo.height - side + 1))
        crop = photo.crop((left, top, left + side, top + side)).resize((224, 224), Image.Resampling.BILINEAR)
        crops.append(np.asarray(crop))
    batch = (np.stack(crops).astype(np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))


def resnet50_graph(folder: Path | None = None, *, seed: int = 0, dim: int = 512) -> Path:
    """The stamped random-init ResNet-50 (output ``embedding``), built and exported on first use."""
    folder = Path(folder) if folder is not None else cache_root() / "benchmark-graphs"
    out = folder / RESNET50
    if out.is_file():
        return out
    import torch

    torch.manual_seed(seed)
    net = _resnet50(dim)
    for module in net.modules():
        if isinstance(module, torch.nn.Conv2d):  # torchvision's ResNet initialisation
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    crops = torch.from_numpy(_calibration_crops(64, seed))
    net.eval()
    with torch.no_grad():
        net[-1].bias -= net[-1](net[:-1](crops)).mean(0)  # centred on the crops' mean
    folder.mkdir(parents=True, exist_ok=True)
    raw = out.with_suffix(".raw.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is legacy
        torch.onnx.export(
            net, (crops[:1],), str(raw), input_names=["images"], output_names=["embedding"],
            opset_version=17, dynamic_axes={"images": {0: "N"}, "embedding": {0: "N"}}, dynamo=False,
        )  # fmt: skip
    return _stamp(raw, out, {"embedding": "embedding"}, "resnet50-random")
