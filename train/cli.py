"""``rmq train ...``: thin commands over the training library (loaded only when used)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import click
import yaml

from train.config import AdapterConfig, BackboneConfig, HeadsConfig, load_config


def _settings(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--set key=value`` pairs; values are read as YAML scalars (numbers, booleans, strings)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--set")
        values[key.replace("-", "_")] = yaml.safe_load(value)
    return values


def _run(fn: Any, cls: type, config: str | None, pairs: tuple[str, ...], **options: Any) -> Any:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        cfg = load_config(cls, config, **{**options, **_settings(pairs)})
        return cfg, fn(cfg)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc


config_option = click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML settings.")
set_option = click.option("--set", "pairs", multiple=True, help="Any setting as KEY=VALUE (repeatable).")


@click.group(name="train")
def train() -> None:
    """Train backbones, the ψ/ρ heads, query adapters and baselines (needs PyTorch)."""


@train.command()
@config_option
@set_option
@click.option("--data", help="Folder with train/ and test/ (ImageFolder layout).")
@click.option("--arch", type=click.Choice(["small-cnn", "resnet18", "resnet50", "vit-b32"]))
@click.option("--role", type=click.Choice(["old", "new"]), help="Train on the old or the new classes.")
@click.option("--setting", type=click.Choice(["extended", "open"]), help="Class split.")
@click.option("--epochs", type=int)
@click.option("--out", help="Checkpoint path.")
def backbone(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train a backbone with cross-entropy (SGD, cosine schedule, label smoothing)."""
    from train.backbone import train_backbone

    _, path = _run(train_backbone, BackboneConfig, config, pairs, **options)
    click.echo(f"wrote {path}")


@train.command()
@config_option
@set_option
@click.option("--old", help="Old backbone checkpoint.")
@click.option("--new", help="New backbone checkpoint.")
@click.option("--data", help="Folder with train/ (ImageFolder layout).")
@click.option("--loss", type=click.Choice(["rqt", "cl-s", "cl-m", "mcl"]), help="[default: mcl]")
@click.option(
    "--learn-rho/--no-learn-rho",
    default=None,
    help="Train ρ, or keep it the identity [default: the paper's per loss: learned for cl-m and mcl, "
    "the identity for rqt and cl-s].",
)
@click.option("--epochs", type=int)
@click.option("--out", help="Checkpoint path.")
def heads(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train ψ and ρ on cached embeddings of the frozen backbones."""
    from train.heads import train_heads

    cfg, (path, history) = _run(train_heads, HeadsConfig, config, pairs, **options)
    click.echo(json.dumps({"checkpoint": str(path), "loss": history, "config": dataclasses.asdict(cfg)}))


@train.command()
@config_option
@set_option
@click.option("--old", help="Old backbone checkpoint.")
@click.option("--new", help="New backbone checkpoint.")
@click.option("--data", help="Folder with train/ (ImageFolder layout).")
@click.option("--kind", type=click.Choice(["procrustes", "low-rank", "residual-mlp"]))
@click.option("--out", help="Checkpoint path.")
def adapter(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Fit a query adapter ψ (new → old space, ρ = identity) without contrastive training."""
    from train.adapter_job import train_adapter_job

    _, path = _run(train_adapter_job, AdapterConfig, config, pairs, **options)
    click.echo(f"wrote {path}")


@train.command()
@click.option("--method", required=True, type=click.Choice(["bct", "fct", "bict", "ract"]))
@config_option
@set_option
@click.option("--old", help="Old backbone checkpoint.")
@click.option("--new", help="New backbone (fct: freely trained; bict: a BCT-trained one).")
@click.option("--data", help="Folder with train/ and test/ (ImageFolder layout).")
@click.option("--out", help="Checkpoint path.")
def baseline(method: str, config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train a baseline: BCT or RACT (a compatible new backbone), FCT or BiCT (a transformation)."""
    from train.baselines import BaselineConfig, train_baseline

    _, path = _run(lambda cfg: train_baseline(method, cfg), BaselineConfig, config, pairs, **options)
    click.echo(f"wrote {path}")
