"""φ_new + ρ + ψ as one ONNX graph with two outputs, checked against PyTorch.

The graph takes a uint8 image batch, NHWC, at the backbone's input size (rm-qdrant's
encoder decodes and resizes to the size in the metadata), normalises it inside the
graph, and returns ``new`` = ρ(φ_new(x)) and ``rev`` = ψ(ρ(φ_new(x))), both
L2-normalised for cosine distance (stamped ``cosine``, scale ``unit``). The batch
axis is dynamic. The ``rm_qdrant`` metadata entry makes the file all ``rmq init
--encoder`` needs.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import Tensor, nn

from rm_qdrant.core.modelinfo import InputSpec, ModelInfo
from rm_qdrant.errors import ExportError
from rm_qdrant_train.backbone import load_backbone
from rm_qdrant_train.heads import load_heads

log = logging.getLogger(__name__)
OPSET = 17
TOLERANCE = 1e-4


class Normalise(nn.Module):
    """uint8 NHWC → float NCHW, scaled to [0, 1] and normalised per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        x = images.permute(0, 3, 1, 2).float() / 255.0
        return (x - self.mean) / self.std


def unit(x: Tensor) -> Tensor:
    """L2-normalise rows in three ONNX ops (``F.normalize`` exports as five)."""
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def fold_batchnorm(module: nn.Module) -> nn.Module:
    """A copy of ``module`` (eval mode) with every Linear → BatchNorm1d pair fused into one Linear."""
    if not isinstance(module, nn.Sequential):
        return module
    layers, children = [], list(module)
    i = 0
    while i < len(children):
        layer = children[i]
        following = children[i + 1] if i + 1 < len(children) else None
        if isinstance(layer, nn.Linear) and isinstance(following, nn.BatchNorm1d):
            scale = following.weight / torch.sqrt(following.running_var + following.eps)
            fused = nn.Linear(layer.in_features, layer.out_features)
            with torch.no_grad():
                fused.weight.copy_(layer.weight * scale[:, None])
                bias = layer.bias if layer.bias is not None else torch.zeros_like(following.running_mean)
                fused.bias.copy_((bias - following.running_mean) * scale + following.bias)
            layers.append(fused)
            i += 2
        else:
            layers.append(layer)
            i += 1
    return nn.Sequential(*layers).eval()


class FoldedHeads(nn.Module):
    """Trained heads with their BatchNorm folded into the Linear layers: same outputs, fewer ops."""

    def __init__(self, heads: nn.Module) -> None:
        super().__init__()
        self.rho, self.psi = fold_batchnorm(heads.rho), fold_batchnorm(heads.psi)

    def forward(self, phi: Tensor) -> tuple[Tensor, Tensor]:
        new = self.rho(phi)
        return new, self.psi(new)


class ServingGraph(nn.Module):
    """What the exported graph computes: (new, rev), or (embedding[, scores]) for an old model."""

    def __init__(
        self,
        backbone: nn.Module,
        mean: Sequence[float],
        std: Sequence[float],
        heads: nn.Module | None = None,
        *,
        scores: bool = False,
    ) -> None:
        super().__init__()
        self.prep, self.backbone, self.heads, self.scores = Normalise(mean, std), backbone, heads, scores

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        embedding, logits = self.backbone(self.prep(images))
        if self.heads is None:
            out = unit(embedding)
            return (out, logits.softmax(dim=1)) if self.scores else (out,)
        new, rev = self.heads(embedding)
        return unit(new), unit(rev)


def _export(module: nn.Module, sample: Tensor, path: Path, outputs: list[str], info: ModelInfo) -> Path:
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter warns that it is legacy
        torch.onnx.export(
            module,
            (sample,),
            str(path),
            input_names=["images"],
            output_names=outputs,
            opset_version=OPSET,
            dynamic_axes={name: {0: "batch"} for name in ["images", *outputs]},
            dynamo=False,
        )
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, info.to_metadata())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def check_parity(
    module: nn.Module, path: Path, images: np.ndarray, outputs: list[str], *, target: Path | None = None
) -> float:
    """Largest absolute difference between ONNX Runtime and PyTorch on ``images``, for batch 1 and all.

    Args:
        target: where the graph at ``path`` is going, named in errors [default: ``path``].

    Raises:
        ExportError: an output holds NaN or infinity (on either side), or the difference
            exceeds 1e-4.
    """
    target = target or path
    log.info("checking %s against PyTorch at batch 1 and %d", target, len(images))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for batch in (images[:1], images):
        with torch.no_grad():
            expected = [t.numpy() for t in module(torch.from_numpy(np.ascontiguousarray(batch)))]
        got = session.run(outputs, {"images": batch})
        for name, e, g in zip(outputs, expected, got, strict=True):
            if not (np.isfinite(e).all() and np.isfinite(g).all()):
                raise ExportError(
                    f"{target}: the graph gives NaN or infinity for {name!r} on the parity images "
                    "(check the checkpoint's weights and mean/std); nothing written"
                )
            worst = max(worst, float(np.abs(e - g).max()))
    if worst > TOLERANCE:
        raise ExportError(
            f"{target}: ONNX Runtime differs from PyTorch by {worst:.2e} (> {TOLERANCE}); nothing written"
        )
    return worst


