"""Training configurations: dataclasses with commented defaults, loadable from YAML."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


@dataclass
class BackboneConfig:
    """Cross-entropy training of one backbone on some classes of an ImageFolder dataset."""

    data: str = ".cache/data"  # folder with train/ and test/ in ImageFolder layout
    out: str = "runs/backbone.pt"  # checkpoint path
    arch: str = "small-cnn"  # small-cnn | resnet18 | resnet50 | vit-b32
    stem: str = "cifar"  # cifar (32x32) or imagenet
    embed_dim: int = 128
    image_size: int = 32  # images are resized to this square size
    # pixel normalisation: cifar10 | imagenet (their channel statistics) | auto (computed from
    # the training images) | none; mean/std, when set, override it
    normalize: str = "cifar10"
    mean: list[float] | None = None
    std: list[float] | None = None
    flip: bool = True  # random horizontal flips while training
    crop_padding: int = 4  # random crops of the image padded by this many pixels (0: none)
    setting: str = "extended"  # class split: extended (old = first half) or open (old = random 30 %)
    role: str = "new"  # old: the old classes of the split; new: the new ones
    seed: int = 0
    epochs: int = 10
    batch: int = 128
    lr: float = 0.1  # SGD, momentum 0.9, cosine decay to 0
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    limit: int = 0  # use at most this many training images (0: all); for quick runs
    device: str = "auto"  # auto: CUDA when present (with mixed precision), else CPU
    influence: str = ""  # BCT: the old checkpoint whose classifier must accept the new embeddings
    influence_weight: float = 1.0
    compat: str = ""  # RACT: "ract" adds its contrastive compatibility loss (train/backbone.py)
    compat_old: str = ""  # the frozen old checkpoint that loss compares with
    compat_weight: float = 1.0
    compat_temperature: float = 0.1


@dataclass
class HeadsConfig:
    """Training ψ and ρ on cached embeddings of the frozen old and new backbones."""

    old: str = "runs/old.pt"
    new: str = "runs/new.pt"
    data: str = ".cache/data"
    out: str = "runs/heads.pt"
    loss: str = "mcl"  # rqt | cl-s | cl-m | mcl
    rqt_weight: float = 0.0  # added RQT term for the contrastive losses
    rqt_metric: str = "cosine"  # cosine | l2
    temperature: float = 0.1  # s = exp(-d / temperature); the paper's s = exp(-d) is 1.0
    hard_mining: bool = True
    # ρ learned or the identity; None: the paper's choice for the loss (learned for cl-m and
    # mcl; the identity for rqt and cl-s, whose ψ maps the new model's own space back)
    learn_rho: bool | None = None
    psi_blocks: int = 2  # Linear-BN-ReLU blocks, the last a Linear (1 to 5)
    rho_blocks: int = 2
    hidden: int = 512
    # Training length in Adam steps, whatever the data set's size (50 epochs of batch 512 are
    # 150 steps on 1,272 images): benchmarks/results/heads_schedule.md
    steps: int = 3000
    epochs: int | None = None  # passes over the images instead of steps (None or 0: use steps)
    batch: int = 256
    lr: float = 1e-3  # Adam, cosine decay to 0 over the steps
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"setting steps: expected a positive integer, got {self.steps}")
        if self.batch < 2:
            raise ValueError(
                f"setting batch: expected 2 or more (BatchNorm needs two rows), got {self.batch}"
            )
        if not 0 < self.lr < math.inf:
            raise ValueError(f"setting lr: expected a positive number, got {self.lr}")
        if self.epochs is not None and self.epochs < 0:
            raise ValueError(f"setting epochs: expected 0 (use steps) or more, got {self.epochs}")


def heads_steps(cfg: HeadsConfig, steps_per_epoch: int) -> int:
    """How many optimizer steps the heads train: ``cfg.epochs`` passes when set, else ``cfg.steps``."""
    return cfg.epochs * steps_per_epoch if cfg.epochs else cfg.steps


def load_config(cls: type[T], path: str | Path | None = None, **overrides: Any) -> T:
    """Build ``cls`` from a YAML file (optional) and keyword overrides (None values ignored).

    Raises:
        ValueError: the file names a field ``cls`` does not have.
    """
    values: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: expected a mapping of settings")
        values.update(loaded)
    values.update({k: v for k, v in overrides.items() if v is not None})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for {cls.__name__}")
    return cls(**{k: _typed(k, v, str(fields[k].type)) for k, v in values.items()})


def _typed(name: str, value: Any, kind: str) -> Any:
    """``value`` as the setting's declared type (int, float, bool, str), or a one-line ValueError.

    YAML reads ``1e-3`` as a string and ``5`` as an int; both are fine floats.
    """
    base = kind.replace(" | None", "").strip()
    if value is None and kind.endswith("| None"):
        return None
    try:
        if base == "float" and not isinstance(value, bool):
            return float(value)
        if base == "int" and not isinstance(value, bool) and float(value) == int(float(value)):
            return int(float(value))
        if base == "bool" and isinstance(value, bool):
            return value
        if base == "str" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int("inf")
        pass
    else:
        if base not in ("float", "int", "bool", "str"):
            return value  # structured settings (a dict of backbone settings) pass as they are
    raise ValueError(f"setting {name}: expected {base}, got {value!r}")


def rho_is_learned(cfg: HeadsConfig) -> bool:
    """Whether ρ is trained: as set, else the paper's default for the loss."""
    return cfg.learn_rho if cfg.learn_rho is not None else cfg.loss in ("cl-m", "mcl")


@dataclass
class AdapterConfig:
    """Fitting a query adapter ψ (ρ = identity) on cached embeddings of the frozen backbones."""

    old: str = "runs/old.pt"
    new: str = "runs/new.pt"
    data: str = ".cache/data"
    out: str = "runs/adapter.pt"
    kind: str = "procrustes"  # procrustes | low-rank | residual-mlp
    epochs: int = 50  # for the trainable kinds
    lr: float = 1e-3
    batch: int = 512
    loss: str = "cosine"  # cosine | l2
    rank: int = 64
    hidden: int = 512
    seed: int = 0
