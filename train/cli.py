"""``rmq train ...``: thin commands over the training library (loaded only when used)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any

import click
import yaml

from rm_qdrant.caches import CACHE_ENV
from rm_qdrant.cli.threads import apply_threads, choose_threads, show_progress, threads_option
from rm_qdrant.core.modelinfo import parse_floats
from rm_qdrant_train.config import AdapterConfig, BackboneConfig, HeadsConfig, load_config


def _settings(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--set key=value`` pairs; values are read as YAML scalars (numbers, booleans, strings)."""
    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--set")
        values[key.replace("-", "_")] = yaml.safe_load(value)
    return values


def progress_options(command: Any) -> Any:
    """``-v``/``-q``, ``--cache-dir`` and ``--threads`` on every training command."""

    @functools.wraps(command)
    def wrapper(
        *args: Any, verbose: bool, quiet: bool, cache_dir: str | None, threads: int | None, **kwargs: Any
    ) -> Any:
        if cache_dir:
            os.environ[CACHE_ENV] = cache_dir
        show_progress(verbose=verbose, quiet=quiet)
        apply_threads(choose_threads(threads))  # -v logs the count and why
        return command(*args, **kwargs)

    for option in (
        threads_option(),
        click.option("-v", "--verbose", is_flag=True, help="More detail (every step's figures)."),
        click.option("-q", "--quiet", is_flag=True, help="No progress: warnings and errors only."),
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            help=f"Where decoded images and embeddings are cached [default: ${CACHE_ENV}, "
            "else $XDG_CACHE_HOME/rm-qdrant, else ~/.cache/rm-qdrant].",
        ),
    ):
        wrapper = option(wrapper)
    return wrapper


def _run(fn: Any, cls: type, config: str | None, pairs: tuple[str, ...], **options: Any) -> Any:
    try:
        cfg = load_config(cls, config, **{**options, **_settings(pairs)})
        _check_numbers(cfg)
        return cfg, fn(cfg)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc


def _check_numbers(cfg: Any) -> None:
    """Refuse nan and infinite numbers (nan passes every bound) and negative seeds, before training."""
    for name, value in dataclasses.asdict(cfg).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"setting {name}: expected a finite number, got {value}")
        if name == "seed" and not 0 <= value < 2**32:
            raise ValueError(f"setting seed: expected 0 to {2**32 - 1}, got {value}")


config_option = click.option("--config", type=click.Path(exists=True, dir_okay=False), help="YAML settings.")
set_option = click.option("--set", "pairs", multiple=True, help="Any setting as KEY=VALUE (repeatable).")


@click.group(name="train")
def train() -> None:
    """Train backbones, the ψ/ρ heads, query adapters and baselines (needs PyTorch)."""


@train.command()
@progress_options
@config_option
@set_option
@click.option("--data", help="Folder with train/ and test/ (ImageFolder layout).")
@click.option("--arch", type=click.Choice(["small-cnn", "resnet18", "resnet50", "vit-b32"]))
@click.option("--role", type=click.Choice(["old", "new"]), help="Train on the old or the new classes.")
@click.option("--setting", type=click.Choice(["extended", "open"]), help="Class split [default: extended].")
@click.option("--epochs", type=int, help="[default: 10]")
@click.option("--image-size", type=click.IntRange(min=8, max=1024), help="Square input size [default: 32].")
@click.option(
    "--normalize",
    type=click.Choice(["cifar10", "imagenet", "auto", "none"]),
    help="Pixel normalisation: a dataset's channel statistics, or auto: measured on the training "
    "images [default: cifar10].",
)
@click.option("--mean", help="Per-channel mean, e.g. 0.5,0.5,0.5 (overrides --normalize).")
@click.option("--std", help="Per-channel std, e.g. 0.25,0.25,0.25 (overrides --normalize).")
@click.option("--flip/--no-flip", default=None, help="Random horizontal flips while training [default: on].")
@click.option(
    "--crop-padding", type=click.IntRange(min=0), help="Random crops with this padding, 0: none [default: 4]."
)
@click.option("--out", help="Checkpoint path.")
def backbone(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train a backbone with cross-entropy (SGD, cosine schedule, label smoothing).

    The normalisation used is recorded in the checkpoint and exported into the ONNX graph.
    """
    from rm_qdrant_train.backbone import train_backbone

    for name in ("mean", "std"):
        if options[name] is not None:
            options[name] = list(parse_floats(options[name], f"--{name}") or ())
    _, path = _run(train_backbone, BackboneConfig, config, pairs, **options)
    click.echo(f"wrote {path}")


@train.command()
@progress_options
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
# Numbers are passed on as text and typed by load_config, so a bad one is the same one line as --set's.
@click.option("--steps", metavar="INTEGER", help="Adam steps, whatever the data set's size [default: 3000].")
@click.option(
    "--epochs", metavar="INTEGER", help="Passes over the images instead of --steps [default: use --steps]."
)
@click.option("--batch", metavar="INTEGER", help="Images per step [default: 256].")
@click.option(
    "--lr", metavar="FLOAT", help="Adam learning rate, cosine decay to 0 over the steps [default: 1e-3]."
)
@click.option("--out", help="Checkpoint path.")
def heads(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train ψ and ρ on cached embeddings of the frozen backbones.

    Training lasts --steps Adam steps (or --epochs passes), so a small data set gets as
    many steps as a large one. Prints the checkpoint, the mean loss of each tenth of the run
    (of each epoch with --epochs) and the settings as JSON.
    """

    def train_heads(cfg: HeadsConfig) -> Any:
        from rm_qdrant_train.heads import train_heads  # torch loads only once the settings are valid

        return train_heads(cfg)

    cfg, (path, history) = _run(train_heads, HeadsConfig, config, pairs, **options)
    click.echo(json.dumps({"checkpoint": str(path), "loss": history, "config": dataclasses.asdict(cfg)}))


@train.command()
@progress_options
@config_option
@set_option
@click.option("--old", help="Old backbone checkpoint.")
@click.option("--new", help="New backbone checkpoint.")
@click.option("--data", help="Folder with train/ (ImageFolder layout).")
@click.option("--kind", type=click.Choice(["procrustes", "low-rank", "residual-mlp"]))
@click.option("--out", help="Checkpoint path.")
def adapter(config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Fit a query adapter ψ (new → old space, ρ = identity) without contrastive training."""
    from rm_qdrant_train.adapter_job import train_adapter_job

    _, path = _run(train_adapter_job, AdapterConfig, config, pairs, **options)
    click.echo(f"wrote {path}")


@train.command()
@progress_options
@click.option("--method", required=True, type=click.Choice(["bct", "fct", "bict", "ract"]))
@config_option
@set_option
@click.option("--old", help="Old backbone checkpoint.")
@click.option("--new", help="New backbone (fct: freely trained; bict: a BCT-trained one).")
@click.option("--data", help="Folder with train/ and test/ (ImageFolder layout).")
@click.option("--out", help="Checkpoint path.")
def baseline(method: str, config: str | None, pairs: tuple[str, ...], **options: Any) -> None:
    """Train a baseline: BCT or RACT (a compatible new backbone), FCT or BiCT (a transformation)."""
    from rm_qdrant_train.baselines import BaselineConfig, train_baseline

    _, path = _run(lambda cfg: train_baseline(method, cfg), BaselineConfig, config, pairs, **options)
    click.echo(f"wrote {path}")