def _export_checked(
    module: nn.Module, sample: np.ndarray, out: str | Path, outputs: list[str], info: ModelInfo
) -> tuple[Path, float]:
    """Export to a hidden file next to ``out``, check it, then move it there: a graph that
    fails its check (or a crash) never leaves a file at ``out``."""
    path = Path(out)
    with checked_write(path) as partial:
        _export(module, torch.from_numpy(sample[:2].copy()), partial, outputs, info)
        worst = check_parity(module, partial, sample, outputs, target=path)
    return path, worst


@contextmanager
def checked_write(path: Path) -> Iterator[Path]:
    """A partial file beside ``path`` for the block to write and check; moved to ``path`` only
    when the block succeeds, removed otherwise: never a half-written or unchecked graph."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        yield partial
        os.replace(partial, path)
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        partial.unlink(missing_ok=True)


def _sample_images(meta: dict, images: np.ndarray | None) -> np.ndarray:
    size = meta["image_size"]
    if images is not None:
        if images.shape[1:] != (size, size, 3) or images.dtype != np.uint8:
            raise ExportError(
                f"parity images must be uint8 (N, {size}, {size}, 3), got {images.dtype} {images.shape}"
            )
        return images[:7]
    return np.random.default_rng(0).integers(0, 256, size=(7, size, size, 3), dtype=np.uint8)


def export_serving(
    new: str | Path,
    heads: str | Path,
    out: str | Path,
    *,
    images: np.ndarray | None = None,
    name: str | None = None,
) -> tuple[Path, float]:
    """Export φ_new + ρ + ψ; returns (path, worst ONNX-vs-PyTorch difference).

    Raises:
        ExportError: the heads do not fit the backbone, or parity fails.
        ValueError: a checkpoint of the wrong kind.
    """
    backbone, meta = load_backbone(new)
    head_model, head_meta = load_heads(heads)
    if head_meta["d_new"] != meta["embed_dim"]:
        raise ExportError(
            f"{heads} expects {head_meta['d_new']}-d backbone embeddings, {new} makes {meta['embed_dim']}-d"
        )
    module = ServingGraph(backbone, meta["mean"], meta["std"], FoldedHeads(head_model.eval())).eval()
    size = meta["image_size"]
    info = ModelInfo(
        name or f"{meta['arch']}+heads-{head_meta['config']['loss']}",
        "cosine",
        {"new": head_meta["d_new"], "rev": head_meta["d_old"]},
        InputSpec(size, size, 3),
        scale="unit",
    )
    return _export_checked(module, _sample_images(meta, images), out, ["new", "rev"], info)


def export_backbone(
    checkpoint: str | Path,
    out: str | Path,
    *,
    role: str = "old",
    scores: bool = True,
    images: np.ndarray | None = None,
    name: str | None = None,
) -> tuple[Path, float]:
    """Export a plain backbone: ``embedding`` (and ``scores``, its classifier's softmax).

    The old model (what ``rmq index`` fills a collection with), or a plain new model for
    the naive mode; ``role`` names it (``small-cnn-new``), so ``rmq status`` tells them apart.
    """
    backbone, meta = load_backbone(checkpoint)
    module = ServingGraph(backbone, meta["mean"], meta["std"], scores=scores).eval()
    outputs = ["embedding", "scores"] if scores else ["embedding"]
    dims = {"embedding": meta["embed_dim"], **({"scores": len(meta["classes"])} if scores else {})}
    size = meta["image_size"]
    info = ModelInfo(name or f"{meta['arch']}-{role}", "cosine", dims, InputSpec(size, size, 3), scale="unit")
    return _export_checked(module, _sample_images(meta, images), out, outputs, info)
